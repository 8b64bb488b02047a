"""Reading other people's checkpoints without running them: the lesson's `gpt.py` state dicts and nanoGPT's
`ckpt.pt` with its `meta.pkl`, for `gpt_serve.folders.importing`.

A checkpoint is a pickle, and a pickle can run code. Checkpoints are read with `torch.load(weights_only=True)`
(tensors and plain containers only) and `meta.pkl` by an unpickler that imports nothing and admits only dicts,
strings and integers, so a file with a code payload is refused (a ValueError) before anything in it runs.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from ..chargpt.vocab import CharVocab
from ..files import check_regular

LESSON, NANOGPT = "lesson", "nanogpt"
SOURCE_NAMES = {LESSON: "the lesson's gpt.py", NANOGPT: "nanoGPT"}  # the formats as messages and cards name them
COMPILE_PREFIX = "_orig_mod."  # what torch.compile's wrapper puts before every name of its state_dict
META_FILE_NAME = "meta.pkl"
META_MAX_BYTES = 2**20  # a character vocabulary's pickle is a few kB
GPT2_VOCAB_SIZE = 50257  # nanoGPT's GPT-2 BPE checkpoints have this many tokens (50304 once padded)


def read_source(path: str | os.PathLike) -> tuple[str, Any]:
    """(format, what the file holds) of a checkpoint: `LESSON` (a state dict) or `NANOGPT` (ckpt.pt's dict).

    Read with `torch.load(weights_only=True)`: tensors and plain containers only, nothing else is built or run.
    """
    path = check_regular(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        wanted = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f"it asks to import {wanted[1]}" if wanted else str(e).strip().splitlines()[-1][:200]
        raise ValueError(
            f"{path} is refused: {what}, and torch.load(weights_only=True) admits only tensors and plain "
            f"containers (nothing in it ran). A whole pickled model (torch.save(model)) cannot be read safely: "
            f"save model.state_dict() instead"
        ) from None
    except Exception as e:  # a text file, a truncated zip, ...: torch.load raises many kinds
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else "empty or truncated"
        raise ValueError(f"{path} is not a PyTorch checkpoint ({type(e).__name__}: {first})") from None
    if isinstance(obj, dict) and "model" in obj and "model_args" in obj:
        return NANOGPT, obj
    if isinstance(obj, dict) and "token_embedding_table.weight" in strip_compile_prefix(obj, check=False):
        return LESSON, obj
    raise ValueError(
        f"{path} is neither a state dict of the lesson's gpt.py (tensors named token_embedding_table.weight, "
        f"blocks.0.sa.heads.0.key.weight, ...) nor a nanoGPT ckpt.pt (a dict with 'model' and 'model_args'): it "
        f"holds {describe_unpickled(obj)}"
    )


def describe_unpickled(obj: Any) -> str:
    """What a loaded checkpoint or pickle holds, for a message: a dict by its first keys, anything else by its type."""
    if isinstance(obj, dict):
        keys = list(obj)
        more = f" and {len(keys) - 6} more" if len(keys) > 6 else ""
        return f"a dict with keys {[str(k) for k in keys[:6]]}{more}" if keys else "an empty dict"
    return f"a {type(obj).__name__}"


def strip_compile_prefix(state: dict, check: bool = True) -> dict:
    """`state` with torch.compile's `_orig_mod.` taken off its names (nanoGPT's sample.py does the same)."""
    out = {
        (k[len(COMPILE_PREFIX) :] if isinstance(k, str) and k.startswith(COMPILE_PREFIX) else k): v
        for k, v in state.items()
    }
    if check:
        bad = [k for k, v in out.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
        if bad:
            raise ValueError(f"a state dict maps names to tensors; these entries are not tensors: {bad[:5]}")
    return out


class _VocabUnpickler(pickle.Unpickler):
    """Builds what a pickle's own opcodes build (dicts, strings, numbers, ...) and imports nothing: any class or
    function it names, the way a code payload runs, is refused before it is looked up."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"it asks to import {module}.{name}")


def read_meta(path: str | os.PathLike) -> CharVocab:
    """The character vocabulary in nanoGPT's `meta.pkl` (`{'vocab_size': n, 'itos': {id: char}, 'stoi': {...}}`),
    read by an unpickler that admits only dicts, strings and integers; a ValueError for anything else."""
    path = check_regular(path)
    if not path.is_file():
        raise FileNotFoundError(f"meta.pkl not found: {path}")
    data = path.read_bytes()
    if len(data) > META_MAX_BYTES:
        raise ValueError(f"{path} has {len(data):,} bytes, more than a character vocabulary's meta.pkl ever has")
    try:
        meta = _VocabUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as e:
        raise ValueError(f"{path} is refused: {e} (meta.pkl may hold only dicts, strings and integers)") from None
    except Exception as e:  # a truncated or foreign file: pickle raises many kinds
        raise ValueError(f"{path} is not a readable pickle ({type(e).__name__}: {e})") from None
    if not _plain(meta):
        raise ValueError(f"{path} is refused: it holds something other than dicts, strings and integers")
    if not isinstance(meta, dict) or not isinstance(meta.get("itos"), dict):
        raise ValueError(
            f"{path} is not nanoGPT's meta.pkl: it needs 'itos' (id -> character), got {describe_unpickled(meta)}"
        )
    itos, stoi = meta["itos"], meta.get("stoi")
    if sorted(itos, key=repr) != sorted(range(len(itos)), key=repr):
        raise ValueError(f"{path}: 'itos' must map the ids 0..{len(itos) - 1} to characters")
    chars = [itos[i] for i in range(len(itos))]
    try:
        vocab = CharVocab(chars)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    if stoi is not None and stoi != vocab.stoi:
        raise ValueError(f"{path}: 'stoi' is not the inverse of 'itos'")
    if meta.get("vocab_size", len(chars)) != len(chars):
        raise ValueError(f"{path}: 'vocab_size' is {meta['vocab_size']} but 'itos' has {len(chars)} characters")
    return vocab


def _plain(obj: Any) -> bool:
    if isinstance(obj, dict):
        return all(_plain(k) and _plain(v) for k, v in obj.items())
    return type(obj) in (str, int)


def find_meta(source: Path, checkpoint: dict, meta: str | os.PathLike | None) -> Path:
    """Where nanoGPT's `meta.pkl` is: `meta` if given, else beside the checkpoint, else where nanoGPT's sample.py
    looks (`data/DATASET/meta.pkl`, from the checkpoint's folder's parent or the working folder)."""
    if meta is not None:
        return Path(meta)
    dataset = (checkpoint.get("config") or {}).get("dataset") if isinstance(checkpoint.get("config"), dict) else None
    candidates = [source.parent / META_FILE_NAME]
    if isinstance(dataset, str) and dataset:
        candidates += [
            source.parent.parent / "data" / dataset / META_FILE_NAME,
            Path("data") / dataset / META_FILE_NAME,
        ]
    for path in candidates:
        if path.is_file():
            return path
    vocab_size = (checkpoint.get("model_args") or {}).get("vocab_size")
    if isinstance(vocab_size, int) and vocab_size >= GPT2_VOCAB_SIZE:
        raise ValueError(
            f"{source} is a nanoGPT checkpoint on GPT-2's BPE vocabulary (vocab_size {vocab_size}, no meta.pkl): "
            f"gpt-serve serves character-level models, whose characters nanoGPT keeps in meta.pkl"
        )
    raise ValueError(
        f"no meta.pkl for {source} (looked at {', '.join(str(p) for p in candidates)}): nanoGPT keeps the character "
        f"vocabulary in data/DATASET/meta.pkl; pass it with --meta"
    )


__all__ = [
    "LESSON",
    "NANOGPT",
    "SOURCE_NAMES",
    "describe_unpickled",
    "find_meta",
    "read_meta",
    "read_source",
    "strip_compile_prefix",
]
