"""The weight-streaming floor of a cached decode step: the weight matrix products alone, batch 1.

    python benchmarks/decode_floor.py                  # lesson-size shapes, 2 threads
    python benchmarks/decode_floor.py --threads 1 --n-embd 192 --n-layer 4

A cached decode step multiplies one row by every weight matrix of the model (per layer: qkv, the attention
projection, the two feed-forward matrices), so its speed is bounded by how fast those matrices stream from memory.
This script times exactly those products, with random weights that do not fit in the CPU cache together:

- PyTorch `F.linear` (the (out, in) layout of `nn.Linear`);
- PyTorch `DecodeLinear` (`gpt_serve.torch_backend`), the batched-product path the PyTorch engine decodes with;
- ONNX Runtime: a graph of nothing but the same MatMuls (no attention, no KV cache, no other nodes), fp32.

Prints milliseconds per token for all the matrices, and the tokens/s ceiling that implies. Not a test: numbers
depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

from gpt_serve.torch_backend import DecodeLinear


def layer_shapes(n_embd: int, n_layer: int) -> list[tuple[int, int]]:
    """(in, out) of every weight matrix a decode step multiplies, lm_head aside (it is tiny)."""
    return [(n_embd, 3 * n_embd), (n_embd, n_embd), (n_embd, 4 * n_embd), (4 * n_embd, n_embd)] * n_layer


def per_call_ms(fn, repeats: int) -> float:
    for _ in range(5):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def torch_floors(shapes, repeats: int) -> dict[str, float]:
    linears = [torch.nn.Linear(i, o) for i, o in shapes]
    rows = {i: torch.randn(1, 1, i) for i, _ in shapes}
    fast = [DecodeLinear(linear) for linear in linears]
    with torch.inference_mode():
        plain = per_call_ms(lambda: [F.linear(rows[m.in_features], m.weight, m.bias) for m in linears], repeats)
        decode = per_call_ms(lambda: [m(rows[m.in_features]) for m in fast], repeats)
    return {"PyTorch F.linear": plain, "PyTorch DecodeLinear": decode}


def onnx_matmuls(shapes, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    inputs = {i: helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1, 1, i]) for i, _ in shapes}
    nodes, weights, outputs = [], [], []
    for k, (i, o) in enumerate(shapes):
        weights.append(numpy_helper.from_array(rng.standard_normal((i, o)).astype(np.float32), f"w{k}"))
        nodes.append(helper.make_node("MatMul", [f"x{i}", f"w{k}"], [f"y{k}"]))
        outputs.append(helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, [1, 1, o]))
    graph = helper.make_graph(nodes, "matmuls", list(inputs.values()), outputs, weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def onnx_floor(shapes, threads: int, repeats: int) -> float:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(onnx_matmuls(shapes), options, providers=["CPUExecutionProvider"])
    feeds = {f"x{i}": np.random.default_rng(1).standard_normal((1, 1, i)).astype(np.float32) for i, _ in shapes}
    return per_call_ms(lambda: session.run(None, feeds), repeats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-embd", type=int, default=384)
    parser.add_argument("--n-layer", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    shapes = layer_shapes(args.n_embd, args.n_layer)
    megabytes = sum(i * o for i, o in shapes) * 4 / 1e6
    results = torch_floors(shapes, args.repeats)
    results["ONNX Runtime MatMul only"] = onnx_floor(shapes, args.threads, args.repeats)
    print(
        f"{len(shapes)} weight matrices ({megabytes:.1f} MB fp32), batch 1, {args.threads} threads, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    for name, ms in results.items():
        print(f"  {name:26s} {ms:6.3f} ms per token   (ceiling {1e3 / ms:6.0f} tok/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
