"""A submitted request and the stream of its tokens: what a scheduler's consumers hold (`Scheduler.submit`), and the
checks of a request (`check_request`, `check_prompt_ids`).

A `Stream` meets its scheduler at two small public sides: the consumer's (`take`, `atake`, `wait`, `cancel`,
iteration) and the scheduler's (`put`, `finish`, `ready`, `waiter`). It knows its scheduler only as a `StreamOwner`:
something to wake when a consumer cancels, and to drive when the loop runs on the consumer's thread."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol

from ..chargpt.window import DEFAULT_WINDOW_MODE, WINDOW_MODES, window_keep
from .backends.interface import check_token_ids
from .fields import RequestError, check_engine_value
from .sampling import SamplingParams
from .token_logprobs import TokenLogprobs

if TYPE_CHECKING:
    from .spec import GenerationRequest


class StreamOwner(Protocol):
    """What a `Stream` asks of the scheduler that runs it."""

    def wake(self) -> None:
        """Something changed that the loop must see (a consumer cancelled)."""

    def drive(self, stream: Stream) -> None:
        """Steps the loop on this thread until `stream` is `ready` (a no-op for a loop on a thread of its own)."""


class ServerBusy(RuntimeError):
    """The scheduler's queue is full: the request was not accepted (HTTP APIs answer 429/503)."""


class SchedulerClosed(RuntimeError):
    """The scheduler is closed (its server is shutting down): nothing more is queued (HTTP APIs answer 503)."""


class EngineError(RuntimeError):
    """The model failed a request that was fine (its logits were NaN or infinite): the request ends with it, the
    other requests go on. The message names the backend; HTTP APIs answer it in their error format."""


@dataclass(frozen=True)
class Request:
    """What to generate: prompt ids (non-empty), how many tokens, how to sample, and the window past block_size.

    A surface's checked `GenerationRequest` becomes one with `Request.of`; a library caller builds one directly,
    `Request(prompt_ids, 200, SamplingParams(0.8), seed=1)`."""

    prompt_ids: Sequence[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    window_mode: str = DEFAULT_WINDOW_MODE
    refill_tokens: int | None = None
    stop_token_ids: Sequence[int] = ()
    logprobs: int | None = None  # report each token's logprob and this many top ones (`Stream.logprobs`)
    # structured outputs: the automaton the text must follow (`constraints.CharAutomaton`), and (id, bias) pairs
    # added to the logits (OpenAI's logit_bias)
    constraint: Any = None
    logit_bias: Sequence[tuple[int, float]] = ()

    @classmethod
    def of(cls, spec: GenerationRequest, prompt_ids: Sequence[int], **own: Any) -> Request:
        """The request of the checked `spec` for one prompt: every field this class shares by name with `spec` is
        `spec`'s, held as it is (its `sampling` too), so a field added to both reaches the row with nothing else
        to write; `own` are what `spec` does not say (`seed` of this choice, `constraint` compiled for this
        vocabulary, `stop_token_ids`) or says otherwise (`logprobs` a ranking needs)."""
        names = {f.name for f in fields(cls)}
        shared = {f.name: getattr(spec, f.name) for f in fields(spec) if f.name in names}
        return cls(prompt_ids, **{**shared, **own})


def check_prompt_ids(ids: Sequence[int], vocab_size: int, name: str = "the prompt") -> None:
    """A ValueError unless `ids` is a non-empty sequence of ids in [0, vocab_size)."""
    if not len(ids):
        raise ValueError(f"{name} is empty; give at least one token (the lesson starts from id 0, a newline)")
    check_token_ids(ids, vocab_size, name)


def check_request(request: Request, block_size: int, vocab_size: int) -> None:
    """A ValueError (a TypeError for a wrong type) naming what `request` gets wrong for a model of `block_size`
    positions and `vocab_size` ids: a `RequestError` naming the field where a checked `GenerationRequest` can still
    be wrong for this model (its window, its logit_bias ids)."""
    if not isinstance(request, Request):
        raise TypeError(f"submit takes a Request, got {type(request).__name__}")
    check_engine_value("max_new_tokens", request.max_new_tokens)
    check_prompt_ids(request.prompt_ids, vocab_size)
    if request.seed is not None:
        check_engine_value("seed", request.seed)
    if not isinstance(request.sampling, SamplingParams):
        raise TypeError(f"sampling must be a SamplingParams, got {type(request.sampling).__name__}")
    try:
        window_keep(block_size, request.window_mode, request.refill_tokens)
    except ValueError as e:
        field_name = "refill_tokens" if request.window_mode in WINDOW_MODES else "window_mode"
        raise RequestError(str(e), field_name) from None
    if request.logprobs is not None:
        check_engine_value("logprobs", request.logprobs)
    if request.constraint is not None and getattr(request.constraint, "vocab_size", None) != vocab_size:
        raise ValueError(f"constraint must be a CharAutomaton of this model's vocabulary of {vocab_size} ids")
    if request.logit_bias:
        try:
            check_token_ids([t for t, _ in request.logit_bias], vocab_size, "logit_bias")
        except ValueError as e:
            raise RequestError(str(e), "logit_bias") from None


_DONE = object()


class Stream:
    """The tokens of one submitted request, as an iterator of ids. `cancel()` (or closing the iterator, or a
    consumer that stops reading and drops it) removes the request's row before the next decode step."""

    def __init__(self, request: Request, owner: StreamOwner):
        self.request = request
        self._owner = owner
        self._tokens: queue.SimpleQueue = queue.SimpleQueue()
        self.cancelled = threading.Event()
        self._ended = threading.Event()  # the scheduler is done with the request (`wait`)
        self.error: BaseException | None = None
        self.submitted_at = time.perf_counter()
        self.first_token_at: float | None = None
        self.admitted_at: float | None = None  # when the scheduler took it from the queue
        self.last_seen_at: float | None = None  # for a consumer that times the gaps between tokens (the API's metrics)
        self.generated = 0
        # with `Request.logprobs`: (logprob, [(id, logprob), ...]) per token, in order
        self.logprobs = TokenLogprobs(request.logprobs or 0)
        self._finished = False  # the consumer has seen the end
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None  # an `atake` waiting

    def cancel(self) -> None:
        if not self.cancelled.is_set():
            self.cancelled.set()
            self._owner.wake()

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
            self._owner.drive(self)  # a scheduler without a thread of its own steps here
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

    @property
    def ready(self) -> bool:
        """`take` would return at once: a token is queued, or the end."""
        return not self._tokens.empty() or self._ended.is_set()

    @property
    def waiter(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Future] | None:
        """The event loop and future of an `atake` waiting for this stream, if one is."""
        return self._waiter

    def put(self, token: int, logprob=None) -> None:
        """The request's next token (and, with `Request.logprobs`, its logprobs)."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if logprob is not None:
            self.logprobs.append(*logprob)  # before the token: a consumer that has the token has its logprob
        self.generated += 1
        self._tokens.put(token)

    def finish(self, error: BaseException | None = None) -> None:
        """The request has ended: finished, cancelled, or failed with `error` (raised by the consumer's `take`)."""
        self.error = error
        self._tokens.put(_DONE)
        self._ended.set()


class Scoring:
    """A prompt's own log-probabilities (OpenAI's `echo` with `logprobs`), computed by a scheduler in chunks between
    its decode steps (`Scheduler.score`): `result()` (or `await aresult()`) gives `logprobs.prompt_logprobs`'s
    entries; `cancel()` stops the work before its next chunk (a client that left)."""

    def __init__(self, ids: Sequence[int], top_n: int, owner: StreamOwner):
        self.ids, self.top_n = [int(t) for t in ids], top_n
        self.entries = TokenLogprobs(top_n)  # filled chunk by chunk
        self.cancelled = threading.Event()
        self.error: BaseException | None = None
        self._owner = owner
        self._ended = threading.Event()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None

    def cancel(self) -> None:
        if not self.cancelled.is_set():
            self.cancelled.set()
            self._owner.wake()

    def result(self, timeout: float | None = None) -> list:
        """The entries, once all are computed (blocking); the scheduler's error if it failed; TimeoutError."""
        self._owner.drive(self)
        if not self._ended.wait(timeout):
            raise TimeoutError(f"the prompt's logprobs were not ready within {timeout} s")
        if self.error is not None:
            raise self.error
        return self.entries

    async def aresult(self) -> list:
        """`result` on an asyncio event loop, without a thread."""
        while not self._ended.is_set():
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            self._waiter = (loop, future)
            if self._ended.is_set():
                break
            try:
                await future
            finally:
                self._waiter = None
        return self.result()

    # -- the scheduler's side --

    @property
    def ready(self) -> bool:
        return self._ended.is_set()

    @property
    def waiter(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Future] | None:
        return self._waiter

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self._ended.set()


def wake_waiters(items: list[Stream | Scoring]) -> None:
    """Wakes the async waiters (`atake`, `aresult`) of `items`, streams given tokens or ended and scorings ended: one
    call into each event loop for all of its waiters."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = {}
    for item in items:
        waiter = item.waiter
        if waiter is not None:
            by_loop.setdefault(waiter[0], []).append(waiter[1])
    for loop, futures in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve, futures)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass


def _resolve(futures: list[asyncio.Future]) -> None:
    for future in futures:
        if not future.done():  # a cancelled waiter (its client went away) stays cancelled
            future.set_result(None)
