"""Model folders: the models shipped inside the package, found by name, and what every folder must hold.

Torch-free (the ONNX Runtime path uses it). A model folder is a `save_pretrained` folder: `config.json`, the
weights (`model.safetensors`), the tokenizer files (`vocab.json`, `tokenizer_config.json`), `generation_config.json`,
a model card, `corpus.json` (what it was trained on: `gpt_serve.folders.corpus_record.CorpusRecord`) and, once exported,
`onnx/`.
The shipped ones hold exactly that, data only; the code lives once, in `gpt_serve`.

    >>> from gpt_serve.models import model_path, list_models
    >>> model_path("shakespeare")  # the default model's folder
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..files import check_regular, json_max_bytes, read_json_file
from ..onnx_contract import FP32_FILE_NAME, INPLACE_FP32_FILE_NAME, INPLACE_INT8_FILE_NAME, INT8_FILE_NAME, ONNX_SUBDIR

MODELS_DIR = Path(__file__).resolve().parent
DEFAULT_MODEL = "shakespeare"
CONFIG_FILE_NAME = "config.json"
CORPUS_FILE_NAME = "corpus.json"  # what the model was trained on (`gpt_serve.folders.corpus_record.CorpusRecord`)
WEIGHTS_FILE_NAME = "model.safetensors"
MODEL_TYPE = "chargpt"
# What a model folder holds, by name: what `save_pretrained` of the model and tokenizer writes, the card, and the
# training's figure and metrics beside it. Loading checks that each present is a regular file (`check_model_files`);
# `gpt-serve copy` writes these, the code files and training's `step.json`, and nothing else
# (`gpt_serve.folders.publishing`).
MODEL_FILE_NAMES = (
    CONFIG_FILE_NAME, WEIGHTS_FILE_NAME, "vocab.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "generation_config.json", "README.md",
    "loss.png", "metrics.jsonl", CORPUS_FILE_NAME,
)  # fmt: skip
# What the export writes into `onnx/` (the graphs, and onnxruntime-genai's config and tokenizer files).
ONNX_FILE_NAMES = (
    FP32_FILE_NAME, INT8_FILE_NAME, INPLACE_FP32_FILE_NAME, INPLACE_INT8_FILE_NAME, "genai_config.json",
    "tokenizer.json", "tokenizer_config.json",
)  # fmt: skip
# The lesson's ladder, shipped as `ladder-a` .. `ladder-e`: what each stage adds to the one before
# (the training presets and the demo's comparison both show it).
LADDER = {
    "ladder-a": "one self-attention head",
    "ladder-b": "4 heads x 8, concatenated, output projection",
    "ladder-c": "+ feed-forward Linear -> ReLU after attention",
    "ladder-d": "3 residual blocks, projections, 4x feed-forward",
    "ladder-e": "+ pre-norm LayerNorm (and one before lm_head)",
}
# The validation loss the lesson reports for each stage on Tiny Shakespeare (`ladder-f`: its scaled-up model, GPU
# work, not shipped): the training presets' targets and the demo's reference lines (docs/ladder.md).
LESSON_VAL_LOSS = {
    "ladder-a": 2.40,
    "ladder-b": 2.28,
    "ladder-c": 2.24,
    "ladder-d": 2.08,
    "ladder-e": 2.06,
    "ladder-f": 1.48,
}


def is_model_folder(path: str | os.PathLike) -> bool:
    return (Path(path) / CONFIG_FILE_NAME).is_file()


def discover(root: str | os.PathLike = MODELS_DIR) -> dict[str, Path]:
    """name -> folder for every model folder directly under `root`, sorted by name, the default model first."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory")
    folders = sorted((p for p in root.iterdir() if is_model_folder(p)), key=lambda p: (p.name != DEFAULT_MODEL, p.name))
    return {p.name: p for p in folders}


def list_models() -> list[str]:
    """Names of the shipped models, the default first."""
    return list(discover(MODELS_DIR))


def model_path(name: str | os.PathLike = DEFAULT_MODEL) -> Path:
    """The folder of a shipped model; a path to a model folder is returned as is."""
    if not isinstance(name, (str, os.PathLike)) or not str(name):
        raise ValueError(f"model must be a shipped model name or a model folder, got {name!r}")
    candidate = Path(name)
    if is_model_folder(candidate):
        return candidate
    if isinstance(name, str) and is_model_folder(MODELS_DIR / name):
        return MODELS_DIR / name
    if candidate.is_dir():
        check_regular(candidate / CONFIG_FILE_NAME)  # a FIFO or a device named config.json: say so
        raise ValueError(f"{name} is a folder but not a model folder: it has no {CONFIG_FILE_NAME}")
    if not isinstance(name, str) or _looks_like_a_path(name):  # a mistyped folder is not an unknown model name
        raise ValueError(f"the model folder {str(name)!r} does not exist")
    raise ValueError(f"unknown model {str(name)!r}: shipped models are {list_models()}, or pass a model folder path")


def _looks_like_a_path(name: str) -> bool:
    """Whether a model named on a command line is meant as a folder: it has a path separator, or starts with `.` or
    `~` (a shipped model's name has neither)."""
    return "/" in name or os.sep in name or name.startswith((".", "~"))


def read_config(folder: str | os.PathLike) -> dict[str, Any]:
    """`config.json` of a model folder as a dict, with a clear error for a missing, unreadable or foreign file."""
    path = check_regular(Path(folder) / CONFIG_FILE_NAME)
    try:
        config = read_json_file(path)  # at most `json_max_bytes`: a 200 MB config.json is refused unread
    except (OSError, ValueError) as e:  # missing, unreadable, too large, not UTF-8, not JSON
        raise ValueError(f"cannot read {path}: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object, got a {type(config).__name__}")
    if config.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{path} is the config of a {config.get('model_type')!r} model, not a {MODEL_TYPE!r} one")
    return config


def check_model_files(folder: str | os.PathLike) -> None:
    """A ValueError naming the first of the folder's model files (`MODEL_FILE_NAMES`, and `ONNX_FILE_NAMES` in
    `onnx/`) that is there but not a regular file (a FIFO would block whoever opens it, a device never ends), or is a
    JSON file larger than its limit (`gpt_serve.files.json_max_bytes`: transformers reads them whole)."""
    folder = Path(folder)
    for path in (*(folder / n for n in MODEL_FILE_NAMES), *(folder / ONNX_SUBDIR / n for n in ONNX_FILE_NAMES)):
        check_regular(path)
        limit = json_max_bytes(path.name)
        if path.suffix == ".json" and path.is_file() and path.stat().st_size > limit:
            raise ValueError(
                f"{path} has {path.stat().st_size:,} bytes; a model folder's {path.name} holds at most {limit:,}"
            )


__all__ = [
    "DEFAULT_MODEL",
    "MODEL_FILE_NAMES",
    "ONNX_FILE_NAMES",
    "check_model_files",
    "LADDER",
    "MODELS_DIR",
    "discover",
    "is_model_folder",
    "list_models",
    "model_path",
    "read_config",
]
