"""gpt_serve.folders.corpus_record: the record a model folder keeps of its text (`corpus.json`), checked however it
is made, read back as written, a broken or hostile file one ValueError."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re

import pytest

from gpt_serve.folders import corpus_record as record_mod
from gpt_serve.folders.corpus import load_text
from gpt_serve.folders.corpus_record import (
    CorpusRecord,
    corpus_record_or_none,
    read_corpus_record,
    write_corpus_record,
)
from gpt_serve.models import CORPUS_FILE_NAME


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
    monkeypatch.setattr(record_mod, "load_text", lambda *a: pytest.fail("the file was read"))
    assert record.find_text() is None
    assert dataclasses.replace(record, characters=2000).find_text() is None  # 1000 bytes < 2000 characters


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
    with caplog.at_level(logging.WARNING, logger="gpt_serve.folders.corpus_record"):
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
