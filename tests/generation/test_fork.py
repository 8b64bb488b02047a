"""Prompts shared: the `n` choices of a prompt are prefilled once and fork its KV cache (`DecodeBatch.fork`).

Each choice makes exactly the tokens it makes alone (its own seed: `offset_seed(seed, index)`, as the API gives
choice `index`), on torch, ONNX (both graphs) and int8; the prompt's window is prefilled once (counted by a spy on
the batch); a forked row that is preempted re-prefills its own window and goes on identically; a prefill that fails
ends every choice of its prompt with the same message, a fork that fails ends the copies only, and the neighbours go
on; forks cost no prefill budget, and each forked row counts as a running row."""

from __future__ import annotations

import pytest

from gpt_serve.generation import EngineError, SamplingParams
from gpt_serve.generation.backends.onnx_backend import OnnxBackend
from gpt_serve.generation.backends.torch_backend import TorchBackend
from gpt_serve.generation.requests import Request
from gpt_serve.generation.runner import InlineRunner
from gpt_serve.generation.scheduler import Scheduler
from gpt_serve.generation.spec import offset_seed
from tests.conftest import make_tiny_model
from tests.generation.conftest import FakeBackend
from tests.generation.test_scheduler import alone

SEED = 41


@pytest.fixture(scope="module", params=["torch", "onnx", "onnx-hf-layout", "onnx-int8"])
def backend(request, exported_dir):
    if request.param == "torch":
        return TorchBackend(make_tiny_model())
    inplace = request.param != "onnx-hf-layout"
    return OnnxBackend(exported_dir, quantized=request.param == "onnx-int8", threads=1, inplace=inplace)


def choices(prompt: list[int], n: int, max_new_tokens: int, **kwargs) -> list[Request]:
    """The `n` choices of one request, as the API submits them: the same prompt, choice j with `seed + j`."""
    sampling = SamplingParams(0.9, top_k=20, repetition_penalty=1.2)
    return [Request(prompt, max_new_tokens, sampling, offset_seed(SEED, j), **kwargs) for j in range(n)]


class Spy:
    """Records what a backend's batches are asked to prefill (each window) and to fork (each source row)."""

    def __init__(self, monkeypatch, backend):
        self.prefilled: list[list[int]] = []
        self.forked: list[int] = []
        new_batch = backend.new_batch

        def spying(max_rows):
            batch = new_batch(max_rows)
            add_rows, add, fork = batch.add_rows, batch.add, batch.fork

            inside = []  # (a batch's add_rows may call its add)

            def counted_rows(windows):
                self.prefilled += [list(w) for w in windows]
                inside.append(1)
                try:
                    return add_rows(windows)
                finally:
                    inside.pop()

            def counted(ids):
                if not inside:
                    self.prefilled.append(list(ids))
                return add(ids)

            batch.add_rows, batch.add = counted_rows, counted
            batch.fork = lambda sources: self.forked.extend(sources) or fork(sources)
            return batch

        monkeypatch.setattr(backend, "new_batch", spying)


def run(backend, requests: list[Request], **options) -> tuple[list[list[int]], Scheduler]:
    """`requests` submitted together, before the loop runs (an inline runner: no thread to race), read to the end."""
    scheduler = Scheduler(backend, runner=InlineRunner(), **options)
    try:
        streams = [scheduler.submit(r) for r in requests]
        return [list(s) for s in streams], scheduler
    finally:
        scheduler.close()


def test_n_seeded_choices_make_their_own_tokens_from_one_prefill(backend, monkeypatch):
    """4 choices of a prompt, sampled with penalties past block_size (refills): each makes the tokens it makes
    alone, and the prompt's window is prefilled once, the other three rows forking it."""
    prompt = [5, 17, 33, 2, 40, 9]
    reqs = choices(prompt, 4, 40, window_mode="refill")
    expected = [alone(backend, r) for r in reqs]
    spy = Spy(monkeypatch, backend)
    got, _ = run(backend, reqs, max_batch=4)
    assert got == expected
    assert len({tuple(t) for t in got}) > 1  # the seeds differ: a fork that shared the RNG would not pass
    assert spy.prefilled.count(prompt) == 1 and spy.forked == [0, 0, 0]


def test_a_preempted_forked_row_rejoins_and_makes_its_own_tokens(backend, monkeypatch):
    """4 forked choices and 2 other requests on 4 rows that change hands every 3 tokens (both window modes): each
    choice re-prefills its own window when its turn comes back and makes the tokens it makes alone."""
    reqs = [*choices([3, 1, 4, 1, 5], 4, 30, window_mode="refill"), *choices([9, 2, 6], 2, 30, window_mode="exact")]
    reqs[-1] = Request([8, 8], 25, SamplingParams(0), seed=7)  # a greedy neighbour with its own prompt
    expected = [alone(backend, r) for r in reqs]
    spy = Spy(monkeypatch, backend)
    got, scheduler = run(backend, reqs, max_batch=4, preempt_after=3)
    assert scheduler.stats()["preempted"] > 4 and spy.forked[:3] == [0, 0, 0]
    assert got == expected


# -- on the numpy fake: the error boundaries, the budget, the counts --


class Refusing(FakeBackend):
    """The fake, whose batches refuse to prefill a window that starts with token 10, and whose `fork` fails while
    `fork_fails` is set."""

    fork_fails = False

    def new_batch(self, max_rows):
        batch = super().new_batch(max_rows)
        add, fork = batch.add, batch.fork

        def refusing(ids):
            if list(ids)[:1] == [10]:
                raise RuntimeError("injected prefill failure")
            return add(ids)

        def forking(sources):
            if self.fork_fails:
                raise RuntimeError("injected fork failure")
            return fork(sources)

        batch.add, batch.fork = refusing, forking  # add_rows adds each window with `add`
        return batch


def outcome(stream) -> tuple[list[int], str | None]:
    """The tokens a stream made, and its error's message (None where it finished)."""
    tokens = []
    try:
        for token in stream:
            tokens.append(token)
    except EngineError as e:
        return tokens, str(e)
    return tokens, None


def test_a_prompt_whose_prefill_fails_ends_every_choice_with_the_one_error():
    backend = Refusing()
    poisoned = choices([10, 1, 2], 3, 6)
    neighbour = Request([4, 5], 6, SamplingParams(0.9), seed=3)
    scheduler = Scheduler(backend, max_batch=4, runner=InlineRunner())
    try:
        streams = [scheduler.submit(r) for r in [*poisoned, neighbour]]
        out = [outcome(s) for s in streams]
    finally:
        scheduler.close()
    messages = {message for _, message in out[:3]}
    assert [tokens for tokens, _ in out[:3]] == [[]] * 3 and len(messages) == 1
    assert "the prefill failed for this request: injected prefill failure" in messages.pop()
    assert out[3] == (alone(FakeBackend(), neighbour), None)


def test_a_fork_that_fails_ends_the_copies_and_the_prefilled_choice_goes_on():
    backend = Refusing()
    backend.fork_fails = True
    reqs = choices([1, 2, 3], 3, 6)
    scheduler = Scheduler(backend, max_batch=4, runner=InlineRunner())
    try:
        streams = [scheduler.submit(r) for r in reqs]
        out = [outcome(s) for s in streams]
    finally:
        scheduler.close()
    assert out[0] == (alone(FakeBackend(), reqs[0]), None)
    for tokens, message in out[1:]:
        assert tokens == [] and "the fork of its prompt's cache: injected fork failure" in message


def test_forks_cost_no_prefill_budget_and_count_as_running_rows():
    """A budget of 8 tokens an iteration admits one 6-token prompt; its 3 other choices join in the same iteration
    as forks (one prefill forward in all), and the loop counts 4 rows running. A different prompt waits."""
    backend = FakeBackend()
    scheduler = Scheduler(backend, max_batch=8, max_tokens_per_step=8, runner=InlineRunner())
    try:
        other = Request([6, 5, 4, 3, 2, 1], 5, seed=1)
        streams = [scheduler.submit(r) for r in [*choices([1, 2, 3, 4, 5, 6], 4, 5), other]]
        scheduler.iterate(lambda: True)  # admissions only, no decode step
        assert backend.calls == [(0, 6)]
        assert scheduler.stats()["active"] == 4 and scheduler.stats()["waiting"] == 1
        for s in streams:
            s.cancel()
    finally:
        scheduler.close()


def test_what_is_forked_is_a_window_not_a_prompt(monkeypatch):
    """Prompts that differ prefill their own; a prompt past block_size whose window (its last 4 tokens, refill)
    is another prompt's forks that one's prefill."""
    backend = FakeBackend()
    spy = Spy(monkeypatch, backend)
    long = list(range(1, 11))  # 10 tokens past block_size 8: its window is [7, 8, 9, 10]
    reqs = [Request([1, 2], 3, seed=0), Request([2, 1], 3, seed=0), Request(long[-4:], 3, seed=1)]
    reqs.append(Request(long, 3, seed=2, window_mode="refill"))
    got, _ = run(backend, reqs, max_batch=4)
    assert spy.prefilled == [[1, 2], [2, 1], [7, 8, 9, 10]] and spy.forked == [2]
    assert got == [alone(FakeBackend(), r) for r in reqs]


def test_requests_submitted_together_are_admitted_together():
    """Inside `Scheduler.together()` nothing is admitted (an iteration run there admits none of the choices
    submitted so far); once it ends, the four are admitted in one iteration, one prefill and three forks."""
    backend = FakeBackend()
    scheduler = Scheduler(backend, max_batch=4, runner=InlineRunner())
    try:
        with scheduler.together():
            streams = [scheduler.submit(r) for r in choices([1, 2, 3], 2, 5)]
            scheduler.iterate(lambda: True)
            assert scheduler.stats()["active"] == 0 and backend.calls == []
            streams += [scheduler.submit(r) for r in choices([1, 2, 3], 4, 5)[2:]]
        scheduler.iterate(lambda: True)
        assert scheduler.stats()["active"] == 4 and backend.calls == [(0, 3)]
        assert [list(s) for s in streams] == [alone(FakeBackend(), r) for r in choices([1, 2, 3], 4, 5)]
    finally:
        scheduler.close()


def test_with_share_prompts_off_every_choice_prefills_its_own(monkeypatch):
    """What `benchmarks/serving.py --unshared` compares with: the same tokens, a prefill per choice, no fork."""
    backend = FakeBackend()
    spy = Spy(monkeypatch, backend)
    reqs = choices([1, 2, 3], 4, 5)
    got, _ = run(backend, reqs, max_batch=4, share_prompts=False)
    assert spy.prefilled == [[1, 2, 3]] * 4 and spy.forked == []
    assert got == [alone(FakeBackend(), r) for r in reqs]
