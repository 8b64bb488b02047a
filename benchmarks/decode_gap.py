"""A batched decode step against its floor: the weight products and the KV cache's bytes, beside each backend's step.

    python benchmarks/decode_gap.py --threads 2 --rows 1 16 64 256              # both sizes, every backend
    python benchmarks/decode_gap.py --size shipped --rows 1 16 --backends torch onnx-int8

For each model size (`shipped`: the shipped model, n_embd 192, 6 heads, 4 layers, block 128; `lesson`: the lesson's
10.8M architecture, 384/6/6, block 256, random weights, exported to ONNX in a temporary folder when an ONNX backend
is asked for) and each `--rows` count, one table row:

- the floor of a step = the weight products' time with the fastest kernel this CPU has for those shapes (the best of
  `decode_floor.py`'s PyTorch `F.linear`, PyTorch `DecodeLinear` and ONNX Runtime's MatMul-only graph, fp32, every
  weight matrix of every layer, lm_head aside) + the time to read attention's bytes once (the keys and values of
  every layer at `--past` positions for every row, fp32 as both backends keep their caches) at the read bandwidth
  measured at the start (`torch.sum` over a 256 MB fp32 tensor on `--threads` threads, best of 20);
- each backend's real step: its `DecodeBatch` (`new_batch`) holding `rows` rows of `--past` cached tokens each,
  stepped over and over at that position (the new column taken back each time, as `decode_batch.py` does), and the
  step as a multiple of the floor (the floor is fp32's: `onnx-int8` streams a quarter of the weight bytes, so where
  the weights dominate it can go under it);
- the torch step split: its weight products (`DecodeLinear` alone, as timed for the floor), its attention
  (PyTorch's fused kernel, as the step calls it, over views of the same shape of cache buffer, every layer), and the
  rest (the step minus both: embeddings, LayerNorms, residuals, lm_head, the cache write, the mask, Python).

Every figure is the median of `--rounds` rounds of `--repeats` calls. A script, not a test: numbers depend on the
machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)  # the repository's packages, not this folder's scripts

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.decode_batch import undoing_step  # noqa: E402
from benchmarks.decode_floor import layer_shapes, onnx_matmuls, onnx_step, torch_floors  # noqa: E402
from gpt_serve import CharGPTConfig, CharGPTForCausalLM, CharTokenizer  # noqa: E402
from gpt_serve.generation import load_backend  # noqa: E402
from gpt_serve.models import model_path  # noqa: E402

SIZES = {"shipped": "the shipped model (1.8M)", "lesson": "the lesson's 10.8M architecture (random weights)"}
BACKENDS = ("torch", "onnx", "onnx-int8")


def timed(fn, repeats: int, rounds: int) -> float:
    """Median ms per call of `fn` over `rounds` rounds of `repeats` calls, after a few calls of warm-up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        times.append((time.perf_counter() - start) / repeats * 1e3)
    return statistics.median(times)


def read_bandwidth(threads: int, megabytes: int = 256) -> float:
    """GB/s of `torch.sum` over a `megabytes` fp32 tensor (far past the CPU's caches), best of 20: on this machine the
    figure climbs over the first calls (the best of 6 ranged from 29 to 51 GB/s across runs, the best of 20 from 56
    to 61)."""
    torch.set_num_threads(threads)
    t = torch.ones(megabytes * 2**20 // 4)
    best = float("inf")
    for _ in range(20):
        start = time.perf_counter()
        t.sum()
        best = min(best, time.perf_counter() - start)
    return t.numel() * 4 / best / 1e9


def size_folder(size: str, backends: list[str], work: Path, data: str | None) -> Path:
    if size == "shipped":
        return model_path("shakespeare")
    from gpt_serve.folders.corpus import load_text

    text = load_text(data)
    if any(b != "torch" for b in backends):
        from benchmarks.onnx_generation import lesson_model_dir

        return lesson_model_dir(work, text)
    folder = work / "lesson-10.8M"  # torch alone: no export
    torch.manual_seed(0)
    CharGPTForCausalLM(CharGPTConfig(dropout=0.0)).save_pretrained(folder)
    CharTokenizer.from_corpus(text).save_pretrained(folder)
    return folder


def attention_ms(config, rows: int, past: int, repeats: int, rounds: int) -> float:
    """Every layer's fused attention of one query per row over `past + 1` keys, on views of a cache buffer shaped as
    `BatchKV`'s (max rows, heads, 2 x block, head size), no mask (no row is padded): the step's attention calls."""
    H, D = config.n_head, config.head_size
    shape = (rows, H, 2 * config.block_size, D)
    caches = [(torch.randn(shape), torch.randn(shape)) for _ in range(config.n_layer)]
    q = torch.randn(rows, H, 1, D)

    def attend():
        for k, v in caches:
            F.scaled_dot_product_attention(q, k[:, :, : past + 1], v[:, :, : past + 1], scale=D**-0.5)

    with torch.inference_mode():
        return timed(attend, repeats, rounds)


def products_ms(config, rows: int, threads: int, repeats: int, rounds: int) -> dict[str, float]:
    """The weight products of a step of `rows` rows with each kernel `decode_floor.py` times, ms."""
    shapes = layer_shapes(config.n_embd, config.n_layer)
    kernels = torch_floors(shapes, repeats * rounds, rows)
    step = onnx_step(onnx_matmuls(shapes, batch=rows), threads)
    kernels["ONNX Runtime MatMul"] = timed(step, repeats, rounds)
    del step  # its session's threads would spin beside the next timing
    return kernels


def backend_steps(folder: Path, key: str, rows_list: list[int], past: int, args) -> dict[int, float]:
    """ms per `DecodeBatch` step of `key` at each row count, every row at `past` cached tokens."""
    backend = load_backend(folder, key, args.threads).backend
    out = {}
    for rows in rows_list:
        batch = backend.new_batch(rows)
        ids = [1 + (j % 60) for j in range(past)]
        batch.add_rows([ids] * rows)
        step, tokens = undoing_step(batch), np.ones(rows, dtype=np.int64)
        out[rows] = timed(lambda step=step, tokens=tokens: step(tokens), args.repeats, args.rounds)
        del batch, step
    return out


def measure_size(size: str, args, bandwidth: float, work: Path) -> None:
    folder = size_folder(size, args.backends, work, args.data)
    torch.set_num_threads(args.threads)
    config = CharGPTConfig.from_pretrained(folder)
    past = args.past if args.past is not None else config.block_size // 2
    steps = {key: backend_steps(folder, key, args.rows, past, args) for key in args.backends}
    print(
        f"\n{SIZES[size]}: n_embd {config.n_embd}, {config.n_head} heads, {config.n_layer} layers, block "
        f"{config.block_size}; every row at {past} cached positions"
    )
    names = {"PyTorch F.linear": "F.linear", "PyTorch DecodeLinear": "DecodeLinear", "ONNX Runtime MatMul": "ORT"}
    names["PyTorch blocked bmm"] = "bmm"
    print(
        "| rows | products floor, ms (kernel) | KV read, MB | KV read, ms | floor, ms | "
        + " | ".join(f"{key} step, ms (x floor)" for key in args.backends)
        + " | torch: products / attention / rest, ms |"
    )
    print("|---:|---:|---:|---:|---:|" + "---:|" * len(args.backends) + "---|")
    for rows in args.rows:
        kernels = products_ms(config, rows, args.threads, args.repeats, args.rounds)
        best = min(kernels, key=kernels.get)
        kv_bytes = rows * config.n_layer * 2 * past * config.n_embd * 4
        kv_ms = kv_bytes / bandwidth / 1e6
        floor = kernels[best] + kv_ms
        cells = [f"{steps[key][rows]:.2f} ({steps[key][rows] / floor:.1f}x)" for key in args.backends]
        split = ""
        if "torch" in steps:
            products = kernels["PyTorch DecodeLinear"]
            attention = attention_ms(config, rows, past, args.repeats, args.rounds)
            split = f"{products:.2f} / {attention:.2f} / {steps['torch'][rows] - products - attention:.2f}"
        print(
            f"| {rows} | {kernels[best]:.2f} ({names[best]}) | {kv_bytes / 1e6:.1f} | {kv_ms:.2f} | {floor:.2f} | "
            + " | ".join(cells)
            + f" | {split} |",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", nargs="+", choices=list(SIZES), default=list(SIZES), help="model sizes (default both)")
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    p.add_argument("--rows", nargs="+", type=int, default=[1, 16, 64, 256], help="rows a step decodes at once")
    p.add_argument("--past", type=int, default=None, help="cached positions of every row (default: half the block)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30, help="calls a round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--data", default=None, help="Tiny Shakespeare, the lesson size's vocabulary (default: downloaded)")
    args = p.parse_args(argv)
    for name in ("rows", "repeats", "rounds", "threads"):
        value = min(getattr(args, name)) if name == "rows" else getattr(args, name)
        if value < 1:
            p.error(f"--{name} must be >= 1, got {value}")
    blocks = {"shipped": CharGPTConfig.from_pretrained(model_path("shakespeare")).block_size}
    blocks["lesson"] = CharGPTConfig().block_size
    for size in args.size:
        if args.past is not None and not 1 <= args.past <= blocks[size] - 2:
            p.error(f"--past {args.past} does not fit the {size} size's block of {blocks[size]} (1 to block - 2)")
    bandwidth = read_bandwidth(args.threads)
    print(
        f"{args.threads} threads, {os.cpu_count()} CPUs, read bandwidth {bandwidth:.1f} GB/s (torch.sum over 256 MB "
        f"fp32, best of 20), median of {args.rounds} rounds of {args.repeats} calls; load average "
        f"{os.getloadavg()[0]:.1f} at the start"
    )
    with tempfile.TemporaryDirectory() as work:
        for size in args.size:
            measure_size(size, args, bandwidth, Path(work))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
