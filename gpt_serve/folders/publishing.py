"""A model folder written out as a self-contained copy: what plain transformers needs, and a Hub repository holds.

The shipped folders (`gpt_serve.models`) hold data only: the package's classes read them. A copy for someone
without gpt-serve (`gpt-serve copy NAME OUT`, `write_self_contained`) also holds the model's code, the files
`save_pretrained` copies for `trust_remote_code=True` (`configuration_chargpt.py`, `config_limits.py`,
`modeling_chargpt.py`, `window.py`) with `auto_map` in its `config.json`, and its model card says how to load it that
way. Written whole or not at all (`gpt_serve.files.write_new_folder`).

A copy is meant to be uploaded as it is, so it holds what a model folder is and nothing else (`plan_copy`):

- the model is loaded with every check of `load_backend` (safetensors only, the vocabulary, finite weights) and
  written again: `config.json` (its `auto_map` ours alone), `model.safetensors`, `generation_config.json`, the
  tokenizer files (with the chat format and its `chat_template.jinja`), and the package's own code files; so are
  the folder's records, read with their checks: its text (`corpus.json`, without `source`, where the text lies on
  this machine) and its training step (`step.json`);
- the card (its "## Use" section rewritten), the training's `loss.png` and `metrics.jsonl`, and the export's files in
  `onnx/` (by name, `gpt_serve.models.ONNX_FILE_NAMES`) are copied byte for byte, when each is a regular file of
  the folder: never a symbolic link (its target may be anywhere: a secret file would be published);
- everything else is skipped, and said so: another code file (`evil.py`, which a foreign `auto_map` entry would
  make `trust_remote_code=True` import), a pickle (`pytorch_model.bin`: it can run code when loaded), a link, any
  other file; a training run's `checkpoints/` and `snapshots/` (each snapshot is a folder to copy on its own).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..chargpt.chat_format import read_chat_format
from ..files import write_file, write_new_folder
from ..models import MODEL_FILE_NAMES, ONNX_FILE_NAMES
from ..onnx_contract import ONNX_SUBDIR
from .corpus_record import read_corpus_record, write_corpus_record
from .snapshots import SNAPSHOTS_DIR, STEP_FILE_NAME, read_step_record, write_step_record

# Copied byte for byte (when regular files of the folder); the rest of MODEL_FILE_NAMES is written from the model.
COPIED_AS_IS = ("README.md", "loss.png", "metrics.jsonl")
CODE_FILES = ("configuration_chargpt.py", "config_limits.py", "modeling_chargpt.py", "window.py")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# What a training run's folder holds beside the model, and why a copy leaves it out.
# ({path}: the entry's path)
LEFT_BY_TRAINING = {
    SNAPSHOTS_DIR: "the model's earlier states that training kept (--snapshots), each a model folder of its own: "
    "copy one with gpt-serve copy {path}/step-NNNNNN DEST",
    "checkpoints": "training's state for resuming (optimizer and RNG, a pickle), not part of a published model",
    "tensorboard": "training's TensorBoard event files (--report-to tensorboard)",
    ".lock": "training's lock on its output folder",
}


@dataclass
class CopyPlan:
    """What `gpt-serve copy` takes from a folder as it is (paths relative to it), and what it skips, with why."""

    copied: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _skip_reason(entry: os.DirEntry, rel: str) -> str:
    if entry.is_symlink():
        return f"a symbolic link (to {os.readlink(entry.path)}): a copy holds the folder's own files only"
    if rel in LEFT_BY_TRAINING:
        return LEFT_BY_TRAINING[rel].format(path=entry.path)
    if entry.is_dir(follow_symlinks=False):
        return "a folder that is not onnx/"
    if not entry.is_file(follow_symlinks=False):
        return "not a regular file"
    name = entry.name
    if name.endswith(PICKLE_SUFFIXES):
        return "a pickle (it can run code when loaded); the weights are model.safetensors"
    if name.endswith(".py"):
        return "a code file that is not gpt-serve's (the copy's code is the package's own)"
    return "not a file of a model folder"


def plan_copy(folder: str | os.PathLike) -> CopyPlan:
    """What `write_self_contained` copies from `folder` as it is, and what it skips (see the module docstring)."""
    folder, plan = Path(folder), CopyPlan()
    # written again from the model, the package and the folder's records (checked as they are read)
    rewritten = {*MODEL_FILE_NAMES, *CODE_FILES, STEP_FILE_NAME} - set(COPIED_AS_IS)
    with os.scandir(folder) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name == "__pycache__":
                continue
            if entry.name == ONNX_SUBDIR and entry.is_dir(follow_symlinks=False):
                with os.scandir(entry.path) as graphs:
                    for graph in sorted(graphs, key=lambda e: e.name):
                        rel = f"{ONNX_SUBDIR}/{graph.name}"
                        if graph.name in ONNX_FILE_NAMES and graph.is_file(follow_symlinks=False):
                            plan.copied.append(rel)
                        else:
                            plan.skipped.append((rel, _skip_reason(graph, rel)))
            elif entry.name in COPIED_AS_IS and entry.is_file(follow_symlinks=False):
                plan.copied.append(entry.name)
            elif entry.name in rewritten:
                # written again from the loaded model or the package: no byte of the file itself is copied (a link
                # here, as in a Hugging Face cache, was read by the loader's checks of a model's files)
                continue
            else:
                plan.skipped.append((entry.name, _skip_reason(entry, entry.name)))
    return plan


def _read_own(path: Path) -> bytes:
    """The bytes of `path`, opened without following a link and refused unless it is a regular file (no window for a
    file swapped for a link after `plan_copy` looked)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{path} is not a regular file; gpt-serve copy takes the folder's own files only")
        return f.read()


REMOTE_CODE_USE = """## Use

This folder holds its own model code: plain transformers loads it with `trust_remote_code=True` (no gpt-serve
needed; the tokenizer is `tokenizer.json`, which needs no code).

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("PATH", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("PATH", trust_remote_code=True)
ids = tokenizer(PROMPT, return_tensors="pt").input_ids
print(tokenizer.decode(model.generate(ids, max_new_tokens=200, do_sample=True)[0]))
```

With gpt-serve installed, `gpt-serve generate PATH` and `gpt-serve serve --model-dir PATH` run it too.

"""


def write_self_contained(source: str | os.PathLike, out: str | os.PathLike, replace: bool = False) -> Path:
    """Writes a self-contained copy of the model folder `source` (a path, or a shipped model's name) to `out`: the
    model's files and nothing else (`plan_copy` says what is skipped)."""
    from .. import CharTokenizer
    from ..generation.backends.loading import load_backend
    from ..generation.model_folder import ModelFolder

    opened = ModelFolder.open(source)
    folder = opened.path
    check_outside(folder, out)
    loaded = load_backend(opened, "torch")  # every check of a load: safetensors only, vocabulary, finite weights
    model = loaded.backend.pretrained
    model.config.auto_map = {}  # ours alone: save_pretrained writes the entries of the package's classes
    chat = read_chat_format(folder, loaded.vocab.chars)  # its chat format, checked (one it records none of: the play's)
    # the folder's vocabulary and chat format; no foreign tokenizer_config.json
    tokenizer = CharTokenizer(chars=loaded.vocab.chars, chat_format=chat)
    corpus, step = read_corpus_record(folder), read_step_record(folder)  # a broken one: a ValueError naming it
    plan = plan_copy(folder)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)  # the weights, config.json with auto_map, the code files
        tokenizer.save_pretrained(tmp)
        if corpus is not None:  # where the text lives on this machine means nothing to a copy's readers
            write_corpus_record(tmp, dataclasses.replace(corpus, source=None))
        if step is not None:
            write_step_record(tmp, step)
        for rel in plan.copied:
            data = _read_own(folder / rel)
            if rel == "README.md":
                prompt = corpus.default_prompt if corpus is not None else ""  # the model's first sample prompt
                data = with_remote_code_use(data.decode("utf-8"), prompt).encode("utf-8")
            (tmp / rel).parent.mkdir(exist_ok=True)
            write_file(tmp / rel, data)

    return write_new_folder(out, write, replace=replace)


def check_outside(folder: Path, out: str | os.PathLike) -> None:
    """A ValueError when `out` is the model folder `folder` or a folder that holds it: replacing it (--force) would
    delete the model being copied (and `X/..` cannot be renamed: "Device or resource busy")."""
    source, dest = folder.resolve(), Path(out).resolve()
    if dest == source or dest in source.parents:
        where = "is the model folder" if dest == source else "holds the model folder"
        raise ValueError(
            f"{out} {where} {folder}: writing the copy there would replace the model being copied; "
            f"choose an output folder outside it"
        )


def with_remote_code_use(card: str, prompt: str = "") -> str:
    """`card` (a model card) with its "## Use" section saying how plain transformers loads the folder, from
    `prompt` (the model's own: its first sample prompt)."""
    use = REMOTE_CODE_USE.replace("PROMPT", json.dumps(prompt), 1)
    # up to the next section: a heading, or a section the export keeps between its markers (`<!-- gpt-serve:...`)
    section = re.compile(r"^## Use\n.*?(?=^## |^<!-- gpt-serve:|\Z)", re.S | re.M)
    if section.search(card):
        return section.sub(lambda _: use, card, count=1)
    return card.rstrip("\n") + "\n\n" + use


__all__ = ["CopyPlan", "plan_copy", "write_self_contained", "with_remote_code_use"]
