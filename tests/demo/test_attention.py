"""The demo's attention view and page, without a server."""

from __future__ import annotations

import numpy as np
import pytest

from demo.attention import (
    AXIS_PX,
    COLORMAP,
    FUTURE,
    GAP_PX,
    LINE_PX,
    SCALE_H,
    axis_text,
    colorize,
    label_step,
    prompt_attention,
    render_heads,
)
from gpt_serve.generation.registry import ModelRegistry
from gpt_serve.generation.spec import MAX_NEW_TOKENS


def test_prompt_attention_is_causal_and_normalized(registry):
    loaded = registry.backend("tiny", "torch")
    weights = prompt_attention(loaded.backend.pretrained, loaded.vocab.encode("First Citizen:\nBefore we proceed"))
    assert weights.shape == (2, 4, 16, 16)  # (layers, heads, T, T): the last block_size = 16 characters
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(weights, k=1) == 0)


def random_weights(n_head: int, T: int, seed: int = 0) -> np.ndarray:
    weights = np.tril(np.random.default_rng(seed).random((n_head, T, T))).astype(np.float32)
    return weights / weights.sum(-1, keepdims=True)


def test_heat_maps_grid_masked_future_and_transparent_background():
    weights = random_weights(6, 5)
    image = render_heads(weights)
    assert image.dtype == np.uint8 and image.shape[2] == 4  # RGBA
    assert image.shape[1] > image.shape[0]  # 6 heads: 3 columns, 2 rows
    with pytest.raises(ValueError, match="shape \\(n_head, T, T\\)"):
        render_heads(weights[0])
    assert (image == FUTURE).all(axis=-1).any()  # the masked upper triangle is drawn translucent grey
    assert image[0, 0, 3] == 0 and image[-1, -1, 3] == 0  # the background is transparent (light and dark pages)
    assert 0 < FUTURE[3] < 255


def test_the_colour_scale_is_drawn_below_the_maps():
    weights = np.tril(np.full((1, 4, 4), 0.5, dtype=np.float32))  # no weight 0 or 1 in the map itself
    below = render_heads(weights)[-(SCALE_H + GAP_PX) :]
    for end in (COLORMAP[0], COLORMAP[255], FUTURE):  # weight 0, weight 1, the masked swatch
        assert (below == end).all(axis=-1).any()
    # along the bar, the colour of weight 0.25 (√ = 0.5) sits half way, where its tick is
    row, start = np.argwhere((below == COLORMAP[0]).all(-1))[0]
    stop = np.argwhere((below[row] == COLORMAP[255]).all(-1))[0, 0]
    middle = below[row, (start + stop + 1) // 2]
    assert (middle == colorize(np.full((1, 1), 0.25))[0, 0]).all()


def test_the_characters_label_both_axes_newlines_and_spaces_visibly():
    assert axis_text("a\n b\t") == "a↵·b→"
    weights = random_weights(2, 4)
    plain, labelled = render_heads(weights), render_heads(weights, "ab\n ")
    assert plain.shape == labelled.shape
    rows, cols = np.nonzero((plain != labelled).any(axis=-1))  # where the labels are drawn
    assert cols.min() < GAP_PX + AXIS_PX and rows.min() < GAP_PX + 2 * LINE_PX  # left of the first map, above it
    assert not np.array_equal(labelled, render_heads(weights, "ab  "))  # ↵ is not ·
    with pytest.raises(ValueError, match="chars must be the 4 characters"):
        render_heads(weights, "abc")


def test_long_prompts_get_every_kth_character_labelled():
    assert [label_step(T) for T in (6, 16, 32, 64, 128)] == [1, 1, 2, 4, 6]
    image = render_heads(random_weights(6, 128), "x" * 128)
    assert image.shape[1] < 1000  # three 256-pixel maps across, still readable on a page


def test_build_demo_with_defaults_loads_nothing(registry):
    from demo.app import build_demo

    fresh = ModelRegistry(registry.folders, threads=1)
    blocks = build_demo(fresh)
    assert blocks.handlers.default_model == "ladder-a" and blocks.handlers.default_backend == "torch"
    assert blocks.handlers.limits.max_new_tokens == MAX_NEW_TOKENS  # the request specification's
    assert not any(fresh.is_loaded(name, "torch") for name in fresh.available)
