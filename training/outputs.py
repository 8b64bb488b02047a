"""What a run leaves on disk, written so that a kill or a full disk never leaves a half-written file behind.

- The final model folder is written into a temporary folder inside the output folder, then moved in file by file
  (`publish_folder`), `config.json` last: until it lands, the folder is not a model folder (a loader says so), and
  each file is complete when it appears.
- Temporary files of an interrupted run (`.save-*/`, `checkpoints/.*.tmp`, `*.tmp`) are removed when the next run
  starts in the same folder (`remove_stale_temp_files`).
- A full disk is reported as one (`explain_write_error`): torch's serializer says "PytorchStreamWriter failed
  writing file" without naming the cause.
- Files get the usual permissions (0644 under the common umask), not the 0600 of a `tempfile` file.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

SAVE_PREFIX = ".save-"
LAST = "config.json"  # what makes a folder a model folder: moved in after everything else
LOW_SPACE_BYTES = 16 * 2**20


def file_mode() -> int:
    """The mode a newly created file gets under this process's umask (0644 under the usual 022)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def publish_folder(out: Path, write: Callable[[Path], None]) -> None:
    """Calls `write(tmp)` to write a model folder's files into a fresh temporary folder inside `out`, then moves
    them into `out`, `config.json` last. A failure (or a kill) before the moves leaves `out`'s previous files."""
    tmp = Path(tempfile.mkdtemp(prefix=SAVE_PREFIX, dir=out))
    try:
        try:
            write(tmp)
        except (OSError, RuntimeError) as e:
            raise explain_write_error(e, tmp) from None
        names = sorted(p.name for p in tmp.iterdir())
        mode = file_mode()
        for name in sorted(names, key=lambda n: n == LAST):
            path = tmp / name
            if path.is_file():
                os.chmod(path, mode)
            os.replace(path, out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_stale_temp_files(out: Path) -> list[Path]:
    """Removes what an interrupted run left in `out` (its temporary save folders and files); returns them."""
    stale = [p for p in out.glob(SAVE_PREFIX + "*") if p.is_dir()]
    stale += [p for p in (out / "checkpoints").glob(".*.tmp")] + [p for p in out.glob("*.tmp*")]
    for path in stale:
        logger.info("removing %s, left by an interrupted run", path)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale


def explain_write_error(error: BaseException, path: Path) -> BaseException:
    """`error` as raised while writing `path`, or an OSError saying the disk is full when it is."""
    full = isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
    if not full:
        try:
            full = shutil.disk_usage(path if path.is_dir() else path.parent).free < LOW_SPACE_BYTES
        except OSError:
            pass
    if full:
        return OSError(errno.ENOSPC, f"no space left on the device to write {path} ({type(error).__name__}: {error})")
    return error
