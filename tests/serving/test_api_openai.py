"""The OpenAI-compatible API as a vLLM user drives it: chat, logprobs, echo, n and best_of, penalties, token-id
prompts, the extra endpoints, the API key, CORS and the metrics; with the official `openai` client and LangChain's
`ChatOpenAI` against a server on 127.0.0.1 (a free port), no network."""

from __future__ import annotations

import threading

import httpx
import numpy as np
import openai
import pytest

from gpt_serve.generation import SamplingParams, generate_text
from gpt_serve.generation.fields import RequestError
from gpt_serve.generation.sampling import log_softmax
from gpt_serve.serving.chat import render
from gpt_serve.serving.registry import ModelRegistry
from tests.helpers import wait_until

KEY = "test-key-123"


@pytest.fixture(scope="module")
def server(models_root):
    import socket

    import uvicorn

    from gpt_serve.serving.api import create_app

    registry = ModelRegistry.discover(models_root=models_root, expected=(), threads=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(registry, api_key=KEY, allow_origins=["https://page.example"])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert wait_until(lambda: server.started, 30)
    url = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    yield client, url, registry
    server.should_exit = True
    thread.join(timeout=10)


def library(registry, prompt, n, backend="torch", **kwargs):
    loaded = registry.backend("tiny", backend)
    # a request that names no temperature gets the folder's (generation_config.json)
    sampling = SamplingParams(kwargs.pop("temperature", registry.generation_defaults("tiny")["temperature"]))
    return generate_text(loaded.backend, loaded.vocab, prompt, n, sampling, **kwargs)


def test_chat_is_a_play_script_and_the_reply_one_speech(server):
    client, _, registry = server
    messages = [
        {"role": "system", "content": "A street in Verona."},
        {"role": "user", "content": "What light?\n\n\nSoft!"},
        {"role": "assistant", "name": "juliet", "content": "Ay me!"},
        {"role": "user", "content": "She speaks."},
    ]
    prompt = render(messages)
    assert (
        prompt
        == "A street in Verona.\n\nROMEO:\nWhat light?\nSoft!\n\nJULIET:\nAy me!\n\nROMEO:\nShe speaks.\n\nJULIET:\n"
    )
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=60, seed=4, temperature=0.9)
    reply = out.choices[0].message.content
    assert out.choices[0].message.role == "assistant" and out.object == "chat.completion"
    full = library(registry, prompt, 60, seed=4, temperature=0.9)
    assert reply == full.split("\n\n")[0]  # the speech, ended at the blank line before the next speaker
    assert out.choices[0].finish_reason == ("stop" if "\n\n" in full else "length")
    assert out.usage.prompt_tokens == len(prompt) and out.usage.completion_tokens >= len(reply)


def test_chat_streams_n_choices_with_their_own_seeds(server):
    client, _, registry = server
    messages = [{"role": "user", "content": "Speak."}]
    kwargs = dict(model="tiny", messages=messages, max_tokens=30, seed=10, n=2, stop=["x"])
    whole = client.chat.completions.create(**kwargs)
    texts = {0: "", 1: ""}
    roles = set()
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            roles |= {c.delta.role} - {None}
            texts[c.index] += c.delta.content or ""
    assert roles == {"assistant"}
    assert [texts[0], texts[1]] == [c.message.content for c in whole.choices]
    prompt = render(messages)
    for i in (0, 1):
        expected = library(registry, prompt, 30, seed=10 + i, stop=["x", "\n\n"])
        assert whole.choices[i].message.content == expected


@pytest.mark.parametrize("backend", ["torch", "onnx-int8"])
def test_logprobs_are_the_models_own_softmax(server, backend):
    client, _, registry = server
    out = client.completions.create(
        model="tiny", prompt="ROMEO:", max_tokens=9, temperature=0, logprobs=3, echo=True,
        extra_body={"backend": backend},
    )  # fmt: skip
    choice = out.choices[0]
    lp = choice.logprobs
    loaded = registry.backend("tiny", backend)
    ids = loaded.vocab.encode(choice.text)
    assert choice.text.startswith("ROMEO:") and lp.tokens == list(choice.text)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # the first prompt token: nothing to score
    assert lp.text_offset == list(range(len(choice.text)))
    # the library's own softmax of the model's logits, position by position
    logits = loaded.backend.sequence_logits(np.asarray(ids, dtype=np.int64))
    expected = log_softmax(logits)
    for i in range(1, len(ids)):
        assert abs(lp.token_logprobs[i] - expected[i - 1, ids[i]]) < 1e-4, i
        top = dict(sorted(((loaded.vocab.chars[t], v) for t, v in enumerate(expected[i - 1])), key=lambda x: -x[1])[:3])
        assert lp.top_logprobs[i].keys() == top.keys()
    # greedy: every generated token is the most likely one
    for i in range(6, len(ids)):
        assert lp.token_logprobs[i] == max(lp.top_logprobs[i].values())


def test_chat_logprobs(server):
    client, _, _ = server
    out = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0, logprobs=True,
        top_logprobs=2, stop=["zzz"],
    )  # fmt: skip
    content = out.choices[0].logprobs.content
    assert "".join(t.token for t in content) == out.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.logprob == t.top_logprobs[0].logprob for t in content)


def test_n_best_of_and_token_id_prompts(server):
    client, _, registry = server
    ids = registry.backend("tiny", "torch").vocab.encode("ROMEO:")
    out = client.completions.create(model="tiny", prompt=ids, max_tokens=10, seed=5, n=3)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.text for c in out.choices] == [library(registry, "ROMEO:", 10, seed=5 + i) for i in range(3)]
    assert out.usage.prompt_tokens == 6 and out.usage.completion_tokens == 30
    best = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=10, seed=5, n=1, best_of=3)
    assert len(best.choices) == 1 and best.choices[0].text in [c.text for c in out.choices]
    two = client.completions.create(model="tiny", prompt=[ids, "JULIET:"], max_tokens=4, seed=1, n=2)
    assert len(two.choices) == 4 and two.choices[2].text == library(registry, "JULIET:", 4, seed=3)


def test_presence_and_frequency_penalties_are_applied(server):
    client, _, registry = server
    plain = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=40, temperature=0)
    penalized = client.completions.create(
        model="tiny", prompt="ROMEO:", max_tokens=40, temperature=0, frequency_penalty=2, presence_penalty=2
    )
    assert len(set(penalized.choices[0].text)) > len(set(plain.choices[0].text))
    loaded = registry.backend("tiny", "torch")
    sampling = SamplingParams(0, frequency_penalty=2.0, presence_penalty=2.0)
    assert penalized.choices[0].text == generate_text(loaded.backend, loaded.vocab, "ROMEO:", 40, sampling)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(messages=[]), "messages must be a non-empty list"),
        (dict(messages=[{"role": "tool", "content": "x"}]), "messages[0].role must be one of"),
        (dict(messages=[{"role": "user", "content": "é"}]), "outside this model's vocabulary: 'é'"),
        (dict(messages=[{"role": "user", "content": "hi", "name": "x" * 70}]), "a speaker's name is 1-64"),
        (dict(top_logprobs=2), "top_logprobs needs logprobs: true"),
    ],
)
def test_bad_chat_requests_are_a_400(server, kwargs, message):
    client, _, _ = server
    args = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5) | kwargs
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(**args)
    assert message in error.value.message


def test_the_api_key_guards_every_route_but_health(server):
    _, url, _ = server
    for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                         ("POST", "/tokenize"), ("GET", "/version")]:  # fmt: skip
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            answer = httpx.request(method, url + path, headers=headers, json={})
            assert answer.status_code == 401, (path, headers)
            assert answer.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/metrics").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()


def test_endpoints_a_vllm_client_reaches_for(server):
    client, url, registry = server
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    auth = {"Authorization": f"Bearer {KEY}"}
    ids = httpx.post(url + "/tokenize", headers=auth, json={"model": "tiny", "prompt": "ROMEO:"}).json()
    assert ids == {"count": 6, "max_model_len": 16, "tokens": registry.backend("tiny", "torch").vocab.encode("ROMEO:")}
    text = httpx.post(url + "/detokenize", headers=auth, json={"model": "tiny", "tokens": ids["tokens"]}).json()
    assert text == {"prompt": "ROMEO:"}
    assert httpx.get(url + "/version", headers=auth).json()["version"]
    for method, path, status in [("GET", "/v1/embeddings", 404), ("GET", "/v1/completions", 405), ("GET", "/x", 404)]:
        answer = httpx.request(method, url + path, headers=auth)
        assert answer.status_code == status and "message" in answer.json()["error"], (path, answer.text)


def test_cors_is_opt_in_for_the_named_origins(server):
    _, url, _ = server
    preflight = {"Origin": "https://page.example", "Access-Control-Request-Method": "POST"}
    answer = httpx.options(url + "/v1/completions", headers=preflight)
    assert answer.headers.get("access-control-allow-origin") == "https://page.example"
    other = httpx.options(url + "/v1/completions", headers={**preflight, "Origin": "https://evil.example"})
    assert other.headers.get("access-control-allow-origin") is None


# What the official OpenAI JS SDK asks a preflight for (openai 6), in a browser's spelling of the request
SDK_HEADERS = (
    "authorization,content-type,x-stainless-arch,x-stainless-lang,x-stainless-os,x-stainless-package-version,"
    "x-stainless-retry-count,x-stainless-runtime,x-stainless-runtime-version,x-stainless-timeout"
)


def test_a_preflight_allows_the_headers_an_sdk_asks_for_from_an_allowed_origin_only(server):
    _, url, _ = server
    asks = {"Origin": "https://page.example", "Access-Control-Request-Method": "POST"}
    sdk_asks = {**asks, "Access-Control-Request-Headers": SDK_HEADERS}
    answer = httpx.options(url + "/v1/chat/completions", headers=sdk_asks)
    allowed = answer.headers["access-control-allow-headers"].split(", ")
    assert answer.status_code == 204 and allowed == SDK_HEADERS.split(",")
    assert {"origin", "access-control-request-headers"} <= set(answer.headers["vary"].lower().split(", "))
    # asked for nothing: what a plain fetch with a key and JSON needs; a name that is no header name is left out
    assert httpx.options(url + "/v1/models", headers=asks).headers["access-control-allow-headers"] == (
        "authorization, content-type"
    )
    odd_asks = {**asks, "Access-Control-Request-Headers": "X-Ok, bad header,,x(y)"}
    odd = httpx.options(url + "/v1/models", headers=odd_asks)
    assert odd.headers["access-control-allow-headers"] == "authorization, content-type, x-ok"
    other = httpx.options(url + "/v1/chat/completions", headers={**sdk_asks, "Origin": "https://evil.example"})
    assert other.status_code == 204 and "access-control-allow-headers" not in other.headers
    # what the preflight allows still needs the key
    sdk = {name: "1" for name in SDK_HEADERS.split(",")[2:]}
    refused = httpx.get(url + "/v1/models", headers={"Origin": "https://page.example", **sdk})
    assert refused.status_code == 401


def test_metrics_a_dashboard_plots(server):
    client, url, _ = server
    client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=5, extra_body={"backend": "torch"})
    text = httpx.get(url + "/metrics").text
    labels = '{backend="torch",model="tiny"}'
    for name in ("time_to_first_token_seconds_count", "inter_token_latency_seconds_count",
                 "e2e_request_latency_seconds_count", "request_queue_time_seconds_count"):  # fmt: skip
        assert f"gpt_serve_{name}{labels}" in text, name
    assert f"gpt_serve_prompt_tokens_total{labels}" in text and f"gpt_serve_generation_tokens_total{labels}" in text
    assert 'gpt_serve_request_success_total{backend="torch",finished_reason="length",model="tiny"}' in text
    assert f"gpt_serve_num_requests_running{labels}" in text and f"gpt_serve_num_requests_waiting{labels}" in text


def test_the_grafana_dashboard_plots_these_metrics():
    import json
    from pathlib import Path

    board = json.loads((Path(__file__).parents[2] / "deploy" / "grafana-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in board["panels"] for t in p.get("targets", []))
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                 "request_queue_time_seconds", "prompt_tokens_total", "generation_tokens_total",
                 "request_success_total", "num_requests_running", "num_requests_waiting"):  # fmt: skip
        assert f"gpt_serve_{name}" in exprs, name


def test_langchain_chat_openai_streams_a_reply(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    _, url, _ = server
    chat = langchain_openai.ChatOpenAI(
        model="tiny", base_url=f"{url}/v1", api_key=KEY, max_tokens=20, temperature=0, max_retries=0
    )
    pieces = [chunk.content for chunk in chat.stream("Good morrow.")]
    whole = chat.invoke("Good morrow.").content
    assert "".join(pieces) == whole and whole


def test_speakers_can_be_renamed():
    messages = [{"role": "user", "content": "Hal!"}]
    assert render(messages, {"user": "falstaff", "assistant": "Prince Henry"}) == "FALSTAFF:\nHal!\n\nPRINCE HENRY:\n"
    with pytest.raises(RequestError, match="speakers must map roles"):
        render(messages, {"narrator": "X"})


def test_the_demos_mounted_api_takes_the_same_access_options(models_root):
    """`python -m demo --api-key K --allow-origin O` mounts the router with them on the demo's own app."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from demo.cli import build_parser, mount_api
    from gpt_serve.cli.server_flags import api_options

    args = build_parser().parse_args(["--api-key", "k2", "--allow-origin", "https://page.example"])
    app = FastAPI()
    registry = ModelRegistry.discover(models_root=models_root, expected=(), threads=1)
    assert mount_api(app, registry, "torch", 100, **api_options(args))
    with TestClient(app) as client:
        assert client.get("/v1/models").status_code == 401
        ok = client.get("/v1/models", headers={"Authorization": "Bearer k2", "Origin": "https://page.example"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://page.example"
        assert client.get("/health").status_code == 200
    registry.close()


def test_the_api_key_comes_from_the_environment_too(monkeypatch):
    from gpt_serve.cli import build_parser
    from gpt_serve.cli.server_flags import API_KEY_ENV, api_options

    monkeypatch.setenv(API_KEY_ENV, "from-env")
    args = build_parser().parse_args(["serve"])
    assert api_options(args)["api_key"] == "from-env"
    args = build_parser().parse_args(["serve", "--api-key", "flag"])
    assert api_options(args)["api_key"] == "flag"
    with pytest.raises(ValueError, match="--api-key is empty"):
        api_options(build_parser().parse_args(["serve", "--api-key", " "]))
