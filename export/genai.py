"""What onnxruntime-genai reads beside the graph: `genai_config.json` and a tokenizer it can parse.

genai's `decoder` model type drives the exported graph through the same Hugging Face I/O names the export writes
(`past_key_values.%d.key` in, `present.%d.key` out), with its own KV-cache loop and search. Two things differ from
this package's engine:

- genai stops at `context_length` = `block_size` (prompt included): it has no sliding window, and a `max_length`
  above it is an error.
- genai needs an end-of-sequence id inside the vocabulary, and the lesson's model has none: the file names the
  character the training text uses least (`$`, once in Tiny Shakespeare), so generation stops early only if the
  model writes it.

genai's tokenizer rejects the `WordLevel` model of the folder's `tokenizer.json`; it reads the same table as a BPE
without merges (same ids; a character outside the vocabulary is dropped), written to `onnx/tokenizer.json`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from gpt_serve.onnx_contract import INPUT_NAMES, LOGITS_NAME, PAST_NAME, PRESENT_NAME
from gpt_serve.tokenization_chargpt import fast_tokenizer
from gpt_serve.vocab import FAST_TOKENIZER_FILE_NAME, CharVocab

GENAI_CONFIG_FILE_NAME = "genai_config.json"
TOKENIZER_CONFIG_FILE_NAME = "tokenizer_config.json"


def rarest_id(vocab: CharVocab, text: str | None) -> int:
    """The id of the vocabulary character `text` uses least (ties: the later id); the last id without text."""
    if not text:
        return len(vocab) - 1
    counts = Counter(text)
    return min(reversed(range(len(vocab))), key=lambda i: counts[vocab.chars[i]])


def genai_config(config, graph_file: str, eos_token_id: int) -> dict:
    """onnxruntime-genai's description of the exported decoder (`config`: the model's `CharGPTConfig`)."""
    return {
        "model": {
            "type": "decoder",
            "vocab_size": config.vocab_size,
            "context_length": config.block_size,
            "bos_token_id": 0,  # the lesson starts generation from a newline
            "pad_token_id": 0,
            "eos_token_id": eos_token_id,
            "decoder": {
                "filename": graph_file,
                "head_size": config.head_size,
                "hidden_size": config.n_embd,
                "num_attention_heads": config.n_head,
                "num_key_value_heads": config.n_head,
                "num_hidden_layers": config.n_layer,
                "inputs": {
                    **{name: name for name in INPUT_NAMES},  # input_ids, attention_mask, position_ids
                    "past_key_names": PAST_NAME.format(layer="%d", kind="key"),
                    "past_value_names": PAST_NAME.format(layer="%d", kind="value"),
                },
                "outputs": {
                    "logits": LOGITS_NAME,
                    "present_key_names": PRESENT_NAME.format(layer="%d", kind="key"),
                    "present_value_names": PRESENT_NAME.format(layer="%d", kind="value"),
                },
            },
        },
        "search": {
            "do_sample": True,  # the lesson's sampling: temperature 1, no top-k/top-p cut
            "temperature": 1.0,
            "top_k": config.vocab_size,
            "top_p": 1.0,
            "max_length": config.block_size,
            "min_length": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,  # the graph concatenates: present = past + the new tokens
        },
    }


def write_genai_files(folder: Path, config, vocab: CharVocab, graph_file: str, text: str | None) -> list[Path]:
    """Writes `genai_config.json`, `tokenizer.json` (BPE form) and `tokenizer_config.json` into `folder`."""
    paths = [folder / name for name in (GENAI_CONFIG_FILE_NAME, FAST_TOKENIZER_FILE_NAME, TOKENIZER_CONFIG_FILE_NAME)]
    settings = genai_config(config, graph_file, rarest_id(vocab, text))
    paths[0].write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    fast_tokenizer(vocab, model="bpe").save(str(paths[1]))
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "padding_side": "left"}
    paths[2].write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
    return paths
