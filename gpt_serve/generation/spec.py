"""A checked generation request (`GenerationRequest`, whose constructor is the check) and the parser of what a user
sent (`parse_request`: aliases, unknown fields, a folder's defaults, a server's cap). Every surface parses into it,
so a bad value gets the same `RequestError` everywhere; the table it checks against is `fields.FIELDS`, and
docs/generation.md says why each limit is what it is. numpy-free, torch-free.

    request = parse_request({"prompt": "ROMEO:", "max_tokens": 200, "temperature": 0.8, "seed": 1})
    request.sampling        # SamplingParams(temperature=0.8, ...), what the sampler gets
"""

from __future__ import annotations

import numbers
import secrets
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from typing import Any

from ..chargpt.window import DEFAULT_WINDOW_MODE
from .fields import (
    ALIASES,
    FIELDS,
    FIELDS_BY_NAME,
    MAX_PROMPT_CHARS,
    MAX_PROMPT_WORK,
    MAX_SEED,
    MAX_STOP_CHARS,
    MAX_STOP_SEQUENCES,
    RANDOM_SEEDS,
    RequestError,
    check_value,
    show_value,
)
from .sampling import SamplingParams
from .structured import CHECKS, Constraint


def check_prompts(prompts: list, rows_each: int = 1) -> None:
    """The limits of a request's prompts as a whole: each (text, or a list of token ids) at most `MAX_PROMPT_CHARS`
    long, and their lengths times `rows_each` (the rows each prompt gets) at most `MAX_PROMPT_WORK` in all;
    RequestError naming the prompt (by its index in a list of several) and the limit otherwise."""
    total = 0
    for i, prompt in enumerate(prompts):
        unit = "characters" if isinstance(prompt, str) else "token ids"
        last = "characters" if isinstance(prompt, str) else "ids"
        if len(prompt) > MAX_PROMPT_CHARS:
            where = f"prompt {i}" if len(prompts) > 1 or not isinstance(prompt, str) else "prompt"
            raise RequestError(
                f"{where} is {len(prompt):,} {unit} long; the limit is {MAX_PROMPT_CHARS:,} "
                f"(the model reads only the last block_size {last})",
                "prompt",
            )
        total += len(prompt) * rows_each
    if total > MAX_PROMPT_WORK:
        rows = f" x {rows_each} rows each" if rows_each > 1 else ""
        raise RequestError(
            f"the prompts' lengths ({len(prompts)} prompts{rows}) add up to {total:,} tokens; the limit of a "
            f"request is {MAX_PROMPT_WORK:,}",
            "prompt",
        )


@dataclass(frozen=True)
class GenerationRequest:
    """A checked request. The constructor is the check: every field against the request table (`FIELDS`, OpenAI's
    ranges), `max_tokens_limit` (a server's cap) bounding `max_new_tokens`; RequestError naming the first bad
    field. A seed of None or -1 is drawn here (`seed_was_random`). `sampling` (the sampler's settings, held by
    reference by every choice and row) is made from the sampling fields, or given instead of them. `backend` and
    `model` are None where the sender left them to the server. Frozen: nothing edits it once checked."""

    prompt: str = ""
    max_new_tokens: int = 256
    # the sampler's fields: None (not given) is the table's default (1.0, 0, 1.0, 1.0, 0.0, 0.0, 0.0) once checked
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_p: float | None = None
    logprobs: int | None = None
    seed: int | None = 0
    stop: tuple[str, ...] = ()
    window_mode: str = DEFAULT_WINDOW_MODE
    refill_tokens: int | None = None
    unk_policy: str = "error"
    structured_outputs: Constraint | None = None
    response_format: Constraint | None = None
    logit_bias: tuple[tuple[int, float], ...] | None = None  # None: () once checked
    allowed_token_ids: tuple[int, ...] | None = None
    backend: str | None = None
    model: str | None = None
    sampling: SamplingParams | None = field(default=None, repr=False, compare=False)
    seed_was_random: bool = False  # (set when the seed is drawn here)
    max_tokens_limit: InitVar[int | None] = None

    def __post_init__(self, max_tokens_limit: int | None):
        for f in FIELDS:
            if f.name in SAMPLING_FIELDS:
                continue
            value = getattr(self, f.name)
            if f.name == "seed":
                self._set_seed(value)
            elif f.kind in CHECKS:
                object.__setattr__(self, f.name, _check_structured(f.kind, value))
            else:
                object.__setattr__(self, f.name, check_value(f.name, value, _cap(f.name, max_tokens_limit)))
            if f.name == "max_new_tokens":  # the sampler's fields in the table's order
                self._set_sampling()
        if self.window_mode == "exact" and self.refill_tokens is not None:
            raise RequestError("refill_tokens applies only with window_mode 'refill'", "refill_tokens")
        if self.structured_outputs and self.response_format:
            raise RequestError("give structured_outputs or a JSON response_format, not both", "response_format")

    def _set_seed(self, seed: Any) -> None:
        random_seed = seed is None or (isinstance(seed, numbers.Real) and not isinstance(seed, bool) and seed == -1)
        object.__setattr__(self, "seed", secrets.randbelow(RANDOM_SEEDS) if random_seed else check_value("seed", seed))
        object.__setattr__(self, "seed_was_random", random_seed or self.seed_was_random)

    def _set_sampling(self) -> None:
        """`sampling` from the sampling fields (checked against the table, OpenAI's ranges), or the fields from a given
        `sampling` (a library caller's, held to the engine's own bounds by its constructor)."""
        given = {name: getattr(self, name) for name in SAMPLING_FIELDS if getattr(self, name) is not None}
        sampling = self.sampling
        if sampling is None:  # the fields a user sent: OpenAI's ranges (a given SamplingParams: the engine's own)
            given = {name: check_value(name, value) for name, value in given.items()}
            sampling = SamplingParams(**{**given, "top_k": given.get("top_k") or None})
            object.__setattr__(self, "sampling", sampling)
        elif not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        elif any(value != _field_of(sampling, name) for name, value in given.items()):
            raise RequestError("give sampling or its fields (temperature, top_k, ...), not both", "sampling")
        for name in SAMPLING_FIELDS:
            object.__setattr__(self, name, _field_of(sampling, name))

    @property
    def constraint(self) -> Constraint | None:
        """What the text must be (`structured_outputs` or `response_format`, at most one of them)."""
        return self.structured_outputs or self.response_format

    def seed_for(self, index: int) -> int:
        """The seed of prompt `index` of a list (`offset_seed`)."""
        return offset_seed(self.seed, index)


# the fields that make `GenerationRequest.sampling` (checked by `SamplingParams`)
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
SAMPLING_FIELDS += ("min_p",)


def _field_of(sampling: SamplingParams, name: str) -> Any:
    return sampling.top_k or 0 if name == "top_k" else getattr(sampling, name)


def _check_structured(kind: str, value: Any) -> Any:
    """`CHECKS[kind]` of `value`, which may be what that check made already (a `dataclasses.replace` of a request)."""
    if isinstance(value, Constraint):
        return value
    if kind == "logit_bias" and isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        value = dict(value)
    return CHECKS[kind](value)


def _cap(name: str, max_tokens_limit: int | None) -> int | None:
    return max_tokens_limit if name == "max_new_tokens" else None


def offset_seed(seed: int, index: int) -> int:
    """The seed of item `index` of a list sent with `seed`: `seed + index`, wrapping inside the seed range."""
    return (seed + index) % (MAX_SEED + 1)


def parse_request(
    values: Mapping[str, Any], max_tokens_limit: int | None = None, defaults: Mapping[str, Any] | None = None
) -> GenerationRequest:
    """A `GenerationRequest` from what a user sent: field names or their aliases (see `FIELDS`); RequestError naming
    an unknown or repeated field, or the first bad value. `max_tokens_limit` is a server's cap of `max_new_tokens`;
    `defaults` (a model folder's: `folder_defaults.read_generation_defaults`) replace the table's for fields not sent
    (None is not sent); a default `max_new_tokens` over the cap is lowered to it. Loads nothing."""
    if not isinstance(values, Mapping):
        raise RequestError(f"a request must be a mapping of field names to values, got {type(values).__name__}")
    given: dict[str, Any] = {}
    sent_as: dict[str, str] = {}
    for key, value in values.items():
        name = ALIASES.get(key, key)
        if name not in FIELDS_BY_NAME:
            raise RequestError(f"unknown field {show_value(key)}; the fields are {[f.name for f in FIELDS]}", str(key))
        if name in given:
            raise RequestError(f"{sent_as[name]} and {key} are the same field: give one of them", name)
        given[name], sent_as[name] = value, key
    for name, value in (defaults or {}).items():
        if name != "seed" and given.get(name) is None:
            given[name] = min(value, max_tokens_limit or value) if name == "max_new_tokens" else value
    given.setdefault("seed", None)  # left out: drawn
    return GenerationRequest(**{k: v for k, v in given.items() if v is not None or k == "seed"},
                             max_tokens_limit=max_tokens_limit)  # fmt: skip


def spec_table() -> dict[str, dict[str, Any]]:
    """`FIELDS` as plain data (JSON), for clients that cannot import this module: the browser page's
    `demo/web/spec.json` is `spec_json()`, and a test keeps it so."""
    table = {}
    for f in FIELDS:
        entry: dict[str, Any] = {"kind": f.kind, "default": list(f.default) if f.kind == "stop" else f.default}
        for key in ("lo", "hi", "lo_open", "choices", "aliases", "hint", "doc"):
            value = getattr(f, key)
            if value is not None and value != () and value != "" and value is not False:
                entry[key] = list(value) if isinstance(value, tuple) else value
        table[f.name] = entry
    table["stop"].update(max_sequences=MAX_STOP_SEQUENCES, max_chars=MAX_STOP_CHARS)
    table["seed"]["random_below"] = RANDOM_SEEDS
    return table


def spec_json() -> str:
    """`spec_table()` as the text of `demo/web/spec.json`."""
    import json

    return json.dumps(spec_table(), indent=2) + "\n"
