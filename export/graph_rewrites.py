"""Rewrites of a traced ONNX graph: static head reshapes (`static_reshapes`), the in-place graph's output shapes,
and the int8 copy (`quantize_int8`: weight-only, one scale per output column). Each is checked afterwards by
`export.validate`; why each pays: docs/export.md and docs/benchmarks.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper

from gpt_serve.onnx_contract import LOGITS_NAME, cache_names, present_names

from .decoders import BATCH


def inplace_output_shapes(proto: onnx.ModelProto, n_layer: int, vocab_size: int) -> None:
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


class _ShapeFacts:
    """What `static_reshapes` reads of a graph: each tensor's producer, the constants' values, and each tensor's
    dims where shape inference knows them statically (None where it does not)."""

    def __init__(self, proto: onnx.ModelProto):
        graph = proto.graph
        self.producer = {out: node for node in graph.node for out in node.output}
        self.constants = {init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant":
                self.constants[node.output[0]] = onnx.numpy_helper.to_array(node.attribute[0].t)
        inferred = onnx.shape_inference.infer_shapes(proto).graph
        self.static_dims = {}  # tensor name -> its dims, an int where shape inference knows it
        for info in (*inferred.value_info, *inferred.input, *inferred.output):
            dims = info.type.tensor_type.shape.dim
            self.static_dims[info.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]

    def produced(self, name: str, op_type: str):
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def shape_dim(self, name: str) -> tuple[str, int] | None:
        """For `name` = Unsqueeze(Gather(Shape(x), i)): ("value", n) when dim i of x is statically n, else
        ("dim", i); None for anything else."""
        unsqueeze = self.produced(name, "Unsqueeze")
        gather = unsqueeze and self.produced(unsqueeze.input[0], "Gather")
        if gather is None or gather.input[1] not in self.constants:
            return None
        shape, index = self.produced(gather.input[0], "Shape"), self.constants[gather.input[1]]
        if shape is None or index.size != 1:
            return None
        i = int(index)
        dims = self.static_dims.get(shape.input[0], [])
        return ("value", dims[i]) if i < len(dims) and dims[i] else ("dim", i)

    def static_target(self, concat) -> list[int] | None:
        """The constant target shape that says what the run-time `concat` computes, or None where there is none:
        a constant or statically known dim as its value, the input's own batch or sequence dim as 0 (copy it)."""
        target = []
        for position, part in enumerate(concat.input):
            dim = self.shape_dim(part)
            if part in self.constants and self.constants[part].size == 1:
                target.append(int(self.constants[part].reshape(())))
            elif dim is not None and dim[0] == "value":
                target.append(dim[1])
            elif dim == ("dim", position) and position < 2:
                target.append(0)  # batch or sequence: copy the input's own dim
            else:
                return None
        return target


def static_reshapes(proto: onnx.ModelProto) -> int:
    """Rewrites the per-layer head split/merge Reshapes to constant target shapes; returns how many.

    The tracer writes `x.view(B, T, n_head, head_size)` as a Reshape whose target is computed at run time from the
    input's shape (Shape, Gather, Unsqueeze, Concat: about nine scalar nodes per layer, which ONNX Runtime cannot
    fold because batch and sequence are dynamic). In those targets batch and sequence come from a tensor with the
    same leading dims as the Reshape's input and the other dims are static, so ONNX's `0` ("copy this input dim")
    says the same without computing anything: `[0, 0, n_head, head_size]` and `[0, 0, n_embd]`. The then-unused
    shape nodes are removed.
    """
    graph, facts = proto.graph, _ShapeFacts(proto)
    rewritten = 0
    for node in graph.node:
        concat = facts.produced(node.input[1], "Concat") if node.op_type == "Reshape" else None
        target = None if concat is None else facts.static_target(concat)
        if target is not None:
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
