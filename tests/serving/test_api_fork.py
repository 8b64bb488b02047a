"""Prompts shared through the API: a request's `n` choices are admitted together (`Scheduler.together`), prefill
their prompt once and fork it; each choice's text is that of a request of its own with the choice's seed
(`seed + index`), on every backend; `/metrics` counts each choice as before; a prompt whose prefill fails ends the
request with its one error (a 422) and the server goes on."""

from __future__ import annotations

import re

import httpx
import pytest

from gpt_serve.serving.registry import ModelRegistry
from gpt_serve.serving.server_limits import ServerLimits
from tests.generation.test_fork import Spy
from tests.helpers import wait_until
from tests.serving.conftest import running

BODY = {"model": "tiny", "prompt": "ROMEO:", "max_tokens": 24, "temperature": 0.9}


@pytest.fixture(scope="module")
def served(models_root):
    registry = ModelRegistry.discover(models_root=models_root, expected=(), threads=1)
    with running(registry, ServerLimits()) as url:
        yield registry, url
    registry.close()


def metric(text: str, name: str, backend: str, **labels: str) -> float:
    """The value of `gpt_serve_<name>` for tiny on `backend` (0 where the series is not there yet)."""
    want = {"backend": backend, "model": "tiny", **labels}
    for line in text.splitlines():
        m = re.fullmatch(rf"gpt_serve_{name}\{{(.*)\}} (\S+)", line)
        if m and dict(re.findall(r'(\w+)="([^"]*)"', m[1])) == want:
            return float(m[2])
    return 0.0


@pytest.mark.parametrize("backend", ["torch", "onnx", "onnx-int8"])
def test_n_choices_fork_one_prefill_and_match_their_own_requests(served, backend, monkeypatch):
    registry, url = served
    spy = Spy(monkeypatch, registry.backend("tiny", backend).backend)  # before the scheduler makes its batch
    assert not any(key == ("tiny", backend) for key in registry.schedulers())
    body = {**BODY, "backend": backend}
    before = httpx.get(url + "/metrics").text
    forked = httpx.post(url + "/v1/completions", json={**body, "n": 4, "seed": 12}, timeout=60).json()
    assert spy.forked == [0, 0, 0] and spy.prefilled.count(spy.prefilled[0]) == 1
    after = httpx.get(url + "/metrics").text
    texts = [c["text"] for c in forked["choices"]]
    own = [httpx.post(url + "/v1/completions", json={**body, "seed": 12 + j}, timeout=60).json() for j in range(4)]
    assert texts == [o["choices"][0]["text"] for o in own] and len(set(texts)) > 1
    grown = {
        name: metric(after, name, backend, **labels) - metric(before, name, backend, **labels)
        for name, labels in [("request_success_total", {"finished_reason": "length"}), ("generation_tokens_total", {})]
    }
    assert grown == {"request_success_total": 4, "generation_tokens_total": 4 * 24}  # each choice, as before
    running_rows = lambda: metric(httpx.get(url + "/metrics").text, "num_requests_running", backend)  # noqa: E731
    assert wait_until(lambda: running_rows() == 0)  # the forked rows leave as others do


def test_a_prompt_whose_prefill_fails_ends_the_request_with_its_one_error(models_root, monkeypatch):
    registry = ModelRegistry.discover(models_root=models_root, expected=(), threads=1)
    loaded = registry.backend("tiny", "onnx")
    poison, new_batch = loaded.vocab.encode("JULIET:"), loaded.backend.new_batch

    def refusing_batch(max_rows):  # a batch that cannot prefill the poisoned prompt
        batch = new_batch(max_rows)
        add_rows = batch.add_rows

        def refusing(windows):
            if any(list(w) == poison for w in windows):
                raise RuntimeError("injected prefill failure")
            return add_rows(windows)

        batch.add_rows, batch.add = refusing, lambda ids: refusing([ids])[0]
        return batch

    monkeypatch.setattr(loaded.backend, "new_batch", refusing_batch)
    try:
        with running(registry, ServerLimits()) as url:
            body = {**BODY, "backend": "onnx", "n": 4}
            answer = httpx.post(url + "/v1/completions", json={**body, "prompt": "JULIET:"}, timeout=60)
            assert answer.status_code == 422
            message = answer.json()["error"]["message"]
            assert "the prefill failed for this request: injected prefill failure" in message
            fine = httpx.post(url + "/v1/completions", json=body, timeout=60)
            assert fine.status_code == 200 and len(fine.json()["choices"]) == 4
    finally:
        registry.close()


def test_best_of_choices_fork_one_prefill(models_root, monkeypatch):
    registry = ModelRegistry.discover(models_root=models_root, expected=(), threads=1)
    spy = Spy(monkeypatch, registry.backend("tiny", "torch").backend)
    try:
        with running(registry, ServerLimits()) as url:
            body = {**BODY, "backend": "torch", "n": 2, "best_of": 4, "seed": 3}
            answer = httpx.post(url + "/v1/completions", json=body, timeout=60)
            assert answer.status_code == 200 and len(answer.json()["choices"]) == 2
            assert spy.forked == [0, 0, 0] and spy.prefilled.count(spy.prefilled[0]) == 1
    finally:
        registry.close()
