"""Snapshots (`--snapshots N`): a run keeps N earlier states of its model as complete model folders in
`OUT/snapshots/step-NNNNNN/`, each with its step and losses; bounded, evenly spread, the same after a resume."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from gpt_serve.folders.snapshots import read_step_record, snapshot_folders
from training.cli import main
from training.report import read_metrics
from training.snapshots import snapshot_steps
from training.trainer import Trainer


@pytest.mark.parametrize(
    ("max_iters", "eval_interval", "count", "want"),
    [
        (5000, 500, 4, [1000, 2000, 3000, 4000]),  # small-cpu: evenly spread, the last step is the model itself
        (5000, 500, 1, [2500]),
        (5000, 500, 0, []),
        (40, 5, 4, [10, 15, 25, 30]),
        (40, 10, 4, [10, 20, 30]),  # fewer evaluations than asked: every one before the end
        (10, 5, 4, [5]),
        (10, 10, 4, []),  # no evaluation before the end: nothing earlier to keep
        (1000, 3, 32, None),
    ],
)
def test_the_steps_are_evaluations_evenly_spread_before_the_end(max_iters, eval_interval, count, want):
    steps = snapshot_steps(max_iters, eval_interval, count)
    if want is not None:
        assert steps == want
    assert len(steps) <= count and steps == sorted(set(steps))
    assert all(0 < s < max_iters and s % eval_interval == 0 for s in steps)


@pytest.fixture(scope="module")
def run(tmp_path_factory, make_config):
    """40 steps evaluated every 10, two snapshots kept."""
    out = tmp_path_factory.mktemp("snap") / "run"
    result = Trainer(make_config(out, max_iters=40, eval_interval=10, snapshots=2)).fit()
    return out, result


def test_a_run_keeps_its_snapshots_as_model_folders_with_their_step_and_losses(run):
    from transformers import AutoModelForCausalLM

    out, result = run
    folders = snapshot_folders(out)
    assert [f.name for f in folders] == ["step-000010", "step-000030"]
    metrics = {m["step"]: m for m in read_metrics(out)}
    for folder in folders:
        record = read_step_record(folder)
        assert record.val_loss == metrics[record.step]["val_loss"] and folder.name == f"step-{record.step:06d}"
        assert record.train_loss == metrics[record.step]["train_loss"]
        # the same characters, the same text, the same chat format (Tiny Shakespeare's: a play) as the model
        for shared in ("vocab.json", "corpus.json", "chat_template.jinja"):
            assert (folder / shared).read_bytes() == (out / shared).read_bytes()
        AutoModelForCausalLM.from_pretrained(folder)  # loadable like the final folder
    final = read_step_record(out)
    assert (final.step, final.val_loss) == (40, result["val_loss"])
    assert not list((out / "snapshots").glob(".*"))  # no temporary folder left
    early, late = (load_file(f / "model.safetensors") for f in folders)
    assert not torch.equal(early["lm_head.weight"], late["lm_head.weight"])


def test_a_snapshot_has_a_card_naming_its_run_step_and_losses_and_a_copy_keeps_it(run, tmp_path):
    from gpt_serve.cli import main
    from gpt_serve.folders.corpus_record import read_corpus_record

    out, _ = run
    snapshot = out / "snapshots" / "step-000010"
    record, corpus = read_step_record(snapshot), read_corpus_record(out)
    card = (snapshot / "README.md").read_text(encoding="utf-8")
    assert f"# {out.name} at step 10" in card and "step\n10 of 40 (`--snapshots`)" in card
    assert f"**{record.val_loss:.4f}**" in card and f"| train loss | {record.train_loss:.4f} |" in card
    assert corpus.description in card and "## Use" in card and json.dumps(corpus.default_prompt) in card
    assert "model-index" in card and f"value: {round(record.val_loss, 4)}" in card  # the Hub reads its losses
    assert main(["copy", str(snapshot), str(tmp_path / "copy")]) == 0  # published on its own, card and records
    copied = (tmp_path / "copy" / "README.md").read_text(encoding="utf-8")
    assert f"# {out.name} at step 10" in copied and "trust_remote_code=True" in copied
    assert read_step_record(tmp_path / "copy") == record


def test_a_snapshot_is_the_model_as_it_was_at_its_step(run, tmp_path, make_config):
    out, _ = run
    Trainer(make_config(tmp_path, max_iters=10, eval_interval=10)).fit()  # the same run, stopped at step 10
    torch.testing.assert_close(
        load_file(out / "snapshots" / "step-000010" / "model.safetensors"),
        load_file(tmp_path / "model.safetensors"),
        rtol=0,
        atol=0,
    )


def test_none_with_zero_and_an_earlier_runs_go_with_a_fresh_run(tmp_path, make_config):
    old = tmp_path / "snapshots" / "step-000005"
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")
    Trainer(make_config(tmp_path, max_iters=20, eval_interval=5, snapshots=0)).fit()
    assert not (tmp_path / "snapshots").exists()  # not beside a model it is no earlier state of


def test_an_interrupted_snapshot_write_is_cleaned_up_by_the_next_run(tmp_path, make_config):
    left = tmp_path / "snapshots" / ".step-000010.new-abc"
    left.mkdir(parents=True)
    (left / "model.safetensors").write_bytes(b"half")
    Trainer(make_config(tmp_path, max_iters=20, eval_interval=10, checkpoint_interval=10)).fit()
    stray = tmp_path / "snapshots" / ".step-000010.new-abc"
    assert not stray.exists() and [f.name for f in snapshot_folders(tmp_path)] == ["step-000010"]


class Killed(Exception):
    pass


def test_a_resumed_run_keeps_the_same_snapshots_as_an_uninterrupted_one(tmp_path, make_config, monkeypatch):
    settings = dict(max_iters=40, eval_interval=10, checkpoint_interval=10, model={"dropout": 0.1})
    Trainer(make_config(tmp_path / "full", **settings)).fit()

    real = Trainer.save_checkpoint

    def killed_at_20(self):  # dies after step 20's snapshot, before its checkpoint: the next run redoes 11..20
        if self.step == 20:
            raise Killed
        real(self)

    monkeypatch.setattr(Trainer, "save_checkpoint", killed_at_20)
    with pytest.raises(Killed):
        Trainer(make_config(tmp_path / "killed", **settings)).fit()
    assert [f.name for f in snapshot_folders(tmp_path / "killed")] == ["step-000010", "step-000020"]
    monkeypatch.setattr(Trainer, "save_checkpoint", real)
    Trainer(make_config(tmp_path / "killed", resume=True, **settings)).fit()

    got, want = snapshot_folders(tmp_path / "killed"), snapshot_folders(tmp_path / "full")
    assert [f.name for f in got] == [f.name for f in want] == ["step-000010", "step-000020", "step-000030"]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(load_file(a / "model.safetensors"), load_file(b / "model.safetensors"))
        assert read_step_record(a) == read_step_record(b)


@pytest.mark.parametrize(("value", "message"), [("-1", "snapshots must be 0 (none) to 32"), ("33", "got 33")])
def test_a_bad_count_is_refused_by_name_before_anything_is_written(tmp_path, make_args, capsys, value, message):
    assert main(make_args(tmp_path / "run", "--snapshots", value)) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_a_count_that_is_not_a_number_is_an_argument_error(tmp_path, make_args, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(make_args(tmp_path / "run", "--snapshots", "all"))
    assert exit_.value.code == 2 and "--snapshots: invalid int value: 'all'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "cannot read"),
        ('{"step": -1, "val_loss": 1.0, "train_loss": 1.0}', "step must be a non-negative integer"),
        ('{"step": 5, "val_loss": NaN, "train_loss": 1.0}', "val_loss must be a finite number"),
        ('{"step": 5, "val_loss": 1.0}', "must hold exactly"),
        ("[1, 2]", "must hold exactly"),
    ],
)
def test_a_broken_step_record_is_named(tmp_path, content, message):
    (tmp_path / "step.json").write_text(content)
    with pytest.raises(ValueError, match=message) as error:
        read_step_record(tmp_path)
    assert str(tmp_path / "step.json") in str(error.value)


def test_a_folder_without_a_step_record_has_none_and_stray_entries_are_no_snapshots(tmp_path):
    assert read_step_record(tmp_path) is None and snapshot_folders(tmp_path) == []
    for name in ("step-000200", "step-000010", ".step-000300.new-x", "step-12", "notes"):
        (tmp_path / "snapshots" / name).mkdir(parents=True)
    (tmp_path / "snapshots" / "step-000400").write_text("a file")
    assert [f.name for f in snapshot_folders(tmp_path)] == ["step-000010", "step-000200"]
