"""The generation engine: one token-level loop with a KV cache, for every backend. numpy only.

The engine knows nothing about tokenization or about what computes the logits. A backend is anything with
`block_size`, `vocab_size` and

    forward(input_ids, attention_mask, position_ids, cache) -> (last_logits, cache)

taking int64 arrays `input_ids` (B, T) and `position_ids` (B, T), an int64 `attention_mask` (B, past + T) over the
cached and new columns, and an opaque `cache` (None = start empty); it returns float logits (B, vocab) of the last
position and the cache extended by the T new tokens. `TorchBackend` and `OnnxBackend` implement it. A backend that
also has `new_batch(max_rows)` (a `DecodeBatch`, see `gpt_serve.generation.scheduler`) and `window_logits(ids)`
(full windows, no cache) runs a single prompt on a one-row batch instead: the scheduler's forward passes.

Past `block_size` the engine slides the window: when the text no longer fits, it restarts the cache from the last
`keep` tokens at positions `0..keep-1`, with `keep = block_size` for `window_mode="exact"` (so every step past the
window is a full-window forward: the lesson's `idx[:, -block_size:]`, exactly) and `keep = refill_tokens` for
`"refill"` (the cache then grows again for `block_size - refill_tokens` cheap steps). The window counts columns,
padding included: in a left-padded batch, `"exact"` gives every row the tokens it would get alone, while `"refill"`
restarts every row when the longest one fills the window (so a short row's tokens may differ from its solo run).
`stream_text` puts text on top.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from .sampling import SamplingParams, apply_repetition_penalty, sample_next

WINDOW_MODES = ("exact", "refill")
MAX_NEW_TOKENS_LIMIT = 1_000_000


class Backend(Protocol):
    block_size: int
    vocab_size: int

    def forward(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray, cache: Any
    ) -> tuple[np.ndarray, Any]: ...


def window_keep(block_size: int, window_mode: str, refill_tokens: int | None) -> int:
    """How many tokens survive when the window overflows."""
    if window_mode not in WINDOW_MODES:
        raise ValueError(f"window_mode must be one of {WINDOW_MODES}, got {window_mode!r}")
    if window_mode == "exact":
        return block_size
    keep = refill_tokens if refill_tokens is not None else max(1, block_size // 2)
    if isinstance(keep, bool) or not isinstance(keep, (int, np.integer)) or not 1 <= keep < max(2, block_size):
        raise ValueError(
            f"refill_tokens must be an integer in [1, block_size - 1] = [1, {block_size - 1}], got {keep!r}"
        )
    return int(keep)


def check_seed(seed) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ValueError(f"seed must be None or an integer >= 0, got {seed!r}")


def check_prompt_ids(ids: Sequence[int], vocab_size: int, name: str = "the prompt") -> None:
    """A ValueError unless `ids` is a non-empty sequence of ids in [0, vocab_size)."""
    if not len(ids):
        raise ValueError(f"{name} is empty; give at least one token (the lesson starts from id 0, a newline)")
    bad = [t for t in ids if not 0 <= int(t) < vocab_size]
    if bad:
        raise ValueError(f"{name} holds ids {bad[:10]} outside the vocabulary [0, {vocab_size - 1}]")


def left_pad(prompts: Sequence[Sequence[int]], extra: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) of shape (B, longest + extra): prompts right-aligned, padding (id 0, mask 0) on the left."""
    if not prompts:
        raise ValueError("no prompts given")
    longest = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), longest + extra), dtype=np.int64)
    mask = np.zeros_like(ids)
    for b, p in enumerate(prompts):
        if len(p):
            ids[b, longest - len(p) : longest] = p
            mask[b, longest - len(p) : longest] = 1
    return ids, mask


def generate_tokens(
    backend: Backend,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    seed: int | None = None,
    window_mode: str = "exact",
    refill_tokens: int | None = None,
    stop_token_ids: Sequence[int] = (),
) -> Iterator[np.ndarray]:
    """Yields the next token of every prompt (an int64 array of shape (B,)), `max_new_tokens` times at most.

    Prompts may differ in length (they are left-padded) but none may be empty. Generation ends early once every
    row has produced one of `stop_token_ids` (rows that stopped keep yielding tokens until then; callers drop
    them). Closing the generator stops the computation.
    """
    sampling = sampling or SamplingParams()
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
        raise TypeError(f"max_new_tokens must be an integer, got {type(max_new_tokens).__name__}")
    if not 0 <= max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
        raise ValueError(f"max_new_tokens must be in [0, {MAX_NEW_TOKENS_LIMIT}], got {max_new_tokens}")
    check_seed(seed)
    keep = window_keep(backend.block_size, window_mode, refill_tokens)
    prompts = [list(p) for p in prompts]
    for b, p in enumerate(prompts):
        check_prompt_ids(p, backend.vocab_size, f"prompt {b}")
    rng = np.random.default_rng(seed)
    stops = np.asarray(list(stop_token_ids), dtype=np.int64)
    if len(prompts) == 1 and hasattr(backend, "new_batch") and hasattr(backend, "window_logits"):
        yield from _one_row(backend, prompts[0], max_new_tokens, sampling, rng, keep, window_mode == "exact", stops)
        return
    ids, mask = left_pad(prompts, extra=max_new_tokens)
    total = max(len(p) for p in prompts)  # columns filled so far
    stopped = np.zeros(len(prompts), dtype=bool)
    cache, start, cached = None, 0, 0  # the cache holds columns [start, start + cached)
    for _ in range(max_new_tokens):
        if total - start > backend.block_size:  # the window overflows: restart it from the last `keep` tokens
            start, cache, cached = total - keep, None, 0
        lo = start + cached  # first column not in the cache
        window_mask = mask[:, start:total]
        positions = np.maximum(np.cumsum(window_mask, axis=1) - 1, 0)[:, lo - start :]
        logits, cache = backend.forward(ids[:, lo:total], window_mask, positions, cache)
        cached = total - start
        logits = apply_repetition_penalty(logits, ids[:, :total], mask[:, :total], sampling.repetition_penalty)
        token = sample_next(logits, sampling, rng).astype(np.int64)
        ids[:, total], mask[:, total] = token, 1
        total += 1
        yield token
        if stops.size:
            stopped |= np.isin(token, stops)
            if stopped.all():
                return


def _one_row(backend, prompt: list[int], max_new_tokens: int, sampling, rng, keep: int, exact: bool, stops):
    """`generate_tokens` for one prompt, on a backend's `DecodeBatch` of one row (`backend.new_batch`): the same
    forward passes as the scheduler's for a request alone (`gpt_serve.generation.scheduler`), so a prompt gets the
    same tokens from this loop as from a server, whatever else the server runs. Same window rule as the batched
    loop: past `block_size`, `"exact"` runs a full-window forward per token and `"refill"` prefills the last `keep`
    tokens again."""
    block = backend.block_size
    ids = list(prompt)
    start = len(ids) - keep if len(ids) > block else 0  # the window is ids[start:]
    batch, in_batch = backend.new_batch(1), False
    for _ in range(max_new_tokens):
        if len(ids) - start > block:  # the new token no longer fits: slide the window
            if in_batch:
                batch.remove(0)
                in_batch = False
            start = len(ids) - keep
        if exact and start > 0:  # a full-window forward, the lesson's idx[:, -block_size:]
            logits = backend.window_logits(np.asarray(ids[-block:], dtype=np.int64)[None])
        elif not in_batch:  # prefill the window
            logits, in_batch = batch.add(ids[start:])[None], True
        else:
            logits = batch.step(np.asarray(ids[-1:], dtype=np.int64))
        if sampling.repetition_penalty != 1.0:  # transformers' rule over every token so far (the batched loop's)
            context = np.asarray(ids, dtype=np.int64)[None]
            logits = apply_repetition_penalty(logits, context, np.ones_like(context), sampling.repetition_penalty)
        token = sample_next(logits, sampling, rng).astype(np.int64)
        ids.append(int(token[0]))
        yield token
        if stops.size and np.isin(token, stops).all():
            return


def encode_prompt(vocab, prompt: str, unk_policy: str | None = None) -> list[int]:
    """Prompt text -> ids. The empty prompt means "start from id 0" (a newline in Tiny Shakespeare), as in the
    lesson's `generate(torch.zeros((1, 1)))`."""
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    ids = vocab.encode(prompt, unk_policy=unk_policy)
    if not ids and prompt:
        raise ValueError(f"the prompt {prompt!r} has no character left after dropping unknown ones")
    return ids or [0]


def stream_text(
    backend: Backend,
    vocab,
    prompt: str,
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    *,
    seed: int | None = None,
    window_mode: str = "exact",
    refill_tokens: int | None = None,
    stop: str | None = None,
    unk_policy: str | None = None,
) -> Iterator[str]:
    """Yields the generated text piece by piece (one character per token); the prompt is not repeated.

    `vocab` is a `CharVocab` (`load_backend(...).vocab`, or a `CharTokenizer`'s `.vocab`); `sampling` is how tokens
    are picked (default: plain sampling at temperature 1). `stop`, if given, is a character that ends the text (it
    is yielded, then generation stops).
    """
    ids = encode_prompt(vocab, prompt, unk_policy)
    stop_ids = vocab.encode(stop) if stop else []
    for token in generate_tokens(backend, [ids], max_new_tokens, sampling, seed, window_mode, refill_tokens, stop_ids):
        yield vocab.decode(token[:1])


def generate_text(
    backend: Backend, vocab, prompt: str, max_new_tokens: int, sampling: SamplingParams | None = None, **kwargs
) -> str:
    """The whole continuation of `prompt` at once (see `stream_text`)."""
    return "".join(stream_text(backend, vocab, prompt, max_new_tokens, sampling, **kwargs))
