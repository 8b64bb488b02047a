"""gpt_serve.folders.corpus: Tiny Shakespeare found or downloaded (checksum-checked), any text file read, the lesson's
split."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import re

import pytest

from gpt_serve.folders import corpus as data_mod
from gpt_serve.folders.corpus import (
    CORPUS_FILE_NAME,
    CorpusRecord,
    corpus_record_or_none,
    download_tiny_shakespeare,
    load_text,
    read_corpus_record,
    sample_prompts,
    train_val_split,
    write_corpus_record,
)


def test_the_split_is_the_first_90_percent():
    train, val = train_val_split("abcdefghij")
    assert (train, val) == ("abcdefghi", "j")
    train, val = train_val_split(list(range(105)))
    assert len(train) == 94 and train + val == list(range(105))
    with pytest.raises(ValueError, match=r"train_fraction must be in \(0, 1\)"):
        train_val_split("abc", 1.0)


def test_missing_data_file_gives_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="data file not found: .*nope.txt .*--data"):
        load_text(tmp_path / "nope.txt")


def test_non_utf8_data_file_gives_a_clear_error(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("café au lait".encode("latin-1"))
    with pytest.raises(ValueError, match="not UTF-8"):
        load_text(path)


class _FakeURL:
    """Stands in for urllib.request.urlopen: serves `payload` and counts calls (tests never download)."""

    def __init__(self, payload: bytes):
        self.payload, self.calls = payload, 0

    def __call__(self, url, timeout=None):
        self.calls += 1
        assert url == data_mod.TINY_SHAKESPEARE_URL
        return io.BytesIO(self.payload)


def test_download_keeps_the_file_only_if_its_sha256_matches(tmp_path, monkeypatch, data_path):
    monkeypatch.setenv("GPT_SERVE_CACHE", str(tmp_path / "cache"))
    bad = _FakeURL(b"not shakespeare")
    monkeypatch.setattr(data_mod.urllib.request, "urlopen", bad)
    with pytest.raises(ValueError, match="sha256"):
        load_text(None)
    assert not (tmp_path / "cache" / "tinyshakespeare.txt").exists() and bad.calls == 1

    good = _FakeURL(data_path.read_bytes())
    monkeypatch.setattr(data_mod.urllib.request, "urlopen", good)
    path = download_tiny_shakespeare()
    assert path == tmp_path / "cache" / "tinyshakespeare.txt"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == data_mod.TINY_SHAKESPEARE_SHA256
    assert load_text(None) == data_path.read_text(encoding="utf-8")
    assert good.calls == 1  # downloaded once, then read from the cache
    assert [p.name for p in path.parent.iterdir()] == ["tinyshakespeare.txt"]  # no temporary file left


def test_a_damaged_cached_copy_is_downloaded_again(tmp_path, monkeypatch, data_path):
    monkeypatch.setenv("GPT_SERVE_CACHE", str(tmp_path))
    (tmp_path / "tinyshakespeare.txt").write_text("truncated")
    fake = _FakeURL(data_path.read_bytes())
    monkeypatch.setattr(data_mod.urllib.request, "urlopen", fake)
    assert data_mod.sha256_of(download_tiny_shakespeare()) == data_mod.TINY_SHAKESPEARE_SHA256 and fake.calls == 1


# -- corpus.json: the record a model folder keeps of its text -----------------------------------------------------


def test_the_shipped_folders_record_tiny_shakespeare_as_the_record_writes_it():
    """gpt_serve/models/*/corpus.json are `CorpusRecord.tiny_shakespeare()`, written by
    `write_corpus_record(folder, CorpusRecord.tiny_shakespeare())`."""
    from gpt_serve.models import MODELS_DIR

    folders = sorted(p.parent for p in MODELS_DIR.glob(f"*/{CORPUS_FILE_NAME}"))
    assert [f.name for f in folders] == ["ladder-a", "ladder-b", "ladder-c", "ladder-d", "ladder-e", "shakespeare"]
    for folder in folders:
        assert read_corpus_record(folder) == CorpusRecord.tiny_shakespeare(), folder
        assert (folder / CORPUS_FILE_NAME).read_text(encoding="utf-8") == CorpusRecord.tiny_shakespeare().to_json()


def test_the_export_finds_a_training_text_with_crlf_line_ends(tmp_path):
    """Training reads the text with newlines translated and hashes that; finding it again hashes the same."""
    path = tmp_path / "windows.txt"
    path.write_bytes(b"FIRST:\r\nHello there.\r\n\r\nSECOND:\r\nGood day to you.\r\n" * 20)
    text = load_text(path)
    assert "\r" not in text
    record = CorpusRecord.of(text, path)
    assert record.find_text() == text  # the text it checked, read once
    path.write_bytes(path.read_bytes().replace(b"Hello", b"Jello"))  # changed since: same size, another hash
    assert record.find_text() is None and "has changed since" in record.missing_text_message()


def test_a_file_whose_size_cannot_hold_the_recorded_text_is_not_read(tmp_path, monkeypatch):
    path = tmp_path / "big.txt"
    path.write_text("x" * 1000, encoding="utf-8")
    record = CorpusRecord("big", "d", sha256="0" * 64, source=str(path), characters=10)  # 1000 bytes > 4 x 10
    monkeypatch.setattr(data_mod, "load_text", lambda *a: pytest.fail("the file was read"))
    assert record.find_text() is None
    assert dataclasses.replace(record, characters=2000).find_text() is None  # 1000 bytes < 2000 characters


def test_sha256_of_hashes_in_chunks(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 9)
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    assert data_mod.sha256_of(path) == expected == data_mod.sha256_of(path, chunk=7)


GOOD = dict(name="t", description="d")


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(name=""), "'name' must be a non-empty string"),
        (dict(name="   "), "'name' must be a non-empty string"),
        (dict(name=3), "'name' must be a non-empty string"),
        (dict(description="x" * 501), "'description' is 501 characters long; the limit is 500"),
        (dict(name="two\nlines"), "'name' must be one line"),
        (dict(prompts="ROMEO:"), "'prompts' must be a list of strings"),
        (dict(prompts=("a",) * 17), "holds 17 prompts; a record holds at most 16"),
        (dict(prompts=("",)), "each prompt must be a string of 1 to 500 characters"),
        (dict(prompts=("x" * 501,)), "each prompt must be a string of 1 to 500 characters"),
        (dict(prompts=(1,)), "each prompt must be a string"),
        (dict(characters=True), "'characters' must be a non-negative integer"),
        (dict(characters=-1), "'characters' must be a non-negative integer"),
        (dict(characters=1.0), "'characters' must be a non-negative integer"),
        (dict(sha256="abc"), "'sha256' must be 64 lowercase hex digits"),
        (dict(sha256="G" * 64), "'sha256' must be 64 lowercase hex digits"),
        (dict(source="relative/path.txt"), "'source' must be an absolute path"),
        (dict(source=5), "'source' must be an absolute path"),
    ],
)
def test_every_record_is_checked_however_it_is_made(tmp_path, changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        CorpusRecord(**{**GOOD, **changes})
    data = {**GOOD, **changes}
    data = {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}
    (tmp_path / CORPUS_FILE_NAME).write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"corpus.json: .*{re.escape(message)}"):
        read_corpus_record(tmp_path)


def test_a_record_strips_its_words_and_reads_back_what_it_writes(tmp_path):
    record = CorpusRecord("  my text ", " a slice\t", ["A:", "B:"], "a" * 64, str(tmp_path / "t.txt"), 0)
    assert (record.name, record.description, record.prompts) == ("my text", "a slice", ("A:", "B:"))
    write_corpus_record(tmp_path, record)
    assert read_corpus_record(tmp_path) == record
    assert record.public() == {"name": "my text", "description": "a slice", "prompts": ["A:", "B:"]}
    assert CorpusRecord.of("some text\n" * 3, tmp_path / "a\nb.txt").name == "a b.txt"  # a file's name, one line


@pytest.mark.parametrize(
    "content, message",
    [
        (b"[" * 60_000, "nested too deep"),  # json's RecursionError, under the size cap
        (b"[" * 100_000, "100,000 bytes; such a file holds at most 65,536"),  # refused before it is read
        (b'{"name": "t", "description": "d", "x": 1}', "unknown fields ['x']"),
        (b'{"name": "t"}', "lacks ['description']"),
        (b"\xff\xfe", "cannot read"),
        (b"[]", "must hold a JSON object"),
    ],
)
def test_a_hostile_corpus_json_is_one_value_error(tmp_path, content, message, caplog):
    (tmp_path / CORPUS_FILE_NAME).write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(message)):
        read_corpus_record(tmp_path)
    with caplog.at_level(logging.WARNING, logger="gpt_serve.folders.corpus"):
        assert corpus_record_or_none(tmp_path) is None  # what a surface presenting the model does: logs, goes on
    assert message in caplog.text and "is ignored" in caplog.text


def test_a_corpus_json_that_is_a_fifo_or_a_link_to_a_huge_file_is_refused_unread(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "a").mkdir()
    os.symlink(fifo, tmp_path / "a" / CORPUS_FILE_NAME)
    with pytest.raises(ValueError, match="FIFO"):
        read_corpus_record(tmp_path / "a")
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(2**30)  # sparse: 1 GiB that is never read
    (tmp_path / "b").mkdir()
    os.symlink(huge, tmp_path / "b" / CORPUS_FILE_NAME)
    with pytest.raises(ValueError, match="1,073,741,824 bytes"):
        read_corpus_record(tmp_path / "b")
    assert read_corpus_record(tmp_path) is None  # no corpus.json: no record


def test_the_record_is_written_never_through_a_link(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text("someone else's\n", encoding="utf-8")
    (tmp_path / "model").mkdir()
    os.symlink(target, tmp_path / "model" / CORPUS_FILE_NAME)
    with pytest.raises(ValueError, match="symbolic link"):
        write_corpus_record(tmp_path / "model", CorpusRecord("t", "d"))
    assert target.read_text(encoding="utf-8") == "someone else's\n"


def test_sample_prompts_are_paragraph_starts_of_the_training_split():
    paragraphs = [f"SPEAKER {i}:\nline {i} of a speech that goes on and on well past the cut" for i in range(20)]
    text = "\n\n".join(paragraphs) + "\n"
    assert sample_prompts(text, n=4) == (  # 19 paragraphs start in the first 90%; each cut at a space by 48
        "SPEAKER 0:\nline 0 of a speech that goes on and",
        "SPEAKER 4:\nline 4 of a speech that goes on and",
        "SPEAKER 9:\nline 9 of a speech that goes on and",
        "SPEAKER 14:\nline 14 of a speech that goes on",
    )
    assert sample_prompts("a\n\n\nb", n=5) == ("a", "b")  # a text under 10 characters is not split
