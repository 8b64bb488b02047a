"""Log-probabilities of a prompt's own tokens (OpenAI's `echo` with `logprobs`): what evaluation harnesses score a
model with. numpy only; the backend computes the logits (`Backend.sequence_logits`, `window_logits`).

Token `i` of the prompt is scored by the model's distribution after the tokens before it, read the way generation
reads them (`gpt_serve.chargpt.window`, the lesson's exact window): the first `block_size` tokens by one forward pass
over
them, each later one by the window of the `block_size` tokens before it. The first token has no logprob (null, as
OpenAI answers).

A scheduler scores prompts in chunks between its decode steps, so that a long prompt shares the machine: its
`ScoringQueue` holds them and runs their chunks in turn within each iteration's budget.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from .backends.interface import Backend, describe_backend
from .requests import EngineError, Scoring
from .sampling import log_softmax
from .token_logprobs import TokenLogprobs

logger = logging.getLogger(__name__)

WINDOWS_PER_CALL = 32  # full windows scored together past block_size


def add_entries(out: TokenLogprobs, lps: np.ndarray, tokens: Sequence[int]) -> None:
    """The entries of `tokens` (k,) read from their positions' log-probabilities `lps` (k, V): each token's logprob
    and the `out.top_n` most likely."""
    lps = np.atleast_2d(lps)
    top = np.argsort(-lps, axis=-1, kind="stable")[:, : out.top_n]  # (k, top_n)
    rows = np.arange(len(lps))
    out.extend(lps[rows, np.asarray(tokens, dtype=np.int64)], top, np.take_along_axis(lps, top, axis=-1))


def prompt_logprobs(backend, ids: Sequence[int], top_n: int) -> TokenLogprobs:
    """One entry per prompt token: None for the first, else (logprob, top) (see the module docstring)."""
    out = TokenLogprobs(top_n)
    for _ in scoring_chunks(backend, ids, top_n, out):
        pass
    return out


def scoring_chunks(
    backend, ids: Sequence[int], top_n: int, out: TokenLogprobs, windows: int = WINDOWS_PER_CALL
) -> Iterator[int]:
    """`prompt_logprobs` in chunks: each `next()` runs one forward pass (the first window's, or up to `windows`
    later windows together), appends its entries to `out`, and yields how many tokens that forward read. What the
    scheduler runs between decode steps (`Scheduler.score`), so that scoring a long prompt shares the machine."""
    ids = [int(t) for t in ids]
    block = backend.block_size
    out.append_none()
    first = ids[:block]
    if len(first) > 1:
        lps = log_softmax(backend.sequence_logits(np.asarray(first, dtype=np.int64)))  # (T, V)
        add_entries(out, lps[:-1], first[1:])
        yield len(first)
    later = list(range(block, len(ids)))  # token i read after the window ids[i - block : i]
    for start in range(0, len(later), windows):
        chunk = later[start : start + windows]
        batch = np.asarray([ids[i - block : i] for i in chunk], dtype=np.int64)  # (k, block)
        lps = log_softmax(backend.window_logits(batch))
        add_entries(out, lps, [ids[i] for i in chunk])
        yield batch.size


class ScoringQueue:
    """The prompts a scheduler scores (`Scheduler.score`): each a `Scoring` and its chunks (`scoring_chunks`), run in
    turn, one chunk at a time. Other threads add scorings under `lock` (the scheduler's, which guards its queue of
    requests too); `add`, `remove_cancelled` and `clear` are called under it."""

    def __init__(self, backend: Backend, chunk_tokens: int, lock: threading.Lock):
        # a chunk: this many full windows in one forward pass (at most `chunk_tokens`, but at least one window)
        self.windows = max(1, min(WINDOWS_PER_CALL, chunk_tokens // backend.block_size))
        self.chunk_tokens = self.windows * backend.block_size
        self.backend, self.lock = backend, lock
        self.name = describe_backend(backend)
        self.scorings: deque[tuple[Scoring, Iterator[int]]] = deque()

    def __len__(self) -> int:
        return len(self.scorings)

    def started(self) -> int:
        """How many of the scorings have run a chunk already (the rest have not begun)."""
        return sum(1 for scoring, _ in self.scorings if scoring.entries)

    def add(self, scoring: Scoring) -> None:
        self.scorings.append(
            (scoring, scoring_chunks(self.backend, scoring.ids, scoring.top_n, scoring.entries, self.windows))
        )

    def remove_cancelled(self) -> list[Scoring]:
        """Takes the cancelled scorings out of the queue; returns them."""
        gone = [pair for pair in self.scorings if pair[0].cancelled.is_set()]
        for pair in gone:
            self.scorings.remove(pair)
        return [scoring for scoring, _ in gone]

    def clear(self) -> list[Scoring]:
        """Takes every scoring out of the queue; returns them."""
        scorings = [scoring for scoring, _ in self.scorings]
        self.scorings.clear()
        return scorings

    def run(
        self, budget: int, interrupted: Callable[[], bool] = lambda: False
    ) -> tuple[int, list[tuple[Scoring, BaseException | None]]]:
        """Runs chunks of the queued scorings, in turn, within `budget` tokens (at least one chunk), and no further
        chunk once `interrupted()` (asked between chunks) is true. Returns the forward passes run and the scorings
        that ended, each with its error (a failure is the prompt's own) or None."""
        forwards = spent = 0
        ended: list[tuple[Scoring, BaseException | None]] = []
        while self.scorings and (spent == 0 or (spent + self.chunk_tokens <= budget and not interrupted())):
            scoring, chunks = self.scorings[0]
            try:
                spent += next(chunks)
                forwards += 1
                self.scorings.rotate(-1)  # the next scoring's chunk next
                continue
            except StopIteration:
                error = None
            except Exception as e:  # this prompt's own failure
                logger.exception("scoring failed")
                error = EngineError(f"{self.name} failed to score this prompt: {type(e).__name__}: {e}")
            with self.lock:
                self.scorings.popleft()
            ended.append((scoring, error))
        return forwards, ended
