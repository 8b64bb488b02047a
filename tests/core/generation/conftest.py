"""A numpy fake backend for the engine's unit tests: no torch, no files."""

from __future__ import annotations

import numpy as np
import pytest


class FakeBackend:
    """Logits that depend on every real token in the window and on its positions, computed from the cache.

    The cache is the (B, S) ids and mask of the columns seen so far, so the fake checks the engine's contract at
    every call (mask over past + new columns, positions inside the window) and a wrong window changes the tokens.
    """

    def __init__(self, block_size: int = 8, vocab_size: int = 11):
        self.block_size, self.vocab_size = block_size, vocab_size
        self.calls: list[tuple[int, int]] = []  # (cached columns, new columns) per forward

    def logits_of(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(B, V) from a window's ids and mask: a deterministic mix of its real tokens and their positions."""
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        score = ((ids * (positions + 3) * mask).sum(axis=1) * 7 + mask.sum(axis=1)) % self.vocab_size
        return np.eye(self.vocab_size, dtype=np.float32)[score] * 5.0 + np.linspace(0, 1, self.vocab_size)

    def forward(self, input_ids, attention_mask, position_ids, cache):
        past_ids, past_mask = cache if cache is not None else (input_ids[:, :0], attention_mask[:, :0])
        B, T = input_ids.shape
        assert attention_mask.shape == (B, past_ids.shape[1] + T), "the mask covers cached and new columns"
        assert position_ids.shape == (B, T) and 0 <= position_ids.min() and position_ids.max() < self.block_size
        assert attention_mask.shape[1] <= self.block_size, "the window never outgrows block_size"
        np.testing.assert_array_equal(attention_mask[:, : past_ids.shape[1]], past_mask)
        self.calls.append((past_ids.shape[1], T))
        ids = np.concatenate([past_ids, input_ids], axis=1)
        return self.logits_of(ids, attention_mask), (ids, attention_mask)


@pytest.fixture
def fake():
    return FakeBackend()
