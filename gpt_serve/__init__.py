"""gpt_serve: the "Let's build GPT" character-level GPT as a transformers model, with one generation engine.

The package is three parts:

- the transformers model: `CharGPTConfig`, `CharGPTForCausalLM`, `CharTokenizer` (`configuration_chargpt`,
  `modeling_chargpt`, `tokenization_chargpt`; torch and transformers);
- `gpt_serve.generation`: loading a model for a backend (`load_backend`), the token loop, sampling, and the
  PyTorch and ONNX Runtime backends (numpy; torch only in the PyTorch backend);
- `gpt_serve.models`: the shipped model folders, by name;
- `gpt_serve.folders.importing`: a checkpoint of the lesson's `gpt.py` or of nanoGPT as a model folder (`gpt-serve
  import`).

`import gpt_serve` imports neither torch nor transformers, so the ONNX Runtime path stays torch-free even where
torch is installed. The model classes are imported on first use (`gpt_serve.CharGPTForCausalLM`, or
`from gpt_serve import CharGPTForCausalLM`), which also registers `chargpt` with transformers' `AutoConfig`,
`AutoModelForCausalLM` and `AutoTokenizer`; `register_auto_classes()` does that explicitly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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


def register_auto_classes() -> None:
    """Registers `chargpt` with transformers' Auto classes (idempotent; imports torch and transformers)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    from .chargpt.configuration_chargpt import CharGPTConfig
    from .chargpt.modeling_chargpt import CharGPTForCausalLM, CharGPTModel
    from .chargpt.tokenization_chargpt import CharTokenizer

    AutoConfig.register(CharGPTConfig.model_type, CharGPTConfig, exist_ok=True)
    AutoModel.register(CharGPTConfig, CharGPTModel, exist_ok=True)
    AutoModelForCausalLM.register(CharGPTConfig, CharGPTForCausalLM, exist_ok=True)
    AutoTokenizer.register(CharGPTConfig, tokenizer_class=CharTokenizer, exist_ok=True)


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
