"""The KV caches of the ONNX Runtime backend between its runs: the engine's `OnnxCache`, and the scheduler's batches.

- `OnnxCache`: what `OnnxBackend.forward` returns and takes back, one call to the next.
- `OnnxDecodeBatch`: rows decoding together on the Hugging Face layout graph (one left-padded cache).
- `OnnxInPlaceBatch`: rows decoding together on the in-place graph (buffers allocated once, written in place).

The batches are what `OnnxBackend.new_batch` hands the scheduler (see `interface.DecodeBatch`).
Torch-free: numpy and onnxruntime.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import onnxruntime as ort

from .interface import check_fork
from .prompt_cache import PromptCache, cached_windows


class OnnxGraphs(Protocol):
    """What the caches and batches use of their `OnnxBackend`: its two graphs and the model's shape."""

    block_size: int
    n_layer: int
    n_head: int
    head_size: int
    prompt_cache: PromptCache | None  # prefilled windows kept across batches

    def forward(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray, cache: OnnxCache | None
    ) -> tuple[np.ndarray, OnnxCache]: ...

    def run_inplace(self, input_ids: np.ndarray, lengths: np.ndarray, cache: list[np.ndarray]) -> np.ndarray: ...


class OnnxCache:
    """The KV cache between two `OnnxBackend.forward` calls: the graph's `present.*` outputs, kept as ONNX Runtime
    values (never copied to numpy) and fed back as the next call's `past_key_values.*`. Opaque to the engine."""

    __slots__ = ("values", "length", "batch_size", "owner")

    def __init__(self, values: list, length: int, batch_size: int, owner: OnnxGraphs):
        self.values, self.length, self.batch_size, self.owner = values, length, batch_size, owner


class OnnxDecodeBatch:
    """Rows decoding together on an `OnnxBackend` (see `interface.DecodeBatch`).

    The rows share one left-padded cache in the graph's Hugging Face layout: row r's keys are the last
    `lengths[r]` of the cache's columns, `mask` says which columns are whose, and a step appends one column for
    every row (the graph's `present = Concat(past, new)`). A new row is prefilled alone and joins padded to the
    others' width; a row that leaves is replaced by the last one. Columns no row uses any more are cut off when a
    row leaves, or once `TRIM_COLUMNS` of them have piled up.
    """

    TRIM_COLUMNS = 16

    def __init__(self, backend: OnnxGraphs, max_rows: int):
        self.backend, self.max_rows = backend, max_rows
        self._set([], np.zeros((0, 0), dtype=np.int64), np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.lengths)

    def _set(self, arrays: list[np.ndarray], mask: np.ndarray, lengths: np.ndarray) -> None:
        self._arrays = [np.ascontiguousarray(a) for a in arrays]  # kept alive: the OrtValues point into them
        values = [ort.OrtValue.ortvalue_from_numpy(a) for a in self._arrays]
        self.cache = OnnxCache(values, mask.shape[1], len(lengths), self.backend) if len(lengths) else None
        self.mask, self.lengths = mask, lengths

    def _numpy(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.cache.values] if self.cache is not None else []

    def _trimmed(self, arrays, mask, lengths):
        unused = mask.shape[1] - (int(lengths.max()) if len(lengths) else 0)
        return [a[:, :, unused:] for a in arrays], mask[:, unused:], lengths

    def add(self, ids) -> np.ndarray:
        if len(self) >= self.max_rows:
            raise ValueError(f"the batch holds {self.max_rows} rows at most")
        ids = np.asarray(ids, dtype=np.int64)[None]  # (1, L)
        L = ids.shape[1]
        prompts = self.backend.prompt_cache
        keys, (entry,) = cached_windows(prompts, ids)
        if entry is None:
            logits, cache = self.backend.forward(ids, np.ones_like(ids), np.arange(L)[None], None)
            entry = ([v.numpy() for v in cache.values], logits[0])  # each (1, H, L, hs); the logits
            if prompts is not None:
                entry = prompts.offer(keys[0], lambda: ([a.copy() for a in entry[0]], entry[1].copy())) or entry
        new, row_logits = entry
        width = max(self.mask.shape[1], L)
        pad = lambda a, w: np.pad(a, ((0, 0), (0, 0), (width - w, 0), (0, 0)))  # noqa: E731  (left, on columns)
        if len(self):
            old = self._numpy()
            arrays = [np.concatenate([pad(o, self.mask.shape[1]), pad(n, L)]) for o, n in zip(old, new, strict=True)]
        else:
            arrays = [pad(n, L) for n in new]
        mask = np.zeros((len(self) + 1, width), dtype=np.int64)
        mask[:-1, width - self.mask.shape[1] :] = self.mask
        mask[-1, width - L :] = 1
        self._set(arrays, mask, np.append(self.lengths, L))
        return row_logits.copy()  # the caller's to change: not the cache's

    def add_rows(self, windows) -> np.ndarray:
        """Each window prefilled alone (joining this layout rebuilds the cache anyway)."""
        return np.stack([self.add(ids) for ids in windows])

    def fork(self, sources) -> None:
        order = [*range(len(self)), *check_fork(sources, len(self), self.max_rows)]
        self._set([a[order] for a in self._numpy()], self.mask[order], self.lengths[order])

    def remove(self, row: int) -> None:
        if not 0 <= row < len(self):
            raise IndexError(f"no row {row} in a batch of {len(self)}")
        order = list(range(len(self)))
        order[row] = order[-1]  # the last row takes its place
        order.pop()
        arrays = [a[order] for a in self._numpy()]
        self._set(*self._trimmed(arrays, self.mask[order], self.lengths[order]))

    def step(self, tokens: np.ndarray) -> np.ndarray:
        n = len(self)
        mask = np.concatenate([self.mask, np.ones((n, 1), dtype=np.int64)], axis=1)
        tokens = np.ascontiguousarray(tokens, dtype=np.int64)[:, None]
        logits, self.cache = self.backend.forward(tokens, mask, self.lengths[:, None].copy(), self.cache)
        self.mask, self.lengths = mask, self.lengths + 1
        if mask.shape[1] - int(self.lengths.max()) >= self.TRIM_COLUMNS:
            self._set(*self._trimmed(self._numpy(), self.mask, self.lengths))
        return logits


class OnnxInPlaceBatch:
    """Rows decoding together on an `OnnxBackend`'s in-place graph (see `interface.DecodeBatch`).

    Every row's keys/values live in buffers allocated once, per layer (max_rows, H, block_size, head_size): row r's
    window positions 0..L-1 in columns 0..L-1 (a window always starts at position 0, so no row needs padding). A
    step hands the first `len(self)` rows of the buffers to the graph as they are (a contiguous view) and ONNX
    Runtime writes each row's new column into them; a new row is prefilled alone straight into its row of the
    buffers; a row that leaves is replaced by the last one (one row copied). Nothing is concatenated or rebuilt,
    and the attention reads each row's own columns only. A scheduler on it runs one ONNX Runtime session (full
    windows too: `OnnxBackend.window_logits`).
    """

    def __init__(self, backend: OnnxGraphs, max_rows: int):
        self.backend, self.max_rows = backend, max_rows
        shape = (max_rows, backend.n_head, backend.block_size, backend.head_size)
        self.cache = [np.zeros(shape, dtype=np.float32) for _ in range(2 * backend.n_layer)]
        self.lengths = np.zeros(max_rows, dtype=np.int64)
        self.rows = 0

    def __len__(self) -> int:
        return self.rows

    def add(self, ids) -> np.ndarray:
        return self.add_rows([ids])[0]

    def add_rows(self, windows) -> np.ndarray:
        ids = np.asarray(windows, dtype=np.int64)  # (k, L)
        (k, L), first = ids.shape, self.rows
        if first + k > self.max_rows:
            raise ValueError(f"the batch holds {self.max_rows} rows at most")
        if not 0 < L <= self.backend.block_size:
            raise ValueError(f"a row holds 1 to block_size = {self.backend.block_size} tokens, got {L}")
        prompts = self.backend.prompt_cache
        keys, found = cached_windows(prompts, ids)
        missing = [j for j, entry in enumerate(found) if entry is None]
        m = len(missing)
        if missing:  # the windows not cached prefilled in place, into the first rows
            rows = [buffer[first : first + m] for buffer in self.cache]
            logits = self.backend.run_inplace(ids[missing], np.zeros(m, dtype=np.int64), rows)
            for n, j in enumerate(missing):

                def copy(n=n):  # the row's own arrays: the rows below are rewritten in window order
                    return [buffer[first + n, :, :L].copy() for buffer in self.cache], logits[n].copy()

                found[j] = prompts.offer(keys[j], copy) if prompts is not None else None
                if found[j] is None and m < k:
                    found[j] = copy()
        if m < k:  # every row in window order, from the cache or the copies just taken
            for j, (arrays, _) in enumerate(found):
                for buffer, a in zip(self.cache, arrays, strict=True):
                    buffer[first + j, :, :L] = a
            logits = np.stack([entry[1] for entry in found])
        self.lengths[first : first + k] = L
        self.rows += k
        return logits

    def fork(self, sources) -> None:
        first, sources = self.rows, check_fork(sources, self.rows, self.max_rows)
        if not sources:
            return
        used = int(self.lengths[sources].max())
        for buffer in self.cache:
            buffer[first : first + len(sources), :, :used] = buffer[sources, :, :used]
        self.lengths[first : first + len(sources)] = self.lengths[sources]
        self.rows += len(sources)

    def remove(self, row: int) -> None:
        if not 0 <= row < self.rows:
            raise IndexError(f"no row {row} in a batch of {self.rows}")
        last = self.rows - 1
        if row != last:  # the last row takes its place
            used = int(self.lengths[last])
            for buffer in self.cache:
                buffer[row, :, :used] = buffer[last, :, :used]
            self.lengths[row] = self.lengths[last]
        self.rows = last

    def step(self, tokens: np.ndarray) -> np.ndarray:
        n = self.rows
        lengths = self.lengths[:n].copy()
        if n and lengths.max() >= self.backend.block_size:
            raise ValueError(
                f"a row already holds block_size = {self.backend.block_size} tokens: slide its window first"
            )
        tokens = np.ascontiguousarray(tokens, dtype=np.int64).reshape(-1, 1)
        if len(tokens) != n:
            raise ValueError(f"step takes one token per row: {n} rows, got {len(tokens)} tokens")
        logits = self.backend.run_inplace(tokens, lengths, [buffer[:n] for buffer in self.cache])
        self.lengths[:n] += 1
        return logits
