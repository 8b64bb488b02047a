"""CPU training kernels: a cheaper dropout mask and the attention with dropout on its weights, in cache-sized blocks.

On CPU, PyTorch's dropout spends most of its time drawing random numbers, and SDPA cannot fuse dropout on the
attention weights, so its fallback materializes the whole (B, H, T, S) matrix several times. This module does the
same math with a cheaper mask and in pieces; `benchmarks/training.py` measures the difference.

The model file knows nothing of it. `use_cpu_training_kernels(model)` switches it in, the way the generation
engine's `decode_copy` switches its decode path in: it registers `cpu_dropout_attention` with transformers'
attention registry (`AttentionInterface`) under `CPU_ATTENTION`, sets the model's attention implementation to it,
and replaces the model's `nn.Dropout` modules by `FastDropout`. Neither changes a weight or what `save_pretrained`
writes (the attention implementation is not saved). Outside eager CPU training (evaluation, CUDA, torch.compile,
no dropout) both fall back to PyTorch's own kernels.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from gpt_serve.chargpt.modeling_chargpt import additive_mask, causal_bias

CPU_ATTENTION = "chargpt_cpu_dropout"


def dropout_mask(shape: tuple[int, ...], p: float, device) -> tuple[torch.Tensor, float]:
    """(mask of the elements dropout zeroes, scale of the kept ones) for dropout with probability `p`.

    Draws 16 random bits per element, four to each 64-bit word of the default generator, so the mask costs a
    fraction of `bernoulli_`'s draws (on CPU `F.dropout` spends most of its time drawing). `p` is rounded to a
    multiple of 2**-16 (at most 7.6e-6 off) and the scale is exact for the rounded value, so the expectation is
    kept, as in `nn.Dropout`.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p!r}")
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), None)
    bits = words.view(torch.int16)[:n].view(shape)  # uniform on [-2**15, 2**15)
    threshold = round(p * 65536)
    return bits < threshold - 32768, 65536 / (65536 - threshold)


def fast_dropout_applies(x: torch.Tensor, p: float, training: bool) -> bool:
    """Whether `dropout_mask` replaces PyTorch's dropout: training on CPU, eager. On CUDA (and under
    torch.compile) PyTorch's fused kernels are the fast path already."""
    return training and 0.0 < p < 1.0 and x.device.type == "cpu" and not torch.compiler.is_compiling()


class FastDropout(nn.Dropout):
    """`nn.Dropout` with a cheaper random mask on CPU (see `dropout_mask`); the same module elsewhere."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not fast_dropout_applies(x, self.p, self.training):
            return super().forward(x)
        drop, scale = dropout_mask(x.shape, self.p, x.device)
        # One float mask, used by the forward product and again by its backward (one pass each way)
        return x * torch.where(drop, 0.0, scale).to(x.dtype)


def cpu_dropout_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """An attention function for transformers' registry: `attention_with_dropout` while training on CPU with
    dropout, SDPA otherwise. Takes (B, H, T, hs) queries and (B, H, S, hs) keys/values, returns (B, T, H, hs)."""
    if not fast_dropout_applies(query, dropout, module.training):
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    T = query.shape[2]
    # The model passes no mask for plain causal attention over all positions (T == S) or for one new token.
    causal = attention_mask is None and T > 1
    y = attention_with_dropout(query, key, value, attention_mask, causal, dropout, scaling)
    return y.transpose(1, 2), None


def use_cpu_training_kernels(model: nn.Module) -> None:
    """Switches `model` (a `CharGPTForCausalLM`) to the CPU training kernels, in place (see the module docstring)."""
    AttentionInterface.register(CPU_ATTENTION, cpu_dropout_attention)
    # SDPA's masks: none for plain causal attention, a boolean one (True = may attend) where padding or packing is
    ALL_MASK_ATTENTION_FUNCTIONS.register(CPU_ATTENTION, sdpa_mask)
    model.set_attn_implementation(CPU_ATTENTION)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Dropout:
                setattr(module, name, FastDropout(child.p))


def attention_with_dropout(q, k, v, attn_mask, is_causal: bool, p: float, scale: float | None = None) -> torch.Tensor:
    """`softmax(q k^T * scale + mask)`, dropout with probability `p`, times `v`: (B, H, T, hs) in and out; `scale`
    is the model's (`config.attention_scaling`), 1 / sqrt(hs) when None.

    `attn_mask` is None, an additive or boolean (True = may attend) (T, S) or (B, 1, T, S) mask; `is_causal` (with
    T == S) means the causal mask.
    """
    B, H, T, hs = q.shape
    S = k.shape[2]
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = additive_mask(attn_mask, q.dtype)
    if is_causal:
        bias = causal_bias(T, S, q.device, q.dtype)
    elif attn_mask is not None:
        # (B, 1, T, S) padding masks are rare in training; materialized per head to index blocks simply
        bias = attn_mask.expand(B, H, T, S).reshape(B * H, T, S) if attn_mask.dim() == 4 else attn_mask
    else:
        bias = None
    flat = [t.reshape(B * H, t.shape[2], hs) for t in (q, k, v)]
    y = _AttentionWithDropout.apply(*flat, bias, is_causal, hs**-0.5 if scale is None else scale, p)
    return y.view(B, H, T, hs)


class _AttentionWithDropout(torch.autograd.Function):
    """Attention with dropout on its weights, forward and backward written out, over blocks of (query rows x
    keys) that fit in the CPU cache.

    A block is `rows` matrices of the batch (`CHUNK_ELEMENTS` scores at most) times a range of queries; with the
    causal mask, queries `[j0, j1)` only see keys `[0, j1)`, so the blocks skip most of the masked upper triangle.
    Results and gradients are written into their place in preallocated tensors, and the backward pass reuses each
    block's softmax output, dropped-out weights and mask from the forward.
    """

    CHUNK_ELEMENTS = 786_432  # ~3 MB of float32 scores per block
    QUERY_BLOCKS = 2  # with the causal mask

    @staticmethod
    def blocks(N: int, T: int, S: int, causal: bool):
        rows = max(1, _AttentionWithDropout.CHUNK_ELEMENTS // (T * S))
        step = -(-T // _AttentionWithDropout.QUERY_BLOCKS) if causal else T
        for n0 in range(0, N, rows):
            for j0 in range(0, T, step):
                j1 = min(T, j0 + step)
                yield slice(n0, n0 + rows), slice(j0, j1), slice(0, j1 if causal else S)

    @staticmethod
    def forward(ctx, q, k, v, bias, causal, scale, p):
        N, T, hs = q.shape
        S = k.shape[1]
        y = torch.empty_like(q)
        saved = []
        for n, j, s in _AttentionWithDropout.blocks(N, T, S, causal):
            keys_t = k[n, s].transpose(1, 2)
            if bias is None:
                scores = torch.bmm(q[n, j], keys_t).mul_(scale)  # (rows, queries, keys)
            else:
                block_bias = bias[n, j, s] if bias.dim() == 3 else bias[j, s].expand(q[n].shape[0], -1, -1)
                scores = torch.baddbmm(block_bias, q[n, j], keys_t, alpha=scale)
            weights = torch.softmax(scores, dim=-1)
            drop, keep_scale = dropout_mask(weights.shape, p, weights.device)
            kept = weights.masked_fill(drop, 0.0)
            y[n, j] = torch.bmm(kept, v[n, s]).mul_(keep_scale)
            saved += [weights, kept, drop]
        ctx.save_for_backward(q, k, v, *saved)
        ctx.causal, ctx.scale, ctx.keep_scale = causal, scale, keep_scale
        return y

    @staticmethod
    def backward(ctx, dy):
        q, k, v, *saved = ctx.saved_tensors
        N, T, hs = q.shape
        S = k.shape[1]
        dy = dy.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        keep_scale = ctx.keep_scale
        for b, (n, j, s) in enumerate(_AttentionWithDropout.blocks(N, T, S, ctx.causal)):
            weights, kept, drop = saved[3 * b : 3 * b + 3]
            # Products land in fresh tensors and are then added into place: an in-place product into a strided
            # view (baddbmm_) runs matrix by matrix on CPU.
            dv[n, s] += torch.bmm(kept.transpose(1, 2), dy[n, j]).mul_(keep_scale)
            dweights = torch.bmm(dy[n, j], v[n, s].transpose(1, 2)).masked_fill_(drop, 0.0)
            # softmax's own backward kernel (the aten op autograd calls for F.softmax): one pass
            dscores = torch._softmax_backward_data(dweights, weights, -1, weights.dtype)
            dscores.mul_(ctx.scale * keep_scale)
            dq[n, j] = torch.bmm(dscores, k[n, s])
            dk[n, s] += torch.bmm(dscores.transpose(1, 2), q[n, j])
        return dq, dk, dv, None, None, None, None
