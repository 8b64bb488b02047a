"""Bring your own model: a checkpoint of the lesson's `gpt.py` or of nanoGPT becomes a gpt-serve model folder.

The two sources, told apart by what the file holds (`read_source`):

- **the lesson's `gpt.py`**: `torch.save(model.state_dict(), path)` of its `GPTLanguageModel`, tensors named
  `token_embedding_table`, `position_embedding_table`, `blocks.N.sa.heads.M.{key,query,value}` (and each head's
  `tril` buffer), `blocks.N.sa.proj`, `blocks.N.ffwd.net.{0,2}`, `blocks.N.ln1`, `.ln2`, `ln_f`, `lm_head`. Every
  hyperparameter comes from the tensors (the heads from how many there are); the vocabulary, which the file does
  not hold, is the lesson's `sorted(set(text))` of the corpus, Tiny Shakespeare's 65 characters by default.
- **nanoGPT**: its `ckpt.pt` (`model`, `model_args`, `config`, `iter_num`, ...; tensor names prefixed `_orig_mod.`
  after `torch.compile`) and the character vocabulary in the `meta.pkl` its `prepare.py` wrote (`stoi`, `itos`).
  A checkpoint on GPT-2's BPE vocabulary has no `meta.pkl` and is refused: gpt-serve's models are character-level.

The lesson's per-head key/query/value Linears go into the model's fused `qkv` (queries of every head in order,
then keys, then values, as nanoGPT's `c_attn` already is); nanoGPT's architecture is a config of the same model
(GELU, tied embeddings, biases per kind of layer). Safe by construction (`gpt_serve.folders.checkpoints`): checkpoints
are
read with `torch.load(weights_only=True)` and `meta.pkl` by an unpickler that imports nothing and admits only dicts,
strings and integers, so a file with a code payload is refused before anything in it runs.

`import_checkpoint` writes a folder like training's (`config.json` with `vocab_sha256`, `model.safetensors`,
`vocab.json`, `tokenizer.json`, `generation_config.json`, a model card naming the source), whole or not at all
(`gpt_serve.files.write_new_folder`); anything wrong with the input is a ValueError naming it, raised before
anything is written. The ONNX export is the export application's: `gpt-serve import` runs it on the new folder.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..chargpt.configuration_chargpt import ATTN_SCALES, CharGPTConfig
from ..chargpt.modeling_chargpt import CharGPTForCausalLM, upgrade_state_dict
from ..chargpt.tokenization_chargpt import CharTokenizer
from ..chargpt.vocab import CharVocab
from ..files import refuse_link, write_new_folder
from .checkpoints import LESSON, NANOGPT, describe, find_meta, read_meta, read_source, strip_compile_prefix
from .corpus import (
    TINY_SHAKESPEARE_CHARS,
    CorpusRecord,
    load_text,
    record_text,
    sample_prompts,
    write_corpus_record,
)
from .markdown import escape

logger = logging.getLogger(__name__)

SOURCE_NAMES = {LESSON: "the lesson's gpt.py", NANOGPT: "nanoGPT"}
NANOGPT_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "bias")
SAMPLE_TOKENS = 200  # characters of the model card's sample
# what the model card shows of the config: the architecture
ARCH_KEYS = (
    "vocab_size", "block_size", "n_embd", "n_head", "n_layer", "ffwd_mult", "activation", "bias", "qkv_bias",
    "lm_head_bias", "layer_norm_bias", "tie_word_embeddings", "attn_scale", "layer_norm_eps", "dropout",
)  # fmt: skip


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


def lesson_vocab(corpus: str | os.PathLike | None) -> tuple[CharVocab, str]:
    """The lesson's vocabulary, `sorted(set(text))` of `corpus`, or Tiny Shakespeare's 65 characters."""
    if corpus is None:
        return CharVocab(TINY_SHAKESPEARE_CHARS), "Tiny Shakespeare's 65 characters (the default)"
    return CharVocab.from_text(load_text(corpus)), f"sorted(set(text)) of {Path(corpus).name}"


# --- converting --------------------------------------------------------------------------------------------------


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
        raise ValueError(f"{what} holds dicts under 'model_args' and 'model', got {describe(args)}, {describe(state)}")
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


def convert(
    source: str | os.PathLike,
    corpus: str | os.PathLike | None = None,
    meta: str | os.PathLike | None = None,
    attn_scale: str | None = None,
) -> Imported:
    """Reads and converts a checkpoint (its format detected, see the module docstring); writes nothing.

    `corpus`: the text the model was trained on (the lesson's vocabulary; for nanoGPT only the export's validation
    text). `meta`: nanoGPT's meta.pkl, when it is not where nanoGPT puts it. `attn_scale`: `"n_embd"` for a gpt.py
    that scaled the scores by `C**-0.5` (see `CharGPTConfig`); the lesson's format only."""
    source = Path(source)
    kind, obj = read_source(source)
    if attn_scale is not None and attn_scale not in ATTN_SCALES:
        raise ValueError(f"attn_scale must be one of {ATTN_SCALES}, got {attn_scale!r}")
    training: dict[str, Any] = {}
    if kind == LESSON:
        vocab, vocab_source = lesson_vocab(corpus)
        config, mapped, origin = convert_lesson(obj, vocab, attn_scale or "head_size")
        corpus_path = Path(corpus) if corpus is not None else None
    else:
        if attn_scale not in (None, "head_size"):
            raise ValueError("attn_scale applies to the lesson's gpt.py only: nanoGPT scales by the head size")
        meta_path = find_meta(source, obj, meta)
        vocab, vocab_source = read_meta(meta_path), f"{meta_path.resolve()}"
        corpus_path = _nanogpt_corpus(corpus, meta_path, vocab)
        config, mapped, origin = convert_nanogpt(obj, vocab)
        training = {k: _plain_number(obj[k]) for k in ("iter_num", "best_val_loss") if k in obj}
        if isinstance(obj.get("config"), dict) and isinstance(obj["config"].get("dataset"), str):
            training["dataset"] = obj["config"]["dataset"]
    model = build_model(config, mapped, origin)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    record = corpus_record(corpus_path, vocab, training.get("dataset"), None if kind == LESSON else meta_path)
    return Imported(model, vocab, kind, source.resolve(), digest, vocab_source, corpus_path, training, record)


def corpus_record(
    corpus: Path | None, vocab: CharVocab, dataset: str | None = None, meta_path: Path | None = None
) -> CorpusRecord | None:
    """What the imported folder records of its training text (`corpus.json`): the text it was given (`--corpus`,
    or nanoGPT's `input.txt`); else Tiny Shakespeare when the vocabulary is its 65 characters; else, for nanoGPT,
    the dataset named by its name with prompts from the `train.bin` beside `meta.pkl` (`val.bin` when there is no
    `train.bin`; no text to validate on: the export then asks for it); else None. The checkpoint's dataset name is
    made fit for a record (`record_text`): whatever the checkpoint holds, the folder gets a record its reader
    takes."""
    if corpus is not None:
        return CorpusRecord.of(load_text(corpus), corpus)
    if "".join(vocab.chars) == TINY_SHAKESPEARE_CHARS:
        return CorpusRecord.tiny_shakespeare()
    if meta_path is None:
        return None
    name = record_text(dataset or "", 100) or record_text(meta_path.parent.name, 100) or "nanoGPT dataset"
    bins = [meta_path.parent / f"{split}.bin" for split in ("train", "val")]  # prompts the validation never measures
    found = next((path for path in bins if path.is_file()), None)
    prompts = sample_prompts(_decode_bin(found, vocab)) if found is not None else ()
    return CorpusRecord(name, f"the nanoGPT dataset {name!r} (its text was not given to the import)", prompts)


def _nanogpt_corpus(corpus, meta_path: Path, vocab: CharVocab) -> Path | None:
    """The export's validation text for a nanoGPT model: `corpus`, else the `input.txt` prepare.py keeps beside
    meta.pkl (when its characters are the vocabulary's), else None (Tiny Shakespeare)."""
    path = Path(corpus) if corpus is not None else meta_path.parent / "input.txt"
    if corpus is None and not path.is_file():
        return None
    outside = sorted(set(load_text(path)) - set(vocab.chars))
    if outside and corpus is not None:
        raise ValueError(f"--corpus {path} has characters outside meta.pkl's vocabulary: {outside[:10]}")
    return None if outside else path


def _decode_bin(path: Path, vocab: CharVocab, limit: int = 1_000_000) -> str:
    """The text of nanoGPT's `train.bin` or `val.bin` (uint16 ids), at most its first `limit` ids; ids outside the
    vocabulary are skipped."""
    import numpy as np

    ids = np.fromfile(path, dtype=np.uint16, count=limit)
    return "".join(vocab.chars[i] for i in ids.tolist() if i < len(vocab.chars))


def _plain_number(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value


# --- writing the folder ------------------------------------------------------------------------------------------


def import_checkpoint(
    source: str | os.PathLike,
    out: str | os.PathLike,
    corpus: str | os.PathLike | None = None,
    meta: str | os.PathLike | None = None,
    attn_scale: str | None = None,
    force: bool = False,
    command: str | None = None,
) -> Imported:
    """Converts `source` (see `convert`) and writes the model folder `out`, whole or not at all.

    `out` must not exist (an empty folder is fine) unless `force`; `command` is recorded in the model card. Bad input
    raises a ValueError (or FileNotFoundError) before anything is written; a full disk an OSError saying so.
    """
    out = refuse_link(out)  # nothing is written through a link (`gpt_serve.files`)
    if out.exists() and not out.is_dir():
        raise ValueError(f"the output {out} exists and is not a folder")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise ValueError(f"the output folder {out} exists; choose another, or pass --force to replace it")
        inside = [Path(p) for p in (source, corpus, meta) if p is not None and _is_inside(Path(p), out)]
        if inside:
            raise ValueError(f"--force would delete {inside[0]}, which is inside {out}; choose another output folder")
    imported = convert(source, corpus=corpus, meta=meta, attn_scale=attn_scale)

    def write(folder: Path) -> None:
        imported.model.save_pretrained(folder)
        CharTokenizer(chars=imported.vocab.chars).save_pretrained(folder)
        (folder / "README.md").write_text(model_card(imported, out.name, command), encoding="utf-8")
        if imported.corpus_record is not None:
            write_corpus_record(folder, imported.corpus_record)

    write_new_folder(out, write, replace=force)
    logger.info("wrote %s from %s (%s)", out, imported.source, SOURCE_NAMES[imported.source_format])
    return imported


def _is_inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except OSError:
        return False


def model_card(imported: Imported, name: str, command: str | None) -> str:
    """README.md of an imported folder: the source (file, format, sha256), vocabulary, architecture, a sample."""
    from huggingface_hub import ModelCardData

    from ..generation import generate_text
    from ..generation.backends.torch_backend import TorchBackend

    model, config = imported.model, imported.model.config
    parameters = sum(p.numel() for p in model.parameters())
    data = ModelCardData(
        model_name=name,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["gpt-serve", "chargpt", "character-level", f"imported-from-{imported.source_format}"],
    )
    arch = {k: getattr(config, k) for k in ARCH_KEYS}
    trained = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in imported.training.items())
    sample = generate_text(TorchBackend(model), imported.vocab, "", SAMPLE_TOKENS, seed=0)  # temperature 1
    record = imported.corpus_record
    # the first sample prompt, shown; without one, no --prompt (generate then starts from a newline)
    prompt = f" --prompt {shlex.quote(record.default_prompt)}" if record is not None and record.default_prompt else ""
    trained_on = f"{escape(record.name)} ({escape(record.description)})" if record is not None else "not recorded"
    return f"""---
{data.to_yaml()}
---

# {name}

A character-level GPT trained with {SOURCE_NAMES[imported.source_format]}, imported into gpt-serve
({parameters:,} parameters).

| | |
|---|---|
| source | `{imported.source}` |
| source sha256 | `{imported.source_sha256}` |
| format | {SOURCE_NAMES[imported.source_format]} ({_format_note(imported.source_format)}) |
| vocabulary | {len(imported.vocab)} characters: {imported.vocab_source} |
| training text | {trained_on} |
| training | {trained or "not recorded in the checkpoint"} |

Command:

```
{command or "(imported from Python: gpt_serve.folders.importing.import_checkpoint)"}
```

Architecture: `{arch}`

## Use

```bash
gpt-serve generate PATH{prompt} --max-new-tokens 200
gpt-serve serve --model-dir PATH
```

## Sample (temperature 1.0, seed 0, from a newline)

```
{sample}
```
"""


def _format_note(kind: str) -> str:
    if kind == LESSON:
        return "a GPTLanguageModel state_dict; the heads' key/query/value fused into qkv"
    return "ckpt.pt with meta.pkl; GELU, tied embeddings, c_attn as qkv"


__all__ = ["LESSON", "NANOGPT", "SOURCE_NAMES", "Imported", "convert", "import_checkpoint", "model_card"]
