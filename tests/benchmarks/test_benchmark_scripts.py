"""The benchmark scripts run end to end on tiny inputs (their numbers are not checked: benchmarks, not tests)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_script(name: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_decode_floor():
    out = run_script(
        "decode_floor.py",
        *("--threads", "1", "--n-embd", "32", "--n-layer", "1", "--n-head", "4", "--past", "8"),
        *("--repeats", "3"),
    )
    for path in ("PyTorch F.linear", "PyTorch DecodeLinear", "ONNX Runtime MatMul only", "KV Concat, past 8"):
        assert path in out


@pytest.mark.slow
def test_training_benchmark(data_path, tmp_path):
    out = run_script(
        "training.py",
        *("--threads", "1", "--presets", "tiny", "--warmup", "1", "--steps", "1", "--rounds", "1"),
        *("--data", str(data_path), "--json", str(tmp_path / "r.json")),
    )
    assert "tiny" in out and "speedup" in out and (tmp_path / "r.json").is_file()


@pytest.mark.slow
def test_decode_benchmark(data_path):
    out = run_script(
        "onnx_generation.py",
        *("--models", "ladder-a", "--threads", "1", "--past-window-tokens", "4", "--data", str(data_path)),
    )
    assert out.count("| ladder-a |") == 5  # naive, PyTorch engine (KVBuffer, StaticCache), ONNX Runtime fp32, int8


def test_serving_benchmark():
    out = run_script(
        "serving.py",
        *("--model", "ladder-a", "--backends", "torch", "onnx", "--streams", "1", "3", "--tokens", "20"),
        *("--threads", "1", "--window-mode", "exact"),
    )
    assert "| torch | 3 | 3/3 |" in out and "| onnx | 1 | 1/1 |" in out
    out = run_script(
        "serving.py",
        *("--model", "ladder-a", "--backends", "torch", "--streams", "2", "--tokens", "10", "--threads", "1"),
        *("--over", "api"),
    )
    assert "| torch | 2 | 2/2 |" in out
