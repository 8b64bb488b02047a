"""Continuous batching: one decode loop runs every active request of a loaded model as one batch.

    scheduler = Scheduler(load_backend("shakespeare", "onnx-int8").backend, max_batch=16)
    stream = scheduler.submit(Request(prompt_ids, 200, SamplingParams(0.8), seed=1))
    for token in stream:        # ids, as the loop makes them (closing or `cancel()` frees the row)
        ...
    scheduler.close()

Iteration-level scheduling, as serving engines do it: between two decode steps, waiting requests are prefilled and
join the batch (FIFO, at most `max_prefills_per_step` per step so a burst of arrivals cannot stall the others), and
finished, stopped or cancelled requests leave it. A decode step runs one token for every row in one forward pass
(`backend.new_batch()`, a `DecodeBatch` that keeps the rows' KV caches the backend's way).

A request's tokens do not depend on what else runs: each has its own RNG (its seed), its own sampling settings and
its own window. A row's window is its own tokens only (padding never counts against it): when it outgrows
`block_size`, a `"refill"` row is prefilled again from its last `refill_tokens` tokens and rejoins; an `"exact"`
row leaves the batch for a full-window forward per token (the lesson's semantics), run for all such rows together
in their own forward pass, a few rows per step (`max_recompute_per_step`), so that they never hold the others up
for long. The queue is bounded: past `max_queue` waiting requests `submit` raises `ServerBusy`.

The loop runs on a `Runner`'s thread, which can run several schedulers' loops in turn: every PyTorch model of a
process shares `torch_runner()` (see `Runner` for why), and each ONNX Runtime scheduler has a runner of its own.
A stream is read with `take()` from any thread, or with `await stream.atake()` on an asyncio event loop.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from itertools import islice
from typing import Protocol

import numpy as np

from .engine import Backend, check_prompt_ids, check_seed, window_keep
from .sampling import SamplingParams, sample_rows

logger = logging.getLogger(__name__)


class ServerBusy(RuntimeError):
    """The scheduler's queue is full: the request was not accepted (HTTP APIs answer 429/503)."""


class DecodeBatch(Protocol):
    """The rows decoding together and their KV caches, kept by the backend (`backend.new_batch(max_rows)`).

    Rows are numbered 0..len-1: a new row is the last one, and removing a row moves the last row into its place."""

    def __len__(self) -> int: ...

    def add(self, ids: Sequence[int]) -> np.ndarray:
        """Prefills `ids` (a window: positions 0..len-1) as a new last row; returns the logits (V,) of its last
        position."""

    def remove(self, row: int) -> None: ...

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Appends one token (int64 (rows,)) to every row; returns the logits (rows, V)."""


@dataclass(frozen=True)
class Request:
    """What to generate: prompt ids (non-empty), how many tokens, how to sample, and the window past block_size."""

    prompt_ids: Sequence[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    window_mode: str = "exact"
    refill_tokens: int | None = None
    stop_token_ids: Sequence[int] = ()


_DONE = object()


class Stream:
    """The tokens of one submitted request, as an iterator of ids. `cancel()` (or closing the iterator, or a
    consumer that stops reading and drops it) removes the request's row before the next decode step."""

    def __init__(self, request: Request, scheduler: Scheduler):
        self.request = request
        self._scheduler = scheduler
        self._tokens: queue.SimpleQueue = queue.SimpleQueue()
        self.cancelled = threading.Event()
        self._ended = threading.Event()  # the scheduler is done with the request (`wait`)
        self.error: BaseException | None = None
        self.submitted_at = time.perf_counter()
        self.first_token_at: float | None = None
        self.generated = 0
        self._finished = False  # the consumer has seen the end
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None  # an `atake` waiting

    def cancel(self) -> None:
        if not self.cancelled.is_set():
            self.cancelled.set()
            self._scheduler._runner.wake()

    def __iter__(self) -> Iterator[int]:
        try:
            while (chunk := self.take()) is not None:
                yield from chunk
        finally:
            self.cancel()  # a consumer that stops early frees the row (a no-op once finished)

    def take(self) -> list[int] | None:
        """Every token made since the last call (waiting for at least one), or None once the request is finished.

        A consumer that only needs to look now and then (a page refreshed every 50 ms) waits between calls
        (`wait(interval)`, which returns early at the end) and gets several tokens at once, instead of being woken
        for every token."""
        if not self._finished:
            chunk = [self._tokens.get()]
            while not self._tokens.empty():
                chunk.append(self._tokens.get())
            if chunk[-1] is not _DONE:
                return chunk
            self._finished = True
            if chunk[:-1]:
                return chunk[:-1]  # the last tokens; the end (or the error) comes at the next call
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return None

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the request has ended (finished, cancelled or failed: its last token is ready for `take`)
        or `timeout` seconds have passed; True if it ended. A consumer that looks now and then waits with this
        instead of sleeping, so the end reaches it at once."""
        return self._ended.wait(timeout)

    async def atake(self) -> list[int] | None:
        """`take` for a consumer on an asyncio event loop (the API's handlers): waits without a thread. The loop
        is woken once per decode step for all its streams that got tokens, not once per stream."""
        while self._tokens.empty() and not self._finished:
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            self._waiter = (loop, future)
            if not self._tokens.empty():  # a token came before the waiter was seen: no need to wait
                self._waiter = None
                break
            try:
                await future
            finally:
                self._waiter = None
        return self.take()

    # -- the scheduler's side --

    def _put(self, token: int) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.generated += 1
        self._tokens.put(token)
        self._scheduler._to_wake.append(self)

    def _finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self._tokens.put(_DONE)
        self._ended.set()
        self._scheduler._to_wake.append(self)


class _Row:
    """A running request: its tokens, RNG, window and where it runs."""

    def __init__(self, stream: Stream, block_size: int, vocab_size: int):
        r = stream.request
        self.stream = stream
        self.sampling = r.sampling
        self.ids = [int(t) for t in r.prompt_ids]  # the prompt and every generated token
        self.prompt_len = len(self.ids)
        self.rng = np.random.default_rng(r.seed)
        self.keep = window_keep(block_size, r.window_mode, r.refill_tokens)
        self.exact = r.window_mode == "exact"
        self.stops = set(int(t) for t in r.stop_token_ids)
        # transformers' repetition penalty applies to every token seen so far: kept as a mask over the vocabulary
        self.seen = None
        if r.sampling.repetition_penalty != 1.0:
            self.seen = np.zeros(vocab_size, dtype=bool)
            self.seen[self.ids] = True
        # The window is ids[start:]; a prompt longer than the window starts from its last `keep` tokens, as the
        # engine's loop does.
        self.start = len(self.ids) - self.keep if len(self.ids) > block_size else 0

    @property
    def done(self) -> bool:
        r = self.stream.request
        return len(self.ids) - self.prompt_len >= r.max_new_tokens or (
            len(self.ids) > self.prompt_len and self.ids[-1] in self.stops
        )


class Runner:
    """A thread that runs the decode loops of one or more schedulers, one iteration of each in turn, and other work
    on their models between iterations (`call`).

    Why PyTorch models share one (`torch_runner()`): PyTorch's CPU ops run on OpenMP (libgomp) thread teams, one
    team per thread that has run a parallel op, kept for the thread's life. Once the teams' threads outnumber the
    CPUs, libgomp stops letting them spin between ops and every op waits for its team to be woken: on the 2-core
    development machine the idle 2-thread team of the thread that loaded the model made a decode step of the
    shipped model on another thread 1.7-3x slower (`benchmarks/decode_threads.py`: 2.99 against 0.92 ms at one
    row, 5.50 against 3.15 ms at 16). So every PyTorch model of a process is loaded and decoded on one thread.
    ONNX Runtime sessions have their own thread pools: each of their schedulers gets a runner of its own.

    `stop()` ends the loops it runs (their requests end with an error) after the current iteration. At interpreter
    exit every runner still running is stopped that way: a thread still inside a PyTorch op while the interpreter
    tears down aborts the process ("terminate called without an active exception").
    """

    def __init__(self, name: str = "gpt-serve-scheduler"):
        self._schedulers: list[Scheduler] = []
        self._calls: queue.SimpleQueue = queue.SimpleQueue()  # (function, args, future)
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _runners.add(self)

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def wake(self) -> None:
        self._event.set()

    def call(self, function, *args):
        """Runs `function(*args)` on the runner's thread, between two iterations, and returns its result (or raises
        its error)."""
        if threading.current_thread() is self._thread:
            return function(*args)
        future: Future = Future()
        with self._lock:
            if self._stopping or not self._thread.is_alive():
                raise RuntimeError("the runner is stopped")
            self._calls.put((function, args, future))
        self.wake()
        return future.result()

    def stop(self, timeout: float = 10.0) -> None:
        """Ends the loops it runs after the current iteration, and waits up to `timeout` seconds for the thread."""
        self._request_stop()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=timeout)

    def _request_stop(self) -> None:
        with self._lock:
            self._stopping = True
        self.wake()

    def _add(self, scheduler: Scheduler) -> None:
        with self._lock:
            if self._stopping:
                raise RuntimeError("the runner is stopped")
            self._schedulers.append(scheduler)
        self.wake()

    def _run_calls(self) -> None:
        while not self._calls.empty():
            function, args, future = self._calls.get()
            try:
                future.set_result(function(*args))
            except BaseException as e:  # the caller gets it
                future.set_exception(e)

    def _run(self) -> None:
        while True:
            self._run_calls()
            with self._lock:
                stopping, schedulers = self._stopping, list(self._schedulers)
            busy = False
            for scheduler in schedulers:
                try:
                    if not stopping and not scheduler._closing():
                        busy = scheduler._iterate() or busy
                        continue
                    scheduler._shutdown()
                except BaseException as e:  # the loop itself failed (no memory for a batch): only it ends
                    logger.exception("a decode loop failed; its requests end with the error")
                    try:
                        scheduler._shutdown(e)
                    except BaseException:
                        logger.exception("and could not end its requests")
                with self._lock:
                    self._schedulers.remove(scheduler)
            if stopping and not schedulers:
                break
            if not busy:
                with self._lock:
                    idle = self._calls.empty() and not self._stopping and not any(s._closing() for s in schedulers)
                if idle:
                    self._event.wait()
                    self._event.clear()
        while not self._calls.empty():
            self._calls.get()[2].set_exception(RuntimeError("the runner is stopped"))


_runners: weakref.WeakSet[Runner] = weakref.WeakSet()


@atexit.register
def _stop_runners() -> None:
    """Runs before the interpreter stops its daemon threads (after the others have ended)."""
    runners = list(_runners)
    for runner in runners:  # all of them at once, then one deadline for all
        runner._request_stop()
    deadline = time.monotonic() + 10
    for runner in runners:
        runner.thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _resolve(futures: list[asyncio.Future]) -> None:
    for future in futures:
        if not future.done():  # a cancelled waiter (its client went away) stays cancelled
            future.set_result(None)


_torch_runner: Runner | None = None
_torch_runner_lock = threading.Lock()


def torch_runner() -> Runner:
    """The process's one runner for PyTorch models (see `Runner`), started on first use."""
    global _torch_runner
    with _torch_runner_lock:
        if _torch_runner is None or not _torch_runner.thread.is_alive():
            _torch_runner = Runner("gpt-serve-torch")
        return _torch_runner


class Scheduler:
    """One decode loop for one backend, run by a `Runner`'s thread; see the module docstring.

    Args:
        backend: a `TorchBackend` or `OnnxBackend` (anything with `new_batch`, `window_logits`, `block_size`,
            `vocab_size`).
        max_batch: the most rows decoding at once.
        max_queue: the most requests waiting to join; `submit` raises `ServerBusy` past it.
        max_prefills_per_step: the most waiting requests prefilled between two decode steps.
        max_recompute_per_step: the most exact-mode rows past their window advanced per step.
        runner: the `Runner` whose thread runs the loop (None: a runner of its own, stopped by `close`). The
            registry gives every PyTorch backend the shared `torch_runner()`.
    """

    def __init__(
        self,
        backend: Backend,
        max_batch: int = 16,
        max_queue: int = 256,
        max_prefills_per_step: int = 2,
        max_recompute_per_step: int = 4,
        runner: Runner | None = None,
    ):
        for name, value in (("max_batch", max_batch), ("max_queue", max_queue)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.backend = backend
        self.max_batch, self.max_queue = max_batch, max_queue
        self.max_prefills_per_step, self.max_recompute_per_step = max_prefills_per_step, max_recompute_per_step
        self._waiting: deque[Stream] = deque()
        self._lock = threading.Lock()
        self._closed = False
        self._stopped = threading.Event()
        # Made on the runner's thread, the one thread that runs the backend (see `Runner`).
        self._batch: DecodeBatch | None = None
        self._batched: list[_Row] = []  # row i of self._batch
        self._recompute: deque[_Row] = deque()  # exact-mode rows past their window
        self.steps = 0  # forward passes run (decode steps, prefills and full-window recomputes)
        self.tokens = 0
        self._to_wake: list[Stream] = []  # streams given tokens since the last `_wake_async`
        self._owns_runner = runner is None
        self._runner = runner or Runner()
        try:
            self._batch = self._runner.call(self.backend.new_batch, self.max_batch)  # made on the runner's thread
        except BaseException:
            if self._owns_runner:
                self._runner.stop()
            raise
        self._runner._add(self)

    # -- the public side --

    def submit(self, request: Request) -> Stream:
        """Queues `request`; returns its `Stream`. Raises ValueError for a bad request, `ServerBusy` when full."""
        self._check(request)
        stream = Stream(request, self)
        with self._lock:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            if len(self._waiting) >= self.max_queue:
                raise ServerBusy(
                    f"server busy: {len(self._waiting)} requests are already waiting (the limit is {self.max_queue}); "
                    f"try again shortly"
                )
            self._waiting.append(stream)
        self._runner.wake()
        return stream

    def call(self, function, *args):
        """Runs `function(*args)` on the loop's thread, between two decode steps, and returns its result (or raises
        its error). For other work on the same model (the demo's attention maps), so that one thread runs the
        backend: see `Runner`."""
        if self._closing():
            raise RuntimeError("the scheduler is closed")
        return self._runner.call(function, *args)

    def stats(self) -> dict[str, int]:
        with self._lock:
            waiting = len(self._waiting)
        return dict(
            active=len(self._batched) + len(self._recompute),
            waiting=waiting,
            steps=self.steps,
            tokens=self.tokens,
        )

    def close(self) -> None:
        """Stops the loop; requests still running or waiting end with an error."""
        with self._lock:
            self._closed = True
        self._runner.wake()
        if threading.current_thread() is not self._runner.thread:
            self._stopped.wait(timeout=10)
        if self._owns_runner:
            self._runner.stop()

    def _check(self, r: Request) -> None:
        if not isinstance(r, Request):
            raise TypeError(f"submit takes a Request, got {type(r).__name__}")
        n = r.max_new_tokens
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {n!r}")
        check_prompt_ids(r.prompt_ids, self.backend.vocab_size)
        check_seed(r.seed)
        if not isinstance(r.sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(r.sampling).__name__}")
        window_keep(self.backend.block_size, r.window_mode, r.refill_tokens)  # raises for a bad window

    # -- the loop --

    def _closing(self) -> bool:
        with self._lock:
            return self._closed

    def _iterate(self) -> bool:
        """One iteration of the loop (on the runner's thread): cancellations, admissions, one decode step.
        Returns whether there is more to do."""
        try:
            self._drop_cancelled()
            self._admit()
            self._recompute_some()
            self._decode()
        except Exception as e:  # a broken backend: the running requests end with the error, the loop goes on
            logger.exception("decode step failed")
            self._fail_all(e)
        self._wake_async()
        with self._lock:
            waiting = bool(self._waiting)
        return bool(self._batched or self._recompute or waiting)

    def _wake_async(self) -> None:
        """Wakes the `atake` waiters of the streams given tokens: one call into each event loop for all of its."""
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = {}
        for stream in self._to_wake:
            waiter = stream._waiter
            if waiter is not None:
                by_loop.setdefault(waiter[0], []).append(waiter[1])
        self._to_wake.clear()
        for loop, futures in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, futures)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def _shutdown(self, error: BaseException | None = None) -> None:
        """Ends what is running or waiting (on the runner's thread): once closed, or with `error` when the loop itself
        failed (the scheduler is closed then)."""
        with self._lock:
            self._closed = True
        self._fail_all(error or RuntimeError("the scheduler was closed"), waiting=True, fresh_batch=False)
        self._wake_async()
        self._stopped.set()

    def _drop_cancelled(self) -> None:
        for i in reversed(range(len(self._batched))):
            if self._batched[i].stream.cancelled.is_set():
                self._batched[i].stream._finish()
                self._remove(i)
        for row in [r for r in self._recompute if r.stream.cancelled.is_set()]:
            self._recompute.remove(row)
            row.stream._finish()
        with self._lock:
            cancelled = [s for s in self._waiting if s.cancelled.is_set()]
            for stream in cancelled:
                self._waiting.remove(stream)
        for stream in cancelled:
            stream._finish()

    def _remove(self, index: int) -> None:
        """Takes row `index` out of the batch; the last row moves into its place, in both lists."""
        self._batch.remove(index)
        last = self._batched.pop()
        if index < len(self._batched):
            self._batched[index] = last

    def _admit(self) -> None:
        for _ in range(self.max_prefills_per_step):
            if len(self._batched) + len(self._recompute) >= self.max_batch:
                return
            with self._lock:
                if not self._waiting:
                    return
                stream = self._waiting.popleft()
            row = _Row(stream, self.backend.block_size, self.backend.vocab_size)
            if len(row.ids) - row.start > self.backend.block_size or (row.exact and row.start > 0):
                self._recompute.append(row)  # exact mode, a prompt past the window: full-window forwards from now
                continue
            try:
                logits = self._batch.add(row.ids[row.start :])
            except Exception as e:
                stream._finish(e)
                continue
            self.steps += 1
            self._batched.append(row)
            self._emit(row, logits[None], len(self._batched) - 1)

    def _recompute_some(self) -> None:
        """Advances up to `max_recompute_per_step` exact-mode rows past their window by one token each."""
        if not self._recompute:
            return
        block = self.backend.block_size
        rows = list(islice(self._recompute, self.max_recompute_per_step))
        ids = np.array([r.ids[-block:] for r in rows], dtype=np.int64)  # (k, block_size): every row's last window
        logits = self.backend.window_logits(ids)  # if it raises, the rows are still queued
        for _ in rows:
            self._recompute.popleft()
        self.steps += 1
        for row, token in zip(rows, self._sample(rows, logits), strict=True):
            if not self._append(row, token):
                self._recompute.append(row)

    def _decode(self) -> None:
        if not self._batched:
            return
        tokens = np.array([r.ids[-1] for r in self._batched], dtype=np.int64)
        rows = list(self._batched)
        chosen = self._sample(rows, self._batch.step(tokens))
        self.steps += 1
        # Reversed: a row that leaves is replaced by the last row (done already), a row that rejoins goes last.
        for i in reversed(range(len(rows))):
            self._advance(rows[i], int(chosen[i]), i)

    def _emit(self, row: _Row, logits: np.ndarray, index: int) -> None:
        """Samples the next token of `row` (batch row `index`) from `logits` (1, V), then `_advance`."""
        self._advance(row, int(self._sample([row], logits)[0]), index)

    def _advance(self, row: _Row, token: int, index: int) -> None:
        """Gives `row` (batch row `index`) its next token and moves it on: finished, to its next window, or on in
        the batch (where the token is fed at the next step)."""
        if self._append(row, token):
            self._remove(index)
            return
        if len(row.ids) - row.start > self.backend.block_size:  # the next token would not fit in the window
            self._remove(index)
            if row.exact:
                self._recompute.append(row)
                return
            row.start = len(row.ids) - row.keep  # refill: the last `keep` tokens, prefilled again
            try:
                logits = self._batch.add(row.ids[row.start :])
            except Exception as e:  # out of the batch already: this request ends with the error, the others go on
                logger.exception("refill prefill failed")
                row.stream._finish(e)
                return
            self.steps += 1
            self._batched.append(row)
            self._emit(row, logits[None], len(self._batched) - 1)

    @staticmethod
    def _sample(rows: list[_Row], logits: np.ndarray) -> np.ndarray:
        """One token per row from `logits` (rows, V), each with its own settings and RNG (`sample_rows`)."""
        penalized = [i for i, r in enumerate(rows) if r.seen is not None]
        if penalized:
            logits = logits.copy()
            for i in penalized:  # transformers' rule: a seen token's logit / penalty if positive, * penalty if not
                seen, penalty = rows[i].seen, rows[i].sampling.repetition_penalty
                row = logits[i, seen]
                logits[i, seen] = np.where(row > 0, row / penalty, row * penalty)
        return sample_rows(logits, [r.sampling for r in rows], [r.rng for r in rows])

    def _append(self, row: _Row, token: int) -> bool:
        """Gives `row` its token; returns True when the row ends here, finished or cancelled by its consumer
        meanwhile (its stream is then ended: the consumer sees the end either way)."""
        row.ids.append(token)
        if row.seen is not None:
            row.seen[token] = True
        self.tokens += 1
        row.stream._put(token)
        ends = row.done or row.stream.cancelled.is_set()
        if ends:
            row.stream._finish()
        return ends

    def _fail_all(self, error: BaseException, waiting: bool = False, fresh_batch: bool = True) -> None:
        """Ends every running request (and, with `waiting`, every queued one) with `error`; then, with
        `fresh_batch`, a new empty batch for the next requests."""
        running = [*self._batched, *self._recompute]
        self._batched, self._recompute = [], deque()
        queued = []
        if waiting:
            with self._lock:
                queued, self._waiting = list(self._waiting), deque()
        for stream in [r.stream for r in running] + queued:
            stream._finish(error)
        if fresh_batch:
            self._batch = self.backend.new_batch(self.max_batch)
