"""What computes the logits: the `Backend` protocol every backend implements, its `DecodeBatch`, and the checks of
what a backend is given (`check_token_ids`). numpy only.

`TorchBackend` (`torch_backend`) and `OnnxBackend` (`onnx_backend`) implement it; the scheduler (`scheduler`), the
one token loop of this package, drives them through nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np


class DecodeBatch(Protocol):
    """The rows decoding together and their KV caches, kept by the backend (`backend.new_batch(max_rows)`).

    Rows are numbered 0..len-1: a new row is the last one, and removing a row moves the last row into its place."""

    def __len__(self) -> int: ...

    def add(self, ids: Sequence[int]) -> np.ndarray:
        """Prefills `ids` (a window: positions 0..len-1) as a new last row; returns the logits (V,) of its last
        position."""

    def add_rows(self, windows: Sequence[Sequence[int]]) -> np.ndarray:
        """Prefills windows of one length together as new last rows (in order); returns their logits (rows, V)."""

    def fork(self, sources: Sequence[int]) -> None:
        """Adds new last rows (in order), the new row j a copy of row `sources[j]`: its KV cache copied, no forward
        pass. The `n` choices of one prompt prefill it once and fork (`RunningBatch.join`); a copy decodes exactly
        as its source would, so its tokens are those it would make prefilled alone."""

    def remove(self, row: int) -> None: ...

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Appends one token (int64 (rows,)) to every row; returns the logits (rows, V)."""


@runtime_checkable
class Backend(Protocol):
    """A model that computes next-token logits.

    - `forward(input_ids, attention_mask, position_ids, cache) -> (last_logits, cache)`: int64 arrays `input_ids`
      (B, T) and `position_ids` (B, T), an int64 `attention_mask` (B, past + T) over the cached and new columns, and
      an opaque `cache` (None = start empty); float logits (B, vocab) of the last position and the cache extended by
      the T new tokens (the export's validation and the backends' own prefills use it);
    - `new_batch(max_rows)`: an empty `DecodeBatch`, what the scheduler decodes on;
    - `window_logits(ids)`: logits (B, vocab) of the last token of B full windows (B, T) at positions 0..T-1, no
      cache: what `window_mode="exact"` runs for every token past `block_size`;
    - `sequence_logits(ids)`: logits (T, vocab) of every position of one window (T,), no cache: a prompt's own
      logprobs (`generation.logprobs`).
    """

    block_size: int
    vocab_size: int

    def forward(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray, cache: Any
    ) -> tuple[np.ndarray, Any]: ...

    def new_batch(self, max_rows: int) -> DecodeBatch: ...

    def window_logits(self, input_ids: np.ndarray) -> np.ndarray: ...

    def sequence_logits(self, ids: np.ndarray) -> np.ndarray: ...


def left_pad(prompts: Sequence[Sequence[int]], extra: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) of shape (B, longest + extra) for `forward`: prompts right-aligned, padding (id 0, mask 0) on the
    left, as transformers' decoders take a batch."""
    if not prompts:
        raise ValueError("no prompts given")
    longest = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), longest + extra), dtype=np.int64)
    mask = np.zeros_like(ids)
    for b, p in enumerate(prompts):
        if len(p):
            ids[b, longest - len(p) : longest] = p
            mask[b, longest - len(p) : longest] = 1
    return ids, mask


def check_token_ids(ids, vocab_size: int, name: str = "input_ids") -> None:
    """A ValueError naming the first ten ids of `ids` (a sequence or an array of any shape, in order) outside the
    vocabulary [0, vocab_size): an id past it would be embedded as some other row of the table, or not at all. The
    one check of ids against a vocabulary: the scheduler's of a prompt, the ONNX backend's of its inputs."""
    ids = np.asarray(ids)
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise ValueError(f"{name} holds ids {bad[:10].tolist()} outside the vocabulary [0, {vocab_size - 1}]")


def check_fork(sources: Sequence[int], rows: int, max_rows: int) -> list[int]:
    """`sources` as a list of ints, checked for `DecodeBatch.fork` on a batch of `rows` (of at most `max_rows`):
    ValueError past `max_rows`, IndexError for a source that is not one of its rows."""
    sources = [int(r) for r in sources]
    if rows + len(sources) > max_rows:
        raise ValueError(f"the batch holds {max_rows} rows at most")
    if any(not 0 <= r < rows for r in sources):
        raise IndexError(f"fork: rows {sources} are not all in a batch of {rows}")
    return sources


def describe_backend(backend: Backend) -> str:
    """What computes the logits, for messages: the backend's `description` (its folder and runtime), else its
    class's name."""
    return str(getattr(backend, "description", type(backend).__name__))
