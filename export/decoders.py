"""What the exporter traces: `CharGPTForCausalLM` wrapped so that its KV cache is flat tensors in and out, in
Hugging Face's decoder layout (`DecoderWithPast`) and in the in-place layout gpt-serve's ONNX backend runs
(`DecoderInPlace`, whose attention is ONNX Runtime's `GroupQueryAttention`), with their tracing inputs and dynamic
axes. Why two graphs, and why these example inputs: docs/export.md.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import DynamicCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from gpt_serve.chargpt.modeling_chargpt import CharGPTForCausalLM, causal_bias, mask_positions
from gpt_serve.onnx_contract import (
    ATTENTION_MASK_NAME,
    CACHE_LENGTHS_NAME,
    INPUT_IDS_NAME,
    LOGITS_NAME,
    POSITION_IDS_NAME,
    cache_names,
    past_names,
    present_names,
)

BATCH, SEQUENCE, PAST = "batch_size", "sequence_length", "past_sequence_length"
COLUMNS = "cache_columns"  # the in-place graph's cache width
TOTAL = f"{PAST} + {SEQUENCE}"  # Hugging Face's name for the attention mask and `present` length


def padding_bias(attention_mask: torch.Tensor, T: int, dtype) -> torch.Tensor:
    """Additive mask (B, 1, T, S) from a 2D key mask (B, S): causal and no attention to padding.

    Uses the dtype's finite minimum, not -inf: a padding query whose every key is masked gets a uniform (ignored)
    row instead of NaN.
    """
    S = attention_mask.shape[1]
    bias = causal_bias(T, S, attention_mask.device, dtype)  # (T, S)
    pad = attention_mask[:, None, None, :] == 0  # (B, 1, 1, S)
    return bias.masked_fill(pad, torch.finfo(dtype).min)


class DecoderWithPast(nn.Module):
    """`CharGPTForCausalLM` with its KV cache as flat tensors in and out, the form an ONNX graph carries.

    forward(input_ids (B, T), attention_mask (B, P + T), position_ids (B, T), *past) -> (logits (B, T, V), *present)
    with `past` = key, value of layer 0, key, value of layer 1, ... each (B, H, P, head_size), and `present` the
    same with P + T positions.

    The 2D padding mask becomes the model's additive 4D mask here (`padding_bias`: a causal Trilu, a Where on the
    padding), which the model uses as given: the few nodes this graph needs, where transformers' mask functions
    trace to a general index computation with its own Shape and Reshape nodes.
    """

    def __init__(self, model: CharGPTForCausalLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        n_layer = self.model.config.n_layer
        cache = DynamicCache(config=self.model.config)
        for i in range(n_layer):
            cache.update(past[2 * i], past[2 * i + 1], i)
        mask = padding_bias(attention_mask, input_ids.shape[1], self.model.dtype)  # (B, 1, T, P + T)
        input_ids = input_ids.masked_fill(attention_mask[:, -input_ids.shape[1] :] == 0, 0)  # a pad id: no embedding
        out = self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=position_ids, cache=cache, use_cache=True
        )
        present = []
        for layer in out.cache.layers[:n_layer]:
            present += [layer.keys, layer.values]  # each (B, H, P + T, head_size)
        return (out.logits, *present)


class _GroupQueryAttention(torch.autograd.Function):
    """ONNX Runtime's `com.microsoft.GroupQueryAttention` for the exporter, with PyTorch's reference of what it
    computes for the trace: causal attention of T new tokens per row over that row's cached tokens and themselves,
    the new keys/values written into the cache buffers at columns `seqlens_k[b] - T + 1 ..` (in place where the
    caller binds the outputs to the inputs' memory: `past_present_share_buffer`)."""

    @staticmethod
    def forward(ctx, query, key, value, past_key, past_value, seqlens_k, total, num_heads: int, scale: float):
        B, T, _ = query.shape
        hs = past_key.shape[-1]
        q, k, v = (t.view(B, T, num_heads, hs).transpose(1, 2) for t in (query, key, value))  # (B, H, T, hs)
        present_key, present_value, out = past_key.clone(), past_value.clone(), torch.empty_like(query)
        for b in range(B):
            end = int(seqlens_k[b]) + 1
            present_key[b, :, end - T : end], present_value[b, :, end - T : end] = k[b], v[b]
            keys, values = present_key[b, :, :end], present_value[b, :, :end]
            mask = causal_bias(T, end, query.device, query.dtype)
            weights = torch.softmax((q[b] @ keys.transpose(-2, -1)) * scale + mask, dim=-1)
            out[b] = (weights @ values).transpose(0, 1).reshape(T, -1)
        return out, present_key, present_value

    @staticmethod
    def symbolic(g, query, key, value, past_key, past_value, seqlens_k, total, num_heads: int, scale: float):
        return g.op(
            "com.microsoft::GroupQueryAttention",
            query,
            key,
            value,
            past_key,
            past_value,
            seqlens_k,
            total,
            num_heads_i=num_heads,
            kv_num_heads_i=num_heads,
            scale_f=scale,
            outputs=3,
        )


class _InPlaceCache:
    """For `DecoderInPlace`: the `Cache` API part a block calls (it hands each layer's new keys/values on to the
    attention as they are: the attention writes them into the cache itself), and what `inplace_attention` reads,
    passed to it by the blocks as a keyword argument: the cache buffers, each row's last column, the total
    length, and each layer's updated buffers (`present`)."""

    def __init__(self, cache, seqlens_k, total):
        self.cache, self.seqlens_k, self.total = cache, seqlens_k, total
        self.present: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key, value, layer_idx, *args, **kwargs):
        return key, value

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


def inplace_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, *, inplace, **kwargs):
    """The attention kernel `DecoderInPlace` traces (registered as `INPLACE_ATTENTION`): one `_GroupQueryAttention`
    per layer over the buffers of `inplace` (an `_InPlaceCache`), in the registry's (B, T, H, hs) output layout."""
    B, _, T, _ = query.shape
    i, state = module.layer_idx, inplace
    q, k, v = (t.transpose(1, 2).reshape(B, T, -1) for t in (query, key, value))  # (B, T, H * hs)
    out, *state.present[i] = _GroupQueryAttention.apply(
        q, k, v, state.cache[2 * i], state.cache[2 * i + 1], state.seqlens_k, state.total, module.n_head, scaling
    )
    return out.view(B, T, module.n_head, -1), None


INPLACE_ATTENTION = "gpt_serve_export_inplace"
ALL_ATTENTION_FUNCTIONS.register(INPLACE_ATTENTION, inplace_attention)


class DecoderInPlace(nn.Module):
    """`CharGPTForCausalLM` on T new tokens per row over a cache that ONNX Runtime updates in place.

    forward(input_ids (B, T), position_ids (B, T), cache_lengths (B,), *cache) -> (logits (B, V), *present)
    with `cache` = key, value of layer 0, key, value of layer 1, ... each (B, H, C, head_size), row b's keys in
    columns `[0, cache_lengths[b])` (C: the buffers' width, at least `cache_lengths[b] + T`; the other columns are
    never read), `logits` those of each row's last new token, and `present` the same buffers with the new tokens'
    keys/values written from column `cache_lengths[b]`. Bound to the inputs' memory (`OnnxInPlaceBatch` does), the
    outputs are the inputs: nothing is copied. T = 1 is a decode step; a prompt is a prefill with cache_lengths 0.

    Why a second graph: the Hugging Face layout returns `present = Concat(past, new)`, so every decode step copies
    every row's whole cache (a quarter of a 16-row decode step of the shipped model, by ONNX Runtime's profiler).
    Here each layer's attention is one ONNX Runtime `GroupQueryAttention` node (its fused CPU kernel, with as many
    key/value heads as query heads), which reads each row's own columns where they are and writes the new ones in
    place, as onnxruntime-genai's decoders do with `past_present_share_buffer`. The same numbers as the model up to
    float rounding (`export.validate.compare_inplace_with_torch`). The blocks are the model's own; only the
    attention kernel and the cache object are swapped in. ONNX Runtime only: other runtimes read the Hugging Face
    layout graph.
    """

    def __init__(self, model: CharGPTForCausalLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, cache_lengths, *cache):
        m = self.model
        B, T = input_ids.shape
        seqlens_k = (cache_lengths + T - 1).to(torch.int32)  # each row's last column after this call (0-based)
        total = (cache_lengths.max() + T).to(torch.int32)
        state = _InPlaceCache(cache, seqlens_k, total)
        body = m.model
        x = body.drop(body.token_embedding_table(input_ids) + body.position_embedding_table(position_ids))
        for block in body.blocks:  # the attention is `inplace_attention` (`_trace` sets it), reading `state`
            x = block(x, attention_mask=None, cache=state, inplace=state)
        logits = m.lm_head(body.ln_f(x[:, -1:]))[:, -1]  # (B, V): the last new token's
        return (logits, *(t for i in range(len(body.blocks)) for t in state.present[i]))


def inplace_example_inputs(model: CharGPTForCausalLM) -> tuple[torch.Tensor, ...]:
    """Tracing inputs for `DecoderInPlace`: 2 rows of 2 new tokens on 3 and 1 cached ones in a 6-column cache."""
    config = model.config
    B, C, T = 2, 6, 2
    input_ids = torch.arange(B * T).reshape(B, T) % config.vocab_size
    lengths = torch.tensor([3, 1])
    cache = [torch.zeros(B, config.n_head, C, config.head_size) for _ in range(2 * config.n_layer)]
    return (input_ids, lengths[:, None] + torch.arange(T), lengths, *cache)


def inplace_dynamic_axes(n_layer: int) -> dict[str, dict[int, str]]:
    axes = {name: {0: BATCH, 1: SEQUENCE} for name in (INPUT_IDS_NAME, POSITION_IDS_NAME)}
    axes.update({name: {0: BATCH} for name in (CACHE_LENGTHS_NAME, LOGITS_NAME)})
    axes.update({name: {0: BATCH, 2: COLUMNS} for name in (*cache_names(n_layer), *present_names(n_layer))})
    return axes


def example_inputs(model: CharGPTForCausalLM) -> tuple[torch.Tensor, ...]:
    """Tracing inputs that take the model's general path: 2 rows, the second left-padded, 2 cached + 2 new."""
    config = model.config
    B, P, T = 2, 2, 2
    input_ids = torch.arange(B * T).reshape(B, T) % config.vocab_size
    attention_mask = torch.ones(B, P + T, dtype=torch.long)
    attention_mask[1, :1] = 0  # left padding: keeps the mask (an all-ones mask would be dropped while tracing)
    position_ids = mask_positions(attention_mask, T)
    past = [torch.zeros(B, config.n_head, P, config.head_size) for _ in range(2 * config.n_layer)]
    return (input_ids, attention_mask, position_ids, *past)


def dynamic_axes(n_layer: int) -> dict[str, dict[int, str]]:
    axes = {
        INPUT_IDS_NAME: {0: BATCH, 1: SEQUENCE},
        ATTENTION_MASK_NAME: {0: BATCH, 1: TOTAL},
        POSITION_IDS_NAME: {0: BATCH, 1: SEQUENCE},
        LOGITS_NAME: {0: BATCH, 1: SEQUENCE},
    }
    axes.update({name: {0: BATCH, 2: PAST} for name in past_names(n_layer)})
    axes.update({name: {0: BATCH, 2: TOTAL} for name in present_names(n_layer)})
    return axes
