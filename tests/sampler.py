"""The engine's sampler outside the engine, for tests and the lesson reference: one setting and one RNG for a batch
(`sample_next`), or each row its own (`sample_rows`), both through the functions the scheduler's rows use
(`sampling.draw_uniforms` and `sampling.sample_groups`), so they give exactly the engine's tokens. Unlike the
engine, which ends a row with non-finite logits on its own, these refuse the whole batch (`check_finite`)."""

from __future__ import annotations

import numpy as np

from gpt_serve.generation.sampling import SamplingParams, draw_uniforms, finite_rows, sample_groups, shared


def check_finite(logits: np.ndarray) -> None:
    """A ValueError unless every logit is finite."""
    bad = ~finite_rows(logits)
    if bad.any():
        raise ValueError(
            f"the logits of row(s) {np.flatnonzero(bad)[:10].tolist()} hold NaN or infinite values: the model "
            f"computed no distribution to sample from"
        )


def sample_rows(logits: np.ndarray, params: list[SamplingParams], rngs: list[np.random.Generator]) -> np.ndarray:
    """Row b's next token from `logits[b]` (B, V) with `params[b]` and one uniform number from `rngs[b]` (none when
    greedy), as the engine picks it."""
    check_finite(logits)
    return sample_groups(logits, [shared(p) for p in params], draw_uniforms(params, rngs))


def sample_next(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> np.ndarray:
    """`sample_rows` with one setting and one RNG for every row (the rows draw from it in order)."""
    return sample_rows(logits, [params] * len(logits), [rng] * len(logits))
