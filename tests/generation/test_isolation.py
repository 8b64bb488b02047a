"""A request's failure is its own, and prompt work is scheduled work.

Each per-row stage of a step (prefill, penalties, filters and the draw, logprobs, the row's bookkeeping, the window's
refill, a full-window recompute, prompt scoring, the text's stop strings) is made to fail for one marked request
while neighbours run beside it: the marked request ends with an `EngineError`, the others get exactly the tokens they
get alone. Scoring a long prompt shares the loop: a 1-token request submitted beside it is served within one
iteration (counted, not timed)."""

from __future__ import annotations

import numpy as np
import pytest

from gpt_serve.generation import EngineError, SamplingParams, parse_request
from gpt_serve.generation import rows as rows_module
from gpt_serve.generation.fields import RequestError
from gpt_serve.generation.logprobs import prompt_logprobs
from gpt_serve.generation.requests import Request
from gpt_serve.generation.runner import InlineRunner
from gpt_serve.generation.scheduler import Scheduler
from gpt_serve.generation.text import TextStream

from .conftest import FakeBackend, counting_windows

MARK = 666  # the seed of the request made to fail


class Poisoned(list):
    """A window the fake batch refuses to prefill."""


class FailingBatchBackend(FakeBackend):
    """The fake, whose batches refuse a `Poisoned` window and whose full-window forwards refuse a window that
    starts with token 10 (the marked prompt's first token)."""

    def new_batch(self, max_rows):
        batch = super().new_batch(max_rows)
        add = batch.add

        def refusing(ids):
            if isinstance(ids, Poisoned):
                raise RuntimeError("injected prefill failure")
            return add(ids)

        batch.add = refusing  # add_rows adds each window with it
        return batch

    def window_logits(self, input_ids):
        if (np.asarray(input_ids)[:, 0] == 10).any():
            raise RuntimeError("injected full-window failure")
        return super().window_logits(input_ids)


def neighbours() -> list[Request]:
    """Three requests that run beside the marked one: sampled, greedy, with logprobs and penalties."""
    return [
        Request([1, 2, 3], 12, SamplingParams(0.9, top_k=5), seed=1, logprobs=2),
        Request([4], 12, SamplingParams(0), seed=2),
        Request([5, 6], 12, SamplingParams(1.0, repetition_penalty=1.3, presence_penalty=0.5), seed=3),
    ]


def alone(request: Request) -> tuple[list[int], list]:
    scheduler = Scheduler(FakeBackend(), max_batch=1)
    try:
        stream = scheduler.submit(request)
        return list(stream), stream.logprobs
    finally:
        scheduler.close()


def unchecked(**values) -> SamplingParams:
    """Settings that no constructor lets through (built around `SamplingParams`'s check), to break a row."""
    params = object.__new__(SamplingParams)
    for name, value in values.items():
        object.__setattr__(params, name, value)
    return params


def breaks(stage: str):
    """A `Row.__init__` that breaks `stage` for the marked request's row."""
    init = rows_module.Row.__init__

    def patched(self, stream, block_size, vocab_size):
        init(self, stream, block_size, vocab_size)
        if stream.request.seed != MARK:
            return
        if stage == "penalties":
            self.seen = "not a mask"
        elif stage == "overflowing penalties":  # a value no parser lets through: the logits become infinite
            self.sampling = unchecked(**{**vars(self.sampling), "repetition_penalty": 1e-320})
            self.seen = np.ones(vocab_size, dtype=bool)
        elif stage == "filters":
            self.sampling = unchecked(**{**vars(self.sampling), "top_k": "not a number"})
        elif stage == "logprobs":
            self.top_logprobs = "not a number"
        elif stage == "output":
            self.stops = None  # `token in None` raises when the token is delivered
        elif stage in ("prefill", "refill"):
            window, calls = self.window, []

            def poisoned_window():
                calls.append(1)
                first_call_is_fine = stage == "refill" and len(calls) == 1
                return window() if first_call_is_fine else Poisoned(window())

            self.window = poisoned_window

    return patched


STAGES = ["prefill", "penalties", "overflowing penalties", "filters", "logprobs", "output", "refill", "recompute"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_failure_in_one_rows_stage_ends_only_that_request(monkeypatch, stage):
    monkeypatch.setattr(rows_module.Row, "__init__", breaks(stage))
    if stage == "refill":  # crosses block_size (8) in refill mode: its second window is prefilled again
        marked = Request([9, 10], 20, SamplingParams(0.8), seed=MARK, window_mode="refill")
    elif stage == "recompute":  # exact mode past the window: a full-window forward per token
        marked = Request([10] * 7, 20, SamplingParams(0.8), seed=MARK, window_mode="exact")
    else:
        marked = Request([7, 8], 20, SamplingParams(0.8, repetition_penalty=1.2), seed=MARK, logprobs=3)
    scheduler = Scheduler(FailingBatchBackend(), max_batch=4)
    try:
        others = [scheduler.submit(r) for r in neighbours()]
        bad = scheduler.submit(marked)
        with pytest.raises(EngineError, match="this request"):
            list(bad)
        got = [(list(s), s.logprobs) for s in others]
    finally:
        scheduler.close()
    monkeypatch.undo()
    assert got == [alone(r) for r in neighbours()]


def test_the_batched_penalties_give_each_row_its_own_numbers_bit_for_bit():
    """`rows.apply_penalties` over many rows at once: each row exactly as `apply_repetition_penalty` and
    `apply_openai_penalties` make it alone."""
    rng = np.random.default_rng(0)
    settings = [
        SamplingParams(0.8, repetition_penalty=1.3),
        SamplingParams(0.8, repetition_penalty=0.7, presence_penalty=0.5, frequency_penalty=-0.3),
        SamplingParams(0.8, frequency_penalty=1.7),
        SamplingParams(0.8, repetition_penalty=9.99, presence_penalty=-2.0),
    ]
    rows = []
    for i, params in enumerate(settings * 3):
        row = rows_module.Row(stream_of(params, rng.integers(0, 65, size=5 + i).tolist()), 128, 65)
        for token in rng.integers(0, 65, size=i):
            row.accept(int(token))
        rows.append(row)
    logits = rng.normal(scale=4, size=(len(rows), 65)).astype(np.float32)
    batched = logits.copy()
    rows_module.apply_penalties(batched, rows, list(range(len(rows))))
    for i, row in enumerate(rows):
        alone = logits[i].copy()
        if row.seen is not None:
            apply_repetition_penalty(alone, row.seen, row.sampling.repetition_penalty)
        if row.counts is not None:
            apply_openai_penalties(alone, row.counts, row.sampling)
        assert np.array_equal(batched[i], alone), i


def apply_repetition_penalty(logits: np.ndarray, seen: np.ndarray, penalty: float) -> None:
    """transformers' rule on one row of `logits` (V,), in place: the logit of every token `seen` (a mask (V,)) is
    divided by `penalty` if positive, multiplied by it if not."""
    row = logits[seen]
    logits[seen] = np.where(row > 0, row / penalty, row * penalty)


def apply_openai_penalties(logits: np.ndarray, counts: np.ndarray, params: SamplingParams) -> None:
    """OpenAI's presence and frequency penalties on one row of `logits` (V,), in place: `counts` (V,) is how often
    each token occurs in the generated text."""
    logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)


def stream_of(params: SamplingParams, prompt: list[int]):
    from gpt_serve.generation.requests import Stream

    return Stream(Request(prompt, 10, params, seed=1), owner=None)


def test_values_that_can_only_overflow_are_refused_when_parsed():
    with pytest.raises(RequestError, match=r"repetition_penalty must be a number in \[0.01, 10\]"):
        parse_request({"prompt": "ROMEO:", "max_tokens": 5, "repetition_penalty": 1e-320})
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=1e-300)


def test_a_failing_stop_string_check_ends_only_its_text(monkeypatch):
    from gpt_serve.chargpt.vocab import CharVocab

    vocab = CharVocab([chr(97 + i) for i in range(11)])
    scheduler = Scheduler(FakeBackend(), max_batch=4)
    try:
        good = TextStream(scheduler, vocab, parse_request({"prompt": "abc", "max_tokens": 10, "seed": 1}))
        bad = TextStream(scheduler, vocab, parse_request({"prompt": "abc", "max_tokens": 10, "seed": 2, "stop": "x"}))
        monkeypatch.setattr(bad, "_hold", None)  # the stop-string scan now raises
        with pytest.raises(EngineError, match="the text of this request failed"):
            list(bad)
        assert bad.stream.cancelled.is_set()
        text = "".join(good)
    finally:
        scheduler.close()
    solo = Scheduler(FakeBackend(), max_batch=1)
    try:
        assert text == "".join(TextStream(solo, vocab, parse_request({"prompt": "abc", "max_tokens": 10, "seed": 1})))
    finally:
        solo.close()


def test_a_scoring_that_fails_ends_alone():
    backend = FailingBatchBackend()
    scheduler = Scheduler(backend, max_batch=4)
    try:
        failing = scheduler.score([10] * 30, 2)  # its later windows start with token 10: the forward refuses them
        fine = scheduler.score([1, 2, 3] * 10, 2)
        stream = scheduler.submit(neighbours()[0])
        with pytest.raises(EngineError, match="failed to score this prompt: RuntimeError: injected full-window"):
            failing.result(timeout=30)
        assert fine.result(timeout=30) == prompt_logprobs(FakeBackend(), [1, 2, 3] * 10, 2)
        assert (list(stream), stream.logprobs) == alone(neighbours()[0])
    finally:
        scheduler.close()


def iterations_until_ready(scheduler: Scheduler, stream, limit: int = 1000) -> int:
    for n in range(1, limit + 1):
        scheduler.iterate()
        if stream.ready:
            return n
    raise AssertionError(f"not ready after {limit} iterations")


@pytest.mark.parametrize("scorings", [1, 16])
def test_scoring_long_prompts_leaves_a_one_token_request_one_iteration_away(scorings):
    """10,000-token prompts to score (`echo` with logprobs), and a 1-token request sent once they have started:
    its token comes in the first iteration after it was sent; the scorings go on, a chunk at a time, and a
    cancelled one stops at once."""
    backend = FakeBackend(block_size=8)
    scheduler = Scheduler(backend, max_batch=4, max_queue=64, max_tokens_per_step=512, runner=InlineRunner())
    try:
        jobs = [scheduler.score([1, 2, 3, 4] * 2500, 20) for _ in range(scorings)]
        for _ in range(3):
            scheduler.iterate()
        stream = scheduler.submit(Request([1, 2], 1, SamplingParams(0), seed=0))
        assert iterations_until_ready(scheduler, stream) == 1
        assert list(stream) == alone(Request([1, 2], 1, SamplingParams(0), seed=0))[0]
        assert not any(job.ready for job in jobs) and 0 < len(jobs[0].entries) < 10_000
        for job in jobs:
            job.cancel()
        scheduler.iterate()
        steps = scheduler.stats()["steps"]
        assert all(job.ready for job in jobs) and not scheduler.iterate() and scheduler.stats()["steps"] == steps
    finally:
        scheduler.close()


def test_a_scoring_chunk_is_bounded_by_the_step_budget(monkeypatch):
    """Every iteration's scoring stays within `max_tokens_per_step` (here 8 windows of 8), and the entries are the
    ones computed at once."""
    backend, windows = counting_windows(monkeypatch)
    scheduler = Scheduler(backend, max_batch=4, max_tokens_per_step=64, runner=InlineRunner())
    try:
        ids = list(range(1, 11)) * 100
        job = scheduler.score(ids, 0)
        while not job.ready:
            before = len(windows)
            scheduler.iterate()
            assert sum(windows[before:]) * 8 <= 64
        assert job.result() == prompt_logprobs(FakeBackend(block_size=8), ids, 0)
    finally:
        scheduler.close()


def test_arrivals_are_prefilled_together_within_the_budget():
    """256 waiting requests with one prompt length join in one iteration, prefilled as one forward pass."""
    backend = FakeBackend(block_size=8)
    scheduler = Scheduler(backend, max_batch=256, max_queue=256, runner=InlineRunner())
    try:
        streams = [scheduler.submit(Request([1, 2, 3], 4, SamplingParams(0.8), seed=i)) for i in range(256)]
        scheduler.iterate(lambda: True)  # admissions only
        assert scheduler.stats()["active"] == 256 and all(s.ready for s in streams)
        got = [list(s) for s in streams]
    finally:
        scheduler.close()
    assert got[:3] == [alone(Request([1, 2, 3], 4, SamplingParams(0.8), seed=i))[0] for i in range(3)]


def test_a_request_is_checked_once_and_held_by_reference(monkeypatch):
    """One `temperature` check for a request against OpenAI's ranges (the wire's) and one against the engine's own
    bounds (its `SamplingParams`), however many choices it has and whatever front end adds to it (the chat's end of
    speech, given beside the request): every choice and every row hold its one `SamplingParams`."""
    from gpt_serve.chargpt.vocab import CharVocab
    from gpt_serve.generation import sampling, spec

    checks, engine_checks = [], []
    check_value, check_engine_value = spec.check_value, sampling.check_engine_value
    counted = lambda name, *a, **k: checks.append(name) or check_value(name, *a, **k)  # noqa: E731
    engine = lambda name, *a, **k: engine_checks.append(name) or check_engine_value(name, *a, **k)  # noqa: E731
    monkeypatch.setattr(spec, "check_value", counted)
    monkeypatch.setattr(sampling, "check_engine_value", engine)
    request = parse_request({"prompt": "abc", "max_tokens": 3, "temperature": 0.7, "seed": 1})
    vocab = CharVocab([chr(97 + i) for i in range(11)])
    scheduler = Scheduler(FakeBackend(), max_batch=4)
    try:
        texts = [
            TextStream(scheduler, vocab, request, i, prompt=p, end="\n\n") for i, p in enumerate(["abc", "ba", "c"])
        ]
        assert all(t.stream.request.sampling is request.sampling for t in texts)
        assert [len("".join(t)) for t in texts] == [3, 3, 3]
        assert request.stop == () and all(t.stops == ("\n\n",) for t in texts)  # the request itself is untouched
    finally:
        scheduler.close()
    assert checks.count("temperature") == 1 and engine_checks.count("temperature") == 1


@pytest.fixture(scope="module")
def api_url(exported_dir, tmp_path_factory):
    import shutil

    from gpt_serve.serving.api import create_app
    from gpt_serve.serving.registry import ModelRegistry
    from tests.helpers import serving

    root = tmp_path_factory.mktemp("isolation-models")
    shutil.copytree(exported_dir, root / "tiny")
    registry = ModelRegistry.discover(models_root=root, expected=(), threads=1, max_batch=16)
    with serving(create_app(registry, default_backend="onnx-int8")) as url:
        yield url
    registry.close()


def test_over_the_api_a_failing_request_ends_alone_beside_streams_and_other_requests(api_url, monkeypatch):
    """The issue's case: 8 streams and 2 plain requests running; the body with `repetition_penalty` 1e-300 is a 400
    now, and a request whose penalties fail in the engine (injected) is a 422; every other request ends normally,
    the streams with `[DONE]`."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    penalize = rows_module.apply_penalties

    def failing(work, rows, at):
        if any(row.sampling.repetition_penalty == 1.5 for row in rows):
            raise FloatingPointError("injected")
        return penalize(work, rows, at)

    monkeypatch.setattr(rows_module, "apply_penalties", failing)
    body = {"model": "tiny", "prompt": "ROMEO:", "max_tokens": 60, "seed": 1}

    def stream(i):
        text = httpx.post(f"{api_url}/v1/completions", json={**body, "seed": i, "stream": True}, timeout=60).text
        return [e.removeprefix("data: ") for e in text.split("\n\n") if e]

    def plain(extra):
        return httpx.post(f"{api_url}/v1/completions", json={**body, **extra}, timeout=60)

    with ThreadPoolExecutor(12) as pool:
        streams = [pool.submit(stream, i) for i in range(8)]
        plains = [pool.submit(plain, {"seed": 20 + i}) for i in range(2)]
        refused = pool.submit(plain, {"max_tokens": 5, "repetition_penalty": 1e-300})
        failed = pool.submit(plain, {"max_tokens": 5, "repetition_penalty": 1.5})
        assert refused.result().status_code == 400 and "repetition_penalty" in refused.result().text
        assert failed.result().status_code == 422, failed.result().text
        assert "the penalties failed for this request" in failed.result().json()["error"]["message"]
        for s in streams:
            events = s.result()
            assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        for p in plains:
            assert p.result().status_code == 200 and len(p.result().json()["choices"][0]["text"]) == 60
