"""Int8 formats of the exported graph: speed, greedy agreement with fp32, and batch invariance.

    python benchmarks/int8_formats.py --threads 2                 # the shipped model
    python benchmarks/int8_formats.py --model ladder-d --tokens 100

The export's int8 file is ONNX Runtime's dynamic quantization: int8 weights, and activations quantized on the fly
with one scale per tensor. That scale is computed over the whole batch, so a row's tokens can depend on the other
rows (the scheduler's batch invariance holds only for fp32), and a 1e-7 difference between two runtimes' LayerNorm
can cross a rounding boundary (the in-browser page's int8 tokens split from Python's at a near tie). This script
compares it with weight-only formats (`MatMulNBits`, ONNX Runtime's quantizer): 8 bits with fp32 compute
(`accuracy_level` unset), 8 bits with int8 compute of block-quantized activations (`accuracy_level=4`), and 4 bits.

For each: decode tokens/s at batch 1 (refill mode, best of `--repeats`), how many greedy characters agree with the
fp32 graph from the prompt (exact mode, `--tokens`, crossing block_size), and whether row 0's greedy tokens are the
same alone and in a batch of four different prompts. A script, not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)

import numpy as np  # noqa: E402
import onnx  # noqa: E402

from gpt_serve.generation import SamplingParams, generate_text, generate_tokens  # noqa: E402
from gpt_serve.generation.onnx_backend import FP32_FILE_NAME, INT8_FILE_NAME, OnnxBackend  # noqa: E402
from gpt_serve.models import model_path  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
OTHER_PROMPTS = ("JULIET:\nO Romeo", "First Citizen:", "KING RICHARD III:\nNow is the winter")


def weight_only(fp32: Path, dst: Path, bits: int, accuracy_level: int | None) -> None:
    """`fp32` with every MatMul's weights in `bits` bits (blocks of 32, symmetric), metadata kept."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(fp32))
    metadata = {p.key: p.value for p in model.metadata_props}  # block_size, the vocabulary's hash: OnnxBackend checks
    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=32, is_symmetric=True, accuracy_level=accuracy_level)
    quantizer.process()
    quantized = quantizer.model.model
    onnx.helper.set_model_props(quantized, metadata)
    onnx.save(quantized, str(dst))


def variant_folder(source: Path, work: Path, name: str, make) -> Path:
    """A copy of the model folder whose `onnx/model_quantized.onnx` is the variant `make(fp32, dst)` writes."""
    folder = Path(shutil.copytree(source, work / name, ignore=shutil.ignore_patterns("*.png", "metrics.jsonl")))
    if make is not None:
        make(source / "onnx" / FP32_FILE_NAME, folder / "onnx" / INT8_FILE_NAME)
    return folder


def measure(backend: OnnxBackend, prompt: str, tokens: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        generate_text(backend, backend.vocab, prompt, tokens, GREEDY, window_mode="refill")
        best = min(best, time.perf_counter() - start)
    return tokens / best


def agreement(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def batch_invariant(backend: OnnxBackend, prompt: str, tokens: int) -> bool:
    ids = [backend.vocab.encode(p) for p in (prompt, *OTHER_PROMPTS)]
    alone = np.stack(list(generate_tokens(backend, ids[:1], tokens, GREEDY)))[:, 0]
    batched = np.stack(list(generate_tokens(backend, ids, tokens, GREEDY)))[:, 0]
    return bool(np.array_equal(alone, batched))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="shakespeare", help="shipped model name or exported model folder")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=300, help="greedy characters compared (crossing block_size)")
    p.add_argument("--speed-tokens", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt", default="ROMEO:")
    args = p.parse_args(argv)
    source = model_path(args.model)
    print(
        f"model {args.model!r}, {args.threads} threads, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f} at the start"
    )
    variants = {
        "fp32 (reference)": None,
        "int8 dynamic (the export's)": "as is",
        "8-bit weights, fp32 compute": lambda src, dst: weight_only(src, dst, 8, None),
        "8-bit weights, int8 compute (accuracy_level 4)": lambda src, dst: weight_only(src, dst, 8, 4),
        "4-bit weights, int8 compute (accuracy_level 4)": lambda src, dst: weight_only(src, dst, 4, 4),
    }
    print("| graph | file | decode tok/s, batch 1 | greedy chars equal to fp32 | row alone == in a batch of 4 |")
    print("|---|---:|---:|---:|---|")
    reference = None
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, make) in enumerate(variants.items()):
            folder = variant_folder(source, Path(tmp), f"v{i}", None if make in (None, "as is") else make)
            backend = OnnxBackend(folder, quantized=make is not None, threads=args.threads)
            text = generate_text(backend, backend.vocab, args.prompt, args.tokens, GREEDY)
            reference = text if reference is None else reference
            speed = measure(backend, args.prompt, args.speed_tokens, args.repeats)
            size = backend.path.stat().st_size / 2**20
            invariant = "yes" if batch_invariant(backend, args.prompt, min(args.tokens, 150)) else "no"
            agree = f"{agreement(text, reference)} / {args.tokens}"
            print(f"| {name} | {size:.1f} MB | {speed:,.0f} | {agree} | {invariant} |")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
