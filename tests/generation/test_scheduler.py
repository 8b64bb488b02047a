"""The continuous-batching scheduler: a request's tokens do not depend on the batch, rows leave when cancelled,
the queue is bounded, bad requests are named."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from gpt_serve.generation import SamplingParams, generate_tokens
from gpt_serve.generation.backends.onnx_backend import OnnxBackend
from gpt_serve.generation.backends.torch_backend import TorchBackend
from gpt_serve.generation.fields import RequestError
from gpt_serve.generation.requests import Request, ServerBusy
from gpt_serve.generation.scheduler import Scheduler
from gpt_serve.generation.spec import GenerationRequest
from tests.conftest import make_tiny_model
from tests.helpers import wait_until


def requests(n: int = 8, block_size: int = 16) -> list[Request]:
    """Requests of different prompt lengths (some longer than the window), lengths, settings and window modes."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        length = int(rng.integers(1, 2 * block_size)) if i % 4 == 3 else int(rng.integers(1, block_size // 2))
        sampling = (
            SamplingParams(0)
            if i % 3 == 0
            else SamplingParams(0.9, top_k=int(rng.integers(0, 20)), top_p=0.95, repetition_penalty=1.2 if i % 2 else 1)
        )
        out.append(
            Request(
                rng.integers(0, 65, length).tolist(),
                int(rng.integers(5, 3 * block_size)),  # most cross block_size
                sampling,
                seed=i,
                window_mode="refill" if i % 2 else "exact",
                refill_tokens=3 if i == 5 else None,
            )
        )
    return out


def alone(backend, r: Request) -> list[int]:
    """The request through the engine's own loop, alone."""
    args = (r.max_new_tokens, r.sampling, r.seed, r.window_mode, r.refill_tokens)
    return [int(t[0]) for t in generate_tokens(backend, [r.prompt_ids], *args)]


@pytest.fixture(scope="module", params=["torch", "onnx", "onnx-int8"])
def backend(request, exported_dir):
    if request.param == "torch":
        return TorchBackend(make_tiny_model())  # the weights of the exported model
    return OnnxBackend(exported_dir, quantized=request.param == "onnx-int8", threads=1)


def test_batched_tokens_equal_each_request_alone(backend):
    """8 requests joining one step apart (one prefill per step), running past block_size in both window modes."""
    reqs = requests()
    scheduler = Scheduler(backend, max_batch=8, max_prefills_per_step=1, max_recompute_per_step=2)
    try:
        streams = [scheduler.submit(r) for r in reqs]
        got = [list(s) for s in streams]
    finally:
        scheduler.close()
    for i, r in enumerate(reqs):
        assert got[i] == alone(backend, r), (i, r.window_mode)
    assert scheduler.stats()["steps"] < sum(len(g) for g in got)  # rows shared forward passes


def test_requests_joining_a_running_batch_get_their_own_tokens(backend):
    reqs = requests(12)
    scheduler = Scheduler(backend, max_batch=4)  # more requests than rows: they wait, then join mid-flight
    try:
        streams = []
        for r in reqs:
            streams.append(scheduler.submit(r))
            time.sleep(0.002)
        got = [list(s) for s in streams]
    finally:
        scheduler.close()
    assert got == [alone(backend, r) for r in reqs]


def test_a_cancelled_request_costs_no_further_forward_passes(backend):
    scheduler = Scheduler(backend, max_batch=4)
    try:
        stream = scheduler.submit(Request([1, 2, 3], 100_000, SamplingParams(1.0), seed=0, window_mode="refill"))
        tokens = iter(stream)
        for _ in range(5):
            next(tokens)
        tokens.close()  # the consumer goes away: the row leaves at the next step, and the stream ends
        while stream.take() is not None:
            pass
        assert wait_until(lambda: scheduler.stats()["active"] == 0)  # as the iteration that ended the stream left it
        steps = scheduler.stats()["steps"]
        time.sleep(0.1)
        assert scheduler.stats()["steps"] == steps and stream.generated < 100_000
    finally:
        scheduler.close()


def test_the_queue_is_bounded():
    scheduler = Scheduler(TorchBackend(make_tiny_model()), max_batch=1, max_queue=2)
    try:
        long = Request([1], 100_000, window_mode="refill")
        running = scheduler.submit(long)
        deadline = time.monotonic() + 5
        while scheduler.stats()["active"] == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        waiting = [scheduler.submit(long), scheduler.submit(long)]
        with pytest.raises(ServerBusy, match="server busy: 2 requests are already waiting"):
            scheduler.submit(long)
        for s in (running, *waiting):
            s.cancel()
    finally:
        scheduler.close()


@pytest.mark.parametrize(
    ("request_", "error", "message"),
    [
        (Request([], 5), ValueError, "the prompt is empty"),
        (Request([1, 99], 5), ValueError, r"ids \[99\] outside the vocabulary \[0, 64\]"),
        (Request([1], 0), ValueError, r"max_new_tokens must be an integer in \[1, 100000\], got 0"),
        (Request([1], 5, seed=-2), ValueError, r"seed must be an integer in \[0, 9007199254740991\]"),
        (Request([1], 5, window_mode="slide"), ValueError, "window_mode must be one of"),
        (Request([1], 5, window_mode="refill", refill_tokens=16), ValueError, "refill_tokens must be an integer"),
        (Request([1], 5, sampling=0.5), TypeError, "sampling must be a SamplingParams"),
    ],
)
def test_bad_requests_are_named(request_, error, message):
    scheduler = Scheduler(TorchBackend(make_tiny_model()))
    try:
        with pytest.raises(error, match=message):
            scheduler.submit(request_)
    finally:
        scheduler.close()


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (Request([1], 5, window_mode="slide"), "window_mode"),
        (Request([1], 5, window_mode="refill", refill_tokens=16), "refill_tokens"),
        (Request([1], 5, logit_bias=((99, 1.0),)), "logit_bias"),
    ],
)
def test_what_a_checked_request_can_still_get_wrong_for_a_model_names_its_field(request_, field):
    """A `GenerationRequest` cannot know the model's window or vocabulary: the engine's check names the field, so
    every surface answers it as the request's own error (the API's 400)."""
    scheduler = Scheduler(TorchBackend(make_tiny_model()))
    try:
        with pytest.raises(RequestError) as e:
            scheduler.submit(request_)
        assert e.value.field == field
    finally:
        scheduler.close()


def test_the_engines_request_of_a_checked_request_holds_its_fields_as_they_are():
    spec = GenerationRequest("ab", 7, temperature=0.5, seed=3, window_mode="refill", refill_tokens=4, logprobs=2,
                             logit_bias={1: 5.0}, structured_outputs={"regex": "a+"})  # fmt: skip
    request = Request.of(spec, [1, 2], seed=spec.seed_for(1))
    shared = {f.name for f in fields(Request)} & {f.name for f in fields(GenerationRequest)}
    assert {"max_new_tokens", "sampling", "window_mode", "refill_tokens", "logprobs", "logit_bias"} <= shared
    for name in shared - {"seed"}:  # every field the two share is the checked request's, by reference
        assert getattr(request, name) is getattr(spec, name), name
    assert request.prompt_ids == [1, 2] and request.seed == 4
    assert request.constraint is None  # the request's constraint is compiled for a vocabulary by its caller
    assert Request.of(spec, [1], logprobs=0).logprobs == 0  # what the caller gives replaces the request's


def test_wait_returns_when_the_request_ends_however_it_ends():
    scheduler = Scheduler(TorchBackend(make_tiny_model()), max_batch=2)
    try:
        running = scheduler.submit(Request([1, 2, 3], 100_000, window_mode="refill"))
        assert running.take()  # it runs
        assert running.wait(0.01) is False  # still running: the timeout passes
        running.cancel()
        assert running.wait(30) is True  # cancelled: ends at the next step
        finished = scheduler.submit(Request([1, 2], 5))
        assert finished.wait(30) is True and len(list(finished)) == 5  # every token is there once it ended
        scheduler._batch.step = lambda tokens: (_ for _ in ()).throw(RuntimeError("broken step"))
        failed = scheduler.submit(Request([1, 2], 20))
        assert failed.wait(30) is True
        with pytest.raises(RuntimeError, match="broken step"):
            list(failed)
    finally:
        scheduler.close()


def test_a_failing_backend_ends_the_requests_with_its_error_and_the_loop_goes_on():
    backend = TorchBackend(make_tiny_model())
    scheduler = Scheduler(backend, max_batch=2)
    try:
        scheduler.call(lambda: None)  # the loop runs: its batch exists
        scheduler._batch.step = lambda tokens: (_ for _ in ()).throw(RuntimeError("broken step"))
        with pytest.raises(RuntimeError, match="broken step"):
            list(scheduler.submit(Request([1, 2], 20)))
        assert len(list(scheduler.submit(Request([1, 2], 20)))) == 20  # a fresh batch serves the next one
    finally:
        scheduler.close()


def test_call_runs_on_the_loop_thread_and_returns_or_raises():
    import threading

    scheduler = Scheduler(TorchBackend(make_tiny_model()))
    try:
        assert scheduler.call(lambda: threading.current_thread().name) == "gpt-serve-scheduler"  # its own runner
        with pytest.raises(ZeroDivisionError):
            scheduler.call(lambda: 1 / 0)
    finally:
        scheduler.close()
    with pytest.raises(RuntimeError, match="closed"):
        scheduler.call(lambda: None)


# The lesson's ladder (no projection, no feed-forward, no LayerNorm, no residual), GELU, biases, and an attention
# that is not the fused kernel (the decode step runs the modules then)
DECODE_VARIANTS = {
    "final": {},
    "stage-a": dict(attn_proj=False, ffwd_mult=0, residual=False, layer_norm=False),
    "stage-c": dict(ffwd_mult=1, ffwd_proj=False, residual=False, layer_norm=False),
    "gelu-biases": dict(activation="gelu", qkv_bias=True, layer_norm_bias=False),
    "eager": dict(attn_implementation="eager"),
}


@pytest.mark.parametrize("variant", DECODE_VARIANTS)
@pytest.mark.parametrize("prompts", [[[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]], [[1, 2], [3, 4]]], ids=["padded", "even"])
def test_a_torch_decode_step_gives_the_models_forward_bit_for_bit(prompts, variant):
    """`TorchDecodeBatch.step` runs the model's tensors itself (`TorchBackend.decode_step`, a `DecodePlan`): the same
    logits as the model's forward on the same cache, with left padding (a mask) and without (none), for every
    variant of the model."""
    backend = TorchBackend(make_tiny_model(**DECODE_VARIANTS[variant]))
    batch = backend.new_batch(4)
    for ids in prompts:
        batch.add(ids)
    tokens = np.array([11, 12, 13][: len(prompts)])
    for _ in range(3):
        kv = batch.kv
        lengths = kv.lengths[: kv.rows]
        columns = kv.width - kv.lo + 1
        mask = (np.arange(columns)[None, :] >= columns - 1 - lengths[:, None]).astype(np.int64)
        forward = backend.run(tokens[:, None], mask, lengths[:, None].copy(), kv)  # writes the column step rewrites
        assert np.array_equal(batch.step(tokens), forward)
        tokens = (tokens + 1) % 65


def test_asyncio_consumers_get_the_same_tokens_and_a_cancelled_one_frees_its_row(backend):
    """`Stream.atake` (the API's handlers): tokens as `take` gives them; cancelling the task cancels nothing else,
    and the stream's `cancel` (as the API's `finally` does) frees its row."""
    import asyncio

    reqs = requests(4)
    scheduler = Scheduler(backend, max_batch=8)

    async def read(stream) -> list[int]:
        tokens = []
        while (chunk := await stream.atake()) is not None:
            tokens += chunk
        return tokens

    async def main():
        streams = [scheduler.submit(r) for r in reqs]
        endless = scheduler.submit(Request([1, 2, 3], 100_000, SamplingParams(1.0), seed=0, window_mode="refill"))
        waiting = asyncio.create_task(read(endless))
        got = await asyncio.gather(*(read(s) for s in streams))
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        endless.cancel()
        return got

    try:
        got = asyncio.run(main())
        assert wait_until(lambda: scheduler.stats()["active"] == 0)
    finally:
        scheduler.close()
    assert got == [alone(backend, r) for r in reqs]


def test_a_decode_loop_that_fails_outright_ends_its_requests_and_the_shared_runner_goes_on():
    """A backend whose step fails and that cannot even make a fresh batch (out of memory): that scheduler's requests
    end with the error and it closes; another scheduler on the same runner keeps serving."""
    from gpt_serve.generation.runner import Runner

    runner = Runner("test-runner")
    broken, healthy = TorchBackend(make_tiny_model()), TorchBackend(make_tiny_model())
    a, b = Scheduler(broken, max_batch=2, runner=runner), Scheduler(healthy, max_batch=2, runner=runner)
    try:
        a._batch.step = lambda tokens: (_ for _ in ()).throw(RuntimeError("broken step"))
        broken.new_batch = lambda rows: (_ for _ in ()).throw(MemoryError("no memory for a batch"))
        with pytest.raises(RuntimeError, match="broken step"):  # the step's error, then no fresh batch
            list(a.submit(Request([1, 2], 20)))
        assert a._stopped.wait(5) and a.closed
        with pytest.raises(RuntimeError, match="closed"):
            a.submit(Request([1, 2], 5))
        assert len(list(b.submit(Request([1, 2], 20)))) == 20
    finally:
        b.close()
        a.close()
        runner.stop()


@pytest.mark.parametrize("where", ["decode step", "full-window forward"])
def test_a_request_cancelled_during_its_own_forward_pass_still_ends_its_stream(where):
    """The cancel lands while the row's forward pass runs (not between steps): the row leaves and a consumer that
    keeps reading sees the end instead of waiting forever."""
    import asyncio

    backend = TorchBackend(make_tiny_model())
    scheduler = Scheduler(backend, max_batch=2)
    try:
        if where == "decode step":
            stream = scheduler.submit(Request([1, 2, 3], 100_000, SamplingParams(1.0), seed=0, window_mode="refill"))
            batch, step = scheduler._batch, scheduler._batch.step
            batch.step = lambda tokens: (stream.cancel(), step(tokens))[1]
        else:  # an exact-mode prompt past the window: every token is a full-window forward
            prompt = [1 + i % 60 for i in range(backend.block_size + 4)]
            stream = scheduler.submit(Request(prompt, 100_000, SamplingParams(1.0), seed=0, window_mode="exact"))
            window_logits = backend.window_logits
            backend.window_logits = lambda ids: (stream.cancel(), window_logits(ids))[1]

        async def read_to_the_end() -> int:
            count = 0
            while (chunk := await stream.atake()) is not None:
                count += len(chunk)
            return count

        assert asyncio.run(asyncio.wait_for(read_to_the_end(), timeout=10)) < 100_000
        assert wait_until(lambda: scheduler.stats()["active"] == 0)
    finally:
        scheduler.close()


def test_stopping_a_runner_ends_the_loops_it_runs():
    from gpt_serve.generation.runner import Runner

    runner = Runner("test-runner")
    scheduler = Scheduler(TorchBackend(make_tiny_model()), max_batch=2, runner=runner)
    stream = scheduler.submit(Request([1, 2], 100_000, window_mode="refill"))
    assert stream.take()
    runner.stop()
    assert not runner.thread.is_alive() and scheduler.closed
    with pytest.raises(RuntimeError, match="closed"):
        list(stream)


def test_a_process_that_exits_while_its_models_decode_exits_cleanly():
    """Interpreter exit with a PyTorch decode loop mid-stream (an error in a user's script, Ctrl+C): the runners
    stop first, so the process exits with its own status instead of aborting inside a PyTorch op."""
    script = """
from gpt_serve.generation.requests import Request
from gpt_serve.generation.runner import torch_runner
from gpt_serve.generation.scheduler import Scheduler
from gpt_serve.generation.spec import GenerationRequest
from gpt_serve.generation.backends.torch_backend import TorchBackend
from gpt_serve.generation.fields import RequestError
from tests.conftest import make_tiny_model
runner = torch_runner()
scheduler = Scheduler(runner.call(lambda: TorchBackend(make_tiny_model())), runner=runner)
stream = scheduler.submit(Request([1, 2, 3], 100_000, window_mode="refill"))
assert stream.take()
raise SystemExit(3)
"""
    root = Path(__file__).resolve().parents[2]  # the repository's root
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=root)
    assert result.returncode == 3 and "terminate called" not in result.stderr, result.stderr[-2000:]


def test_the_torch_backend_copies_read_only_inputs():
    """A one-row full window (exact mode past block_size) once handed PyTorch a read-only broadcast view of its
    positions (PyTorch warns that it cannot protect such memory): read-only arrays are copied, others shared."""
    from gpt_serve.generation.backends.torch_backend import int64_tensor

    positions = np.broadcast_to(np.arange(3), (1, 3))  # read-only
    tensor = int64_tensor(positions, "cpu")
    tensor[0, 0] = 7  # its own memory
    assert positions[0, 0] == 0 and tensor.dtype.is_signed and tensor.shape == (1, 3)
    writable = np.arange(3, dtype=np.int64)[None]
    int64_tensor(writable, "cpu")[0, 0] = 7
    assert writable[0, 0] == 7  # shared, not copied
    backend = TorchBackend(make_tiny_model())
    ids = np.array([[1, 2, 3]], dtype=np.int64)
    logits, _ = backend.forward(ids, np.ones_like(ids), positions, None)
    np.testing.assert_array_equal(backend.window_logits(ids), logits)
