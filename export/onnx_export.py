"""Writing the ONNX graphs: each wrapper of `export.decoders` traced with the TorchScript-based exporter (why that
one: docs/export.md), rewritten by `export.graph_rewrites`, and saved with its metadata in one write.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
import tempfile
import warnings
from pathlib import Path

import onnx
import torch

from gpt_serve import __version__
from gpt_serve.chargpt.modeling_chargpt import CharGPTForCausalLM
from gpt_serve.chargpt.vocab import CharVocab
from gpt_serve.onnx_contract import (
    BLOCK_SIZE_KEY,
    EXPORTER_VERSION_KEY,
    FORMAT_KEY,
    FORMAT_VERSION_KEY,
    HEAD_SIZE_KEY,
    INPLACE_FORMAT,
    INPLACE_INPUT_NAMES,
    INPUT_NAMES,
    LOGITS_NAME,
    N_HEAD_KEY,
    N_LAYER_KEY,
    ONNX_FORMAT,
    ONNX_FORMAT_VERSION,
    VOCAB_SHA256_KEY,
    VOCAB_SIZE_KEY,
    WEIGHTS_SHA256_KEY,
    cache_names,
    past_names,
    present_names,
)

from .decoders import (
    INPLACE_ATTENTION,
    DecoderInPlace,
    DecoderWithPast,
    dynamic_axes,
    example_inputs,
    inplace_dynamic_axes,
    inplace_example_inputs,
)
from .graph_rewrites import inplace_output_shapes, static_reshapes

# Opset 17 is the first with a LayerNormalization op (one node instead of seven per LayerNorm) and is read by
# every ONNX Runtime since 1.11. Fixed so that a re-export gives the same graph.
OPSET = 17
EXPORTER = "torchscript"
EXPORTER_VERSION = f"gpt_serve.export {__version__}"


@contextlib.contextmanager
def traced_attention(model: CharGPTForCausalLM, implementation: str = "eager"):
    """While exporting, the model runs the attention `implementation` of transformers' registry: the lesson's
    attention written out (`"eager"`) for the Hugging Face layout graph, `INPLACE_ATTENTION` for the in-place one.

    Traced, it is six ONNX nodes with a constant scale (MatMul, Mul, Add, Softmax, MatMul, and the key's
    Transpose), which ONNX Runtime fuses. The SDPA path would trace to `aten::scaled_dot_product_attention`, whose
    translation derives the scale from the query's runtime shape (seven scalar nodes per layer, not folded while
    the batch and sequence dims are dynamic), and transformers' SDPA wrapper adds a runtime-shaped Reshape per
    layer: at batch 1 a decode step is a few hundred tiny nodes, so each one costs (docs/benchmarks.md, "Figures
    behind design choices"). Same math, checked by `export.validate`.
    """
    previous = model.config._attn_implementation
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def export_fp32(model: CharGPTForCausalLM, path: Path, values: dict[str, str], opset: int = OPSET) -> None:
    """Traces `model` (fp32, eval mode) into the KV-cache decoder graph, makes its head reshapes static
    (`static_reshapes`) and writes it to `path` with the metadata `values`, in one write."""
    n_layer = model.config.n_layer
    inputs, outputs = [*INPUT_NAMES, *past_names(n_layer)], [LOGITS_NAME, *present_names(n_layer)]
    _trace(model, DecoderWithPast, example_inputs(model), inputs, outputs, dynamic_axes(n_layer), path, values, opset)


def export_inplace_fp32(model: CharGPTForCausalLM, path: Path, values: dict[str, str], opset: int = OPSET) -> None:
    """`export_fp32` for the in-place decode graph (`DecoderInPlace`); `values` should name `INPLACE_FORMAT`."""
    n_layer = model.config.n_layer
    inputs, outputs = [*INPLACE_INPUT_NAMES, *cache_names(n_layer)], [LOGITS_NAME, *present_names(n_layer)]
    axes = inplace_dynamic_axes(n_layer)
    example = inplace_example_inputs(model)
    fix = functools.partial(inplace_output_shapes, n_layer=n_layer, vocab_size=model.config.vocab_size)
    _trace(model, DecoderInPlace, example, inputs, outputs, axes, path, values, opset, fix, INPLACE_ATTENTION)


# What torch's C++ side writes to stderr (not Python warnings) while it traces, expected here: one line per
# `GroupQueryAttention` node of the in-place graph, which ONNX has no shape function for. `_inplace_output_shapes`
# names its outputs' shapes instead, and `export.validate` checks the graph by running it.
KNOWN_NATIVE_WARNINGS = ("The shape inference of com.microsoft::GroupQueryAttention type is missing",)


@contextlib.contextmanager
def without_native_lines(known: tuple[str, ...]):
    """Whatever is written to file descriptor 2 while the block runs (C++ code included) reaches stderr after it,
    except the lines that hold one of `known`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode("utf-8", "replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not any(k in line for k in known)))
            sys.stderr.flush()


def _trace(
    model,
    wrapper,
    example,
    input_names,
    output_names,
    axes,
    path: Path,
    values,
    opset: int,
    fix=None,
    attention="eager",
) -> None:
    model = model.float().eval()
    with warnings.catch_warnings(), traced_attention(model, attention), without_native_lines(KNOWN_NATIVE_WARNINGS):
        # Expected: the exporter's deprecation notice, and tracer warnings about the model's input checks
        # (`if bool(...)`) being frozen. The frozen branches are the general ones (see the module docstring).
        warnings.simplefilter("ignore")
        traced = io.BytesIO()
        torch.onnx.export(
            # .eval(): the exporter restores the wrapper's mode afterwards, and a fresh Module is in training mode,
            # which would switch the model's dropout back on for everything after the export (the parity check)
            wrapper(model).eval(),
            example,
            traced,
            dynamo=False,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=axes,
            opset_version=opset,
            do_constant_folding=True,
        )
    proto = onnx.load_from_string(traced.getvalue())
    if fix is not None:
        fix(proto)
    static_reshapes(proto)
    set_metadata(proto, values)
    onnx.save(proto, str(path))


def metadata(
    model: CharGPTForCausalLM,
    vocab: CharVocab,
    weights: str,
    source_sha256: str | None,
    opset: int = OPSET,
    inplace: bool = False,
) -> dict[str, str]:
    """What a runtime needs to refuse a mismatched model folder, and where the file came from.

    `source_sha256` is the sha256 of the `model.safetensors` the graph was exported from (None: not from a file);
    `inplace`: for the in-place decode graph (its own format name).
    """
    config = model.config
    if config.vocab_size != len(vocab):
        raise ValueError(f"the model has {config.vocab_size} token rows but the vocabulary {len(vocab)} characters")
    return {
        FORMAT_KEY: INPLACE_FORMAT if inplace else ONNX_FORMAT,
        FORMAT_VERSION_KEY: ONNX_FORMAT_VERSION,
        EXPORTER_VERSION_KEY: EXPORTER_VERSION,
        "exporter": EXPORTER,
        "torch_version": torch.__version__,
        "opset": str(opset),
        "weights": weights,
        "model_type": config.model_type,
        BLOCK_SIZE_KEY: str(config.block_size),
        VOCAB_SIZE_KEY: str(config.vocab_size),
        VOCAB_SHA256_KEY: vocab.sha256,
        WEIGHTS_SHA256_KEY: source_sha256 or "",
        N_LAYER_KEY: str(config.n_layer),
        N_HEAD_KEY: str(config.n_head),
        HEAD_SIZE_KEY: str(config.head_size),
        "n_embd": str(config.n_embd),
    }


def set_metadata(proto: onnx.ModelProto, values: dict[str, str]) -> None:
    """Replaces the `metadata_props` of `proto` with `values` and names gpt_serve as its producer."""
    del proto.metadata_props[:]
    for key, value in values.items():
        proto.metadata_props.add(key=key, value=value)
    proto.producer_name, proto.producer_version = "gpt_serve.export", __version__


def write_metadata(path: Path, values: dict[str, str]) -> None:
    """Replaces the `metadata_props` of the ONNX file at `path` with `values`."""
    proto = onnx.load(str(path))
    set_metadata(proto, values)
    onnx.save(proto, str(path))
