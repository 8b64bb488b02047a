"""A submitted request and the stream of its tokens: what a scheduler's consumers hold (`Scheduler.submit`)."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..window import DEFAULT_WINDOW_MODE
from .sampling import SamplingParams

if TYPE_CHECKING:
    from .scheduler import Scheduler


class ServerBusy(RuntimeError):
    """The scheduler's queue is full: the request was not accepted (HTTP APIs answer 429/503)."""


class EngineError(RuntimeError):
    """The model failed a request that was fine (its logits were NaN or infinite): the request ends with it, the
    other requests go on. The message names the backend; HTTP APIs answer it in their error format."""


@dataclass(frozen=True)
class Request:
    """What to generate: prompt ids (non-empty), how many tokens, how to sample, and the window past block_size."""

    prompt_ids: Sequence[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    window_mode: str = DEFAULT_WINDOW_MODE
    refill_tokens: int | None = None
    stop_token_ids: Sequence[int] = ()
    logprobs: int | None = None  # report each token's logprob and this many top ones (`Stream.logprobs`)


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
        self.admitted_at: float | None = None  # when the scheduler took it from the queue
        self.last_seen_at: float | None = None  # for a consumer that times the gaps between tokens (the API's metrics)
        self.generated = 0
        self.logprobs: list = []  # with `Request.logprobs`: (logprob, [(id, logprob), ...]) per token, in order
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
            self._scheduler._drive(self)  # a scheduler without a thread of its own steps here
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

    def _put(self, token: int, logprob=None) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if logprob is not None:
            self.logprobs.append(logprob)  # before the token: a consumer that has the token has its logprob
        self.generated += 1
        self._tokens.put(token)
        self._scheduler._to_wake.append(self)

    def _finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self._tokens.put(_DONE)
        self._ended.set()
        self._scheduler._to_wake.append(self)
