"""The request side of structured outputs: vLLM's `structured_outputs`, OpenAI's `response_format`, `logit_bias`
and vLLM's `allowed_token_ids`, checked and turned into plain, hashable values (`Constraint`, tuples). Knows
nothing about a vocabulary: `constraints` compiles a `Constraint` for one (docs/structured.md). numpy-free,
torch-free.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .fields import RequestError, show_value

KINDS = ("regex", "choice", "json", "grammar", "json_object")  # vLLM's structured_outputs, exactly one of them
MAX_PATTERN_CHARS = 10_000  # a regex, a grammar, the choices together
MAX_SCHEMA_CHARS = 100_000  # a JSON schema's JSON text
MAX_SCHEMA_DEPTH = 16  # objects and arrays nested in a schema
MAX_CHOICES = 1_000
MAX_BIAS_ENTRIES = 1_000
MAX_ALLOWED_IDS = 100_000
BIAS_RANGE = 100  # OpenAI's: a bias in [-100, 100] is added to the token's logit
# What `json_object` (either field) asks for: any JSON object, nested without limit. That is no regular language:
# llguidance compiles it (in about 2 ms) and masks by its parser (docs/structured.md).
JSON_OBJECT_SCHEMA = json.dumps({"type": "object"})


@dataclass(frozen=True)
class Constraint:
    """What a request's text must be: `kind` one of `KINDS`, `value` the regex, the grammar, the canonical JSON of
    a schema, or the choices (a tuple); `source` where the request gave it ('structured_outputs.regex',
    'response_format.json_schema.schema': messages name it); `end` a text that may follow the constrained text (a
    chat's end of speech)."""

    kind: str
    value: str | tuple[str, ...]
    source: str = "structured_outputs"
    end: str = ""

    def ending(self, end: str) -> Constraint:
        return replace(self, end=end)

    @property
    def field(self) -> str:
        """The request field it came from."""
        return self.source.split(".")[0]


def check_structured_outputs(value: Any) -> Constraint | None:
    """vLLM's `structured_outputs`: an object with exactly one of `KINDS` (null: none)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise RequestError(f"structured_outputs must be an object with one of {list(KINDS)}, got {show_value(value)}",
                           "structured_outputs")  # fmt: skip
    unknown = [k for k in value if k not in KINDS]
    given = [k for k in KINDS if value.get(k) not in (None, False)]
    if unknown or len(given) != 1:
        what = f"unknown keys {unknown}" if unknown else f"{len(given)} of them ({given})"
        raise RequestError(f"structured_outputs takes exactly one of {list(KINDS)}, got {what}", "structured_outputs")
    kind = given[0]
    return _constraint(kind, value[kind], "structured_outputs", f"structured_outputs.{kind}")


def check_response_format(value: Any) -> Constraint | None:
    """OpenAI's `response_format`: `{"type": "text"}` (none), `{"type": "json_object"}`, or `{"type": "json_schema",
    "json_schema": {"name", "schema", "strict", "description"}}`."""
    if value is None:
        return None
    kinds = ("text", "json_object", "json_schema")
    if not isinstance(value, Mapping) or value.get("type") not in kinds:
        raise RequestError(f"response_format must be an object whose type is one of {list(kinds)}, got "
                           f"{show_value(value)}", "response_format")  # fmt: skip
    extra = [k for k in value if k not in ("type", "json_schema")]
    if extra or ("json_schema" in value) != (value["type"] == "json_schema"):
        raise RequestError("response_format takes type, and json_schema only with type 'json_schema'",
                           "response_format")  # fmt: skip
    if value["type"] == "text":
        return None
    if value["type"] == "json_object":
        return Constraint("json_object", JSON_OBJECT_SCHEMA, "response_format.type")
    spec = value["json_schema"]
    keys = ("name", "schema", "strict", "description")
    if not isinstance(spec, Mapping) or "schema" not in spec or any(k not in keys for k in spec):
        raise RequestError(f"response_format.json_schema must be an object with schema (and name, strict, "
                           f"description), got {show_value(spec)}", "response_format")  # fmt: skip
    if spec.get("strict") not in (None, True, False):
        raise RequestError("response_format.json_schema.strict must be true or false", "response_format")
    return _constraint("json", spec["schema"], "response_format", "response_format.json_schema.schema")


def _constraint(kind: str, value: Any, field: str, where: str) -> Constraint:
    if kind == "json_object":
        if value is not True:
            raise RequestError(f"{where} must be true, got {show_value(value)}", field)
        return Constraint(kind, JSON_OBJECT_SCHEMA, where)
    if kind == "json":
        return Constraint(kind, _schema_text(value, where, field), where)
    if kind == "choice":
        if (
            not isinstance(value, (list, tuple))
            or not 0 < len(value) <= MAX_CHOICES
            or not all(isinstance(c, str) and c for c in value)
            or sum(map(len, value)) > MAX_PATTERN_CHARS
        ):
            raise RequestError(f"{where} must be a list of 1 to {MAX_CHOICES:,} non-empty strings of at most "
                               f"{MAX_PATTERN_CHARS:,} characters in all, got {show_value(value)}", field)  # fmt: skip
        return Constraint(kind, tuple(dict.fromkeys(value)), where)
    if not isinstance(value, str) or not value or len(value) > MAX_PATTERN_CHARS:
        raise RequestError(f"{where} must be a non-empty string of at most {MAX_PATTERN_CHARS:,} characters, got "
                           f"{show_value(value)}", field)  # fmt: skip
    return Constraint(kind, value, where)


def _schema_text(schema: Any, where: str, field: str) -> str:
    """The schema as canonical JSON text (a JSON string is parsed first), its depth bounded before anything
    recurses into it."""
    if isinstance(schema, str):
        if len(schema) > MAX_SCHEMA_CHARS:
            raise RequestError(f"{where} is {len(schema):,} characters long; the limit is {MAX_SCHEMA_CHARS:,}", field)
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError) as e:
            raise RequestError(f"{where} is not valid JSON: {e}", field) from None
    if not isinstance(schema, Mapping):
        raise RequestError(f"{where} must be a JSON schema (an object), got {show_value(schema)}", field)
    stack = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise RequestError(f"{where} nests objects and arrays more than {MAX_SCHEMA_DEPTH} deep", field)
        children = node.values() if isinstance(node, Mapping) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (Mapping, list)))
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_SCHEMA_CHARS:
        raise RequestError(f"{where} is {len(text):,} characters long; the limit is {MAX_SCHEMA_CHARS:,}", field)
    return text


def check_logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias`: token ids (integers, or their decimal strings as JSON keys are) to a bias in [-100,
    100], added to the token's logit; as sorted (id, bias) pairs. Null or {}: none."""
    if value is None:
        return ()
    message = (f"logit_bias must map token ids to numbers in [-{BIAS_RANGE}, {BIAS_RANGE}] (at most "
               f"{MAX_BIAS_ENTRIES:,} of them)")  # fmt: skip
    if not isinstance(value, Mapping) or len(value) > MAX_BIAS_ENTRIES:
        raise RequestError(f"{message}, got {show_value(value)}", "logit_bias")
    pairs = {}
    for key, bias in value.items():
        token = _token_id(key)
        ok = isinstance(bias, numbers.Real) and not isinstance(bias, bool) and -BIAS_RANGE <= bias <= BIAS_RANGE
        if token is None or not ok:
            raise RequestError(f"{message}, got {show_value(key)}: {show_value(bias)}", "logit_bias")
        pairs[token] = float(bias)
    return tuple(sorted(pairs.items()))


def _token_id(key: Any) -> int | None:
    if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 10:
        return int(key)
    return key if isinstance(key, int) and not isinstance(key, bool) and key >= 0 else None


def check_allowed_token_ids(value: Any) -> tuple[int, ...] | None:
    """vLLM's `allowed_token_ids`: a non-empty list of token ids, the only ones sampled (null: all)."""
    if value is None:
        return None
    if (
        not isinstance(value, (list, tuple))
        or not 0 < len(value) <= MAX_ALLOWED_IDS
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    ):
        raise RequestError(f"allowed_token_ids must be a non-empty list of token ids, got {show_value(value)}",
                           "allowed_token_ids")  # fmt: skip
    return tuple(sorted(set(value)))


# the checks of the fields of these kinds in the request table (`fields.FIELDS`), for `spec.parse_request`
CHECKS = {
    "structured_outputs": check_structured_outputs,
    "response_format": check_response_format,
    "logit_bias": check_logit_bias,
    "token_ids": check_allowed_token_ids,
}
