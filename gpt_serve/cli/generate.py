"""`gpt-serve generate [MODEL]`: stream a model's continuation of a prompt to stdout, every field checked by the
request specification before anything loads, as a server checks it."""

from __future__ import annotations

import argparse
import sys
import time

from ..chargpt.vocab import UNK_POLICIES
from ..generation import BACKENDS, WINDOW_MODES, ModelFolder, load_backend, parse_request
from ..generation.fields import DEFAULT_BACKEND, FIELDS_BY_NAME
from ..generation.folder_defaults import read_generation_defaults
from ..generation.inline import inline_scheduler
from ..generation.text import TextStream
from ..models import DEFAULT_MODEL
from .flags import add_generation_config_argument, add_verbose_and_progress, thread_count

# `gpt-serve generate`'s flags that are fields of the request specification (`--max-new-tokens` is max_new_tokens)
GENERATE_FIELDS = (
    "max_new_tokens",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "seed",
    "stop",
    "window_mode",
    "refill_tokens",
    "unk_policy",
    "backend",
)


CLI_UNK_HINT = "pass --unk-policy replace (each becomes a space) or --unk-policy drop"


def default_prompt(folder) -> str:
    """`gpt-serve generate`'s prompt when none is given: the first sample prompt of the model folder `folder` (its
    corpus.json), else the empty prompt (the text after a newline; also when that record is broken, a warning says
    so: the model generates all the same, as the demo serves it)."""
    from ..folders.corpus_record import corpus_record_or_none

    record = corpus_record_or_none(folder)
    return record.default_prompt if record is not None else ""


def run(args: argparse.Namespace) -> int:
    folder = ModelFolder.open(model_argument(args.model, args.model_flag))  # read and checked once
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    prompt = default_prompt(folder.path) if prompt is None else prompt
    # every field checked by the request specification before the backend loads, as a server checks it
    fields = {name: getattr(args, name) for name in GENERATE_FIELDS}
    defaults = read_generation_defaults(folder.path, args.generation_config)  # the folder's, named
    request = parse_request(
        {**fields, "prompt": prompt, "structured_outputs": structured_outputs(args)}, None, defaults
    )
    loaded = load_backend(folder, request.backend, args.threads)
    # refuses unknown characters here, naming the flag that accepts them
    text = TextStream(inline_scheduler(loaded.backend), loaded.vocab, request, unk_hint=CLI_UNK_HINT)
    out = sys.stdout
    start = time.perf_counter()
    if not args.no_echo:
        out.write(prompt)
    for piece in text:
        out.write(piece)
        out.flush()
    out.write("\n")
    if args.stats:
        elapsed = time.perf_counter() - start
        rate = text.tokens / max(elapsed, 1e-9)
        print(f"[{text.tokens} tokens in {elapsed:.2f} s, {rate:.1f} tokens/s, {request.backend}]", file=sys.stderr)
    return 0


def model_argument(positional: str | None, flag: str | None) -> str:
    """The model of a command that takes it as MODEL or `--model MODEL` (vLLM's and transformers' spelling):
    either, not two different ones; none: the shipped default."""
    if positional is not None and flag is not None and positional != flag:
        raise ValueError(f"two models given: MODEL {positional!r} and --model {flag!r}; give one")
    return positional or flag or DEFAULT_MODEL


def structured_outputs(args: argparse.Namespace) -> dict | None:
    """The request's `structured_outputs` from `--regex`, `--choice`, `--json-schema FILE` or `--grammar FILE` (at
    most one: argparse refuses two)."""
    if args.regex is not None:
        return {"regex": args.regex}
    if args.choice:
        return {"choice": args.choice}
    if args.json_schema is not None:
        return {"json": _read(args.json_schema, "--json-schema")}
    if args.grammar is not None:
        return {"grammar": _read(args.grammar, "--grammar")}
    return None


def _read(path: str, flag: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{flag}: cannot read {path}: {e.strerror or e}") from None


def _add_structured_arguments(g) -> None:
    """Structured outputs (docs/structured.md): what the text must be, one way at most."""
    one = g.add_mutually_exclusive_group()
    one.add_argument("--regex", default=None, help="the text must match this regular expression")
    one.add_argument("--choice", action="append", default=None, help="the text is one of these (repeat the flag)")
    one.add_argument("--json-schema", metavar="FILE", default=None, help="the text is JSON that fits this schema")
    one.add_argument(
        "--grammar",
        metavar="FILE",
        default=None,
        help="the text must match this grammar: Lark, or EBNF as llama.cpp's GBNF (root ::= ...), as vLLM takes it",
    )


def _default(field: str):
    return FIELDS_BY_NAME[field].default


def _help(text: str, field: str) -> str:
    return f"{text}; none: the folder's generation_config.json, else {_default(field)}"


def add_parser(sub) -> None:
    g = sub.add_parser(
        "generate", help="stream text from a model", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    model = f"shipped model name or model folder (none: {DEFAULT_MODEL})"
    g.add_argument("model", nargs="?", default=None, metavar="MODEL", help=model)
    g.add_argument("--model", dest="model_flag", default=None, metavar="MODEL", help="the same as MODEL")
    g.add_argument(
        "--prompt",
        default=None,
        help='the text to continue ("-" reads stdin; empty starts from a newline; default: the model\'s first '
        "sample prompt, from its folder's corpus.json, else empty)",
    )
    _add_sampling_arguments(g)
    _add_structured_arguments(g)
    g.add_argument("--backend", default=DEFAULT_BACKEND, help=f"what computes the logits: {', '.join(BACKENDS)}")
    g.add_argument("--threads", type=thread_count, default=None, help="threads per forward pass (none: all CPUs)")
    g.add_argument("--no-echo", action="store_true", help="do not print the prompt before the continuation")
    g.add_argument("--stats", action="store_true", help="print tokens/s to stderr")
    add_verbose_and_progress(g)
    g.set_defaults(func=run)


def _add_sampling_arguments(g) -> None:
    """The request's fields but `--backend`: how many characters, how they are drawn, past the window, unknowns."""
    sampling = {
        "max_new_tokens": (int, "characters to generate"),
        "temperature": (float, "0 = greedy"),
        "top_k": (int, "keep the k most likely characters (0: all)"),
        "top_p": (float, "nucleus sampling (1 = off)"),
        "repetition_penalty": (float, "> 1 discourages repeats (1 = off)"),
    }
    for field, (kind, text) in sampling.items():
        g.add_argument("--" + field.replace("_", "-"), type=kind, default=None, help=_help(text, field))
    add_generation_config_argument(g)
    g.add_argument("--seed", type=int, default=None, help="sampling seed (none: random)")
    g.add_argument("--stop", action="append", default=None, help="end the text before this string (up to 4 times)")
    g.add_argument(
        "--window-mode",
        choices=WINDOW_MODES,
        default=_default("window_mode"),
        help="past block_size: refill (fast: the cache restarts from the last tokens) or exact (the lesson's window)",
    )
    g.add_argument(
        "--refill-tokens", type=int, default=None, help="tokens kept by --window-mode refill (none: block_size // 2)"
    )
    g.add_argument("--unk-policy", choices=UNK_POLICIES, default="error", help="characters outside the vocabulary")
