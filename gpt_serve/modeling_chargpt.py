"""CharGPTForCausalLM: the lesson's GPT as a transformers model.

Read top to bottom, it is the lesson's `gpt.py`: token + position embeddings, `n_layer` blocks of
"communication" (causal multi-head self-attention) followed by "computation" (a position-wise feed-forward),
each wrapped in pre-norm LayerNorm and a residual connection, then a final LayerNorm and `lm_head`.
The config switches turn those pieces off to give every stage of the lesson's loss ladder, and swap the few
that other character-level GPTs (nanoGPT's) do differently: GELU, biases, tied embeddings, the attention scale.

What transformers adds: the attention kernel picked from its registry by `config._attn_implementation` (`"sdpa"`,
PyTorch's fused kernel, by default; `"eager"` is the lesson's explicit softmax), a KV cache (the `Cache` API; in 5.x
the argument and output are `cache`), left-padded batches (`attention_mask`, `position_ids`), `generate()` that
keeps going past `block_size` (`prepare_inputs_for_generation` slides the window), gradient checkpointing, and
`save_pretrained` / `from_pretrained`. This file and `configuration_chargpt.py` (and the tokenizer's two files) are
what `save_pretrained` copies into a folder for `trust_remote_code=True`, so they import nothing else of gpt_serve.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils.deprecation import deprecate_kwarg

from .configuration_chargpt import CharGPTConfig
from .window import DEFAULT_WINDOW_MODE, WINDOW_MODES, window_keep, window_start


def eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """The lesson's attention, written out: `softmax(q k^T / sqrt(head_size) + mask) @ v`, per head.

    `query` is (B, H, T, hs), `key`/`value` (B, H, S, hs); `attention_mask` is an additive (T, S) or (B, 1, T, S)
    mask, or None for plain causal attention (T == S) and for a single new token. Returns the heads' outputs
    (B, T, H, hs) and the attention weights (B, H, T, S), as transformers' attention functions do.
    """
    T, S = query.shape[2], key.shape[2]
    if attention_mask is None and T > 1:
        attention_mask = causal_bias(T, S, query.device, query.dtype)
    wei = (query @ key.transpose(-2, -1)) * scaling  # (B, H, T, S): affinities of each query with each key
    if attention_mask is not None:
        wei = wei + attention_mask
    wei = F.softmax(wei, dim=-1)
    y = F.dropout(wei, p=dropout, training=module.training) @ value  # (B, H, T, hs)
    return y.transpose(1, 2), wei


class CausalSelfAttention(nn.Module):
    """Communication: `n_head` causal self-attention heads, concatenated, then an output projection.

    The lesson's `Head` modules (key, query, value Linears without bias) are fused into one `qkv` Linear of the
    same size, so all heads run in a single matmul and one attention kernel call (`gpt_serve.importing` maps a
    lesson checkpoint's heads into it).
    """

    is_causal = True  # read by transformers' attention functions

    def __init__(self, config: CharGPTConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.head_size = config.head_size
        self.dropout = config.dropout
        self.scaling = config.attention_scaling  # 1 / sqrt(head_size), the lesson's (see `attn_scale`)
        # queries of every head, then their keys, then their values (the order of nanoGPT's `c_attn`)
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.qkv_bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias) if config.attn_proj else nn.Identity()
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, attention, attention_mask=None, cache=None):
        """`attention` is the kernel (`attention_function(config)`), looked up once per forward of the model."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, self.head_size).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hs)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # (B, H, S, hs), S = past + T
        dropout = self.dropout if self.training else 0.0
        y, wei = attention(self, q, k, v, attention_mask, dropout=dropout, scaling=self.scaling)
        y = y.reshape(B, T, C)  # (B, T, H, hs) -> the heads concatenated: (B, T, C)
        return self.resid_dropout(self.proj(y)), wei


ACTIVATION_MODULES = {"relu": nn.ReLU, "gelu": nn.GELU}  # `config.activation`; GELU is the exact (erf) one


class FeedForward(nn.Module):
    """Computation: `Linear(n, m*n) -> ReLU -> Linear(m*n, n) -> Dropout`, applied to each position alone (GELU
    instead of ReLU with `activation="gelu"`)."""

    def __init__(self, config: CharGPTConfig):
        super().__init__()
        hidden = config.ffwd_mult * config.n_embd
        layers = [nn.Linear(config.n_embd, hidden, bias=config.bias), ACTIVATION_MODULES[config.activation]()]
        if config.ffwd_proj:
            layers.append(nn.Linear(hidden, config.n_embd, bias=config.bias))
        layers.append(nn.Dropout(config.dropout))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def layer_norm(config: CharGPTConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.layer_norm_bias)


class Block(GradientCheckpointingLayer):
    """Communication then computation, each pre-normed and added to the residual stream."""

    def __init__(self, config: CharGPTConfig, layer_idx: int):
        super().__init__()
        self.residual = config.residual
        norm = (lambda: layer_norm(config)) if config.layer_norm else nn.Identity
        self.ln1 = norm()
        self.sa = CausalSelfAttention(config, layer_idx)
        self.ln2 = norm() if config.ffwd_mult else nn.Identity()
        self.ffwd = FeedForward(config) if config.ffwd_mult else None

    def forward(self, x, attention, attention_mask=None, cache=None):
        a, wei = self.sa(self.ln1(x), attention, attention_mask, cache)
        x = x + a if self.residual else a
        if self.ffwd is not None:
            f = self.ffwd(self.ln2(x))
            x = x + f if self.residual else f
        return x, wei


def attention_function(config: CharGPTConfig, output_attentions: bool = False):
    """The attention kernel `config._attn_implementation` names in transformers' registry (`"sdpa"` by default,
    `"eager"` is `eager_attention`). The weights themselves are only written out by the eager kernel, so
    `output_attentions` takes it."""
    implementation = "eager" if output_attentions else config._attn_implementation
    return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention)


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
    base_model_prefix = ""  # the causal LM is its own base model: no wrapped body (`model.base_model is model`)
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_attention_backend = True

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
            if module.bias is not None:
                init.zeros_(module.bias)


def generation_defaults(config: CharGPTConfig) -> dict:
    """The model's generation defaults: sampled text (temperature 1, no top-k/top-p cut), 200 new characters."""
    return {
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "max_new_tokens": 200,
        "pad_token_id": config.vocab_size,
    }


class CharGPTForCausalLM(CharGPTPreTrainedModel, GenerationMixin):
    """The lesson's GPT with a language-modeling head."""

    # with `tie_word_embeddings` (nanoGPT's), `lm_head` reads out through the token embedding: one tensor
    _tied_weights_keys = {"lm_head.weight": "token_embedding_table.weight"}

    def __init__(self, config: CharGPTConfig):
        super().__init__(config)
        self.token_embedding_table = nn.Embedding(config.vocab_size, config.n_embd)
        self.position_embedding_table = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        self.ln_f = layer_norm(config) if config.layer_norm else nn.Identity()
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=config.lm_head_bias)
        self.post_init()
        # What `generate()` and `pipeline("text-generation")` do when told nothing (saved as generation_config.json):
        # sample from the whole distribution, as the lesson's `generate` does, and pad with the tokenizer's <pad>.
        self.generation_config.update(**generation_defaults(config))

    def get_input_embeddings(self):
        return self.token_embedding_table

    def set_input_embeddings(self, value):
        self.token_embedding_table = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        logits_to_keep: int = 0,
        return_dict: bool | None = None,
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
                `past_key_values=` is accepted as its deprecated name.
            inputs_embeds (`torch.FloatTensor` of shape `(batch_size, sequence_length, n_embd)`, *optional*):
                Token embeddings instead of `input_ids` (the position embeddings are still added).
            labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Targets, shifted inside (position t predicts `labels[:, t+1]`); -100 is ignored. The loss is
                transformers' causal-LM loss (`self.loss_function`), so `num_items_in_batch` and `shift_labels`
                work as in every transformers model.
            logits_to_keep (`int`, *optional*, defaults to 0):
                Compute logits for the last `logits_to_keep` positions only (0 = all); `generate()` passes 1.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        x_in = input_ids if input_ids is not None else inputs_embeds
        if x_in.dim() != (2 if input_ids is not None else 3):
            kind = (
                "input_ids must be a (batch, sequence) tensor of ids"
                if input_ids is not None
                else ("inputs_embeds must be a (batch, sequence, n_embd) tensor")
            )
            raise ValueError(f"{kind}, got shape {tuple(x_in.shape)}")
        if x_in.shape[1] == 0:
            raise ValueError("the input is empty: give at least one token (the lesson starts from a newline, id 0)")
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)

        past = cache.get_seq_length() if cache is not None else 0
        dtype = self.token_embedding_table.weight.dtype
        if torch.is_autocast_enabled(x_in.device.type):
            dtype = torch.get_autocast_dtype(x_in.device.type)
        attention_mask, position_ids = self._mask_and_positions(x_in.shape[:2], attention_mask, position_ids, past)
        if input_ids is not None:
            if attention_mask is not None:
                # Padding may hold the tokenizer's pad id, which has no embedding row: embed id 0 there instead.
                input_ids = input_ids.masked_fill(attention_mask[:, -input_ids.shape[1] :] == 0, 0)
            self._check_ids(input_ids)
            inputs_embeds = self.token_embedding_table(input_ids)  # (B, T, C)
        bias = self._attention_bias(attention_mask, x_in.shape[1], past, x_in.device, dtype)

        pos_emb = self.position_embedding_table(position_ids)  # (B, T, C)
        x = self.drop(inputs_embeds + pos_emb)
        all_hidden = (x,) if output_hidden_states else None
        all_attn = () if output_attentions else None
        attention = attention_function(self.config, output_attentions)
        for block in self.blocks:
            x, wei = block(x, attention=attention, attention_mask=bias, cache=cache if use_cache else None)
            if output_hidden_states:
                all_hidden += (x,)
            if output_attentions:
                all_attn += (wei,)
        x = self.ln_f(x)
        logits = self.lm_head(x[:, -logits_to_keep:] if logits_to_keep else x)  # (B, T', vocab_size)

        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        cache = cache if use_cache else None
        if not return_dict:
            out = tuple(t for t in (logits, cache, all_hidden, all_attn) if t is not None)
            return (loss, *out) if loss is not None else out
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, cache=cache, hidden_states=all_hidden, attentions=all_attn
        )

    def _mask_and_positions(self, shape, attention_mask, position_ids, past: int):
        """Checks the mask's shape (None when it masks nothing) and the positions, derived when omitted."""
        B, T = shape
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape != (B, past + T):
                raise ValueError(
                    f"attention_mask must have shape (batch, past + sequence) = ({B}, {past + T}), "
                    f"got {tuple(attention_mask.shape)}"
                )
            # An all-ones mask masks nothing: drop it so attention takes the plain causal path. (Reading the
            # tensor back is a device sync and a graph break: compiled graphs keep the mask.)
            if not torch.compiler.is_compiling() and bool(attention_mask.all()):
                attention_mask = None
        device = self.token_embedding_table.weight.device
        if position_ids is None:
            if attention_mask is not None:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]
            else:
                position_ids = torch.arange(past, past + T, device=device).unsqueeze(0).expand(B, T)
        block_size = self.config.block_size
        if not torch.compiler.is_compiling() and bool(((position_ids >= block_size) | (position_ids < 0)).any()):
            raise ValueError(
                f"positions must lie in [0, block_size) = [0, {block_size}), got max {int(position_ids.max())}: "
                f"the model has {block_size} learned positions. generate() slides the window past block_size; "
                f"a direct forward must be given at most {block_size} tokens."
            )
        return attention_mask, position_ids

    def _check_ids(self, input_ids) -> None:
        V = self.config.vocab_size
        # Value checks read tensors back (a device sync); compiled graphs skip them.
        if not torch.compiler.is_compiling() and bool(((input_ids < 0) | (input_ids >= V)).any()):
            bad = input_ids[(input_ids < 0) | (input_ids >= V)].unique().tolist()
            raise ValueError(f"input_ids holds ids {bad[:10]} outside the vocabulary [0, {V - 1}]")

    @staticmethod
    def _attention_bias(attention_mask, T: int, past: int, device, dtype):
        """The additive mask every layer's attention takes, or None where plain causal masking is right: the
        queries are all the positions (T == past + T) or a single new token."""
        if attention_mask is not None:
            return padding_bias(attention_mask, T, dtype)  # (B, 1, T, S)
        if T > 1 and past > 0:
            return causal_bias(T, past + T, device, dtype)  # a chunk on top of a cache: (T, S)
        return None

    def prepare_inputs_for_generation(
        self,
        input_ids,
        next_sequence_length=None,
        cache=None,
        attention_mask=None,
        window_mode=DEFAULT_WINDOW_MODE,
        refill_tokens=None,
        **kwargs,
    ):
        """Feeds the model the tokens it has not seen, sliding the window once the text outgrows `block_size`.

        Inside the window this is the usual incremental decode. Past it, `window_mode` (a `generate()` argument)
        decides, by the package's one window rule (`gpt_serve.window`): `"refill"` (the default) restarts the cache
        from the last `refill_tokens` tokens (`generate()` argument, default `block_size // 2`) when it is full;
        `"exact"` re-runs the last `block_size` tokens at positions `0..block_size-1` every step (the lesson's
        `idx[:, -block_size:]`). Positions restart at 0 in the window.
        """
        block_size = self.config.block_size
        # the package's one window rule (`gpt_serve.window`); without a cache every step re-reads the whole window
        keep = window_keep(block_size, window_mode, refill_tokens) if cache is not None else block_size
        kwargs.pop("position_ids", None)  # recomputed from the window below
        total = input_ids.shape[1]
        past = cache.get_seq_length() if cache is not None else 0
        new = total - past if cache is not None else total
        if cache is not None and next_sequence_length is not None:
            new = next_sequence_length
        start = total - past - new  # where the window starts: the cache holds [start, total - new)
        if window_start(total, start, block_size, keep) != start:
            # The window overflows: restart the cache from the last `keep` tokens.
            past, new = 0, min(keep, total)
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


# save_pretrained copies this file (and what it imports relatively) into the folder and writes `auto_map`.
CharGPTForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = ["CharGPTForCausalLM", "CharGPTPreTrainedModel", "WINDOW_MODES", "eager_attention"]
