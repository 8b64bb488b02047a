"""The request table: every generation field's type, range, default and aliases (`FIELDS`, OpenAI's ranges), the
one check of a value against it (`check_value`) and its `RequestError`; the backend keys (`BACKENDS`,
`resolve_backend`). A leaf that `spec` and `sampling` read. numpy-free, torch-free.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Any

from ..chargpt.vocab import UNK_POLICIES
from ..chargpt.window import DEFAULT_WINDOW_MODE, WINDOW_MODES

# key -> what a UI shows. The keys are what `gpt-serve generate --backend`, the demo and the APIs take.
BACKENDS = {"torch": "PyTorch", "onnx": "ONNX Runtime fp32", "onnx-int8": "ONNX Runtime int8"}
DEFAULT_BACKEND = "torch"  # what a surface computes with when neither its user nor its request names a backend
# other names a request may give a backend by (`resolve_backend`), on every surface
BACKEND_ALIASES = {"pytorch": "torch", "onnx-fp32": "onnx", "onnxruntime": "onnx", "fp32": "onnx", "int8": "onnx-int8"}
MAX_PROMPT_CHARS = 10_000
MAX_PROMPT_WORK = 100_000  # tokens of prompt, summed over a request's rows
MAX_NEW_TOKENS = 100_000
MAX_SEED = 2**53 - 1
RANDOM_SEEDS = 2**31  # a drawn seed is below this: short enough to read back and type
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 100


class RequestError(ValueError):
    """A request refused, with a message meant for the person who sent it; `field` names the bad field."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Field:
    """One request field: `kind` is "integer", "number", "text", "choice", "stop", "backend", "model", or a kind of
    `structured.CHECKS`; `lo`/`hi` bound numbers (`hi` the length of text); None values (JSON null) mean the
    default."""

    name: str
    kind: str
    default: Any
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    choices: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    hint: str = ""
    doc: str = ""

    def interval(self, hi: float | None = None) -> str:
        """'[0, 2]', '(0, 1]', '[1, inf)': the accepted numbers (`hi`: a lower upper bound than the field's)."""
        hi = self.hi if hi is None else hi
        return f"{'(' if self.lo_open else '['}{_num(self.lo)}, {'inf)' if hi is None else _num(hi) + ']'}"


def _num(x) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


FIELDS: tuple[Field, ...] = (
    Field("prompt", "text", "", hi=MAX_PROMPT_CHARS, doc="the text to continue; empty starts after a newline"),
    Field(
        "max_new_tokens",
        "integer",
        256,
        1,
        MAX_NEW_TOKENS,
        aliases=("max_tokens", "max_completion_tokens"),
        doc="characters to generate",
    ),
    Field("temperature", "number", 1.0, 0, 2, hint=" (0 = greedy)", doc="sampling temperature"),
    Field("top_k", "integer", 0, 0, 1_000_000, hint=" (0 = no limit)", doc="sample among the k most likely"),
    Field("top_p", "number", 1.0, 0, 1, lo_open=True, doc="nucleus sampling (1 = off)"),
    Field("repetition_penalty", "number", 1.0, 0.01, 10, hint=" (1 = off)", doc="> 1 discourages repeats"),
    Field("presence_penalty", "number", 0.0, -2, 2, hint=" (0 = off)", doc="OpenAI's: per token the text holds"),
    Field("frequency_penalty", "number", 0.0, -2, 2, hint=" (0 = off)", doc="OpenAI's: per occurrence in the text"),
    Field("min_p", "number", 0.0, 0, 1, hint=" (0 = off)", doc="drop tokens below min_p times the likeliest"),
    Field("logprobs", "integer", None, 0, 20, doc="the top logprobs to report per token (null: none)"),
    Field("seed", "integer", None, 0, MAX_SEED, hint=" (null or -1 = random)", doc="the same seed gives the same text"),
    Field("stop", "stop", (), doc=f"up to {MAX_STOP_SEQUENCES} strings; the text ends before the first one"),
    Field("window_mode", "choice", DEFAULT_WINDOW_MODE, choices=WINDOW_MODES, doc="past block_size"),
    Field("refill_tokens", "integer", None, 1, None, doc="tokens kept by refill (null: block_size // 2)"),
    Field("unk_policy", "choice", "error", choices=UNK_POLICIES, doc="characters outside the vocabulary"),
    # structured outputs (`structured`, docs/structured.md): checked there, by their kind
    Field("structured_outputs", "structured_outputs", None, doc="vLLM's: one of regex, choice, json, json_object"),
    Field("response_format", "response_format", None, doc="OpenAI's: text, json_object or json_schema"),
    Field("logit_bias", "logit_bias", None, doc="token id -> bias in [-100, 100] added to its logit"),
    Field("allowed_token_ids", "token_ids", None, doc="vLLM's: only these token ids are sampled (null: all)"),
    Field("backend", "backend", None, doc="torch, onnx or onnx-int8 (null: the server's default)"),
    Field("model", "model", None, doc="a model name (null: the server's default)"),
)
FIELDS_BY_NAME = {f.name: f for f in FIELDS}
ALIASES = {alias: f.name for f in FIELDS for alias in f.aliases}


def show_value(value: Any) -> str:
    """A value for a message: its repr, cut short (a client can send a 20 MB string); a whole float as an integer,
    so that 0 in JSON and 0.0 from a command line read alike."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text):,} characters)"


def check_value(name: str, value: Any, hi: float | None = None) -> Any:
    """The field `name`'s value, checked and normalized (ints stay ints, numbers become floats, `stop` a tuple);
    RequestError naming the field, the accepted values and what was sent otherwise. `hi` lowers the upper bound
    (a server's own limit). None returns the field's default."""
    f = FIELDS_BY_NAME[name]
    if value is None:
        return f.default
    hi = f.hi if hi is None else min(hi, f.hi) if f.hi is not None else hi
    if f.kind in ("integer", "number"):
        return _check_number(f, value, hi)
    if f.kind == "text":
        if not isinstance(value, str):
            raise RequestError(f"{name} must be text, got {type(value).__name__}", name)
        if len(value) > hi:
            raise RequestError(
                f"{name} is {len(value):,} characters long; the limit is {int(hi):,} "
                f"(the model reads only the last block_size characters)",
                name,
            )
        return value
    if f.kind == "stop":
        return _check_stop(value)
    if f.kind == "choice":
        if not isinstance(value, str) or value not in f.choices:
            raise RequestError(f"{name} must be one of {list(f.choices)}, got {show_value(value)}", name)
        return value
    if f.kind == "backend":
        return resolve_backend(value)
    if not isinstance(value, str) or not value.strip():  # a model name, resolved by the server's registry
        raise RequestError(f"{name} must be a model name, got {show_value(value)}", name)
    return value.strip()


# The sampler's fields that the engine bounds more widely than OpenAI's wire does (its upper bound lifted): a library
# caller may sample hotter, keep more tokens or penalize repeats harder than an API request may ask.
ENGINE_UNBOUNDED = ("temperature", "top_k", "repetition_penalty")


def check_engine_value(name: str, value: Any) -> int | float:
    """A number field's value against the engine's own bounds (`SamplingParams`, `requests.check_request`): the
    table's, with the upper bound of `ENGINE_UNBOUNDED` lifted (a finite number still; a repetition_penalty below
    0.01 still overflows the logits); RequestError naming the field otherwise."""
    f = _ENGINE_FIELDS.get(name) or FIELDS_BY_NAME[name]
    return _check_number(f, value, f.hi)


_ENGINE_FIELDS = {name: replace(FIELDS_BY_NAME[name], hi=None) for name in ENGINE_UNBOUNDED}


def resolve_backend(value: Any) -> str:
    """A backend key from a key, an alias (`BACKEND_ALIASES`) or a UI label, case-insensitive; `RequestError`
    otherwise."""
    if isinstance(value, str):
        text = value.strip().lower()
        for key, label in BACKENDS.items():
            if text in (key, label.lower()):
                return key
        if text in BACKEND_ALIASES:
            return BACKEND_ALIASES[text]
    choices = ", ".join(f"{k!r} ({v})" for k, v in BACKENDS.items())
    raise RequestError(f"backend must be one of {choices}, got {show_value(value)}", "backend")


def _check_number(f: Field, value: Any, hi: float | None) -> int | float:
    integer = f.kind == "integer"
    message = f"{f.name} must be {'an integer' if integer else 'a number'} in {f.interval(hi)}{f.hint}"
    # bool is an int to Python, never to a user; and nothing is converted before it is bounded (a 400-digit integer
    # is compared as it is: float() of it would raise OverflowError)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RequestError(f"{message}, got {show_value(value)}", f.name)
    if not isinstance(value, numbers.Integral) and (
        not math.isfinite(value) or (integer and not float(value).is_integer())
    ):
        raise RequestError(f"{message}, got {show_value(value)}", f.name)
    low_ok = value > f.lo if f.lo_open else value >= f.lo
    if not low_ok or (hi is not None and value > hi):
        raise RequestError(f"{message}, got {show_value(value)}", f.name)
    return int(value) if integer else float(value)


def _check_stop(value: Any) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if (
        not isinstance(stops, (list, tuple))
        or len(stops) > MAX_STOP_SEQUENCES
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops)
    ):
        raise RequestError(
            f"stop must be a string or a list of at most {MAX_STOP_SEQUENCES} non-empty strings of at most "
            f"{MAX_STOP_CHARS} characters, got {show_value(value)}",
            "stop",
        )
    return tuple(stops)
