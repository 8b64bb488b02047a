"""gpt_serve.folders.corpus: Tiny Shakespeare found or downloaded (checksum-checked), any text file read, the lesson's
split, sample prompts."""

from __future__ import annotations

import hashlib
import io

import pytest

from gpt_serve.folders import corpus as data_mod
from gpt_serve.folders.corpus import download_tiny_shakespeare, load_text, sample_prompts, train_val_split


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


def test_sha256_of_hashes_in_chunks(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 9)
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    assert data_mod.sha256_of(path) == expected == data_mod.sha256_of(path, chunk=7)


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
