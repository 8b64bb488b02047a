"""What onnxruntime-genai reads beside the graph: `genai_config.json` and a tokenizer it can parse.

genai's `decoder` model type drives the exported graph through the same Hugging Face I/O names the export writes
(`past_key_values.%d.key` in, `present.%d.key` out), with its own KV-cache loop and search. Two things differ from
this package's engine:

- genai stops at `context_length` = `block_size` (prompt included): it has no sliding window, and a `max_length`
  above it is an error.
- genai needs an end-of-sequence id inside the vocabulary, and the lesson's model has none: the file names the
  character the training text uses least (`$`, once in Tiny Shakespeare), so generation stops early only if the
  model writes it.

The tokenizer. genai's `og.Tokenizer` is onnxruntime-extensions' reading of a `tokenizer.json` (0.18 checked). It
rejects the `WordLevel` model of the folder's own `tokenizer.json`, and it reads a `BPE` (one without a
SentencePiece decoder) as GPT-2's byte-level BPE, whatever the file's pre-tokenizer says: it maps each UTF-8 byte of
the text to a printable stand-in (space to `Ġ`, newline to `Ċ`, `a` to itself) and looks the stand-ins up in the
vocabulary. A plain character table therefore encoded "a b" as [39, -1, 40] (a stand-in it lacks comes out as -1),
and its `Split` regex, run on bytes, crashed on "é" (`basic_string_view::substr`). It ignores `normalizer` and the
model's `unk_token`, but follows `merges` and `added_tokens`. So `onnx/tokenizer.json` (`genai_tokenizer`) is a
byte-level BPE over `vocab.json`'s ids:

- a one-byte (ASCII) vocabulary character is its byte's stand-in; a longer one is an added token, which genai
  cuts out of the text whole before the byte-level pass.
- A character outside the vocabulary becomes the id of `unk_replacement` (a space), once per character: the core's
  opt-in `unk_policy="replace"`. genai cannot refuse the text with our message (the default policy), and dropping
  would join the words around the character silently; a space keeps them apart, and shows where it was when
  the ids are decoded. How: every other byte that can start a character is a stand-in for the replacement id,
  every continuation byte (0x80-0xBF) for an id just past the vocabulary, and one merge (merges pair ids, not
  strings) folds (replacement, continuation) into the replacement, so "é" (2 bytes) and "€" (3) give one space
  each. The replacement character is an added token too, so its id, which many stand-ins share, decodes to it.

No `<pad>` token (`genai_config.json` names genai's `pad_token_id`), so a literal "<pad>" is just text.
The `tokenizers` library reads the file with the same ids and text for an ASCII vocabulary (every shipped one); a
multi-byte vocabulary character that is itself a byte stand-in (é, for one) it gives another id.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from gpt_serve.chargpt.vocab import FAST_TOKENIZER_FILE_NAME, CharVocab
from gpt_serve.onnx_contract import INPUT_NAMES, LOGITS_NAME, PAST_NAME, PRESENT_NAME

GENAI_CONFIG_FILE_NAME = "genai_config.json"
TOKENIZER_CONFIG_FILE_NAME = "tokenizer_config.json"


def _byte_symbols() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (`bytes_to_unicode`): printable Latin-1 bytes stand for themselves,
    the others (control bytes, space, 0x7F-0xA0, 0xAD) for U+0100 onwards in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(256 + n) for n, b in enumerate(moved)}}


BYTE_SYMBOLS = _byte_symbols()  # BYTE_SYMBOLS[ord(" ")] == "Ġ", BYTE_SYMBOLS[ord("\n")] == "Ċ"


def rarest_id(vocab: CharVocab, text: str | None) -> int:
    """The id of the vocabulary character `text` uses least (ties: the later id); the last id without text."""
    if not text:
        return len(vocab) - 1
    counts = Counter(text)
    return min(reversed(range(len(vocab))), key=lambda i: counts[vocab.chars[i]])


def genai_search(config, defaults: dict) -> dict:
    """genai's sampling: the folder's defaults (`read_generation_defaults` of its generation_config.json, as the
    servers read them), else the lesson's (temperature 1, no top-k/top-p cut). Temperature 0 is genai's greedy
    search; top_k 0 (no cut) is the whole vocabulary."""
    temperature = float(defaults.get("temperature", 1.0))
    top_k = int(defaults.get("top_k") or 0)
    return {
        "do_sample": temperature > 0,
        "temperature": temperature if temperature > 0 else 1.0,  # genai's greedy ignores it; 0 is not a valid value
        "top_k": top_k if 0 < top_k < config.vocab_size else config.vocab_size,
        "top_p": float(defaults.get("top_p", 1.0)),
    }


def genai_config(config, graph_file: str, eos_token_id: int, defaults: dict | None = None) -> dict:
    """onnxruntime-genai's description of the exported decoder (`config`: the model's `CharGPTConfig`; `defaults`:
    the folder's sampling defaults, `genai_search`)."""
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
            **genai_search(config, defaults or {}),
            "max_length": config.block_size,
            "min_length": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,  # the graph concatenates: present = past + the new tokens
        },
    }


def genai_tokenizer(vocab: CharVocab) -> dict:
    """`vocab` as the byte-level BPE `tokenizer.json` onnxruntime-genai reads (see the module docstring).

    genai encodes each vocabulary character to its `vocab` id and decodes the ids back to the text; a character
    outside the vocabulary becomes `vocab.unk_replacement`'s id, once per character (the `"replace"` policy).
    """
    replacement = vocab.stoi[vocab.unk_replacement]
    continuation = len(vocab)  # the first id past the vocabulary: never left over after the merge below
    table = {BYTE_SYMBOLS[ord(c)]: i for c, i in vocab.stoi.items() if ord(c) < 128}
    for byte, symbol in BYTE_SYMBOLS.items():  # the bytes no vocabulary character is: lead bytes and other ASCII
        table.setdefault(symbol, continuation if 0x80 <= byte < 0xC0 else replacement)
    # Merges pair ids, not strings: this one merge folds every (replacement, continuation) pair into the
    # replacement. 0xC0 0x80 is not UTF-8, so the merged key is no character's.
    merge = [BYTE_SYMBOLS[0xC0], BYTE_SYMBOLS[0x80]]
    table[merge[0] + merge[1]] = replacement
    added = [vocab.unk_replacement, *(c for c in vocab.chars if ord(c) >= 128 and c != vocab.unk_replacement)]
    stand_ins = set(BYTE_SYMBOLS.values())
    for c in added:  # `tokenizers` keeps an added token's id only where the model's vocabulary has its text
        if c not in stand_ins:
            table[c] = vocab.stoi[c]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": vocab.stoi[c],
                "content": c,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": False,
            }
            for c in added
        ],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": dict(sorted(table.items(), key=lambda item: (item[1], item[0]))),
            "merges": [merge],
        },
    }


def write_genai_files(
    folder: Path, config, vocab: CharVocab, graph_file: str, text: str | None, defaults: dict | None = None
) -> list[Path]:
    """Writes `genai_config.json` (its search from `defaults`, the model folder's: `genai_search`) and the tokenizer
    files (`write_genai_tokenizer`) into `folder`."""
    path = folder / GENAI_CONFIG_FILE_NAME
    settings = genai_config(config, graph_file, rarest_id(vocab, text), defaults)
    path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    return [path, *write_genai_tokenizer(folder, vocab)]


def write_genai_tokenizer(folder: Path, vocab: CharVocab) -> list[Path]:
    """Writes `tokenizer.json` (`genai_tokenizer`) and `tokenizer_config.json` into `folder`."""
    paths = [folder / FAST_TOKENIZER_FILE_NAME, folder / TOKENIZER_CONFIG_FILE_NAME]
    paths[0].write_text(json.dumps(genai_tokenizer(vocab), ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    # genai maps this class to its BPE; no cleanup of spaces around punctuation when decoding.
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    paths[1].write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
    return paths
