"""Earlier states of a trained model, kept beside it: what the training writes and the demo compares.

A training run (`python -m training --snapshots N`) keeps a few of its earlier states as complete model folders in
`OUT/snapshots/step-000200/`, `OUT/snapshots/step-000400/`, ... (`snapshot_folder`): each is loadable like the
final model, with the same vocabulary and corpus record. Every folder the trainer writes, the final one included,
records which step its weights are from and their losses in `step.json` (`StepRecord`).

Torch-free: the demo reads these without the trainer (the applications never import each other).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..files import read_small, write_file

SNAPSHOTS_DIR = "snapshots"  # in a model folder: its earlier states, one folder each
STEP_FILE_NAME = "step.json"  # in a model folder written by training: the step of its weights and their losses
STEP_MAX_BYTES = 4096  # a record is under 100 bytes; a larger step.json is refused unread
_SNAPSHOT_NAME = re.compile(r"step-(\d{6,})")


def snapshot_name(step: int) -> str:
    """'step-000200': sorted by name, the folders sort by step."""
    return f"step-{step:06d}"


def snapshot_folder(model_folder: str | os.PathLike, step: int) -> Path:
    """Where the state of `step` is kept: `MODEL/snapshots/step-000200`."""
    return Path(model_folder) / SNAPSHOTS_DIR / snapshot_name(step)


def snapshot_step(folder: str | os.PathLike) -> int | None:
    """The step a snapshot folder's name says (`step-000200` -> 200); None for a name that is not a snapshot's."""
    m = _SNAPSHOT_NAME.fullmatch(Path(folder).name)
    return int(m.group(1)) if m else None


def snapshot_folders(model_folder: str | os.PathLike) -> list[Path]:
    """The model folder's snapshot folders (`snapshots/step-NNNNNN`, whatever they hold), by step; none when it
    has no `snapshots/`. Other entries (a run's temporary folders, a stray file) are not snapshots."""
    root = Path(model_folder) / SNAPSHOTS_DIR
    if not root.is_dir():
        return []
    found = [(step, p) for p in root.iterdir() if (step := snapshot_step(p)) is not None and p.is_dir()]
    return [path for _, path in sorted(found)]


@dataclass(frozen=True)
class StepRecord:
    """Which training step a model folder's weights are from, and their losses (the training's estimate: the mean
    over its evaluation batches). Checked when made: `step` a non-negative integer, the losses finite numbers."""

    step: int
    val_loss: float
    train_loss: float

    def __post_init__(self):
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise ValueError(f"step must be a non-negative integer, got {self.step!r}")
        for name in ("val_loss", "train_loss"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))

    def to_json(self) -> str:
        return json.dumps(asdict(self)) + "\n"


def write_step_record(folder: str | os.PathLike, record: StepRecord) -> Path:
    """Writes `record` as the folder's `step.json` (whole; never through a link: `gpt_serve.files.write_file`)."""
    return write_file(Path(folder) / STEP_FILE_NAME, record.to_json())


def read_step_record(folder: str | os.PathLike) -> StepRecord | None:
    """The folder's `step.json`, or None when it has none; a ValueError naming a broken one (not a regular file,
    over `STEP_MAX_BYTES`, not UTF-8 JSON, other keys, or values that fail `StepRecord`'s checks)."""
    path = Path(folder) / STEP_FILE_NAME
    if not path.exists() and not path.is_symlink():
        return None
    try:
        data = json.loads(read_small(path, STEP_MAX_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"cannot read {path}: {e}") from None
    keys = {"step", "val_loss", "train_loss"}
    if not isinstance(data, dict) or set(data) != keys:
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path} is not a step record: it must hold exactly {sorted(keys)}, got {got}")
    try:
        return StepRecord(**data)
    except ValueError as e:
        raise ValueError(f"{path} is not a step record: {e}") from None
