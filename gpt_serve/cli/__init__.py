"""The `gpt-serve` command (also `python -m gpt_serve`).

    gpt-serve generate [MODEL] --prompt "ROMEO:" --max-new-tokens 300 [--backend torch|onnx|onnx-int8]
    gpt-serve models                  # the shipped models
    gpt-serve serve --port 8000       # the OpenAI-compatible API (POST /v1/completions), no web page
    gpt-serve serve --ray --replicas 2 --threads 1   # the same API, as Ray Serve replicas (the `ray` extra)
    gpt-serve import ckpt.pt my-model  # bring your own model: the lesson's gpt.py or nanoGPT, then ONNX-exported
    gpt-serve record-vocab FOLDER     # record vocab.json's sha256 in config.json (a folder that lacks it)
    gpt-serve train ...               # the training pipeline (python -m training from a clone)
    gpt-serve ladder ...              # the lesson's loss ladder (python -m training.ladder)
    gpt-serve export MODEL ...        # ONNX export (python -m export)
    gpt-serve demo ...                # the Gradio demo (python -m demo)

`generate`, `models`, `serve`, `import` and `record-vocab` are the library's own. The other subcommands are the
applications, which the library never imports: each registers itself as an entry point of the `gpt_serve.commands`
group (see pyproject.toml), and only the one asked for is loaded, so `generate --backend onnx` never imports torch.
`import` runs the `export` application the same way on the folder it wrote. Every command imports what it needs when
it runs (`generate --backend onnx` and `models`: numpy and onnxruntime alone); one that cannot import a dependency
prints one line naming the extra to install (`missing_dependency`) and exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
import time
from importlib.metadata import EntryPoint, entry_points

from ..chargpt.vocab import UNK_POLICIES
from ..extras import MissingDependency, missing_base, missing_extra
from ..generation import BACKENDS, WINDOW_MODES, EngineError, load_backend, parse_request
from ..generation.backends.threads import check_threads
from ..generation.fields import DEFAULT_BACKEND, FIELDS_BY_NAME, MAX_NEW_TOKENS
from ..generation.inline import inline_scheduler
from ..generation.scheduler import DEFAULT_MAX_BATCH, DEFAULT_MAX_QUEUE
from ..generation.text import TextStream
from ..models import DEFAULT_MODEL
from ..serving.server_limits import ServerLimits

COMMANDS_GROUP = "gpt_serve.commands"
# What `gpt-serve --help` says of the applications' subcommands (loading one just for its help would import it).
COMMAND_HELP = {
    "train": "train a model (see `gpt-serve train --help`)",
    "ladder": "train the lesson's ladder stages and write the table",
    "export": "export a model folder to ONNX and validate it",
    "demo": "launch the Gradio web demo",
}
PORT_HINT = "another server holds the port? choose another with --port N"  # `gpt-serve serve`, with or without Ray
# The extra each command needs beyond gpt-serve's own dependencies (numpy, torch, transformers, safetensors); the
# others need only those, or less (`generate --backend onnx` and `models`: numpy and onnxruntime)
EXTRAS = {
    "train": "train", "ladder": "train", "export": "export", "demo": "demo", "serve": "serve", "serve --ray": "ray",
}  # fmt: skip


def quiet_model_loading(show: bool = False) -> None:
    """No "Loading weights" progress bar from transformers in the commands' output, unless `show` (`--progress`,
    `--verbose`) or `HF_HUB_DISABLE_PROGRESS_BARS=0` in the environment (which `show` sets, so that the library's
    own quiet loading, `modeling_chargpt.quiet_weight_loading`, keeps the bar too)."""
    if show:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "0"
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] != "0":  # read at its import
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


def add_progress_argument(parser, default: bool = False, help: str = "show transformers' weight-loading bar") -> None:
    """`--progress` / `--no-progress`, the one spelling of every command's progress switch (`gpt-serve` and its
    subcommands, `python -m training`, the ladder, the export, the demo)."""
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=default, help=help)


def _default(field: str):
    return FIELDS_BY_NAME[field].default


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def tcp_port(text: str) -> int:
    """argparse type: a TCP port, in [1, 65535]."""
    value = int(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"must be a TCP port in [1, 65535], got {text}")
    return value


API_KEY_ENV = "GPT_SERVE_API_KEY"


def add_api_arguments(parser) -> None:
    """The OpenAI-compatible API's access flags, the same for `gpt-serve serve` and the demo."""
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"every API route but /health then needs 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}, if set)",
    )
    parser.add_argument(
        "--metrics-need-key", action="store_true", help="/metrics needs the API key too (default: open, as /health)"
    )
    parser.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let a browser page from ORIGIN (e.g. https://example.org) call the API (CORS); repeatable",
    )


LIMIT_FLAGS = {  # flag: (ServerLimits field, argparse type, help)
    "--max-body-bytes": ("max_body_bytes", positive_int, "the largest request body accepted (past it: 413)"),
    "--body-timeout": ("body_timeout", "seconds", "seconds a request's body may take to arrive (past them: 408)"),
    "--header-timeout": ("header_timeout", "seconds", "seconds a client may take to send a request's headers"),
    "--shutdown-timeout": (
        "shutdown_timeout", "seconds",
        "on SIGTERM or Ctrl-C, seconds open requests get to end before they are cut (their streams end with "
        "finish_reason 'abort' and [DONE])",
    ),
}  # fmt: skip


def add_limit_arguments(parser) -> None:
    """The server's bounds (`gpt_serve.serving.server_limits.ServerLimits`), the same for `gpt-serve serve` and the
    demo."""
    defaults = ServerLimits()
    for flag, (field, kind, text) in LIMIT_FLAGS.items():
        parser.add_argument(
            flag,
            type=positive_float if kind == "seconds" else kind,
            default=argparse.SUPPRESS,  # left out: no attribute, and `server_limits` takes the default
            help=f"{text} (default {getattr(defaults, field):,})",
        )


def server_limits(args) -> ServerLimits:
    """The `ServerLimits` of the flags of `add_limit_arguments` (a flag left out: the default)."""
    given = {field: getattr(args, field) for field, _, _ in LIMIT_FLAGS.values() if hasattr(args, field)}
    return ServerLimits(**given)


def api_options(args) -> dict:
    """`create_router`'s access options from the flags of `add_api_arguments`."""
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    if key is not None and not key.strip():
        raise ValueError("--api-key is empty")
    return dict(api_key=key, metrics_need_key=args.metrics_need_key, allow_origins=tuple(args.allow_origin))


def max_tokens_limit(text: str) -> int:
    """argparse type: a server's limit of max_tokens, in [1, MAX_NEW_TOKENS] (the request specification's)."""
    value = positive_int(text)
    if value > MAX_NEW_TOKENS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_NEW_TOKENS} (the request specification's limit)")
    return value


def thread_count(text: str) -> int:
    """argparse type: a thread count in [1, the CPUs this process may use]."""
    try:
        return check_threads(int(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            str(e).replace("threads must be None (the runtime's default) or ", "must be ")
        ) from None


def check_port_free(host: str, port: int, hint: str) -> None:
    """An OSError naming `hint` (how to choose another port) when (host, port) cannot be bound: checked before any
    model loads, so a busy port costs no wait."""
    import socket

    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
            probe.bind((host, port))
    except OSError as e:
        raise OSError(f"cannot serve on {host}:{port} ({e.strerror or e}): {hint}") from None


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def app_commands() -> dict[str, EntryPoint]:
    """The applications' subcommands installed with this package: name -> entry point (not loaded)."""
    return {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP)}


def missing_dependency(command: str, error: ImportError) -> str:
    """The one line `gpt-serve COMMAND` prints when an import fails: an error that already says what to install (a
    `MissingDependency`, e.g. the torch backend's) as it is, else the extra the command needs (`EXTRAS`; none:
    gpt-serve's own dependencies, which `pip install --no-deps` leaves out)."""
    if isinstance(error, MissingDependency):
        return f"gpt-serve {command}: {error}"
    if not error.name or error.name.split(".")[0].startswith("gpt_serve"):  # not a dependency: gpt-serve's own
        return f"gpt-serve {command}: error: {error}"
    what, extra = f"gpt-serve {command}", EXTRAS.get(command)
    return str(missing_extra(what, extra, error) if extra else missing_base(what, error))


def _run_app(entry: EntryPoint, argv: list[str]) -> int:
    try:  # the app's module, then what it imports as it runs: e.g. a torch-free install running `gpt-serve train`
        return entry.load()(argv)
    except ImportError as e:
        print(missing_dependency(entry.name, e), file=sys.stderr)
        return 2


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


def default_prompt(model) -> str:
    """`gpt-serve generate`'s prompt when none is given: the model's first sample prompt (its folder's
    corpus.json), else the empty prompt (the text after a newline; also when that record is broken, a warning says
    so: the model generates all the same, as the demo serves it)."""
    from ..folders.corpus import corpus_record_or_none
    from ..models import model_path

    record = corpus_record_or_none(model_path(model))
    return record.default_prompt if record is not None else ""


def _generate(args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    prompt = default_prompt(args.model) if prompt is None else prompt
    # every field checked by the request specification before anything loads, as a server checks it
    request = parse_request({**{name: getattr(args, name) for name in GENERATE_FIELDS}, "prompt": prompt})
    loaded = load_backend(args.model, request.backend, args.threads)
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


def _serve(args: argparse.Namespace) -> int:
    if args.ray:
        return _serve_ray(args)
    ray_only = {"--replicas": args.replicas, "--replica-cpus": args.replica_cpus, "--ray-address": args.ray_address}
    given = [flag for flag, value in ray_only.items() if value is not None]
    if given:
        raise ValueError(f"only with --ray: {', '.join(given)}")
    from ..serving.api import create_app  # fastapi: the `serve` extra (a message, not a traceback: `main`)
    from ..serving.limits import run_server
    from ..serving.registry import ModelRegistry

    check_port_free(args.host, args.port, PORT_HINT)
    registry = ModelRegistry.discover(
        args.model_dir, args.models_root, expected=(), threads=args.threads, max_batch=args.max_batch,
        max_queue=args.max_queue,
    )  # fmt: skip
    if not registry.available:
        raise ValueError(f"no model folder found under {args.models_root} or in --model-dir")
    if not args.no_preload:  # the first request should not wait for a model to load
        print(f"gpt-serve serve: {registry.preload(args.backend)[1]}", file=sys.stderr)
    options, limits = api_options(args), server_limits(args)
    app = create_app(
        registry, default_backend=args.backend, max_tokens_limit=args.max_tokens_limit, limits=limits, **options
    )
    print(f"gpt-serve serve: models {registry.available} on http://{args.host}:{args.port}/v1", file=sys.stderr)
    run_server(app, args.host, args.port, args.log_level, limits, app.state.drain, args.access_log)
    return 0


def _serve_ray(args: argparse.Namespace) -> int:
    from ..models import MODELS_DIR

    not_with_ray = [f for f in ("--header-timeout", "--shutdown-timeout") if hasattr(args, LIMIT_FLAGS[f][0])]
    not_with_ray += ["--access-log"] if args.access_log else []  # the replicas' request lines: --log-level info
    if not_with_ray:  # Ray's proxy holds the connections, and the replicas' shutdown is Ray's
        raise ValueError(f"not with --ray: {', '.join(not_with_ray)}")
    from ..serving.ray_serve import RayServeOptions, require_ray, serving  # the `ray` extra (a message: `main`)

    require_ray()  # before anything starts
    limits = server_limits(args)
    options = RayServeOptions(
        replicas=args.replicas or 1,
        replica_cpus=args.replica_cpus or 1.0,
        threads=args.threads,
        models_root=None if args.models_root == str(MODELS_DIR) else args.models_root,  # None: each replica's own
        model_dirs=tuple(args.model_dir),
        backend=args.backend,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        max_tokens_limit=args.max_tokens_limit,
        max_body_bytes=limits.max_body_bytes,
        body_timeout=limits.body_timeout,
        preload=not args.no_preload,
        **api_options(args),
    )
    if args.ray_address is None:  # a new local instance: its proxy binds the port
        check_port_free(args.host, args.port, PORT_HINT)
    models = options.registry().available  # checked here, before Ray starts; each replica finds its own
    with serving(options, args.host, args.port, args.ray_address, args.log_level) as url:
        replicas = f"{options.replicas} Ray Serve replica{'s' if options.replicas > 1 else ''}"
        print(f"gpt-serve serve: models {models} on {url}/v1, {replicas}; Ctrl-C stops", file=sys.stderr)
        signal.signal(signal.SIGTERM, interrupt)  # a service manager's stop: the same clean exit as Ctrl-C
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


def interrupt(signum, frame):
    """A SIGTERM handler: KeyboardInterrupt, as Ctrl-C raises."""
    for stop in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut the shutdown short
        signal.signal(stop, signal.SIG_IGN)
    raise KeyboardInterrupt


def _import(args: argparse.Namespace) -> int:
    """`gpt-serve import`: the model folder (`gpt_serve.folders.importing`), then its ONNX export by the export app."""
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    from ..folders.importing import SOURCE_NAMES, import_checkpoint

    command = shlex.join(["gpt-serve", *args.argv])
    imported = import_checkpoint(
        args.source, args.out, corpus=args.corpus, meta=args.meta, attn_scale=args.attn_scale, force=args.force,
        command=command,
    )  # fmt: skip
    config = imported.model.config
    print(
        f"gpt-serve import: wrote {args.out} from {SOURCE_NAMES[imported.source_format]} ({config.n_layer} layers, "
        f"{config.n_head} heads, n_embd {config.n_embd}, block_size {config.block_size}, {len(imported.vocab)} "
        f"characters: {imported.vocab_source})",
        file=sys.stderr,
    )
    export_argv = [args.out, *(["--data", str(imported.corpus)] if imported.corpus else [])]
    export_argv += ["--threads", str(args.threads)] if args.threads is not None else []
    later = f"gpt-serve export {shlex.join(export_argv)}"
    if args.no_export:
        print(f"gpt-serve import: not exported to ONNX (--no-export); to export it: {later}", file=sys.stderr)
        return 0
    entry, export_main = app_commands().get("export"), None
    try:
        export_main = entry.load() if entry is not None else None
        missing = "the export application is not installed"
    except ImportError as e:
        missing = f"the export application cannot import {e.name or e}"
    if export_main is None:
        print(
            f"gpt-serve import: not exported to ONNX ({missing}): pip install 'gpt-serve[export]', then {later}",
            file=sys.stderr,
        )
        return 0
    code = export_main(export_argv)
    if code != 0:
        print(f"gpt-serve import: {args.out} is written, but its ONNX export failed (above); {later}", file=sys.stderr)
    return code


def _import_parser(sub) -> None:
    i = sub.add_parser(
        "import",
        help="make a model folder of a checkpoint of the lesson's gpt.py or of nanoGPT (and export it to ONNX)",
        description="Convert a checkpoint into a gpt-serve model folder, written whole or not at all, then export "
        "it to ONNX. The format is read from the file: the lesson's gpt.py (torch.save(model.state_dict())) or "
        "nanoGPT (out-*/ckpt.pt with the meta.pkl of its character vocabulary). Checkpoints are read with "
        "torch.load(weights_only=True) and meta.pkl by an unpickler that admits only dicts, strings and integers.",
    )
    i.add_argument("source", help="the checkpoint: a gpt.py state dict, or nanoGPT's ckpt.pt")
    i.add_argument("out", help="the model folder to write (must not exist, unless --force)")
    i.add_argument(
        "--corpus",
        default=None,
        help="the text the model was trained on: the lesson's vocabulary is its sorted(set(text)) (default: Tiny "
        "Shakespeare's 65 characters); also the export's validation text",
    )
    i.add_argument("--meta", default=None, help="nanoGPT's meta.pkl (default: beside SOURCE, or data/DATASET/meta.pkl)")
    i.add_argument(
        "--attn-scale",
        default=None,  # checked by CharGPTConfig (its module imports transformers: not while parsing)
        metavar="head_size|n_embd",
        help="the lesson's gpt.py only: n_embd for a gpt.py that scaled attention by C**-0.5, as typed in the video "
        "(default: head_size, the final gpt.py's k.shape[-1]**-0.5)",
    )
    i.add_argument("--force", action="store_true", help="replace OUT if it exists")
    i.add_argument("--no-export", action="store_true", help="write the folder only, no ONNX export")
    i.add_argument("--threads", type=thread_count, default=None, help="torch and ONNX Runtime threads (none: all CPUs)")
    i.add_argument("--verbose", action="store_true", help="the same as --progress")
    add_progress_argument(i)
    i.set_defaults(func=_import)


def _copy(args: argparse.Namespace) -> int:
    from ..folders.publishing import plan_copy, write_self_contained
    from ..models import model_path

    skipped = plan_copy(model_path(args.model)).skipped
    out = write_self_contained(args.model, args.out, replace=args.force)
    for name, why in skipped:
        print(f"gpt-serve copy: skipped {name}: {why}", file=sys.stderr)
    print(
        f"gpt-serve copy: wrote {out}: it loads without gpt-serve, "
        f'AutoModelForCausalLM.from_pretrained("{out}", trust_remote_code=True)',
        file=sys.stderr,
    )
    return 0


def _copy_parser(sub) -> None:
    c = sub.add_parser(
        "copy",
        help="write a self-contained copy of a model (its code included): for plain transformers or the Hub",
        description="Copy a shipped model (by name) or a model folder into a new folder that also holds the "
        "model's code, so that plain transformers loads it with trust_remote_code=True: what a Hugging Face Hub "
        "repository holds (upload the folder as it is). It holds the model's files only: other code files, pickles, "
        "symbolic links and unknown files are skipped, and named. Written whole or not at all.",
    )
    c.add_argument("model", help="shipped model name or model folder")
    c.add_argument("out", help="the folder to write (must not exist, unless --force)")
    c.add_argument("--force", action="store_true", help="replace OUT if it exists")
    add_progress_argument(c)
    c.set_defaults(func=_copy)


def _record_vocab(args: argparse.Namespace) -> int:
    from ..generation.backends.loading import record_vocab_sha256

    path, digest = record_vocab_sha256(args.model)
    print(f"gpt-serve record-vocab: {path} now records vocab_sha256 {digest}")
    return 0


def _models(args: argparse.Namespace) -> int:
    from ..models import discover

    for name, folder in discover().items():
        print(f"{name:14s} {folder}")
    return 0


def build_parser(apps: dict[str, EntryPoint] | None = None) -> argparse.ArgumentParser:
    from .. import __version__

    p = argparse.ArgumentParser(prog="gpt-serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"gpt-serve {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser(
        "generate", help="stream text from a model", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    g.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="shipped model name or model folder")
    g.add_argument(
        "--prompt",
        default=None,
        help='the text to continue ("-" reads stdin; empty starts from a newline; default: the model\'s first '
        "sample prompt, from its folder's corpus.json, else empty)",
    )
    g.add_argument("--max-new-tokens", type=int, default=_default("max_new_tokens"), help="characters to generate")
    g.add_argument("--temperature", type=float, default=_default("temperature"), help="0 = greedy")
    g.add_argument("--top-k", type=int, default=_default("top_k"), help="keep the k most likely characters (0: all)")
    g.add_argument("--top-p", type=float, default=_default("top_p"), help="nucleus sampling (1 = off)")
    g.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats (1 = off)")
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
    g.add_argument("--backend", default=DEFAULT_BACKEND, help=f"what computes the logits: {', '.join(BACKENDS)}")
    g.add_argument("--threads", type=thread_count, default=None, help="threads per forward pass (none: all CPUs)")
    g.add_argument("--no-echo", action="store_true", help="do not print the prompt before the continuation")
    g.add_argument("--stats", action="store_true", help="print tokens/s to stderr")
    g.add_argument("--verbose", action="store_true", help="the same as --progress")
    add_progress_argument(g)
    g.set_defaults(func=_generate)
    m = sub.add_parser("models", help="list the shipped models")
    m.set_defaults(func=_models)
    _serve_parser(sub)
    _import_parser(sub)
    _copy_parser(sub)
    v = sub.add_parser(
        "record-vocab",
        help="record the sha256 of a folder's vocab.json in its config.json (vocab_sha256)",
        description="Write the sha256 of MODEL's vocab.json into its config.json as vocab_sha256, which every loader "
        "then checks. A folder without it loads only if its vocabulary is in the lesson's sorted order; run this "
        "only for a vocabulary you know to be the one the model was trained with.",
    )
    v.add_argument("model", help="a model folder (or a shipped model name)")
    v.set_defaults(func=_record_vocab)
    for name in apps if apps is not None else app_commands():
        sub.add_parser(name, help=COMMAND_HELP.get(name, f"see `gpt-serve {name} --help`"), add_help=False)
    return p


def _serve_parser(sub) -> None:
    from ..models import MODELS_DIR

    s = sub.add_parser(
        "serve",
        help="serve the OpenAI-compatible completions API (no web page)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    s.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0: every interface, opt-in)")
    s.add_argument("--port", type=tcp_port, default=8000)
    s.add_argument("--models-root", default=str(MODELS_DIR), help="folder whose sub-folders are the models")
    s.add_argument("--model-dir", action="append", default=[], metavar="[NAME=]PATH", help="add a model folder")
    s.add_argument("--backend", choices=list(BACKENDS), default=DEFAULT_BACKEND, help="when a request names none")
    threads = "threads per forward pass (none: all CPUs; with --ray: the replica's CPUs)"
    s.add_argument("--threads", type=thread_count, default=None, help=threads)
    batch = "requests decoded at once, per model"
    s.add_argument("--max-batch", type=positive_int, default=DEFAULT_MAX_BATCH, help=batch)
    s.add_argument("--max-queue", type=positive_int, default=DEFAULT_MAX_QUEUE, help="requests waiting; past it: 429")
    s.add_argument(
        "--max-tokens-limit",
        type=max_tokens_limit,
        default=MAX_NEW_TOKENS,
        help=f"the largest max_tokens accepted (at most {MAX_NEW_TOKENS})",
    )
    s.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the server's (with --ray: the replicas')",
    )
    s.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="a line per request in the server's log (uvicorn's access log; not with --ray)",
    )
    s.add_argument("--verbose", action="store_true", help="the same as --progress")
    add_progress_argument(s)
    add_api_arguments(s)
    add_limit_arguments(s)
    s.add_argument(
        "--no-preload",
        action="store_true",
        help="load models on first use (default: the default model for --backend is loaded and warmed up first)",
    )
    r = s.add_argument_group("Ray Serve (pip install 'gpt-serve[ray]')")
    r.add_argument("--ray", action="store_true", help="serve through Ray Serve replicas behind Ray's HTTP proxy")
    r.add_argument("--replicas", type=positive_int, default=None, help="replicas, each with its own models (none: 1)")
    r.add_argument("--replica-cpus", type=positive_float, default=None, help="CPUs Ray reserves per replica (none: 1)")
    r.add_argument(
        "--ray-address", default=None, help="join this Ray cluster ('auto': this machine's; none: a new local one)"
    )
    s.set_defaults(func=_serve)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    apps = app_commands()
    if argv and argv[0] in apps:
        return _run_app(apps[argv[0]], argv[1:])
    args = build_parser(apps).parse_args(argv)
    args.argv = argv  # as typed, for what a command records of itself (`import`'s model card)
    quiet_model_loading(getattr(args, "verbose", False) or getattr(args, "progress", False))
    try:
        return args.func(args)
    except ImportError as e:  # a dependency the command needs is not installed: what to install, never a traceback
        print(missing_dependency("serve --ray" if getattr(args, "ray", False) else args.command, e), file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError, EngineError) as e:  # OSError: missing or unreadable files
        print(f"gpt-serve: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
