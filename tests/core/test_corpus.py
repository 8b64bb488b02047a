"""gpt_serve.corpus: Tiny Shakespeare found or downloaded (checksum-checked), any text file read, the lesson's split."""

from __future__ import annotations

import hashlib
import io

import pytest

from gpt_serve import corpus as data_mod
from gpt_serve.corpus import download_tiny_shakespeare, load_text, train_val_split


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
