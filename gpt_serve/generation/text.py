"""The one text stream: a checked request's prompt encoded, submitted to a scheduler, and its tokens decoded
incrementally with stop strings, cancelled when its consumer closes it. Every surface (the library's `stream_text`,
`gpt-serve generate`, the OpenAI API, the demo, Ray Serve replicas) reads its text from a `TextStream`; each maps
only its errors (`RequestError`, `ServerBusy`) to its own wire format.

    text = TextStream(scheduler, loaded.vocab, parse_request({"prompt": "ROMEO:", "max_tokens": 50, "stop": "\\n\\n"}))
    for piece in text:          # the new text, piece by piece; `text.finish_reason` is "stop" or "length" at the end
        ...
"""

from __future__ import annotations

from .constraints import compile_constraint
from .fields import RequestError
from .requests import EngineError, Request, Stream
from .spec import GenerationRequest

# How a request accepts characters outside the vocabulary, in the API's words; a surface with a control or a flag of
# its own passes its words (`unk_hint`): the CLI's `--unk-policy`, the page's "Characters outside the vocabulary".
UNK_HINT = "set unk_policy to 'replace' (each becomes a space) or 'drop'"


def encode_prompt(vocab, prompt: str, unk_policy: str = "error", unk_hint: str = UNK_HINT) -> list[int]:
    """The prompt's ids. The empty prompt starts after a newline (id 0), as the lesson's `generate(torch.zeros((1,
    1)))` does. RequestError naming the characters outside the vocabulary (the first ten and a count: nothing of a
    huge prompt is kept in the error) and how to accept them (`unk_hint`), or a prompt with nothing left once they
    are dropped."""
    if not isinstance(prompt, str):
        raise RequestError(f"prompt must be text, got {type(prompt).__name__}", "prompt")
    if not prompt:
        return [0]
    if unk_policy == "error":
        count, first = vocab.unknown(prompt)
        if count:
            shown = ", ".join(f"{c!r} (position {i})" for i, c in first)
            more = f" and {count - len(first)} more" if count > len(first) else ""
            raise RequestError(
                f"the prompt has {count:,} character{'s' if count > 1 else ''} outside this model's vocabulary: "
                f"{shown}{more}. Remove them, or {unk_hint}",
                "prompt",
            )
    ids = vocab.encode(prompt, unk_policy=unk_policy)
    if not ids:
        raise RequestError("the prompt has no character left once the unknown ones are dropped", "prompt")
    return ids


class TextStream:
    """The text of one request on `scheduler` (see the module docstring).

    Args:
        scheduler: the `Scheduler` of the model (`ModelRegistry.scheduler`, or an inline one for a script).
        vocab: the model's `CharVocab`.
        request: the checked request (`parse_request`).
        index: which prompt of a list this is: its seed is `request.seed_for(index)`.
        prompt: this prompt of a list (None: `request.prompt`); the request itself is held as it is, by reference.
        unk_hint: how the caller's surface accepts characters outside the vocabulary (see `encode_prompt`).
        end: a text that ends it as a stop string does, after the request's own (a chat's end of speech): a
            constraint's text may be followed by it.
        ranked: keep each token's logprob even if the request asks none (best_of ranks choices by them).

    Raises `RequestError` for a prompt the vocabulary cannot encode or a request this model cannot take (a
    constraint, logit_bias ids or a refill_tokens past its window) and `ServerBusy` when the scheduler's queue is
    full; nothing is submitted then.
    """

    def __init__(
        self,
        scheduler,
        vocab,
        request: GenerationRequest,
        index: int = 0,
        prompt: str | None = None,
        unk_hint: str = UNK_HINT,
        end: str = "",
        ranked: bool = False,
    ):
        self.request, self.vocab = request, vocab
        prompt = request.prompt if prompt is None else prompt
        self.prompt_ids = encode_prompt(vocab, prompt, request.unk_policy, unk_hint)
        self.prompt = vocab.decode(self.prompt_ids)  # as the model reads it (a newline for the empty prompt)
        self.stops = (*request.stop, end) if end else request.stop
        constraint = request.constraint.ending(end) if end and request.constraint else request.constraint
        # structured outputs: compiled for this vocabulary (cached; a RequestError names what is wrong)
        self.automaton = compile_constraint(constraint, vocab.chars, request.allowed_token_ids)
        logprobs = 0 if ranked and request.logprobs is None else request.logprobs
        own = dict(seed=request.seed_for(index), logprobs=logprobs, constraint=self.automaton)
        # the engine's request: `request`'s own fields as they are, then this choice's (a RequestError names the
        # field this model cannot take: its window, its logit_bias ids)
        self.stream: Stream = scheduler.submit(Request.of(request, self.prompt_ids, **own))
        self.text = ""  # the text so far, cut at a stop string
        self.tokens = 0  # tokens that made the text (a stop string's included)
        self.finish_reason: str | None = None  # "stop" (a stop string), "length" or `cancel`'s reason once done
        self._end_reason = "length"
        self._sent = 0  # how much of `text` `take` has returned
        self._hold = max((len(s) - 1 for s in self.stops), default=0)  # a tail that may still become a stop
        self._state = self.automaton.walk([]) if self.automaton is not None else 0  # after the tokens so far

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def logprobs(self) -> list:
        """With `request.logprobs`: (logprob, [(id, logprob), ...]) of each token of `text`, in order."""
        return self.stream.logprobs[: len(self.text)]

    def cancel(self, reason: str | None = None) -> None:
        """Frees the request's row before the next decode step (a no-op once it has ended); the text then ends
        with `reason` as its finish_reason (a server's "abort" at shutdown), or "length"."""
        if reason is not None and not self.done:
            self._end_reason = reason
        self.stream.cancel()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the request has ended or `timeout` seconds passed (`Stream.wait`); True if it ended."""
        return self.stream.wait(timeout)

    def take(self) -> str | None:
        """The text made since the last call (waiting for at least one token; may be "" while a possible stop
        string is held back), or None once finished."""
        if self.done:
            return None
        return self._feed(self.stream.take())

    async def atake(self) -> str | None:
        """`take` on an asyncio event loop, without a thread."""
        if self.done:
            return None
        return self._feed(await self.stream.atake())

    def __iter__(self):
        try:
            while (piece := self.take()) is not None:
                if piece:
                    yield piece
        finally:
            self.cancel()

    def _feed(self, chunk: list[int] | None) -> str:
        """The new text of `chunk`; a failure here (decoding, stop strings) is this request's alone: its row is
        freed and it ends with an `EngineError`."""
        try:
            return self._text_of(chunk)
        except Exception as e:
            self.stream.cancel()
            self.finish_reason = "error"
            raise EngineError(f"the text of this request failed: {type(e).__name__}: {e}") from e

    def _text_of(self, chunk: list[int] | None) -> str:
        if chunk is None:
            done = self.automaton is not None and self.automaton.is_final(self._state)  # the constraint's text is whole
            self.finish_reason = "stop" if done else self._end_reason
            return self._new_text(final=True)
        if self.automaton is not None:
            self._state = self.automaton.walk(chunk, self._state)
        checked = max(0, len(self.text) - self._hold)  # where a stop string may start that was not seen yet
        self.text += self.vocab.decode(chunk)
        self.tokens += len(chunk)
        cut = min((i for i in (self.text.find(s, checked) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            stop = min((s for s in self.stops if self.text.startswith(s, cut)), key=len)
            self.tokens -= len(self.text) - cut - len(stop)
            self.text, self.finish_reason = self.text[:cut], "stop"
            self.stream.cancel()
            return self._new_text(final=True)
        return self._new_text(final=False)

    def _new_text(self, final: bool) -> str:
        end = len(self.text) if final else max(self._sent, len(self.text) - self._hold)
        piece, self._sent = self.text[self._sent : end], end
        return piece
