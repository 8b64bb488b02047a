"""A request refused after some of its parts started leaves nothing behind: its choices' rows, their places in the
server's drain (what a shutdown waits for) and its scorings are all released, on every refusal path."""

from __future__ import annotations

import json
import threading
import time

import pytest

from gpt_serve.generation.requests import Request
from gpt_serve.serving.api import create_app
from gpt_serve.serving.registry import ModelRegistry
from tests.helpers import serving, wait_until
from tests.serving.conftest import assert_openai_error, post

LONG = Request([1], 100_000, window_mode="refill")


@pytest.fixture
def small_server(models_root):
    """`--max-batch 1 --max-queue 4` in this process: (its URL, its drain, the tiny model's scheduler). Without
    preemption, so that the queue stays as the test fills it."""
    registry = ModelRegistry.discover(
        models_root=models_root, expected=(), threads=1, max_batch=1, max_queue=4, preempt_after=None
    )
    app = create_app(registry)
    with serving(app) as url:
        yield url, app.state.drain, registry.scheduler("tiny", "torch")
    registry.close()


def fill(scheduler, waiting: int) -> list:
    """A long request running and `waiting` more in the queue."""
    streams = [scheduler.submit(LONG)]
    assert wait_until(lambda: scheduler.stats()["active"] == 1)
    return streams + [scheduler.submit(LONG) for _ in range(waiting)]


def shutdown_seconds(drain) -> float:
    """How long the drain takes to close once nothing runs (a server's shutdown waits for it)."""
    start = time.monotonic()
    closer = threading.Thread(target=drain.close, args=(60,))
    closer.start()
    closer.join(timeout=90)
    return time.monotonic() - start


@pytest.mark.parametrize(
    ("waiting", "body", "message"),
    [
        # the issue's: the queue at 2, 2 choices join it, and the scoring of their prompt finds it full
        (2, {"n": 2, "echo": True, "logprobs": 1, "prompt": "a" * 10_000}, "server busy"),
        # the second choice finds the queue full after the first joined it
        (3, {"n": 2, "prompt": "a"}, "server busy"),
        # the second prompt cannot be encoded after the first's choice started
        (0, {"prompt": ["a", "a\u00e9"]}, "prompt 1: the prompt has 1 character outside"),
    ],
)
def test_a_refusal_after_some_parts_started_releases_them_all(small_server, waiting, body, message):
    """Each refusal 20 times: the request's choices leave the queue and the drain at once, and a shutdown right
    after takes no longer than after no refusal (the issue's: 11.2 s, the whole shutdown timeout, vs 1.3 s)."""
    url, drain, scheduler = small_server
    held = fill(scheduler, waiting)
    try:
        for _ in range(20):
            answer = post(url, "/v1/completions", json.dumps({"model": "tiny", "max_tokens": 1, **body}).encode())
            assert_openai_error(answer, 429 if "busy" in message else 400, message)
            assert drain.open == set()
        assert wait_until(lambda: scheduler.stats()["waiting"] <= waiting)
    finally:
        for stream in held:
            stream.cancel()
    assert wait_until(lambda: scheduler.stats()["active"] == 0)
    assert shutdown_seconds(drain) < 30  # the deadline is 60 s: a choice left in the drain waits all of it
