"""What a run checks before torch is imported: its folders, the model it starts from, its text.

torch and transformers take seconds to import; a mistyped path or a text too short for the context should answer
at once. The command line runs `prepare` right after parsing its flags, and `Trainer` runs it again (for callers
from Python), so every message names the flag to change. Torch-free.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt_serve.chargpt.vocab import CharVocab
from gpt_serve.folders.corpus import TRAIN_FRACTION, load_text, train_val_split
from gpt_serve.generation import ModelFolder
from gpt_serve.models import MODELS_DIR

from .config import CONFIG_DEFAULTS, TrainConfig
from .outputs import CHECKPOINTS_DIR, checkpoint_file

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BaseModel:
    """The model a run starts from (`--init-from`).

    Attributes:
        name: what the model card's `base_model` says: a shipped model's name, else the folder's name.
        source: its model folder, opened: the config and vocabulary read and checked (`ModelFolder.open`).
    """

    name: str
    source: ModelFolder

    @property
    def folder(self) -> Path:
        return self.source.path

    @property
    def config(self) -> Mapping[str, Any]:
        return self.source.config

    @property
    def vocab(self) -> CharVocab:
        return self.source.vocab

    @property
    def shipped(self) -> bool:
        return self.folder.parent == MODELS_DIR


@dataclass(frozen=True)
class Prepared:
    """What `prepare` found: the text, the base model (or None), the vocabulary and the context length."""

    text: str
    base: BaseModel | None
    vocab: CharVocab
    block_size: int

    @property
    def new_chars(self) -> list[str]:
        """The characters the vocabulary adds to the base's (none without a base: every one is new)."""
        return self.vocab.chars[len(self.base.vocab) :] if self.base is not None else []


def resolve_base(init_from: str) -> BaseModel:
    """The model folder `--init-from` names (a shipped model or a folder), its config and vocabulary checked."""
    path = Path(init_from)
    if path.is_file():
        raise ValueError(
            f"--init-from {init_from} is a file, not a model folder. A checkpoint of the lesson's gpt.py or of "
            f"nanoGPT becomes one with: gpt-serve import {init_from} FOLDER (then --init-from FOLDER)"
        )
    if path.is_dir() and not (path / "config.json").exists() and (path / CHECKPOINTS_DIR).is_dir():
        raise ValueError(
            f"--init-from {init_from} is a training run that has not saved its model yet (it has {CHECKPOINTS_DIR}/ "
            f"but no config.json): finish it with --resume, or start from one of its snapshots/ folders"
        )
    try:
        source = ModelFolder.open(init_from)
    except ValueError as e:  # an unknown name (the message lists the shipped ones), no config.json, a bad file
        raise ValueError(f"--init-from: {e}") from None
    folder = source.path
    name = folder.name if folder.parent == MODELS_DIR else folder.resolve().name
    return BaseModel(name, source)


def extend_vocab(base: CharVocab, text: str) -> CharVocab:
    """The base's characters in their ids, then the characters of `text` it lacks, sorted (the lesson's order for
    the new ones); the old ids stay as they were."""
    return CharVocab(base.chars + sorted(set(text) - set(base.chars)))


def block_size_of(cfg: TrainConfig, base: BaseModel | None) -> int:
    """The run's context length: `--model.block_size`, else the base's, else CharGPTConfig's default. A base
    cannot be given more positions than it learned."""
    if base is None:
        return int(cfg.model.get("block_size", CONFIG_DEFAULTS["block_size"]))
    learned = int(base.config["block_size"])
    wanted = int(cfg.model.get("block_size", learned))
    if wanted > learned:
        raise ValueError(
            f"--model.block_size {wanted} is longer than the context {base.name} was trained with ({learned} learned "
            f"positions): a model started from it can use at most {learned}. Lower --model.block_size, or leave it "
            f"out to keep {learned}"
        )
    return wanted


def check_splits(
    n_tokens: int, block_size: int, data: str | None = None, train_fraction: float = TRAIN_FRACTION
) -> None:
    """A ValueError saying what to do when a split of a text of `n_tokens` is too short for one training window
    (`block_size + 1` tokens); `data` is the `--data` it was read from."""
    lengths = dict(zip(("train", "val"), map(len, train_val_split(range(n_tokens), train_fraction))))
    for name, length in lengths.items():
        if length <= block_size:
            share = train_fraction if name == "train" else 1 - train_fraction
            part = f"{'first' if name == 'train' else 'last'} {share:.0%}"
            where = f"of --data {data} (its {part})" if data else f"(the {part} of the text)"
            raise ValueError(
                f"the {name} split {where} has {length} characters, fewer than block_size + 1 = "
                f"{block_size + 1} (one training window): give more text, or lower --model.block_size (at most "
                f"{max(1, min(lengths.values()) - 1)} for this text)"
            )


def check_folder(cfg: TrainConfig) -> None:
    """`--out` is a folder (or not there yet); `--resume` has a checkpoint to continue, a fresh run none."""
    out = Path(cfg.out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {cfg.out_dir} is a file; give a folder (it is created if missing)")
    checkpoint = checkpoint_file(out)
    if cfg.resume and not checkpoint.is_file():
        raise ValueError(
            f"--resume: no checkpoint to continue at {checkpoint}; run without --resume to start a run in {out}"
        )
    if not cfg.resume and checkpoint.exists():
        raise ValueError(
            f"{out} already holds a checkpoint ({checkpoint}); pass --resume to continue that run, or choose "
            f"another --out"
        )


def prepare(cfg: TrainConfig, text: str | None = None) -> Prepared:
    """Checks a run's options, folders, base model and text (read from `cfg.data` unless given), without torch."""
    cfg.validate()
    check_folder(cfg)
    base = resolve_base(cfg.init_from) if cfg.init_from is not None else None
    block_size = block_size_of(cfg, base)
    text = text if text is not None else load_text(cfg.data)
    check_splits(len(text), block_size, cfg.data)
    vocab = extend_vocab(base.vocab, text) if base is not None else CharVocab.from_text(text)
    return Prepared(text, base, vocab, block_size)
