"""The PyTorch backend of the generation engine, and the lesson's full-recompute loop as a reference."""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..modeling_chargpt import CharGPTForCausalLM
from .engine import window_keep
from .sampling import SamplingParams, sample_next


class DecodeLinear(nn.Module):
    """An inference-only `nn.Linear` (sharing its weight) with a faster path for decoding a few rows.

    Decoding multiplies one row by each weight matrix, which is bound by reading the weights from memory. On CPU,
    `F.linear` runs that product as a single-threaded matrix-vector product; splitting the (out, in) weight into
    `chunks` blocks of rows and multiplying them as one batched product (`torch.bmm`, vector broadcast over the
    batch) streams the weights on every thread. Measured on the lesson-size model's matrices (torch 2.13's MKL
    build, an AMD EPYC, 2 threads, weights not in cache): 3.7 ms -> 1.2 ms per token for all of them;
    `benchmarks/decode_floor.py` measures it on your machine. Same numbers up to float rounding. Prefill and
    larger batches (more than `max_rows` rows) take `F.linear`, which is faster there.
    """

    max_rows = 8

    def __init__(self, linear: nn.Linear, chunks: int = 4):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias  # shared, not copied
        self.out_features, self.in_features = linear.weight.shape
        # The blocks are a view of the weight: that needs a contiguous weight whose rows split evenly.
        splits = self.out_features % chunks == 0 and linear.weight.is_contiguous()
        self.chunks = chunks if splits else 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # (N, in)
        n = rows.shape[0]
        if self.chunks == 1 or n > self.max_rows:
            return F.linear(x, self.weight, self.bias)
        c = self.chunks
        blocks = self.weight.view(c, self.out_features // c, self.in_features)  # (c, out/c, in)
        vectors = rows.t().expand(c, self.in_features, n)  # the same rows for every block, not copied
        if self.bias is None:
            out = torch.bmm(blocks, vectors)  # (c, out/c, N)
        else:
            out = torch.baddbmm(self.bias.view(c, -1, 1), blocks, vectors)
        out = out.view(1, self.out_features) if n == 1 else out.permute(2, 0, 1).reshape(n, self.out_features)
        return out.view(*x.shape[:-1], self.out_features)


def decode_copy(model: CharGPTForCausalLM) -> CharGPTForCausalLM:
    """An eval-mode copy of `model`, sharing its parameters, with every `nn.Linear` replaced by a `DecodeLinear`."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    fast = copy.deepcopy(model, memo=shared).eval()
    for module in list(fast.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, child_name, DecodeLinear(child))
            elif isinstance(child, nn.Dropout):  # a no-op in eval mode, but still a call
                setattr(module, child_name, nn.Identity())
    return fast


class KVBuffer:
    """A KV cache of fixed capacity: keys and values are written in place into buffers allocated once.

    Implements the part of transformers' `Cache` API that `CharGPTForCausalLM` calls (`update`,
    `get_seq_length`). Unlike `DynamicCache`, which concatenates (copies) the whole cache at every step, a decode
    step only writes its own row. The engine never holds more than `block_size` columns, the capacity.
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


class TorchBackend:
    """Runs a `CharGPTForCausalLM` for the engine, with a preallocated `KVBuffer` as the cache.

    On CPU the backend decodes through `decode_copy(model)`, which shares the model's weights but multiplies
    them by a decode-friendly path (`DecodeLinear`); `decode_layout=False` runs `model` itself (put in eval mode).
    `self.pretrained` is `model` as given (in eval mode), for everything else (attention maps, export); `self.model`
    is what decodes. Inputs go to the model's device and logits come back as float32 numpy.
    """

    def __init__(self, model: CharGPTForCausalLM, decode_layout: bool = True):
        self.device = next(model.parameters()).device
        self.dtype = model.get_input_embeddings().weight.dtype
        self.pretrained = model.eval()
        self.model = decode_copy(model) if decode_layout and self.device.type == "cpu" else model
        config = model.config
        self.config = config
        self.block_size = config.block_size
        self.vocab_size = config.vocab_size

    def new_cache(self, batch: int) -> KVBuffer:
        c = self.config
        return KVBuffer(c.n_layer, batch, c.n_head, c.block_size, c.head_size, self.dtype, self.device)

    @torch.inference_mode()
    def forward(self, input_ids, attention_mask, position_ids, cache):
        if cache is None:
            cache = self.new_cache(input_ids.shape[0])
        elif not isinstance(cache, KVBuffer):
            raise TypeError(f"cache must be None or the KVBuffer this backend returned, got {type(cache).__name__}")
        elif cache.batch != input_ids.shape[0]:
            raise ValueError(f"the cache holds a batch of {cache.batch} rows, input_ids has {input_ids.shape[0]}")
        out = self.model(
            input_ids=torch.from_numpy(np.ascontiguousarray(input_ids)).to(self.device),
            attention_mask=torch.from_numpy(np.ascontiguousarray(attention_mask)).to(self.device),
            position_ids=torch.from_numpy(np.ascontiguousarray(position_ids)).to(self.device),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1].float().cpu().numpy(), out.cache


@torch.inference_mode()
def full_recompute_generate(
    model: CharGPTForCausalLM,
    prompt: list[int],
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    seed: int | None = None,
    window_mode: str = "exact",
    refill_tokens: int | None = None,
) -> list[int]:
    """The lesson's `generate`: no cache, the whole window re-run for every token. The reference the cached
    paths are tested and benchmarked against; same window semantics and same sampler as the engine."""
    model.eval()
    sampling = sampling or SamplingParams()
    block_size = model.config.block_size
    keep = window_keep(block_size, window_mode, refill_tokens)
    rng = np.random.default_rng(seed)
    device = next(model.parameters()).device
    ids, start = list(prompt), 0
    for _ in range(max_new_tokens):
        if len(ids) - start > block_size:
            start = len(ids) - keep
        x = torch.tensor([ids[start:]], device=device)
        logits = model(input_ids=x, use_cache=False, logits_to_keep=1).logits[:, -1].float().cpu().numpy()
        ids.append(int(sample_next(logits, sampling, rng)[0]))
    return ids[len(prompt) :]
