"""Structured outputs: the request fields (`structured`), their automata over a vocabulary (`constraints`), and what
the engine makes of them (`rows`, `text`), on the shipped model and on a tiny model whose vocabulary writes JSON."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from gpt_serve.generation import RequestError, parse_request
from gpt_serve.generation.constraints import compile_constraint
from gpt_serve.generation.scheduler import Scheduler
from gpt_serve.generation.structured import check_structured_outputs
from gpt_serve.generation.text import TextStream

SPEAKER_LINE = r"[A-Z][A-Z ]*:\n[A-Z][a-z ,]{3,40}[.!?]\n"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["name", "age", "ok"],
}


def texts(loaded, fields: dict, n: int = 1, max_batch: int = 1) -> list[TextStream]:
    """`n` choices of one request (seeds seed, seed + 1, ...), run together, read to the end."""
    request = parse_request(fields)
    scheduler = Scheduler(loaded.backend, max_batch=max_batch, max_queue=max(n, 1))
    try:
        streams = [TextStream(scheduler, loaded.vocab, request, i) for i in range(n)]
        for s in streams:
            for _ in s:
                pass
        return streams
    finally:
        scheduler.close()


def chars(loaded) -> list[str]:
    return loaded.vocab.chars


# -- the request fields --


@pytest.mark.parametrize(
    "value, message",
    [
        ({"regex": "a", "choice": ["b"]}, "exactly one of"),
        ({}, "exactly one of"),
        ({"regexp": "a"}, "unknown keys ['regexp']"),
        ({"choice": []}, "structured_outputs.choice must be a list of 1 to"),
        ({"choice": ["a", 3]}, "structured_outputs.choice must be a list"),
        ({"regex": ""}, "structured_outputs.regex must be a non-empty string"),
        ({"json": "{not json"}, "structured_outputs.json is not valid JSON"),
        ({"json": [1]}, "structured_outputs.json must be a JSON schema"),
        ({"json_object": "yes"}, "structured_outputs.json_object must be true"),
        ("a", "structured_outputs must be an object"),
    ],
)
def test_bad_structured_outputs_are_refused_by_name(value, message):
    with pytest.raises(RequestError, match=re.escape(message)) as e:
        parse_request({"structured_outputs": value})
    assert e.value.field == "structured_outputs"


def test_a_deeply_nested_schema_is_refused_before_anything_recurses_into_it():
    schema: dict = {"type": "string"}
    for _ in range(5000):  # deeper than Python's recursion limit
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(RequestError, match="nests objects and arrays more than 16 deep"):
        parse_request({"structured_outputs": {"json": schema}})


@pytest.mark.parametrize(
    "value, message",
    [
        ({"type": "xml"}, "response_format must be an object whose type is one of"),
        ({"type": "json_schema"}, "json_schema only with type 'json_schema'"),
        ({"type": "text", "json_schema": {}}, "json_schema only with type 'json_schema'"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "must be an object with schema"),
        ({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}, "strict must be true or false"),
    ],
)
def test_bad_response_formats_are_refused_by_name(value, message):
    with pytest.raises(RequestError, match=re.escape(message)):
        parse_request({"response_format": value})


def test_response_format_reads_as_openai_sends_it():
    assert parse_request({"response_format": {"type": "text"}}).constraint is None
    spec = {"name": "p", "schema": SCHEMA, "strict": True}
    c = parse_request({"response_format": {"type": "json_schema", "json_schema": spec}}).constraint
    assert (c.kind, json.loads(c.value), c.source) == ("json", SCHEMA, "response_format.json_schema.schema")
    assert parse_request({"response_format": {"type": "json_object"}}).constraint.kind == "json_object"
    with pytest.raises(RequestError, match="not both"):
        parse_request({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}})


@pytest.mark.parametrize(
    "value", [{"a": 1}, {"1": 101}, {"1": True}, {"-1": 5}, [1], {"1": float("nan")}, {str(i): 1 for i in range(1001)}]
)
def test_bad_logit_bias_is_refused(value):
    with pytest.raises(RequestError, match=r"logit_bias must map token ids to numbers in \[-100, 100\]"):
        parse_request({"logit_bias": value})


@pytest.mark.parametrize("value", [[], [-1], ["a"], [True], "1"])
def test_bad_allowed_token_ids_are_refused(value):
    with pytest.raises(RequestError, match="allowed_token_ids must be a non-empty list of token ids"):
        parse_request({"allowed_token_ids": value})


# -- compiling --


def test_a_regex_compiles_to_tables_over_the_vocabulary(shakespeare):
    a = compile_constraint(check_structured_outputs({"regex": "ab?c"}), chars(shakespeare))
    v = shakespeare.vocab.stoi
    assert a.allowed.shape == (a.n_states, len(v)) and a.allowed.dtype == bool
    assert a.allowed[a.initial].nonzero()[0].tolist() == [v["a"]]
    after_a = a.walk([v["a"]])
    assert sorted(a.allowed[after_a].nonzero()[0].tolist()) == sorted([v["b"], v["c"]])
    assert a.final[a.walk([v["a"], v["c"]])] and not a.accepting[after_a]
    assert compile_constraint(check_structured_outputs({"regex": "ab?c"}), chars(shakespeare)) is a  # cached


def test_states_that_cannot_reach_an_accepted_text_are_pruned(shakespeare):
    """`a` then `{` or `b`: the vocabulary has no `{`, so after `a` only `b` is offered, never a dead end."""
    a = compile_constraint(check_structured_outputs({"regex": "a(\\{|b)"}), chars(shakespeare))
    v = shakespeare.vocab.stoi
    assert a.allowed[a.walk([v["a"]])].nonzero()[0].tolist() == [v["b"]]


@pytest.mark.parametrize(
    "value, message",
    [
        ({"regex": "ab(c"}, "structured_outputs.regex: the regex is malformed or unsupported (missing ), unterminated"),
        ({"regex": "((a{100}){100}){100}"}, "structured_outputs.regex: compiling it"),
        ({"json": {"type": "nonsense"}}, "structured_outputs.json: the JSON schema is not supported"),
    ],
)
def test_bad_or_hostile_constraints_are_refused_not_stalled(shakespeare, value, message):
    with pytest.raises(RequestError, match=re.escape(message)) as e:
        compile_constraint(check_structured_outputs(value), chars(shakespeare))
    assert e.value.field == "structured_outputs"


def test_a_constraint_the_vocabulary_cannot_write_names_the_missing_characters(shakespeare):
    with pytest.raises(RequestError) as e:
        compile_constraint(check_structured_outputs({"json": SCHEMA}), chars(shakespeare))
    message = str(e.value)
    assert message.startswith("structured_outputs.json: this model's vocabulary cannot write any text")
    for c in '{"}0124':
        assert repr(c) in message
    assert "'3'" not in message and "'a'" not in message  # it has those


def test_the_compiler_still_works_after_a_hostile_pattern(shakespeare):
    with pytest.raises(RequestError):
        compile_constraint(check_structured_outputs({"regex": "((b{100}){100}){100}"}), chars(shakespeare))
    assert compile_constraint(check_structured_outputs({"regex": "bc+"}), chars(shakespeare)).n_states >= 2


# -- generation --


def test_sampled_speaker_lines_all_match_and_stop(shakespeare):
    fields = {
        "prompt": "ROMEO:\nI love thee.\n\n",
        "max_tokens": 200,
        "temperature": 1,
        "seed": 5,
        "structured_outputs": {"regex": SPEAKER_LINE},
    }
    streams = texts(shakespeare, fields, n=8, max_batch=8)
    for s in streams:
        assert re.fullmatch(SPEAKER_LINE, s.text), s.text
        assert s.finish_reason == "stop"
    assert len({s.text for s in streams}) > 1  # sampled, not one text eight times


def test_a_choice_request_returns_only_the_choices(shakespeare):
    choices = ["Ay.", "No, my lord.", "Nay"]
    streams = texts(
        shakespeare,
        {"prompt": "ROMEO:\n", "max_tokens": 50, "seed": 0, "structured_outputs": {"choice": choices}},
        n=16,
        max_batch=16,
    )
    assert all(s.text in choices and s.finish_reason == "stop" for s in streams)


def test_a_language_that_goes_on_ends_at_max_tokens_with_length(shakespeare):
    (s,) = texts(shakespeare, {"prompt": "A", "max_tokens": 30, "seed": 0, "structured_outputs": {"regex": "[a-z ]+"}})
    assert len(s.text) == 30 and re.fullmatch("[a-z ]+", s.text) and s.finish_reason == "length"


def test_logit_bias_minus_100_removes_a_character(shakespeare):
    e = shakespeare.vocab.stoi["e"]
    fields = {"prompt": "ROMEO:\n", "max_tokens": 200, "seed": 1, "temperature": 1.0}
    plain = texts(shakespeare, fields, n=4, max_batch=4)
    assert sum(s.text.count("e") for s in plain) > 20
    biased = texts(shakespeare, {**fields, "logit_bias": {str(e): -100}}, n=4, max_batch=4)
    assert all("e" not in s.text for s in biased)


def test_logit_bias_plus_100_forces_a_character_greedily(shakespeare):
    z = shakespeare.vocab.stoi["z"]
    (s,) = texts(shakespeare, {"prompt": "ROMEO:", "max_tokens": 10, "temperature": 0, "logit_bias": {z: 100}})
    assert s.text == "z" * 10


def test_allowed_token_ids_limit_the_text(shakespeare):
    ids = [shakespeare.vocab.stoi[c] for c in "ab "]
    (s,) = texts(shakespeare, {"prompt": "ROMEO:", "max_tokens": 40, "seed": 2, "allowed_token_ids": ids})
    assert set(s.text) <= set("ab ") and s.finish_reason == "length"
    with pytest.raises(RequestError, match="allowed_token_ids holds ids outside"):
        texts(shakespeare, {"prompt": "ROMEO:", "allowed_token_ids": [65]})


def test_logit_bias_ids_outside_the_vocabulary_are_refused(shakespeare):
    with pytest.raises(ValueError, match=r"logit_bias holds ids \[65\] outside the vocabulary"):
        texts(shakespeare, {"prompt": "ROMEO:", "logit_bias": {"65": 1}})


def test_the_logprobs_stay_the_models_own(shakespeare):
    fields = {"prompt": "ROMEO:\n", "max_tokens": 12, "seed": 3, "logprobs": 2}
    (plain,) = texts(shakespeare, {**fields, "temperature": 0})
    (forced,) = texts(shakespeare, {**fields, "temperature": 0, "structured_outputs": {"regex": re.escape(plain.text)}})
    assert forced.text == plain.text
    np.testing.assert_allclose([e[0] for e in forced.logprobs], [e[0] for e in plain.logprobs], rtol=0, atol=1e-9)


def test_a_row_alone_and_in_a_batch_of_64_gets_the_same_text(shakespeare):
    fields = {
        "prompt": "ROMEO:\n",
        "max_tokens": 40,
        "seed": 9,
        "temperature": 1,
        "structured_outputs": {"regex": SPEAKER_LINE},
    }
    alone = [texts(shakespeare, {**fields, "seed": 9 + i})[0].text for i in (0, 37)]
    batch = texts(shakespeare, fields, n=64, max_batch=64)
    assert [batch[0].text, batch[37].text] == alone


def test_the_automaton_state_is_a_function_of_a_rows_generated_tokens(shakespeare):
    """What a row made again from its tokens (a preempted row, prefilled again) finds: the state its steps reached."""
    from gpt_serve.generation.requests import Request, Stream
    from gpt_serve.generation.rows import Row

    a = compile_constraint(check_structured_outputs({"regex": "abc"}), chars(shakespeare))
    v = shakespeare.vocab.stoi
    row = Row(Stream(Request([v["R"]], 5, constraint=a), None), 16, len(v))
    assert row.state == a.initial  # the prompt is not the constraint's
    assert not row.accept(v["a"]) and not row.accept(v["b"])
    assert row.state == a.walk(row.ids[row.prompt_len :]) != a.initial
    assert row.accept(v["c"])  # accepted with nothing to follow: the row is complete


# -- a vocabulary that writes JSON --


def fits(value) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"name", "age", "ok"}
        and isinstance(value["name"], str)
        and len(value["name"]) <= 8
        and type(value["age"]) is int
        and isinstance(value["ok"], bool)
    )


def test_a_json_schema_gives_json_that_fits_it_for_every_sample(json_model):
    fields = {
        "prompt": "{",
        "max_tokens": 300,
        "seed": 0,
        "temperature": 1,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
    }
    streams = texts(json_model, fields, n=8, max_batch=8)
    for s in streams:
        assert fits(json.loads(s.text)), s.text
        assert s.finish_reason == "stop"


def test_json_object_gives_a_json_object(json_model):
    streams = texts(
        json_model,
        {"prompt": "x", "max_tokens": 400, "seed": 1, "response_format": {"type": "json_object"}},
        n=4,
        max_batch=4,
    )
    for s in streams:
        if s.finish_reason == "stop":
            assert isinstance(json.loads(s.text), dict), s.text
        else:  # a random model may not close it within max_tokens: what it wrote is still a prefix of one
            assert s.finish_reason == "length" and s.text.startswith("{")
