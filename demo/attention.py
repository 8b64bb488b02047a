"""The attention view: the prompt's per-head attention weights, drawn as heat maps (matplotlib's viridis colormap).

Row t of head h's map is where query position t looks: weights over key positions 0..t (the "communication" of
the lesson's self-attention), lower-triangular, summing to 1. A lookup into matplotlib's colormap takes a few
milliseconds, so the view can follow every generation without slowing the stream (a matplotlib figure takes
~150 ms).
"""

from __future__ import annotations

import math

import matplotlib
import numpy as np

# matplotlib's viridis as a 256-entry RGB lookup table, computed once (no figure is ever drawn)
COLORMAP = (matplotlib.colormaps["viridis"](np.linspace(0, 1, 256))[:, :3] * 255).round().astype(np.uint8)  # (256, 3)
FUTURE = np.array([236, 236, 240], dtype=np.uint8)  # keys a query cannot see (above the diagonal)
BACKGROUND = (255, 255, 255)
TILE_PX = 192  # a head's map is scaled up (nearest neighbour) to at least this many pixels
LABEL_PX = 16
GAP_PX = 10


def prompt_attention(model, ids: list[int]) -> np.ndarray:
    """Attention weights (n_layer, n_head, T, T) of `model` on the last `block_size` ids of a prompt, float32."""
    import torch

    ids = list(ids)[-model.config.block_size :]
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), output_attentions=True, use_cache=False)
    return np.stack([layer[0].float().cpu().numpy() for layer in out.attentions])  # (L, H, T, T)


def colorize(weights: np.ndarray, gamma: float = 0.5) -> np.ndarray:
    """(..., T, T) weights in [0, 1] -> (..., T, T, 3) uint8: colormap of weight**gamma, future keys grey.

    gamma < 1 lifts small weights, which are most of them once the prompt is longer than a few characters.
    """
    T = weights.shape[-1]
    index = np.clip(np.rint(np.clip(weights, 0, 1) ** gamma * 255), 0, 255).astype(np.intp)
    rgb = COLORMAP[index]
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    rgb[..., future, :] = FUTURE
    return rgb


def render_heads(weights: np.ndarray, max_columns: int = 3, gamma: float = 0.5) -> np.ndarray:
    """One layer's weights (n_head, T, T) -> an RGB image (height, width, 3) uint8: a grid of labelled heat maps,
    query positions down, key positions across."""
    from PIL import Image, ImageDraw

    if weights.ndim != 3 or weights.shape[1] != weights.shape[2]:
        raise ValueError(f"weights must have shape (n_head, T, T), got {weights.shape}")
    H, T, _ = weights.shape
    scale = max(1, math.ceil(TILE_PX / T))
    tiles = colorize(weights, gamma).repeat(scale, axis=1).repeat(scale, axis=2)  # (H, T*s, T*s, 3)
    side = T * scale
    cols = min(H, max_columns)
    rows = math.ceil(H / cols)
    width = cols * side + (cols + 1) * GAP_PX
    height = rows * (side + LABEL_PX) + (rows + 1) * GAP_PX
    canvas = np.full((height, width, 3), BACKGROUND, dtype=np.uint8)
    origins = []
    for h in range(H):
        r, c = divmod(h, cols)
        x = GAP_PX + c * (side + GAP_PX)
        y = GAP_PX + r * (side + LABEL_PX + GAP_PX)
        canvas[y + LABEL_PX : y + LABEL_PX + side, x : x + side] = tiles[h]
        origins.append((x, y))
    image = Image.fromarray(canvas)
    draw = ImageDraw.Draw(image)
    for h, (x, y) in enumerate(origins):
        draw.text((x, y + 1), f"head {h}", fill=(40, 40, 40))
    return np.asarray(image)
