"""What one generation request is, checked; the stream it produces, with live stats; and the yield throttle.

Everything here is plain Python generators over the library's scheduler (one batched decode loop per model and
backend, `registry.scheduler`), testable without Gradio:

    request = parse_form(registry, MAX_NEW_TOKENS, dict(prompt="ROMEO:", max_new_tokens=200, ...))  # the library's spec
    for progress in throttle(stream_progress(registry, request), interval=0.05):
        print(progress.text, progress.tokens, progress.tokens_per_second)

A request is checked once, by the library's request specification (`gpt_serve.generation.spec`), and its text is
the library's `TextStream`: the demo adds only what a page needs (progress, stop tickets, a throttle).

Closing a stream (`GeneratorExit`, as Gradio does on Stop or a disconnect) or stopping it (`should_stop`) cancels
its request in `finally:`: its row leaves the batch before the next decode step, and `Activity` marks it finished.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from gpt_serve.generation.fields import RequestError
from gpt_serve.generation.requests import ServerBusy
from gpt_serve.generation.spec import GenerationRequest, parse_request
from gpt_serve.generation.text import UNK_HINT, TextStream, encode_prompt
from gpt_serve.serving.registry import ModelRegistry


def plural(n: int, noun: str) -> str:
    """'1 layer', '4 layers', '2,000 tokens'."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class Progress:
    """The state of a stream after a token: the text generated so far (the prompt not included) and timings."""

    prompt: str  # the prompt as the model reads it (unknown characters replaced or dropped)
    text: str
    tokens: int
    time_to_first_token: float | None  # seconds from the request to the first token
    elapsed: float  # seconds since the request
    decode_seconds: float  # seconds from the first token to the latest one
    done: bool = False
    stopped: bool = False  # ended early because the user asked (`should_stop`)
    block_size: int | None = None  # the model's window

    @property
    def past_block_size(self) -> bool:
        """Whether prompt and text no longer fit the model's window: it now reads only the last block_size."""
        return self.block_size is not None and len(self.prompt) + self.tokens > self.block_size

    @property
    def tokens_per_second(self) -> float | None:
        """Decode speed: tokens after the first, per second after the first (None until there are two)."""
        if self.tokens < 2 or self.decode_seconds <= 0:
            return None
        return (self.tokens - 1) / self.decode_seconds


class Activity:
    """Counts of live and finished streams and of tokens generated, shared by all requests (thread-safe).

    `active` is the number of generation loops running now (`peak`: the most at once); `tokens` grows by one per
    forward pass, so a test (or an operator) can see that a stopped stream really stopped computing.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.active = self.peak = self.started = self.finished = self.tokens = 0

    def begin(self) -> None:
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.started += 1

    def token(self, n: int = 1) -> None:
        with self._lock:
            self.tokens += n

    def end(self) -> None:
        with self._lock:
            self.active -= 1
            self.finished += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(
                active=self.active, peak=self.peak, started=self.started, finished=self.finished, tokens=self.tokens
            )


def parse_form(registry: ModelRegistry, max_tokens_limit: int, form: Mapping[str, object]) -> GenerationRequest:
    """Checks what a user (UI or API) sent, the parameters of `DemoHandlers.generate` by name, with the request
    specification's parser (the same messages as every other surface), max_new_tokens at most `max_tokens_limit`
    (the server's cap, `--max-tokens-limit`); the model name must be one of `registry`'s.
    A field sent as None gets the model folder's default (its generation_config.json, `registry.generation_defaults`).
    Raises `RequestError`. Does not load any model."""
    model = registry.resolve_model(form.get("model"))
    defaults = registry.generation_defaults(model)
    return parse_request({**form, "model": model}, max_tokens_limit, defaults)


class StopRequests:
    """The UI's Stop button: tickets (random strings the page gives each run) of the runs asked to stop.

    A stream polls `is_stopped(ticket)` after every token and ends cleanly, so the page receives a normal end of
    stream. (Gradio's `cancels=` also ends the run, but under load the page then often shows its outputs in an
    error state: diffs still in flight arrive after the cancel.) A ticket stopped before its run leaves the queue
    stops that run as soon as it starts. Tickets are forgotten when their run ends or after `max_age` seconds.

    Every client can reach these handlers over HTTP (Gradio serves private events too), so what is kept is bounded:
    a ticket is at most `TICKET_CHARS` letters, digits, `-` or `_` (anything else is ignored), and at most
    `max_tickets` stopped tickets and as many page runs are remembered, the oldest dropped first.
    """

    TICKET_CHARS = 64

    def __init__(self, max_age: float = 3600.0, max_tickets: int = 4096):
        self._lock = threading.Lock()
        self._stopped: OrderedDict[str, float] = OrderedDict()
        self._current: OrderedDict[object, str] = OrderedDict()  # (page session, kind of run) -> its latest ticket
        self.max_age, self.max_tickets = max_age, max_tickets

    @classmethod
    def valid(cls, ticket: object) -> bool:
        return isinstance(ticket, str) and 0 < len(ticket) <= cls.TICKET_CHARS and _TICKET.fullmatch(ticket) is not None

    def supersede(self, key: tuple[str, str], ticket: str | None) -> None:
        """`ticket` is now the run of `key` (a page session and a kind of run): the run it replaces is stopped, so
        a second click of Generate restarts the stream instead of running two into the same box."""
        if not self.valid(ticket) or not (isinstance(key, tuple) and all(self.valid(part) for part in key)):
            return
        with self._lock:
            previous = self._current.pop(key, None)
            self._current[key] = ticket
            while len(self._current) > self.max_tickets:
                self._current.popitem(last=False)
        if previous and previous != ticket:
            self.stop(previous)

    def stop(self, *tickets: str) -> None:
        now = time.monotonic()
        with self._lock:
            for ticket in tickets:
                if self.valid(ticket):
                    self._stopped.pop(ticket, None)
                    self._stopped[ticket] = now
            while self._stopped and (
                len(self._stopped) > self.max_tickets or now - next(iter(self._stopped.values())) > self.max_age
            ):
                self._stopped.popitem(last=False)

    def stop_page(self, session: object, kinds: tuple[str, ...] | None = None) -> None:
        """Stops the runs that `supersede` registered for a page session (whatever ticket the page holds now): those
        of `kinds` (kinds of run: "generate", "compare"), or all of them."""
        with self._lock:
            tickets = [t for key, t in self._current.items() if key[0] == session and _of(key, kinds)]
        self.stop(*tickets)

    def has_runs(self, session: object, kinds: tuple[str, ...] | None = None) -> bool:
        """Whether a run of `kinds` (or any) that `supersede` registered for a page session is still on (not yet
        `forget`-ed)."""
        with self._lock:
            return any(key[0] == session and _of(key, kinds) for key in self._current)

    def is_stopped(self, ticket: str | None) -> bool:
        return self.valid(ticket) and ticket in self._stopped

    def forget(self, ticket: str | None) -> None:
        if not self.valid(ticket):
            return
        with self._lock:
            self._stopped.pop(ticket, None)
            for key in [k for k, t in self._current.items() if t == ticket]:
                del self._current[key]

    def __len__(self) -> int:
        """How many tickets and page runs are remembered (tests check that it stays bounded)."""
        with self._lock:
            return len(self._stopped) + len(self._current)


_TICKET = re.compile(r"[0-9A-Za-z_-]+")


def _of(key: tuple, kinds: tuple[str, ...] | None) -> bool:
    return kinds is None or key[1] in kinds


def pacer(interval: float | Callable[[], float]) -> Callable[[], float]:
    """`interval` as a function giving the seconds now (a number: always the same)."""
    return interval if callable(interval) else lambda: interval


def stream_progress(
    registry: ModelRegistry,
    request: GenerationRequest,
    activity: Activity | None = None,
    should_stop: Callable[[], bool] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    poll_interval: float | Callable[[], float] = 0.0,
    unk_hint: str = UNK_HINT,
    model: str | None = None,
) -> Iterator[Progress]:
    """A `Progress` with no tokens once the prompt is encoded, one per new piece of text, then a last one with
    `done=True`: the request's `TextStream` (the library's, as every surface reads it). Loads the backend on first
    use. With `poll_interval` (seconds, or a function giving them now), the text is collected every that often
    rather than as each token comes (a stream shown at that pace needs no more), and only the state after the last
    of it is yielded.

    `should_stop` is polled before the first token and after every state yielded; once it returns True the stream
    ends with the text shown so far (the last `Progress` has `stopped=True`) and no further forward pass runs.
    `unk_hint`: how the caller's surface accepts characters outside the vocabulary. `model`: the model to run it on
    (None: `request.model`; the comparison runs one request on several).
    """
    start, pace = clock(), pacer(poll_interval)
    model = request.model if model is None else model
    loaded = registry.backend(model, request.backend)
    prompt = loaded.vocab.decode(encode_prompt(loaded.vocab, request.prompt, request.unk_policy, unk_hint))
    block_size = loaded.block_size
    activity = activity or Activity()
    activity.begin()
    first_at, now, stopped, text, shown = None, start, False, None, 0
    try:
        yield Progress(prompt, "", 0, None, clock() - start, 0.0, block_size=block_size)
        stopped = should_stop is not None and should_stop()
        text = None if stopped else _submit(registry, model, loaded.vocab, request)
        while text is not None and not stopped and (piece := text.take()) is not None:
            pause = pace()
            # without a pace, a state per token (a piece holds the tokens made since the last look); with one, the
            # state after the last of them
            ends = range(len(text.text) - len(piece) + 1, len(text.text) + 1) if pause <= 0 else [len(text.text)]
            for end in ends if piece else ():
                now = clock()
                first_at = now if first_at is None else first_at
                activity.token(len(piece) if pause > 0 else 1)
                ttft, elapsed, decode = first_at - start, now - start, now - first_at
                shown = end
                yield Progress(prompt, text.text[:end], end, ttft, elapsed, decode, block_size=block_size)
                stopped = should_stop is not None and should_stop()
                if stopped:  # the piece's later tokens were made meanwhile, never shown: the text ends here
                    break
            if not stopped and pause > 0:
                text.wait(pause)  # let tokens pile up (one wake-up per interval, not per token), or end at once
        ttft = None if first_at is None else first_at - start
        decode = now - (first_at or now)
        final = "" if text is None else text.text[:shown] if stopped else text.text
        yield Progress(
            prompt, final, len(final), ttft, clock() - start, decode, done=True, stopped=stopped, block_size=block_size
        )
    finally:
        if text is not None:
            text.cancel()  # the row leaves the batch before the next step (a no-op once finished)
        activity.end()


def _submit(registry: ModelRegistry, model: str, vocab, request: GenerationRequest) -> TextStream:
    """The request's `TextStream` on `model`'s scheduler; a full queue is the demo's RequestError (a status line)."""
    try:
        return TextStream(registry.scheduler(model, request.backend), vocab, request)
    except ServerBusy as e:
        raise RequestError(str(e)) from None


def throttle(
    progress: Iterator[Progress],
    interval: float | Callable[[], float],
    clock: Callable[[], float] = time.perf_counter,
):
    """The first `Progress`, then at most one every `interval` seconds (the latest), and always the final one.
    `interval` may be a function, asked at each state (`DemoHandlers.interval` lengthens it under load).

    Browsers fall behind yields much faster than ~20/s; the skipped states are superseded by the next one.
    """
    pace = pacer(interval)
    last = None
    for p in progress:
        if p.tokens == 0 and not p.done:  # the prompt, before any token: shown at once, and not a token
            yield p
            continue
        now = clock()
        if p.done or last is None or now - last >= pace():
            last = now
            yield p


def stream_side_by_side(
    streams: Sequence[Iterator[Progress] | str],
    interval: float | Callable[[], float],
    failed: set[int] | None = None,
) -> Iterator[list[str]]:
    """Advances several streams one token each in turn; yields all their texts (throttled) until every one ends.

    A `str` in `streams` is a message shown in place of a stream (e.g. why that model is unavailable); a stream
    that fails shows its error message after the text it produced. The indices of both kinds are added to `failed`.
    """
    failed = set() if failed is None else failed
    failed.update(i for i, s in enumerate(streams) if isinstance(s, str))
    texts = [s if isinstance(s, str) else "" for s in streams]
    live = {i: s for i, s in enumerate(streams) if not isinstance(s, str)}
    pace = pacer(interval)
    last = None
    if not live:  # no stream could start: the messages are all there is to show
        yield list(texts)
    try:
        while live:
            for i in list(live):
                try:
                    texts[i] = next(live[i]).text
                except StopIteration:
                    del live[i]
                except (ValueError, TypeError) as e:
                    texts[i] = f"{texts[i]}\n[{e}]".lstrip("\n")
                    failed.add(i)
                    del live[i]
            now = time.perf_counter()
            if not live or last is None or now - last >= pace():
                last = now
                yield list(texts)
    finally:
        for s in live.values():
            s.close()
