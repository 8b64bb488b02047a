"""Continuous batching: one decode loop runs every active request of a loaded model as one batch. It is the one
token loop of this package: a server's requests, the demo's and a script's single prompt (`generate_tokens`) all
run on it.

    scheduler = Scheduler(load_backend("shakespeare", "onnx-int8").backend, max_batch=16)
    stream = scheduler.submit(Request(prompt_ids, 200, SamplingParams(0.8), seed=1))
    for token in stream:        # ids, as the loop makes them (closing or `cancel()` frees the row)
        ...
    scheduler.close()

Between two decode steps, waiting requests are prefilled and join the batch and finished ones leave it, within a
budget of forward work per iteration shared by the decode step, the prefills and prompt scoring; the `n` choices of
a prompt share one prefill (`DecodeBatch.fork`); a row that has had its share while others wait is preempted and
later rejoins with exactly the tokens it would have made; a request's failure is its own; its tokens depend only on
its own seed, settings and window. docs/serving.md ("Many streams at once") explains each rule and its knobs.

It decides who runs; what runs is below it: the running batch and the exact-mode rows (`batch`), the queue
(`waiting`), the scoring chunks (`logprobs.ScoringQueue`), the output side of a step (`rows.next_tokens`), and the
thread it runs on (`runner`; an `InlineRunner` steps it on the thread that reads its streams).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from ..chargpt.window import window_keep, window_start
from .backends.interface import Backend, describe_backend
from .batch import FullWindowRows, RunningBatch
from .fields import check_value
from .requests import EngineError, Request, Scoring, Stream, check_prompt_ids, check_request, wake_waiters
from .rows import Outcome, Row, next_tokens
from .runner import InlineRunner, Runner
from .waiting import WaitingQueue

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_BATCH", "DEFAULT_MAX_QUEUE", "DEFAULT_PREEMPT_AFTER", "MAX_SCORING_TOKENS_PER_STEP",
    "MAX_TOKENS_PER_STEP", "Scheduler",
]  # fmt: skip

DEFAULT_MAX_BATCH = 16  # rows decoding together, every surface's default (`gpt-serve serve --max-batch`)
DEFAULT_MAX_QUEUE = 256  # requests waiting for a row before the next is refused (a 429)
MAX_TOKENS_PER_STEP = 4096  # the default budget of one iteration's forward work (see the module docstring)
MAX_SCORING_TOKENS_PER_STEP = 512  # scoring's share of it while rows decode or requests wait
DEFAULT_PREEMPT_AFTER = 64  # tokens a row makes before it yields its row to a waiting request (`--preempt-after`)


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
        max_scoring_tokens_per_step: scoring's share of that budget while rows decode or requests wait.
        preempt_after: the tokens a row makes, once it joined, before it yields its row to a waiting request
            (None: rows are never preempted; see the module docstring).
        share_prompts: rows admitted together whose windows are the same prefill once and fork (see the module
            docstring); False prefills each (what `benchmarks/serving.py --unshared` compares with).
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
        max_scoring_tokens_per_step: int = MAX_SCORING_TOKENS_PER_STEP,
        preempt_after: int | None = DEFAULT_PREEMPT_AFTER,
        share_prompts: bool = True,
    ):
        bounds = [("max_batch", max_batch), ("max_queue", max_queue), ("max_tokens", max_tokens_per_step)]
        bounds += [("max_scoring_tokens_per_step", max_scoring_tokens_per_step)]
        for name, value in bounds + ([("preempt_after", preempt_after)] if preempt_after is not None else []):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.backend = backend
        self.name = describe_backend(backend)
        self.max_batch, self.max_queue = max_batch, max_queue
        self.max_prefills_per_step, self.max_recompute_per_step = max_prefills_per_step, max_recompute_per_step
        self.max_tokens_per_step, self.preempt_after = max_tokens_per_step, preempt_after
        self.share_prompts = share_prompts
        self.scoring_share = min(max_scoring_tokens_per_step, max_tokens_per_step)
        self.preemptions = 0  # rows preempted so far
        self._queue = WaitingQueue(backend, max_queue, self.scoring_share)
        self._stopped = threading.Event()
        # Made on the runner's thread, the one thread that runs the backend (see `Runner`).
        self._batch: RunningBatch | None = None
        self._recompute = FullWindowRows(backend, max_recompute_per_step)  # exact-mode rows past their window
        self.steps = 0  # forward passes run (decode steps, prefills, full-window recomputes, scoring chunks)
        self.tokens = 0
        self._published = dict(active=0, waiting=0, scoring=0, preempted=0, steps=0, tokens=0)  # set by `_publish`
        self._to_wake: list = []  # streams and scorings given something since the last `wake_waiters`
        self._owns_runner = runner is None
        self._runner = runner or Runner()
        try:
            self._batch = self._runner.call(RunningBatch, self.backend, self.max_batch)  # on the runner's thread
        except BaseException:
            if self._owns_runner:
                self._runner.stop()
            raise
        self._runner.add(self)

    # -- the public side --

    def submit(self, request: Request) -> Stream:
        """Queues `request`; returns its `Stream`. Raises ValueError for a bad request, `ServerBusy` when full."""
        check_request(request, self.backend.block_size, self.backend.vocab_size)
        stream = Stream(request, self)
        self._queue.add(stream)
        self._runner.wake()
        return stream

    def score(self, ids: Sequence[int], top_n: int) -> Scoring:
        """Queues the scoring of a prompt's own tokens (`logprobs.prompt_logprobs`, with the `top_n` most likely
        beside each); returns its `Scoring`. ValueError for bad ids or `top_n`, `ServerBusy` when full."""
        check_prompt_ids(ids, self.backend.vocab_size)
        check_value("logprobs", top_n)
        scoring = Scoring(ids, top_n, self)
        self._queue.add(scoring)
        self._runner.wake()
        return scoring

    @contextmanager
    def together(self) -> Iterator[None]:
        """Requests submitted inside the block are admitted together, none before the block ends: the `n` choices of
        a prompt, which then prefill it once and fork its cache (see the module docstring). Keep the block short:
        nothing is admitted while it is open."""
        self._queue.hold(True)
        try:
            yield
        finally:
            self._queue.hold(False)
            self._runner.wake()

    def call(self, function, *args):
        """Runs `function(*args)` on the loop's thread, between two decode steps, and returns its result (or raises
        its error). For other work on the same model (the demo's attention maps), so that one thread runs the
        backend: see `Runner`."""
        if self.closed:
            raise RuntimeError("the scheduler is closed")
        return self._runner.call(function, *args)

    def stats(self) -> dict[str, int]:
        """The loop's counts as its last iteration left them: rows decoding and prompts being scored (`active`),
        requests, preempted rows and prompts to score not begun (`waiting`), prompts to score in all (`scoring`),
        rows preempted so far, forward passes run and tokens made. One consistent reading, never one taken halfway
        through an iteration (where a row that refills its window is out of the batch, or an admitted request is
        neither queued nor running yet): `active` and `waiting` both 0 means the loop has nothing left to run."""
        return dict(self._published)

    def close(self) -> None:
        """Stops the loop; requests still running or waiting end with an error."""
        self._queue.close()
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
        return self._queue.is_closed()

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
            preempted = self._preempt()
            self._queue.reserve(len(preempted))  # their places, before admissions free the waiting requests'
            try:
                budget = self.max_tokens_per_step - len(self._batch)  # what the decode step leaves for the rest
                budget -= self._admit(budget)
            finally:
                for row in preempted:  # queued once their rows are taken: the queue never holds more than before
                    self._queue.requeue(row)
            self._recompute_some()
            self._publish()  # a consistent reading (the admitted rows run), before their readers wake
            self._wake_async()  # the first tokens of the rows just admitted go out now, not after the scoring
            self._score(budget)
            if ready is None or not ready():
                self._decode()
        except Exception as e:  # a broken backend: the running requests end with the error, the loop goes on
            logger.exception("decode step failed")
            self._fail_all(e)
        self._publish()
        self._wake_async()
        return bool(self._batch.rows or self._recompute or any(self._queue.counts()[:2]))

    def shutdown(self, error: BaseException | None = None) -> None:
        """Ends what is running or waiting (on the runner's thread): once closed, or with `error` when the loop itself
        failed (the scheduler is closed then)."""
        self._queue.close()
        self._fail_all(error or RuntimeError("the scheduler was closed"), waiting=True, fresh_batch=False)
        self._publish()
        self._wake_async()
        self._stopped.set()

    # -- the loop --

    def _end(self, item: Stream | Scoring, error: BaseException | None = None) -> None:
        item.finish(error)
        self._to_wake.append(item)

    def _fail(self, row: Row, error: BaseException) -> None:
        self._end(row.stream, error)

    def _publish(self) -> None:
        """Sets what `stats` reads (on the runner's thread, between two iterations), as one new dict."""
        waiting, scoring, begun = self._queue.counts()
        self._published = dict(
            active=len(self._batch) + len(self._recompute) + begun,
            waiting=waiting + scoring - begun,
            scoring=scoring,
            preempted=self.preemptions,
            steps=self.steps,
            tokens=self.tokens,
        )

    def _wake_async(self) -> None:
        """Wakes the async waiters of the streams and scorings given something since the last call."""
        wake_waiters(self._to_wake)
        self._to_wake.clear()

    def _drop_cancelled(self) -> None:
        for row in [*self._batch.remove_cancelled(), *self._recompute.remove_cancelled()]:
            self._end(row.stream)
        for item in self._queue.remove_cancelled():
            self._end(item)

    def _preempt(self) -> list[Row]:
        """While requests wait and no row is free: the rows that have made `preempt_after` tokens since they joined
        (longest turn first, one per waiting request) leave the batch; returns them, for the end of the queue (see
        the module docstring)."""
        if self.preempt_after is None:
            return []
        short = self._queue.counts()[0] - (self.max_batch - len(self._batch) - len(self._recompute))
        if short <= 0:
            return []
        due = [(row.turn, i) for i, row in enumerate(self._batch.rows) if row.turn >= self.preempt_after]
        out = []
        for _, i in sorted(sorted(due, reverse=True)[:short], key=lambda pair: -pair[1]):  # last index first
            out.append(self._batch.rows[i])
            self._batch.remove(i)  # (the last row moves into i: no index still to remove is above it)
        for row in [row for row in self._recompute.rows if row.turn >= self.preempt_after][: short - len(out)]:
            self._recompute.rows.remove(row)
            out.append(row)
        for row in out:
            row.turn = 0
        self.preemptions += len(out)
        return out

    def _admit(self, budget: int) -> int:
        """Prefills waiting requests and preempted rows within `budget` tokens (at least one, if a row is free),
        those whose windows have the same length together, and those whose windows are the same (the `n` choices of
        a prompt) once, forked (`RunningBatch.join`); returns the tokens prefilled."""
        free = self.max_batch - len(self._batch) - len(self._recompute)
        limit = free if self.max_prefills_per_step is None else min(free, self.max_prefills_per_step)
        groups: dict[int, list[Row]] = {}
        windows: set[tuple[int, ...]] = set()  # a window prefilled once, whatever the rows that share it
        used = taken = 0
        while taken < limit:
            item = self._queue.pop(
                budget - used if taken else None, self.backend.block_size, lambda head: self._window(head) in windows
            )
            if item is None:
                break
            taken += 1
            row = item if isinstance(item, Row) else self._start(item)
            if row is None:
                continue
            if len(row.ids) - row.start > self.backend.block_size or (row.exact and row.start > 0):
                self._recompute.rows.append(row)  # exact mode, a prompt past the window: full-window forwards from now
                continue
            window = self._window(row)
            used += 0 if window in windows else len(window)  # the `n` choices of a prompt fork one prefill
            if self.share_prompts:
                windows.add(window)
            groups.setdefault(len(row.ids) - row.start, []).append(row)
        for rows in groups.values():
            self._prefill(rows)
        return used

    def _window(self, item: Stream | Row) -> tuple[int, ...]:
        """The window a waiting stream or preempted row would prefill (a stream's as its `Row` makes it)."""
        if isinstance(item, Row):
            return tuple(item.window())
        r, block = item.request, self.backend.block_size
        start = window_start(len(r.prompt_ids), 0, block, window_keep(block, r.window_mode, r.refill_tokens))
        return tuple(int(t) for t in r.prompt_ids[start:])

    def _start(self, stream: Stream) -> Row | None:
        """A new request's row (None: its own state could not be made, and it ended with the error)."""
        stream.admitted_at = time.perf_counter()
        try:
            return Row(stream, self.backend.block_size, self.backend.vocab_size)
        except Exception as e:
            self._end(stream, EngineError(f"the request could not start: {type(e).__name__}: {e}"))
            return None

    def _prefill(self, rows: list[Row]) -> None:
        """Prefills `rows` (windows of one length) as new rows of the batch, in one forward pass (or, if that fails,
        each alone: a row whose own prefill fails ends with its error), and gives each its first token."""
        first = len(self._batch)
        rows, logits, forwards = self._batch.join(rows, self._fail, self.share_prompts)
        self.steps += forwards
        if rows:
            self._apply(rows, logits, first)

    def _apply(self, rows: list[Row], logits: np.ndarray, first: int) -> None:
        """Samples the next token of `rows` (batch rows `first`, `first + 1`, ...) from `logits` (rows, V), then
        moves each on (`_advance`), last row first: a row that leaves is replaced by the last row (done already),
        and a row that rejoins goes last."""
        out = next_tokens(rows, logits, self.name)
        for i in reversed(range(len(rows))):
            self._advance(rows[i], first + i, *self._deliver(rows[i], out, i))

    def _advance(self, row: Row, index: int, ends: bool, error: BaseException | None) -> None:
        """Moves `row` (batch row `index`) on after its token (`_deliver`): ended (with `error`, or finished), to its
        next window, or on in the batch (where the token is fed at the next step)."""
        block = self.backend.block_size
        slide = not ends and len(row.ids) - row.start > block  # the next token would not fit
        if ends or slide:
            self._batch.remove(index)
        if error is not None:
            self._end(row.stream, error)
        elif slide:
            if row.exact:
                self._recompute.rows.append(row)
                return
            row.start = window_start(len(row.ids), row.start, block, row.keep)  # refill: the last `keep` tokens
            self._prefill([row])

    def _deliver(self, row: Row, out: Outcome, i: int) -> tuple[bool, BaseException | None]:
        """Gives `row`'s stream its token of `out` (row `i`). Returns whether the request ends here, and its error:
        `out`'s, or that of its own bookkeeping (the caller ends it then), or None where it finished or its consumer
        cancelled it meanwhile (its stream is then ended: the consumer sees the end either way)."""
        error = out.errors.get(i)
        if error is not None:
            return True, error
        try:
            token = int(out.tokens[i])
            complete = row.accept(token)
            self.tokens += 1
            row.stream.put(token, out.logprobs[i])
        except Exception as e:  # this row's own bookkeeping
            logger.exception("a row's output failed")
            return True, EngineError(f"the output of this request failed: {type(e).__name__}: {e}")
        self._to_wake.append(row.stream)
        ends = complete or row.stream.cancelled.is_set()
        if ends:
            self._end(row.stream)
        return ends, None

    def _recompute_some(self) -> None:
        """Advances up to `max_recompute_per_step` exact-mode rows past their window by one token each (in one
        forward pass, or, if that fails, each alone: a row whose own forward fails ends with its error)."""
        if not self._recompute:
            return
        rows, logits, forwards = self._recompute.forward(self._fail)
        self.steps += forwards
        if not rows:
            return
        out = next_tokens(rows, logits, self.name)
        for i, row in enumerate(rows):
            ends, error = self._deliver(row, out, i)
            if error is not None:
                self._end(row.stream, error)
            elif not ends:
                self._recompute.rows.append(row)

    def _score(self, budget: int) -> None:
        """Runs chunks of the queued scorings, in turn, within `budget` tokens (at least one chunk), or within their
        share (`scoring_share`) while rows decode or requests wait. A request that arrives meanwhile ends the run
        after the chunk at hand, so it waits for one chunk, not for the whole budget."""
        if not self._queue.scoring:
            return
        if self._batch.rows or self._recompute or self._queue.counts()[0]:
            budget = min(budget, self.scoring_share)
        forwards, ended = self._queue.scoring.run(budget, self._queue.has_streams)
        self.steps += forwards
        for scoring, error in ended:
            self._end(scoring, error)

    def _decode(self) -> None:
        if not self._batch.rows:
            return
        rows = list(self._batch.rows)
        tokens = np.fromiter((r.ids[-1] for r in rows), dtype=np.int64, count=len(rows))
        logits = self._batch.step(tokens)
        self.steps += 1
        self._apply(rows, logits, 0)

    def _fail_all(self, error: BaseException, waiting: bool = False, fresh_batch: bool = True) -> None:
        """Ends every running request (and, with `waiting`, every queued one and every scoring) with `error`; then,
        with `fresh_batch`, a new empty batch for the next requests."""
        running = [*self._batch.rows, *self._recompute.rows]
        self._batch.rows = []  # that batch is not used again
        self._recompute.rows.clear()
        queued = self._queue.clear() if waiting else []
        for item in [r.stream for r in running] + queued:
            self._end(item, error)
        if fresh_batch:
            self._batch = RunningBatch(self.backend, self.max_batch)
