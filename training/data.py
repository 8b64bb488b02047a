"""Tiny Shakespeare: finding it, encoding it, splitting it the lesson's way and sampling random windows."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import urllib.request
from pathlib import Path

import torch

from gpt_serve import CharTokenizer

logger = logging.getLogger(__name__)

TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


def cache_dir() -> Path:
    import platformdirs

    return Path(os.environ.get("GPT_SERVE_CACHE", platformdirs.user_cache_dir("gpt-serve")))


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def download_tiny_shakespeare(dest: Path | None = None) -> Path:
    """Downloads Tiny Shakespeare once into the user cache, verifying its sha256."""
    dest = Path(dest or cache_dir() / "tinyshakespeare.txt")
    if dest.exists() and sha256_of(dest) == TINY_SHAKESPEARE_SHA256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    logger.info("downloading Tiny Shakespeare from %s to %s", TINY_SHAKESPEARE_URL, dest)
    with urllib.request.urlopen(TINY_SHAKESPEARE_URL, timeout=60) as r:
        payload = r.read()
    digest = hashlib.sha256(payload).hexdigest()
    if digest != TINY_SHAKESPEARE_SHA256:
        raise ValueError(f"downloaded file has sha256 {digest}, expected {TINY_SHAKESPEARE_SHA256}; not saved")
    fd, tmp = tempfile.mkstemp(dir=dest.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
    os.replace(tmp, dest)
    return dest


def load_text(path: str | os.PathLike | None = None) -> str:
    """The corpus at `path`, or Tiny Shakespeare (downloaded once) when `path` is None."""
    path = Path(path) if path is not None else download_tiny_shakespeare()
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path} (pass --data PATH to a UTF-8 text file)")
    text = path.read_text(encoding="utf-8")
    if len(text) < 2:
        raise ValueError(f"data file {path} has {len(text)} characters; training needs a real corpus")
    return text


class CharDataset:
    """The corpus as ids, split into the first `train_fraction` (train) and the rest (val), as in the lesson.

    Batches are random contiguous windows of `block_size + 1` ids (inputs and targets shifted by one), drawn
    with an explicit `torch.Generator` whose state is the sampler state a checkpoint saves.
    """

    def __init__(self, text: str, tokenizer: CharTokenizer, block_size: int, train_fraction: float = 0.9):
        if not 0.0 < train_fraction < 1.0:
            raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
        data = torch.tensor(tokenizer.vocab.encode(text), dtype=torch.long)
        n = int(train_fraction * len(data))
        self.splits = {"train": data[:n], "val": data[n:]}
        self.block_size = block_size
        for name, split in self.splits.items():
            if len(split) <= block_size:
                raise ValueError(
                    f"the {name} split has {len(split)} tokens, fewer than block_size + 1 = {block_size + 1}"
                )

    def get_batch(self, split: str, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        data = self.splits[split]
        ix = torch.randint(len(data) - self.block_size, (batch_size,), generator=generator)
        offsets = torch.arange(self.block_size + 1)
        windows = data[ix[:, None] + offsets]  # (B, block_size + 1)
        return windows[:, :-1], windows[:, 1:]
