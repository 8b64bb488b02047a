"""Structured outputs through the OpenAI-compatible API, with the official `openai` client: vLLM's
`structured_outputs`, OpenAI's `response_format`, `logit_bias`, `allowed_token_ids`, on completions and chat, with
n and streaming; and the 400s of what cannot be served."""

from __future__ import annotations

import re

import openai
import pytest

from gpt_serve.serving.registry import ModelRegistry
from tests.helpers import serving

SPEAKER = r"[A-Z]{2,8}:\n[a-z ]{2,20}\."  # bounded: a random model reaches its end within max_tokens
SCHEMA = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}


@pytest.fixture(scope="module")
def client(models_root):
    from gpt_serve.serving.api import create_app

    registry = ModelRegistry.discover(models_root=models_root, expected=(), threads=1, max_batch=8)
    with serving(create_app(registry)) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    registry.close()


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_completions_follow_a_regex_for_every_choice(client, backend):
    out = client.completions.create(
        model="tiny",
        prompt="ROMEO:",
        max_tokens=60,
        n=4,
        seed=1,
        extra_body={"backend": backend, "structured_outputs": {"regex": SPEAKER}},
    )
    assert len(out.choices) == 4
    for c in out.choices:
        assert re.fullmatch(SPEAKER, c.text) and c.finish_reason == "stop", c


def test_streamed_choices_follow_it_too(client):
    body = {"structured_outputs": {"regex": SPEAKER}}
    chunks = list(
        client.completions.create(
            model="tiny", prompt="ROMEO:", max_tokens=60, n=2, seed=3, stream=True, extra_body=body
        )
    )
    texts = ["".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in range(2)]
    assert all(re.fullmatch(SPEAKER, t) for t in texts), texts
    whole = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=60, n=2, seed=3, extra_body=body)
    assert [c.text for c in whole.choices] == texts  # the same seeds, the same texts


def test_a_chat_reply_is_one_of_the_choices(client):
    choices = ["Ay, my lord.", "No."]
    out = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Wilt thou?"}],
        n=6,
        seed=0,
        max_tokens=40,
        extra_body={"structured_outputs": {"choice": choices}},
    )
    for c in out.choices:
        assert c.message.content in choices and c.finish_reason == "stop"


GRAMMAR = 'start: NAME ":\\n" WORDS "."\nNAME: /[A-Z]{2,8}/\nWORDS: /[a-z ]{2,20}/\n'  # SPEAKER, in Lark


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_grammar_governs_every_choice_streamed_or_not(client, backend):
    body = {"backend": backend, "structured_outputs": {"grammar": GRAMMAR}}
    kw = dict(model="tiny", prompt="ROMEO:", max_tokens=60, n=3, seed=4, extra_body=body)
    chunks = list(client.completions.create(**kw, stream=True))
    texts = ["".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in range(3)]
    whole = client.completions.create(**kw)
    assert [c.text for c in whole.choices] == texts
    for c in whole.choices:
        assert re.fullmatch(SPEAKER, c.text) and c.finish_reason == "stop", c


def test_a_chat_reply_follows_a_grammar(client):
    out = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Wilt thou?"}],
        n=4,
        seed=0,
        max_tokens=40,
        extra_body={"structured_outputs": {"grammar": 'root ::= ("Ay" | "No") (", my lord." | "!")'}},
    )
    for c in out.choices:
        assert c.message.content in ("Ay, my lord.", "No, my lord.", "Ay!", "No!") and c.finish_reason == "stop"


def test_a_grammar_that_runs_into_a_missing_character_is_a_422_naming_it(client):
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.completions.create(
            model="tiny",
            prompt="ROMEO:",
            max_tokens=5,
            extra_body={"structured_outputs": {"grammar": 'start: "a" "{"'}},
        )
    assert (
        "the grammar goes on after 1 character only with characters this model's vocabulary cannot write: '{'"
        in (e.value.body["message"])
    )


def test_a_json_schema_the_vocabulary_cannot_write_is_a_400_naming_the_characters(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Thy age?"}],
            max_tokens=9,
            response_format={"type": "json_schema", "json_schema": {"name": "age", "schema": SCHEMA}},
        )
    message = e.value.body["message"]
    assert message.startswith("response_format.json_schema.schema: this model's vocabulary cannot write any text")
    assert "'{'" in message and "'\"'" in message and e.value.body["param"] == "response_format"


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs.regex: the regex is malformed"),
        ({"structured_outputs": {"grammar": "start: foo"}}, "grammar is malformed or unsupported: at 1(8): unknown"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs takes exactly one of"),
        ({"response_format": {"type": "yaml"}}, "response_format must be an object whose type is one of"),
        ({"allowed_token_ids": [999]}, "allowed_token_ids holds ids outside this model's vocabulary"),
        ({"logit_bias": {"999": 1}}, "logit_bias holds ids [999] outside the vocabulary"),
    ],
)
def test_bad_constraints_are_a_400_naming_the_field(client, extra, message):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=5, extra_body=extra)
    assert message in e.value.body["message"]


def test_logit_bias_and_allowed_token_ids(client):
    e = 43  # 'e' in Tiny Shakespeare's vocabulary
    out = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=100, n=4, seed=2, logit_bias={e: -100})
    assert all("e" not in c.text for c in out.choices)
    out = client.completions.create(
        model="tiny", prompt="ROMEO:", max_tokens=30, seed=2, temperature=0, logit_bias={e: 100}
    )
    assert out.choices[0].text == "e" * 30
    out = client.completions.create(
        model="tiny", prompt="ROMEO:", max_tokens=30, seed=2, extra_body={"allowed_token_ids": [1, 43]}
    )
    assert set(out.choices[0].text) <= {" ", "e"}


def test_response_format_text_changes_nothing(client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Hail."}], max_tokens=20, seed=4)
    plain = client.chat.completions.create(**kw)
    assert client.chat.completions.create(**kw, response_format={"type": "text"}).choices[0].message.content == (
        plain.choices[0].message.content
    )
