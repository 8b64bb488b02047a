"""The checks a run makes before torch is imported: each bad flag or path answers at once, naming the flag."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from training.cli import main
from training.preflight import check_splits

ROOT = Path(__file__).resolve().parents[2]

# argv (after --out and --data) -> what the one error line says
BAD_RUNS = {
    "max-iters": (["--max-iters", "0"], "error: --max-iters must be >= 1, got 0"),
    "eval-iters": (["--eval-iters", "-1"], "error: --eval-iters must be >= 1, got -1"),
    "lr": (["--learning-rate", "0"], "error: --learning-rate must be > 0, got 0.0"),
    "model-key": (["--model.n_lyaer", "2"], "error: unknown model config argument(s) --model.n_lyaer;"),
    "data": (["--data", "{tmp}/missing.txt"], "error: data file not found: {tmp}/missing.txt"),
    "base": (["--init-from", "shakespear"], "error: --init-from: unknown model 'shakespear'"),
    "block": (["--init-from", "shakespeare", "--model.block_size", "256"], "error: --model.block_size 256 is longer"),
    "resume": (["--resume"], "error: --resume: no checkpoint to continue at"),
    "short": (["--data", "{tmp}/short.txt", "--preset", "tiny"], "error: the val split of --data {tmp}/short.txt"),
}


def test_bad_flags_and_paths_answer_before_torch_is_imported(tmp_path, small_data_path):
    """Each of these used to come 10-14 s after the command, once torch and transformers had been imported."""
    (tmp_path / "short.txt").write_text("a few words\n" * 2, encoding="utf-8")
    runs = {
        name: ["--out", str(tmp_path / name), "--data", str(small_data_path)] + [a.format(tmp=tmp_path) for a in args]
        for name, (args, _) in BAD_RUNS.items()
    }
    script = (
        "import contextlib, io, json, sys\n"
        "from training.cli import main\n"
        "out = {}\n"
        "for name, argv in json.loads(sys.argv[1]).items():\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        code = main(argv)\n"
        "    out[name] = [code, err.getvalue(), 'torch' in sys.modules or 'transformers' in sys.modules]\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(runs)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    for name, (_, message) in BAD_RUNS.items():
        code, err, imported = results[name]
        assert code == 2 and err.startswith(message.format(tmp=tmp_path)) and err.count("\n") == 1, (name, err)
        assert not imported, f"{name}: torch was imported before the error"


def test_a_text_too_short_says_what_to_do():
    with pytest.raises(ValueError) as e:
        check_splits(100, 128, "notes.txt")
    assert str(e.value) == (
        "the train split of --data notes.txt (its first 90%) has 90 characters, fewer than block_size + 1 = 129 (one "
        "training window): give more text, or lower --model.block_size (at most 9 for this text)"
    )
    check_splits(1000, 99)  # the val split's 100 characters hold one window of 100


def test_a_file_as_out_is_refused(tmp_path, small_data_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["--preset", "tiny", "--out", str(tmp_path / "file"), "--data", str(small_data_path)]) == 2
    assert (
        capsys.readouterr().err
        == f"error: --out {tmp_path / 'file'} is a file; give a folder (it is created if missing)\n"
    )
