"""Checkpoints: written atomically, resumed exactly in-process, and refused loudly when corrupt or foreign."""

from __future__ import annotations

import json

import pytest
import torch

from training import checkpoint as ckpt_mod
from training.checkpoint import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from training.cli import main
from training.report import read_metrics
from training.trainer import Trainer

from .conftest import crash_at


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_checkpoint_holds_everything_a_resume_needs(tmp_path, make_config):
    t = Trainer(make_config(tmp_path, max_iters=10, eval_interval=5, sample_tokens=0))
    t.fit()
    state = read_checkpoint(t.checkpoint_path())
    assert {"model", "optimizer", "scheduler", "step", "rank_states", "run", "best_val", "train_time"} <= set(state)
    assert state["step"] == 10 and len(state["rank_states"]) == 1
    assert {"torch_rng", "batch_gen"} <= set(state["rank_states"][0])
    assert state["run"]["model_config"]["n_layer"] == 2 and state["run"]["world_size"] == 1


def test_resume_in_process_repeats_the_uninterrupted_run(tmp_path, make_config):
    """A run that crashes after step 13 (last checkpoint at 12) and is resumed ends where the full run ends."""
    settings = dict(max_iters=24, eval_interval=8, checkpoint_interval=4, sample_tokens=0, model={"dropout": 0.1})
    full = Trainer(make_config(tmp_path / "full", **settings))
    full.fit()

    with crash_at(13):
        Trainer(make_config(tmp_path / "part", **settings)).fit()
    assert read_checkpoint(tmp_path / "part" / "checkpoints" / "checkpoint.pt")["step"] == 12
    resumed = Trainer(make_config(tmp_path / "part", resume=True, **settings))
    resumed.fit()
    torch.testing.assert_close(_weights(resumed.model), _weights(full.model), rtol=0, atol=0)
    assert [(m["step"], m["val_loss"]) for m in read_metrics(tmp_path / "part")] == [
        (m["step"], m["val_loss"]) for m in read_metrics(tmp_path / "full")
    ]


def test_save_is_atomic_a_failed_write_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "checkpoint.pt"
    save_checkpoint(path, {"step": 1})

    def broken_save(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_mod.torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"step": 2})
    monkeypatch.undo()
    assert read_checkpoint(path)["step"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["checkpoint.pt"]  # no temporary file left behind


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_a_corrupt_checkpoint_is_a_clear_error_not_a_restart(tmp_path, make_args, capsys, damage):
    assert main(make_args(tmp_path, "--max-iters", "10", "--eval-interval", "5")) == 0
    path = tmp_path / "checkpoints" / "checkpoint.pt"
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"\x00garbage" * 100, "empty": b""}[damage])
    metrics_before = (tmp_path / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(make_args(tmp_path, "--max-iters", "10", "--eval-interval", "5", "--resume")) == 2
    err = capsys.readouterr().err
    assert "checkpoint" in err and "corrupt" in err and str(path) in err
    assert (tmp_path / "metrics.jsonl").read_text() == metrics_before  # nothing was restarted or overwritten


def test_an_incompatible_checkpoint_names_the_difference(tmp_path, make_args, capsys):
    assert main(make_args(tmp_path, "--max-iters", "10", "--eval-interval", "5")) == 0
    capsys.readouterr()
    resume = ["--max-iters", "10", "--eval-interval", "5", "--resume"]
    assert main(make_args(tmp_path, *resume, "--model.n_layer", "3")) == 2
    err = capsys.readouterr().err
    assert "incompatible" in err and "model_config" in err and "'n_layer': 2" in err and "'n_layer': 3" in err
    assert main(make_args(tmp_path, *resume, "--seed", "1")) == 2
    assert "seed is 1337 there and 1 here" in capsys.readouterr().err


def test_resume_without_a_checkpoint_and_restart_over_one_are_refused(tmp_path, make_args, capsys):
    assert main(make_args(tmp_path / "none", "--resume")) == 2
    assert "--resume: no checkpoint to continue at" in capsys.readouterr().err
    assert main(make_args(tmp_path / "run", "--max-iters", "10", "--eval-interval", "5")) == 0
    capsys.readouterr()
    assert main(make_args(tmp_path / "run", "--max-iters", "10", "--eval-interval", "5")) == 2
    err = capsys.readouterr().err
    assert "already holds a checkpoint" in err and "--resume" in err


def test_a_checkpoint_never_runs_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "evil.pt"
    torch.save({"format_version": 2, "payload": Evil()}, path)
    with pytest.raises(CheckpointError, match="corrupt or not a gpt-serve checkpoint"):
        read_checkpoint(path)


def test_unknown_format_and_missing_parts_are_refused(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"format_version": 99}, path)
    with pytest.raises(CheckpointError, match="format_version 99"):
        read_checkpoint(path)
    save_checkpoint(path, {"step": 3})
    with pytest.raises(CheckpointError, match="lacks"):
        load_checkpoint(path, {})


def test_format_1_checkpoints_of_the_first_trainer_still_load(tmp_path):
    g = torch.Generator().manual_seed(0)
    v1 = {
        "format_version": 1,
        "run": {"seed": 1, "model_config": {"n_layer": 2, "transformers_version": "5.24.0"}},
        "model": {},
        "optimizer": {},
        "scheduler": {},
        "step": 5,
        "best_val": 3.0,
        "train_time": 1.5,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": None,
        "batch_gen": g.get_state(),
    }
    torch.save(v1, tmp_path / "v1.pt")
    state = load_checkpoint(tmp_path / "v1.pt", {"seed": 1, "model_config": {"n_layer": 2}, "data_sha256": "x"})
    assert state["rank_states"][0]["batch_gen"].equal(g.get_state()) and state["wall_time"] == 1.5
    with pytest.raises(CheckpointError, match="seed"):
        load_checkpoint(tmp_path / "v1.pt", {"seed": 2})


def test_a_run_checkpointed_in_format_1_resumes_exactly(tmp_path, make_config, monkeypatch):
    """Runs started by the first trainer (format 1, e.g. the default model's) continue with this one."""
    settings = dict(max_iters=20, eval_interval=10, sample_tokens=0, keep_best=True, model={"dropout": 0.1})
    full = Trainer(make_config(tmp_path / "full", **settings))
    full.fit()
    real_step = Trainer.train_step
    monkeypatch.setattr(Trainer, "train_step", lambda self: real_step(self) if self.step < 13 else 1 / 0)
    with pytest.raises(ZeroDivisionError):
        Trainer(make_config(tmp_path / "v1", **settings)).fit()
    monkeypatch.setattr(Trainer, "train_step", real_step)

    # Rewrite the step-10 checkpoint and the log the way the first trainer wrote them.
    path = tmp_path / "v1" / "checkpoints" / "checkpoint.pt"
    state = read_checkpoint(path)
    rank = state.pop("rank_states")[0]
    for key in ("best_step", "evals_since_best", "stopped_early", "wall_time"):
        state.pop(key)
    for key in ("data_sha256", "weight_decay", "grad_clip", "betas", "eval_interval", "eval_iters"):
        state["run"].pop(key)
    state["run"]["model_config"] = {**state["run"]["model_config"], "transformers_version": "5.24.0", "use_cache": True}
    torch.save({**state, **rank, "format_version": 1}, path)
    lines = (tmp_path / "v1" / "metrics.jsonl").read_text().splitlines()
    old_records = [{k: v for k, v in json.loads(line).items() if k != "tokens"} for line in lines]
    (tmp_path / "v1" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old_records))

    resumed = Trainer(make_config(tmp_path / "v1", resume=True, **settings))
    resumed.fit()
    torch.testing.assert_close(_weights(resumed.model), _weights(full.model), rtol=0, atol=0)
    assert [m["val_loss"] for m in read_metrics(tmp_path / "v1")] == [
        m["val_loss"] for m in read_metrics(tmp_path / "full")
    ]
