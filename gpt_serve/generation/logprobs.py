"""Log-probabilities of a prompt's own tokens (OpenAI's `echo` with `logprobs`): what evaluation harnesses score a
model with. numpy only; the backend computes the logits (`Backend.sequence_logits`, `window_logits`).

Token `i` of the prompt is scored by the model's distribution after the tokens before it, read the way generation
reads them (`gpt_serve.chargpt.window`, the lesson's exact window): the first `block_size` tokens by one forward pass
over
them, each later one by the window of the `block_size` tokens before it. The first token has no logprob (null, as
OpenAI answers).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from .sampling import log_softmax

WINDOWS_PER_CALL = 32  # full windows scored together past block_size


def entry(lp: np.ndarray, token: int, top_n: int) -> tuple[float, list[tuple[int, float]]]:
    """(the token's logprob, the `top_n` most likely (id, logprob)) of one position's log-probabilities."""
    top = np.argsort(-lp, kind="stable")[:top_n]
    return float(lp[token]), [(int(t), float(lp[t])) for t in top]


def prompt_logprobs(backend, ids: Sequence[int], top_n: int) -> list:
    """One entry per prompt token: None for the first, else `entry(...)` (see the module docstring)."""
    out: list = []
    for _ in scoring_chunks(backend, ids, top_n, out):
        pass
    return out


def scoring_chunks(
    backend, ids: Sequence[int], top_n: int, out: list, windows: int = WINDOWS_PER_CALL
) -> Iterator[int]:
    """`prompt_logprobs` in chunks: each `next()` runs one forward pass (the first window's, or up to `windows`
    later windows together), appends its entries to `out`, and yields how many tokens that forward read. What the
    scheduler runs between decode steps (`Scheduler.score`), so that scoring a long prompt shares the machine."""
    ids = [int(t) for t in ids]
    block = backend.block_size
    out.append(None)
    first = ids[:block]
    if len(first) > 1:
        lps = log_softmax(backend.sequence_logits(np.asarray(first, dtype=np.int64)))  # (T, V)
        out += [entry(lps[i - 1], ids[i], top_n) for i in range(1, len(first))]
        yield len(first)
    later = list(range(block, len(ids)))  # token i read after the window ids[i - block : i]
    for start in range(0, len(later), windows):
        chunk = later[start : start + windows]
        batch = np.asarray([ids[i - block : i] for i in chunk], dtype=np.int64)  # (k, block)
        lps = log_softmax(backend.window_logits(batch))
        out += [entry(lps[k], ids[i], top_n) for k, i in enumerate(chunk)]
        yield batch.size
