"""CharGPTConfig: standard names, validation, serialization."""

import pytest

from gpt_serve import CharGPTConfig


def test_attribute_map_gives_standard_names():
    cfg = CharGPTConfig(block_size=64, n_embd=48, n_head=3, n_layer=2)
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers) == (48, 3, 2)
    assert cfg.head_size == 16
    # block_size is the window, not a length limit: no max_position_embeddings for transformers to warn about; vLLM
    # (which does not slide) reads GPT-2's n_positions as its longest sequence, and config.json keeps block_size only
    assert not hasattr(cfg, "max_position_embeddings")
    assert cfg.n_positions == 64 and "n_positions" not in cfg.to_dict()
    assert CharGPTConfig(n_positions=32).block_size == 32


def test_vocab_sha256_is_checked():
    assert CharGPTConfig(vocab_sha256="ab" * 32).vocab_sha256 == "ab" * 32
    with pytest.raises(ValueError, match="vocab_sha256 must be None or 64 lowercase hex digits"):
        CharGPTConfig(vocab_sha256="not-a-hash")


def test_defaults_are_the_lesson_final_model():
    cfg = CharGPTConfig()
    assert (cfg.block_size, cfg.n_embd, cfg.n_head, cfg.n_layer, cfg.dropout) == (256, 384, 6, 6, 0.2)


def test_round_trip(tmp_path):
    cfg = CharGPTConfig(block_size=32, n_embd=64, n_head=4, n_layer=3, init="pytorch")
    cfg.save_pretrained(tmp_path)
    again = CharGPTConfig.from_pretrained(tmp_path)
    assert again.to_dict() == cfg.to_dict()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n_embd=30, n_head=4), "n_embd \\(30\\) must be divisible by n_head \\(4\\)"),
        (dict(n_head=0), "n_head must be a positive integer"),
        (dict(block_size=-1), "block_size must be a positive integer"),
        (dict(dropout=1.5), "dropout must be in \\[0, 1\\)"),
        (dict(ffwd_mult=-1), "ffwd_mult must be an integer >= 0"),
        (dict(ffwd_mult=4, ffwd_proj=False), "ffwd_proj=False needs ffwd_mult=1"),
        (dict(init="xavier"), "init must be one of"),
        (dict(vocab_size=2.5), "vocab_size must be a positive integer"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CharGPTConfig(**kwargs)


def test_the_switches_default_to_the_lesson_and_old_folders_read_as_before(tmp_path):
    cfg = CharGPTConfig()
    assert (cfg.activation, cfg.qkv_bias, cfg.layer_norm_bias, cfg.attn_scale) == ("relu", False, True, "head_size")
    assert cfg.tie_word_embeddings is False and cfg.lm_head_bias is True and cfg.hidden_act == "relu"
    assert CharGPTConfig(bias=False).lm_head_bias is False  # follows bias unless told
    assert CharGPTConfig(bias=False, lm_head_bias=True).lm_head_bias is True
    assert CharGPTConfig(hidden_act="gelu").activation == "gelu"
    # a config.json written before the switches existed
    old = CharGPTConfig(bias=False).to_dict()
    for key in ("activation", "qkv_bias", "lm_head_bias", "layer_norm_bias", "attn_scale"):
        del old[key]
    again = CharGPTConfig.from_dict(old)
    assert (again.activation, again.lm_head_bias, again.layer_norm_bias, again.attn_scale) == (
        "relu", False, True, "head_size",
    )  # fmt: skip
    cfg = CharGPTConfig(activation="gelu", tie_word_embeddings=True, attn_scale="n_embd", qkv_bias=True)
    cfg.save_pretrained(tmp_path)
    assert CharGPTConfig.from_pretrained(tmp_path).to_dict() == cfg.to_dict()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(activation="tanh"), "activation must be one of \\('relu', 'gelu'\\)"),
        (dict(attn_scale="sqrt"), "attn_scale must be one of \\('head_size', 'n_embd'\\)"),
        (dict(qkv_bias="yes"), "qkv_bias must be true or false"),
        (dict(layer_norm_bias=None), "layer_norm_bias must be true or false"),
    ],
)
def test_bad_switches_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CharGPTConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        # issue 32: each of these was a 500, a traceback or a hang before the config refused it
        (dict(block_size=10**400), "block_size must be a positive integer of at most 65,536, got an integer of 401"),
        (dict(n_layer=1000000), "n_layer must be a positive integer of at most 256, got 1000000"),
        (dict(dtype="__import__('os')"), "dtype must be one of \\['float32', 'float16', 'bfloat16'\\]"),
        (dict(torch_dtype="float64"), "torch_dtype must be one of"),
        (dict(vocab_size=0x110001), "vocab_size must be a positive integer of at most 1,114,112"),
        (dict(n_embd=2**15, n_head=4), "n_embd must be a positive integer of at most 16,384"),
        (dict(n_head=512, n_embd=1024), "n_head must be a positive integer of at most 256"),
        (dict(ffwd_mult=17), "ffwd_mult must be an integer >= 0 and <= 16"),
        (dict(layer_norm_eps=float("nan")), "layer_norm_eps must be a number > 0"),
        (dict(initializer_range=1e308 * 10), "initializer_range must be a number in \\[0, 1.0\\]"),
        (dict(pad_token_id=66), "pad_token_id must be absent or an id in \\[0, vocab_size\\] = \\[0, 65\\]"),
        # each size within its limit, the total not: 16384 wide x 256 layers
        (dict(n_embd=2**14, n_head=16, n_layer=256), "about [\\d,]+ parameters .* more than the 1,000,000,000"),
        (
            dict(n_embd=512, n_head=8, n_layer=256, block_size=2**16, ffwd_mult=0),
            "KV cache would hold [\\d,]+ numbers .* more than the 1,073,741,824",
        ),
    ],
)
def test_every_number_is_bounded_before_anything_is_built(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CharGPTConfig(**kwargs)


def test_the_limits_admit_the_dtypes_and_big_real_models():
    import torch

    for dtype in ("float32", "float16", "bfloat16", torch.bfloat16, None):
        CharGPTConfig(dtype=dtype)
    # GPT-2 large's sizes (36 layers x 1280, block 1024) with a character vocabulary: about 0.7B parameters
    CharGPTConfig(vocab_size=65, block_size=1024, n_embd=1280, n_head=20, n_layer=36)
