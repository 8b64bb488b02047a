"""The training curve's data (`demo.curve`): the steps and losses of a folder's metrics.jsonl, the lesson's ladder as
reference lines on Tiny Shakespeare only, where a fine-tuned model's base started, and a one-line note where there
is no curve (no metrics, an unreadable or oversized file, an unknown model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from demo.curve import (
    MAX_METRICS_BYTES,
    Curve,
    card_base_model,
    curve_figure,
    curve_update,
    ladder_references,
    training_curve,
    y_range,
)
from gpt_serve.folders.corpus_record import CorpusRecord, write_corpus_record
from gpt_serve.models import LESSON_VAL_LOSS
from gpt_serve.serving.registry import ModelRegistry

SCRATCH = [
    {"step": 0, "train_loss": 4.2, "val_loss": 4.21},
    {"step": 100, "train_loss": 2.6, "val_loss": 2.7},
    {"step": 200, "train_loss": 2.3, "val_loss": 2.45},
]


def model_folder(root: Path, name: str, records=None, record=None, base: str | None = None) -> Path:
    """A folder the registry takes for a model (config.json), with its corpus.json, metrics.jsonl and card."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    write_corpus_record(folder, record or CorpusRecord.tiny_shakespeare())
    if records is not None:
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if base is not None:
        (folder / "README.md").write_text(f"---\nlicense: mit\nbase_model: {base}\n---\n\n# {name}\n")
    return folder


def registry_of(*folders: Path) -> ModelRegistry:
    return ModelRegistry({f.name: f for f in folders}, threads=1)


def test_a_run_on_tiny_shakespeare_gets_its_losses_and_the_ladder(tmp_path):
    registry = registry_of(model_folder(tmp_path, "mine", SCRATCH))
    curve = training_curve(registry, "mine")
    assert curve.steps == (0, 100, 200) and curve.train == (4.2, 2.6, 2.3) and curve.val == (4.21, 2.7, 2.45)
    assert [(r.label, r.loss) for r in curve.references][0] == ("A", LESSON_VAL_LOSS["ladder-a"])  # one head
    assert [r.label for r in curve.references] == ["A", "B", "C", "D", "E"]
    assert [r.loss for r in curve.references] == [LESSON_VAL_LOSS[f"ladder-{c}"] for c in "abcde"]
    assert curve.base is None and curve.base_start is None and curve.has_plot
    assert curve.note == (
        "`mine`: 3 evaluations · validation loss 2.450 at step 200 · dotted: the lesson's ladder, A (one head) to E."
    )


def test_another_text_has_no_ladder_lines(tmp_path):
    record = CorpusRecord.of("def f():\n    return 1\n" * 20, name="code")
    curve = training_curve(registry_of(model_folder(tmp_path, "code", SCRATCH, record)), "code")
    assert curve.references == () and "ladder" not in curve.note and curve.has_plot


def test_a_fine_tuned_model_shows_where_its_base_started(tmp_path):
    records = [{"step": 0, "train_loss": 2.9, "val_loss": 2.95}, {"step": 50, "train_loss": 1.9, "val_loss": 2.0}]
    record = CorpusRecord.of("Some other English text.\n" * 20, name="mine")
    registry = registry_of(model_folder(tmp_path, "tuned", records, record, base="shakespeare"))
    curve = training_curve(registry, "tuned")
    assert curve.base == "shakespeare" and curve.base_start == 2.95 and curve.references == ()
    assert "fine-tuned from `shakespeare` (started at 2.950 on this text)" in curve.note
    labels = [line.get_label() for line in curve_figure(curve).axes[0].get_lines()]
    assert "shakespeare (base) at step 0" in labels


def test_a_fine_tuned_model_without_a_step_0_record_says_so(tmp_path):
    folder = model_folder(tmp_path, "tuned", SCRATCH[1:], base="shakespeare")
    curve = training_curve(registry_of(folder), "tuned")
    assert curve.base == "shakespeare" and curve.base_start is None and "(no step-0 loss)" in curve.note


def test_a_folder_without_metrics_says_so_in_one_line(tmp_path):
    registry = registry_of(model_folder(tmp_path, "imported"))
    curve = training_curve(registry, "imported")
    assert not curve.has_plot and curve_figure(curve) is None
    assert curve.note == "No training curve: `imported`'s folder has no metrics.jsonl (not trained here)."
    plot, note = curve_update(registry, "imported")
    assert plot.visible is False and note == curve.note


def test_the_figure_of_a_curve(tmp_path):
    registry = registry_of(model_folder(tmp_path, "mine", SCRATCH))
    plot, note = curve_update(registry, "mine")
    assert plot.visible is True and note.startswith("`mine`: 3 evaluations")
    ax = curve_figure(training_curve(registry, "mine")).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["train"].get_xdata()) == [0, 100, 200] and list(lines["validation"].get_ydata()) == [
        4.21,
        2.7,
        2.45,
    ]
    texts = [t.get_text() for t in ax.texts]
    assert texts[0] == "A (one head) 2.40" and texts[1:] == ["B 2.28", "C 2.24", "D 2.08", "E 2.06"]


def test_unreadable_lines_are_skipped_and_counted(tmp_path):
    folder = model_folder(tmp_path, "mine", SCRATCH)
    lines = [
        "not json",
        "[1, 2]",
        '{"val_loss": 2.0}',
        '{"step": "7", "val_loss": 2.0}',
        '{"step": 300, "val_loss": NaN}',
        '{"step": 250, "train_loss": 2.2, "val_loss": true}',
        '{"step": 40',
    ]
    with open(folder / "metrics.jsonl", "a") as f:
        f.write("\n".join(lines) + "\n")
    curve = training_curve(registry_of(folder), "mine")
    assert curve.steps == (0, 100, 200, 250, 300)  # by step
    assert curve.val[3:] == (None, None) and curve.train[3] == 2.2  # true and NaN are no losses
    assert curve.skipped == 5 and curve.note.endswith("5 unreadable lines of metrics.jsonl skipped.")


@pytest.mark.parametrize(
    "content, expected",
    [
        ("", "holds no evaluation"),
        ("not json\n", "holds no evaluation"),
        (None, f"more than a training writes (at most {MAX_METRICS_BYTES:,})"),
    ],
)
def test_metrics_that_hold_no_curve_say_why(tmp_path, content, expected):
    folder = model_folder(tmp_path, "mine")
    path = folder / "metrics.jsonl"
    if content is None:
        with open(path, "wb") as f:
            f.truncate(MAX_METRICS_BYTES + 1)
    else:
        path.write_text(content)
    curve = training_curve(registry_of(folder), "mine")
    assert not curve.has_plot and curve.note.startswith("No training curve: ") and expected in curve.note


def test_an_unknown_model_or_a_value_that_is_no_name(tmp_path):
    registry = registry_of(model_folder(tmp_path, "mine", SCRATCH))
    assert training_curve(registry, "nope").note.startswith("No training curve: unknown model 'nope'")
    plot, note = curve_update(registry, ["mine"])
    assert plot.visible is False and note == "No model chosen."


@pytest.mark.parametrize(
    "card, expected",
    [
        ("---\nbase_model: shakespeare\n---\n# x\n", "shakespeare"),
        ("---\nbase_model:\n- ladder-a\n- other\n---\n", "ladder-a"),
        ("---\nlicense: mit\n---\n", None),
        ("# no front matter\nbase_model: shakespeare\n", None),
        ("---\nbase_model: [unclosed\n---\n", None),
        ("---\nbase_model: 3\n---\n", None),
        ("---\n- a list\n---\n", None),
    ],
)
def test_the_base_model_the_card_names(tmp_path, card, expected):
    (tmp_path / "README.md").write_text(card)
    assert card_base_model(tmp_path) == expected


def test_the_loss_axis_cuts_the_first_loss_from_scratch(tmp_path):
    curve = Curve("m", steps=(0, 1, 2, 3), train=(4.2, 2.0, 1.8, 1.7), val=(4.2, 2.1, 1.9, 1.8))
    low, high = y_range(curve)
    assert low < 1.7 and 3.0 < high < 3.3  # not up to 4.2
    refs = Curve("m", steps=(0, 1), train=(4.0, 3.5), val=(4.1, 3.6), references=ladder_references())
    low, high = y_range(refs)
    assert low < 2.06 and high > 4.1  # a short run above 3.0: all of it, and the ladder below it


def test_records_without_losses_draw_an_empty_plot(tmp_path):
    registry = registry_of(model_folder(tmp_path, "mine", [{"step": 0}, {"step": 5, "val_loss": None}]))
    curve = training_curve(registry, "mine")
    assert (
        curve.steps == (0, 5)
        and curve.val == (None, None)
        and curve.note == ("`mine`: 2 evaluations · dotted: the lesson's ladder, A (one head) to E.")
    )
    figure = curve_figure(curve)
    labels = [line.get_label() for line in figure.axes[0].get_lines()]
    assert "train" not in labels and "validation" not in labels and not figure.legends
