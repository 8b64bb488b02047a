"""The floor of a cached decode step: its weight matrix products alone, then with its KV-cache copy.

    python benchmarks/decode_floor.py                  # lesson-size shapes, 2 threads, batch 1
    python benchmarks/decode_floor.py --threads 1 --n-embd 192 --n-layer 4 --n-head 6 --past 80
    python benchmarks/decode_floor.py --n-embd 192 --n-layer 4 --rows 1 16    # the shipped model's, 1 and 16 rows

A cached decode step multiplies one row by every weight matrix of the model (per layer: qkv, the attention
projection, the two feed-forward matrices), so its speed is bounded by how fast those matrices stream from memory.
This script times exactly those products, with random weights that do not fit in the CPU cache together:

- PyTorch `F.linear` (the (out, in) layout of `nn.Linear`);
- PyTorch `DecodeLinear` (`gpt_serve.generation.backends.torch_decode`), what the PyTorch engine decodes with:
  oneDNN's linear kernel on the weight packed once, at every row count;
- PyTorch blocked bmm (`DecodeLinear(chunks=4, max_rows=8)`): a batched product over 4 blocks of the weight up to
  8 rows (oneDNN past that), an earlier path of the engine;
- ONNX Runtime: a graph of nothing but the same MatMuls (no attention, no KV cache, no other nodes), fp32;
- ONNX Runtime: the same MatMuls plus, per layer, the two `Concat`s a Hugging Face-style decoder graph makes at
  every step (`present.{i}.key/.value` = the whole `past_key_values.{i}.*` followed by the new row), at a cache
  of `--past` positions. An fp32 graph that keeps that I/O contract does all this work and more: its ceiling.

Prints milliseconds per step, and the tokens/s ceiling that implies. With `--rows`, the products of that many rows
at once (a batched step: (rows, 1, in) activations, the KV Concats' caches `rows` deep too), once per count. The
ONNX Runtime graphs run through IO binding, as `OnnxBackend` runs its model, taking turns over 3 rounds; each
figure is the median of its rounds.
Not a test: numbers depend on the machine and its load.
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

from gpt_serve.generation.backends.torch_decode import DecodeLinear


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


def torch_floors(shapes, repeats: int, batch: int = 1) -> dict[str, float]:
    linears = [torch.nn.Linear(i, o) for i, o in shapes]
    rows = {i: torch.randn(batch, 1, i) for i, _ in shapes}
    fast = [DecodeLinear(linear) for linear in linears]
    blocked = [DecodeLinear(linear, chunks=4, max_rows=8) for linear in linears]
    with torch.inference_mode():
        plain = per_call_ms(lambda: [F.linear(rows[m.in_features], m.weight, m.bias) for m in linears], repeats)
        decode = per_call_ms(lambda: [m(rows[m.in_features]) for m in fast], repeats)
        bmm = per_call_ms(lambda: [m(rows[m.in_features]) for m in blocked], repeats)
    return {"PyTorch F.linear": plain, "PyTorch DecodeLinear": decode, "PyTorch blocked bmm": bmm}


def onnx_matmuls(shapes, kv: tuple[int, int, int] | None = None, seed: int = 0, batch: int = 1) -> bytes:
    """A graph of the decode step's weight products; with `kv = (n_head, head_size, past)` also each layer's two
    KV-cache Concats, past (batch, n_head, past, head_size) + the new row -> present (batch, n_head, past + 1,
    head_size)."""
    rng = np.random.default_rng(seed)
    inputs = {f"x{i}": [batch, 1, i] for i, _ in shapes}
    nodes, weights, outputs = [], [], {}
    for k, (i, o) in enumerate(shapes):
        weights.append(numpy_helper.from_array(rng.standard_normal((i, o)).astype(np.float32), f"w{k}"))
        nodes.append(helper.make_node("MatMul", [f"x{i}", f"w{k}"], [f"y{k}"]))
        outputs[f"y{k}"] = [batch, 1, o]
    if kv is not None:
        n_head, head_size, past = kv
        inputs["new"] = [batch, n_head, 1, head_size]
        for j in range(2 * (len(shapes) // 4)):  # a key and a value per layer
            inputs[f"past{j}"] = [batch, n_head, past, head_size]
            nodes.append(helper.make_node("Concat", [f"past{j}", "new"], [f"present{j}"], axis=2))
            outputs[f"present{j}"] = [batch, n_head, past + 1, head_size]
    graph = helper.make_graph(
        nodes,
        "decode_floor",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, d) for n, d in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, d) for n, d in outputs.items()],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def onnx_step(graph: bytes, threads: int):
    """A callable that runs `graph` once on random inputs through IO binding, outputs allocated by ONNX Runtime."""
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    rng = np.random.default_rng(1)
    for arg in session.get_inputs():
        binding.bind_cpu_input(arg.name, rng.standard_normal(arg.shape).astype(np.float32))
    for arg in session.get_outputs():
        binding.bind_output(arg.name, "cpu")
    return lambda: session.run_with_iobinding(binding)


def onnx_floors(
    shapes, threads: int, repeats: int, kv: tuple[int, int, int], rounds: int = 3, batch: int = 1
) -> dict[str, float]:
    graphs = {
        "ONNX Runtime MatMul only": onnx_matmuls(shapes, batch=batch),
        f"ONNX Runtime + KV Concat, past {kv[2]}": onnx_matmuls(shapes, kv, batch=batch),
    }
    # One session alive at a time: an idle session's thread pool would still spin beside the one being timed.
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, graph in graphs.items():
            times[name].append(per_call_ms(onnx_step(graph, threads), repeats))
    return {name: float(np.median(t)) for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-embd", type=int, default=384)
    parser.add_argument("--n-layer", type=int, default=6)
    parser.add_argument("--n-head", type=int, default=6)
    parser.add_argument(
        "--past",
        type=int,
        default=160,
        help="KV cache positions for the Concat row (default 160: the mean cache length of onnx_generation.py's "
        "in-window run on the lesson-size model, 64 -> 256)",
    )
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument(
        "--rows", type=int, nargs="+", default=[1], help="rows decoded at once, one measurement per count (default 1)"
    )
    args = parser.parse_args(argv)
    if args.n_embd % args.n_head:
        parser.error(f"--n-embd {args.n_embd} is not a multiple of --n-head {args.n_head}")
    if min(args.rows) < 1:
        parser.error(f"--rows must be >= 1, got {min(args.rows)}")
    torch.set_num_threads(args.threads)
    shapes = layer_shapes(args.n_embd, args.n_layer)
    megabytes = sum(i * o for i, o in shapes) * 4 / 1e6
    kv = (args.n_head, args.n_embd // args.n_head, args.past)
    print(
        f"{len(shapes)} weight matrices ({megabytes:.1f} MB fp32), {args.threads} threads, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start"
    )
    for batch in args.rows:
        results = torch_floors(shapes, args.repeats, batch)
        results.update(onnx_floors(shapes, args.threads, args.repeats, kv, batch=batch))
        print(f"batch {batch}:")
        for name, ms in results.items():
            print(f"  {name:36s} {ms:6.3f} ms per step   (ceiling {batch * 1e3 / ms:6.0f} tok/s)")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
