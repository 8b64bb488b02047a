"""The ONNX export's layout, named once: what the exporter (`python -m export`) writes and the runtime reads.

File names, graph inputs and outputs, metadata keys and format names, as plain constants and pure helpers (no
torch, transformers or onnxruntime), imported by both `export` and `gpt_serve.generation.backends.onnx_backend`.

The layout is Hugging Face's: the graphs live in `MODEL_DIR/onnx/` next to `config.json` and `vocab.json`, and a
decoder graph takes `input_ids`, `attention_mask`, `position_ids`, `past_key_values.{i}.key/.value` and returns
`logits`, `present.{i}.key/.value`. One graph serves prefill (an empty past) and decode; the browser,
onnxruntime-genai and other runtimes read it. Beside it, the export writes an in-place decode graph for ONNX
Runtime (`onnx/decoder_inplace*.onnx`), which takes `input_ids`, `position_ids`, `cache_lengths` and
`cache.{i}.key/.value` and returns `logits` and `present.{i}.key/.value` written into the `cache.*` buffers
(`gpt_serve.generation.backends.onnx_session.run_inplace`).
"""

from __future__ import annotations

import os
from pathlib import Path

# The graph files, in the model folder's `onnx/`.
ONNX_SUBDIR = "onnx"
FP32_FILE_NAME = "model.onnx"
INT8_FILE_NAME = "model_quantized.onnx"
INPLACE_FP32_FILE_NAME = "decoder_inplace.onnx"
INPLACE_INT8_FILE_NAME = "decoder_inplace_quantized.onnx"

# Graph inputs and outputs. The Hugging Face layout graph takes INPUT_NAMES then the past (`past_names`); the
# in-place graph takes INPLACE_INPUT_NAMES then its cache buffers (`cache_names`). Both return the logits, then
# the cache (`present_names`).
INPUT_IDS_NAME = "input_ids"
ATTENTION_MASK_NAME = "attention_mask"
POSITION_IDS_NAME = "position_ids"
CACHE_LENGTHS_NAME = "cache_lengths"
INPUT_NAMES = (INPUT_IDS_NAME, ATTENTION_MASK_NAME, POSITION_IDS_NAME)
INPLACE_INPUT_NAMES = (INPUT_IDS_NAME, POSITION_IDS_NAME, CACHE_LENGTHS_NAME)
LOGITS_NAME = "logits"
# The cache's input and output names (Hugging Face's decoder layout), by layer and kind ("key" or "value").
PAST_NAME = "past_key_values.{layer}.{kind}"
PRESENT_NAME = "present.{layer}.{kind}"
# The in-place graph's cache inputs: buffers with every row's keys/values at columns [0, cache_lengths[row]). Its
# outputs after the logits are `present_names`, the same buffers with the new tokens' columns written (bound to the
# inputs' memory, they are the inputs).
CACHE_NAME = "cache.{layer}.{kind}"

# Metadata stored in each graph file (`metadata_props`), all as strings. The exporter writes these and a few more
# for people (`export.onnx_export.metadata`); the runtime refuses a file that lacks one of REQUIRED_METADATA.
FORMAT_KEY = "format"  # ONNX_FORMAT, or INPLACE_FORMAT for the in-place graph
FORMAT_VERSION_KEY = "format_version"  # ONNX_FORMAT_VERSION
EXPORTER_VERSION_KEY = "exporter_version"
VOCAB_SHA256_KEY = "vocab_sha256"  # the sha256 of the vocabulary exported with (`CharVocab.sha256`)
WEIGHTS_SHA256_KEY = "weights_sha256"  # of the model.safetensors exported from; "" where not exported from a file
# The model's shapes, under the config's own names.
BLOCK_SIZE_KEY = "block_size"
VOCAB_SIZE_KEY = "vocab_size"
N_LAYER_KEY = "n_layer"
N_HEAD_KEY = "n_head"
HEAD_SIZE_KEY = "head_size"
ONNX_FORMAT = "chargpt-decoder-with-past"
INPLACE_FORMAT = "chargpt-decoder-inplace"
ONNX_FORMAT_VERSION = "1"
REQUIRED_METADATA = (
    FORMAT_KEY,
    FORMAT_VERSION_KEY,
    EXPORTER_VERSION_KEY,
    BLOCK_SIZE_KEY,
    VOCAB_SIZE_KEY,
    VOCAB_SHA256_KEY,
    N_LAYER_KEY,
    N_HEAD_KEY,
    HEAD_SIZE_KEY,
)
# config.json entries that must agree with the ONNX metadata (a stale export of an older architecture).
CONFIG_KEYS_CHECKED = (BLOCK_SIZE_KEY, VOCAB_SIZE_KEY, N_LAYER_KEY, N_HEAD_KEY)


def cache_names(n_layer: int) -> list[str]:
    """The in-place graph's cache inputs in graph order: cache.0.key, cache.0.value, cache.1.key, ..."""
    return [CACHE_NAME.format(layer=i, kind=kind) for i in range(n_layer) for kind in ("key", "value")]


def past_names(n_layer: int) -> list[str]:
    """Cache inputs in graph order: past_key_values.0.key, past_key_values.0.value, past_key_values.1.key, ..."""
    return [PAST_NAME.format(layer=i, kind=kind) for i in range(n_layer) for kind in ("key", "value")]


def present_names(n_layer: int) -> list[str]:
    """Cache outputs in graph order, matching `past_names`: present.0.key, present.0.value, ..."""
    return [PRESENT_NAME.format(layer=i, kind=kind) for i in range(n_layer) for kind in ("key", "value")]


def onnx_path(model_dir: str | os.PathLike, quantized: bool = False, inplace: bool = False) -> Path:
    """Where the fp32 (`onnx/model.onnx`) or int8 (`onnx/model_quantized.onnx`) graph of a model folder lives; with
    `inplace`, its in-place decode graph (`onnx/decoder_inplace.onnx`, `onnx/decoder_inplace_quantized.onnx`)."""
    if inplace:
        return Path(model_dir) / ONNX_SUBDIR / (INPLACE_INT8_FILE_NAME if quantized else INPLACE_FP32_FILE_NAME)
    return Path(model_dir) / ONNX_SUBDIR / (INT8_FILE_NAME if quantized else FP32_FILE_NAME)
