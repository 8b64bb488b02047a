"""Writing the ONNX graphs: the KV-cache decoder in Hugging Face's layout (fp32), the in-place decode graph that
gpt-serve's ONNX backend runs (`DecoderInPlace`), their metadata, and the int8 copies.

Exporter choice: the TorchScript-based exporter (`torch.onnx.export(..., dynamo=False)`), on purpose. With the
pinned torch 2.13 both exporters produce a correct KV-cache decoder (see FIELD-NOTES), but this one
  - names the dynamic dimensions as we ask (`batch_size`, `sequence_length`, `past_sequence_length`); dynamo
    writes expressions (`s0 + s1`) for output dims that would need renaming afterwards;
  - writes one self-contained file, many times faster than dynamo (docs/benchmarks.md), which splits the weights
    into `model.onnx.data` by default, which is awkward to ship inside a wheel next to `config.json`.
The cost: tracing records the Python control flow taken for the example inputs. The model branches on its
inputs in two places (it drops an all-ones `attention_mask`, and chooses SDPA's `is_causal` when there is no
mask and no past), so the example is a left-padded batch with a non-empty past, which takes the general path
(explicit additive mask) that is correct for every input. `export.validate` then checks prefill (empty past)
and decode against PyTorch. The TorchScript exporter is deprecated upstream; when it goes, switch to dynamo here
and keep the validation as it is.
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

import numpy as np
import onnx
import onnx.numpy_helper
import torch
from torch import nn
from transformers.cache_utils import DynamicCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from gpt_serve import __version__
from gpt_serve.chargpt.modeling_chargpt import CharGPTForCausalLM, causal_bias, mask_positions
from gpt_serve.chargpt.vocab import CharVocab
from gpt_serve.onnx_contract import (
    ATTENTION_MASK_NAME,
    BLOCK_SIZE_KEY,
    CACHE_LENGTHS_NAME,
    EXPORTER_VERSION_KEY,
    FORMAT_KEY,
    FORMAT_VERSION_KEY,
    HEAD_SIZE_KEY,
    INPLACE_FORMAT,
    INPLACE_INPUT_NAMES,
    INPUT_IDS_NAME,
    INPUT_NAMES,
    LOGITS_NAME,
    N_HEAD_KEY,
    N_LAYER_KEY,
    ONNX_FORMAT,
    ONNX_FORMAT_VERSION,
    POSITION_IDS_NAME,
    VOCAB_SHA256_KEY,
    VOCAB_SIZE_KEY,
    WEIGHTS_SHA256_KEY,
    cache_names,
    past_names,
    present_names,
)

# Opset 17 is the first with a LayerNormalization op (one node instead of seven per LayerNorm) and is read by
# every ONNX Runtime since 1.11. Fixed so that a re-export gives the same graph.
OPSET = 17
EXPORTER = "torchscript"
EXPORTER_VERSION = f"gpt_serve.export {__version__}"

BATCH, SEQUENCE, PAST = "batch_size", "sequence_length", "past_sequence_length"
COLUMNS = "cache_columns"  # the in-place graph's cache width
TOTAL = f"{PAST} + {SEQUENCE}"  # Hugging Face's name for the attention mask and `present` length


def padding_bias(attention_mask: torch.Tensor, T: int, dtype) -> torch.Tensor:
    """Additive mask (B, 1, T, S) from a 2D key mask (B, S): causal and no attention to padding.

    Uses the dtype's finite minimum, not -inf: a padding query whose every key is masked gets a uniform (ignored)
    row instead of NaN.
    """
    S = attention_mask.shape[1]
    bias = causal_bias(T, S, attention_mask.device, dtype)  # (T, S)
    pad = attention_mask[:, None, None, :] == 0  # (B, 1, 1, S)
    return bias.masked_fill(pad, torch.finfo(dtype).min)


class DecoderWithPast(nn.Module):
    """`CharGPTForCausalLM` with its KV cache as flat tensors in and out, the form an ONNX graph carries.

    forward(input_ids (B, T), attention_mask (B, P + T), position_ids (B, T), *past) -> (logits (B, T, V), *present)
    with `past` = key, value of layer 0, key, value of layer 1, ... each (B, H, P, head_size), and `present` the
    same with P + T positions.

    The 2D padding mask becomes the model's additive 4D mask here (`padding_bias`: a causal Trilu, a Where on the
    padding), which the model uses as given: the few nodes this graph needs, where transformers' mask functions
    trace to a general index computation with its own Shape and Reshape nodes.
    """

    def __init__(self, model: CharGPTForCausalLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        n_layer = self.model.config.n_layer
        cache = DynamicCache(config=self.model.config)
        for i in range(n_layer):
            cache.update(past[2 * i], past[2 * i + 1], i)
        mask = padding_bias(attention_mask, input_ids.shape[1], self.model.dtype)  # (B, 1, T, P + T)
        input_ids = input_ids.masked_fill(attention_mask[:, -input_ids.shape[1] :] == 0, 0)  # a pad id: no embedding
        out = self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=position_ids, cache=cache, use_cache=True
        )
        present = []
        for layer in out.cache.layers[:n_layer]:
            present += [layer.keys, layer.values]  # each (B, H, P + T, head_size)
        return (out.logits, *present)


class _GroupQueryAttention(torch.autograd.Function):
    """ONNX Runtime's `com.microsoft.GroupQueryAttention` for the exporter, with PyTorch's reference of what it
    computes for the trace: causal attention of T new tokens per row over that row's cached tokens and themselves,
    the new keys/values written into the cache buffers at columns `seqlens_k[b] - T + 1 ..` (in place where the
    caller binds the outputs to the inputs' memory: `past_present_share_buffer`)."""

    @staticmethod
    def forward(ctx, query, key, value, past_key, past_value, seqlens_k, total, num_heads: int, scale: float):
        B, T, _ = query.shape
        hs = past_key.shape[-1]
        q, k, v = (t.view(B, T, num_heads, hs).transpose(1, 2) for t in (query, key, value))  # (B, H, T, hs)
        present_key, present_value, out = past_key.clone(), past_value.clone(), torch.empty_like(query)
        for b in range(B):
            end = int(seqlens_k[b]) + 1
            present_key[b, :, end - T : end], present_value[b, :, end - T : end] = k[b], v[b]
            keys, values = present_key[b, :, :end], present_value[b, :, :end]
            mask = causal_bias(T, end, query.device, query.dtype)
            weights = torch.softmax((q[b] @ keys.transpose(-2, -1)) * scale + mask, dim=-1)
            out[b] = (weights @ values).transpose(0, 1).reshape(T, -1)
        return out, present_key, present_value

    @staticmethod
    def symbolic(g, query, key, value, past_key, past_value, seqlens_k, total, num_heads: int, scale: float):
        return g.op(
            "com.microsoft::GroupQueryAttention",
            query,
            key,
            value,
            past_key,
            past_value,
            seqlens_k,
            total,
            num_heads_i=num_heads,
            kv_num_heads_i=num_heads,
            scale_f=scale,
            outputs=3,
        )


class _InPlaceCache:
    """For `DecoderInPlace`: the `Cache` API part a block calls (it hands each layer's new keys/values on to the
    attention as they are: the attention writes them into the cache itself), and what `inplace_attention` reads,
    passed to it by the blocks as a keyword argument: the cache buffers, each row's last column, the total
    length, and each layer's updated buffers (`present`)."""

    def __init__(self, cache, seqlens_k, total):
        self.cache, self.seqlens_k, self.total = cache, seqlens_k, total
        self.present: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key, value, layer_idx, *args, **kwargs):
        return key, value

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


def inplace_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, *, inplace, **kwargs):
    """The attention kernel `DecoderInPlace` traces (registered as `INPLACE_ATTENTION`): one `_GroupQueryAttention`
    per layer over the buffers of `inplace` (an `_InPlaceCache`), in the registry's (B, T, H, hs) output layout."""
    B, _, T, _ = query.shape
    i, state = module.layer_idx, inplace
    q, k, v = (t.transpose(1, 2).reshape(B, T, -1) for t in (query, key, value))  # (B, T, H * hs)
    out, *state.present[i] = _GroupQueryAttention.apply(
        q, k, v, state.cache[2 * i], state.cache[2 * i + 1], state.seqlens_k, state.total, module.n_head, scaling
    )
    return out.view(B, T, module.n_head, -1), None


INPLACE_ATTENTION = "gpt_serve_export_inplace"
ALL_ATTENTION_FUNCTIONS.register(INPLACE_ATTENTION, inplace_attention)


class DecoderInPlace(nn.Module):
    """`CharGPTForCausalLM` on T new tokens per row over a cache that ONNX Runtime updates in place.

    forward(input_ids (B, T), position_ids (B, T), cache_lengths (B,), *cache) -> (logits (B, V), *present)
    with `cache` = key, value of layer 0, key, value of layer 1, ... each (B, H, C, head_size), row b's keys in
    columns `[0, cache_lengths[b])` (C: the buffers' width, at least `cache_lengths[b] + T`; the other columns are
    never read), `logits` those of each row's last new token, and `present` the same buffers with the new tokens'
    keys/values written from column `cache_lengths[b]`. Bound to the inputs' memory (`OnnxInPlaceBatch` does), the
    outputs are the inputs: nothing is copied. T = 1 is a decode step; a prompt is a prefill with cache_lengths 0.

    Why a second graph: the Hugging Face layout returns `present = Concat(past, new)`, so every decode step copies
    every row's whole cache (a quarter of a 16-row decode step of the shipped model, by ONNX Runtime's profiler).
    Here each layer's attention is one ONNX Runtime `GroupQueryAttention` node (its fused CPU kernel, with as many
    key/value heads as query heads), which reads each row's own columns where they are and writes the new ones in
    place, as onnxruntime-genai's decoders do with `past_present_share_buffer`. The same numbers as the model up to
    float rounding (`export.validate.compare_inplace_with_torch`). The blocks are the model's own; only the
    attention kernel and the cache object are swapped in. ONNX Runtime only: other runtimes read the Hugging Face
    layout graph.
    """

    def __init__(self, model: CharGPTForCausalLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, cache_lengths, *cache):
        m = self.model
        B, T = input_ids.shape
        seqlens_k = (cache_lengths + T - 1).to(torch.int32)  # each row's last column after this call (0-based)
        total = (cache_lengths.max() + T).to(torch.int32)
        state = _InPlaceCache(cache, seqlens_k, total)
        body = m.model
        x = body.drop(body.token_embedding_table(input_ids) + body.position_embedding_table(position_ids))
        for block in body.blocks:  # the attention is `inplace_attention` (`_trace` sets it), reading `state`
            x = block(x, attention_mask=None, cache=state, inplace=state)
        logits = m.lm_head(body.ln_f(x[:, -1:]))[:, -1]  # (B, V): the last new token's
        return (logits, *(t for i in range(len(body.blocks)) for t in state.present[i]))


def inplace_example_inputs(model: CharGPTForCausalLM) -> tuple[torch.Tensor, ...]:
    """Tracing inputs for `DecoderInPlace`: 2 rows of 2 new tokens on 3 and 1 cached ones in a 6-column cache."""
    config = model.config
    B, C, T = 2, 6, 2
    input_ids = torch.arange(B * T).reshape(B, T) % config.vocab_size
    lengths = torch.tensor([3, 1])
    cache = [torch.zeros(B, config.n_head, C, config.head_size) for _ in range(2 * config.n_layer)]
    return (input_ids, lengths[:, None] + torch.arange(T), lengths, *cache)


def inplace_dynamic_axes(n_layer: int) -> dict[str, dict[int, str]]:
    axes = {name: {0: BATCH, 1: SEQUENCE} for name in (INPUT_IDS_NAME, POSITION_IDS_NAME)}
    axes.update({name: {0: BATCH} for name in (CACHE_LENGTHS_NAME, LOGITS_NAME)})
    axes.update({name: {0: BATCH, 2: COLUMNS} for name in (*cache_names(n_layer), *present_names(n_layer))})
    return axes


def example_inputs(model: CharGPTForCausalLM) -> tuple[torch.Tensor, ...]:
    """Tracing inputs that take the model's general path: 2 rows, the second left-padded, 2 cached + 2 new."""
    config = model.config
    B, P, T = 2, 2, 2
    input_ids = torch.arange(B * T).reshape(B, T) % config.vocab_size
    attention_mask = torch.ones(B, P + T, dtype=torch.long)
    attention_mask[1, :1] = 0  # left padding: keeps the mask (an all-ones mask would be dropped while tracing)
    position_ids = mask_positions(attention_mask, T)
    past = [torch.zeros(B, config.n_head, P, config.head_size) for _ in range(2 * config.n_layer)]
    return (input_ids, attention_mask, position_ids, *past)


def dynamic_axes(n_layer: int) -> dict[str, dict[int, str]]:
    axes = {
        INPUT_IDS_NAME: {0: BATCH, 1: SEQUENCE},
        ATTENTION_MASK_NAME: {0: BATCH, 1: TOTAL},
        POSITION_IDS_NAME: {0: BATCH, 1: SEQUENCE},
        LOGITS_NAME: {0: BATCH, 1: SEQUENCE},
    }
    axes.update({name: {0: BATCH, 2: PAST} for name in past_names(n_layer)})
    axes.update({name: {0: BATCH, 2: TOTAL} for name in present_names(n_layer)})
    return axes


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
    fix = functools.partial(_inplace_output_shapes, n_layer=n_layer, vocab_size=model.config.vocab_size)
    _trace(model, DecoderInPlace, example, inputs, outputs, axes, path, values, opset, fix, INPLACE_ATTENTION)


def _inplace_output_shapes(proto: onnx.ModelProto, n_layer: int, vocab_size: int) -> None:
    """The in-place graph's output shapes: `logits` (batch_size, vocab) and each `present.*` its `cache.*` input's
    (ONNX has no shape function for ONNX Runtime's GroupQueryAttention, so nothing after it gets named dims)."""
    inputs = {i.name: i for i in proto.graph.input}
    cache_of = dict(zip(present_names(n_layer), cache_names(n_layer), strict=True))
    for output in proto.graph.output:
        shape = output.type.tensor_type.shape
        if output.name == LOGITS_NAME:
            del shape.dim[:]
            shape.dim.add().dim_param = BATCH
            shape.dim.add().dim_value = vocab_size
        else:
            shape.CopyFrom(inputs[cache_of[output.name]].type.tensor_type.shape)


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


def static_reshapes(proto: onnx.ModelProto) -> int:
    """Rewrites the per-layer head split/merge Reshapes to constant target shapes; returns how many.

    The tracer writes `x.view(B, T, n_head, head_size)` as a Reshape whose target is computed at run time from
    the input's shape (Shape, Gather, Unsqueeze, Concat: about nine scalar nodes per layer, which ONNX Runtime
    cannot fold because batch and sequence are dynamic). In those targets, batch and sequence come from a tensor
    with the same leading dims as the Reshape's input, and the other dims are static: ONNX's `0` ("copy this
    input dim") says the same without computing anything, `[0, 0, n_head, head_size]` and `[0, 0, n_embd]`. The
    then-unused shape nodes are removed. `export.validate` checks the result against PyTorch.
    """
    graph = proto.graph
    producer = {out: node for node in graph.node for out in node.output}
    constants = {init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            constants[node.output[0]] = onnx.numpy_helper.to_array(node.attribute[0].t)

    inferred = onnx.shape_inference.infer_shapes(proto).graph
    static_dims = {}  # tensor name -> its dims, an int where shape inference knows it
    for info in (*inferred.value_info, *inferred.input, *inferred.output):
        dims = info.type.tensor_type.shape.dim
        static_dims[info.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]

    def shape_dim(name: str) -> tuple[str, int] | None:
        """For `name` = Unsqueeze(Gather(Shape(x), i)): ("value", n) when dim i of x is statically n, else
        ("dim", i); None for anything else."""
        unsqueeze = producer.get(name)
        if unsqueeze is None or unsqueeze.op_type != "Unsqueeze":
            return None
        gather = producer.get(unsqueeze.input[0])
        if gather is None or gather.op_type != "Gather" or gather.input[1] not in constants:
            return None
        shape, index = producer.get(gather.input[0]), constants[gather.input[1]]
        if shape is None or shape.op_type != "Shape" or index.size != 1:
            return None
        i = int(index)
        dims = static_dims.get(shape.input[0], [])
        return ("value", dims[i]) if i < len(dims) and dims[i] else ("dim", i)

    rewritten = 0
    for node in graph.node:
        concat = producer.get(node.input[1]) if node.op_type == "Reshape" else None
        if concat is None or concat.op_type != "Concat":
            continue
        target = []
        for position, part in enumerate(concat.input):
            dim = shape_dim(part)
            if part in constants and constants[part].size == 1:
                target.append(int(constants[part].reshape(())))
            elif dim is not None and dim[0] == "value":
                target.append(dim[1])
            elif dim == ("dim", position) and position < 2:
                target.append(0)  # batch or sequence: copy the input's own dim
            else:
                break
        else:
            name = f"{node.name}/static_shape"
            graph.initializer.append(onnx.numpy_helper.from_array(np.array(target, dtype=np.int64), name))
            node.input[1] = name
            rewritten += 1
    _drop_dead_nodes(graph)
    return rewritten


def _drop_dead_nodes(graph: onnx.GraphProto) -> None:
    needed = {out.name for out in graph.output}
    keep = []
    for node in reversed(graph.node):
        if any(out in needed for out in node.output):
            keep.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(keep))


def quantize_int8(src: Path, dst: Path) -> None:
    """Weight-only int8: every MatMul weight (in, out) stored as int8 with one fp32 scale per output column
    (symmetric, zero point 0), read through a `DequantizeLinear` node; activations are not quantized in the file.

    A quarter of the fp32 file. ONNX Runtime fuses each pair into its int8 `MatMulNBits` kernel (weights stay int8
    in memory, activations quantized per block of a row, so a row's result does not depend on the other rows); the
    in-browser page has onnxruntime-web fold them into fp32 weights at load, and `OnnxBackend(..., int8_compute=
    False)` does the same natively (see `onnx_session.session_options`). ONNX Runtime's dynamic quantization (one
    activation scale per tensor) was as fast but made a row's tokens depend on the batch and split the page's tokens
    from Python's at near ties: `benchmarks/int8_formats.py` compares the formats. The embedding tables (Gather) stay
    fp32 (under 3% of the weights).
    """
    model = onnx.load(str(src))
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    targets = []
    for node in graph.node:
        name = node.input[1] if node.op_type == "MatMul" and len(node.input) == 2 else None
        if name in weights and len(weights[name].dims) == 2 and name not in targets:
            targets.append(name)
    quantized, dequantize = [], []
    for name in targets:
        w = onnx.numpy_helper.to_array(weights[name]).astype(np.float32)  # (in, out)
        scale = np.abs(w).max(axis=0) / 127.0
        scale[scale == 0] = 1.0  # an all-zero column: any scale gives zeros
        q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
        quantized += [
            onnx.numpy_helper.from_array(q, f"{name}_quantized"),
            onnx.numpy_helper.from_array(scale.astype(np.float32), f"{name}_scale"),
            onnx.numpy_helper.from_array(np.zeros(scale.shape, dtype=np.int8), f"{name}_zero_point"),
        ]
        inputs = [f"{name}_quantized", f"{name}_scale", f"{name}_zero_point"]
        dequantize.append(onnx.helper.make_node("DequantizeLinear", inputs, [name], name=f"{name}_dequantize", axis=1))
    kept = [init for init in graph.initializer if init.name not in set(targets)]
    del graph.initializer[:]
    graph.initializer.extend(kept + quantized)
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(dequantize + nodes)  # the weights' producers first: the graph stays topologically sorted
    onnx.save(model, str(dst))


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
