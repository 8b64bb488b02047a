"""Files stay inside their folder: the one rule every reader and writer of a model folder follows.

- **Readers take regular files only.** A FIFO, a device or a folder where a model file should be (`vocab.json` a
  FIFO, `model.safetensors` a link to `/dev/zero`) is a ValueError naming the file, before it is opened: opening a
  FIFO blocks until someone writes to it, and a device never ends. A link to a regular file is read (a Hugging Face
  cache's snapshot folders are made of links).
- **Writers never write through a symbolic link.** Where gpt-serve would write a file or a folder and finds a link
  there (`README.md` linked to a file elsewhere, `onnx/` linked to another folder, an output folder that is a link),
  it refuses with one line naming the path (`refuse_link`) and writes nothing: the link's target, outside the
  folder, is never changed, and the link is not silently replaced either. Files are written under a fresh name
  beside their destination and renamed over it (`write_file`), so no temporary name can be a link either.
- **Small files are read with a size cap.** A file that should be a few kilobytes (a JSON record) is read by
  `read_small`, which refuses anything larger before reading it.

Torch-free and pure Python: the ONNX Runtime path, the vocabulary and the loaders use it.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

_KINDS = {
    stat.S_ISDIR: "a folder",
    stat.S_ISFIFO: "a FIFO (named pipe)",
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
    stat.S_ISSOCK: "a socket",
}


def kind(mode: int) -> str:
    """What a file of `mode` (from `os.stat`) is, in words: "a FIFO (named pipe)", "a folder", ..."""
    return next((name for test, name in _KINDS.items() if test(mode)), "not a regular file")


def check_regular(path: str | os.PathLike) -> Path:
    """`path`, after a ValueError if something other than a regular file is there (a FIFO, a device, a folder; a
    link is followed and its target judged). A missing path is returned as is: the caller says it is missing."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing, a dangling link, unreadable: the caller's open() names it
        return path
    if not stat.S_ISREG(mode):
        via = f" (a link to {os.readlink(path)})" if path.is_symlink() else ""
        raise ValueError(f"{path} is not a regular file: it is {kind(mode)}{via}; gpt-serve reads only regular files")
    return path


def read_small(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of the regular file `path` (a link to one is followed), after a ValueError if it is something else
    or holds more than `max_bytes`: the size is checked on the open file before a byte is read, so a FIFO never
    blocks and a huge file is never loaded. A missing file is a FileNotFoundError."""
    path = check_regular(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # O_NONBLOCK: a FIFO swapped in does not block
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(
                f"{path} is not a regular file: it is {kind(info.st_mode)}; gpt-serve reads only regular files"
            )
        if info.st_size > max_bytes:
            raise ValueError(f"{path} has {info.st_size:,} bytes; such a file holds at most {max_bytes:,}")
        data = f.read(max_bytes + 1)  # a file growing while read is cut here, not read on
    if len(data) > max_bytes:
        raise ValueError(f"{path} has more than {max_bytes:,} bytes; such a file holds at most {max_bytes:,}")
    return data


def refuse_link(path: str | os.PathLike) -> Path:
    """`path`, after a ValueError if it is a symbolic link (gpt-serve never writes through one: see the module)."""
    path = Path(path)
    if path.is_symlink():
        raise ValueError(
            f"{path} is a symbolic link (to {os.readlink(path)}); gpt-serve never writes through a link: replace it "
            f"by a regular file or folder, or remove it"
        )
    return path


def write_file(path: str | os.PathLike, data: str | bytes, mode: int | None = None) -> Path:
    """Writes `data` (text as UTF-8) to `path` whole: into a fresh file beside it, renamed over it, so a reader sees
    the old file or the new one. Refuses a `path` that is a link (`refuse_link`) or exists and is not a regular
    file; `mode`: the new file's permissions (default: 0666 under the umask, as `open` would create it)."""
    from .writing import explain_write_error, file_mode

    path = refuse_link(path)
    if path.exists() and not path.is_file():
        raise ValueError(f"{path} is {kind(os.stat(path).st_mode)}, not a file gpt-serve may replace")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # O_EXCL: never a link
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, file_mode() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise explain_write_error(e, path) from None
        raise
    return path


def folder_to_write(path: str | os.PathLike) -> Path:
    """`path` as a folder to write files into, created if missing; refuses a link or a file there."""
    path = refuse_link(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} exists and is not a folder")
    path.mkdir(exist_ok=True)
    return path


__all__ = ["check_regular", "folder_to_write", "kind", "read_small", "refuse_link", "write_file"]
