"""The attention view: the prompt's per-head attention weights, drawn as HTML heat maps (matplotlib's viridis
colours), one grid of cells per head, with a readout of the weight under the pointer.

Row t of head h's map is where query position t looks: weights over key positions 0..t (the "communication" of
the lesson's self-attention), lower-triangular, summing to 1. Whatever the prompt's length, a map shows at most the
last `VIEW_POSITIONS` positions, each labelled with its character on both axes (query down, key across); a longer
window's earlier keys are summed into one first column ("…"), so every row still sums to 1. Every cell's `title`
is its weight, and hovering (or tapping) a cell says its head, query, key and weight in the readout line under the
maps. Plain HTML: no image to load lazily, no image buttons over the maps, and on a narrow screen the heads scroll
sideways (`VIEW_CSS`) instead of shrinking.

Colours are set inline; text and the masked (future) cells use the page's theme colours, so the maps suit light
and dark pages.
"""

from __future__ import annotations

import functools
import html

import numpy as np

VIEW_POSITIONS = 32  # the most positions a map shows (and labels): the last ones
DENSE_LABELS = 16  # past this many columns, a narrow screen labels every other position
SCALE_TICKS = {0: "0", 0.05: ".05", 0.25: ".25", 0.5: ".5", 1: "1"}  # weight -> its label on the colour scale
VISIBLE = {"\n": "↵", " ": "·", "\t": "→"}  # characters that would draw as nothing
READOUT_HINT = "Hover over (or tap) a cell to read its weight."
EARLIER = "…"  # the label of the column that sums the keys before the shown positions

# Scoped to the view's component (gr.HTML's css_template): a map's cells are a CSS grid of square cells as wide as the
# head's box allows, at most 22 px, in whole pixels (fractional rows leave 1-pixel seams between some of them); on a
# narrow screen the heads scroll sideways, each ~90% of the width.
VIEW_CSS = """
.attn-heads {display: grid; grid-template-columns: repeat(3, minmax(0, 1fr)); gap: 14px 18px;}
.attn-head {margin: 0; min-width: 0; container-type: inline-size;}
.attn-head figcaption {font-size: 12px; color: var(--body-text-color-subdued); margin-bottom: 2px;}
.attn-grid {display: grid; --cell: min(22px, calc((100cqw - 12px) / var(--n)));
  grid-template-columns: 12px repeat(var(--n), var(--cell)); grid-auto-rows: var(--cell);
  font: 10px/1 ui-monospace, SFMono-Regular, Menlo, monospace; color: var(--body-text-color-subdued);}
@supports (width: round(down, 10.5px, 1px)) {
  .attn-grid {--cell: min(22px, round(down, calc((100cqw - 12px) / var(--n)), 1px));}
}
.attn-grid > * {display: flex; align-items: center; justify-content: center; overflow: hidden;}
.attn-grid > i {font-style: normal;}
.attn-grid > b {background: color-mix(in srgb, var(--body-text-color-subdued) 22%, transparent);}
.attn-grid > i:hover, .attn-grid > i.on {outline: 2px solid var(--body-text-color); outline-offset: -1px;}
.attn-readout {min-height: 1.4em; margin: 8px 0 4px; font-size: 13px;}
.attn-scale {display: flex; flex-wrap: wrap; align-items: flex-start; gap: 6px 20px; font-size: 11px;
  color: var(--body-text-color-subdued);}
.attn-bar, .attn-ticks {width: 192px; margin-right: 8px;}
.attn-bar {height: 10px; margin-top: 3px;}
.attn-ticks {position: relative; height: 15px;}
.attn-ticks span {position: absolute; top: 1px; transform: translateX(-50%);}
.attn-swatch {display: inline-block; width: 10px; height: 10px; vertical-align: middle; margin-right: 4px;
  background: color-mix(in srgb, var(--body-text-color-subdued) 22%, transparent);}
@media (max-width: 720px) {
  .attn-heads {display: flex; overflow-x: auto; scroll-snap-type: x mandatory; padding-bottom: 6px;}
  .attn-head {flex: 0 0 88%; scroll-snap-align: start;}
  .attn-grid.dense .odd {visibility: hidden;}
}
"""
# The readout: what the cell under the pointer (or the last one tapped) is, from its place in its map's grid (a
# header row of key labels, then per query its label and its cells) and its title (the weight). Listens on the
# component's element, which outlives the maps it shows (each update replaces them).
VIEW_JS = """
const show = (event) => {
  const cell = event.target.closest && event.target.closest(".attn-grid > i");
  const readout = element.querySelector(".attn-readout");
  if (!cell || !readout) return;
  const grid = cell.parentElement, n = Number(grid.dataset.n), start = Number(grid.dataset.start);
  const index = Array.prototype.indexOf.call(grid.children, cell);
  const row = Math.floor(index / (n + 1)) - 1, col = (index % (n + 1)) - 1;
  const label = (i) => grid.children[i].textContent;
  const query = `${start + row} “${label((row + 1) * (n + 1))}”`;
  const key = start && col === 0
    ? `keys 0–${start - 1} (summed)`
    : `${start + col - (start ? 1 : 0)} “${label(col + 1)}”`;
  element.querySelectorAll(".attn-grid > i.on").forEach((c) => c.classList.remove("on"));
  cell.classList.add("on");
  readout.textContent = `head ${grid.dataset.head} · query ${query} → key ${key}: weight ${cell.title}`;
};
element.addEventListener("pointerover", show);
element.addEventListener("click", show);
"""


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


@functools.cache
def colormap() -> np.ndarray:
    """matplotlib's viridis as 256 '#rrggbb' colours, (256,) str, computed once, on the first view drawn (no figure
    is ever drawn; a torch-free demo, which has no attention view, needs no matplotlib)."""
    import matplotlib

    rgb = (matplotlib.colormaps["viridis"](np.linspace(0, 1, 256))[:, :3] * 255).round().astype(np.uint8)
    return np.array([f"#{r:02x}{g:02x}{b:02x}" for r, g, b in rgb])


def colour_index(weights: np.ndarray, gamma: float = 0.5) -> np.ndarray:
    """Weights in [0, 1] -> indices into `colormap()` of weight**gamma. gamma < 1 lifts small weights, which are most
    of them once the prompt is longer than a few characters."""
    return np.clip(np.rint(np.clip(weights, 0, 1) ** gamma * 255), 0, 255).astype(np.intp)


def shown_weights(weights: np.ndarray, positions: int = VIEW_POSITIONS) -> tuple[np.ndarray, int]:
    """(n_head, T, T) weights -> (what the maps show, the first shown position s): the last n = min(T, positions)
    queries, (n_head, n, n) over the last n keys, or (n_head, n, n + 1) when s > 0, the first column then holding
    each query's total weight on keys 0..s-1."""
    T = weights.shape[-1]
    start = max(0, T - positions)
    shown = weights[:, start:, start:]
    if start:
        shown = np.concatenate([weights[:, start:, :start].sum(-1, keepdims=True), shown], axis=-1)
    return shown, start


def render_heads(weights: np.ndarray, chars: str, positions: int = VIEW_POSITIONS, gamma: float = 0.5) -> str:
    """One layer's weights (n_head, T, T) and the T characters the view read -> the view's HTML: a heat map per
    head (the last `positions` positions, see `shown_weights`), a readout line and a colour scale."""
    if weights.ndim != 3 or weights.shape[1] != weights.shape[2]:
        raise ValueError(f"weights must have shape (n_head, T, T), got {weights.shape}")
    H, T, _ = weights.shape
    if len(chars) != T:
        raise ValueError(f"chars must be the {T} characters of the view, got {len(chars)}: {chars!r}")
    shown, start = shown_weights(weights, positions)
    text = axis_text(chars)
    labels = ([EARLIER] if start else []) + list(text[start:])
    n, queries = len(labels), T - start
    # every other label counted back from the last position, hidden on a narrow screen if there are many (VIEW_CSS)
    odd = [' class="odd"' if (n - 1 - j) % 2 else "" for j in range(n)]
    header = "<span></span>" + "".join(f"<span{odd[j]}>{html.escape(c)}</span>" for j, c in enumerate(labels))
    colours = colormap()[colour_index(shown, gamma)]
    dense = " dense" if n > DENSE_LABELS else ""
    titles = np.char.lstrip(np.char.mod("%.3f", shown), "0")  # a cell's title: its weight, '.125'
    heads = []
    for h in range(H):
        rows = []
        for i in range(queries):
            seen = i + 1 + (1 if start else 0)  # the cells this query can see: the summed one, keys start..start+i
            cells = "".join(
                f'<i style="background:{colours[h, i, j]}" title="{titles[h, i, j]}"></i>' for j in range(seen)
            )
            rows.append(
                f"<span{odd[i + n - queries]}>{html.escape(text[start + i])}</span>{cells}{'<b></b>' * (n - seen)}"
            )
        heads.append(
            f'<figure class="attn-head"><figcaption>head {h}</figcaption><div class="attn-grid{dense}" data-head="{h}" '
            f'data-n="{n}" data-start="{start}" style="--n:{n}">{header}{"".join(rows)}</div></figure>'
        )
    return (
        f'<div class="attn-view"><div class="attn-heads">{"".join(heads)}</div>'
        f'<div class="attn-readout" aria-live="polite">{READOUT_HINT}</div>{_scale(gamma)}</div>'
    )


def _scale(gamma: float) -> str:
    """The colour scale: a bar of the colours with weight ticks at weight**gamma, and the masked swatch."""
    colour = "√weight" if gamma == 0.5 else f"weight^{gamma:g}"
    stops = ", ".join(colormap()[np.linspace(0, 255, 9).round().astype(np.intp)])
    ticks = "".join(f'<span style="left:{w**gamma * 100:.1f}%">{label}</span>' for w, label in SCALE_TICKS.items())
    return (
        f'<div class="attn-scale"><div>attention weight (colour = {colour})'
        f'<div class="attn-bar" style="background:linear-gradient(to right, {stops})"></div>'
        f'<div class="attn-ticks">{ticks}</div></div><div><span class="attn-swatch"></span>masked (future)</div></div>'
    )
