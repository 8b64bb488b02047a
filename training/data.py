"""Training data: the corpus as ids, split the lesson's way (`gpt_serve.folders.corpus`), and random windows."""

from __future__ import annotations

import torch

from gpt_serve import CharTokenizer
from gpt_serve.folders.corpus import TRAIN_FRACTION, train_val_split

from .preflight import check_splits


class CharDataset:
    """The corpus as ids, split into the first `train_fraction` (train) and the rest (val), as in the lesson.

    Batches are random contiguous windows of `block_size + 1` ids (inputs and the targets shifted by one),
    drawn with an explicit CPU `torch.Generator`: its state is the sampler state a checkpoint saves, and the
    same seed gives the same batches on every device.
    """

    def __init__(self, text: str, tokenizer: CharTokenizer, block_size: int, train_fraction: float = TRAIN_FRACTION):
        data = torch.tensor(tokenizer.vocab.encode(text), dtype=torch.long)
        train, val = train_val_split(data, train_fraction)
        self.splits = {"train": train, "val": val}
        self.block_size = block_size
        self.offsets = torch.arange(block_size + 1)
        check_splits(len(data), block_size, train_fraction=train_fraction)

    def to(self, device: torch.device) -> CharDataset:
        """Keeps the ids on `device` (the whole corpus is a few MB), so batches are gathered there."""
        self.splits = {k: v.to(device) for k, v in self.splits.items()}
        self.offsets = self.offsets.to(device)
        return self

    def get_batch(self, split: str, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), each (batch_size, block_size): `batch_size` random windows, y = x shifted left by one."""
        data = self.splits[split]
        # The lesson's `torch.randint(len(data) - block_size, (batch_size,))`, from our own generator.
        ix = torch.randint(len(data) - self.block_size, (batch_size,), generator=generator)
        windows = data[ix.to(data.device)[:, None] + self.offsets]  # (B, block_size + 1)
        return windows[:, :-1], windows[:, 1:]

    def tiled_windows(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) covering the whole split with non-overlapping windows (the tail that does not fit is left out).

        Every position of a random window is equally likely to be any of 0..block_size-1, so the mean loss over
        these windows estimates the same quantity as `estimate_loss`, without its sampling noise.
        """
        data = self.splits[split]
        n = (len(data) - 1) // self.block_size
        x = data[: n * self.block_size].view(n, self.block_size)
        y = data[1 : n * self.block_size + 1].view(n, self.block_size)
        return x, y
