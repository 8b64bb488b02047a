"""The selected model's training curve: train and validation loss by step from its folder's `metrics.jsonl`, with
the lesson's ladder as reference lines when it was trained on Tiny Shakespeare, and for a fine-tuned model (its
card names a `base_model`) where the base started on the new text (the run's step-0 evaluation).

`training_curve` reads the data (`Curve`, tested without a plot); `curve_figure` draws it (matplotlib, drawn
into the page's `gr.Plot`). A folder without metrics (an imported checkpoint) gets a one-line note instead.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from gpt_serve.models import LADDER, LESSON_VAL_LOSS
from gpt_serve.serving.registry import ModelRegistry, RequestError

logger = logging.getLogger(__name__)

METRICS_FILE_NAME = "metrics.jsonl"
CARD_FILE_NAME = "README.md"
MAX_METRICS_BYTES = 8 << 20  # a 5000-step run with an evaluation every 10 steps writes about 60 kB
MAX_CARD_BYTES = 1 << 20


@dataclass(frozen=True)
class Reference:
    """A horizontal line: `label` (short: 'A', 'B'...) at `loss`; `meaning` says what it is (the legend)."""

    label: str
    loss: float
    meaning: str


@dataclass(frozen=True)
class Curve:
    """What the plot shows of `model`: `steps` with their `train` and `val` losses (None where a record lacks one),
    the `references`, the `base` model's name and its validation loss on this text at step 0 (`base_start`) for
    a fine-tuned model, and `note`: one line, what the plot shows or why there is none."""

    model: str
    steps: tuple[int, ...] = ()
    train: tuple[float | None, ...] = ()
    val: tuple[float | None, ...] = ()
    references: tuple[Reference, ...] = ()
    base: str | None = None
    base_start: float | None = None
    note: str = ""
    skipped: int = field(default=0)  # unreadable lines of metrics.jsonl (a torn last line, an edit)

    @property
    def has_plot(self) -> bool:
        return bool(self.steps)


def ladder_references() -> tuple[Reference, ...]:
    """The lesson's stages A-E, each at the validation loss the lesson reports (`gpt_serve.models.LESSON_VAL_LOSS`)."""
    return tuple(
        Reference(name[-1].upper(), LESSON_VAL_LOSS[name], LADDER[name]) for name in LADDER if name in LESSON_VAL_LOSS
    )


def reference_text(ref: Reference) -> str:
    """A reference line's label on the plot: 'A (one head) 2.40', 'B 2.28'."""
    return f"{ref.label}{' (one head)' if ref.label == 'A' else ''} {ref.loss:.2f}"


def read_metrics(path: Path) -> tuple[list[dict], int]:
    """The records of a metrics file that have a step (JSON objects, one a line), and how many lines were skipped
    (not JSON, not an object, no integer step). ValueError for a file too large to be a training's metrics."""
    size = path.stat().st_size
    if size > MAX_METRICS_BYTES:
        raise ValueError(f"{path} is {size:,} bytes, more than a training writes (at most {MAX_METRICS_BYTES:,})")
    records, skipped = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            skipped += 1
            continue
        if isinstance(record, dict) and type(record.get("step")) is int:
            records.append(record)
        else:
            skipped += 1
    return records, skipped


def _loss(record: dict, key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        return None
    return float(value)


def card_base_model(folder: Path) -> str | None:
    """The `base_model` the model card's front matter names (a fine-tuned model's: `python -m training
    --init-from`), or None: no card, no front matter, no such field, or a card that cannot be read (logged)."""
    path = folder / CARD_FILE_NAME
    try:
        if not path.is_file() or path.stat().st_size > MAX_CARD_BYTES:
            return None
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        logger.warning("cannot read %s: %s", path, e)
        return None
    if not text.startswith("---\n") or "\n---" not in text[4:]:
        return None
    try:
        front = yaml.safe_load(text[4 : text.index("\n---", 3)])
    except yaml.YAMLError as e:
        logger.warning("%s: its front matter is not YAML (%s)", path, e)
        return None
    base = front.get("base_model") if isinstance(front, dict) else None
    if isinstance(base, list) and base:  # the Hub allows a list
        base = base[0]
    if not isinstance(base, str) or not base.strip():
        return None
    return base.strip()


def training_curve(registry: ModelRegistry, model: str) -> Curve:
    """The curve of `model` as its folder records it (`Curve`); a model without one gets a note saying why."""
    try:
        folder = Path(registry.folder(model))
    except RequestError as e:
        return Curve(str(model), note=f"No training curve: {e}")
    path = folder / METRICS_FILE_NAME
    if not path.is_file():
        return Curve(
            model, note=f"No training curve: `{model}`'s folder has no {METRICS_FILE_NAME} (not trained here)."
        )
    try:
        records, skipped = read_metrics(path)
    except (OSError, ValueError) as e:
        return Curve(model, note=f"No training curve: {e}")
    if not records:
        return Curve(model, note=f"No training curve: `{model}`'s {METRICS_FILE_NAME} holds no evaluation.")
    records.sort(key=lambda r: r["step"])
    record = registry.corpus(model)
    references = ladder_references() if record is not None and record.is_tiny_shakespeare else ()
    base = card_base_model(folder)
    start = next((r for r in records if r["step"] == 0), None) if base else None
    base_start = _loss(start, "val_loss") if start is not None else None
    curve = Curve(
        model,
        steps=tuple(r["step"] for r in records),
        train=tuple(_loss(r, "train_loss") for r in records),
        val=tuple(_loss(r, "val_loss") for r in records),
        references=references,
        base=base,
        base_start=base_start,
        skipped=skipped,
    )
    return replace(curve, note=curve_note(curve))


def curve_note(curve: Curve) -> str:
    """The line under the plot: the last validation loss, the base's start, the reference lines."""
    vals = [(s, v) for s, v in zip(curve.steps, curve.val) if v is not None]
    parts = [f"`{curve.model}`: {len(curve.steps)} evaluations"]
    if vals:
        parts.append(f"validation loss {vals[-1][1]:.3f} at step {vals[-1][0]:,}")
    if curve.base is not None:
        start = f"started at {curve.base_start:.3f} on this text" if curve.base_start is not None else "no step-0 loss"
        parts.append(f"fine-tuned from `{curve.base}` ({start})")
    if curve.references:
        parts.append("dotted: the lesson's ladder, A (one head) to E")
    if curve.skipped:
        parts.append(
            f"{curve.skipped} unreadable line{'s' if curve.skipped > 1 else ''} of {METRICS_FILE_NAME} skipped"
        )
    return " · ".join(parts) + "."


def y_range(curve: Curve) -> tuple[float, float]:
    """The loss axis: from below the lowest loss or reference line to the highest loss, cut at 3.0 when most
    evaluations are below it (a run's first loss, ~4.2 from scratch, would flatten the rest)."""
    losses = [v for v in (*curve.train, *curve.val) if v is not None]
    lines = [r.loss for r in curve.references] + ([curve.base_start] if curve.base_start is not None else [])
    if not losses:
        return 0.0, 1.0
    low, high = min(losses + lines), max(losses + lines)
    if sum(v < 3.0 for v in losses) > len(losses) / 2:
        high = min(high, 3.0)
    pad = 0.06 * (high - low) + 0.02  # room for a reference line's label above it
    return low - pad, high + 2 * pad


def curve_update(registry: ModelRegistry, model):
    """Another model chosen (or the page opened): its plot (hidden when it has no curve) and its line."""
    import gradio as gr

    curve = training_curve(registry, model) if isinstance(model, str) else Curve(str(model), note="No model chosen.")
    return gr.Plot(curve_figure(curve), visible=curve.has_plot), curve.note


def curve_figure(curve: Curve):
    """The curve as a matplotlib Figure (no pyplot: each call its own figure), or None when there is no curve."""
    if not curve.has_plot:
        return None
    from matplotlib.figure import Figure

    # small and with large type: a phone shows it about 330 px wide
    fig = Figure(figsize=(4.8, 3.4), dpi=100, layout="constrained")
    ax = fig.subplots()
    ax.tick_params(labelsize=10)
    for values, label, style in ((curve.train, "train", "-"), (curve.val, "validation", "-")):
        points = [(s, v) for s, v in zip(curve.steps, values) if v is not None]
        if points:
            ax.plot(*zip(*points), style, marker=".", label=label)
    for i, ref in enumerate(curve.references):
        ax.axhline(ref.loss, color="0.45", linestyle=":", linewidth=1)
        side = (0.01, "left") if i % 2 == 0 else (0.99, "right")  # B/C and D/E are close: alternate the sides
        ax.text(side[0], ref.loss, reference_text(ref), transform=ax.get_yaxis_transform(), ha=side[1],
                va="bottom", fontsize=9, color="0.3")  # fmt: skip
    if curve.base_start is not None:
        ax.axhline(curve.base_start, color="C3", linestyle="--", linewidth=1)
        ax.plot([0], [curve.base_start], "*", color="C3", markersize=11, label=f"{curve.base} (base) at step 0")
    ax.set_ylim(*y_range(curve))
    ax.set_xlabel("step", fontsize=10)
    ax.set_ylabel("loss (nats/char)", fontsize=10)
    ax.grid(alpha=0.3)
    entries = len(ax.get_legend_handles_labels()[0])
    # below the plot (the lines' labels stay free), two a row when the base is one: a phone shows the figure narrow
    if entries:
        fig.legend(fontsize=10, loc="outside lower center", ncols=min(entries, 2), frameon=False)
    return fig
