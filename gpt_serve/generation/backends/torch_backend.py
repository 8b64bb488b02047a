"""The PyTorch backend of the generation engine: a `CharGPTForCausalLM` behind the `Backend` protocol, its KV caches
and its decode batches. What makes its decode step fast (`decode_copy`, `DecodePlan`) is `torch_decode`'s."""

from __future__ import annotations

import time

import numpy as np
import torch

from ...chargpt.modeling_chargpt import CharGPTForCausalLM
from .interface import check_fork
from .prompt_cache import PromptCache, cached_windows
from .torch_decode import DecodePlan, decode_copy


def int64_tensor(array, device) -> torch.Tensor:
    """`array` as an int64 tensor on `device`, sharing a numpy array's memory where it can (`torch.from_numpy`), a
    copy where numpy may not write to it (a broadcast view, say: PyTorch would warn that it cannot protect it)."""
    array = np.ascontiguousarray(array, dtype=np.int64)
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array).to(device)


class CacheSizes:
    """What transformers' mask functions (`create_causal_mask`) ask of a cache, from its `get_seq_length`: the
    queries' offset and the keys' length and offset a mask must cover."""

    is_compileable = False

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.get_seq_length(layer_idx)

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.get_seq_length(layer_idx) + query_length, 0


class KVBuffer(CacheSizes):
    """A KV cache of fixed capacity: keys and values are written in place into buffers allocated once.

    Implements the part of transformers' `Cache` API that `CharGPTForCausalLM` calls (`update`,
    `get_seq_length`). Unlike `DynamicCache`, which concatenates (copies) the whole cache at every step, a decode
    step only writes its own row. The engine never holds more than `block_size` columns, the capacity.

    Why not transformers' `StaticCache`, which also writes in place: it hands the attention its whole capacity
    (masked beyond the filled length), so it needs a view of the filled positions on top, and it keeps the lengths
    as tensors: this buffer decoded faster in every paired run (docs/benchmarks.md, "Figures behind design
    choices"), so it stays.
    """

    def __init__(self, n_layer: int, batch: int, n_head: int, capacity: int, head_size: int, dtype, device):
        shape = (batch, n_head, capacity, head_size)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.lengths = [0] * n_layer
        self.batch = batch

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.lengths[layer_idx]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        start = self.lengths[layer_idx]
        end = start + key.shape[2]
        if end > self.keys[layer_idx].shape[2]:
            raise ValueError(f"the KVBuffer holds {self.keys[layer_idx].shape[2]} positions, {end} were given")
        self.keys[layer_idx][:, :, start:end] = key
        self.values[layer_idx][:, :, start:end] = value
        self.lengths[layer_idx] = end
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]


class ThreadTuner:
    """PyTorch's intra-op thread count for decode steps, adapted to the machine as it runs: the count the process
    was given (`torch.get_num_threads()`) while steps run as they should, one thread for a while after a stall.

    On a quiet machine every thread helps. Beside a busy process, a parallel region now and then waits for a
    descheduled sibling thread (OpenMP spins, then sleeps): most decode steps still take their usual time, but one
    in tens takes a scheduler time slice or more (40-130 ms instead of 1-3 ms), and a stream on 2 cores decoded 4-7x
    slower on 2 threads than on one (`benchmarks/contention.py`, docs/serving.md). So a step `stall_factor` times
    slower than usual (and at least `stall_floor` seconds) switches to one thread for `hold` steps, then the tuner
    tries the full count again; each stall that follows doubles the hold (up to `max_hold`), and `hold` good steps
    in a row at the full count reset it. `torch.set_num_threads` is process-wide: the tuner belongs to the one thread
    that runs PyTorch (the process's shared runner). Given one thread, it does nothing.
    """

    def __init__(
        self, stall_factor: float = 10.0, stall_floor: float = 0.02, hold: int = 1024, max_hold: int = 65536, clock=None
    ):
        self.most = self.current = torch.get_num_threads()
        self.clock = clock or time.perf_counter
        self.stall_factor, self.stall_floor = stall_factor, stall_floor
        self.base_hold, self.max_hold = hold, max_hold
        self.next_hold = hold
        self.left = 0  # steps still to run on one thread
        self.typical: float | None = None  # a running mean of a step's seconds at the full count, stalls left out
        self.good = 0  # steps in a row without a stall at the full count
        self.stalls = 0  # how many the tuner has seen (for benchmarks and tests)

    def run(self, step):
        """`step()` at the chosen thread count; returns what it returns."""
        if self.most == 1:
            return step()
        if self.left > 0:
            self.left -= 1
            if self.left == 0:
                self._use(self.most)  # try the full count again
            return step()
        start = self.clock()
        out = step()
        seconds = self.clock() - start
        if self.typical is not None and seconds > max(self.stall_factor * self.typical, self.stall_floor):
            self.stalls += 1
            self._use(1)
            self.left, self.next_hold = self.next_hold, min(2 * self.next_hold, self.max_hold)
            self.good = 0
        else:
            self.typical = seconds if self.typical is None else 0.9 * self.typical + 0.1 * seconds
            self.good += 1
            if self.good >= self.base_hold:
                self.next_hold = self.base_hold
        return out

    def _use(self, count: int) -> None:
        if count != self.current:
            torch.set_num_threads(count)
            self.current = count


class TorchBackend:
    """Runs a `CharGPTForCausalLM` for the engine, with a preallocated `KVBuffer` as the cache.

    On CPU the backend decodes through `decode_copy(model)`, which shares the model's weights but multiplies
    them by a decode-friendly path (`DecodeLinear`); `decode_layout=False` runs `model` itself (put in eval mode).
    `self.pretrained` is `model` as given (in eval mode), for everything else (attention maps, export); `self.model`
    is what decodes. Inputs go to the model's device and logits come back as float32 numpy.
    """

    cache_type: type = KVBuffer  # what `new_cache` makes

    def __init__(self, model: CharGPTForCausalLM, decode_layout: bool = True):
        self.device = next(model.parameters()).device
        self.dtype = model.get_input_embeddings().weight.dtype
        self.pretrained = model.eval()
        self.model = decode_copy(model) if decode_layout and self.device.type == "cpu" else model
        config = model.config
        self.config = config
        self.block_size = config.block_size
        self.vocab_size = config.vocab_size
        self.description = f"the torch backend (PyTorch) of {model.name_or_path or type(model).__name__}"
        self.tuner: ThreadTuner | None = None  # made on the first decode step, on the thread that decodes
        self.plan: DecodePlan | bool | None = None  # made on the first decode step (False: none, see `DecodePlan.of`)
        self.prompt_cache: PromptCache | None = None  # prefilled windows kept across batches (`load_backend` sets one)

    def new_cache(self, batch: int) -> KVBuffer:
        c = self.config
        return KVBuffer(c.n_layer, batch, c.n_head, c.block_size, c.head_size, self.dtype, self.device)

    def new_batch(self, max_rows: int) -> TorchDecodeBatch:
        """An empty batch of at most `max_rows` rows for the scheduler (`gpt_serve.generation.scheduler`)."""
        return TorchDecodeBatch(self, max_rows)

    @torch.inference_mode()
    def forward(self, input_ids, attention_mask, position_ids, cache):
        if cache is None:
            cache = self.new_cache(input_ids.shape[0])
        elif not isinstance(cache, self.cache_type):
            expected, got = self.cache_type.__name__, type(cache).__name__
            raise TypeError(f"cache must be None or the {expected} this backend returned, got {got}")
        elif cache.batch != input_ids.shape[0]:
            raise ValueError(f"the cache holds a batch of {cache.batch} rows, input_ids has {input_ids.shape[0]}")
        return self.run(input_ids, attention_mask, position_ids, cache), cache

    @torch.inference_mode()
    def run(self, input_ids, attention_mask, position_ids, cache) -> np.ndarray:
        """The decoding model on numpy inputs, extending `cache` in place; float32 logits (B, vocab) of the last
        position. (`forward` checks the cache; a `TorchDecodeBatch` passes its own.)"""
        ids, mask, positions = (int64_tensor(a, self.device) for a in (input_ids, attention_mask, position_ids))
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1
        )
        return out.logits[:, -1].float().cpu().numpy()

    def window_logits(self, input_ids: np.ndarray) -> np.ndarray:
        """Logits (B, V) of the last token of B windows of ids (B, T) at positions 0..T-1, without a cache: the
        full-window forward that exact mode runs for every token past `block_size`."""
        ones = np.ones_like(input_ids)
        return self.forward(input_ids, ones, np.tile(np.arange(input_ids.shape[1]), (len(ones), 1)), None)[0]

    @torch.inference_mode()
    def sequence_logits(self, ids: np.ndarray) -> np.ndarray:
        """float32 logits (T, V) of every position of one window of ids (T,) at positions 0..T-1, no cache."""
        x = int64_tensor(np.asarray(ids)[None], self.device)
        return self.model(input_ids=x, use_cache=False).logits[0].float().cpu().numpy()

    @torch.inference_mode()
    def decode_step(self, tokens: np.ndarray, positions: np.ndarray, padding: np.ndarray, cache) -> np.ndarray:
        """One new token per row on top of `cache` (a `BatchKV`): float32 logits (rows, vocab).

        The decoding model's own tensors and modules in the order its forward runs them (`DecodePlan`), without the
        forward's per-call work that a decode batch does not need: input checks (the scheduler checked the prompts,
        and sampled ids and positions are in range by construction), the mask built from a 2-D attention_mask, the
        output dataclass, the module calls: the per-call cost that dominates a step of a small model. The same
        numbers as `run` (tested bit for bit). `padding` (rows, cache columns + 1) is True at each row's left
        padding; with none, no mask at all, as the forward does for an all-ones mask."""
        ids, pos = (int64_tensor(a, self.device) for a in (tokens, positions))
        # The forward's own mask for one query over a 2-D key mask (boolean, True = may attend), or none where
        # nothing is padded, as it does.
        mask = torch.from_numpy(~padding).to(self.device)[:, None, None, :] if padding.any() else None
        if self.plan is None:
            self.plan = DecodePlan.of(self.model)
        if self.plan:
            return self.plan(ids, pos, mask, cache).float().cpu().numpy()
        m = self.model.model  # another attention implementation (`eager`): the modules themselves, as the forward
        x = m.drop(m.token_embedding_table(ids[:, None]) + m.position_embedding_table(pos[:, None]))
        for block in m.blocks:
            x = block(x, attention_mask=mask, cache=cache)
        return self.model.lm_head(m.ln_f(x))[:, -1].float().cpu().numpy()


class BatchKV(CacheSizes):
    """The KV caches of a `TorchDecodeBatch`'s rows: per layer one buffer (max_rows, H, capacity, hs), allocated
    once and zeroed (masked columns must hold finite numbers).

    Rows are left-padded, as transformers' decoder contract has it: every row's tokens end at the shared column
    `width` (the next one written), row r's own keys fill columns `[width - lengths[r], width)`, and a decode step
    writes every row's new key at column `width`, in place. The model reads columns `[lo, width + T)`, `lo` the
    first column any row still uses. When the columns run out, the used ones move back to the front (once every
    `capacity - block_size` steps at the least). Implements the part of the `Cache` API the model calls.
    """

    def __init__(self, n_layer: int, max_rows: int, n_head: int, block_size: int, head_size: int, dtype, device):
        shape = (max_rows, n_head, 2 * block_size, head_size)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.capacity = shape[2]
        self.rows = 0
        self.lengths = np.zeros(max_rows, dtype=np.int64)
        self.width = self.lo = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.width - self.lo

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        n, end = self.rows, self.width + key.shape[2]
        self.keys[layer_idx][:n, :, self.width : end] = key
        self.values[layer_idx][:n, :, self.width : end] = value
        return self.keys[layer_idx][:n, :, self.lo : end], self.values[layer_idx][:n, :, self.lo : end]

    def _shift(self, to: int) -> None:
        """Moves the used columns `[lo, width)` to start at column `to`."""
        n, used = self.rows, self.width - self.lo
        if to == self.lo or used == 0:
            self.lo, self.width = to, to + used
            return
        for buffers in (self.keys, self.values):
            for b in buffers:
                b[:n, :, to : to + used] = b[:n, :, self.lo : self.width].clone()
        self.lo, self.width = to, to + used

    def reserve(self, columns_before: int, columns_after: int) -> None:
        """Makes `width >= columns_before` (room for a new row's keys) and `width + columns_after <= capacity`."""
        if self.width < columns_before:
            self._shift(self.lo + columns_before - self.width)
        if self.width + columns_after > self.capacity:
            self._shift(max(0, columns_before - (self.width - self.lo)))

    def set_rows(self, first: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Writes rows `first`, `first + 1`, ...'s keys/values (each (k, H, L, hs), per layer) to end at column
        `width`."""
        k, L = keys[0].shape[0], keys[0].shape[2]
        for buffers, new in ((self.keys, keys), (self.values, values)):
            for b, t in zip(buffers, new, strict=True):
                b[first : first + k, :, self.width - L : self.width] = t
        self.lengths[first : first + k] = L

    def copy_rows(self, sources: list[int]) -> None:
        """Appends rows after the last, the new row j a copy of row `sources[j]` (its used columns and length)."""
        first, k = self.rows, len(sources)
        index = torch.as_tensor(sources, dtype=torch.long, device=self.keys[0].device)
        for buffers in (self.keys, self.values):
            for b in buffers:
                b[first : first + k, :, self.lo : self.width] = b[index, :, self.lo : self.width]
        self.lengths[first : first + k] = self.lengths[sources]
        self.rows += k

    def move_row(self, src: int, dst: int) -> None:
        for buffers in (self.keys, self.values):
            for b in buffers:
                b[dst, :, self.lo : self.width] = b[src, :, self.lo : self.width]
        self.lengths[dst] = self.lengths[src]

    def refresh_lo(self) -> None:
        self.lo = self.width - int(self.lengths[: self.rows].max()) if self.rows else self.width


class TorchDecodeBatch:
    """Rows decoding together on a `TorchBackend` (see `interface.DecodeBatch`): a new row is prefilled alone and its
    keys copied into the shared `BatchKV`; a step decodes one token for every row."""

    def __init__(self, backend: TorchBackend, max_rows: int):
        c = backend.config
        self.backend = backend
        self.kv = BatchKV(c.n_layer, max_rows, c.n_head, c.block_size, c.head_size, backend.dtype, backend.device)
        self.max_rows = max_rows

    def __len__(self) -> int:
        return self.kv.rows

    def add(self, ids) -> np.ndarray:
        return self.add_rows([ids])[0]

    def add_rows(self, windows) -> np.ndarray:
        kv = self.kv
        ids = np.asarray(windows, dtype=np.int64)  # (k, L)
        k, L = ids.shape
        if kv.rows + k > self.max_rows:
            raise ValueError(f"the batch holds {self.max_rows} rows at most")
        prompts = self.backend.prompt_cache
        keys, found = cached_windows(prompts, ids)
        missing = [j for j, entry in enumerate(found) if entry is None]
        if missing:  # one forward pass over the windows not cached
            new = ids[missing]
            logits, cache = self.backend.forward(new, np.ones_like(new), np.tile(np.arange(L), (len(new), 1)), None)
            # Each row's entry (every layer's keys then values (1, H, L, hs), and its logits) where the cache may
            # keep it or the rows are placed one by one; none where the pass's rows go in as they are.
            for n, j in enumerate(missing if prompts is not None or len(missing) < k else ()):
                row = [t[n : n + 1, :, :L] for t in (*cache.keys, *cache.values)]
                if prompts is not None:  # kept: copies, not views of this pass's buffers
                    found[j] = prompts.offer(keys[j], lambda row=row, n=n: ([t.clone() for t in row], logits[n].copy()))
                if found[j] is None and len(missing) < k:
                    found[j] = (row, logits[n])
        kv.reserve(L, 1)
        if len(missing) == k:  # the pass's rows in order: one copy per layer
            kv.set_rows(kv.rows, [t[:, :, :L] for t in cache.keys], [t[:, :, :L] for t in cache.values])
        else:
            layers = len(kv.keys)
            for j, (row, _) in enumerate(found):
                kv.set_rows(kv.rows + j, row[:layers], row[layers:])
        kv.rows += k
        kv.refresh_lo()
        return logits if len(missing) == k else np.stack([entry[1] for entry in found])

    def fork(self, sources) -> None:
        self.kv.copy_rows(check_fork(sources, self.kv.rows, self.max_rows))

    def remove(self, row: int) -> None:
        kv = self.kv
        if not 0 <= row < kv.rows:
            raise IndexError(f"no row {row} in a batch of {kv.rows}")
        if row != kv.rows - 1:
            kv.move_row(kv.rows - 1, row)  # the last row takes its place
        kv.rows -= 1
        kv.refresh_lo()

    @torch.inference_mode()
    def step(self, tokens: np.ndarray) -> np.ndarray:
        kv, n = self.kv, self.kv.rows
        kv.reserve(0, 1)
        lengths = kv.lengths[:n]
        columns = kv.width - kv.lo + 1
        padding = np.arange(columns)[None, :] < columns - 1 - lengths[:, None]  # (n, columns): each row's left padding
        backend = self.backend
        if backend.tuner is None:
            backend.tuner = ThreadTuner(stall_factor=float("inf") if backend.device.type != "cpu" else 10.0)
        logits = backend.tuner.run(lambda: backend.decode_step(tokens, lengths, padding, kv))
        kv.width += 1
        kv.lengths[:n] += 1
        return logits
