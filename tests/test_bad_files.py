"""The bad-file matrix: every damaged file of a model folder, through every entry point that loads one, gets a
clear error naming the problem (exit status 2 on the command lines, no traceback) and never a random model."""

from __future__ import annotations

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


def _pickle_only(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


# name -> (how the folder is damaged, the backends that read the damaged file, what the message says)
DAMAGE = {
    "weights truncated": (lambda f: _truncate(f / "model.safetensors", 100), ["torch"], "model.safetensors"),
    "weights empty": (lambda f: _truncate(f / "model.safetensors", 0), ["torch"], "model.safetensors"),
    "weights pickled only": (_pickle_only, ["torch"], "Pickled weights .* are not loaded.*To convert a file you trust"),
    "weights of another model": (_other_weights, ["torch"], "does not hold this model's weights"),
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
    "vocab not JSON": (lambda f: (f / "vocab.json").write_text("{"), ["torch", "onnx"], "vocab.json is not valid JSON"),
    "vocab missing": (lambda f: (f / "vocab.json").unlink(), ["torch", "onnx"], "vocabulary file not found"),
    "tokenizer.json disagrees": (
        lambda f: edit_json(f / "tokenizer.json", lambda t: t["model"]["vocab"].update(a=64)),
        ["torch", "onnx"],
        "disagree on the vocabulary",
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
