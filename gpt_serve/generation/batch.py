"""The rows a scheduler runs and the forward passes that give them logits: the decode batch with the `Row` of each
of its rows (`RunningBatch`), and the exact-mode rows past their window, a full window per token (`FullWindowRows`).

A pass other than the decode step (a new row's prefill, a full window) runs each row inside its own error boundary:
all rows together in one pass or, if that fails, each alone, so that a row whose own forward fails ends with its
error and the others go on (the output side of a step is `rows.next_tokens`). numpy only; the backend runs the passes.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from itertools import islice

import numpy as np

from .backends.interface import Backend
from .requests import EngineError
from .rows import Row

logger = logging.getLogger(__name__)

__all__ = ["Fail", "Forwarded", "FullWindowRows", "RunningBatch"]

Fail = Callable[[Row, EngineError], None]  # ends a row's request with its error (the scheduler's)
Forwarded = tuple[list[Row], np.ndarray, int]  # the rows that got logits, their logits (rows, V), the passes run


class RunningBatch:
    """The rows decoding together: a backend's `DecodeBatch` (`backend.new_batch`) and the `Row` of each of its rows
    (`rows[i]` is batch row i). Rows join last; a row that leaves is replaced by the last one, in both."""

    def __init__(self, backend: Backend, max_rows: int):
        self.batch = backend.new_batch(max_rows)
        self.rows: list[Row] = []
        self.step = self.batch.step  # the decode step: one token per row (rows,) in, logits (rows, V) out

    def __len__(self) -> int:
        return len(self.rows)

    def join(self, rows: list[Row], fail: Fail, share: bool = True) -> Forwarded:
        """Prefills `rows` (windows of one length) as new last rows, in one forward pass (or each alone). Rows whose
        windows are the same (the `n` choices of a prompt) share one prefill: the first of them is prefilled, the
        others fork its KV cache (`DecodeBatch.fork`) and take its logits, and fail with its error if it fails.
        Returns the rows that joined (in their batch order: the prefilled ones, then the forks), their logits and
        the forward passes run. With `share` False, every row is prefilled."""
        first_of: dict[tuple[int, ...], int] = {}  # a window's first row in `unique`
        unique: list[Row] = []
        forks: list[tuple[Row, int]] = []  # a row and the index in `unique` of the row it copies
        for row in rows:
            key = tuple(row.window()) if share else (id(row),)
            if key in first_of:
                forks.append((row, first_of[key]))
            else:
                first_of[key] = len(unique)
                unique.append(row)
        first = len(self.batch)
        try:
            joined, logits, forwards = unique, self.batch.add_rows([row.window() for row in unique]), 1
        except Exception:
            if len(self.batch) != first:  # a batch left half-changed: nothing else can be trusted
                raise
            joined, logits, forwards, forks = self._each_alone(unique, forks, fail)
        self.rows += joined
        if forks:
            logits = self._fork(joined, logits, forks, first, fail)
        return self.rows[first:], logits, forwards

    def _each_alone(self, unique: list[Row], forks: list[tuple[Row, int]], fail: Fail):
        """`unique` prefilled each alone; a row whose prefill fails ends with its error, and so do its `forks`.
        Returns the rows prefilled, their logits, the passes run and the forks of those rows (indices into them)."""
        errors: dict[int, EngineError] = {}

        def failed(row: Row, error: EngineError) -> None:
            errors[id(row)] = error
            fail(row, error)

        joined, logits, forwards = _each_alone(unique, lambda row: self.batch.add(row.window()), "the prefill", failed)
        at = {id(row): i for i, row in enumerate(joined)}
        kept = []
        for row, source in forks:
            source = unique[source]
            if id(source) in at:
                kept.append((row, at[id(source)]))
            else:
                fail(row, EngineError(str(errors[id(source)])))  # the same message, an error of its own
        return joined, logits, forwards, kept

    def _fork(self, joined: list[Row], logits: np.ndarray, forks: list[tuple[Row, int]], first: int, fail: Fail):
        """Adds `forks` (each a row and the index in `joined`, batch row `first + index`, of the row it copies) as
        copies after `joined`; returns the logits of `joined` and the forks. If the fork fails, the copies end with
        its error and the rows prefilled go on."""
        try:
            self.batch.fork([first + source for _, source in forks])
        except Exception as e:
            if len(self.batch) != first + len(joined):
                raise
            logger.exception("the fork of a prefilled prompt failed")
            for row, _ in forks:
                fail(row, EngineError(f"the prefill failed for this request: the fork of its prompt's cache: {e}"))
            return logits
        self.rows += [row for row, _ in forks]
        return np.concatenate([logits, logits[[source for _, source in forks]]])

    def remove(self, index: int) -> None:
        """Takes row `index` out; the last row moves into its place."""
        self.batch.remove(index)
        last = self.rows.pop()
        if index < len(self.rows):
            self.rows[index] = last

    def remove_cancelled(self) -> list[Row]:
        """Takes out the rows whose consumer cancelled; returns them."""
        gone = []
        for i in reversed(range(len(self.rows))):
            if self.rows[i].stream.cancelled.is_set():
                gone.append(self.rows[i])
                self.remove(i)
        return gone


class FullWindowRows:
    """Exact-mode rows past their window, outside the batch: each token of theirs is a full-window forward without a
    cache (`backend.window_logits`), for up to `per_step` rows per iteration, in turn."""

    def __init__(self, backend: Backend, per_step: int):
        self.backend, self.per_step = backend, per_step
        self.rows: deque[Row] = deque()

    def __len__(self) -> int:
        return len(self.rows)

    def forward(self, fail: Fail) -> Forwarded:
        """The logits after the next rows' last `block_size` tokens, in one forward pass (or each alone). The rows
        leave the queue once their forward is done (until then, `len` counts them)."""
        rows, block = list(islice(self.rows, self.per_step)), self.backend.block_size
        try:
            out = rows, self.backend.window_logits(np.array([row.ids[-block:] for row in rows], dtype=np.int64)), 1
        except Exception:
            alone = lambda row: self.backend.window_logits(np.array([row.ids[-block:]], dtype=np.int64))[0]  # noqa: E731
            out = _each_alone(rows, alone, "the full-window forward", fail)
        for _ in rows:
            self.rows.popleft()
        return out

    def remove_cancelled(self) -> list[Row]:
        """Takes out the rows whose consumer cancelled; returns them."""
        gone = [row for row in self.rows if row.stream.cancelled.is_set()]
        for row in gone:
            self.rows.remove(row)
        return gone


def _each_alone(rows: list[Row], forward: Callable[[Row], np.ndarray], what: str, fail: Fail) -> Forwarded:
    kept, out = [], []
    for row in rows:
        try:
            out.append(forward(row))
        except Exception as e:
            logger.exception("%s failed", what)
            fail(row, EngineError(f"{what} failed for this request: {e}"))
            continue
        kept.append(row)
    return kept, np.stack(out) if out else np.zeros((0, 0), dtype=np.float32), len(kept)
