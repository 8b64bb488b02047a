"""Choosing the next token from logits: one small pure function, numpy only, with an explicit RNG.

Every backend (PyTorch, ONNX Runtime) hands its logits to `sample_next`, so the same seed picks the same tokens
whatever computed the logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens.

    Args:
        temperature: 0 picks the most likely token (greedy); otherwise logits are divided by it. Must be >= 0.
        top_k: keep only the `top_k` most likely tokens (None or 0: all).
        top_p: nucleus sampling, keep the smallest set of tokens whose probability reaches `top_p`, in (0, 1].
        repetition_penalty: > 1 discourages tokens already in the context (as in transformers), 1 disables.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not np.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0):
            raise ValueError(f"top_k must be None or an integer >= 0 (0 = no limit), got {k!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        r = self.repetition_penalty
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not np.isfinite(r) or r <= 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 = off), got {r!r}")


def apply_repetition_penalty(logits: np.ndarray, context: np.ndarray, mask: np.ndarray, penalty: float) -> np.ndarray:
    """transformers' rule: a seen token's logit is divided by `penalty` if positive, multiplied if negative."""
    if penalty == 1.0:
        return logits
    logits = logits.copy()
    for b in range(logits.shape[0]):
        seen = np.unique(context[b][mask[b] > 0])
        row = logits[b, seen]
        logits[b, seen] = np.where(row > 0, row / penalty, row * penalty)
    return logits


def sample_next(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> np.ndarray:
    """Next token id per row of `logits` (B, V): argmax at temperature 0, else a draw from the filtered softmax.

    Exactly one uniform number is drawn per row and step (none when greedy), so a seed fixes the stream.
    """
    if params.temperature == 0:
        return logits.argmax(axis=-1)
    return draw(probabilities(logits, params), rng.random(logits.shape[0]))


def sample_rows(logits: np.ndarray, params: list[SamplingParams], rngs: list[np.random.Generator]) -> np.ndarray:
    """`sample_next` for rows that each have their own settings and RNG: row b gets exactly the token that
    `sample_next(logits[b:b+1], params[b], rngs[b])` gives (the same operations, one uniform number from its own RNG),
    computed for all rows that share settings at once."""
    tokens = np.zeros(len(params), dtype=np.int64)
    groups: dict[SamplingParams, list[int]] = {}
    for b, p in enumerate(params):
        groups.setdefault(p, []).append(b)
    for p, rows in groups.items():
        if p.temperature == 0:
            tokens[rows] = logits[rows].argmax(axis=-1)
        else:
            u = np.array([rngs[b].random() for b in rows])
            tokens[rows] = draw(probabilities(logits[rows], p), u)
    return tokens


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The filtered softmax (B, V) that a temperature > 0 draw samples from, in float64."""
    z = logits.astype(np.float64) / params.temperature  # (B, V)
    V = z.shape[-1]
    if params.top_k and params.top_k < V:
        kth = np.partition(z, V - params.top_k, axis=-1)[:, V - params.top_k, None]  # (B, 1)
        z = np.where(z < kth, -np.inf, z)
    z = z - z.max(axis=-1, keepdims=True)
    probs = np.exp(z)
    probs /= probs.sum(axis=-1, keepdims=True)
    if params.top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(probs, order, axis=-1)
        # keep a token if the probability before it is still short of top_p (the first token always stays)
        drop_sorted = (np.cumsum(sorted_p, axis=-1) - sorted_p) >= params.top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        probs = np.where(drop, 0.0, probs)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def draw(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The token each row's uniform number `u` (B,) in [0, 1) picks from `probs` (B, V) (inverse CDF)."""
    cdf = np.cumsum(probs, axis=-1)  # (B, V)
    return np.minimum((cdf <= u[:, None] * cdf[:, -1:]).sum(axis=-1), probs.shape[-1] - 1)
