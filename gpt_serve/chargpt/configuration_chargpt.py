"""CharGPTConfig: the architecture of the lesson's character-level GPT, every stage of its ladder included."""

from __future__ import annotations

from transformers import PretrainedConfig

from .config_limits import DTYPES, check_dtype, check_limits

INIT_SCHEMES = ("normal", "pytorch")
ACTIVATIONS = ("relu", "gelu")
# What the attention scores are divided by the square root of: the lesson's final gpt.py and nanoGPT use the head
# size; gpt.py as first typed in the video used `C**-0.5`, with C the embedding width.
ATTN_SCALES = ("head_size", "n_embd")


class CharGPTConfig(PretrainedConfig):
    r"""
    Configuration of a [`CharGPTForCausalLM`]: the GPT of the "Let's build GPT" lesson.

    The defaults are the lesson's final (stage F) architecture. The switches `attn_proj`, `ffwd_mult`,
    `ffwd_proj`, `residual` and `layer_norm` switch off the pieces the lesson adds one at a time, so every stage
    of its loss ladder (A-F) is a config of this one model (see `training.presets`). `activation`, the biases
    (`qkv_bias`, `bias`, `lm_head_bias`, `layer_norm_bias`), `tie_word_embeddings` and `attn_scale` express the
    other character-level GPTs people train, nanoGPT's `shakespeare_char` among them (`gpt_serve.folders.importing`).

    Args:
        vocab_size (`int`, *optional*, defaults to 65):
            Number of characters in the vocabulary (rows of the token embedding and outputs of `lm_head`).
        block_size (`int`, *optional*, defaults to 256):
            Context length: the number of learned positions. Generation past it slides the window (a generation
            argument, `window_mode`: see `CharGPTForCausalLM.prepare_inputs_for_generation`).
        n_embd (`int`, *optional*, defaults to 384):
            Width of the residual stream (embedding size).
        n_head (`int`, *optional*, defaults to 6):
            Attention heads per block; each has `head_size = n_embd // n_head` channels.
        n_layer (`int`, *optional*, defaults to 6):
            Number of Transformer blocks.
        dropout (`float`, *optional*, defaults to 0.2):
            Dropout on attention weights, on the attention output projection, and after the feed-forward.
        attn_proj (`bool`, *optional*, defaults to `True`):
            Whether the concatenated heads go through an output projection `Linear(n_embd, n_embd)`.
        ffwd_mult (`int`, *optional*, defaults to 4):
            Hidden width of the feed-forward, as a multiple of `n_embd`; 0 removes the feed-forward.
        ffwd_proj (`bool`, *optional*, defaults to `True`):
            Whether the feed-forward ends with a projection `Linear(ffwd_mult * n_embd, n_embd)` after the ReLU
            (the lesson's stage C has only `Linear -> ReLU`). Requires `ffwd_mult == 1` when `False`.
        activation (`str`, *optional*, defaults to `"relu"`):
            The feed-forward's non-linearity: `"relu"` (the lesson's) or `"gelu"` (exact, erf-based: nanoGPT's
            `nn.GELU()`). Also readable as `hidden_act`.
        residual (`bool`, *optional*, defaults to `True`):
            Whether attention and feed-forward are added to the residual stream (`x = x + f(x)`) or replace it.
        layer_norm (`bool`, *optional*, defaults to `True`):
            Pre-norm LayerNorm before attention and feed-forward, and a final LayerNorm before `lm_head`.
        bias (`bool`, *optional*, defaults to `True`):
            Bias in the attention's output projection and the feed-forward Linears (and in `lm_head` unless
            `lm_head_bias` says otherwise).
        qkv_bias (`bool`, *optional*, defaults to `False`):
            Bias in the key/query/value Linear (the lesson's heads have none; nanoGPT's `c_attn` has one unless
            `bias=False`).
        lm_head_bias (`bool`, *optional*):
            Bias in `lm_head`; `None` (the default) follows `bias`. nanoGPT's `lm_head` never has one.
        layer_norm_bias (`bool`, *optional*, defaults to `True`):
            Bias (the additive part) in every LayerNorm; nanoGPT's `bias=False` drops it.
        tie_word_embeddings (`bool`, *optional*, defaults to `False`):
            Whether `lm_head` reads out through the token embedding matrix itself (one tensor, saved once), as
            nanoGPT does; the lesson's `lm_head` is its own.
        attn_scale (`str`, *optional*, defaults to `"head_size"`):
            Attention scores are `q k^T / sqrt(d)` with d the `"head_size"` (the lesson's final gpt.py, nanoGPT) or
            `"n_embd"` (gpt.py as first typed in the video, `C**-0.5`: a checkpoint trained so needs it).
        init (`str`, *optional*, defaults to `"normal"`):
            `"normal"`: the lesson's final init, normal(0, `initializer_range`) weights and zero biases.
            `"pytorch"`: PyTorch's default module init, which the lesson used for stages A-E; the ladder's
            published losses need it.
        initializer_range (`float`, *optional*, defaults to 0.02):
            Standard deviation of the `"normal"` init.
        layer_norm_eps (`float`, *optional*, defaults to 1e-5):
            Epsilon of every LayerNorm.
        use_cache (`bool`, *optional*, defaults to `True`):
            Whether `forward` returns a KV cache (in eval mode) for incremental decoding.
        bos_token_id, eos_token_id, pad_token_id (`int`, *optional*):
            Special token ids, None here: the character vocabulary has no begin or end of text (generation stops on
            length or a stop string), and the tokenizer's `<pad>` (id `vocab_size`) has no embedding row: padded
            positions are masked (`generation_config.json` names it as the pad id for `generate()`).
        vocab_sha256 (`str`, *optional*):
            The hash (`CharVocab.sha256`) of the vocabulary the model was trained with. Training records it;
            `gpt_serve.generation.load_backend` refuses a folder whose `vocab.json` hashes differently (two
            characters swapped would otherwise run silently and print the wrong letters).
    """

    model_type = "chargpt"
    # No `max_position_embeddings` alias for `block_size`: it is the window, not a length limit (generation slides
    # past it), and transformers would cap and warn at every generation longer than it. `n_positions` (GPT-2's name
    # for its learned positions) is read by no generation code of transformers; vLLM takes it as the longest
    # sequence (`max_model_len`), since it does not slide.
    attribute_map = {
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
        "hidden_act": "activation",
        "n_positions": "block_size",
    }

    def __init__(
        self,
        vocab_size: int = 65,
        block_size: int = 256,
        n_embd: int = 384,
        n_head: int = 6,
        n_layer: int = 6,
        dropout: float = 0.2,
        attn_proj: bool = True,
        ffwd_mult: int = 4,
        ffwd_proj: bool = True,
        residual: bool = True,
        layer_norm: bool = True,
        bias: bool = True,
        activation: str = "relu",
        qkv_bias: bool = False,
        lm_head_bias: bool | None = None,
        layer_norm_bias: bool = True,
        attn_scale: str = "head_size",
        init: str = "normal",
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-5,
        use_cache: bool = True,
        vocab_sha256: str | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.n_embd = n_embd
        self.n_head = n_head
        self.n_layer = n_layer
        self.dropout = dropout
        self.attn_proj = attn_proj
        self.ffwd_mult = ffwd_mult
        self.ffwd_proj = ffwd_proj
        self.residual = residual
        self.layer_norm = layer_norm
        self.bias = bias
        self.activation = activation
        self.qkv_bias = qkv_bias
        self.lm_head_bias = bias if lm_head_bias is None else lm_head_bias
        self.layer_norm_bias = layer_norm_bias
        self.attn_scale = attn_scale
        self.init = init
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.use_cache = use_cache
        self.vocab_sha256 = vocab_sha256
        self.bos_token_id, self.eos_token_id, self.pad_token_id = bos_token_id, eos_token_id, pad_token_id
        kwargs.setdefault("tie_word_embeddings", False)
        for name in ("dtype", "torch_dtype"):  # before transformers turns the string into an attribute of torch
            check_dtype(kwargs.get(name), name)
        super().__init__(**kwargs)
        self._validate()

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    def _validate(self) -> None:
        # the sizes, their totals, dropout, eps, token ids and dtype: bounded (`config_limits`, docs/model.md)
        names = ("vocab_size", "block_size", "n_embd", "n_head", "n_layer", "ffwd_mult", "dropout")
        names += ("layer_norm_eps", "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id", "dtype")
        check_limits({name: getattr(self, name, None) for name in names})
        if not self.ffwd_proj and self.ffwd_mult not in (0, 1):
            raise ValueError(
                "ffwd_proj=False needs ffwd_mult=1 (Linear(n, n) -> ReLU keeps the width), "
                f"got ffwd_mult={self.ffwd_mult}"
            )
        digest = self.vocab_sha256
        if digest is not None and not (
            isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
        ):
            raise ValueError(f"vocab_sha256 must be None or 64 lowercase hex digits, got {digest!r}")
        if self.init not in INIT_SCHEMES:
            raise ValueError(f"init must be one of {INIT_SCHEMES}, got {self.init!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.attn_scale not in ATTN_SCALES:
            raise ValueError(f"attn_scale must be one of {ATTN_SCALES}, got {self.attn_scale!r}")
        for name in ("bias", "qkv_bias", "lm_head_bias", "layer_norm_bias", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @property
    def attention_scaling(self) -> float:
        """The factor the attention scores `q k^T` are multiplied by: `1 / sqrt(head_size)` or `1 / sqrt(n_embd)`."""
        return (self.head_size if self.attn_scale == "head_size" else self.n_embd) ** -0.5


# save_pretrained copies this file into the folder and writes `auto_map` (for trust_remote_code=True).
CharGPTConfig.register_for_auto_class()

__all__ = ["ACTIVATIONS", "ATTN_SCALES", "DTYPES", "CharGPTConfig", "INIT_SCHEMES"]
