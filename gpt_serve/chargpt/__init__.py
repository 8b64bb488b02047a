"""The transformers model of the lesson: config, model, char tokenizer, window, vocabulary.

Importing this package imports neither torch nor transformers; `register_auto_classes` (called when the modeling
module is imported) does.
"""


def register_auto_classes() -> None:
    """Registers `chargpt` with transformers' Auto classes (idempotent; imports torch and transformers)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    from .configuration_chargpt import CharGPTConfig
    from .modeling_chargpt import CharGPTForCausalLM, CharGPTModel
    from .tokenization_chargpt import CharTokenizer

    AutoConfig.register(CharGPTConfig.model_type, CharGPTConfig, exist_ok=True)
    AutoModel.register(CharGPTConfig, CharGPTModel, exist_ok=True)
    AutoModelForCausalLM.register(CharGPTConfig, CharGPTForCausalLM, exist_ok=True)
    AutoTokenizer.register(CharGPTConfig, tokenizer_class=CharTokenizer, exist_ok=True)
