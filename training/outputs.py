"""What a run leaves on disk, written so that a kill or a full disk never leaves a half-written file behind.

- The final model folder is written into a temporary folder inside the output folder, then moved in file by file
  (`publish_folder`), `config.json` last: until it lands, the folder is not a model folder (a loader says so), and
  each file is complete when it appears.
- Temporary files of an interrupted run (`.save-*/`, `checkpoints/.*.tmp`, `metrics.tmp.jsonl`, `loss.tmp.png`,
  `snapshots/.step-*` folders) are removed when the next run starts in the same folder (`remove_stale_temp_files`),
  once it holds the folder's lock (`lock_folder`): a second run started by mistake never deletes a running one's
  files.
- Nothing is written through a symbolic link (`gpt_serve.files`): an output folder that is a link, or holds one
  (a file, `checkpoints/`, `snapshots/` or an entry of either), is refused when the run starts (`refuse_links`),
  before anything is written; the files moved in are checked again.
- A full disk is reported as one, and files get the usual permissions (`explain_write_error`, `file_mode`: the
  library's `gpt_serve.files`, which the importer shares).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from gpt_serve.files import LOW_SPACE_BYTES, explain_write_error, file_mode, fill, refuse_link  # noqa: F401 (re-exported)
from gpt_serve.folders.snapshots import SNAPSHOTS_DIR

from .snapshots import temp_folders

CHECKPOINTS_DIR = "checkpoints"  # in a run's folder: what --resume continues from
CHECKPOINT_NAME = "checkpoint.pt"
BEST_NAME = "best.pt"  # with --keep-best: the weights of the best validation loss


def checkpoint_file(out: str | os.PathLike, name: str = CHECKPOINT_NAME) -> Path:
    """`OUT/checkpoints/checkpoint.pt` (or another file of that folder)."""
    return Path(out) / CHECKPOINTS_DIR / name


logger = logging.getLogger(__name__)

SAVE_PREFIX = ".save-"
LAST = "config.json"  # what makes a folder a model folder: moved in after everything else
RENAMED_OUTPUTS = ("metrics.jsonl", "loss.png")  # written under `temp_path` and renamed (training/report.py)


def temp_path(path: Path) -> Path:
    """Where a file is written before it is renamed over `path` (its suffix kept: matplotlib reads the format from
    it); the next run removes it if a kill left it there."""
    return path.with_name(f"{path.stem}.tmp{path.suffix}")


def publish_folder(out: Path, write: Callable[[Path], None]) -> None:
    """Calls `write(tmp)` to write a model folder's files into a fresh temporary folder inside `out`, then moves
    them into `out`, `config.json` last. A failure (or a kill) before the moves leaves `out`'s previous files."""
    tmp = Path(tempfile.mkdtemp(prefix=SAVE_PREFIX, dir=out))
    try:
        fill(tmp, write)  # a full disk named as one; the usual file modes
        (out / LAST).unlink(missing_ok=True)  # a folder saved before: not a model folder until the new one lands
        for name in sorted((p.name for p in tmp.iterdir()), key=lambda n: (n == LAST, n)):
            os.replace(tmp / name, refuse_link(out / name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_stale_temp_files(out: Path) -> list[Path]:
    """Removes what an interrupted run left in `out` (its temporary save folders and files); returns them."""
    stale = [p for p in out.glob(SAVE_PREFIX + "*") if p.is_dir()]
    stale += list((out / CHECKPOINTS_DIR).glob(".*.tmp"))
    stale += [path for path in (temp_path(out / name) for name in RENAMED_OUTPUTS) if path.exists()]
    stale += temp_folders(out)
    for path in stale:
        logger.info("removing %s, left by an interrupted run", path)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale


def refuse_links(out: Path) -> None:
    """A ValueError naming the first symbolic link among what a run writes: `out` itself, an entry of it,
    `checkpoints/`, `snapshots/` or an entry of either. A run writes regular files into folders it made; a link's
    target may be anywhere."""
    for folder in (out, out / CHECKPOINTS_DIR, out / SNAPSHOTS_DIR):
        refuse_link(folder)
        if folder.is_dir():
            for path in sorted(folder.iterdir()):
                refuse_link(path)


def lock_folder(out: Path):
    """Holds an exclusive lock on `out/.lock` (an open file; released when it is closed, or the process ends); a
    ValueError if another process holds it."""
    import fcntl

    refuse_links(out)  # before the lock file is opened: it could be a link too
    out.mkdir(parents=True, exist_ok=True)
    handle = open(out / ".lock", "a+")  # noqa: SIM115 -- held for the run, closed by the caller
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise ValueError(
            f"another training run is using {out} (it holds {out / '.lock'}); choose another --out"
        ) from None
    return handle
