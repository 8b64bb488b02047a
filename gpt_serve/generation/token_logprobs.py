"""The logprobs of a sequence of tokens, held compactly (`TokenLogprobs`): what a stream with `logprobs` and a
prompt's scoring (`echo`) accumulate. Each entry is `(logprob, [(id, logprob), ...])` of the token and its `top_n`
most likely, or None (a prompt's first token, which has none), as OpenAI's answers list them; they are kept in flat
arrays, 8 bytes for the token and 12 for each top entry (as Python floats, tuples and lists they took ~3 KB a token
at 20), and made into tuples only when read. numpy only.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator

import numpy as np

__all__ = ["TokenLogprobs"]


class TokenLogprobs:
    """Entries appended in order (`append`, `extend`, `append_none`), read by index or slice like a list of them;
    `release(upto)` forgets those before `upto` (a stream that has sent them), and they cannot be read again:
    `len` still counts them, so later entries keep their indices."""

    __slots__ = ("top_n", "_chosen", "_ids", "_lps", "_start")

    def __init__(self, top_n: int):
        self.top_n = top_n
        self._chosen = array("d")  # the token's logprob, NaN for None (a logprob is never NaN: the logits are finite)
        self._ids = array("i")  # top_n ids per entry (-1 past the vocabulary, where it has fewer than top_n)
        self._lps = array("d")  # and their logprobs
        self._start = 0  # entries released before the first kept

    def __len__(self) -> int:
        return self._start + len(self._chosen)

    @property
    def nbytes(self) -> int:
        """The bytes its entries hold."""
        return sum(a.itemsize * len(a) for a in (self._chosen, self._ids, self._lps))

    def append(self, logprob: float, top_ids: np.ndarray, top_lps: np.ndarray) -> None:
        """One entry: the token's logprob and its top (ids, logprobs), each of shape (at most top_n,)."""
        self.extend(np.array([logprob]), np.asarray(top_ids)[None], np.asarray(top_lps)[None])

    def extend(self, logprobs: np.ndarray, top_ids: np.ndarray, top_lps: np.ndarray) -> None:
        """k entries at once: logprobs (k,), top ids and logprobs (k, at most top_n)."""
        short = self.top_n - top_ids.shape[1]  # a vocabulary smaller than top_n: every id is a top one
        if short:
            top_ids = np.pad(top_ids, ((0, 0), (0, short)), constant_values=-1)
            top_lps = np.pad(top_lps, ((0, 0), (0, short)))
        self._chosen.frombytes(np.ascontiguousarray(logprobs, dtype=np.float64).tobytes())
        self._ids.frombytes(np.ascontiguousarray(top_ids, dtype=np.int32).tobytes())
        self._lps.frombytes(np.ascontiguousarray(top_lps, dtype=np.float64).tobytes())

    def append_none(self) -> None:
        self.extend(np.full(1, np.nan), np.zeros((1, self.top_n)), np.zeros((1, self.top_n)))

    def release(self, upto: int) -> None:
        """Forgets the entries before index `upto`."""
        drop = min(max(0, upto - self._start), len(self._chosen))
        del self._chosen[:drop], self._ids[: drop * self.top_n], self._lps[: drop * self.top_n]
        self._start += drop

    def _entry(self, i: int) -> tuple[float, list[tuple[int, float]]] | None:
        chosen = self._chosen[i]
        if math.isnan(chosen):
            return None
        k = self.top_n
        pairs = zip(self._ids[i * k : (i + 1) * k], self._lps[i * k : (i + 1) * k], strict=True)
        return chosen, [(t, lp) for t, lp in pairs if t >= 0]

    def __getitem__(self, index):
        if isinstance(index, slice):
            held = range(*index.indices(len(self)))
            if held and min(held[0], held[-1]) < self._start:
                raise IndexError(f"entries before {self._start} are not held any more")
            return [self._entry(i - self._start) for i in held]
        i = index + len(self) if index < 0 else index
        if not self._start <= i < len(self):
            raise IndexError(f"entry {index} is not held (entries {self._start} to {len(self) - 1} are)")
        return self._entry(i - self._start)

    def __iter__(self) -> Iterator:
        return (self._entry(i) for i in range(len(self._chosen)))

    def __eq__(self, other) -> bool:
        try:
            return len(self) == len(other) and list(self) == list(other)
        except TypeError:
            return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"TokenLogprobs({list(self)!r})"
