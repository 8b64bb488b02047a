"""gpt_serve: the "Let's build GPT" character-level GPT as a transformers model, with a KV-cache generation engine.

Importing the package registers `chargpt` with `AutoConfig`, `AutoModelForCausalLM` and `AutoTokenizer` when
torch and transformers are installed. The ONNX Runtime path (`gpt_serve.onnx_backend`) needs neither: with only
numpy and onnxruntime installed, importing it never imports torch.
"""

from __future__ import annotations

import importlib.util

__version__ = "0.1.0"


def _torch_stack_available() -> bool:
    try:
        return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))
    except (ImportError, ValueError):
        return False


if _torch_stack_available():
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from .configuration_chargpt import CharGPTConfig
    from .modeling_chargpt import CharGPTForCausalLM
    from .tokenization_chargpt import CharTokenizer

    AutoConfig.register(CharGPTConfig.model_type, CharGPTConfig, exist_ok=True)
    AutoModelForCausalLM.register(CharGPTConfig, CharGPTForCausalLM, exist_ok=True)
    AutoTokenizer.register(CharGPTConfig, tokenizer_class=CharTokenizer, exist_ok=True)
    # save_pretrained copies these modules next to the weights and writes `auto_map`, so the folder loads with
    # trust_remote_code=True where gpt_serve is not installed.
    CharGPTConfig.register_for_auto_class()
    CharGPTForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    CharTokenizer.register_for_auto_class("AutoTokenizer")

    __all__ = ["CharGPTConfig", "CharGPTForCausalLM", "CharTokenizer", "__version__"]
else:  # pragma: no cover - exercised by the torch-free subprocess test
    __all__ = ["__version__"]
