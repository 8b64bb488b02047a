"""Which earlier states of the model a run keeps (`--snapshots N`), and where.

A snapshot is the model as it was at one evaluation, kept as a complete model folder in
`OUT/snapshots/step-000200/` (`gpt_serve.folders.snapshots`: the layout the demo reads). The steps are a function of the
run's settings alone (`snapshot_steps`), so a resumed run keeps the same ones as an uninterrupted run; a snapshot
written again after a resume replaces the old one whole (`gpt_serve.files.write_new_folder`).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from gpt_serve.folders.snapshots import SNAPSHOTS_DIR

logger = logging.getLogger(__name__)


def snapshot_steps(max_iters: int, eval_interval: int, count: int) -> list[int]:
    """`count` evaluation steps spread evenly over the run, the last step (the model itself) and step 0 (untrained)
    excluded: 5000 steps evaluated every 500, 4 snapshots -> [1000, 2000, 3000, 4000]. All of them when the run
    evaluates no more often than that."""
    evals = list(range(eval_interval, max_iters, eval_interval))
    if count >= len(evals):
        return evals
    m, n = len(evals), count + 1
    # the i-th of n equal parts of the m + 1 gaps between step 0, the evaluations and the end, rounded half up
    return sorted({evals[(2 * i * (m + 1) + n) // (2 * n) - 1] for i in range(1, n)})


def temp_folders(out: Path) -> list[Path]:
    """What an interrupted snapshot write leaves in `OUT/snapshots/` (`write_new_folder`'s `.step-*.new-*` and
    `.step-*.old-*` folders); the next run in the folder removes them."""
    root = out / SNAPSHOTS_DIR
    return sorted(p for p in root.glob(".step-*") if p.is_dir()) if root.is_dir() else []


def remove_snapshots(out: Path) -> None:
    """A fresh run's start in `out`: the snapshots of an earlier run there go with its metrics (they would be
    shown beside a model they are no earlier states of)."""
    root = out / SNAPSHOTS_DIR
    if root.is_dir() and not root.is_symlink():
        logger.info("removing %s, the snapshots of an earlier run in %s", root, out)
        shutil.rmtree(root)
