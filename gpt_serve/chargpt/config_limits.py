"""The limits of a chargpt config, checked before anything is built from it.

A `config.json` is data someone else may have written. Every number in it sizes something this process allocates
(an embedding of `vocab_size` x `n_embd`, `n_layer` blocks, a KV cache of `block_size` columns), so each is bounded
here, and so are the totals they multiply into: a config past a limit is a ValueError naming the field, its value and
the limit, raised before a tensor or an ONNX Runtime session exists. Without the bounds `"block_size": 10**400`
overflowed inside `nn.Embedding` (a server's 500), and `"n_layer": 1000000` built modules for minutes.

The limits are far above any character-level GPT (the lesson's model: 10.8M parameters, 6 layers, 384 wide, block
256; GPT-2 large's sizes, 36 layers 1280 wide, fit with a character vocabulary) and low enough that a config within
them is a model one machine can hold (docs/model.md, "Limits of a config").

Pure Python with no imports: `configuration_chargpt` (the remote-code bundle, which `save_pretrained` copies into a
folder with this file) and the torch-free loader (`gpt_serve.generation.backends.loading`) both check a config with it.
"""

from __future__ import annotations

import math

# Every Unicode code point: a vocabulary of single characters cannot hold more.
MAX_VOCAB_SIZE = 0x110000
MAX_BLOCK_SIZE = 2**16  # positions: 65,536 (the lesson's is 256; GPT-2's 1,024)
MAX_N_EMBD = 2**14  # residual width: 16,384 (GPT-2 XL's is 1,600)
MAX_N_HEAD = 256  # heads per block (n_embd must also divide by it)
MAX_N_LAYER = 256  # blocks (GPT-2 XL has 48)
MAX_FFWD_MULT = 16  # feed-forward width in units of n_embd (the lesson's is 4)
# 4 GB of float32 weights: about 100x the lesson's model. Checked on an estimate from the sizes, so a config of
# small numbers that multiply into a huge model is refused as well.
MAX_PARAMETERS = 10**9
# One sequence's KV cache at full window, in elements (4 GiB of float32): what every row of a batch allocates.
MAX_CACHE_ELEMENTS = 2**30
MAX_LAYER_NORM_EPS = 1.0
MAX_INITIALIZER_RANGE = 1.0
# The weights' dtype a config may name (`dtype`, or its older name `torch_dtype`); anything else is refused before
# transformers turns the string into an attribute of torch.
DTYPES = ("float32", "float16", "bfloat16")

SIZE_LIMITS = {
    "vocab_size": MAX_VOCAB_SIZE,
    "block_size": MAX_BLOCK_SIZE,
    "n_embd": MAX_N_EMBD,
    "n_head": MAX_N_HEAD,
    "n_layer": MAX_N_LAYER,
}
TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _shown(value: object) -> str:
    """`value` as a message shows it: a 400-digit integer as its digit count, not 400 digits."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**12:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def dtype_name(value: object) -> str | None:
    """The name of a config's `dtype` ("float32", ...), from a string or a `torch.dtype`; None for None."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return text.removeprefix("torch.")


def check_dtype(value: object, name: str = "dtype") -> None:
    """A ValueError unless `value` is None or one of `DTYPES` (a string or a `torch.dtype`)."""
    if value is None:
        return
    if not (isinstance(value, str) or type(value).__name__ == "dtype") or dtype_name(value) not in DTYPES:
        raise ValueError(f"{name} must be one of {list(DTYPES)} (or absent), got {_shown(value)}")


def estimate_parameters(config: dict) -> int:
    """About how many parameters a model of `config` has (biases and LayerNorms left out: a few per mille)."""
    n, layers, mult = config["n_embd"], config["n_layer"], config.get("ffwd_mult", 4)
    per_block = 4 * n * n + 2 * mult * n * n  # qkv + output projection, the feed-forward's two Linears
    return config["vocab_size"] * n * 2 + config["block_size"] * n + layers * per_block


def check_limits(config: dict) -> None:
    """A ValueError naming the first field of `config` (a config's attributes, or a `config.json` as read) that is
    not a number within its limit, or whose sizes multiply past the model or cache limits. Fields that are absent
    take CharGPTConfig's defaults."""
    values = {"vocab_size": 65, "block_size": 256, "n_embd": 384, "n_head": 6, "n_layer": 6, "ffwd_mult": 4}
    values.update({k: config[k] for k in values if k in config})
    for name, limit in SIZE_LIMITS.items():
        value = values[name]
        if not _is_int(value) or not 1 <= value <= limit:
            raise ValueError(f"{name} must be a positive integer of at most {limit:,}, got {_shown(value)}")
    if values["n_embd"] % values["n_head"] != 0:
        raise ValueError(
            f"n_embd ({values['n_embd']}) must be divisible by n_head ({values['n_head']}) so each head gets "
            f"n_embd // n_head channels"
        )
    mult = values["ffwd_mult"]
    if not _is_int(mult) or not 0 <= mult <= MAX_FFWD_MULT:
        raise ValueError(
            f"ffwd_mult must be an integer >= 0 and <= {MAX_FFWD_MULT} (0 = no feed-forward), got {_shown(mult)}"
        )
    dropout = config.get("dropout", 0.0)
    if not _number(dropout) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {_shown(dropout)}")
    eps = config.get("layer_norm_eps", 1e-5)
    if not _number(eps) or not 0.0 < eps <= MAX_LAYER_NORM_EPS:
        raise ValueError(
            f"layer_norm_eps must be a number > 0 and <= {MAX_LAYER_NORM_EPS} (the lesson's is 1e-05), got "
            f"{_shown(eps)}"
        )
    init_range = config.get("initializer_range", 0.02)
    if not _number(init_range) or not 0.0 <= init_range <= MAX_INITIALIZER_RANGE:
        limit = MAX_INITIALIZER_RANGE
        raise ValueError(f"initializer_range must be a number in [0, {limit}], got {_shown(init_range)}")
    for name in TOKEN_ID_FIELDS:
        value = config.get(name)
        if value is not None and (not _is_int(value) or not 0 <= value <= values["vocab_size"]):
            raise ValueError(
                f"{name} must be absent or an id in [0, vocab_size] = [0, {values['vocab_size']}], got {_shown(value)}"
            )
    for name in ("dtype", "torch_dtype"):
        check_dtype(config.get(name), name)
    parameters = estimate_parameters(values)
    if parameters > MAX_PARAMETERS:
        raise ValueError(
            f"the config describes a model of about {parameters:,} parameters (vocab_size {values['vocab_size']}, "
            f"block_size {values['block_size']}, n_embd {values['n_embd']}, n_layer {values['n_layer']}, ffwd_mult "
            f"{mult}), more than the {MAX_PARAMETERS:,} a chargpt model may have"
        )
    cache = 2 * values["n_layer"] * values["block_size"] * values["n_embd"]
    if cache > MAX_CACHE_ELEMENTS:
        raise ValueError(
            f"one sequence's KV cache would hold {cache:,} numbers (2 x n_layer {values['n_layer']} x block_size "
            f"{values['block_size']} x n_embd {values['n_embd']}), more than the {MAX_CACHE_ELEMENTS:,} allowed"
        )


__all__ = ["DTYPES", "MAX_PARAMETERS", "SIZE_LIMITS", "check_dtype", "check_limits", "estimate_parameters"]
