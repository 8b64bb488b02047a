"""The models shipped inside the package, found by name. Torch-free (the ONNX Runtime path uses it).

    >>> from gpt_serve.models import model_path, list_models
    >>> model_path("shakespeare")  # a save_pretrained folder (plus onnx/ once exported)
"""

from __future__ import annotations

from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent
DEFAULT_MODEL = "shakespeare"


def list_models() -> list[str]:
    """Names of the shipped models (folders holding a config.json), the default first."""
    names = sorted(p.name for p in MODELS_DIR.iterdir() if (p / "config.json").is_file())
    return sorted(names, key=lambda n: n != DEFAULT_MODEL)


def model_path(name: str = DEFAULT_MODEL) -> Path:
    """The folder of a shipped model; a path to an existing folder is returned as is."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"model name must be a non-empty string, got {name!r}")
    candidate = Path(name)
    if candidate.is_dir() and (candidate / "config.json").is_file():
        return candidate
    folder = MODELS_DIR / name
    if (folder / "config.json").is_file():
        return folder
    if candidate.is_dir():
        raise ValueError(f"{name} is a folder but not a model folder: it has no config.json")
    raise ValueError(f"unknown model {name!r}: shipped models are {list_models()}, or pass a model folder path")
