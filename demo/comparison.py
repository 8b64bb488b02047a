"""What the page's comparison runs side by side, and what it calls itself: the lesson's ladder, or the model's own
earlier checkpoints.

- A default model whose folder holds snapshots (`snapshots/step-NNNNNN/`, kept by `python -m training --snapshots N`:
  `gpt_serve.folders.snapshots`) is compared with them: its earlier states from the earliest, then the model itself,
  each column labelled with its step and validation loss. A snapshot that cannot run (its step record unreadable, no
  model in it, another vocabulary) keeps its column, which says why; one whose weights fail to load says so when the
  comparison runs.
- A fine-tuned default model (its card names a `base_model`) whose base is one of the served models: the base beside
  it (before its snapshots, when it has any), labelled with its validation loss on the new text before fine-tuning.
- Otherwise, the ladder: the default model and the ladder's stages A-E that share its vocabulary.
- Neither (a model trained on another text, without snapshots): no comparison on the page.

Snapshots are served by a registry of their own (`Comparison.own`): they are columns of the comparison, not models
of the server's model list or its APIs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from gpt_serve.folders.snapshots import SNAPSHOTS_DIR, StepRecord, read_step_record, snapshot_folders, snapshot_step
from gpt_serve.models import is_model_folder
from gpt_serve.serving.registry import LADDER_MODELS, ModelRegistry, RequestError

from .captions import ladder_label, ladder_legend
from .curve import card_base_model, training_curve

logger = logging.getLogger(__name__)

MAX_SNAPSHOT_COLUMNS = 7  # beside the model itself: a folder holding more shows this many, evenly spread


@dataclass(frozen=True)
class Column:
    """One column: the model `name` of `registry`, its one-line label and element id, and `problem`: why it cannot
    run, when that is known without loading it (the column shows it instead of a text)."""

    name: str
    registry: ModelRegistry
    label: str
    elem_id: str
    problem: str | None = None


@dataclass(frozen=True)
class Comparison:
    """The comparison's columns and words: `kind` 'ladder', 'base' or 'checkpoints'; `title` (the accordion's), `intro`
    (Markdown above the button), `button`; `own`: the registry serving the snapshots (closed by `close`)."""

    kind: str
    title: str
    intro: str
    button: str
    columns: tuple[Column, ...]
    own: ModelRegistry | None = None

    def close(self) -> None:
        if self.own is not None:
            self.own.close()


def compared_models(registry: ModelRegistry, default_model: str) -> list[str]:
    """The ladder comparison's columns: the default model, then the ladder's stages A-E that share its vocabulary
    (the same characters, so one prompt means the same to all). A stage not trained yet is listed (its column says
    so) when the default model was trained on the ladder's text, Tiny Shakespeare. Only the default model: no
    comparison."""
    vocab = registry.vocab_sha256(default_model)
    record = registry.corpus(default_model)
    ladder_text = record is not None and record.is_tiny_shakespeare
    columns = [default_model]
    for name in LADDER_MODELS:
        if name not in registry.names or name == default_model:
            continue
        if name not in registry.available:
            if ladder_text:
                columns.append(name)
        elif vocab is not None and registry.vocab_sha256(name) == vocab:
            columns.append(name)
    return columns


def comparison_for(registry: ModelRegistry, default_model: str) -> Comparison | None:
    """The page's comparison for `default_model`: its snapshots when its folder has any, else the ladder when a
    stage shares its vocabulary, else None."""
    try:
        folders = snapshot_folders(registry.folder(default_model))
    except RequestError:  # a missing default model: the page says so; nothing of its own to compare
        folders = []
    base = served_base(registry, default_model)
    if folders:
        return checkpoint_comparison(registry, default_model, folders, base)
    if base is not None:
        return base_comparison(registry, default_model, base)
    names = compared_models(registry, default_model)
    if len(names) < 2:
        return None
    return Comparison(
        kind="ladder",
        title="Compare the ladder: what each lesson component buys",
        intro=(
            f"Runs the prompt, seed and sampling settings above through the default model (`{default_model}`) and "
            "the stages of the lesson's ladder (A–E) that read the same characters, side by side. Set a seed to make "
            "it repeatable.  \n" + ladder_legend(names, registry)
        ),
        button="Compare the ladder",
        columns=tuple(Column(n, registry, ladder_label(n, registry), f"compare-{n}") for n in names),
    )


def served_base(registry: ModelRegistry, model: str) -> str | None:
    """The base `model` was fine-tuned from (its card's `base_model`) when the registry serves it, else None."""
    try:
        base = card_base_model(Path(registry.folder(model)))
    except RequestError:
        return None
    return base if base is not None and base != model and base in registry.available else None


def base_column(registry: ModelRegistry, model: str, base: str) -> Column:
    """The base's column: 'shakespeare · base · val loss 2.95', its loss on `model`'s text before fine-tuning."""
    start = training_curve(registry, model).base_start
    label = f"{base} · base" + (f" · val loss {start:.2f}" if start is not None else "")
    return Column(base, registry, label, f"compare-{base}")


def base_comparison(registry: ModelRegistry, model: str, base: str) -> Comparison:
    """A fine-tuned model beside the model it started from."""
    intro = (
        f"Runs the prompt, seed and sampling settings above through `{base}`, the model `{model}` was fine-tuned "
        f"from, and through `{model}` itself, side by side: what fine-tuning bought. The base's column gives its "
        "validation loss on the new text before fine-tuning (step 0); a character the base does not know is "
        "handled by the setting for unknown characters. Set a seed to make it repeatable."
    )
    columns = (
        base_column(registry, model, base),
        Column(model, registry, ladder_label(model, registry), f"compare-{model}"),
    )
    return Comparison(
        kind="base",
        title="Compare with the base model: what fine-tuning bought",
        intro=intro,
        button="Compare with the base model",
        columns=columns,
    )


def spread(items: list, most: int) -> list:
    """At most `most` of `items`, evenly spread from the first to the last."""
    if len(items) <= most:
        return list(items)
    if most == 1:
        return [items[-1]]
    return [items[(2 * i * (len(items) - 1) + most - 1) // (2 * (most - 1))] for i in range(most)]


def checkpoint_comparison(
    registry: ModelRegistry, default_model: str, folders: list[Path], base: str | None = None
) -> Comparison:
    """The default model's earlier checkpoints (`folders`, by step), then the model itself; first the model it was
    fine-tuned from, when `base` names a served one."""
    shown = spread(folders, MAX_SNAPSHOT_COLUMNS)
    own = ModelRegistry(
        {f"{default_model}@{f.name}": f for f in shown},
        threads=registry.threads,
        models_root=Path(registry.folder(default_model)) / SNAPSHOTS_DIR,
        max_batch=registry.max_batch,
        max_queue=registry.max_queue,
        preempt_after=registry.preempt_after,
        prompt_cache_bytes=registry.prompt_cache_bytes,
    )
    vocab = registry.vocab_sha256(default_model)
    columns = [_snapshot_column(own, f"{default_model}@{f.name}", f, default_model, vocab) for f in shown]
    final = _step_record(registry.folder(default_model))
    if final is not None:
        label = f"{default_model} · {step_text(final.step)} · val loss {final.val_loss:.2f}"
    else:  # a folder without a step record (trained elsewhere): what its metrics say
        label = ladder_label(default_model, registry)
    columns.append(Column(default_model, registry, label, f"compare-{default_model}"))
    if base is not None:
        columns.insert(0, base_column(registry, default_model, base))
    more = f" ({len(shown)} of the {len(folders)} it holds)" if len(shown) < len(folders) else ""
    intro = (
        f"Runs the prompt, seed and sampling settings above through the earlier checkpoints of `{default_model}` that "
        f"its training kept (`{SNAPSHOTS_DIR}/` in its folder{more}), from the earliest, and through `{default_model}` "
        "itself, side by side: what more training bought. Each column says its training step and the validation "
        "loss the training measured there. Set a seed to make it repeatable."
    )
    if base is not None:
        intro += (
            f" The first column is `{base}`, the model it was fine-tuned from, with its validation loss on the new "
            "text before fine-tuning (step 0)."
        )
    return Comparison(
        kind="checkpoints",
        title="Compare with earlier checkpoints: what more training bought",
        intro=intro,
        button="Compare with earlier checkpoints",
        columns=tuple(columns),
        own=own,
    )


def step_text(step: int) -> str:
    return f"step {step:,}"


def _step_record(folder: Path) -> StepRecord | None:
    """The folder's step record; None when it has none or it cannot be read (logged)."""
    try:
        return read_step_record(folder)
    except ValueError as e:
        logger.warning("%s", e)
        return None


def _snapshot_column(own: ModelRegistry, name: str, folder: Path, default_model: str, vocab: str | None) -> Column:
    """A snapshot's column: 'step 1,000 · val loss 1.91', or, when it cannot run, why."""
    elem_id = f"compare-{folder.name}"
    fallback = step_text(snapshot_step(folder))  # `folder` is one of `snapshot_folders`: a snapshot's name
    try:
        record = read_step_record(folder)
    except ValueError as e:
        return Column(name, own, f"{fallback} (cannot run)", elem_id, f"Not compared: {e}")
    label = fallback if record is None else f"{step_text(record.step)} · val loss {record.val_loss:.2f}"
    if not is_model_folder(folder):
        problem = f"Not compared: {folder} holds no model (no config.json)"
        return Column(name, own, f"{label} (cannot run)", elem_id, problem)
    if vocab is None or own.vocab_sha256(name) != vocab:
        problem = (
            f"Not compared: {folder} reads other characters than '{default_model}' (its vocab.json is another or "
            f"unreadable), so it is not one of its earlier states"
        )
        return Column(name, own, f"{label} (cannot run)", elem_id, problem)
    return Column(name, own, label, elem_id)
