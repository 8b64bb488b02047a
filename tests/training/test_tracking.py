"""--report-to: the scalars of metrics.jsonl, also in TensorBoard's event files and in a local trackio project."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from training.report import read_metrics
from training.tracking import parse_report_to
from training.trainer import Trainer

SCALARS = ("train_loss", "val_loss", "lr", "tokens", "time_s")


def test_tensorboard_gets_the_same_scalars_as_metrics_jsonl(tmp_path, make_config):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install 'gpt-serve[tracking]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    Trainer(make_config(tmp_path, max_iters=20, eval_interval=10, sample_tokens=0, report_to="tensorboard")).fit()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    metrics = read_metrics(tmp_path)
    assert set(SCALARS) <= set(events.Tags()["scalars"])
    for name in SCALARS:
        logged = [(e.step, e.value) for e in events.Scalars(name)]
        assert [step for step, _ in logged] == [m["step"] for m in metrics] == [0, 10, 20]
        assert [value for _, value in logged] == pytest.approx([m[name] for m in metrics], rel=1e-6)


def test_trackio_gets_the_same_scalars(tmp_path, small_data_path):
    """In a subprocess: trackio fixes its data folder (TRACKIO_DIR) when imported."""
    pytest.importorskip("trackio", reason="trackio is not installed (pip install 'gpt-serve[tracking]')")
    out = tmp_path / "run"
    script = textwrap.dedent(f"""
        import json
        from tests.training.conftest import tiny_config
        from training.trainer import Trainer
        from trackio.sqlite_storage import SQLiteStorage

        cfg = tiny_config({str(out)!r}, {str(small_data_path)!r}, max_iters=20, eval_interval=10, sample_tokens=0,
                          report_to="trackio")
        Trainer(cfg).fit()
        logs = SQLiteStorage.get_logs("gpt-serve", "run")
        print("RESULT " + json.dumps([{{k: v for k, v in log.items() if k != "timestamp"}} for log in logs]))
    """)
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "GRADIO_ANALYTICS_ENABLED": "False"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=os.getcwd())
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))
    logs = json.loads(line.removeprefix("RESULT "))
    metrics = read_metrics(out)
    assert [log["step"] for log in logs] == [m["step"] for m in metrics] == [0, 10, 20]
    for log, record in zip(logs, metrics, strict=True):
        assert {name: log[name] for name in SCALARS} == pytest.approx({name: record[name] for name in SCALARS})


def test_report_to_names_unknown_and_missing_trackers(monkeypatch):
    assert parse_report_to("none") == [] and parse_report_to("tensorboard,tensorboard") == ["tensorboard"]
    with pytest.raises(ValueError, match=r"unknown tracker\(s\) \['wandb'\]; choose 'none' or any of"):
        parse_report_to("wandb")
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ValueError, match=r"needs tensorboard: pip install 'gpt-serve\[tracking\]'"):
        parse_report_to("tensorboard")
