"""gpt_serve: the "Let's build GPT" character-level GPT as a transformers model, with one generation engine.

The package, a sub-package per concern, each importing only those listed after it (import-linter holds it):

- `gpt_serve.cli`: the `gpt-serve` command, a module per command;
- `gpt_serve.serving`: the model registry servers share, the OpenAI-compatible API, Ray Serve;
- `gpt_serve.folders`: model folders made and copied (`gpt-serve import`, `gpt-serve copy`), their corpus records;
- `gpt_serve.generation`: the request specification, sampling, the continuous-batching scheduler, and in
  `generation.backends` loading a model for a backend (`load_backend`), the PyTorch and ONNX Runtime backends;
- `gpt_serve.chargpt`: the transformers model, `CharGPTConfig`, `CharGPTForCausalLM`, `CharTokenizer` (torch and
  transformers; its character table `vocab` and window rule `window` are pure Python), and `gpt_serve.models`, the
  shipped model folders by name and what every folder holds;
- leaves: `files` (reading and writing inside a folder), `onnx_contract`, `extras`.

`import gpt_serve` imports neither torch nor transformers, so the ONNX Runtime path stays torch-free even where
torch is installed. The model classes are imported on first use (`gpt_serve.CharGPTForCausalLM`, or
`from gpt_serve import CharGPTForCausalLM`), which also registers `chargpt` with transformers' `AutoConfig`,
`AutoModelForCausalLM` and `AutoTokenizer`; `register_auto_classes()` does that explicitly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .chargpt import register_auto_classes

__version__ = "0.1.0"

_MODEL_CLASSES = {
    "CharGPTConfig": "chargpt.configuration_chargpt",
    "CharGPTForCausalLM": "chargpt.modeling_chargpt",
    "CharGPTModel": "chargpt.modeling_chargpt",
    "CharTokenizer": "chargpt.tokenization_chargpt",
}

if TYPE_CHECKING:  # pragma: no cover
    from .chargpt.configuration_chargpt import CharGPTConfig
    from .chargpt.modeling_chargpt import CharGPTForCausalLM, CharGPTModel
    from .chargpt.tokenization_chargpt import CharTokenizer


def __getattr__(name: str):
    if name in _MODEL_CLASSES:
        import importlib

        register_auto_classes()
        value = getattr(importlib.import_module(f".{_MODEL_CLASSES[name]}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODEL_CLASSES])


__all__ = [
    "CharGPTConfig",
    "CharGPTForCausalLM",
    "CharGPTModel",
    "CharTokenizer",
    "register_auto_classes",
    "__version__",
]
