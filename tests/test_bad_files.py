"""The bad-file matrix: every damaged file of a model folder, through every entry point that loads one, gets a
clear error naming the problem (exit status 2 on the command lines, no traceback) and never a random model."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from gpt_serve.generation import load_backend
from tests.conftest import edit_json


def _swap(vocab: dict) -> None:
    vocab["a"], vocab["e"] = vocab["e"], vocab["a"]


def _other_weights(folder: Path) -> None:
    from safetensors.torch import save_file

    from tests.conftest import make_tiny_model

    state = make_tiny_model(n_layer=1).state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))


def _nan_weights(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v.float().fill_(float("nan")) for k, v in state.items()}, str(folder / "model.safetensors"))


def _swap_both_unrecorded(folder: Path) -> None:
    """vocab.json and tokenizer.json swapped alike, and config.json's vocab_sha256 removed: consistent, but wrong."""
    edit_json(folder / "vocab.json", _swap)
    edit_json(folder / "tokenizer.json", lambda t: _swap(t["model"]["vocab"]))
    edit_json(folder / "config.json", lambda c: c.pop("vocab_sha256"))


def _pickle_only(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")


def _pad(path: Path, size: int) -> None:
    """`path` made `size` bytes long by spaces after its JSON: still the same JSON."""
    with open(path, "ab") as f:
        f.write(b" " * (size - path.stat().st_size))


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


# name -> (how the folder is damaged, the backends that read the damaged file, what the message says)
DAMAGE = {
    "weights truncated": (lambda f: _truncate(f / "model.safetensors", 100), ["torch"], "model.safetensors"),
    "weights empty": (lambda f: _truncate(f / "model.safetensors", 0), ["torch"], "model.safetensors"),
    "weights pickled only": (_pickle_only, ["torch"], "Pickled weights .* are not loaded.*To convert a file you trust"),
    "weights of another model": (_other_weights, ["torch"], "does not hold this model's weights"),
    "weights all NaN": (_nan_weights, ["torch"], r"model.safetensors holds NaN or infinite values in \d+ tensors"),
    "config layer_norm_eps NaN": (
        lambda f: edit_json(f / "config.json", lambda c: c.update(layer_norm_eps=float("nan"))),
        ["torch", "onnx"],
        "layer_norm_eps is nan, not a finite number",
    ),
    "config layer_norm_eps Infinity": (
        lambda f: edit_json(f / "config.json", lambda c: c.update(layer_norm_eps=float("inf"))),
        ["torch", "onnx"],
        "layer_norm_eps is inf, not a finite number",
    ),
    "config layer_norm_eps 0": (
        lambda f: edit_json(f / "config.json", lambda c: c.update(layer_norm_eps=0)),
        ["torch", "onnx"],
        "layer_norm_eps must be a number > 0",
    ),
    "config a JSON list": (lambda f: (f / "config.json").write_text("[1, 2]"), ["torch", "onnx"], "JSON object"),
    "config not JSON": (lambda f: (f / "config.json").write_text("{oops"), ["torch", "onnx"], "config.json"),
    "config vocab_size not the weights'": (
        lambda f: edit_json(f / "config.json", lambda c: c.update(vocab_size=66)),
        ["torch", "onnx"],
        "vocab_size 66",
    ),
    "vocab of the wrong size": (
        lambda f: edit_json(f / "vocab.json", lambda v: v.pop("z")),
        ["torch", "onnx"],
        "vocab.json has 64 characters",
    ),
    "vocab with swapped characters": (
        lambda f: (edit_json(f / "vocab.json", _swap), (f / "tokenizer.json").unlink()),
        ["torch", "onnx"],
        "not the vocabulary the model was trained with",
    ),
    "vocab and tokenizer.json swapped alike, no vocab_sha256": (
        _swap_both_unrecorded,
        ["torch", "onnx"],
        "records no vocab_sha256 and .*vocab.json is not in the lesson's sorted order.*gpt-serve record-vocab",
    ),
    "vocab not JSON": (lambda f: (f / "vocab.json").write_text("{"), ["torch", "onnx"], "vocab.json is not valid JSON"),
    "vocab missing": (lambda f: (f / "vocab.json").unlink(), ["torch", "onnx"], "vocabulary file not found"),
    "tokenizer.json disagrees": (
        lambda f: edit_json(f / "tokenizer.json", lambda t: t["model"]["vocab"].update(a=64)),
        ["torch", "onnx"],
        "disagree on the vocabulary",
    ),
    # issue 32: a config's numbers are bounded before anything is built (each was a 500, a traceback or a hang)
    "config block_size 10**400": (
        lambda f: edit_json(f / "config.json", lambda c: c.update(block_size=10**400)),
        ["torch", "onnx"],
        "block_size must be a positive integer of at most 65,536, got an integer of 401 digits",
    ),
    "config dtype code": (
        lambda f: edit_json(f / "config.json", lambda c: c.update(dtype="__import__('os')")),
        ["torch", "onnx"],
        r"dtype must be one of \['float32', 'float16', 'bfloat16'\]",
    ),
    "config n_layer 1000000": (
        lambda f: edit_json(f / "config.json", lambda c: c.update(n_layer=1000000)),
        ["torch", "onnx"],
        "n_layer must be a positive integer of at most 256, got 1000000",
    ),
    # issue 32: readers take regular files only (a FIFO blocked `gpt-serve generate`; /dev/zero was "no weights")
    "vocab a FIFO": (
        lambda f: ((f / "vocab.json").unlink(), os.mkfifo(f / "vocab.json")),
        ["torch", "onnx"],
        r"vocab.json is not a regular file: it is a FIFO",
    ),
    "weights a link to /dev/zero": (
        lambda f: ((f / "model.safetensors").unlink(), os.symlink("/dev/zero", f / "model.safetensors")),
        ["torch", "onnx"],
        r"model.safetensors is not a regular file: it is a character device \(a link to /dev/zero\)",
    ),
    # issue 40: a model folder's JSON files are read whole: each has a size limit, checked before it is read
    "config.json of 2 MiB": (
        lambda f: _pad(f / "config.json", 2 << 20),
        ["torch", "onnx"],
        r"config.json has 2,097,\d{3} bytes; a model folder's config.json holds at most 1,048,576",
    ),
    "generation_config.json of 2 MiB": (
        lambda f: _pad(f / "generation_config.json", 2 << 20),
        ["torch"],
        r"generation_config.json has 2,097,\d{3} bytes; a model folder's generation_config.json holds at most",
    ),
    "vocab.json past 64 MiB": (
        lambda f: os.truncate(f / "vocab.json", (64 << 20) + 1),  # (sparse: no disk used)
        ["torch", "onnx"],
        r"vocab.json has 67,108,865 bytes; a model folder's vocab.json holds at most 67,108,864",
    ),
    "onnx graph empty": (lambda f: _truncate(f / "onnx" / "model.onnx", 0), ["onnx"], "model.onnx"),
    "onnx graph truncated": (lambda f: _truncate(f / "onnx" / "model.onnx", 5000), ["onnx"], "model.onnx"),
}
CASES = [(name, backend) for name, (_, backends, _) in DAMAGE.items() for backend in backends]


@pytest.fixture
def damaged(request, exported_dir, tmp_path) -> tuple[Path, str, str]:
    name, backend = request.param
    damage, _, message = DAMAGE[name]
    folder = Path(shutil.copytree(exported_dir, tmp_path / "bad"))
    damage(folder)
    return folder, backend, message


def check_cli(code: int, err: str, message: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err and re.search(message, err), err


@pytest.mark.parametrize("damaged", CASES, indirect=True, ids=[f"{n} ({b})" for n, b in CASES])
def test_the_python_loading_api(damaged):
    folder, backend, message = damaged
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_backend(folder, backend, threads=1)


@pytest.mark.parametrize("damaged", CASES, indirect=True, ids=[f"{n} ({b})" for n, b in CASES])
def test_gpt_serve_generate(damaged, capsys):
    from gpt_serve.cli import main

    folder, backend, message = damaged
    code = main(["generate", str(folder), "--backend", backend, "--max-new-tokens", "3", "--threads", "1"])
    check_cli(code, capsys.readouterr().err, message)


@pytest.mark.parametrize("damaged", CASES, indirect=True, ids=[f"{n} ({b})" for n, b in CASES])
def test_demo_preload(damaged, capsys):
    """`python -m demo --model-dir bad=PATH --model bad` stops at preload, before it serves anything."""
    from demo.cli import main
    from tests.demo.conftest import free_port

    folder, backend, message = damaged
    argv = ["--model-dir", f"bad={folder}", "--model", "bad", "--backend", backend, "--port", str(free_port())]
    check_cli(main([*argv, "--models-root", str(folder.parent)]), capsys.readouterr().err, message)


TORCH_CASES = [(n, b) for n, b in CASES if b == "torch"]


@pytest.mark.parametrize("damaged", TORCH_CASES, indirect=True, ids=[f"{n} ({b})" for n, b in TORCH_CASES])
def test_export(damaged, capsys):
    from export.cli import main

    folder, _, message = damaged
    check_cli(main([str(folder), "--no-quantize", "--threads", "1"]), capsys.readouterr().err, message)


def test_record_vocab_makes_a_known_vocabulary_load(exported_dir, tmp_path, capsys):
    """The fix the refusal names: `gpt-serve record-vocab FOLDER` records the hash, and the folder loads with it (the
    vocabulary is then the recorded one: the check is the hash, not the order)."""
    from gpt_serve.cli import main

    folder = Path(shutil.copytree(exported_dir, tmp_path / "unsorted"))
    _swap_both_unrecorded(folder)
    with pytest.raises(ValueError, match="gpt-serve record-vocab"):
        load_backend(folder, "torch", threads=1)
    assert main(["record-vocab", str(folder)]) == 0
    assert "now records vocab_sha256" in capsys.readouterr().out
    assert load_backend(folder, "torch", threads=1).vocab.chars[0] == "\n"
    (folder / "vocab.json").write_text((exported_dir / "vocab.json").read_text("utf-8"), encoding="utf-8")
    with pytest.raises(ValueError, match="not the vocabulary the model was trained with"):
        load_backend(folder, "torch", threads=1)  # the sorted original no longer matches what was recorded


def test_a_sorted_vocabulary_without_a_hash_loads(exported_dir, tmp_path):
    folder = Path(shutil.copytree(exported_dir, tmp_path / "unrecorded"))
    edit_json(folder / "config.json", lambda c: c.pop("vocab_sha256"))
    assert len(load_backend(folder, "torch", threads=1).vocab) == 65
