"""Files stay inside their folder: the one rule every reader and writer of a model folder follows (docs/model.md).

Readers take regular files only (`check_regular`: a FIFO or a device is named, never opened) and small files with a
size cap (`read_small`, `read_json_file`, `json_max_bytes`); writers never write through a symbolic link
(`refuse_link`) and replace a file or a folder whole (`write_file`, `write_new_folder`), with the usual permissions
(`file_mode`) and a full disk named as one (`explain_write_error`). Torch-free and pure Python.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def read_json_object(path: str | os.PathLike) -> dict | None:
    """The JSON object in the file at `path`, None when there is no file; a ValueError naming the file when it is
    not a regular file, unreadable, not JSON, or not an object."""
    path = check_regular(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        raise ValueError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got a {type(data).__name__}")
    return data


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


# The JSON files of a model folder are read whole: a config or a record is a few hundred bytes; a vocabulary
# (`vocab.json`, `tokenizer.json`) about 20 bytes a character, so one of every Unicode code point fits.
JSON_MAX_BYTES = 1 << 20
VOCAB_JSON_MAX_BYTES = 64 << 20
VOCAB_JSON_NAMES = ("vocab.json", "tokenizer.json")


def json_max_bytes(name: str) -> int:
    """The most bytes a model folder's JSON file `name` may hold (`read_small` refuses a larger one unread)."""
    return VOCAB_JSON_MAX_BYTES if name in VOCAB_JSON_NAMES else JSON_MAX_BYTES


def read_json_file(path: str | os.PathLike) -> Any:
    """The JSON value of a model folder's file `path`, its size capped by its name (`json_max_bytes`)."""
    return json.loads(read_small(path, json_max_bytes(Path(path).name)).decode("utf-8"))


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


LOW_SPACE_BYTES = 16 * 2**20
NO_SPACE_SIGNS = ("No space left on device", "StorageFull", "Disk quota exceeded", "QuotaExceeded")


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
    # safetensors' SafetensorError carries no errno, only the text of Rust's I/O error
    full = full or any(sign in str(error) for sign in NO_SPACE_SIGNS)
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
    except Exception as e:  # OSError, torch's RuntimeError, safetensors' SafetensorError, ...
        explained = explain_write_error(e, tmp)
        if explained is e:
            raise
        raise explained from None
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


__all__ = [
    "check_regular",
    "explain_write_error",
    "file_mode",
    "fill",
    "folder_to_write",
    "is_free",
    "json_max_bytes",
    "kind",
    "read_json_file",
    "read_small",
    "refuse_link",
    "write_file",
    "write_new_folder",
]
