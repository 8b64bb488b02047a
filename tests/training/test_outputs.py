"""What a run leaves on disk: a complete model folder or the previous one, usual file modes, no temporary files
after a kill, a torn metrics line tolerated, a full disk named as one."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from collections import namedtuple

import pytest

from gpt_serve.chargpt.chat_format import PLAY, chat_template
from training import checkpoint as ckpt_mod
from training import outputs
from training.checkpoint import save_checkpoint
from training.cli import main
from training.outputs import publish_folder, remove_stale_temp_files
from training.report import read_metrics
from training.trainer import Trainer


def test_the_final_folder_is_published_complete_with_the_usual_modes(tmp_path, make_config):
    Trainer(make_config(tmp_path, max_iters=4, eval_interval=4, sample_tokens=0)).fit()
    files = ["config.json", "model.safetensors", "vocab.json", "tokenizer.json", "README.md", "generation_config.json",
             "chat_template.jinja"]  # fmt: skip
    want = outputs.file_mode()
    modes = {name: stat.S_IMODE((tmp_path / name).stat().st_mode) for name in files}
    assert modes == dict.fromkeys(files, want)  # transformers writes model.safetensors 0600 on its own
    assert not list(tmp_path.glob(".save-*"))
    assert (tmp_path / "chat_template.jinja").read_text() == chat_template(PLAY)  # Tiny Shakespeare reads as a play


def test_a_failed_final_save_leaves_the_previous_folder(tmp_path):
    (tmp_path / "config.json").write_text('{"old": true}')
    (tmp_path / "vocab.json").write_text('{"a": 0}')

    def write(folder):
        (folder / "config.json").write_text('{"new": true}')
        (folder / "model.safetensors").write_bytes(b"weights")
        raise OSError(errno.EIO, "killed half way")

    with pytest.raises(OSError, match="killed half way"):
        publish_folder(tmp_path, write)
    assert json.loads((tmp_path / "config.json").read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "vocab.json"]


def test_config_json_lands_last(tmp_path, monkeypatch):
    moved = []
    real = os.replace
    monkeypatch.setattr(outputs.os, "replace", lambda a, b: (moved.append(os.path.basename(b)), real(a, b)))
    publish_folder(tmp_path, lambda f: [(f / n).write_text("{}") for n in ("config.json", "vocab.json", "z.json")])
    assert moved[-1] == "config.json" and sorted(moved) == ["config.json", "vocab.json", "z.json"]


def test_an_interrupted_runs_temporary_files_are_removed_by_the_next(tmp_path, make_config):
    (tmp_path / "checkpoints").mkdir(parents=True)
    left = [tmp_path / ".save-abc123", tmp_path / "checkpoints" / ".checkpoint.pt-x1.tmp", tmp_path / "loss.tmp.png"]
    left.append(outputs.temp_path(tmp_path / "metrics.jsonl"))  # what write_metrics renames over metrics.jsonl
    left[0].mkdir()
    (left[0] / "model.safetensors").write_bytes(b"half")
    for path in left[1:]:
        path.write_bytes(b"half")
    (tmp_path / "notes.tmp.txt").write_text("the user's")  # not ours: kept
    Trainer(make_config(tmp_path, max_iters=2, eval_interval=2, sample_tokens=0)).fit()
    assert not any(p.exists() for p in left) and (tmp_path / "notes.tmp.txt").exists()


def test_a_second_run_in_the_same_folder_is_refused_and_touches_nothing(tmp_path, make_config):
    from training.outputs import lock_folder

    (tmp_path / "checkpoints").mkdir(parents=True)
    running = tmp_path / "checkpoints" / ".checkpoint.pt-live.tmp"  # the running job's checkpoint being written
    running.write_bytes(b"in progress")
    held = lock_folder(tmp_path)  # as the running job holds it
    try:
        with pytest.raises(ValueError, match=r"another training run is using .* choose another --out"):
            Trainer(make_config(tmp_path, max_iters=2, eval_interval=2, sample_tokens=0)).fit()
        assert running.exists()
    finally:
        held.close()
    assert remove_stale_temp_files(tmp_path) == [running]  # once the lock is free


def test_republishing_removes_config_json_first(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text('{"old": true}')
    seen = []
    real = os.replace

    def replace(a, b):
        seen.append((os.path.basename(b), (tmp_path / "config.json").exists()))
        real(a, b)

    monkeypatch.setattr(outputs.os, "replace", replace)
    publish_folder(tmp_path, lambda f: [(f / n).write_text("{}") for n in ("config.json", "model.safetensors")])
    assert seen == [("model.safetensors", False), ("config.json", False)]


def test_resume_drops_a_torn_last_metrics_line_and_repairs_the_file(tmp_path, make_config):
    settings = dict(max_iters=8, eval_interval=4, sample_tokens=0)
    Trainer(make_config(tmp_path, **settings)).fit()
    metrics = tmp_path / "metrics.jsonl"
    with open(metrics, "a", encoding="utf-8") as f:
        f.write('{"step": 12, "train_loss": 3.1, "val_')  # the disk filled up in the middle of this line
    Trainer(make_config(tmp_path, resume=True, **settings)).fit()  # resumes at the last checkpoint, step 8
    assert [m["step"] for m in read_metrics(tmp_path)] == [0, 4, 8]
    assert all(json.loads(line) for line in metrics.read_text().splitlines())


def test_a_damaged_metrics_line_before_the_last_names_the_file_and_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 4, oops\n{"step": 8}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl line 2 is not a metrics record"):
        read_metrics(tmp_path)


def test_a_full_disk_is_named_as_one(tmp_path, make_args, monkeypatch, capsys):
    """torch reports a full disk as 'PytorchStreamWriter failed writing file ...', naming no cause."""

    def full_save(obj, f):
        raise RuntimeError("[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file")

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(ckpt_mod.torch, "save", full_save)
    monkeypatch.setattr(outputs.shutil, "disk_usage", lambda path: usage(10**9, 10**9, 0))
    with pytest.raises(OSError, match="no space left on the device to write .*checkpoint.pt"):
        save_checkpoint(tmp_path / "checkpoint.pt", {"step": 1})
    assert main(make_args(tmp_path / "run", "--max-iters", "2", "--eval-interval", "2")) == 2
    assert "no space left on the device" in capsys.readouterr().err


def test_a_real_error_is_not_mistaken_for_a_full_disk(tmp_path):
    error = RuntimeError("something else")
    assert outputs.explain_write_error(error, tmp_path) is error
    assert shutil.disk_usage(tmp_path).free > outputs.LOW_SPACE_BYTES


def test_a_run_refuses_an_output_folder_holding_a_link_and_writes_nothing(tmp_path, make_config, link_outside):
    """Issue 32: nothing is written through a symbolic link; a run's folder holding one is refused at the start."""
    out = tmp_path / "run"
    outside = link_outside(out / "metrics.jsonl")
    with pytest.raises(ValueError, match=r"run/metrics.jsonl is a symbolic link .* never writes through a link"):
        Trainer(make_config(out, max_iters=2, eval_interval=2, sample_tokens=0)).fit()
    assert outside.read_text() == "someone else's\n"
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]
