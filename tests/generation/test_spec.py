"""The request specification: one table of fields, one parser, one set of messages (every surface parses into it)."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from demo.browser import WEB_DIR
from gpt_serve.generation.fields import FIELDS, MAX_NEW_TOKENS, MAX_SEED, RANDOM_SEEDS, RequestError
from gpt_serve.generation.sampling import SamplingParams
from gpt_serve.generation.spec import GenerationRequest, parse_request, spec_json


def test_defaults():
    r = parse_request({})
    assert (r.prompt, r.max_new_tokens, r.temperature, r.top_k, r.top_p) == ("", 256, 1.0, 0, 1.0)
    assert (r.window_mode, r.refill_tokens, r.unk_policy, r.stop, r.backend, r.model) == (
        "refill",
        None,
        "error",
        (),
        None,
        None,
    )
    assert r.seed_was_random and 0 <= r.seed < RANDOM_SEEDS
    assert r.sampling.top_k is None and r.sampling.temperature == 1.0


@pytest.mark.parametrize(
    "fields",
    [
        {"max_new_tokens": 1},
        {"max_new_tokens": MAX_NEW_TOKENS},
        {"max_tokens": 5.0},
        {"temperature": 0},
        {"temperature": 2},
        {"top_p": 1e-9},
        {"top_k": 1_000_000},
        {"seed": 0},
        {"seed": MAX_SEED},
        {"stop": ["a", "b", "c", "d" * 100]},
        {"window_mode": "refill", "refill_tokens": 3},
        {"backend": "PyTorch"},
        {"backend": "int8"},
    ],
)
def test_values_at_the_edges_are_accepted(fields):
    parse_request(fields)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"max_new_tokens": 0}, r"max_new_tokens must be an integer in [1, 100000], got 0"),
        ({"max_tokens": MAX_NEW_TOKENS + 1}, r"max_new_tokens must be an integer in [1, 100000], got 100001"),
        ({"max_tokens": 2.5}, r"max_new_tokens must be an integer in [1, 100000], got 2.5"),
        ({"max_tokens": "5"}, r"max_new_tokens must be an integer in [1, 100000], got '5'"),
        ({"max_tokens": True}, r"max_new_tokens must be an integer in [1, 100000], got True"),
        ({"temperature": 2.0001}, r"temperature must be a number in [0, 2] (0 = greedy), got 2.0001"),
        ({"temperature": float("inf")}, r"temperature must be a number in [0, 2] (0 = greedy), got inf"),
        ({"temperature": 1e-400}, None),  # 0.0 after JSON: greedy, accepted
        ({"top_p": 0}, r"top_p must be a number in (0, 1], got 0"),
        ({"seed": MAX_SEED + 1}, r"seed must be an integer in [0, 9007199254740991] (null or -1 = random), got 9007"),
        ({"seed": 10**400}, r"seed must be an integer in [0, 9007199254740991] (null or -1 = random), got 1000"),
        ({"seed": -2}, r"seed must be an integer in [0, 9007199254740991] (null or -1 = random), got -2"),
        ({"stop": ["a"] * 5}, "stop must be a string or a list of at most 4 non-empty strings of at most 100"),
        ({"stop": [""]}, "stop must be a string or a list of at most 4 non-empty strings"),
        ({"window_mode": "slide"}, "window_mode must be one of ['exact', 'refill'], got 'slide'"),
        ({"window_mode": "exact", "refill_tokens": 3}, "refill_tokens applies only with window_mode 'refill'"),
        ({"unk_policy": "ignore"}, "unk_policy must be one of ['error', 'drop', 'replace'], got 'ignore'"),
        ({"backend": ["torch"]}, "backend must be one of 'torch' (PyTorch), 'onnx' (ONNX Runtime fp32)"),
        ({"prompt": "x" * 10_001}, "prompt is 10,001 characters long; the limit is 10,000"),
        ({"prompt": 5}, "prompt must be text, got int"),
        ({"nucleus": 0.1}, "unknown field 'nucleus'; the fields are ['prompt', 'max_new_tokens'"),
        ({"presence_penalty": 2.5}, "presence_penalty must be a number in [-2, 2] (0 = off), got 2.5"),
        ({"min_p": -0.1}, "min_p must be a number in [0, 1] (0 = off), got -0.1"),
        ({"logprobs": 21}, "logprobs must be an integer in [0, 20], got 21"),
        ({"max_tokens": 5, "max_new_tokens": 5}, "max_tokens and max_new_tokens are the same field: give one of them"),
    ],
)
def test_bad_values_are_refused_by_name(fields, message):
    if message is None:
        assert parse_request(fields).temperature == 0.0
        return
    with pytest.raises(RequestError) as e:
        parse_request(fields)
    assert str(e.value).startswith(message), str(e.value)
    assert len(str(e.value)) < 500  # a huge value is cut short in the message (the list of the fields is not)


def test_the_field_is_named_for_the_wire_formats():
    with pytest.raises(RequestError) as e:
        parse_request({"max_tokens": 0})
    assert e.value.field == "max_new_tokens"


def test_seeds():
    assert {parse_request({"seed": s}).seed_was_random for s in (None, -1, -1.0)} == {True}
    r = parse_request({"seed": 7})
    assert (r.seed, r.seed_was_random, r.seed_for(0), r.seed_for(2)) == (7, False, 7, 9)
    assert parse_request({"seed": MAX_SEED}).seed_for(1) == 0  # wraps inside the range


def test_a_server_lowers_max_new_tokens():
    with pytest.raises(RequestError, match=r"max_new_tokens must be an integer in \[1, 50\], got 51"):
        parse_request({"max_new_tokens": 51}, max_tokens_limit=50)
    assert parse_request({"max_new_tokens": 50}, max_tokens_limit=50).max_new_tokens == 50


def test_the_browser_pages_limits_are_the_table():
    """demo/web/spec.json is `spec_json()`, written by
    `python -c "from gpt_serve.generation.spec import spec_json; print(spec_json(), end='')" > demo/web/spec.json`."""
    text = (WEB_DIR / "spec.json").read_text(encoding="utf-8")
    assert text == spec_json(), "regenerate demo/web/spec.json (the command is in this test's docstring)"
    assert list(json.loads(text)) == [f.name for f in FIELDS]
    assert json.loads(text)["seed"]["hi"] == MAX_SEED == 2**53 - 1  # what a JavaScript number holds exactly


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"temperature": -5}, r"temperature must be a number in [0, 2] (0 = greedy), got -5"),
        ({"top_k": 2.5}, r"top_k must be an integer in [0, 1000000] (0 = no limit), got 2.5"),
        ({"max_new_tokens": 0}, r"max_new_tokens must be an integer in [1, 100000], got 0"),
        ({"stop": ("a",) * 5}, "stop must be a string or a list of at most 4 non-empty strings"),
        ({"logprobs": 21}, "logprobs must be an integer in [0, 20], got 21"),
        ({"window_mode": "exact", "refill_tokens": 3}, "refill_tokens applies only with window_mode 'refill'"),
        ({"logit_bias": {"x": 1}}, "logit_bias must map token ids to numbers"),
    ],
)
def test_no_constructor_skips_the_check(fields, message):
    """`GenerationRequest(...)` is checked as `parse_request` checks it: its sampler never holds an unchecked value."""
    with pytest.raises(RequestError) as e:
        GenerationRequest(**fields)
    assert str(e.value).startswith(message), str(e.value)


def test_the_constructor_normalizes_and_holds_a_given_sampler():
    r = GenerationRequest("ROMEO:", 5, top_k=3.0, temperature=1, stop="\n", logit_bias={"2": 1})
    assert (r.top_k, r.sampling.top_k, type(r.temperature), r.stop, r.logit_bias) == (3, 3, float, ("\n",), ((2, 1.0),))
    assert isinstance(r.sampling.top_k, int)
    sampling = SamplingParams(0.5, top_k=4)
    r = GenerationRequest("ROMEO:", 5, sampling=sampling, seed=None)
    assert r.sampling is sampling and (r.temperature, r.top_k) == (0.5, 4) and r.seed_was_random
    with pytest.raises(RequestError, match="give sampling or its fields"):
        GenerationRequest(temperature=0.7, sampling=sampling)
    with pytest.raises(TypeError, match="sampling must be a SamplingParams, got dict"):
        GenerationRequest(sampling={"temperature": 0.5})
    with pytest.raises(RequestError, match=r"max_new_tokens must be an integer in \[1, 50\], got 51"):
        GenerationRequest(max_new_tokens=51, max_tokens_limit=50)


def test_a_replaced_request_is_a_new_checked_one():
    import dataclasses

    r = parse_request({"temperature": 0.7, "logit_bias": {"3": -1}, "structured_outputs": {"regex": "a+"}})
    other = dataclasses.replace(r, model="other")
    assert (other.model, other.seed, other.seed_was_random, other.logit_bias) == ("other", r.seed, True, r.logit_bias)
    assert other.sampling is r.sampling and other.constraint is r.constraint
    with pytest.raises(RequestError, match="stop must be a string or a list of at most 4"):
        dataclasses.replace(r, stop=("a",) * 5)
    with pytest.raises(RequestError, match="give sampling or its fields"):  # never the old sampler, silently
        dataclasses.replace(r, temperature=1.0)


def test_the_checked_request_has_a_field_for_each_row_of_the_table_and_no_other():
    """A new request field is a row of `FIELDS` (its range, its doc, its aliases) and an attribute of
    `GenerationRequest` (its type): the two stay one list, so no attribute goes unchecked."""
    names = [f.name for f in fields(GenerationRequest)]
    assert names == [f.name for f in FIELDS] + ["sampling", "seed_was_random"]
