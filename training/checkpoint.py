"""Training checkpoints: everything needed to continue a run exactly, written atomically.

A checkpoint holds the model, optimizer and scheduler states, the step, the RNG and batch-sampler states of
every DDP rank, and a `run` record of the settings that must match for a resumed run to be the same run.
It is written to a temporary file in the same folder and renamed over the old one, so a process killed at any
moment leaves either the previous checkpoint or the new one, never half of one. Loading uses
`torch.load(weights_only=True)`: a checkpoint is data, and it never runs code.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from .outputs import BEST_NAME, CHECKPOINT_NAME, explain_write_error  # noqa: F401 (re-exported)

FORMAT_VERSION = 2
REQUIRED_KEYS = ("run", "model", "optimizer", "scheduler", "step", "rank_states")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: corrupt, or from an incompatible run."""


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """Writes `state` to a temporary file in the same folder, fsyncs it, then renames it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format_version": FORMAT_VERSION, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, (OSError, RuntimeError)):  # torch reports a full disk as a RuntimeError
            raise explain_write_error(e, path) from None
        raise


def read_checkpoint(path: str | os.PathLike) -> dict:
    """The raw contents of a checkpoint file; a clear `CheckpointError` when it is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint to resume from at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a damaged file
        raise CheckpointError(
            f"checkpoint {path} is corrupt or not a gpt-serve checkpoint ({type(e).__name__}: {e}). "
            f"Delete it to start over, or restore a good copy; refusing to restart silently."
        ) from None
    version = state.get("format_version") if isinstance(state, dict) else None
    if version not in (1, FORMAT_VERSION):
        raise CheckpointError(
            f"checkpoint {path} has format_version {version!r}; this version reads 1 and {FORMAT_VERSION}"
        )
    return _upgrade_v1(state) if version == 1 else state


def load_checkpoint(path: str | os.PathLike, expected: dict) -> dict:
    """Reads a training checkpoint and checks that it belongs to a run with the `expected` settings."""
    state = read_checkpoint(path)
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {missing}; it is not a complete training checkpoint")
    run = state["run"]
    for key, want in expected.items():
        if key not in run and key in _ADDED_IN_V2:
            continue  # a format-1 checkpoint did not record it
        got = run.get(key)
        if isinstance(want, dict) and isinstance(got, dict):
            got = {k: got.get(k) for k in want}  # only the entries this run cares about (e.g. model architecture)
        if got != want:
            raise CheckpointError(
                f"checkpoint {path} is incompatible with this run: {key} is {_short(got)} there and "
                f"{_short(want)} here. Resume with the settings of the checkpointed run, or use a fresh --out folder."
            )
    return state


_ADDED_IN_V2 = ("data_sha256", "weight_decay", "grad_clip", "betas", "eval_interval", "eval_iters")


def _upgrade_v1(state: dict) -> dict:
    """Format 1 (single process only) kept one rank's RNG states at the top level."""
    state = dict(state)
    state["rank_states"] = [{k: state.pop(k, None) for k in ("torch_rng", "cuda_rng", "batch_gen")}]
    state.setdefault("wall_time", state.get("train_time", 0.0))
    return state


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
