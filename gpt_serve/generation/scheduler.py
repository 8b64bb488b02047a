"""Continuous batching: one decode loop runs every active request of a loaded model as one batch. It is the one
token loop of this package: a server's requests, the demo's and a script's single prompt (`generate_tokens`) all
run on it.

    scheduler = Scheduler(load_backend("shakespeare", "onnx-int8").backend, max_batch=16)
    stream = scheduler.submit(Request(prompt_ids, 200, SamplingParams(0.8), seed=1))
    for token in stream:        # ids, as the loop makes them (closing or `cancel()` frees the row)
        ...
    scheduler.close()

Iteration-level scheduling, as serving engines do it: between two decode steps, waiting requests are prefilled and
join the batch, and finished, stopped or cancelled requests leave it. A decode step runs one token for every row in
one forward pass (`backend.new_batch()`, a `DecodeBatch` that keeps the rows' KV caches the backend's way).

Every iteration has a budget of `max_tokens_per_step` tokens of forward work, shared, in this order, by the decode
step (one token per row), the prefills of waiting requests (FIFO; a prefill is one window, at most `block_size`
tokens; requests whose windows have the same length are prefilled together, in one forward pass) and prompt scoring
(`score`: a prompt's own logprobs, `echo`, one chunk of full windows at a time). Each of them gets at least one unit
per iteration, so none starves; none runs unbounded, so a long prompt to score or a burst of arrivals delays the
others by a few steps, not by its whole cost.

A request's failure is its own: the output side of a step (`rows.next_tokens`: penalties, filters, sampling,
logprobs) runs every row inside its own error boundary, and so do a row's prefill, its window's refill and its
scoring; such a request ends with an `EngineError`, and its neighbours get exactly the tokens they would have had.
Only a decode step that fails as a whole (a broken backend) ends every running request.

A request's tokens do not depend on what else runs: each has its own RNG (its seed), its own sampling settings and
its own window (`gpt_serve.chargpt.window`). A row's window is its own tokens only (padding never counts against it):
when
it outgrows `block_size`, a `"refill"` row is prefilled again from its last `refill_tokens` tokens and rejoins; an
`"exact"` row leaves the batch for a full-window forward per token (the lesson's semantics), run for all such rows
together in their own forward pass, a few rows per step (`max_recompute_per_step`), so that they never hold the
others up for long. The queue is bounded: past `max_queue` waiting requests `submit` raises `ServerBusy`.

The loop runs on a `Runner`'s thread (`runner`), or, with an `InlineRunner`, on the thread that reads its streams.
Requests and streams are in `requests`; a stream is read with `take()` from any thread, or with
`await stream.atake()` on an asyncio event loop. The scheduler meets them, and its runner, only through their public
sides (`Stream.put`/`finish`, `StreamOwner`; `runner.Loop`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import islice

import numpy as np

from ..chargpt.window import window_keep, window_start
from .backends.protocol import Backend, DecodeBatch
from .fields import check_value
from .logprobs import WINDOWS_PER_CALL, scoring_chunks
from .requests import EngineError, Request, Scoring, ServerBusy, Stream
from .rows import Row, next_tokens
from .runner import InlineRunner, Runner, torch_runner
from .sampling import SamplingParams

logger = logging.getLogger(__name__)

__all__ = ["EngineError", "InlineRunner", "Request", "Runner", "Scheduler", "Scoring", "ServerBusy", "Stream"]
__all__ += ["check_prompt_ids", "torch_runner"]

DEFAULT_MAX_BATCH = 16  # rows decoding together, every surface's default (`gpt-serve serve --max-batch`)
DEFAULT_MAX_QUEUE = 256  # requests waiting for a row before the next is refused (a 429)
MAX_TOKENS_PER_STEP = 4096  # the default budget of one iteration's forward work (see the module docstring)


def check_prompt_ids(ids: Sequence[int], vocab_size: int, name: str = "the prompt") -> None:
    """A ValueError unless `ids` is a non-empty sequence of ids in [0, vocab_size)."""
    if not len(ids):
        raise ValueError(f"{name} is empty; give at least one token (the lesson starts from id 0, a newline)")
    bad = [t for t in ids if not 0 <= int(t) < vocab_size]
    if bad:
        raise ValueError(f"{name} holds ids {bad[:10]} outside the vocabulary [0, {vocab_size - 1}]")


def describe(backend: Backend) -> str:
    """What computes the logits, for messages: the backend's `description` (its folder and runtime)."""
    return str(getattr(backend, "description", type(backend).__name__))


def _resolve(futures: list[asyncio.Future]) -> None:
    for future in futures:
        if not future.done():  # a cancelled waiter (its client went away) stays cancelled
            future.set_result(None)


class Scheduler:
    """One decode loop for one backend, run by a `Runner`'s thread; see the module docstring.

    Args:
        backend: a `TorchBackend` or `OnnxBackend` (anything with `new_batch`, `window_logits`, `sequence_logits`,
            `block_size`, `vocab_size`).
        max_batch: the most rows decoding at once.
        max_queue: the most requests waiting to join (prompts to score included); `submit` and `score` raise
            `ServerBusy` past it.
        max_prefills_per_step: the most waiting requests prefilled in one iteration (None: as many as the token
            budget and the free rows allow).
        max_recompute_per_step: the most exact-mode rows past their window advanced per iteration.
        max_tokens_per_step: the iteration's budget of forward work, in tokens (see the module docstring).
        runner: the `Runner` whose thread runs the loop (None: a runner of its own, stopped by `close`). The
            registry gives every PyTorch backend the shared `torch_runner()`; an `InlineRunner` steps the loop on
            the thread that reads the streams (what the library's `generate_tokens` uses).
    """

    def __init__(
        self,
        backend: Backend,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_queue: int = DEFAULT_MAX_QUEUE,
        max_prefills_per_step: int | None = None,
        max_recompute_per_step: int = 4,
        max_tokens_per_step: int = MAX_TOKENS_PER_STEP,
        runner: Runner | InlineRunner | None = None,
    ):
        for name, value in (("max_batch", max_batch), ("max_queue", max_queue), ("max_tokens", max_tokens_per_step)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.backend = backend
        self.name = describe(backend)
        self.max_batch, self.max_queue = max_batch, max_queue
        self.max_prefills_per_step, self.max_recompute_per_step = max_prefills_per_step, max_recompute_per_step
        self.max_tokens_per_step = max_tokens_per_step
        # a scoring chunk: this many full windows in one forward pass (the largest chunk, in tokens)
        self._score_windows = max(1, min(WINDOWS_PER_CALL, max_tokens_per_step // backend.block_size))
        self._score_chunk = self._score_windows * backend.block_size
        self._waiting: deque[Stream] = deque()
        self._scoring: deque[tuple[Scoring, object]] = deque()  # (job, its chunks: `logprobs.scoring_chunks`)
        self._lock = threading.Lock()
        self._closed = False
        self._stopped = threading.Event()
        # Made on the runner's thread, the one thread that runs the backend (see `Runner`).
        self._batch: DecodeBatch | None = None
        self._batched: list[Row] = []  # row i of self._batch
        self._recompute: deque[Row] = deque()  # exact-mode rows past their window
        self.steps = 0  # forward passes run (decode steps, prefills, full-window recomputes, scoring chunks)
        self.tokens = 0
        self._to_wake: list = []  # streams and scorings given something since the last `_wake_async`
        self._owns_runner = runner is None
        self._runner = runner or Runner()
        try:
            self._batch = self._runner.call(self.backend.new_batch, self.max_batch)  # made on the runner's thread
        except BaseException:
            if self._owns_runner:
                self._runner.stop()
            raise
        self._runner.add(self)

    # -- the public side --

    def submit(self, request: Request) -> Stream:
        """Queues `request`; returns its `Stream`. Raises ValueError for a bad request, `ServerBusy` when full."""
        self._check(request)
        stream = Stream(request, self)
        with self._lock:
            self._admit_to_queue()
            self._waiting.append(stream)
        self._runner.wake()
        return stream

    def score(self, ids: Sequence[int], top_n: int) -> Scoring:
        """Queues the scoring of a prompt's own tokens (`logprobs.prompt_logprobs`, with the `top_n` most likely
        beside each); returns its `Scoring`. ValueError for bad ids or `top_n`, `ServerBusy` when full."""
        check_prompt_ids(ids, self.backend.vocab_size)
        check_value("logprobs", top_n)
        job = Scoring(ids, top_n, self)
        with self._lock:
            self._admit_to_queue()
            chunks = scoring_chunks(self.backend, job.ids, top_n, job.entries, self._score_windows)
            self._scoring.append((job, chunks))
        self._runner.wake()
        return job

    def call(self, function, *args):
        """Runs `function(*args)` on the loop's thread, between two decode steps, and returns its result (or raises
        its error). For other work on the same model (the demo's attention maps), so that one thread runs the
        backend: see `Runner`."""
        if self.closed:
            raise RuntimeError("the scheduler is closed")
        return self._runner.call(function, *args)

    def stats(self) -> dict[str, int]:
        with self._lock:
            waiting, scoring = len(self._waiting), len(self._scoring)
        return dict(
            active=len(self._batched) + len(self._recompute),
            waiting=waiting,
            scoring=scoring,
            steps=self.steps,
            tokens=self.tokens,
        )

    def close(self) -> None:
        """Stops the loop; requests still running or waiting end with an error."""
        with self._lock:
            self._closed = True
        if self._runner.inline:
            if not self._stopped.is_set():
                self.shutdown()
        else:
            self._runner.wake()
            if threading.current_thread() is not self._runner.thread:
                self._stopped.wait(timeout=10)
        if self._owns_runner:
            self._runner.stop()

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    # -- what streams and the runner ask of it (`requests.StreamOwner`, `runner.Loop`) --

    def wake(self) -> None:
        self._runner.wake()

    def drive(self, item: Stream | Scoring) -> None:
        """With an `InlineRunner`: runs iterations of the loop here until `item` is ready to read. A no-op for a loop
        on a runner's thread."""
        if not self._runner.inline:
            return
        while not item.ready:
            if self.closed:
                self.shutdown()
                return
            self.iterate(lambda: item.ready)

    def iterate(self, ready: Callable[[], bool] | None = None) -> bool:
        """One iteration of the loop (on the runner's thread): cancellations, admissions, scoring, one decode step.
        Returns whether there is more to do. `ready` (an inline consumer's question: is my stream ready?) ends the
        iteration before the decode step once it is true, so a prompt's first token is not held back by a step for
        its second."""
        try:
            self._drop_cancelled()
            budget = self.max_tokens_per_step - len(self._batched)  # what the decode step leaves for the rest
            budget -= self._admit(budget)
            self._recompute_some()
            self._score_some(budget)
            if ready is None or not ready():
                self._decode()
        except Exception as e:  # a broken backend: the running requests end with the error, the loop goes on
            logger.exception("decode step failed")
            self._fail_all(e)
        self._wake_async()
        with self._lock:
            queued = bool(self._waiting or self._scoring)
        return bool(self._batched or self._recompute or queued)

    def shutdown(self, error: BaseException | None = None) -> None:
        """Ends what is running or waiting (on the runner's thread): once closed, or with `error` when the loop itself
        failed (the scheduler is closed then)."""
        with self._lock:
            self._closed = True
        self._fail_all(error or RuntimeError("the scheduler was closed"), waiting=True, fresh_batch=False)
        self._wake_async()
        self._stopped.set()

    # -- the loop --

    def _admit_to_queue(self) -> None:
        """(Under the lock.) Raises unless a request may wait now."""
        if self._closed:
            raise RuntimeError("the scheduler is closed")
        queued = len(self._waiting) + len(self._scoring)
        if queued >= self.max_queue:
            raise ServerBusy(
                f"server busy: {queued} requests are already waiting (the limit is {self.max_queue}); try again shortly"
            )

    def _check(self, r: Request) -> None:
        if not isinstance(r, Request):
            raise TypeError(f"submit takes a Request, got {type(r).__name__}")
        check_value("max_new_tokens", r.max_new_tokens)
        check_prompt_ids(r.prompt_ids, self.backend.vocab_size)
        if r.seed is not None:
            check_value("seed", r.seed)
        if not isinstance(r.sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(r.sampling).__name__}")
        window_keep(self.backend.block_size, r.window_mode, r.refill_tokens)  # raises for a bad window
        if r.logprobs is not None:
            check_value("logprobs", r.logprobs)

    def _end(self, item: Stream | Scoring, error: BaseException | None = None) -> None:
        item.finish(error)
        self._to_wake.append(item)

    def _wake_async(self) -> None:
        """Wakes the async waiters of the streams given tokens: one call into each event loop for all of its."""
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = {}
        for item in self._to_wake:
            waiter = item.waiter
            if waiter is not None:
                by_loop.setdefault(waiter[0], []).append(waiter[1])
        self._to_wake.clear()
        for loop, futures in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, futures)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def _drop_cancelled(self) -> None:
        for i in reversed(range(len(self._batched))):
            if self._batched[i].stream.cancelled.is_set():
                self._end(self._batched[i].stream)
                self._remove(i)
        for row in [r for r in self._recompute if r.stream.cancelled.is_set()]:
            self._recompute.remove(row)
            self._end(row.stream)
        if not self._waiting and not self._scoring:  # read without the lock: looked at again next iteration
            return
        with self._lock:
            cancelled = [s for s in self._waiting if s.cancelled.is_set()]
            for stream in cancelled:
                self._waiting.remove(stream)
            gone = [pair for pair in self._scoring if pair[0].cancelled.is_set()]
            for pair in gone:
                self._scoring.remove(pair)
        for item in [*cancelled, *(job for job, _ in gone)]:
            self._end(item)

    def _remove(self, index: int) -> None:
        """Takes row `index` out of the batch; the last row moves into its place, in both lists."""
        self._batch.remove(index)
        last = self._batched.pop()
        if index < len(self._batched):
            self._batched[index] = last

    def _admit(self, budget: int) -> int:
        """Prefills waiting requests within `budget` tokens (at least one request, if a row is free), requests whose
        windows have the same length together; returns the tokens prefilled."""
        free = self.max_batch - len(self._batched) - len(self._recompute)
        limit = free if self.max_prefills_per_step is None else min(free, self.max_prefills_per_step)
        groups: dict[int, list[Row]] = {}
        used = taken = 0
        while taken < limit:
            with self._lock:
                if not self._waiting:
                    break
                length = min(len(self._waiting[0].request.prompt_ids), self.backend.block_size)
                if taken and used + length > budget:
                    break
                stream = self._waiting.popleft()
            taken += 1
            stream.admitted_at = time.perf_counter()
            try:
                row = Row(stream, self.backend.block_size, self.backend.vocab_size)
            except Exception as e:  # this request's own state could not be made
                self._end(stream, EngineError(f"the request could not start: {type(e).__name__}: {e}"))
                continue
            if len(row.ids) - row.start > self.backend.block_size or (row.exact and row.start > 0):
                self._recompute.append(row)  # exact mode, a prompt past the window: full-window forwards from now
                continue
            used += len(row.ids) - row.start
            groups.setdefault(len(row.ids) - row.start, []).append(row)
        for rows in groups.values():
            self._prefill(rows)
        return used

    def _prefill(self, rows: list[Row]) -> None:
        """Prefills `rows` (windows of one length) as new rows of the batch, in one forward pass (or, if that fails,
        each alone: a row whose own prefill fails ends with its error), and gives each its first token."""
        first = len(self._batched)
        try:
            logits = self._batch.add_rows([row.window() for row in rows])  # (k, V)
            self.steps += 1
            self._batched += rows
        except Exception:
            if len(self._batch) != first:  # a batch left half-changed: nothing else can be trusted
                raise
            kept, out = [], []
            for row in rows:
                try:
                    out.append(self._batch.add(row.window()))
                except Exception as e:
                    logger.exception("prefill failed")
                    self._end(row.stream, EngineError(f"the prefill failed for this request: {e}"))
                    continue
                self.steps += 1
                self._batched.append(row)
                kept.append(row)
            if not kept:
                return
            rows, logits = kept, np.stack(out)
        self._apply(rows, logits, first)

    def _apply(self, rows: list[Row], logits: np.ndarray, first: int) -> None:
        """Samples the next token of `rows` (batch rows `first`, `first + 1`, ...) from `logits` (rows, V), then
        moves each on (`_advance`), last row first: a row that leaves is replaced by the last row (done already),
        and a row that rejoins goes last."""
        out = next_tokens(rows, logits, self.name)
        for i in reversed(range(len(rows))):
            self._advance(rows[i], first + i, int(out.tokens[i]), out.logprobs[i], out.errors.get(i))

    def _advance(self, row: Row, index: int, token: int, logprob=None, error: BaseException | None = None) -> None:
        """Gives `row` (batch row `index`) its next token, or ends it with `error`, and moves it on: finished, to its
        next window, or on in the batch (where the token is fed at the next step)."""
        block = self.backend.block_size
        done = slide = False
        if error is None:
            try:
                done = self._deliver(row, token, logprob)
                slide = not done and len(row.ids) - row.start > block  # the next token would not fit
            except Exception as e:  # this row's own bookkeeping
                logger.exception("a row's output failed")
                error = EngineError(f"the output of this request failed: {type(e).__name__}: {e}")
        if error is not None or done or slide:
            self._remove(index)
        if error is not None:
            self._end(row.stream, error)
        elif slide:
            if row.exact:
                self._recompute.append(row)
                return
            row.start = window_start(len(row.ids), row.start, block, row.keep)  # refill: the last `keep` tokens
            self._prefill([row])

    def _deliver(self, row: Row, token: int, logprob) -> bool:
        """Gives `row`'s stream its token; True when the request ends here, finished or cancelled by its consumer
        meanwhile (its stream is then ended: the consumer sees the end either way)."""
        complete = row.accept(token)
        self.tokens += 1
        row.stream.put(token, logprob)
        self._to_wake.append(row.stream)
        ends = complete or row.stream.cancelled.is_set()
        if ends:
            self._end(row.stream)
        return ends

    def _recompute_some(self) -> None:
        """Advances up to `max_recompute_per_step` exact-mode rows past their window by one token each (in one
        forward pass, or, if that fails, each alone: a row whose own forward fails ends with its error)."""
        if not self._recompute:
            return
        block = self.backend.block_size
        # the rows stay queued (and counted active by `stats`) until their forward is done
        rows = list(islice(self._recompute, self.max_recompute_per_step))
        windows = np.array([r.ids[-block:] for r in rows], dtype=np.int64)  # (k, block_size): every row's last window
        try:
            logits = self.backend.window_logits(windows)
            self.steps += 1
            for _ in rows:
                self._recompute.popleft()
        except Exception:
            kept, out = [], []
            for row, window in zip(rows, windows, strict=True):
                try:
                    out.append(self.backend.window_logits(window[None])[0])
                except Exception as e:
                    logger.exception("a full-window forward failed")
                    self._end(row.stream, EngineError(f"the full-window forward failed for this request: {e}"))
                    continue
                finally:
                    self._recompute.popleft()
                self.steps += 1
                kept.append(row)
            if not kept:
                return
            rows, logits = kept, np.stack(out)
        out = next_tokens(rows, logits, self.name)
        for i, row in enumerate(rows):
            error = out.errors.get(i)
            if error is None:
                try:
                    if self._deliver(row, int(out.tokens[i]), out.logprobs[i]):
                        continue
                except Exception as e:
                    error = EngineError(f"the output of this request failed: {type(e).__name__}: {e}")
            if error is not None:
                self._end(row.stream, error)
            else:
                self._recompute.append(row)

    def _score_some(self, budget: int) -> None:
        """Runs chunks of the queued scorings, in turn, within `budget` tokens (at least one chunk)."""
        spent = 0
        while self._scoring and (spent == 0 or spent + self._score_chunk <= budget):
            job, chunks = self._scoring[0]
            try:
                spent += next(chunks)
                self.steps += 1
                self._scoring.rotate(-1)  # the next job's chunk next
                continue
            except StopIteration:
                error = None
            except Exception as e:  # this prompt's own failure
                logger.exception("scoring failed")
                error = EngineError(f"{self.name} failed to score this prompt: {type(e).__name__}: {e}")
            with self._lock:
                self._scoring.popleft()
            self._end(job, error)

    def _decode(self) -> None:
        if not self._batched:
            return
        rows = list(self._batched)
        tokens = np.fromiter((r.ids[-1] for r in rows), dtype=np.int64, count=len(rows))
        logits = self._batch.step(tokens)
        self.steps += 1
        self._apply(rows, logits, 0)

    def _fail_all(self, error: BaseException, waiting: bool = False, fresh_batch: bool = True) -> None:
        """Ends every running request (and, with `waiting`, every queued one and every scoring) with `error`; then,
        with `fresh_batch`, a new empty batch for the next requests."""
        running = [*self._batched, *self._recompute]
        self._batched, self._recompute = [], deque()
        queued: list = []
        if waiting:
            with self._lock:
                queued = [*self._waiting, *(job for job, _ in self._scoring)]
                self._waiting, self._scoring = deque(), deque()
        for item in [r.stream for r in running] + queued:
            self._end(item, error)
        if fresh_batch:
            self._batch = self.backend.new_batch(self.max_batch)
