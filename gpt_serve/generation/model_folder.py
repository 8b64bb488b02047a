"""A model folder read and checked once (`ModelFolder.open`), then handed on whole: its path, config and vocabulary.

What is checked, before anything is built: the folder's files are regular files within their sizes (a FIFO or a link
to a device is named, never opened); `config.json` is a chargpt config whose every number is finite and within its
limit (`gpt_serve.chargpt.config_limits`); `vocab.json` is the model's: its size, and the `vocab_sha256` the config
records (without one, the lesson's sorted order), and `tokenizer.json` agrees with it. The weights and ONNX graphs
are checked by the backend that loads them (`gpt_serve.generation.backends.loading`). Torch-free.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..chargpt.config_limits import check_limits
from ..chargpt.vocab import FAST_TOKENIZER_FILE_NAME, VOCAB_FILE_NAME, CharVocab
from ..files import write_file
from ..models import CONFIG_FILE_NAME, DEFAULT_MODEL, check_model_files, model_path, read_config


@dataclass(frozen=True)
class ModelFolder:
    """A model folder read and checked once (`open`): its files are regular files within their sizes, its
    `config.json` a chargpt config whose every number is finite and within its limit, its `vocab.json` the model's
    (`check_vocab`). Backends, servers and training take it as it is; the weights and ONNX graphs are checked by the
    backend that loads them (`load_backend`)."""

    path: Path
    config: Mapping[str, Any]  # config.json, read-only
    vocab: CharVocab

    @classmethod
    def open(cls, model: str | os.PathLike | ModelFolder = DEFAULT_MODEL) -> ModelFolder:
        """The folder of a shipped model (by name) or a model folder (a path), read and checked; a `ModelFolder`
        is returned as it is. ValueError naming the file and what is wrong."""
        if isinstance(model, ModelFolder):
            return model
        path = model_path(model)
        check_model_files(path)  # regular files only: a FIFO as vocab.json would block, /dev/zero never ends
        config = read_config(path)
        check_config_numbers(path, config)
        return cls(path, MappingProxyType(config), check_vocab(path, config))


def check_config_numbers(folder: Path, config: Mapping[str, Any]) -> None:
    """A ValueError naming the field unless every number in `config.json` is finite (Python's json reads `NaN` and
    `Infinity`) and within its limit (`gpt_serve.chargpt.config_limits`: sizes, the model's total, `layer_norm_eps` > 0,
    `dtype` one of float32, float16, bfloat16)."""
    config_file = folder / CONFIG_FILE_NAME
    for key, value in config.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{config_file}: {key} is {value}, not a finite number; the model would compute NaN")
    try:
        check_limits(config)  # every size bounded, and their totals: before a tensor or a session is built
    except ValueError as e:
        raise ValueError(f"{config_file}: {e}") from None


RECORD_VOCAB_COMMAND = "gpt-serve record-vocab"


def check_vocab(folder: Path, config: Mapping[str, Any]) -> CharVocab:
    """The folder's `vocab.json`, checked against the model's config (its size and `vocab_sha256`; without a
    recorded hash, the lesson's sorted order) and the folder's `tokenizer.json`."""
    vocab_file, config_file = folder / VOCAB_FILE_NAME, folder / CONFIG_FILE_NAME
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
    text = json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    path = write_file(folder / CONFIG_FILE_NAME, text)
    return path, vocab.sha256
