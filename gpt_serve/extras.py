"""What to install when a dependency is missing, said the same way by every command and backend.

`pip install gpt-serve` brings its own dependencies (numpy, torch, transformers, safetensors); the rest come with
its extras (pyproject.toml: `onnx`, `serve`, `ray`, `train`, `export`, `demo`, ...). The torch-free install
(`pip install numpy onnxruntime`, then gpt-serve with `--no-deps`) has numpy and onnxruntime alone.
"""

from __future__ import annotations


class MissingDependency(ModuleNotFoundError):
    """A dependency is not installed; the message names it and what to install (or what to use instead)."""


def missing_extra(what: str, extra: str, error: ImportError) -> MissingDependency:
    """`what` (a command, a backend) cannot import a dependency that `extra` installs, e.g. "gpt-serve serve needs
    the 'serve' extra (cannot import fastapi): pip install 'gpt-serve[serve]'"."""
    return MissingDependency(
        f"{what} needs the {extra!r} extra (cannot import {error.name or error}): pip install 'gpt-serve[{extra}]'",
        name=error.name,
    )


def missing_base(what: str, error: ImportError) -> MissingDependency:
    """`what` cannot import one of gpt-serve's own dependencies (torch, transformers), which a `--no-deps` install
    leaves out."""
    return MissingDependency(
        f"{what} needs PyTorch and transformers, gpt-serve's own dependencies (cannot import {error.name or error}): "
        f"pip install gpt-serve (not --no-deps)",
        name=error.name,
    )
