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

The tensors are mapped onto the model by `gpt_serve.folders.conversion` (the lesson's per-head key/query/value
Linears fused into `qkv`; nanoGPT's architecture a config of the same model). Safe by construction
(`gpt_serve.folders.checkpoints`): checkpoints are read with `torch.load(weights_only=True)` and `meta.pkl` by an
unpickler that imports nothing and admits only dicts, strings and integers, so a file with a code payload is
refused before anything in it runs.

`import_checkpoint` writes a folder like training's (`config.json` with `vocab_sha256`, `model.safetensors`,
`vocab.json`, `tokenizer.json`, `generation_config.json`, a model card naming the source:
`gpt_serve.folders.import_card`), whole or not at all (`gpt_serve.files.write_new_folder`); anything wrong with the
input is a ValueError naming it, raised before anything is written. The ONNX export is the export application's:
`gpt-serve import` runs it on the new folder.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import torch

from ..chargpt.chat_format import format_for_text
from ..chargpt.configuration_chargpt import ATTN_SCALES
from ..chargpt.tokenization_chargpt import CharTokenizer
from ..chargpt.vocab import CharVocab
from ..files import refuse_link, write_new_folder
from .checkpoints import LESSON, NANOGPT, SOURCE_NAMES, find_meta, read_meta, read_source
from .conversion import Imported, build_model, convert_lesson, convert_nanogpt
from .corpus import TINY_SHAKESPEARE_CHARS, load_text, sample_prompts
from .corpus_record import CorpusRecord, record_text, write_corpus_record
from .import_card import model_card

logger = logging.getLogger(__name__)


def lesson_vocab(corpus: str | os.PathLike | None) -> tuple[CharVocab, str]:
    """The lesson's vocabulary, `sorted(set(text))` of `corpus`, or Tiny Shakespeare's 65 characters."""
    if corpus is None:
        return CharVocab(TINY_SHAKESPEARE_CHARS), "Tiny Shakespeare's 65 characters (the default)"
    return CharVocab.from_text(load_text(corpus)), f"sorted(set(text)) of {Path(corpus).name}"


# --- reading and converting --------------------------------------------------------------------------------------


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
    # the chat format that fits the text (the lesson's Tiny Shakespeare without one: the play's, where it fits)
    chat = "auto" if corpus is None else format_for_text(load_text(corpus), imported.vocab.chars)

    def write(folder: Path) -> None:
        imported.model.save_pretrained(folder)
        CharTokenizer(chars=imported.vocab.chars, chat_format=chat).save_pretrained(folder)
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


__all__ = ["LESSON", "NANOGPT", "SOURCE_NAMES", "convert", "corpus_record", "import_checkpoint"]
