"""Choosing the next token from logits: pure functions, numpy only, each row with its own explicit RNG.

The scheduler samples a step's rows through `rows.next_tokens` (which also applies the penalties): each sampling row
draws its one uniform number from its own RNG (`draw_uniforms`), and `sample_groups` picks the tokens, the rows that
share settings together. So the same seed picks the same tokens whatever computed the logits (PyTorch, ONNX Runtime)
and whatever else runs in the batch.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from .fields import check_engine_value

# A temperature below this samples greedily, as vLLM's does: dividing by 1e-320 overflows the logits to inf and their
# softmax to NaN. Below it the draw is the argmax anyway, but for logits closer than ~1e-4 (docs/generation.md).
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens.

    Args:
        temperature: 0 (or anything below `GREEDY_BELOW`) picks the most likely token (greedy); otherwise logits are
            divided by it.
        top_k: keep only the `top_k` most likely tokens (None or 0: all).
        top_p: nucleus sampling, keep the smallest set of tokens whose probability reaches `top_p`.
        repetition_penalty: > 1 discourages tokens already in the context (as in transformers), 1 disables.
        presence_penalty: subtracted from the logit of every token the generated text holds (OpenAI's rule), 0 off.
        frequency_penalty: subtracted once per occurrence in the generated text (OpenAI's rule), 0 off.
        min_p: drop tokens whose probability is below `min_p` times the most likely one's, 0 off.

    The accepted ranges are the engine's own (`fields.check_engine_value`): the request table's, without the upper
    bounds of temperature, top_k and repetition_penalty that OpenAI's wire sets (a request is held to those when
    it is parsed, `spec.GenerationRequest`); a value outside them raises its `RequestError` (a ValueError).
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0

    def __post_init__(self):
        for name in ("temperature", "top_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "min_p"):
            object.__setattr__(self, name, check_engine_value(name, getattr(self, name)))
        if self.top_k is not None:
            object.__setattr__(self, "top_k", check_engine_value("top_k", self.top_k))

    @property
    def greedy(self) -> bool:
        """Whether tokens are the argmax: temperature 0 or below `GREEDY_BELOW`."""
        return self.temperature < GREEDY_BELOW


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log-probabilities (..., V) of logits, in float64: what `logprobs` report (the model's own distribution,
    before temperature, penalties and filters)."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def finite_rows(logits: np.ndarray) -> np.ndarray:
    """Whether each row of `logits` (B, V) is finite (B,): a NaN or an infinite logit is never sampled (a broken
    model's; the scheduler ends such a row's request with an `EngineError`)."""
    return np.isfinite(logits).all(axis=-1)


def draw_uniforms(params: list[SamplingParams], rngs: list[np.random.Generator]) -> np.ndarray:
    """The one uniform number each sampling row draws from its own RNG this step (0 for greedy rows, which draw
    none): drawn before anything else, so that a later failure cannot make a row draw twice."""
    return np.array([0.0 if p.greedy else g.random() for p, g in zip(params, rngs, strict=True)])


_SHARED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def shared(params: SamplingParams) -> SamplingParams:
    """The one object of `params`'s settings among those in use (`params` itself if it is the first): rows whose
    settings are equal then hold the same object, and `sample_groups` groups them by identity, without comparing
    settings row by row at every step."""
    return _SHARED.setdefault(params, params)


def sample_groups(logits: np.ndarray, params: list[SamplingParams], u: np.ndarray) -> np.ndarray:
    """Row b's token from finite `logits[b]` with `params[b]` and its uniform number `u[b]` (`draw_uniforms`),
    computed at once for the rows that hold the same settings object (`shared`; every operation is row by row, so
    a row's token does not depend on its group)."""
    groups: dict[int, tuple[SamplingParams, list[int]]] = {}
    for b, p in enumerate(params):
        groups.setdefault(id(p), (p, []))[1].append(b)
    tokens = np.zeros(len(params), dtype=np.int64)
    for p, rows in groups.values():
        if p.greedy:
            tokens[rows] = logits[rows].argmax(axis=-1)
        else:
            tokens[rows] = draw(probabilities(logits[rows], p), u[rows])
    return tokens


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The filtered softmax (B, V) that a draw at a temperature of at least `GREEDY_BELOW` samples from, in float64."""
    z = logits.astype(np.float64) / params.temperature  # (B, V)
    V = z.shape[-1]
    if params.top_k and params.top_k < V:
        kth = np.partition(z, V - params.top_k, axis=-1)[:, V - params.top_k, None]  # (B, 1)
        z = np.where(z < kth, -np.inf, z)
    z = z - z.max(axis=-1, keepdims=True)
    probs = np.exp(z)
    probs /= probs.sum(axis=-1, keepdims=True)
    if params.min_p > 0.0:
        probs = np.where(probs < params.min_p * probs.max(axis=-1, keepdims=True), 0.0, probs)
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
