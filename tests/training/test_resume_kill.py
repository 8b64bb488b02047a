"""Kill -9 and resume: a run killed after a checkpoint and resumed ends exactly like an uninterrupted run, its
snapshots included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training.cli import main
from training.report import read_metrics

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = [
    "--max-iters",
    "300",
    "--eval-interval",
    "100",
    "--checkpoint-interval",
    "25",
    "--eval-iters",
    "2",
    "--model.dropout",
    "0.1",
]


def _wait_for(predicate, proc, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            pytest.fail(f"the training run ended (rc {proc.returncode}) before it could be killed")
        time.sleep(0.01)
    pytest.fail("timed out waiting for the training run")


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_then_resume_matches_an_uninterrupted_run(tmp_path, make_args):
    killed, full = tmp_path / "killed", tmp_path / "full"
    proc = subprocess.Popen(
        [sys.executable, "-m", "training", *make_args(killed, *SETTINGS)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # Kill once step 100 was evaluated: its checkpoint may or may not be written yet, and either must work.
        _wait_for(lambda: any(m["step"] == 100 for m in _metrics(killed)), proc)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "model.safetensors").exists()  # it really died mid-run
    step = torch.load(killed / "checkpoints" / "checkpoint.pt", weights_only=True)["step"]
    assert 75 <= step < 300

    assert main(make_args(killed, *SETTINGS, "--resume")) == 0
    assert main(make_args(full, *SETTINGS)) == 0

    torch.testing.assert_close(
        load_file(killed / "model.safetensors"), load_file(full / "model.safetensors"), rtol=1e-6, atol=1e-7
    )
    got, want = read_metrics(killed), read_metrics(full)
    assert [m["step"] for m in got] == [m["step"] for m in want] == [0, 100, 200, 300]  # nothing twice
    for a, b in zip(got, want, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6, abs=1e-7)
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-6, abs=1e-7)
        assert a["lr"] == b["lr"] and a["tokens"] == b["tokens"]
    # the snapshots (steps 100 and 200; 100's was written again, or for the first time, after the kill)
    kept = [sorted(p.name for p in (run / "snapshots").iterdir()) for run in (killed, full)]
    assert kept[0] == kept[1] == ["step-000100", "step-000200"]
    for name in kept[0]:
        torch.testing.assert_close(
            load_file(killed / "snapshots" / name / "model.safetensors"),
            load_file(full / "snapshots" / name / "model.safetensors"),
            rtol=1e-6,
            atol=1e-7,
        )


def _metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    # The file may be mid-append when read: ignore a partial last line.
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


if os.name == "nt":  # pragma: no cover
    pytestmark = pytest.mark.skip("SIGKILL is POSIX")
