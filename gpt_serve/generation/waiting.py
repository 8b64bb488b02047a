"""What waits for a scheduler's loop (`WaitingQueue`): the requests submitted and not yet admitted, first in first
out, and the prompts to score (a `logprobs.ScoringQueue`), bounded together by `max_queue`. Other threads add, the
loop takes; one lock guards both queues and whether the scheduler is closed. numpy only.
"""

from __future__ import annotations

import threading
from collections import deque

from .backends.protocol import Backend
from .logprobs import ScoringQueue
from .requests import Scoring, ServerBusy, Stream

__all__ = ["WaitingQueue"]


class WaitingQueue:
    """Submitted streams (FIFO) and prompts to score (`scoring`), at most `max_queue` of them together."""

    def __init__(self, backend: Backend, max_queue: int, max_tokens_per_step: int):
        self.lock = threading.Lock()
        self.max_queue = max_queue
        self.closed = False  # once closed, nothing more is queued
        self.streams: deque[Stream] = deque()
        self.scoring = ScoringQueue(backend, max_tokens_per_step, self.lock)

    def add(self, item: Stream | Scoring) -> None:
        """Queues `item`: a RuntimeError once closed, `ServerBusy` when `max_queue` requests are waiting."""
        with self.lock:
            if self.closed:
                raise RuntimeError("the scheduler is closed")
            queued = len(self.streams) + len(self.scoring)
            if queued >= self.max_queue:
                raise ServerBusy(
                    f"server busy: {queued} requests are already waiting (the limit is {self.max_queue}); try again "
                    f"shortly"
                )
            if isinstance(item, Scoring):
                self.scoring.add(item)
            else:
                self.streams.append(item)

    def close(self) -> None:
        with self.lock:
            self.closed = True

    def is_closed(self) -> bool:
        with self.lock:
            return self.closed

    def counts(self) -> tuple[int, int]:
        """(streams waiting, prompts to score)."""
        with self.lock:
            return len(self.streams), len(self.scoring)

    def pop(self, room: int | None, block_size: int) -> Stream | None:
        """The next stream, if one waits and its first window (its prompt, at most `block_size` tokens) fits in `room`
        tokens (None: whatever its size)."""
        with self.lock:
            if not self.streams:
                return None
            if room is not None and min(len(self.streams[0].request.prompt_ids), block_size) > room:
                return None
            return self.streams.popleft()

    def remove_cancelled(self) -> list[Stream | Scoring]:
        """Takes out what its consumer cancelled; returns it."""
        if not self.streams and not self.scoring:  # read without the lock: looked at again next iteration
            return []
        with self.lock:
            cancelled = [s for s in self.streams if s.cancelled.is_set()]
            for stream in cancelled:
                self.streams.remove(stream)
            return [*cancelled, *self.scoring.remove_cancelled()]

    def clear(self) -> list[Stream | Scoring]:
        """Takes out everything; returns it."""
        with self.lock:
            items = [*self.streams, *self.scoring.clear()]
            self.streams.clear()
            return items
