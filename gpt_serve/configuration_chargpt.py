"""CharGPTConfig: the architecture of the lesson's character-level GPT, every stage of its ladder included."""

from __future__ import annotations

from transformers import PretrainedConfig

INIT_SCHEMES = ("normal", "pytorch")


class CharGPTConfig(PretrainedConfig):
    r"""
    Configuration of a [`CharGPTForCausalLM`]: the GPT of the "Let's build GPT" lesson.

    The defaults are the lesson's final (stage F) architecture. The switches `attn_proj`, `ffwd_mult`,
    `ffwd_proj`, `residual` and `layer_norm` switch off the pieces the lesson adds one at a time, so every stage
    of its loss ladder (A-F) is a config of this one model (see `training.presets`).

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
        residual (`bool`, *optional*, defaults to `True`):
            Whether attention and feed-forward are added to the residual stream (`x = x + f(x)`) or replace it.
        layer_norm (`bool`, *optional*, defaults to `True`):
            Pre-norm LayerNorm before attention and feed-forward, and a final LayerNorm before `lm_head`.
        bias (`bool`, *optional*, defaults to `True`):
            Bias in the output projection, feed-forward and `lm_head` Linears (key/query/value never have one).
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
        vocab_sha256 (`str`, *optional*):
            The hash (`CharVocab.sha256`) of the vocabulary the model was trained with. Training records it;
            `gpt_serve.generation.load_backend` refuses a folder whose `vocab.json` hashes differently (two
            characters swapped would otherwise run silently and print the wrong letters).
    """

    model_type = "chargpt"
    # No `max_position_embeddings` alias for `block_size`: it is the window, not a length limit (generation slides
    # past it), and transformers would warn at every generation longer than it.
    attribute_map = {"hidden_size": "n_embd", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"}

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
        init: str = "normal",
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-5,
        use_cache: bool = True,
        vocab_sha256: str | None = None,
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
        self.init = init
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.use_cache = use_cache
        self.vocab_sha256 = vocab_sha256
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)
        self._validate()

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    def _validate(self) -> None:
        for name in ("vocab_size", "block_size", "n_embd", "n_head", "n_layer"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}) so each head gets "
                f"n_embd // n_head channels"
            )
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if isinstance(self.ffwd_mult, bool) or not isinstance(self.ffwd_mult, int) or self.ffwd_mult < 0:
            raise ValueError(f"ffwd_mult must be an integer >= 0 (0 = no feed-forward), got {self.ffwd_mult!r}")
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


# save_pretrained copies this file into the folder and writes `auto_map` (for trust_remote_code=True).
CharGPTConfig.register_for_auto_class()

__all__ = ["CharGPTConfig", "INIT_SCHEMES"]
