"""The one way in: `load_backend(model, backend, threads)` turns a model name or folder into a ready backend.

Every application (the `gpt-serve` CLI, the demo, the export, the benchmarks) loads models through it, so every
backend gets the same checks of the folder before anything runs:

- the folder is a model folder, and its `config.json` is readable and a chargpt config;
- `vocab.json` is readable, as long as the model's vocabulary (`vocab_size`), the vocabulary the model was
  trained with (`vocab_sha256` in the config, when recorded), and agrees with `tokenizer.json` (when present);
- torch: `model.safetensors` exists, is readable, and holds exactly the model's tensors, in the right shapes
  (transformers would otherwise load a folder of unrelated weights with everything "newly initialized");
- ONNX Runtime: the graph exists, loads, and was exported from this folder's vocabulary, config and weights
  (`OnnxBackend` checks its metadata).

torch is imported only for the `torch` backend: the ONNX Runtime path needs numpy and onnxruntime alone.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..models import WEIGHTS_FILE_NAME, model_path, read_config
from ..vocab import FAST_TOKENIZER_FILE_NAME, VOCAB_FILE_NAME, CharVocab
from .backend import Backend
from .spec import BACKENDS, resolve_backend  # noqa: F401 (the table of backends, re-exported)
from .threads import check_threads


@dataclass(frozen=True)
class LoadedModel:
    """A backend ready for the engine (`stream_text(loaded.backend, loaded.vocab, ...)`), and where it came from."""

    folder: Path
    backend_key: str
    backend: Backend
    vocab: CharVocab
    load_seconds: float

    @property
    def block_size(self) -> int:
        return int(self.backend.block_size)


def check_backend_key(key: object) -> str:
    """`key` if it names a backend (see `BACKENDS`); a ValueError listing them otherwise."""
    if not isinstance(key, str) or key not in BACKENDS:
        raise ValueError(f"unknown backend {key!r}; choose one of {list(BACKENDS)}")
    return key


def load_backend(
    model: str | os.PathLike = "shakespeare", backend: str = "torch", threads: int | None = None
) -> LoadedModel:
    """Loads a shipped model (by name) or a model folder for `backend` (`"torch"`, `"onnx"` or `"onnx-int8"`).

    `threads`: intra-op threads per forward pass (None: the runtime's default). For PyTorch the count is
    process-wide (`torch.set_num_threads`); each ONNX Runtime session has its own.

    Raises:
        ValueError: an unknown model or backend, or a folder whose files are missing, corrupt or do not match
            each other (the message names the file and what is wrong).
        FileNotFoundError: a file the backend needs is missing (the message says how to make it).
        ModuleNotFoundError: the backend's runtime is not installed (the message says what to install).
    """
    start = time.perf_counter()
    key = check_backend_key(backend)
    threads = check_threads(threads)
    folder = model_path(model)
    config = read_config(folder)
    vocab = check_vocab(folder, config)
    if key == "torch":
        runner = _torch_backend(folder, threads)
    else:
        from .onnx_backend import OnnxBackend

        runner = OnnxBackend(folder, quantized=key == "onnx-int8", threads=threads)
    return LoadedModel(folder, key, runner, vocab, time.perf_counter() - start)


def check_vocab(folder: Path, config: dict) -> CharVocab:
    """The folder's `vocab.json`, checked against the model's config and the folder's `tokenizer.json`."""
    vocab_file, config_file = folder / VOCAB_FILE_NAME, folder / "config.json"
    vocab = CharVocab.from_file(vocab_file)
    if len(vocab) != config.get("vocab_size"):
        raise ValueError(
            f"{vocab_file} has {len(vocab)} characters but {config_file} says the model has vocab_size "
            f"{config.get('vocab_size')}: the vocabulary is not the model's"
        )
    recorded = config.get("vocab_sha256")
    if recorded is not None and vocab.sha256 != recorded:
        raise ValueError(
            f"{vocab_file} is not the vocabulary the model was trained with: its sha256 is {vocab.sha256[:12]}... "
            f"but {config_file} records {str(recorded)[:12]}... (characters swapped, replaced or reordered). The "
            f"ids would decode to the wrong characters; restore the folder's original vocab.json"
        )
    fast = folder / FAST_TOKENIZER_FILE_NAME
    if fast.is_file():
        vocab.check_tokenizer_file(fast, vocab_file)
    return vocab


def _torch_backend(folder: Path, threads: int | None):
    try:
        import torch

        from .. import CharGPTForCausalLM
        from .torch_backend import TorchBackend
    except ImportError as e:  # a torch-free install: numpy + onnxruntime and the package without dependencies
        raise ModuleNotFoundError(
            f"the torch backend needs PyTorch and transformers ({e}): pip install torch transformers, or use the "
            f"'onnx' or 'onnx-int8' backend",
            name=e.name,
        ) from None

    weights = folder / WEIGHTS_FILE_NAME
    if not weights.is_file():
        found = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".safetensors"))
        raise FileNotFoundError(
            f"{folder} has no {WEIGHTS_FILE_NAME} (found: {found or 'no weights'}); save the model with "
            f"save_pretrained, which writes it. Pickled weights (pytorch_model.bin) are not loaded: they can run code. "
            f"To convert a file you trust: CharGPTForCausalLM.from_pretrained(folder, use_safetensors=False)"
            f".save_pretrained(folder)"
        )
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        model, info = CharGPTForCausalLM.from_pretrained(folder, use_safetensors=True, output_loading_info=True)
    except (OSError, RuntimeError, ValueError) as e:  # SafetensorError is an Exception: caught below
        raise ValueError(f"cannot load the weights in {weights}: {type(e).__name__}: {str(e)[:300]}") from None
    except Exception as e:
        if type(e).__name__ != "SafetensorError":
            raise
        raise ValueError(f"{weights} is truncated or corrupt ({e}); save the model again") from None
    problems = {k: info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys") if info.get(k)}
    if problems:
        shown = "; ".join(f"{k.replace('_', ' ')}: {sorted(map(str, v))[:5]}" for k, v in problems.items())
        raise ValueError(f"{weights} does not hold this model's weights ({shown})")
    return TorchBackend(model)
