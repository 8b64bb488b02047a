"""CharGPTForCausalLM: the lesson's GPT as a transformers model.

Read top to bottom, it is the lesson's `gpt.py`: token + position embeddings, `n_layer` blocks of
"communication" (causal multi-head self-attention) followed by "computation" (a position-wise feed-forward),
each wrapped in pre-norm LayerNorm and a residual connection, then a final LayerNorm and `lm_head`.
The config switches turn those pieces off to give every stage of the lesson's loss ladder.

What transformers adds: a KV cache (transformers' `Cache` API; in 5.x the argument and output are `cache`),
left-padded batches (`attention_mask`, `position_ids`), `generate()` that keeps going past `block_size`
(`prepare_inputs_for_generation` slides the window, see `CharGPTConfig.window_mode`), and `save_pretrained`
/ `from_pretrained`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_chargpt import CharGPTConfig
from .engine import WINDOW_MODES


class CausalSelfAttention(nn.Module):
    """Communication: `n_head` causal self-attention heads, concatenated, then an output projection.

    The lesson's `Head` modules (key, query, value Linears without bias) are fused into one `qkv` Linear of the
    same size, so all heads run in a single matmul and in PyTorch's fused attention kernel.
    """

    def __init__(self, config: CharGPTConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.head_size = config.head_size
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)  # key, query, value of every head
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias) if config.attn_proj else nn.Identity()
        self.attn_dropout = Dropout(config.dropout)
        self.resid_dropout = Dropout(config.dropout)

    def forward(self, x, attn_mask=None, cache=None, output_attentions=False):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, self.head_size).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hs)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # (B, H, S, hs), S = past + T
        S = k.shape[2]
        # A query sees every key at or before it. Without padding that is plain causal masking (or nothing, for
        # a single new token); with padding or a partial cache the caller passes an explicit additive mask.
        is_causal = attn_mask is None and T > 1 and S == T
        if attn_mask is None and T > 1 and S != T:
            attn_mask = causal_bias(T, S, x.device, q.dtype)
        if not output_attentions and fast_dropout_applies(x, self.dropout, self.training):
            wei = None
            # The lesson's explicit attention with dropout, by hand for CPU training (see `attention_with_dropout`)
            y = attention_with_dropout(q, k, v, attn_mask, is_causal, self.dropout)
        elif output_attentions:
            wei = (q @ k.transpose(-2, -1)) * self.head_size**-0.5  # (B, H, T, S)
            if attn_mask is not None:
                wei = wei + attn_mask
            elif is_causal:
                wei = wei + causal_bias(T, S, x.device, q.dtype)
            wei = F.softmax(wei, dim=-1)
            y = self.attn_dropout(wei) @ v  # (B, H, T, hs)
        else:
            wei = None
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=self.dropout if self.training else 0.0
            )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # concatenate the heads: (B, T, C)
        return self.resid_dropout(self.proj(y)), wei


class FeedForward(nn.Module):
    """Computation: `Linear(n, m*n) -> ReLU -> Linear(m*n, n) -> Dropout`, applied to each position alone."""

    def __init__(self, config: CharGPTConfig):
        super().__init__()
        hidden = config.ffwd_mult * config.n_embd
        layers = [nn.Linear(config.n_embd, hidden, bias=config.bias), nn.ReLU()]
        if config.ffwd_proj:
            layers.append(nn.Linear(hidden, config.n_embd, bias=config.bias))
        layers.append(Dropout(config.dropout))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    """Communication then computation, each pre-normed and added to the residual stream."""

    def __init__(self, config: CharGPTConfig, layer_idx: int):
        super().__init__()
        self.residual = config.residual
        norm = (lambda: nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps)) if config.layer_norm else nn.Identity
        self.ln1 = norm()
        self.sa = CausalSelfAttention(config, layer_idx)
        self.ln2 = norm() if config.ffwd_mult else nn.Identity()
        self.ffwd = FeedForward(config) if config.ffwd_mult else None

    def forward(self, x, attn_mask=None, cache=None, output_attentions=False):
        a, wei = self.sa(self.ln1(x), attn_mask, cache, output_attentions)
        x = x + a if self.residual else a
        if self.ffwd is not None:
            f = self.ffwd(self.ln2(x))
            x = x + f if self.residual else f
        return x, wei


def causal_bias(T: int, S: int, device, dtype) -> torch.Tensor:
    """Additive mask (T, S) letting query t (the last T of S positions) see keys 0..S-T+t."""
    allowed = torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)
    return torch.zeros(T, S, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)


def padding_bias(attention_mask: torch.Tensor, T: int, dtype) -> torch.Tensor:
    """Additive mask (B, 1, T, S) from a 2D key mask (B, S): causal and no attention to padding.

    Uses the dtype's finite minimum, not -inf: a padding query whose every key is masked gets a uniform (ignored)
    row instead of NaN.
    """
    S = attention_mask.shape[1]
    bias = causal_bias(T, S, attention_mask.device, dtype)  # (T, S)
    pad = attention_mask[:, None, None, :] == 0  # (B, 1, 1, S)
    return bias.masked_fill(pad, torch.finfo(dtype).min)


class CharGPTPreTrainedModel(PreTrainedModel):
    config_class = CharGPTConfig
    base_model_prefix = "chargpt"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _supports_sdpa = True

    @torch.no_grad()
    def _init_weights(self, module):
        if self.config.init == "pytorch":
            # PyTorch's own default init (what the lesson's stages A-E used).
            if isinstance(module, (nn.Linear, nn.Embedding, nn.LayerNorm)):
                module.reset_parameters()
            return
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)


class CharGPTForCausalLM(CharGPTPreTrainedModel, GenerationMixin):
    """The lesson's GPT with a language-modeling head."""

    def __init__(self, config: CharGPTConfig):
        super().__init__(config)
        self.token_embedding_table = nn.Embedding(config.vocab_size, config.n_embd)
        self.position_embedding_table = nn.Embedding(config.block_size, config.n_embd)
        self.drop = Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps) if config.layer_norm else nn.Identity()
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=config.bias)
        self.post_init()

    def get_input_embeddings(self):
        return self.token_embedding_table

    def set_input_embeddings(self, value):
        self.token_embedding_table = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        logits_to_keep: int = 0,
        return_dict: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`):
                Character ids; padded positions (where `attention_mask` is 0) may hold any id, the pad id included.
            attention_mask (`torch.Tensor` of shape `(batch_size, past_length + sequence_length)`, *optional*):
                1 for real tokens, 0 for (left) padding.
            position_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Positions in `[0, block_size)`; derived from `attention_mask` (or the cache length) when omitted.
            cache (`Cache`, *optional*):
                Keys and values of earlier tokens; a `DynamicCache` is created when `use_cache=True`.
            labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Targets, shifted inside (position t predicts `labels[:, t+1]`); -100 is ignored. The loss is the mean
                cross-entropy.
            logits_to_keep (`int`, *optional*, defaults to 0):
                Compute logits for the last `logits_to_keep` positions only (0 = all); `generate()` passes 1.
        """
        if inputs_embeds is not None:
            raise ValueError("CharGPTForCausalLM takes input_ids only; inputs_embeds is not supported")
        if kwargs.get("past_key_values") is not None:
            raise ValueError("the KV cache argument is `cache` (transformers 5.x), not `past_key_values`")
        if input_ids is None or input_ids.dim() != 2:
            shape = None if input_ids is None else tuple(input_ids.shape)
            raise ValueError(f"input_ids must be a (batch, sequence) tensor of ids, got {shape}")
        if input_ids.shape[1] == 0:
            raise ValueError("input_ids is empty: give at least one token (the lesson starts from a newline, id 0)")
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)

        B, T = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        input_ids, attn_mask, position_ids = self._prepare_inputs(input_ids, attention_mask, position_ids, past)

        tok_emb = self.token_embedding_table(input_ids)  # (B, T, C)
        pos_emb = self.position_embedding_table(position_ids)  # (B, T, C)
        x = self.drop(tok_emb + pos_emb)
        all_hidden = (x,) if output_hidden_states else None
        all_attn = () if output_attentions else None
        for block in self.blocks:
            x, wei = block(x, attn_mask, cache if use_cache else None, output_attentions)
            if output_hidden_states:
                all_hidden += (x,)
            if output_attentions:
                all_attn += (wei,)
        x = self.ln_f(x)
        logits = self.lm_head(x[:, -logits_to_keep:] if logits_to_keep else x)  # (B, T', vocab_size)

        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        cache = cache if use_cache else None
        if not return_dict:
            out = tuple(t for t in (logits, cache, all_hidden, all_attn) if t is not None)
            return (loss, *out) if loss is not None else out
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, cache=cache, hidden_states=all_hidden, attentions=all_attn
        )

    def _prepare_inputs(self, input_ids, attention_mask, position_ids, past: int):
        """Validates ids, positions and mask; returns (ids safe to embed, additive mask or None, positions)."""
        B, T = input_ids.shape
        V, block_size = self.config.vocab_size, self.config.block_size
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape != (B, past + T):
                raise ValueError(
                    f"attention_mask must have shape (batch, past + sequence) = ({B}, {past + T}), "
                    f"got {tuple(attention_mask.shape)}"
                )
            if bool(attention_mask.all()):
                attention_mask = None
        if attention_mask is not None:
            # Padding may hold the tokenizer's pad id, which has no embedding row: embed id 0 there instead.
            input_ids = input_ids.masked_fill(attention_mask[:, -T:] == 0, 0)
        # Value checks read tensors back (a device sync); compiled training graphs skip them.
        validate = not torch.compiler.is_compiling()
        if validate and bool(((input_ids < 0) | (input_ids >= V)).any()):
            bad = input_ids[(input_ids < 0) | (input_ids >= V)].unique().tolist()
            raise ValueError(f"input_ids holds ids {bad[:10]} outside the vocabulary [0, {V - 1}]")
        if position_ids is None:
            if attention_mask is not None:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]
            else:
                position_ids = torch.arange(past, past + T, device=input_ids.device).unsqueeze(0).expand(B, T)
        if validate and bool(((position_ids >= block_size) | (position_ids < 0)).any()):
            raise ValueError(
                f"positions must lie in [0, block_size) = [0, {block_size}), got max {int(position_ids.max())}: "
                f"the model has {block_size} learned positions. generate() slides the window past block_size; "
                f"a direct forward must be given at most {block_size} tokens."
            )
        dtype = self.token_embedding_table.weight.dtype
        if torch.is_autocast_enabled(input_ids.device.type):
            dtype = torch.get_autocast_dtype(input_ids.device.type)
        attn_mask = padding_bias(attention_mask, T, dtype) if attention_mask is not None else None
        return input_ids, attn_mask, position_ids

    def prepare_inputs_for_generation(
        self, input_ids, next_sequence_length=None, cache=None, attention_mask=None, window_mode=None, **kwargs
    ):
        """Feeds the model the tokens it has not seen, sliding the window once the text outgrows `block_size`.

        Inside the window this is the usual incremental decode. Past it, `window_mode` (a `generate()` kwarg, else
        `config.window_mode`) decides: `"exact"` re-runs the last `block_size` tokens at positions
        `0..block_size-1` every step (the lesson's `idx[:, -block_size:]`); `"refill"` restarts the cache from the
        last `config.refill_tokens` tokens when it is full. Positions always restart at 0 inside the window.
        """
        mode = window_mode or self.config.window_mode
        if mode not in WINDOW_MODES:
            raise ValueError(f"window_mode must be one of {WINDOW_MODES}, got {mode!r}")
        kwargs.pop("position_ids", None)  # recomputed from the window below
        block_size = self.config.block_size
        total = input_ids.shape[1]
        past = cache.get_seq_length() if cache is not None else 0
        new = total - past if cache is not None else total
        if cache is not None and next_sequence_length is not None:
            new = next_sequence_length
        if past + new > block_size:
            # The window overflows: restart the cache from the last tokens.
            keep = block_size if (mode == "exact" or cache is None) else self.config.refill_tokens
            keep = min(keep, total)
            past, new = 0, keep
            if cache is not None:
                cache = DynamicCache(config=self.config)
        window = past + new
        if attention_mask is None:
            window_mask = torch.ones(input_ids.shape[0], window, dtype=torch.long, device=input_ids.device)
        else:
            window_mask = attention_mask[:, -window:]
        position_ids = (window_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -new:]
        model_inputs = {
            "input_ids": input_ids[:, -new:].contiguous(),
            "attention_mask": window_mask,
            "position_ids": position_ids.contiguous(),
            "cache": cache,
        }
        for key, value in kwargs.items():
            if key not in ("next_sequence_length", "is_first_iteration", "labels") and key not in model_inputs:
                model_inputs[key] = value
        return model_inputs


# -- CPU training kernels ----------------------------------------------------------------------------------------
# On CPU, PyTorch's dropout spends most of its time drawing random numbers, and SDPA cannot fuse dropout on the
# attention weights, so its fallback materializes the whole (B, H, T, S) matrix several times. What follows does
# the same math with a cheaper mask and in cache-sized pieces; `benchmarks/training.py` measures the difference.
# On CUDA and under torch.compile the model uses PyTorch's own kernels.


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


class Dropout(nn.Dropout):
    """`nn.Dropout` with a cheaper random mask on CPU (see `dropout_mask`); the same module elsewhere."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not fast_dropout_applies(x, self.p, self.training):
            return super().forward(x)
        drop, scale = dropout_mask(x.shape, self.p, x.device)
        # One float mask, used by the forward product and again by its backward (one pass each way)
        return x * torch.where(drop, 0.0, scale).to(x.dtype)


def attention_with_dropout(q, k, v, attn_mask, is_causal: bool, p: float) -> torch.Tensor:
    """`softmax(q k^T / sqrt(hs) + mask)`, dropout with probability `p`, times `v`: (B, H, T, hs) in and out.

    `attn_mask` is None, an additive (T, S) or (B, 1, T, S) mask; `is_causal` (with T == S) means the causal mask.
    """
    B, H, T, hs = q.shape
    S = k.shape[2]
    if is_causal:
        bias = causal_bias(T, S, q.device, q.dtype)
    elif attn_mask is not None:
        # (B, 1, T, S) padding masks are rare in training; materialized per head to index blocks simply
        bias = attn_mask.expand(B, H, T, S).reshape(B * H, T, S) if attn_mask.dim() == 4 else attn_mask
    else:
        bias = None
    flat = [t.reshape(B * H, t.shape[2], hs) for t in (q, k, v)]
    y = _AttentionWithDropout.apply(*flat, bias, is_causal, p)
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
    def forward(ctx, q, k, v, bias, causal, p):
        N, T, hs = q.shape
        S = k.shape[1]
        scale = hs**-0.5
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
        return dq, dk, dv, None, None, None


__all__ = ["CharGPTForCausalLM", "CharGPTPreTrainedModel"]
