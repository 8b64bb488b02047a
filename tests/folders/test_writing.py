"""gpt_serve.files: a new folder lands whole or not at all, with the usual modes; a failure leaves no trace."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from gpt_serve import files as writing
from gpt_serve.files import file_mode, write_new_folder


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


# --- gpt_serve.files: regular files in, nothing written through a link (issue 32) -------------------------------


def test_write_file_replaces_whole_with_the_usual_mode_and_leaves_no_temporary_file(tmp_path):
    from gpt_serve.files import write_file

    path = tmp_path / "README.md"
    path.write_text("old")
    write_file(path, "new")
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == file_mode()
    write_file(tmp_path / "blob", b"\x00\x01")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "blob"]


def test_no_writer_writes_through_a_link(tmp_path, link_outside):
    from gpt_serve.files import folder_to_write, write_file

    folder = tmp_path / "model"
    outside = link_outside(folder / "README.md", "someone else's")
    with pytest.raises(ValueError, match=r"model/README.md is a symbolic link \(to .*outside.txt\); gpt-serve never"):
        write_file(folder / "README.md", "text")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, folder / "onnx")
    with pytest.raises(ValueError, match="model/onnx is a symbolic link"):
        folder_to_write(folder / "onnx")
    os.symlink(elsewhere, tmp_path / "out")
    with pytest.raises(ValueError, match="out is a symbolic link"):
        write_new_folder(tmp_path / "out", two_files)
    with pytest.raises(ValueError, match="out is a symbolic link"):
        write_new_folder(tmp_path / "out", two_files, replace=True)
    assert outside.read_text() == "someone else's" and not any(elsewhere.iterdir())
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "onnx"]  # no temporary file left


def test_record_vocab_refuses_a_linked_config(tmp_path, tiny_model_dir):
    import shutil

    from gpt_serve.generation.model_folder import record_vocab_sha256

    folder = shutil.copytree(tiny_model_dir, tmp_path / "m")
    real = tmp_path / "config-elsewhere.json"
    os.replace(folder / "config.json", real)
    os.symlink(real, folder / "config.json")
    before = real.read_bytes()
    with pytest.raises(ValueError, match="config.json is a symbolic link"):
        record_vocab_sha256(folder)
    assert real.read_bytes() == before


@pytest.mark.parametrize("what", ["fifo", "device", "folder"])
def test_readers_name_what_is_not_a_regular_file(tmp_path, what):
    from gpt_serve.files import check_regular

    path = tmp_path / "vocab.json"
    if what == "fifo":
        os.mkfifo(path)
    elif what == "device":
        os.symlink("/dev/null", path)
    else:
        path.mkdir()
    kind = {"fifo": "a FIFO", "device": r"a character device \(a link to /dev/null\)", "folder": "a folder"}[what]
    with pytest.raises(ValueError, match=f"vocab.json is not a regular file: it is {kind}"):
        check_regular(path)
    (tmp_path / "real").write_text("{}")
    os.symlink(tmp_path / "real", tmp_path / "link")
    assert check_regular(tmp_path / "link") == tmp_path / "link"  # a link to a regular file is read (HF caches)
    assert check_regular(tmp_path / "missing") == tmp_path / "missing"  # the caller says it is missing


# --- a full disk is one line, whoever writes (issue 40: safetensors raised its own error) -----------------------

RUST_NO_SPACE = (
    'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
)


def test_a_full_disk_during_a_safetensors_write_is_the_same_one_line(tmp_path):
    """safetensors' `SafetensorError` carries no errno, only Rust's I/O error: it was a traceback where every other
    write says "no space left on the device"."""
    from safetensors import SafetensorError

    def weights(folder):
        raise SafetensorError(RUST_NO_SPACE)

    with pytest.raises(OSError, match=r"^\[Errno 28\] no space left on the device to write .*model\.new-") as e:
        write_new_folder(tmp_path / "model", weights)
    assert e.value.errno == errno.ENOSPC and list(tmp_path.iterdir()) == []

    def other(folder):
        raise SafetensorError("Error while serializing: a tensor shares memory")

    with pytest.raises(SafetensorError, match="shares memory"):  # not a full disk: raised as it is
        write_new_folder(tmp_path / "model", other)


def test_gpt_serve_copy_onto_a_full_disk_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    import transformers.modeling_utils
    from safetensors import SafetensorError

    from gpt_serve.cli import main

    def full(*args, **kwargs):
        raise SafetensorError(RUST_NO_SPACE)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    assert main(["copy", "ladder-a", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "no space left on the device to write" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
