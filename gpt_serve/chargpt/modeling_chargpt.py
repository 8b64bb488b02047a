"""CharGPTForCausalLM: the lesson's GPT as a transformers model.

Read top to bottom, it is the lesson's `gpt.py`: token + position embeddings, `n_layer` blocks of
"communication" (causal multi-head self-attention) followed by "computation" (a position-wise feed-forward),
each wrapped in pre-norm LayerNorm and a residual connection, then a final LayerNorm and `lm_head`.
The config switches turn those pieces off to give every stage of the lesson's loss ladder, and swap the few
that other character-level GPTs (nanoGPT's) do differently: GELU, biases, tied embeddings, the attention scale.

The body is `CharGPTModel` (embeddings, blocks, final LayerNorm: `AutoModel`), the causal LM `CharGPTForCausalLM`
puts `lm_head` on it. What transformers adds, through the same contract as its own models (GPT-2, Llama): the
attention kernel picked from its registry by `config._attn_implementation` (`"sdpa"`, PyTorch's fused kernel, by
default; `"eager"` is the lesson's explicit softmax; any registered kernel receives the mask and the forward's
`**kwargs`), masks from `transformers.masking_utils.create_causal_mask` (left padding from a 2D `attention_mask`,
custom 4D masks, packed sequences split by `position_ids`), any `Cache` (`DynamicCache`, `StaticCache` with
`torch.compile`, the `PagedAttentionCache` of continuous batching: `cache.update(k, v, layer_idx, kwargs=...)`),
output capture (`output_hidden_states`, `output_attentions`), `generate()` that keeps going past `block_size`
(`prepare_inputs_for_generation` slides the window), gradient checkpointing, and `save_pretrained` /
`from_pretrained` (folders saved before the body/head split load through a key mapping). This file,
`configuration_chargpt.py` and `window.py` are what `save_pretrained` copies into a folder for
`trust_remote_code=True`, so they import nothing else of gpt_serve. The model stays one file, as each of
transformers' own models is one modeling file: a second one would be a file every saved folder must carry
(`gpt_serve.folders.publishing.CODE_FILES`), and its helpers (the attention masks, the old layout's key mapping,
quiet loading) are few and short.
"""

import contextlib
import os

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, slice_logits_to_keep
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_chargpt import CharGPTConfig
from .window import DEFAULT_WINDOW_MODE, WINDOW_MODES, window_keep, window_start


def eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """The lesson's attention, written out: `softmax(q k^T / sqrt(head_size) + mask) @ v`, per head.

    `query` is (B, H, T, hs), `key`/`value` (B, H, S, hs); `attention_mask` is an additive float mask or a boolean
    one (True = may attend), (T, S) or (B, 1, T, S), or None for plain causal attention (the last T of S positions)
    and for a single new token. Returns the heads' outputs (B, T, H, hs) and the attention weights (B, H, T, S), as
    transformers' attention functions do.
    """
    T, S = query.shape[2], key.shape[2]
    if attention_mask is None and T > 1:
        attention_mask = causal_bias(T, S, query.device, query.dtype)
    elif attention_mask is not None and attention_mask.dtype == torch.bool:
        attention_mask = additive_mask(attention_mask, query.dtype)
    wei = (query @ key.transpose(-2, -1)) * scaling  # (B, H, T, S): affinities of each query with each key
    if attention_mask is not None:
        wei = wei + attention_mask
    wei = F.softmax(wei, dim=-1)
    y = F.dropout(wei, p=dropout, training=module.training) @ value  # (B, H, T, hs)
    return y.transpose(1, 2), wei


def additive_mask(allowed: torch.Tensor, dtype) -> torch.Tensor:
    """A boolean mask (True = may attend) as the additive one eager attention adds to its scores: 0 where allowed,
    the dtype's finite minimum elsewhere (not -inf: a row with every key masked gets a uniform, ignored row, not
    NaN)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def causal_bias(T: int, S: int, device, dtype) -> torch.Tensor:
    """Additive mask (T, S) letting query t (the last T of S positions) see keys 0..S-T+t. (Built from T and S, not
    by `additive_mask`, whose zeros take the shape of a tensor: an exported graph would compute it at run time.)"""
    allowed = torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)
    return torch.zeros(T, S, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)


class CausalSelfAttention(nn.Module):
    """Communication: `n_head` causal self-attention heads, concatenated, then an output projection.

    The lesson's `Head` modules (key, query, value Linears without bias) are fused into one `qkv` Linear of the
    same size, so all heads run in a single matmul and one attention kernel call (`gpt_serve.folders.conversion` maps a
    lesson checkpoint's heads into it).
    """

    is_causal = True  # read by transformers' attention functions

    def __init__(self, config: CharGPTConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.head_size = config.head_size
        self.dropout = config.dropout
        self.scaling = config.attention_scaling  # 1 / sqrt(head_size), the lesson's (see `attn_scale`)
        # queries of every head, then their keys, then their values (the order of nanoGPT's `c_attn`)
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.qkv_bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias) if config.attn_proj else nn.Identity()
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, hidden_states, attention_mask=None, cache: Cache | None = None, **kwargs):
        """Returns the block's attention output (B, T, C) and the weights (B, H, T, S) where the kernel gives them.
        `kwargs` go on to the cache (`update(..., kwargs=...)`: a paged cache reads and fills them) and the kernel."""
        B, T, C = hidden_states.shape
        q, k, v = self.qkv(hidden_states).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, self.head_size).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hs)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)  # (B, H, S, hs), S = past + T
        # The kernel `config._attn_implementation` names in transformers' registry ("sdpa" by default, "eager" is
        # `eager_attention`; only eager writes out the weights, so `output_attentions` takes it). Looked up and
        # called here, in transformers' own words: vLLM's Transformers backend finds the attention layers by reading
        # this source for one `ALL_ATTENTION_FUNCTIONS` lookup called once, with `scaling=self.<attribute>`.
        implementation = "eager" if kwargs.get("output_attentions", False) else self.config._attn_implementation
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention)
        dropout = self.dropout if self.training else 0.0
        y, wei = attention_interface(self, q, k, v, attention_mask, dropout=dropout, scaling=self.scaling, **kwargs)
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

    def forward(self, hidden_states, attention_mask=None, cache: Cache | None = None, **kwargs) -> torch.Tensor:
        x = hidden_states
        a, _ = self.sa(self.ln1(x), attention_mask, cache, **kwargs)
        x = x + a if self.residual else a
        if self.ffwd is not None:
            f = self.ffwd(self.ln2(x))
            x = x + f if self.residual else f
        return x


# Folders saved before the body/head split hold the body's tensors at the top level (`blocks.0...`, no `model.`).
OLD_LAYOUT_KEYS = ("token_embedding_table.", "position_embedding_table.", "blocks.", "ln_f.")
OLD_LAYOUT_MAPPING = {rf"^({'|'.join(k[:-1] for k in OLD_LAYOUT_KEYS)})\.": r"model.\1."}  # a `key_mapping`


def upgrade_state_dict(state: dict) -> dict:
    """A causal LM's state dict (or any mapping keyed by its tensor names) in the current layout: the body's tensors
    of a state dict saved before the body/head split move under `model.`; current names stay."""
    return {("model." + k if k.startswith(OLD_LAYOUT_KEYS) else k): v for k, v in state.items()}


@contextlib.contextmanager
def quiet_weight_loading():
    """transformers' "Loading weights" progress bar off while the block runs (on again after it, if it was), so that
    loading a model prints nothing (saving one neither: its "Writing model shards" bar is the same switch);
    `HF_HUB_DISABLE_PROGRESS_BARS=0` in the environment keeps it (what the commands'
    `--progress` sets)."""
    from transformers.utils import logging as transformers_logging

    was_on = transformers_logging.is_progress_bar_enabled()
    if was_on and os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") != "0":
        transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            transformers_logging.enable_progress_bar()


class CharGPTPreTrainedModel(PreTrainedModel):
    config_class = CharGPTConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True
    _can_record_outputs = {
        "hidden_states": Block,
        "attentions": OutputRecorder(CausalSelfAttention, index=1),
    }

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

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' `from_pretrained`, quietly (`quiet_weight_loading`); a causal LM folder saved before the
        body/head split (its body's tensors at the top level: `blocks.0...`) loads through a key mapping onto
        `model.`."""
        if cls is not CharGPTModel and kwargs.get("key_mapping") is None:
            kwargs["key_mapping"] = OLD_LAYOUT_MAPPING
        with quiet_weight_loading():
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)


class CharGPTModel(CharGPTPreTrainedModel):
    """The lesson's GPT without its head: token + position embeddings, the blocks, the final LayerNorm. Its output
    is the last hidden state (B, T, n_embd) (`AutoModel`)."""

    def __init__(self, config: CharGPTConfig):
        super().__init__(config)
        self.token_embedding_table = nn.Embedding(config.vocab_size, config.n_embd)
        self.position_embedding_table = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        self.ln_f = layer_norm(config) if config.layer_norm else nn.Identity()
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.token_embedding_table

    def set_input_embeddings(self, value):
        self.token_embedding_table = value

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPast:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`):
                Character ids; padded positions (where a 2D `attention_mask` is 0) may hold any id, the pad id
                included.
            attention_mask (`torch.Tensor`, *optional*):
                A 2D `(batch_size, past_length + sequence_length)` mask, 1 for real tokens and 0 for (left) padding,
                or a prepared 4D mask `(batch_size, 1, sequence_length, key_length)` (boolean, True = may attend, or
                additive float), used as given.
            position_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Positions in `[0, block_size)`; derived from a 2D `attention_mask` (or the cache length) when
                omitted. Without a mask or cache, positions that restart at 0 inside a row mark packed sequences,
                which do not attend to each other.
            cache (`Cache`, *optional*):
                Keys and values of earlier tokens, extended in place (whatever `use_cache` says, as in transformers'
                models); without one, a `DynamicCache` is created when `use_cache=True` (the default in eval mode).
                `past_key_values=` is accepted as its deprecated name.
            inputs_embeds (`torch.FloatTensor` of shape `(batch_size, sequence_length, n_embd)`, *optional*):
                Token embeddings instead of `input_ids` (the position embeddings are still added).
        """
        self._check_inputs(input_ids, inputs_embeds, attention_mask, position_ids, cache)
        if use_cache is None:
            use_cache = self.config.use_cache and not self.training
        past = cache  # the keys of earlier tokens, if any: a cache made here holds none, so mask and positions skip it
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        padding_mask = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
        if inputs_embeds is None:
            inputs_embeds = self._token_embeddings(input_ids, padding_mask)  # (B, T, C)
        mask = self._causal_mask(inputs_embeds, attention_mask, position_ids, past)
        if position_ids is None:
            position_ids = self._positions(padding_mask, past, *inputs_embeds.shape[:2])

        x = self.drop(inputs_embeds + self.position_embedding_table(position_ids))  # (B, T, C)
        for block in self.blocks:
            x = block(x, attention_mask=mask, cache=cache, position_ids=position_ids, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.ln_f(x), cache=cache)

    def _check_inputs(self, input_ids, inputs_embeds, attention_mask, position_ids, cache) -> None:
        """A ValueError naming what is wrong with the forward's inputs: not exactly one of `input_ids` and
        `inputs_embeds`, a shape, an empty input, and (where the values are read: a compiled graph skips those
        checks) a 2D mask that does not cover the cache and the input, ids outside the vocabulary where the mask
        does not pad, positions outside `[0, block_size)`."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        x_in = input_ids if input_ids is not None else inputs_embeds
        if x_in.dim() != (2 if input_ids is not None else 3):
            kind = (
                "input_ids must be a (batch, sequence) tensor of ids"
                if input_ids is not None
                else "inputs_embeds must be a (batch, sequence, n_embd) tensor"
            )
            raise ValueError(f"{kind}, got shape {tuple(x_in.shape)}")
        B, T = x_in.shape[:2]
        if T == 0:
            raise ValueError("the input is empty: give at least one token (the lesson starts from a newline, id 0)")
        if attention_mask is not None and attention_mask.dim() not in (2, 4):
            raise ValueError(
                "attention_mask must be a 2D (batch, past + sequence) padding mask or a 4D (batch, 1, sequence, keys) "
                f"mask, got shape {tuple(attention_mask.shape)}"
            )
        if torch.compiler.is_compiling():
            return  # the checks below read tensors back
        padded = None
        if attention_mask is not None and attention_mask.dim() == 2:
            past = int(cache.get_seq_length()) if cache is not None else 0
            if attention_mask.shape != (B, past + T):
                raise ValueError(
                    f"a 2D attention_mask must have shape (batch, past + sequence) = ({B}, {past + T}), "
                    f"got {tuple(attention_mask.shape)}"
                )
            padded = attention_mask[:, -T:] == 0
        if input_ids is not None:
            self._check_ids(input_ids, padded)
        if position_ids is not None:
            self._check_positions(position_ids)

    def _token_embeddings(self, input_ids, padding_mask) -> torch.Tensor:
        """The ids' embeddings. Padding may hold the tokenizer's pad id, which has no embedding row: id 0 is embedded
        there instead (an id of the vocabulary stays, so `inputs_embeds` of the same ids give the same numbers)."""
        if padding_mask is not None:
            outside = (input_ids < 0) | (input_ids >= self.config.vocab_size)
            input_ids = input_ids.masked_fill((padding_mask[:, -input_ids.shape[1] :] == 0) & outside, 0)
        return self.token_embedding_table(input_ids)

    def _causal_mask(self, inputs_embeds, attention_mask, position_ids, past: Cache | None):
        """What the attention kernel is given: None for plain causal attention over all the positions (every
        kernel's `is_causal` case), else transformers' mask of the padding, a 4D mask, the packed sequences that
        `position_ids` (as given) show, and the `past` cache's earlier tokens."""
        if attention_mask is None and position_ids is None and past is None:
            return None
        return create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            cache=past,
            position_ids=position_ids,
        )

    def _positions(self, padding_mask, cache, B: int, T: int) -> torch.LongTensor:
        """Each token's position: counted over the real tokens of a 2D mask (left padding), else after the cache."""
        if padding_mask is not None:
            position_ids = mask_positions(padding_mask, T)
        else:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(T, device=self.token_embedding_table.weight.device) + past).expand(B, T)
        if not torch.compiler.is_compiling():
            self._check_positions(position_ids)
        return position_ids

    def _check_positions(self, position_ids) -> None:
        block_size = self.config.block_size
        if bool(((position_ids >= block_size) | (position_ids < 0)).any()):
            raise ValueError(
                f"positions must lie in [0, block_size) = [0, {block_size}), got max {int(position_ids.max())}: "
                f"the model has {block_size} learned positions. generate() slides the window past block_size; "
                f"a direct forward must be given at most {block_size} tokens."
            )

    def _check_ids(self, input_ids, padded) -> None:
        """Ids outside the vocabulary are refused, except where `padded` (a boolean mask, or None) says padding."""
        V = self.config.vocab_size
        outside = (input_ids < 0) | (input_ids >= V)
        if padded is not None:
            outside &= ~padded
        if bool(outside.any()):
            bad = input_ids[outside].unique().tolist()
            raise ValueError(f"input_ids holds ids {bad[:10]} outside the vocabulary [0, {V - 1}]")


def generation_defaults(config: CharGPTConfig) -> dict:
    """The model's generation defaults, every surface's for a request that names none (`generation_config.json`;
    the demo starts from them): sampled text at temperature 0.8, no top-k/top-p cut, 300 new characters."""
    return {
        "do_sample": True,
        "temperature": 0.8,
        "top_k": 0,
        "top_p": 1.0,
        "max_new_tokens": 300,
        "pad_token_id": config.vocab_size,
    }


def window_inputs(input_ids, attention_mask, window: int, new: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention mask of the last `window` tokens (all ones without `attention_mask`) and the positions of its
    last `new` tokens, counted over its real tokens from 0."""
    if attention_mask is None:
        window_mask = torch.ones(input_ids.shape[0], window, dtype=torch.long, device=input_ids.device)
    else:
        window_mask = attention_mask[:, -window:]
    return window_mask, mask_positions(window_mask, new)


def mask_positions(mask: torch.Tensor, last: int) -> torch.LongTensor:
    """The positions of the `last` tokens of a 2D padding mask (1 = a real token), counted over its real tokens from
    0 (left padding sits at 0)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -last:]


class CharGPTForCausalLM(CharGPTPreTrainedModel, GenerationMixin):
    """The lesson's GPT with its language-modeling head: `CharGPTModel` (`self.model`), then `lm_head`."""

    # with `tie_word_embeddings` (nanoGPT's), `lm_head` reads out through the token embedding: one tensor
    _tied_weights_keys = {"lm_head.weight": "model.token_embedding_table.weight"}

    def __init__(self, config: CharGPTConfig):
        super().__init__(config)
        self.model = CharGPTModel(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=config.lm_head_bias)
        self.post_init()
        # What `generate()` and `pipeline("text-generation")` do when told nothing (saved as generation_config.json):
        # sample from the whole distribution (a little cooler than the lesson's), and pad with the tokenizer's <pad>.
        self.generation_config.update(**generation_defaults(config))

    def get_output_embeddings(self):
        return self.lm_head

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' `save_pretrained`; a folder with the model's code (`trust_remote_code`) also names the body
        for `AutoModel` in its `auto_map`."""
        if self._auto_class is not None:
            auto_map = dict(getattr(self.config, "auto_map", None) or {})
            self.config.auto_map = {**auto_map, "AutoModel": f"{__name__.rsplit('.', 1)[-1]}.CharGPTModel"}
        return super().save_pretrained(save_directory, *args, **kwargs)

    def set_output_embeddings(self, value):
        self.lm_head = value

    @can_return_tuple
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
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> CausalLMOutputWithPast:
        r"""
        The arguments of `CharGPTModel.forward`, and:

        Args:
            labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Targets, shifted inside (position t predicts `labels[:, t+1]`); -100 is ignored. The loss is
                transformers' causal-LM loss (`self.loss_function`), so `num_items_in_batch` and `shift_labels`
                work as in every transformers model.
            logits_to_keep (`int` or `torch.Tensor`, *optional*, defaults to 0):
                Compute logits for the last `logits_to_keep` positions only (0 = all; `generate()` passes 1), or,
                given a 1D tensor, for those positions (continuous batching's).
        """
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        x = out.last_hidden_state
        logits = self.lm_head(slice_logits_to_keep(x, logits_to_keep))  # (B, T', vocab_size)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, cache=out.cache, hidden_states=out.hidden_states, attentions=out.attentions
        )

    def prepare_inputs_for_generation(
        self,
        input_ids,
        next_sequence_length=None,
        cache=None,
        attention_mask=None,
        inputs_embeds=None,
        is_first_iteration=False,
        window_mode=DEFAULT_WINDOW_MODE,
        refill_tokens=None,
        **kwargs,
    ):
        """transformers' own input preparation, on the window: slides it once the text outgrows `block_size`.

        Inside the window this is the usual incremental decode. Past it, `window_mode` (a `generate()` argument)
        decides, by the package's one window rule (`gpt_serve.chargpt.window`): `"refill"` (the default) restarts the
        cache (`cache.reset()`, whatever its class) from the last `refill_tokens` tokens (`generate()` argument,
        default `block_size // 2`) when it is full; `"exact"` re-runs the last `block_size` tokens at positions
        `0..block_size-1` every step (the lesson's `idx[:, -block_size:]`). Positions restart at 0 in the window.
        """
        block_size = self.config.block_size
        # without a cache every step re-reads the whole window
        keep = window_keep(block_size, window_mode, refill_tokens) if cache is not None else block_size
        kwargs.pop("position_ids", None)  # recomputed from the window below
        past = int(cache.get_seq_length()) if cache is not None else 0
        ids = input_ids.shape[1]
        if cache is not None and next_sequence_length is not None:
            new = next_sequence_length
        elif inputs_embeds is not None and is_first_iteration:
            new = inputs_embeds.shape[1]
        else:
            new = ids - past if cache is not None else ids
        # Generating from `inputs_embeds`, `input_ids` holds only the new tokens: the prompt is the embeddings.
        total = ids + inputs_embeds.shape[1] if inputs_embeds is not None and ids != past + new else ids
        start = total - past - new  # where the window starts: the cache holds [start, total - new)
        if window_start(total, start, block_size, keep) != start:
            # The window overflows: restart the cache from the last `keep` tokens.
            past, new = 0, min(keep, total)
            if new > ids:
                raise ValueError(
                    f"generation from inputs_embeds cannot slide its window past block_size ({block_size}) while "
                    f"the window holds prompt embeddings (it restarts from the last {new} tokens, {ids} generated): "
                    "give input_ids, or a shorter prompt"
                )
            inputs_embeds = None  # the window is generated tokens only
            if cache is not None:
                cache.reset()
        window_mask, position_ids = window_inputs(input_ids, attention_mask, past + new, new)
        return super().prepare_inputs_for_generation(
            input_ids,
            next_sequence_length=new,
            cache=cache,
            attention_mask=window_mask,
            inputs_embeds=inputs_embeds,
            is_first_iteration=is_first_iteration,
            position_ids=position_ids.contiguous(),
            **kwargs,
        )


# save_pretrained copies this file (and what it imports relatively) into the folder and writes `auto_map`.
CharGPTModel.register_for_auto_class("AutoModel")
CharGPTForCausalLM.register_for_auto_class("AutoModelForCausalLM")

if __package__ == "gpt_serve.chargpt":  # as the package's module (not a folder's copy): "chargpt" for the Auto classes
    from . import register_auto_classes  # the package's own; transformers reads `from . import` as no requirement

    register_auto_classes()

__all__ = [
    "CharGPTForCausalLM",
    "CharGPTModel",
    "CharGPTPreTrainedModel",
    "WINDOW_MODES",
    "additive_mask",
    "causal_bias",
    "eager_attention",
    "upgrade_state_dict",
]
