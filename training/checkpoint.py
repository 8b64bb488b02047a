"""Training checkpoints: everything needed to continue a run exactly, written atomically."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: corrupt, or from an incompatible run."""


def save_checkpoint(path: Path, state: dict) -> None:
    """Writes `state` to a temporary file in the same folder, then renames it over `path` (atomic on POSIX)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ckpt-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format_version": FORMAT_VERSION, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_checkpoint(path: Path, expected: dict) -> dict:
    """Loads a checkpoint and checks it belongs to a run with the same `expected` settings (model config etc.)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint to resume from at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises several types for a damaged file
        raise CheckpointError(f"checkpoint {path} is corrupt or not a checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has an unknown format (expected format_version {FORMAT_VERSION})")
    for key, want in expected.items():
        got = state.get("run", {}).get(key)
        if got != want:
            raise CheckpointError(
                f"checkpoint {path} is incompatible with this run: {key} is {got!r} there and {want!r} here. "
                f"Use a fresh --out folder, or the same settings as the checkpointed run."
            )
    return state
