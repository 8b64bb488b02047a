"""What waits for a scheduler's loop (`WaitingQueue`): the requests submitted and not yet admitted and the rows it
preempted (`requeue`), first in first out, and the prompts to score (a `logprobs.ScoringQueue`), bounded together
by `max_queue` (a preempted row takes the place of the request that took its row, so preemption never grows the
queue). Other threads add, the loop takes; one lock guards both queues and whether the scheduler is closed. numpy
only.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from .backends.interface import Backend
from .logprobs import ScoringQueue
from .requests import SchedulerClosed, Scoring, ServerBusy, Stream
from .rows import Row

__all__ = ["WaitingQueue"]


class WaitingQueue:
    """Submitted streams and preempted rows (FIFO) and prompts to score (`scoring`), at most `max_queue` of them
    together."""

    def __init__(self, backend: Backend, max_queue: int, scoring_chunk_tokens: int):
        self.lock = threading.Lock()
        self.max_queue = max_queue
        self.closed = False  # once closed, nothing more is queued
        self.reserved = 0  # places held for rows preempted this iteration, until `requeue` queues them
        self.streams: deque[Stream | Row] = deque()
        self.held = 0  # `hold`s open: nothing is admitted meanwhile
        self.scoring = ScoringQueue(backend, scoring_chunk_tokens, self.lock)

    def add(self, item: Stream | Scoring) -> None:
        """Queues `item`: `SchedulerClosed` once closed, `ServerBusy` when `max_queue` requests are waiting."""
        with self.lock:
            if self.closed:
                raise SchedulerClosed("the scheduler is closed")
            queued = len(self.streams) + len(self.scoring) + self.reserved
            if queued >= self.max_queue:
                raise ServerBusy(
                    f"server busy: {queued} requests are already waiting (the limit is {self.max_queue}); try again "
                    f"shortly"
                )
            if isinstance(item, Scoring):
                self.scoring.add(item)
            else:
                self.streams.append(item)

    def hold(self, held: bool) -> None:
        """While one or more holds are open (`held` True opens one, False closes it), `pop` gives nothing: the
        choices of one request are queued as a whole, and admitted together (so that they share their prompt's
        prefill)."""
        with self.lock:
            self.held += 1 if held else -1

    def reserve(self, n: int) -> None:
        """Holds `n` places for rows being preempted: while the requests they make room for leave the queue, no new
        request takes those places (`add` counts them), so the queue never holds more than `max_queue`."""
        with self.lock:
            self.reserved += n

    def requeue(self, row: Row) -> None:
        """A preempted row, last in line (it rejoins when its turn comes, as a request does), in a place `reserve`
        held."""
        with self.lock:
            self.reserved -= 1
            self.streams.append(row)

    def close(self) -> None:
        with self.lock:
            self.closed = True

    def is_closed(self) -> bool:
        with self.lock:
            return self.closed

    def has_streams(self) -> bool:
        """Whether a stream or a preempted row waits (read without the lock: a deque's length is one atomic read)."""
        return bool(self.streams)

    def counts(self) -> tuple[int, int, int]:
        """(streams and preempted rows waiting, prompts to score, those of them begun)."""
        with self.lock:
            return len(self.streams), len(self.scoring), self.scoring.started()

    def pop(self, room: int | None, block_size: int, free: Callable[[Stream | Row], bool] | None = None):
        """The next stream or preempted row, if one waits and its window (a stream's prompt, at most `block_size`
        tokens) fits in `room` tokens (None: whatever its size), or costs nothing (`free(item)`: its window is one
        prefilled already, that it forks)."""
        with self.lock:
            if not self.streams or self.held:
                return None
            head = self.streams[0]
            size = len(head.ids) - head.start if isinstance(head, Row) else len(head.request.prompt_ids)
            if room is not None and min(size, block_size) > room and not (free is not None and free(head)):
                return None
            return self.streams.popleft()

    def remove_cancelled(self) -> list[Stream | Scoring]:
        """Takes out what its consumer cancelled; returns it (a preempted row as its stream)."""
        if not self.streams and not self.scoring:  # read without the lock: looked at again next iteration
            return []
        with self.lock:
            cancelled = [s for s in self.streams if _stream(s).cancelled.is_set()]
            for item in cancelled:
                self.streams.remove(item)
            return [*map(_stream, cancelled), *self.scoring.remove_cancelled()]

    def clear(self) -> list[Stream | Scoring]:
        """Takes out everything; returns it (a preempted row as its stream)."""
        with self.lock:
            items = [*map(_stream, self.streams), *self.scoring.clear()]
            self.streams.clear()
            return items


def _stream(item: Stream | Row) -> Stream:
    return item.stream if isinstance(item, Row) else item
