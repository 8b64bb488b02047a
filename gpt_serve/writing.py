"""Writing files so that a kill or a full disk never leaves a half-written one behind.

- `write_new_folder`: a folder written whole or not at all. The files go into a temporary folder beside it, which is
  renamed to the destination once every file is written: until then the destination does not exist (or, replaced,
  is still the old folder).
- `explain_write_error`: a full disk reported as one (torch's serializer says "PytorchStreamWriter failed writing
  file" without naming the cause).
- `file_mode`: the usual permissions (0644 under the common umask), not the 0600 of a `tempfile` file.
- One file replaced whole, and the rule that nothing is written through a symbolic link: `gpt_serve.files`
  (`write_file`, `refuse_link`); `write_new_folder` refuses an output folder that is a link.

Torch-free. The training app (`training/outputs.py`) and the importer (`gpt_serve.importing`) share them.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from .files import refuse_link

LOW_SPACE_BYTES = 16 * 2**20


def file_mode() -> int:
    """The mode a newly created file gets under this process's umask (0644 under the usual 022)."""
    return 0o666 & ~_umask()


def _umask() -> int:
    try:  # Linux: read it (setting it to read it back would change it for every thread for a moment)
        with open("/proc/self/status", encoding="ascii") as f:
            return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)
    except (OSError, StopIteration, ValueError):
        umask = os.umask(0o022)
        os.umask(umask)
        return umask


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


def fill(tmp: Path, write: Callable[[Path], None]) -> None:
    """Calls `write(tmp)` (a full disk reported as one, `explain_write_error`), then gives what it wrote the usual
    permissions (`file_mode`; folders also searchable), `tmp` itself included (a `mkdtemp` folder is 0700)."""
    try:
        write(tmp)
    except (OSError, RuntimeError) as e:
        raise explain_write_error(e, tmp) from None
    mode = file_mode()
    for path in (tmp, *tmp.rglob("*")):
        if path.is_symlink():  # chmod would change the link's target, which may be anywhere
            continue
        os.chmod(path, (mode | 0o111) if path.is_dir() else mode)


def is_free(path: Path) -> bool:
    """Whether a new folder may be written at `path` without replacing anything: nothing there, or an empty folder."""
    return not path.exists() or (path.is_dir() and not any(path.iterdir()))


def write_new_folder(out: str | os.PathLike, write: Callable[[Path], None], replace: bool = False) -> Path:
    """Calls `write(tmp)` to fill a fresh temporary folder beside `out`, then renames it to `out`; returns `out`.

    `out` must be free (`is_free`) unless `replace`, which swaps the old folder out only once the new one is
    complete. A failure (an exception from `write`, a full disk, a kill) leaves no trace: no `out` (or the old
    one), no temporary folder, no parent folder created for it.
    """
    out = refuse_link(out)  # a link's target, wherever it is, is never filled or swapped out (`gpt_serve.files`)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a folder")
    if not (replace or is_free(out)):
        raise ValueError(f"{out} exists and is not empty; choose another output folder or replace it (--force)")
    created = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))
    old = None
    try:
        fill(tmp, write)
        if out.exists() and not is_free(out):
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old)  # an empty folder is replaced by the rename itself
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists():
            os.replace(old, out)  # the new folder did not land: the old one goes back
        for parent in created:  # innermost first
            try:
                parent.rmdir()
            except OSError:
                break
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out
