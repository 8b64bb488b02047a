"""The API's routers by concern (`gpt_serve.serving.api`), each served alone: the state reaches a route through the
`api_state` dependency, so a test overrides it instead of building the whole API."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gpt_serve.serving.api import create_app, models, tokens
from gpt_serve.serving.api.state import APIState, api_state
from gpt_serve.serving.metrics import Metrics
from gpt_serve.serving.registry import ModelRegistry


@pytest.fixture(scope="module")
def registry(models_root):
    registry = ModelRegistry.discover(models_root=models_root, expected=(), threads=1)
    yield registry
    registry.close()


def serve_alone(router, registry) -> TestClient:
    """A client of an app holding only `router`, its routes given the state by a dependency override."""
    app = FastAPI()
    app.include_router(router)
    state = APIState(registry, Metrics(registry))
    app.dependency_overrides[api_state] = lambda: state
    return TestClient(app)


def test_the_models_router_serves_alone(registry):
    client = serve_alone(models.router, registry)
    listed = client.get("/v1/models").json()["data"]
    assert [m["id"] for m in listed] == registry.available == ["ladder-a", "ladder-b", "tiny"]
    assert client.get("/v1/models/tiny").json()["owned_by"] == "gpt-serve"
    missing = client.get("/v1/models/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_the_tokens_router_serves_alone(registry):
    client = serve_alone(tokens.router, registry)
    ids = client.post("/tokenize", json={"model": "tiny", "prompt": "ROMEO:"}).json()
    assert ids["count"] == 6
    text = client.post("/detokenize", json={"model": "tiny", "tokens": ids["tokens"]}).json()
    assert text == {"prompt": "ROMEO:"}


@pytest.mark.parametrize("unk_policy", ["bogus", "", "Replace", 3, ["drop"]])
def test_tokenize_refuses_a_bad_unk_policy_as_the_request_parser_does(registry, unk_policy):
    """The same 400, word for word, from /tokenize as from /v1/completions: never a silent "error" policy."""
    client = TestClient(create_app(registry))
    body = {"model": "tiny", "prompt": "A", "unk_policy": unk_policy}
    tokenized, completed = client.post("/tokenize", json=body), client.post("/v1/completions", json=body)
    assert tokenized.status_code == completed.status_code == 400
    assert tokenized.json() == completed.json()
    assert tokenized.json()["error"]["param"] == "unk_policy"
    assert tokenized.json()["error"]["message"].startswith("unk_policy must be one of ['error', 'drop', 'replace']")


@pytest.mark.parametrize(
    "ids, message",
    [
        ([1, 10**6, -1, 10**20], "tokens holds ids [1000000, -1, 100000000000000000000] outside the vocabulary [0, "),
        ("ABC", "tokens must be a list of token ids, got 'ABC'"),
        ([1, 2.0], "tokens must be a list of token ids, got [1, 2.0]"),
        ([True], "tokens must be a list of token ids, got [True]"),
    ],
)
def test_detokenize_refuses_what_is_not_ids_of_the_vocabulary(registry, ids, message):
    client = serve_alone(tokens.router, registry)
    answer = client.post("/detokenize", json={"model": "tiny", "tokens": ids})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "tokens" and error["message"].startswith(message), error
