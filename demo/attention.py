"""The attention view: the prompt's per-head attention weights, drawn as heat maps (matplotlib's viridis colormap).

Row t of head h's map is where query position t looks: weights over key positions 0..t (the "communication" of
the lesson's self-attention), lower-triangular, summing to 1. The prompt's characters label both axes (query
down, key across; every k-th one when they don't fit), and a colour scale says what a colour means. A lookup into
matplotlib's colormap and a few PIL text draws are several times cheaper than a matplotlib figure (docs/benchmarks.md,
"Figures behind design choices"), so the view can follow every generation without slowing the stream.

The image is RGBA on a transparent background, so it sits on the page's own background in light and dark themes:
text is mid grey, and masked (future) positions are a translucent grey.
"""

from __future__ import annotations

import functools
import math
import os

import matplotlib
import numpy as np

# matplotlib's viridis as a 256-entry RGBA lookup table, computed once (no figure is ever drawn)
COLORMAP = (matplotlib.colormaps["viridis"](np.linspace(0, 1, 256)) * 255).round().astype(np.uint8)  # (256, 4)
FUTURE = np.array([128, 128, 128, 72], dtype=np.uint8)  # keys a query cannot see (above the diagonal)
TEXT = (128, 128, 128, 255)  # readable on a light and on a dark page
TILE_PX = 192  # a head's map is scaled up (nearest neighbour) to at least this many pixels
FONT_PX = 11
LINE_PX = 14  # one line of text: a head's title, the key labels, the colour scale's labels
AXIS_PX = 12  # the query labels' column, left of each map
LABEL_GAP_PX = 12  # the least distance between two labels: past it, only every k-th character is labelled
LABEL_PAD_PX = 6  # how far the first and last labels may overhang the map's edges (half a character)
GAP_PX = 10
SCALE_PX = (192, 10)  # the colour scale's bar (width, height)
SCALE_H = 2 * LINE_PX + SCALE_PX[1] + 5  # its title, the bar, its ticks and their labels
SCALE_TICKS = {0: "0", 0.05: ".05", 0.25: ".25", 0.5: ".5", 1: "1"}  # weight -> its label
MASKED = "masked (future)"
VISIBLE = {"\n": "↵", " ": "·", "\t": "→"}  # characters that would draw as nothing


def prompt_attention(model, ids: list[int]) -> np.ndarray:
    """Attention weights (n_layer, n_head, T, T) of `model` on the last `block_size` ids of a prompt, float32."""
    import torch

    ids = list(ids)[-model.config.block_size :]
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), output_attentions=True, use_cache=False)
    return np.stack([layer[0].float().cpu().numpy() for layer in out.attentions])  # (L, H, T, T)


def axis_text(chars: str) -> str:
    """The characters as the axes show them: newline ↵, space ·, tab →."""
    return "".join(VISIBLE.get(c, c) for c in chars)


def label_step(T: int) -> int:
    """Every how many positions an axis gets a label: 1 while the characters fit (T <= 16), 6 at T = 128."""
    return math.ceil(LABEL_GAP_PX / _cell_px(T))


def colorize(weights: np.ndarray, gamma: float = 0.5) -> np.ndarray:
    """(..., T, T) weights in [0, 1] -> (..., T, T, 4) uint8 RGBA: colormap of weight**gamma, future keys grey.

    gamma < 1 lifts small weights, which are most of them once the prompt is longer than a few characters.
    """
    T = weights.shape[-1]
    rgba = COLORMAP[_color_index(np.clip(weights, 0, 1), gamma)]
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    rgba[..., future, :] = FUTURE
    return rgba


def render_heads(weights: np.ndarray, chars: str | None = None, max_columns: int = 3, gamma: float = 0.5) -> np.ndarray:
    """One layer's weights (n_head, T, T) -> an RGBA image (height, width, 4) uint8, transparent background: a grid
    of heat maps titled by head, query positions down and key positions across, both labelled with `chars` (the T
    characters the view read, if given), and a colour scale below."""
    from PIL import Image, ImageDraw

    if weights.ndim != 3 or weights.shape[1] != weights.shape[2]:
        raise ValueError(f"weights must have shape (n_head, T, T), got {weights.shape}")
    H, T, _ = weights.shape
    if chars is not None and len(chars) != T:
        raise ValueError(f"chars must be the {T} characters of the view, got {len(chars)}: {chars!r}")
    cell = _cell_px(T)
    side = T * cell
    tiles = colorize(weights, gamma).repeat(cell, axis=1).repeat(cell, axis=2)  # (H, T*cell, T*cell, 4)
    cols = min(H, max_columns)
    rows = math.ceil(H / cols)
    block_w, block_h = AXIS_PX + side, 2 * LINE_PX + side  # a head: title, key labels, then query labels | map
    grid_w = cols * block_w + (cols + 1) * GAP_PX
    scale_w = AXIS_PX + sum(SCALE_PX) + 4 * GAP_PX + round(_font().getlength(MASKED))  # the bar, a swatch, its text
    grid_h = rows * block_h + (rows + 1) * GAP_PX
    canvas = np.zeros((grid_h + SCALE_H + GAP_PX, max(grid_w, GAP_PX + scale_w), 4), dtype=np.uint8)  # transparent
    origins = []
    for h in range(H):
        r, c = divmod(h, cols)
        x, y = GAP_PX + c * (block_w + GAP_PX), GAP_PX + r * (block_h + GAP_PX)
        canvas[y + 2 * LINE_PX : y + block_h, x + AXIS_PX : x + block_w] = tiles[h]
        origins.append((x, y))
    image = Image.fromarray(canvas, "RGBA")
    draw = ImageDraw.Draw(image)
    font = _font()
    if chars is not None:
        keys, queries = _axis_strips(axis_text(chars), cell)
    for h, (x, y) in enumerate(origins):
        draw.text((x + AXIS_PX, y), f"head {h}", fill=TEXT, font=font)
        if chars is not None:
            image.alpha_composite(keys, (x + AXIS_PX - LABEL_PAD_PX, y + LINE_PX))
            image.alpha_composite(queries, (x, y + 2 * LINE_PX - LABEL_PAD_PX))
    _draw_scale(image, draw, GAP_PX + AXIS_PX, grid_h, gamma)
    return np.asarray(image)


def _cell_px(T: int) -> int:
    return max(1, math.ceil(TILE_PX / T))


def _color_index(weights: np.ndarray, gamma: float) -> np.ndarray:
    return np.clip(np.rint(weights**gamma * 255), 0, 255).astype(np.intp)


@functools.cache
def _font():
    """DejaVu Sans Mono, which matplotlib ships (so ↵ and · have glyphs on every machine)."""
    from PIL import ImageFont

    return ImageFont.truetype(os.path.join(matplotlib.get_data_path(), "fonts", "ttf", "DejaVuSansMono.ttf"), FONT_PX)


def _axis_strips(text: str, cell: int):
    """(key labels across, query labels down) as transparent images, drawn once and pasted beside every head; each
    reaches `LABEL_PAD_PX` past the map's ends, where the first and last labels overhang. Labels count back from the
    last position, so the newest character always has one; when only every k-th fits, a tick marks its place."""
    from PIL import Image, ImageDraw

    T, step, font, pad = len(text), label_step(len(text)), _font(), LABEL_PAD_PX
    keys = Image.new("RGBA", (T * cell + 2 * pad, LINE_PX))
    queries = Image.new("RGBA", (AXIS_PX, T * cell + 2 * pad))
    key_draw, query_draw = ImageDraw.Draw(keys), ImageDraw.Draw(queries)
    for i in range(T - 1, -1, -step):
        middle = pad + i * cell + cell / 2
        key_draw.text((middle, LINE_PX - 4), text[i], fill=TEXT, font=font, anchor="ms")
        query_draw.text((AXIS_PX - 4, middle), text[i], fill=TEXT, font=font, anchor="rm")
        if step > 1:
            key_draw.line([(middle, LINE_PX - 2), (middle, LINE_PX - 1)], fill=TEXT)
            query_draw.line([(AXIS_PX - 2, middle), (AXIS_PX - 1, middle)], fill=TEXT)
    return keys, queries


def _draw_scale(image, draw, x: int, y: int, gamma: float) -> None:
    """The colour scale at (x, y): a title, the bar with weight ticks at weight**gamma, a 'masked' swatch."""
    font = _font()
    width, height = SCALE_PX
    colour = "√weight" if gamma == 0.5 else f"weight^{gamma:g}"
    draw.text((x, y), f"attention weight (colour = {colour})", fill=TEXT, font=font)
    top = y + LINE_PX + 2
    ramp = COLORMAP[np.linspace(0, 255, width).round().astype(np.intp)]  # (width, 4): the colours left to right
    image.paste(_image(np.repeat(ramp[None], height, axis=0)), (x, top))
    for w, label in SCALE_TICKS.items():  # so weight w sits at w**gamma of the way
        at = x + round(w**gamma * (width - 1))
        draw.line([(at, top + height), (at, top + height + 2)], fill=TEXT)
        draw.text((at, top + height + 3), label, fill=TEXT, font=font, anchor="mt")
    swatch = x + width + 2 * GAP_PX
    image.alpha_composite(_image(np.broadcast_to(FUTURE, (height, height, 4))), (swatch, top))
    draw.text((swatch + height + 4, top + height / 2), MASKED, fill=TEXT, font=font, anchor="lm")


def _image(rgba: np.ndarray):
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(rgba), "RGBA")
