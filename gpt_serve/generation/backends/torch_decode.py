"""The PyTorch decode path: a `CharGPTForCausalLM` made fast for decoding, its weights shared, its numbers the same.

- `decode_copy(model)`: an inference-only copy whose `nn.Linear`s are `DecodeLinear`s (one-row products on every
  thread, larger ones on oneDNN's kernel over weights packed once, `pack_for_onednn`) and whose attention is
  `decode_attention` (PyTorch's fused kernel, called directly);
- `DecodePlan`: a decode step (one new token per row) as one flat function over the model's tensors and modules.

`TorchBackend` (`torch_backend`) decodes with both; each is measured in docs/benchmarks.md ("Figures behind design
choices").
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ...chargpt.modeling_chargpt import CharGPTForCausalLM

__all__ = ["DECODE_ATTENTION", "DecodeLinear", "DecodePlan", "decode_attention", "decode_copy", "pack_for_onednn"]


class DecodeLinear(nn.Module):
    """An inference-only `nn.Linear` (sharing its weight) that runs oneDNN's linear kernel on its weight packed once
    (`pack_for_onednn`), or `F.linear` where that cannot run, at every row count.

    Decoding multiplies a few rows by each weight matrix, bound by reading the weights from memory, and which kernel
    streams them fastest depends on the CPU and the size: `F.linear` (MKL) was 2x the blocked product on one machine
    of this kind (Intel) and 2.2x slower than oneDNN on the lesson's size on another (AMD, where MKL takes a slow
    path). No kernel was the fastest at one row everywhere; oneDNN was the fastest past one row on the lesson's size
    there and past 8 rows on both, and costs a fixed time per call that small in-cache matrices feel at one row
    (`benchmarks/decode_floor.py` measures the paths on your machine; figures in docs/benchmarks.md). For those
    comparisons, up to `max_rows` rows (0 by default: none) it runs `F.linear` (`chunks=1`) or splits the (out, in)
    weight into `chunks` blocks of rows multiplied as one batched product (`torch.bmm`, the rows broadcast over the
    blocks). Same numbers up to float rounding.
    """

    def __init__(self, linear: nn.Linear, chunks: int = 1, max_rows: int = 0):
        super().__init__()
        self.max_rows = max_rows
        self.weight, self.bias = linear.weight, linear.bias  # shared, not copied
        self.out_features, self.in_features = linear.weight.shape
        # The blocks are a view of the weight: that needs a contiguous weight whose rows split evenly.
        splits = self.out_features % chunks == 0 and linear.weight.is_contiguous()
        self.chunks = chunks if splits else 1
        self.packed = pack_for_onednn(linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # (N, in)
        n = rows.shape[0]
        if n > self.max_rows and self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
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


def pack_for_onednn(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight` (out, in) as oneDNN's packed layout for its linear kernel (what `torch.compile`'s CPU backend runs for
    a frozen `nn.Linear`), or None where it cannot be used (not an fp32 CPU tensor, PyTorch built without oneDNN).

    Why: `F.linear` runs on the BLAS PyTorch was built with (MKL), and for these shapes (a few to a few hundred rows
    by 192-768 columns) oneDNN's kernel took about half its time on this 2-core machine (`benchmarks/decode_floor.py
    --rows 16 64 256`, its `F.linear` and `DecodeLinear` rows; docs/benchmarks.md). A row's result does not depend on
    the other rows of the batch (tested). The packed copy is made once: `DecodeLinear` serves an inference-only model
    (`decode_copy`), whose weights do not change."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return None
    try:
        with torch.no_grad():
            return torch.ops.mkldnn._reorder_linear_weight(weight.detach())
    except (RuntimeError, AttributeError):  # an op this build does not have
        return None


def decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """PyTorch's fused attention called directly, for inference (no dropout): transformers' generic SDPA wrapper
    checks for features this model never uses (GQA, NPUs, tracing, position biases) at every call, a cost paid per
    layer per decoded token (docs/benchmarks.md, "Figures behind design choices")."""
    is_causal = attention_mask is None and query.shape[2] > 1
    y = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, is_causal=is_causal, scale=scaling)
    return y.transpose(1, 2), None


DECODE_ATTENTION = "gpt_serve_decode"
ALL_ATTENTION_FUNCTIONS.register(DECODE_ATTENTION, decode_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(DECODE_ATTENTION, sdpa_mask)  # the masks SDPA takes: boolean, or none


def decode_copy(model: CharGPTForCausalLM) -> CharGPTForCausalLM:
    """An eval-mode copy of `model`, sharing its parameters, with every `nn.Linear` replaced by a `DecodeLinear` and
    the attention by `decode_attention` (the copy's config is its own: `model` keeps its attention)."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    fast = copy.deepcopy(model, memo=shared).eval()
    if fast.config._attn_implementation == "sdpa":
        fast.config._attn_implementation = DECODE_ATTENTION
    for module in list(fast.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, child_name, DecodeLinear(child))
            elif isinstance(child, nn.Dropout):  # a no-op in eval mode, but still a call
                setattr(module, child_name, nn.Identity())
    return fast


class DecodePlan:
    """A model's decode step (one new token per row, on a `BatchKV`) as one flat function over its tensors and modules:
    what `CharGPTForCausalLM`'s forward computes for one query per row, in the same order with the same operations
    (so the same numbers, bit for bit), without its module calls (`nn.Module.__call__`'s hooks and dispatch), its
    cache and attention-registry lookups and its shape juggling: on CPU, a 16-row decode step of the shipped model
    spent about a seventh of its time there (docs/benchmarks.md, "Figures behind design choices"). Every variant of
    the lesson's ladder is covered (no projection, no feed-forward, no LayerNorm, no residual, GELU); attention is
    PyTorch's fused kernel, as `decode_attention` calls it (`of` gives no plan for another implementation, `eager`:
    the backend runs the modules then)."""

    @classmethod
    def of(cls, model: CharGPTForCausalLM) -> DecodePlan | bool:
        """The plan of `model`, or False where its attention is not PyTorch's fused kernel."""
        return cls(model) if model.config._attn_implementation in ("sdpa", DECODE_ATTENTION) else False

    def __init__(self, model: CharGPTForCausalLM):
        body, config = model.model, model.config
        self.n_embd, self.n_head, self.head_size = config.n_embd, config.n_head, config.head_size
        self.token_embeddings = body.token_embedding_table.weight
        self.position_embeddings = body.position_embedding_table.weight
        self.blocks = []
        for block in body.blocks:
            ffwd = None
            if block.ffwd is not None:  # Linear, activation, Linear (without the eval-mode no-ops)
                ffwd = [m.forward for m in block.ffwd.net if not isinstance(m, (nn.Dropout, nn.Identity))]
            self.blocks.append(
                (
                    _call(block.ln1),
                    block.sa.qkv.forward,
                    _call(block.sa.proj),
                    block.sa.scaling,
                    _call(block.ln2),
                    ffwd,
                    block.residual,
                )
            )
        self.final_norm = _call(body.ln_f)
        self.head = model.lm_head.forward

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, kv) -> torch.Tensor:
        """Logits (rows, vocab) of ids (rows,) at positions (rows,), with the key mask (rows, 1, 1, columns) or none,
        extending `kv` (a `BatchKV`) by one column in place."""
        x = F.embedding(ids, self.token_embeddings) + F.embedding(positions, self.position_embeddings)  # (B, C)
        B, C, H, D = x.shape[0], self.n_embd, self.n_head, self.head_size
        for i, (ln1, qkv, proj, scaling, ln2, ffwd, residual) in enumerate(self.blocks):
            h = ln1(x) if ln1 else x
            q, k, v = qkv(h).view(B, 3, H, 1, D).unbind(1)  # each (B, H, 1, hs): queries, keys, values of every head
            k, v = kv.update(k, v, i)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling)  # (B, H, 1, hs)
            a = y.transpose(1, 2).reshape(B, C)  # the heads concatenated
            if proj:
                a = proj(a)
            x = x + a if residual else a
            if ffwd is not None:
                f = ln2(x) if ln2 else x
                for layer in ffwd:
                    f = layer(f)
                x = x + f if residual else f
        return self.head(self.final_norm(x) if self.final_norm else x)


def _call(module: nn.Module):
    """A module's `forward` (None for an identity): called without `nn.Module.__call__`'s per-call work."""
    return None if isinstance(module, nn.Identity) else module.forward
