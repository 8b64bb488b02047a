"""The demo's attention view and page, without a server."""

from __future__ import annotations

import re

import numpy as np
import pytest

from demo.attention import (
    EARLIER,
    VIEW_POSITIONS,
    axis_text,
    colormap,
    colour_index,
    prompt_attention,
    render_heads,
    shown_weights,
)
from gpt_serve.generation.fields import MAX_NEW_TOKENS
from gpt_serve.serving.registry import ModelRegistry


def test_prompt_attention_is_causal_and_normalized(registry):
    loaded = registry.backend("tiny", "torch")
    weights = prompt_attention(loaded.backend.pretrained, loaded.vocab.encode("First Citizen:\nBefore we proceed"))
    assert weights.shape == (2, 4, 16, 16)  # (layers, heads, T, T): the last block_size = 16 characters
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(weights, k=1) == 0)


def random_weights(n_head: int, T: int, seed: int = 0) -> np.ndarray:
    weights = np.tril(np.random.default_rng(seed).random((n_head, T, T))).astype(np.float32)
    return weights / weights.sum(-1, keepdims=True)


def cells(view: str) -> list[tuple[str, str]]:
    """(colour, title) of every visible cell of a view's HTML, in order."""
    return re.findall(r'<i style="background:(#[0-9a-f]{6})" title="([^"]*)"></i>', view)


def test_a_map_per_head_its_cells_coloured_and_titled_by_weight():
    weights = random_weights(6, 5)
    view = render_heads(weights, "ab\n c")
    assert view.count('<figure class="attn-head">') == 6 and "head 5</figcaption>" in view
    shown = cells(view)
    assert len(shown) == 6 * 15 and view.count("<b></b>") == 6 * 10  # lower triangle visible, the rest masked
    first_head = np.asarray(weights[0])[np.tril_indices(5)]
    assert [title for _, title in shown[:15]] == [f"{w:.3f}".lstrip("0") for w in first_head]
    assert [colour for colour, _ in shown[:15]] == list(colormap()[colour_index(first_head)])
    with pytest.raises(ValueError, match="shape \\(n_head, T, T\\)"):
        render_heads(weights[0], "ab\n c")
    with pytest.raises(ValueError, match="chars must be the 5 characters"):
        render_heads(weights, "abc")


def test_the_colour_scale_and_the_readout_line_are_under_the_maps():
    view = render_heads(random_weights(1, 3), "abc")
    assert view.index("attn-heads") < view.index("attn-readout") < view.index("attn-scale")
    assert "colour = √weight" in view and "masked (future)" in view
    assert 'left:50.0%">.25</span>' in view  # weight .25 sits half way along a bar of √weight


def test_the_characters_label_both_axes_newlines_and_spaces_visibly_and_escaped():
    assert axis_text("a\n b\t") == "a↵·b→"
    view = render_heads(random_weights(1, 4), "<\n &")
    header = re.search(r"<span></span>(.*?)<span class=\"odd\">&lt;</span><i", view)  # the first row's label
    assert header and re.sub("<[^>]+>", "", header.group(1)) == "&lt;↵·&amp;"
    assert "<\n" not in view


def test_a_long_prompt_shows_its_last_positions_and_sums_the_earlier_keys():
    weights = random_weights(2, 128)
    shown, start = shown_weights(weights)
    assert start == 128 - VIEW_POSITIONS and shown.shape == (2, VIEW_POSITIONS, VIEW_POSITIONS + 1)
    np.testing.assert_allclose(shown.sum(-1), 1.0, atol=1e-5)  # every row still sums to 1
    np.testing.assert_allclose(shown[:, :, 0], weights[:, start:, :start].sum(-1), atol=1e-6)
    view = render_heads(weights, "x" * 96 + "abcdefghijklmnopqrstuvwxyzABCDEF")
    grid = re.search(r'data-start="96" style="--n:33">(.*?)</div>', view).group(1)
    labels = re.findall(r"<span[^>]*>([^<]*)</span>", grid)  # the corner, the keys, then a label per query
    assert labels == ["", EARLIER, *"abcdefghijklmnopqrstuvwxyzABCDEF", *"abcdefghijklmnopqrstuvwxyzABCDEF"]
    assert len(cells(view)) == 2 * sum(i + 2 for i in range(32))  # the summed column, then keys 96..query
    longer = render_heads(random_weights(2, 512), "x" * 512)
    assert len(longer) < 1.05 * len(view) < 2 * 35_000  # the size of the view stops growing with the prompt


def test_build_demo_with_defaults_loads_nothing(registry):
    from demo.app import build_demo

    fresh = ModelRegistry(registry.folders, threads=1)
    blocks = build_demo(fresh)
    assert blocks.handlers.default_model == "ladder-a" and blocks.handlers.default_backend == "torch"
    assert blocks.handlers.max_tokens_limit == MAX_NEW_TOKENS  # the request specification's
    assert not any(fresh.is_loaded(name, "torch") for name in fresh.available)
