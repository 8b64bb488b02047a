"""The one way in: `load_backend(model, backend, threads)` turns a model name or folder into a ready backend.

Every application (the `gpt-serve` CLI, the demo, the export, the benchmarks) loads models through it, so every
backend gets the same checks of the folder before anything runs:

- the folder is a model folder whose files are regular files (`gpt_serve.files`: a FIFO or a link to a device is
  named, never opened), and its `config.json` is readable, a chargpt config, and every number in it is
  finite (`NaN` or `Infinity` in `layer_norm_eps` would make every logit NaN) and within its limit
  (`gpt_serve.chargpt.config_limits`: a config that would build a huge model, or none, is refused before anything is
  built);
- `vocab.json` is readable, as long as the model's vocabulary (`vocab_size`), the vocabulary the model was
  trained with (`vocab_sha256` in the config), and agrees with `tokenizer.json` (when present). A config without
  `vocab_sha256` is checked another way: its vocabulary must be in the lesson's order (`sorted(set(text))`, what
  training, the importer and nanoGPT write), which swapping or reordering characters breaks; an unsorted one is
  refused, with the command that records the hash (`gpt-serve record-vocab FOLDER`) for a vocabulary known to be
  right (`check_vocab`);
- torch: `model.safetensors` exists, is readable, and holds exactly the model's tensors, in the right shapes
  (transformers would otherwise load a folder of unrelated weights with everything "newly initialized"), and every
  weight is finite (`check_finite_weights`);
- ONNX Runtime: the graph exists, loads, and was exported from this folder's vocabulary, config and weights
  (`OnnxBackend` checks its metadata).

torch is imported only for the `torch` backend: the ONNX Runtime path needs numpy and onnxruntime alone.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ...chargpt.config_limits import check_limits
from ...chargpt.vocab import FAST_TOKENIZER_FILE_NAME, VOCAB_FILE_NAME, CharVocab
from ...extras import MissingDependency, missing_extra
from ...files import check_regular, write_file
from ...models import WEIGHTS_FILE_NAME, check_model_files, model_path, read_config
from ..fields import BACKENDS
from .interface import Backend
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
        MissingDependency: the backend's runtime is not installed (a ModuleNotFoundError; the message says what
            to install).
    """
    start = time.perf_counter()
    key = check_backend_key(backend)
    threads = check_threads(threads)
    folder = model_path(model)
    check_model_files(folder)  # regular files only: a FIFO as vocab.json would block, /dev/zero never ends
    config = read_config(folder)
    check_config_numbers(folder, config)
    vocab = check_vocab(folder, config)
    if key == "torch":
        runner = _torch_backend(folder, threads)
    else:
        try:
            from .onnx_backend import OnnxBackend
        except ImportError as e:  # numpy and onnxruntime: the `onnx` extra
            raise missing_extra(f"the {key} backend", "onnx", e) from None
        runner = OnnxBackend(folder, quantized=key == "onnx-int8", threads=threads)
    return LoadedModel(folder, key, runner, vocab, time.perf_counter() - start)


def check_config_numbers(folder: Path, config: dict) -> None:
    """A ValueError naming the field unless every number in `config.json` is finite (Python's json reads `NaN` and
    `Infinity`) and within its limit (`gpt_serve.chargpt.config_limits`: sizes, the model's total, `layer_norm_eps` > 0,
    `dtype` one of float32, float16, bfloat16)."""
    config_file = folder / "config.json"
    for key, value in config.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{config_file}: {key} is {value}, not a finite number; the model would compute NaN")
    try:
        check_limits(config)  # every size bounded, and their totals: before a tensor or a session is built
    except ValueError as e:
        raise ValueError(f"{config_file}: {e}") from None


RECORD_VOCAB_COMMAND = "gpt-serve record-vocab"


def check_vocab(folder: Path, config: dict) -> CharVocab:
    """The folder's `vocab.json`, checked against the model's config (its size and `vocab_sha256`; without a
    recorded hash, the lesson's sorted order) and the folder's `tokenizer.json`."""
    vocab_file, config_file = folder / VOCAB_FILE_NAME, folder / "config.json"
    vocab = CharVocab.from_file(vocab_file)
    if len(vocab) != config.get("vocab_size"):
        raise ValueError(
            f"{vocab_file} has {len(vocab)} characters but {config_file} says the model has vocab_size "
            f"{config.get('vocab_size')}: the vocabulary is not the model's"
        )
    recorded = config.get("vocab_sha256")
    if recorded is None and vocab.chars != sorted(vocab.chars):
        out_of_order = next(i for i in range(len(vocab) - 1) if vocab.chars[i] > vocab.chars[i + 1])
        raise ValueError(
            f"{config_file} records no vocab_sha256 and {vocab_file} is not in the lesson's sorted order (id "
            f"{out_of_order} is {vocab.chars[out_of_order]!r}, id {out_of_order + 1} is "
            f"{vocab.chars[out_of_order + 1]!r}): characters may be swapped, and the ids would decode to the wrong "
            f"letters. Restore the folder's original vocab.json; or, if this vocabulary is the one the model was "
            f"trained with, record it: {RECORD_VOCAB_COMMAND} {folder}"
        )
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

        from ... import CharGPTForCausalLM
        from .torch_backend import TorchBackend
    except ImportError as e:  # a torch-free install: numpy + onnxruntime and the package without dependencies
        raise MissingDependency(
            f"the torch backend needs PyTorch and transformers ({e}): pip install torch transformers, or use the "
            f"'onnx' or 'onnx-int8' backend",
            name=e.name,
        ) from None

    weights = check_regular(folder / WEIGHTS_FILE_NAME)
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
    check_finite_weights(model, weights)
    return TorchBackend(model)


def check_finite_weights(model, weights: Path) -> None:
    """A ValueError naming the first tensors that hold NaN or infinite values (`weights`: the file they came from).
    One pass over the parameters and buffers: milliseconds (docs/benchmarks.md, `benchmarks/finite_weights.py`)."""
    import torch

    def finite(t) -> bool:  # NaN propagates through min and max: two reductions, no tensor of flags
        return not t.is_floating_point() or not t.numel() or bool(torch.isfinite(torch.stack(torch.aminmax(t))).all())

    with torch.no_grad():
        bad = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if not finite(t)]
    if bad:
        raise ValueError(
            f"{weights} holds NaN or infinite values in {len(bad)} tensor{'s' if len(bad) > 1 else ''} "
            f"({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}): the model would compute NaN; train or save it "
            f"again"
        )


def record_vocab_sha256(model: str | os.PathLike) -> tuple[Path, str]:
    """Writes the sha256 of the folder's `vocab.json` into its `config.json` (`vocab_sha256`), which loading then
    checks (`check_vocab`); returns (config file, hash). For a folder whose vocabulary is known to be the model's:
    what it records is taken as right from then on. The file is replaced whole (a kill leaves the old one)."""
    folder = model_path(model)
    config = read_config(folder)
    vocab = CharVocab.from_file(folder / VOCAB_FILE_NAME)
    if len(vocab) != config.get("vocab_size"):
        check_vocab(folder, config)  # its message names the sizes
    config["vocab_sha256"] = vocab.sha256
    path = write_file(folder / "config.json", json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return path, vocab.sha256
