"""gpt_serve.writing: a new folder lands whole or not at all, with the usual modes; a failure leaves no trace."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from gpt_serve import writing
from gpt_serve.writing import file_mode, write_new_folder


def two_files(folder):
    (folder / "config.json").write_text("{}")
    (folder / "sub").mkdir()
    (folder / "sub" / "model.bin").write_bytes(b"w")


def test_a_new_folder_lands_whole_with_the_usual_modes(tmp_path):
    out = write_new_folder(tmp_path / "a" / "b" / "model", two_files)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["config.json", "sub", "sub/model.bin"]
    assert stat.S_IMODE((out / "config.json").stat().st_mode) == file_mode()
    assert stat.S_IMODE(out.stat().st_mode) == file_mode() | 0o111  # not mkdtemp's 0700
    assert sorted(p.name for p in out.parent.iterdir()) == ["model"]  # no temporary folder left


def test_an_empty_folder_is_free_a_full_one_needs_replace(tmp_path):
    (tmp_path / "model").mkdir()
    write_new_folder(tmp_path / "model", two_files)
    with pytest.raises(ValueError, match="exists and is not empty"):
        write_new_folder(tmp_path / "model", two_files)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="exists and is not a folder"):
        write_new_folder(tmp_path / "file", two_files, replace=True)


def test_a_failure_leaves_no_trace_and_the_old_folder(tmp_path, monkeypatch):
    def half(folder):
        (folder / "config.json").write_text("{}")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="no space left on the device"):
        write_new_folder(tmp_path / "new" / "deeper" / "model", half)
    assert list(tmp_path.iterdir()) == []  # not even the parents it made

    old = write_new_folder(tmp_path / "model", two_files)
    real = os.replace

    def fail_second(src, dst):  # the new folder cannot be moved in: the old one must come back
        if ".new-" in str(src):
            raise OSError(errno.EIO, "I/O error")
        return real(src, dst)

    monkeypatch.setattr(writing.os, "replace", fail_second)
    with pytest.raises(OSError, match="I/O error"):
        write_new_folder(old, lambda f: (f / "other.json").write_text("{}"), replace=True)
    assert (old / "config.json").is_file() and not (old / "other.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_replace_swaps_the_old_folder_out(tmp_path):
    out = write_new_folder(tmp_path / "model", two_files)
    write_new_folder(out, lambda f: (f / "other.json").write_text("{}"), replace=True)
    assert sorted(p.name for p in out.iterdir()) == ["other.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
