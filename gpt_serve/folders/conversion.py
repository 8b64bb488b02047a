"""The lesson's and nanoGPT's tensors as `CharGPTForCausalLM`'s: hyperparameters read from the tensors (the
lesson's) or `model_args` (nanoGPT's), every tensor renamed, the lesson's per-head key/query/value Linears fused
into `qkv`, and the model built with them, each shape checked against the hyperparameters. Converts what
`gpt_serve.folders.checkpoints` read; reads and writes no file.

The lesson's heads go into the model's fused `qkv` (queries of every head in order, then keys, then values, as
nanoGPT's `c_attn` already is); nanoGPT's architecture is a config of the same model (GELU, tied embeddings, biases
per kind of layer). Anything wrong is a ValueError naming the tensor or argument.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..chargpt.configuration_chargpt import CharGPTConfig
from ..chargpt.modeling_chargpt import CharGPTForCausalLM, upgrade_state_dict
from ..chargpt.vocab import CharVocab
from .checkpoints import describe_unpickled, strip_compile_prefix
from .corpus import TINY_SHAKESPEARE_CHARS
from .corpus_record import CorpusRecord

NANOGPT_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "bias")


@dataclass(frozen=True)
class Imported:
    """A checkpoint converted: the model (eval mode), its vocabulary, and what the card says of where they came from.

    `corpus` is the text file the vocabulary was read from (or that nanoGPT's `prepare.py` left beside `meta.pkl`):
    the export measures its int8 validation loss on it. None: Tiny Shakespeare."""

    model: CharGPTForCausalLM
    vocab: CharVocab
    source_format: str
    source: Path
    source_sha256: str
    vocab_source: str
    corpus: Path | None = None
    training: dict[str, Any] = field(default_factory=dict)
    corpus_record: CorpusRecord | None = None  # the folder's corpus.json (`corpus_record`)


def _shape(state: dict, name: str, dims: int) -> tuple[int, ...]:
    shape = tuple(state[name].shape)
    if len(shape) != dims:
        raise ValueError(f"{name} has shape {shape}, but a {dims}-d tensor is expected")
    return shape


def _check_names(state: dict, expected: set[str], optional: set[str], what: str) -> None:
    missing = sorted(expected - state.keys(), key=_natural)
    if missing:
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        raise ValueError(f"missing tensors of {what}: {missing[:6]}{more}")
    unexpected = sorted(state.keys() - expected - optional, key=_natural)
    if unexpected:
        more = f" and {len(unexpected) - 6} more" if len(unexpected) > 6 else ""
        raise ValueError(f"tensors that {what} does not have: {unexpected[:6]}{more}")


def _natural(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _indices(state: dict, pattern: str) -> list[int]:
    return sorted({int(m[1]) for k in state if (m := re.fullmatch(pattern, k))})


def convert_lesson(state: dict, vocab: CharVocab, attn_scale: str = "head_size") -> tuple[CharGPTConfig, dict, dict]:
    """(config, state dict of `CharGPTForCausalLM`, target name -> source name) of a lesson `gpt.py` state dict."""
    state = strip_compile_prefix(state)
    what = "the lesson's gpt.py"
    for name in ("token_embedding_table.weight", "position_embedding_table.weight", "blocks.0.ffwd.net.0.weight"):
        if name not in state:
            raise ValueError(f"missing tensors of {what}: [{name!r}]")
    vocab_size, n_embd = _shape(state, "token_embedding_table.weight", 2)
    block_size = _shape(state, "position_embedding_table.weight", 2)[0]
    layers = _indices(state, r"blocks\.(\d+)\..*")
    heads = _indices(state, r"blocks\.0\.sa\.heads\.(\d+)\..*")
    if layers != list(range(len(layers))) or heads != list(range(len(heads))) or not heads:
        raise ValueError(f"{what} numbers its blocks and heads 0, 1, ...: found blocks {layers}, heads {heads}")
    n_layer, n_head = len(layers), len(heads)
    head_size = (
        _shape(state, "blocks.0.sa.heads.0.key.weight", 2)[0] if "blocks.0.sa.heads.0.key.weight" in state else 0
    )
    if head_size * n_head != n_embd:
        raise ValueError(
            f"the heads of blocks.0 ({n_head} x head_size {head_size}) must add up to n_embd {n_embd} (the token "
            f"embedding's width): the shapes contradict each other"
        )
    hidden = _shape(state, "blocks.0.ffwd.net.0.weight", 2)[0]
    if hidden % n_embd:
        raise ValueError(f"blocks.0.ffwd.net.0 has {hidden} outputs, not a multiple of n_embd {n_embd}")
    hint = (
        "pass --corpus with the text it was trained on"
        if vocab.chars != list(TINY_SHAKESPEARE_CHARS)
        else ("Tiny Shakespeare's is the default: pass --corpus with the text it was trained on")
    )
    _check_vocab_size(vocab, vocab_size, "the checkpoint's token embedding", hint)

    per_block = ["sa.proj.weight", "sa.proj.bias", "ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"]
    per_block += [f"ffwd.net.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")]
    qkv_names = [f"sa.heads.{h}.{kind}.weight" for kind in ("query", "key", "value") for h in range(n_head)]
    expected = {"token_embedding_table.weight", "position_embedding_table.weight", "ln_f.weight", "ln_f.bias"}
    expected |= {"lm_head.weight", "lm_head.bias"}
    expected |= {f"blocks.{i}.{name}" for i in range(n_layer) for name in per_block + qkv_names}
    trils = {f"blocks.{i}.sa.heads.{h}.tril" for i in range(n_layer) for h in range(n_head)}  # rebuilt, not needed
    _check_names(state, expected, trils, what)

    origin = {name: name for name in expected if ".sa.heads." not in name}
    for i in range(n_layer):
        # queries of every head, then keys, then values: (3 * n_embd, n_embd), the rows the model's qkv splits
        origin[f"blocks.{i}.sa.qkv.weight"] = [f"blocks.{i}.{name}" for name in qkv_names]
    mapped = {target: _gather(state, source) for target, source in origin.items()}
    config = CharGPTConfig(
        vocab_size=vocab_size, block_size=block_size, n_embd=n_embd, n_head=n_head, n_layer=n_layer,
        dropout=0.0,  # not in a state dict; inference does not use it
        ffwd_mult=hidden // n_embd, attn_scale=attn_scale, vocab_sha256=vocab.sha256,
    )  # fmt: skip
    for name in trils & state.keys():
        if tuple(state[name].shape) != (block_size, block_size):
            raise ValueError(
                f"{name} has shape {tuple(state[name].shape)}, but block_size is {block_size} (the position "
                f"embedding's rows): the shapes contradict each other"
            )
    return config, mapped, origin


def convert_nanogpt(checkpoint: dict, vocab: CharVocab) -> tuple[CharGPTConfig, dict, dict]:
    """(config, state dict of `CharGPTForCausalLM`, target name -> source name) of a nanoGPT `ckpt.pt`."""
    what = "a nanoGPT checkpoint"
    args, state = checkpoint["model_args"], checkpoint["model"]
    if not isinstance(args, dict) or not isinstance(state, dict):
        got = f"{describe_unpickled(args)}, {describe_unpickled(state)}"
        raise ValueError(f"{what} holds dicts under 'model_args' and 'model', got {got}")
    absent = [k for k in NANOGPT_ARGS if k not in args]
    if absent:
        raise ValueError(f"{what}'s model_args lacks {absent} (it has {sorted(args)})")
    bad = [f"{k}={args[k]!r}" for k in NANOGPT_ARGS[:5] if type(args[k]) is not int or args[k] < 1]
    bad += [] if isinstance(args["bias"], bool) else [f"bias={args['bias']!r}"]
    if bad:
        raise ValueError(f"{what}'s model_args do not describe a model: {', '.join(bad)}")
    n_layer, n_head, n_embd, block_size, vocab_size = (args[k] for k in NANOGPT_ARGS[:5])
    bias = args["bias"]
    _check_vocab_size(vocab, vocab_size, "the checkpoint's model_args", "meta.pkl is another dataset's")
    state = strip_compile_prefix(state)

    rename = {"ln_1": "ln1", "attn.c_attn": "sa.qkv", "attn.c_proj": "sa.proj", "ln_2": "ln2"}
    rename |= {"mlp.c_fc": "ffwd.net.0", "mlp.c_proj": "ffwd.net.2"}
    params = ("weight", "bias") if bias else ("weight",)  # bias=False drops every Linear and LayerNorm bias
    origin = {"token_embedding_table.weight": "transformer.wte.weight"}
    origin["position_embedding_table.weight"] = "transformer.wpe.weight"
    origin |= {f"ln_f.{p}": f"transformer.ln_f.{p}" for p in params}
    for i in range(n_layer):
        origin |= {
            f"blocks.{i}.{ours}.{p}": f"transformer.h.{i}.{theirs}.{p}"
            for theirs, ours in rename.items()
            for p in params
        }
    masks = {f"transformer.h.{i}.attn.bias" for i in range(n_layer)}  # the causal mask, without flash attention
    _check_names(state, set(origin.values()), masks | {"lm_head.weight"}, what)
    wte, head = state["transformer.wte.weight"], state.get("lm_head.weight")
    # nanoGPT ties lm_head to the token embedding; a checkpoint whose lm_head was trained apart keeps its own
    tied = head is None or (head.shape == wte.shape and torch.equal(head, wte))
    if not tied:
        origin["lm_head.weight"] = "lm_head.weight"
    hidden = _shape(state, "transformer.h.0.mlp.c_fc.weight", 2)[0]
    if hidden % n_embd:
        raise ValueError(f"transformer.h.0.mlp.c_fc has {hidden} outputs, not a multiple of n_embd {n_embd}")
    try:
        config = CharGPTConfig(
            vocab_size=vocab_size, block_size=block_size, n_embd=n_embd, n_head=n_head, n_layer=n_layer,
            dropout=float(args.get("dropout", 0.0)), ffwd_mult=hidden // n_embd, activation="gelu", bias=bias,
            qkv_bias=bias, lm_head_bias=False, layer_norm_bias=bias, tie_word_embeddings=tied,
            vocab_sha256=vocab.sha256,
        )  # fmt: skip
    except (ValueError, TypeError) as e:
        raise ValueError(f"{what}'s model_args do not describe a model: {e}") from None
    for name in masks & state.keys():
        if tuple(state[name].shape) != (1, 1, block_size, block_size):
            shape = tuple(state[name].shape)
            raise ValueError(f"{name} has shape {shape}, but model_args says block_size {block_size}")
    return config, {target: state[source] for target, source in origin.items()}, origin


def _gather(state: dict, source: str | list[str]) -> torch.Tensor:
    return state[source] if isinstance(source, str) else torch.cat([state[name] for name in source])


def _check_vocab_size(vocab: CharVocab, rows: int, what: str, hint: str) -> None:
    if rows != len(vocab):
        raise ValueError(
            f"the vocabulary has {len(vocab)} characters but {what} has vocab_size {rows}: the model was trained "
            f"on another vocabulary ({hint})"
        )


def build_model(config: CharGPTConfig, mapped: dict, origin: dict) -> CharGPTForCausalLM:
    """The model of `config` with the converted tensors; a ValueError naming any tensor whose shape contradicts the
    hyperparameters read from the others, or that is not finite."""
    model = CharGPTForCausalLM(config).eval()
    own = model.state_dict()
    mapped, origin = upgrade_state_dict(mapped), upgrade_state_dict(origin)  # named as the lesson's: `model.` body
    for target, tensor in mapped.items():
        if tuple(tensor.shape) != tuple(own[target].shape):
            source = origin[target] if isinstance(origin[target], str) else f"the heads of {origin[target][0]}..."
            raise ValueError(
                f"{source} has shape {tuple(tensor.shape)}, but {tuple(own[target].shape)} is expected of a model "
                f"with {_hyperparameters(config)}: the shapes contradict each other"
            )
        if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            source = origin[target] if isinstance(origin[target], str) else origin[target][0]
            raise ValueError(f"{source} holds values that are not finite floating-point numbers (NaN, inf, integers)")
    result = model.load_state_dict({k: v.float() for k, v in mapped.items()}, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    assert set(result.missing_keys) == tied and not result.unexpected_keys, result
    return model


def _hyperparameters(config: CharGPTConfig) -> str:
    keys = ("vocab_size", "block_size", "n_embd", "n_head", "n_layer", "ffwd_mult")
    return ", ".join(f"{k} {getattr(config, k)}" for k in keys)


__all__ = ["Imported", "build_model", "convert_lesson", "convert_nanogpt"]
