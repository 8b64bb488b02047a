"""The demo's attention view and page, without a server."""

from __future__ import annotations

import numpy as np
import pytest

from demo.attention import FUTURE, prompt_attention, render_heads
from gpt_serve.generation.registry import ModelRegistry


def test_prompt_attention_is_causal_and_normalized(registry):
    loaded = registry.backend("tiny", "torch")
    weights = prompt_attention(loaded.backend.pretrained, loaded.vocab.encode("First Citizen:\nBefore we proceed"))
    assert weights.shape == (2, 4, 16, 16)  # (layers, heads, T, T): the last block_size = 16 characters
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(weights, k=1) == 0)


def test_heat_maps_grid_and_masked_future():
    rng = np.random.default_rng(0)
    weights = np.tril(rng.random((6, 5, 5))).astype(np.float32)
    weights /= weights.sum(-1, keepdims=True)
    image = render_heads(weights)
    assert image.dtype == np.uint8 and image.shape[2] == 3
    assert image.shape[1] > image.shape[0]  # 6 heads: 3 columns, 2 rows
    with pytest.raises(ValueError, match="shape \\(n_head, T, T\\)"):
        render_heads(weights[0])
    assert (image == FUTURE).all(axis=-1).any()  # the masked upper triangle is drawn grey


def test_build_demo_with_defaults_loads_nothing(registry):
    from demo.app import build_demo

    fresh = ModelRegistry(registry.folders, threads=1)
    blocks = build_demo(fresh)
    assert blocks.handlers.default_model == "ladder-a" and blocks.handlers.default_backend == "torch"
    assert blocks.handlers.limits.max_new_tokens == 2000
    assert not any(fresh.is_loaded(name, "torch") for name in fresh.available)
