"""The model card (README.md) of an imported folder: where the model came from (file, format, sha256), its
vocabulary, training text and architecture, how to run it, and a sample."""

from __future__ import annotations

import shlex

from .checkpoints import LESSON, SOURCE_NAMES
from .conversion import Imported
from .markdown import escape

SAMPLE_TOKENS = 200  # characters of the model card's sample
# what the model card shows of the config: the architecture
ARCH_KEYS = (
    "vocab_size", "block_size", "n_embd", "n_head", "n_layer", "ffwd_mult", "activation", "bias", "qkv_bias",
    "lm_head_bias", "layer_norm_bias", "tie_word_embeddings", "attn_scale", "layer_norm_eps", "dropout",
)  # fmt: skip


def card_metadata(name: str, source_format: str) -> str:
    """The card's YAML header, as the Hub reads it: the model's name, library, task and tags."""
    from huggingface_hub import ModelCardData

    tags = ["gpt-serve", "chargpt", "character-level", f"imported-from-{source_format}"]
    data = ModelCardData(model_name=name, library_name="transformers", pipeline_tag="text-generation", tags=tags)
    return data.to_yaml()


def model_card(imported: Imported, name: str, command: str | None) -> str:
    """README.md of an imported folder: the source (file, format, sha256), vocabulary, architecture, a sample."""
    from ..generation import generate_text
    from ..generation.backends.torch_backend import TorchBackend

    model, config = imported.model, imported.model.config
    parameters = sum(p.numel() for p in model.parameters())
    arch = {k: getattr(config, k) for k in ARCH_KEYS}
    trained = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in imported.training.items())
    sample = generate_text(TorchBackend(model), imported.vocab, "", SAMPLE_TOKENS, seed=0)  # temperature 1
    record = imported.corpus_record
    # the first sample prompt, shown; without one, no --prompt (generate then starts from a newline)
    prompt = f" --prompt {shlex.quote(record.default_prompt)}" if record is not None and record.default_prompt else ""
    trained_on = f"{escape(record.name)} ({escape(record.description)})" if record is not None else "not recorded"
    return f"""---
{card_metadata(name, imported.source_format)}
---

# {name}

A character-level GPT trained with {SOURCE_NAMES[imported.source_format]}, imported into gpt-serve
({parameters:,} parameters).

| | |
|---|---|
| source | `{imported.source}` |
| source sha256 | `{imported.source_sha256}` |
| format | {SOURCE_NAMES[imported.source_format]} ({_format_note(imported.source_format)}) |
| vocabulary | {len(imported.vocab)} characters: {imported.vocab_source} |
| training text | {trained_on} |
| training | {trained or "not recorded in the checkpoint"} |

Command:

```
{command or "(imported from Python: gpt_serve.folders.importing.import_checkpoint)"}
```

Architecture: `{arch}`

## Use

```bash
gpt-serve generate PATH{prompt} --max-new-tokens 200
gpt-serve serve --model-dir PATH
```

## Sample (temperature 1.0, seed 0, from a newline)

```
{sample}
```
"""


def _format_note(kind: str) -> str:
    if kind == LESSON:
        return "a GPTLanguageModel state_dict; the heads' key/query/value fused into qkv"
    return "ckpt.pt with meta.pkl; GELU, tied embeddings, c_attn as qkv"


__all__ = ["model_card"]
