"""Continuous batching: one decode loop runs every active request of a loaded model as one batch. It is the one
token loop of this package: a server's requests, the demo's and a script's single prompt (`generate_tokens`) all
run on it.

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
its own window (`gpt_serve.window`). A row's window is its own tokens only (padding never counts against it): when
it outgrows `block_size`, a `"refill"` row is prefilled again from its last `refill_tokens` tokens and rejoins; an
`"exact"` row leaves the batch for a full-window forward per token (the lesson's semantics), run for all such rows
together in their own forward pass, a few rows per step (`max_recompute_per_step`), so that they never hold the
others up for long. The queue is bounded: past `max_queue` waiting requests `submit` raises `ServerBusy`.

The loop runs on a `Runner`'s thread (`runner`), or, with an `InlineRunner`, on the thread that reads its streams.
Requests and streams are in `requests`; a stream is read with `take()` from any thread, or with
`await stream.atake()` on an asyncio event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from itertools import islice

import numpy as np

from ..window import window_keep, window_start
from .backend import Backend, DecodeBatch
from .requests import EngineError, Request, ServerBusy, Stream
from .runner import InlineRunner, Runner, torch_runner
from .sampling import (
    SamplingParams,
    apply_openai_penalties,
    apply_repetition_penalty,
    finite_rows,
    log_softmax,
    sample_rows,
)
from .spec import check_value

logger = logging.getLogger(__name__)

__all__ = ["EngineError", "InlineRunner", "Request", "Runner", "Scheduler", "ServerBusy", "Stream", "check_prompt_ids"]
__all__ += ["torch_runner"]


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
        self.penalty = r.sampling.repetition_penalty
        self.stops = set(int(t) for t in r.stop_token_ids)
        self.top_logprobs = r.logprobs
        # OpenAI's penalties count the generated tokens only
        s = r.sampling
        self.counts = np.zeros(vocab_size, dtype=np.int64) if s.presence_penalty or s.frequency_penalty else None
        # transformers' repetition penalty applies to every token seen so far: kept as a mask over the vocabulary
        self.seen = None
        if r.sampling.repetition_penalty != 1.0:
            self.seen = np.zeros(vocab_size, dtype=bool)
            self.seen[self.ids] = True
        # The window is ids[start:] (`gpt_serve.window`); a prompt longer than the window starts from its last `keep`
        self.start = window_start(len(self.ids), 0, block_size, self.keep)

    @property
    def done(self) -> bool:
        r = self.stream.request
        return len(self.ids) - self.prompt_len >= r.max_new_tokens or (
            len(self.ids) > self.prompt_len and self.ids[-1] in self.stops
        )


def _resolve(futures: list[asyncio.Future]) -> None:
    for future in futures:
        if not future.done():  # a cancelled waiter (its client went away) stays cancelled
            future.set_result(None)


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
            registry gives every PyTorch backend the shared `torch_runner()`; an `InlineRunner` steps the loop on
            the thread that reads the streams (what the library's `generate_tokens` uses).
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
        if self._runner.inline:
            if not self._stopped.is_set():
                self._shutdown()
        else:
            self._runner.wake()
            if threading.current_thread() is not self._runner.thread:
                self._stopped.wait(timeout=10)
        if self._owns_runner:
            self._runner.stop()

    def _drive(self, stream: Stream, until_end: bool = False) -> None:
        """With an `InlineRunner`: runs iterations of the loop here until `stream` has a token to take (or, with
        `until_end`, has ended). A no-op for a loop on a runner's thread."""
        if not self._runner.inline:
            return
        while (stream._tokens.empty() or until_end) and not stream._ended.is_set():
            if self._closing():
                self._shutdown()
                return
            self._iterate(None if until_end else lambda: not stream._tokens.empty())

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

    # -- the loop --

    def _closing(self) -> bool:
        with self._lock:
            return self._closed

    def _iterate(self, ready=None) -> bool:
        """One iteration of the loop (on the runner's thread): cancellations, admissions, one decode step.
        Returns whether there is more to do. `ready` (an inline consumer's question: does my stream have a token?)
        ends the iteration before the decode step once it is true, so a prompt's first token is not held back by a
        step for its second."""
        try:
            self._drop_cancelled()
            self._admit()
            self._recompute_some()
            if ready is None or not ready():
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
        if not self._waiting:  # read without the lock: a request queued meanwhile is looked at next iteration
            return
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
            stream.admitted_at = time.perf_counter()
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
        tokens, logprobs = self._sample(rows, logits)
        for row, token, lp in zip(rows, tokens, logprobs, strict=True):
            if not self._append(row, int(token), lp):
                self._recompute.append(row)

    def _decode(self) -> None:
        if not self._batched:
            return
        tokens = np.array([r.ids[-1] for r in self._batched], dtype=np.int64)
        rows = list(self._batched)
        chosen, logprobs = self._sample(rows, self._batch.step(tokens))
        self.steps += 1
        # Reversed: a row that leaves is replaced by the last row (done already), a row that rejoins goes last.
        for i in reversed(range(len(rows))):
            self._advance(rows[i], int(chosen[i]), i, logprobs[i])

    def _emit(self, row: _Row, logits: np.ndarray, index: int) -> None:
        """Samples the next token of `row` (batch row `index`) from `logits` (1, V), then `_advance`."""
        tokens, logprobs = self._sample([row], logits)
        self._advance(row, int(tokens[0]), index, logprobs[0])

    def _advance(self, row: _Row, token: int, index: int, logprob=None) -> None:
        """Gives `row` (batch row `index`) its next token and moves it on: finished, to its next window, or on in
        the batch (where the token is fed at the next step)."""
        if self._append(row, token, logprob):
            self._remove(index)
            return
        start = window_start(len(row.ids), row.start, self.backend.block_size, row.keep)
        if start != row.start:  # the next token would not fit in the window
            self._remove(index)
            if row.exact:
                self._recompute.append(row)
                return
            row.start = start  # refill: the last `keep` tokens, prefilled again
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
    def _sample(rows: list[_Row], logits: np.ndarray) -> tuple[np.ndarray, list]:
        """One token per row from `logits` (rows, V), each with its own settings and RNG (`sample_rows`), and for
        the rows that ask for them (`Request.logprobs`) the token's log-probability and the top ones, of the model's
        own distribution (the logits before penalties): `(logprob, [(id, logprob), ...])`, None for the others.
        A row whose logits are not all finite gets the token -1 (`_append` ends its request with an `EngineError`);
        the other rows are sampled as if it were not there."""
        ok = finite_rows(logits)
        if not ok.all():
            tokens = np.full(len(rows), -1, dtype=np.int64)
            kept = np.flatnonzero(ok)
            if len(kept):
                tokens[kept], kept_logprobs = Scheduler._sample([rows[i] for i in kept], logits[kept])
            logprobs = [None] * len(rows)
            for j, i in enumerate(kept):
                logprobs[i] = kept_logprobs[j]
            return tokens, logprobs
        adjusted = [i for i, r in enumerate(rows) if r.seen is not None or r.counts is not None]
        work = logits.copy() if adjusted else logits
        for i in adjusted:
            if rows[i].seen is not None:
                apply_repetition_penalty(work[i], rows[i].seen, rows[i].penalty)
            if rows[i].counts is not None:
                apply_openai_penalties(work[i], rows[i].counts, rows[i].sampling)
        tokens = sample_rows(work, [r.sampling for r in rows], [r.rng for r in rows])
        logprobs = [None] * len(rows)
        for i, row in enumerate(rows):
            if row.top_logprobs is not None:
                lp = log_softmax(logits[i])
                top = np.argsort(-lp, kind="stable")[: row.top_logprobs]
                logprobs[i] = (float(lp[tokens[i]]), [(int(t), float(lp[t])) for t in top])
        return tokens, logprobs

    def _append(self, row: _Row, token: int, logprob=None) -> bool:
        """Gives `row` its token (and its logprobs); returns True when the row ends here, finished or cancelled by
        its consumer meanwhile (its stream is then ended: the consumer sees the end either way). Token -1: the row's
        logits were not finite (`_sample`), and its request ends with an `EngineError` naming the backend."""
        if token < 0:
            row.stream._finish(
                EngineError(
                    f"{describe(self.backend)} computed NaN or infinite logits for token "
                    f"{len(row.ids) - row.prompt_len + 1} of this request: nothing to sample from, so it ends here (a "
                    f"broken model: check its weights and config)"
                )
            )
            return True
        row.ids.append(token)
        if row.seen is not None:
            row.seen[token] = True
        if row.counts is not None:
            row.counts[token] += 1
        self.tokens += 1
        row.stream._put(token, logprob)
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
