"""`python -m training` / `gpt-serve train`: flags, presets, overrides and the recorded command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training import cli
from training.cli import build_parser, config_from_args, invocation, main, split_model_overrides

ROOT = Path(__file__).resolve().parents[2]


def _config(*argv):
    overrides, rest = split_model_overrides(list(argv))
    return config_from_args(build_parser().parse_args(rest), overrides)


def test_a_preset_fills_in_and_flags_override_it():
    cfg = _config("--preset", "ladder-d", "--max-iters", "100", "--model.n_layer", "2", "--model.dropout=0.1")
    assert cfg.batch_size == 32 and cfg.learning_rate == 1e-3 and cfg.eval_iters == 200  # from the preset
    assert cfg.max_iters == 100 and cfg.model["n_layer"] == 2 and cfg.model["dropout"] == 0.1
    assert cfg.model["init"] == "pytorch" and cfg.model["block_size"] == 8


def test_the_default_models_command_still_parses():
    """The shipped default model's card records this command; it must keep meaning the same run."""
    cfg = _config(
        "--resume",
        "true",
        "--preset",
        "shakespeare-cpu",
        "--out",
        "runs/shakespeare-cpu",
        "--data",
        "../shared/data/tinyshakespeare.txt",
        "--threads",
        "2",
    )
    assert (cfg.out_dir, cfg.threads, cfg.keep_best, cfg.schedule) == ("runs/shakespeare-cpu", 2, True, "cosine")
    assert cfg.resume is True
    assert cfg.model == dict(block_size=128, n_embd=192, n_head=6, n_layer=4, dropout=0.1, init="normal")
    assert (cfg.batch_size, cfg.learning_rate, cfg.min_lr) == (32, 2e-3, 1e-4)
    assert (cfg.warmup_iters, cfg.max_iters, cfg.grad_accum) == (200, 5000, 1)
    assert (cfg.eval_interval, cfg.eval_iters, cfg.grad_clip, cfg.weight_decay, cfg.seed) == (500, 80, 1.0, 0.1, 1337)


def test_boolean_flags_and_resume():
    assert _config("--resume").resume is True and _config().resume is False
    assert _config("--resume", "true").resume is True and _config("--resume", "false").resume is False
    assert _config("--preset", "shakespeare-cpu", "--keep-best", "false").keep_best is False
    assert _config("--preset", "tiny", "--keep-best").keep_best is True
    assert _config("--compile", "off").compile is False and _config().compile is None
    with pytest.raises(SystemExit):
        _config("--keep-best", "maybe")


def test_model_override_needs_a_value():
    with pytest.raises(ValueError, match="--model.n_layer needs a value"):
        split_model_overrides(["--model.n_layer"])


def test_list_presets(capsys):
    assert main(["--list-presets"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("ladder-a", "ladder-e", "ladder-f", "small-cpu", "shakespeare-cpu", "tiny"))


def test_unknown_preset_is_an_error(capsys):
    assert main(["--preset", "nope"]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err


def test_missing_data_file_is_a_clear_cli_error(tmp_path, capsys):
    assert main(["--preset", "tiny", "--data", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "data file not found" in err and "missing.txt" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_cuda_is_a_one_line_cli_error(tmp_path, make_args, capsys, device):
    assert main(make_args(tmp_path, "--device", device)) == 2
    err = capsys.readouterr().err
    assert err == f"error: device {device!r} asked for CUDA, but no CUDA device is available; use --device cpu\n"
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_python_m_training_device_cuda_without_cuda_exits_2_with_no_traceback(tmp_path, make_args):
    proc = subprocess.run(
        [sys.executable, "-m", "training", *make_args(tmp_path, "--device", "cuda")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "error: device 'cuda' asked for CUDA, but no CUDA device is available; use --device cpu"
    ]


def test_train_prints_the_result_and_records_the_command(tmp_path, make_args, capsys):
    assert main(make_args(tmp_path, "--max-iters", "4", "--eval-interval", "2")) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["final_step"] == 4
    card = (tmp_path / "README.md").read_text()
    assert f"python -m training --preset tiny --out {tmp_path}" in card


def test_invocation_names_how_the_trainer_was_launched(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/usr/bin/gpt-serve", "train", "--preset", "tiny"])
    assert invocation(["--preset", "tiny"]) == "gpt-serve train --preset tiny"
    monkeypatch.setattr(sys, "argv", ["/x/training/__main__.py"])
    assert invocation(["--out", "a b"]) == "python -m training --out 'a b'"
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert invocation([]) == "torchrun --nproc_per_node=2 --nnodes=2 -m training"
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setattr(sys, "argv", ["/x/gpt-serve", "ladder"])
    assert invocation(["--stages", "a"], module="training.ladder", subcommand="ladder") == "gpt-serve ladder --stages a"


def test_gpt_serve_dispatches_train_and_ladder_here():
    """`gpt-serve train|ladder` reach this package through its entry points, under its installed name."""
    from gpt_serve.cli.apps import app_commands

    apps = app_commands()
    assert apps["train"].value == "gpt_serve_training.cli:main"
    assert apps["ladder"].value == "gpt_serve_training.ladder:main"
    assert callable(apps["train"].load()) and callable(cli.main)


def test_presets_are_named_for_size_and_device_and_the_former_name_still_works():
    from training.presets import get_preset

    assert get_preset("shakespeare-cpu") is get_preset("small-cpu")  # the former name: an alias
    assert _config().model == _config("--preset", "shakespeare-cpu").model  # and the default is the same preset
    assert [get_preset(f"ladder-{s}").name for s in "abcdef"] == [f"ladder-{s}" for s in "abcdef"]  # the lesson's
    with pytest.raises(ValueError, match="unknown preset 'big'.*'small-cpu'"):
        get_preset("big")


def test_no_progress_prints_no_bar_at_all(tmp_path, make_args, capfd):
    """`--no-progress`: the training's own bar off, and transformers' "Writing model shards" bar too."""
    assert main([*make_args(tmp_path / "out"), "--max-iters", "2", "--eval-interval", "2", "--no-progress"]) == 0
    out, err = capfd.readouterr()
    assert '"final_step": 2' in out and "Writing model shards" not in out + err and "it/s" not in out + err


def test_snapshots_print_no_bar_inside_the_training_bar(tmp_path, make_args, capfd):
    """With the bars on, transformers' "Writing model shards" bar comes once, for the final folder, after the
    training's bar has closed: never for a snapshot written while the training's bar is on the screen."""
    args = [*make_args(tmp_path / "out"), "--max-iters", "4", "--eval-interval", "1", "--snapshots", "2"]
    assert main([*args, "--progress"]) == 0
    out, err = capfd.readouterr()
    assert len(list((tmp_path / "out" / "snapshots").iterdir())) == 2
    bars = (out + err).count("Writing model shards: 100%")
    assert bars <= 1  # transformers may skip its bar for a folder this small
    if bars:
        assert err.index("Writing model shards") > err.rindex("step/s")
