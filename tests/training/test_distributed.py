"""The same entry point under `torchrun`: 2 CPU processes, DDP over gloo; only rank 0 logs and saves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training.checkpoint import read_checkpoint
from training.report import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def _torchrun(args: list[str], nproc: int = 2) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "training",
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.distributed
def test_torchrun_two_processes_on_cpu_train_and_save_once(tmp_path, make_args):
    out = tmp_path / "ddp"
    args = make_args(
        out, "--max-iters", "20", "--eval-interval", "10", "--checkpoint-interval", "10", "--model.dropout", "0.1"
    )
    proc = _torchrun(args)
    assert proc.returncode == 0, proc.stderr[-3000:]

    # One result line (rank 0 prints it), one model, one log, one checkpoint.
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == 1 and results[0]["final_step"] == 20
    assert proc.stderr.count("saved the model to") == 1
    assert proc.stderr.count("step 10: train loss") == 1
    assert [m["step"] for m in read_metrics(out)] == [0, 10, 20]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["checkpoint.pt"]
    load_file(out / "model.safetensors")

    state = read_checkpoint(out / "checkpoints" / "checkpoint.pt")
    assert state["run"]["world_size"] == 2 and len(state["rank_states"]) == 2
    # Each rank samples its own batches: their sampler states differ.
    assert not torch.equal(state["rank_states"][0]["batch_gen"], state["rank_states"][1]["batch_gen"])
    # Two processes of 8 sequences each per step.
    assert read_metrics(out)[-1]["tokens"] == 20 * 2 * 8 * 16
    card = (out / "README.md").read_text()
    assert "torchrun --nproc_per_node=2 -m training --preset tiny" in card and "2 DDP processes" in card


@pytest.mark.distributed
def test_a_failing_torchrun_worker_prints_one_error_line_that_torchrun_repeats(tmp_path, make_args):
    """The worker prints its one-line error (once per job) before torchrun's own failure summary, and hands it to
    torchrun through its error file, so the summary names it instead of a link to torchrun's documentation."""
    missing = tmp_path / "missing.txt"
    proc = _torchrun(make_args(tmp_path / "out", "--data", missing))  # the last --data counts
    message = f"error: data file not found: {missing} (pass --data PATH to a UTF-8 text file)"
    lines = proc.stderr.splitlines()
    assert proc.returncode != 0 and [line for line in lines if line.startswith("error: ")] == [message]
    assert lines.index(message) < lines.index("Traceback (most recent call last):")  # torchrun's own, then
    root_cause = proc.stderr.split("Root Cause (first observed failure):")[1]
    assert f"traceback : {message}" in root_cause and "To enable traceback" not in proc.stderr


@pytest.mark.distributed
def test_torchrun_fine_tunes_a_model_the_same_on_both_ranks(tmp_path, small_data_path):
    """`--init-from` under DDP: both ranks start from the same extended weights (DDP checks that the parameters'
    shapes agree), and rank 0 writes the card naming the base."""
    text = tmp_path / "new.txt"
    text.write_text(small_data_path.read_text(encoding="utf-8")[:20_000] + "é§\n", encoding="utf-8")
    out = tmp_path / "ddp"
    args = ["--init-from", "ladder-a", "--data", str(text), "--out", str(out), "--max-iters", "4"]
    args += ["--eval-interval", "2", "--eval-iters", "2", "--batch-size", "4", "--threads", "1", "--no-progress"]
    proc = _torchrun([*args, "--sample-tokens", "10"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("ladder-a lacks 2 characters of the text") == 1  # rank 0 logs it
    card = (out / "README.md").read_text()
    assert "base_model: ladder-a" in card and "2 DDP processes" in card
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 67
