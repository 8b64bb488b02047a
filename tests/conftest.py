"""Shared fixtures: the Tiny Shakespeare corpus from ../shared/data, tiny models built on the spot, and one of
them exported to ONNX once per session."""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

# Tiny Shakespeare's 65 characters in id order (sorted), so that most tests need no corpus on disk;
# tests/chargpt/test_tokenizer.py checks them against the corpus.
from gpt_serve.folders.corpus import TINY_SHAKESPEARE_CHARS

ROOT = Path(__file__).resolve().parents[1]
DATA_PATH = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"


def pytest_configure(config):
    # Tiny models gain nothing from intra-op threads, and on a loaded 2-core machine OpenMP threads that spin
    # while waiting for each other make tests many times slower.
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def data_path() -> Path:
    if not DATA_PATH.is_file():
        pytest.fail(f"Tiny Shakespeare is expected at {DATA_PATH} (see ../shared/data/README.md)")
    return DATA_PATH


@pytest.fixture(scope="session")
def corpus(data_path) -> str:
    return data_path.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def tokenizer():
    from gpt_serve import CharTokenizer

    return CharTokenizer(chars=list(TINY_SHAKESPEARE_CHARS))


def edit_json(path: Path, change) -> None:
    """Rewrites the JSON file at `path` after `change(data)` edits it in place (damaging a model folder's files)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def make_tiny_model(seed: int = 0, **overrides):
    """A random tiny CharGPT (block_size 16, so tests cross the window quickly), in eval mode."""
    import torch

    from gpt_serve import CharGPTConfig, CharGPTForCausalLM

    kwargs = dict(vocab_size=65, block_size=16, n_embd=32, n_head=4, n_layer=2, dropout=0.0)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    return CharGPTForCausalLM(CharGPTConfig(**kwargs)).eval()


@pytest.fixture
def tiny_model():
    return make_tiny_model()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A saved tiny model folder (weights, config, tokenizer, module files)."""
    folder = tmp_path_factory.mktemp("tiny-model")
    model = make_tiny_model()
    model.config.vocab_sha256 = tokenizer.vocab.sha256  # as training records it
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def exported(tmp_path_factory, tiny_model_dir, corpus):
    """(folder, report) of the tiny model (`make_tiny_model()`) exported with validation (fp32 + int8), once."""
    from export.exporter import export_model

    folder = Path(shutil.copytree(tiny_model_dir, tmp_path_factory.mktemp("exported") / "tiny"))
    report = export_model(folder, text=corpus, text_source="tinyshakespeare.txt", threads=1, val_tokens=2048)
    return folder, report


@pytest.fixture(scope="session")
def exported_dir(exported) -> Path:
    """The exported tiny model's folder; tests that change files work on a copy (`shutil.copytree`)."""
    return exported[0]


@contextmanager
def busy_port():
    """A port on 127.0.0.1 that something is listening on, for as long as the block runs."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield busy.getsockname()[1]


def run_without_gpt_serve(script: str, cwd: Path, args: list[str] = ()):
    """Runs `script` (with `args` as its sys.argv[1:]) in a fresh Python process that cannot import gpt_serve (as a
    user of the model folder who has only transformers), offline; returns the CompletedProcess (text stdout and
    stderr)."""
    import os
    import subprocess
    import sys
    import textwrap

    blocker = textwrap.dedent("""
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "gpt_serve" or name.startswith("gpt_serve."):
                    raise ImportError("gpt_serve is blocked in this test")

        sys.meta_path.insert(0, Block())
    """)
    env = {**os.environ, "HF_HOME": str(cwd / "hf"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", blocker + textwrap.dedent(script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )


LADDER_SEEDS = {"ladder-a": 1, "ladder-b": 2}  # ladder-c..e stay missing: servers must say so


@pytest.fixture(scope="session")
def models_root(tmp_path_factory, tiny_model_dir, exported) -> Path:
    """tiny (block_size 16, with onnx/model.onnx and onnx/model_quantized.onnx), ladder-a and ladder-b (block 8),
    each with Tiny Shakespeare's corpus.json."""
    from gpt_serve import CharTokenizer
    from gpt_serve.folders.corpus_record import CorpusRecord, write_corpus_record

    root = tmp_path_factory.mktemp("demo-models")
    folder, report = exported
    assert report.passed, report
    shutil.copytree(folder, root / "tiny")
    tokenizer = CharTokenizer.from_pretrained(tiny_model_dir)
    for name, seed in LADDER_SEEDS.items():
        make_tiny_model(seed=seed, block_size=8, n_layer=1).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    for name in ("tiny", *LADDER_SEEDS):  # trained on Tiny Shakespeare, as the shipped ones say
        write_corpus_record(root / name, CorpusRecord.tiny_shakespeare())
    # what training writes next to a model: the compare view shows the last validation loss
    metrics = ['{"step": 0, "val_loss": 4.2}', "not json", '{"step": 9, "val_loss": 3.25}']
    (root / "ladder-a" / "metrics.jsonl").write_text("\n".join(metrics) + "\n")
    return root


@pytest.fixture(scope="session")
def registry(models_root):
    from gpt_serve.serving.registry import ModelRegistry

    return ModelRegistry.discover(models_root=models_root, threads=1)


@pytest.fixture
def link_outside(tmp_path):
    """Makes `link` (its folder created) a symbolic link to someone else's file, `tmp_path/outside.txt` holding
    `text`, and returns that file: what gpt-serve never writes through."""

    def make(link: Path, text: str = "someone else's\n") -> Path:
        outside = tmp_path / "outside.txt"
        outside.write_text(text)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(outside)
        return outside

    return make
