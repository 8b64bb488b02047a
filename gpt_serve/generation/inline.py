"""Generation for a script: token ids (`generate_tokens`) and text (`stream_text`, `generate_text`) from a backend,
on the scheduler that servers run (one token loop for everything), stepped on the caller's thread.

    loaded = load_backend("shakespeare", "onnx-int8")
    for piece in stream_text(loaded.backend, loaded.vocab, "ROMEO:", 200, SamplingParams(temperature=0.8), seed=0):
        print(piece, end="")

A prompt gets the same tokens here as from a server, whatever else the server runs: the same forward passes
(`Scheduler`, on an `InlineRunner`), the same sampler, the same window rule and the same checks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

import numpy as np

from ..chargpt.window import DEFAULT_WINDOW_MODE, WINDOW_MODES, window_keep
from .backends.interface import Backend, left_pad
from .requests import Request
from .runner import InlineRunner
from .sampling import SamplingParams
from .scheduler import Scheduler
from .spec import GenerationRequest, offset_seed
from .text import TextStream

__all__ = ["WINDOW_MODES", "Backend", "generate_text", "generate_tokens", "inline_scheduler", "stream_text"]
__all__ += ["left_pad", "window_keep"]  # left_pad: the export's validation builds batches with it


def inline_scheduler(backend: Backend, max_batch: int = 1) -> Scheduler:
    """A `Scheduler` of `backend` that steps on the thread reading its streams (no thread of its own)."""
    return Scheduler(backend, max_batch, max_queue=max_batch, max_prefills_per_step=max_batch, runner=InlineRunner())


def generate_tokens(
    backend: Backend,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    seed: int | None = None,
    window_mode: str = DEFAULT_WINDOW_MODE,
    refill_tokens: int | None = None,
    stop_token_ids: Sequence[int] = (),
) -> Iterator[np.ndarray]:
    """Yields the next token of every prompt (an int64 array of shape (B,)), `max_new_tokens` times at most.

    Each prompt (non-empty ids) is a request of its own on one scheduler, so its tokens are what it gets alone:
    prompt `b` samples with seed `seed + b`. A row that produced one of `stop_token_ids` has ended: its entries are
    -1 from then on, and the generator ends when every row has. Closing the generator stops the computation.
    """
    sampling = sampling or SamplingParams()
    prompts = [list(p) for p in prompts]
    if not prompts:
        raise ValueError("no prompts given")
    scheduler = inline_scheduler(backend, len(prompts))
    try:
        streams = []
        for b, prompt in enumerate(prompts):
            row_seed = seed if seed is None or b == 0 else offset_seed(seed, b)
            request = Request(prompt, max_new_tokens, sampling, row_seed, window_mode, refill_tokens, stop_token_ids)
            try:
                streams.append(scheduler.submit(request))
            except ValueError as e:
                raise type(e)(f"prompt {b}: {e}" if len(prompts) > 1 else str(e)) from None
        if len(streams) == 1:  # one prompt: its tokens as they come
            while (chunk := streams[0].take()) is not None:
                for token in chunk:
                    yield np.array([token], dtype=np.int64)
            return
        pending: list[deque[int]] = [deque() for _ in streams]
        ended = [False] * len(streams)
        while True:
            step = np.full(len(streams), -1, dtype=np.int64)
            for b, stream in enumerate(streams):
                if not pending[b] and not ended[b]:
                    chunk = stream.take()
                    ended[b] = chunk is None
                    pending[b].extend(chunk or ())
                if pending[b]:
                    step[b] = pending[b].popleft()
            if (step < 0).all():
                return
            yield step
    finally:
        scheduler.close()


def stream_text(
    backend: Backend,
    vocab,
    prompt: str,
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    **fields,
) -> Iterator[str]:
    """Yields the generated text one character (one token) at a time; the prompt is not repeated.

    `vocab` is a `CharVocab` (`load_backend(...).vocab`, or a `CharTokenizer`'s `.vocab`); `sampling` is how tokens
    are picked (default: plain sampling at temperature 1). `fields` are any other fields of `GenerationRequest` (the
    request table, docs/generation.md): `seed` (left out or None draws one), `stop` (a string or up to four; the
    text ends before the first one), `window_mode`, `refill_tokens`, `unk_policy`, `structured_outputs`,
    `response_format`, `logit_bias`, `allowed_token_ids` (docs/structured.md), ... Every value is checked as a
    server checks its request's: a bad one raises its `RequestError` (a ValueError) at the first `next()`.
    """
    sampling = sampling or SamplingParams()
    request = GenerationRequest(prompt, max_new_tokens, sampling=sampling, **{"seed": None, **fields})
    scheduler = inline_scheduler(backend)
    try:
        for piece in TextStream(scheduler, vocab, request):
            yield from piece
    finally:
        scheduler.close()


def generate_text(
    backend: Backend, vocab, prompt: str, max_new_tokens: int, sampling: SamplingParams | None = None, **kwargs
) -> str:
    """The whole continuation of `prompt` at once (see `stream_text`)."""
    return "".join(stream_text(backend, vocab, prompt, max_new_tokens, sampling, **kwargs))
