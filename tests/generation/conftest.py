"""A numpy fake backend for the engine's unit tests: no torch, no files. And, for the structured outputs' tests, the
shipped model and a tiny model whose vocabulary writes JSON."""

from __future__ import annotations

import numpy as np
import pytest


class FakeBackend:
    """Logits that depend on every real token in the window and on its positions, computed from the cache.

    The cache is the (B, S) ids and mask of the columns seen so far, so the fake checks the engine's contract at
    every call (mask over past + new columns, positions inside the window) and a wrong window changes the tokens.
    """

    def __init__(self, block_size: int = 8, vocab_size: int = 11):
        self.block_size, self.vocab_size = block_size, vocab_size
        self.calls: list[tuple[int, int]] = []  # (cached columns, new columns) per forward

    def logits_of(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(B, V) from a window's ids and mask: a deterministic mix of its real tokens and their positions."""
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        score = ((ids * (positions + 3) * mask).sum(axis=1) * 7 + mask.sum(axis=1)) % self.vocab_size
        return np.eye(self.vocab_size, dtype=np.float32)[score] * 5.0 + np.linspace(0, 1, self.vocab_size)

    def forward(self, input_ids, attention_mask, position_ids, cache):
        past_ids, past_mask = cache if cache is not None else (input_ids[:, :0], attention_mask[:, :0])
        B, T = input_ids.shape
        assert attention_mask.shape == (B, past_ids.shape[1] + T), "the mask covers cached and new columns"
        position_ids = np.asarray(position_ids)
        assert position_ids.shape == (B, T) and 0 <= position_ids.min() and position_ids.max() < self.block_size
        assert attention_mask.shape[1] <= self.block_size, "the window never outgrows block_size"
        np.testing.assert_array_equal(attention_mask[:, : past_ids.shape[1]], past_mask)
        self.calls.append((past_ids.shape[1], T))
        ids = np.concatenate([past_ids, input_ids], axis=1)
        return self.logits_of(ids, attention_mask), (ids, attention_mask)

    def sequence_logits(self, ids):
        ids = np.asarray(ids, dtype=np.int64)[None]
        return np.concatenate([self.logits_of(ids[:, : t + 1], np.ones((1, t + 1), np.int64)) for t in range(ids.size)])

    def new_batch(self, max_rows: int) -> FakeBatch:
        return FakeBatch(self, max_rows)

    def window_logits(self, input_ids):
        positions = np.tile(np.arange(input_ids.shape[1]), (len(input_ids), 1))
        return self.forward(input_ids, np.ones_like(input_ids), positions, None)[0]


class FakeBatch:
    """The scheduler's `DecodeBatch` on the fake: every row keeps its own cache and steps through `forward`."""

    def __init__(self, backend: FakeBackend, max_rows: int):
        self.backend, self.max_rows, self.caches = backend, max_rows, []

    def __len__(self) -> int:
        return len(self.caches)

    def add(self, ids):
        assert len(self.caches) < self.max_rows
        ids = np.asarray(ids, dtype=np.int64)[None]
        logits, cache = self.backend.forward(ids, np.ones_like(ids), np.arange(ids.shape[1])[None], None)
        self.caches.append(cache)
        return logits[0]

    def add_rows(self, windows):
        """Each window prefilled alone; the batch changes only once every prefill has worked."""
        kept = list(self.caches)
        try:
            return np.stack([self.add(ids) for ids in windows])
        except BaseException:
            self.caches = kept
            raise

    def fork(self, sources):
        assert len(self.caches) + len(sources) <= self.max_rows
        self.caches += [self.caches[r] for r in sources]  # (a step replaces a row's cache, never changes it)

    def remove(self, row: int) -> None:
        last = self.caches.pop()
        if row < len(self.caches):
            self.caches[row] = last

    def step(self, tokens):
        out = []
        for r, cache in enumerate(self.caches):
            past = cache[0].shape[1]
            token = np.asarray(tokens[r : r + 1], dtype=np.int64)[None]
            logits, self.caches[r] = self.backend.forward(token, np.ones((1, past + 1), np.int64), [[past]], cache)
            out.append(logits[0])
        return np.stack(out)


@pytest.fixture
def fake():
    return FakeBackend()


def counting_windows(monkeypatch, block_size: int = 8) -> tuple[FakeBackend, list[int]]:
    """A fake whose `window_logits` records how many windows each call reads: (the fake, that list)."""
    backend = FakeBackend(block_size=block_size)
    windows: list[int] = []
    full = backend.window_logits
    monkeypatch.setattr(backend, "window_logits", lambda ids: windows.append(len(ids)) or full(ids))
    return backend, windows


@pytest.fixture(scope="session")
def shakespeare():
    from gpt_serve.generation import load_backend

    return load_backend("shakespeare", "onnx", threads=1)


@pytest.fixture(scope="session")
def json_model(tmp_path_factory):
    """A tiny random-weights model whose vocabulary is printable ASCII and a newline: only the mask can make its
    text valid JSON."""
    import string

    from gpt_serve import CharTokenizer
    from gpt_serve.generation import load_backend
    from tests.conftest import make_tiny_model

    folder = tmp_path_factory.mktemp("json-model")
    vocab = sorted(set(string.printable) - set("\t\r\x0b\x0c"))
    tokenizer = CharTokenizer(chars=vocab)
    model = make_tiny_model(vocab_size=len(vocab), block_size=64)
    model.config.vocab_sha256 = tokenizer.vocab.sha256
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return load_backend(str(folder), "torch", threads=1)
