"""Int8 formats of the exported graph: speed, greedy agreement with fp32, and batch invariance.

    python benchmarks/int8_formats.py --threads 2                 # the shipped model
    python benchmarks/int8_formats.py --threads 2 --model lesson  # the lesson's 10.8M model (random weights)
    python benchmarks/int8_formats.py --model ladder-d --tokens 100

The export's int8 file (`export.graph_rewrites.quantize_int8`) is weight-only: int8 weights with one scale per output
column, dequantized by a `DequantizeLinear` that ONNX Runtime folds into fp32 weights at load, so the arithmetic is
fp32's. This script compares it with ONNX Runtime's dynamic quantization (int8 weights, activations quantized on the
fly with one scale per tensor: a scale computed over the whole batch can make a row's tokens depend on the other
rows, and a 1e-7 difference between two runtimes' LayerNorm can cross a rounding boundary: the in-browser page's
tokens split from Python's at a near tie with it) and with `MatMulNBits` (ONNX Runtime's block-wise weight-only
quantizer): 8 bits with fp32 compute (`accuracy_level` unset), 8 bits with int8 compute of block-quantized
activations (`accuracy_level=4`), and 4 bits.

For each: decode tokens/s at batch 1 (refill mode, best of `--repeats`), the time of one forward of a whole window
(block_size tokens, no cache: what exact mode runs for every token past it), how many greedy characters agree with the
fp32 graph from the prompt (exact mode, `--tokens`, crossing block_size), and how many rows of random batches of 2,
4 and 16 get logits that differ at all from the same row run alone (one decode step on random caches). A script,
not a test.
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

from gpt_serve.generation import SamplingParams, generate_text  # noqa: E402
from gpt_serve.generation.backends.onnx_backend import OnnxBackend  # noqa: E402
from gpt_serve.models import model_path  # noqa: E402
from gpt_serve.onnx_contract import (  # noqa: E402
    ATTENTION_MASK_NAME,
    INPLACE_FP32_FILE_NAME,
    INPLACE_INT8_FILE_NAME,
    INPUT_IDS_NAME,
    LOGITS_NAME,
    POSITION_IDS_NAME,
    onnx_path,
    past_names,
)

GREEDY = SamplingParams(temperature=0.0)
OTHER_PROMPTS = ("JULIET:\nO Romeo", "First Citizen:", "KING RICHARD III:\nNow is the winter")


def weight_only(fp32: Path, dst: Path, bits: int, accuracy_level: int | None) -> None:
    """`fp32` with every MatMul's weights in `bits` bits (blocks of 32, symmetric)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(fp32)), bits=bits, block_size=32, is_symmetric=True, accuracy_level=accuracy_level
    )
    quantizer.process()
    onnx.save(quantizer.model.model, str(dst))


def dynamic(fp32: Path, dst: Path) -> None:
    """`fp32` through ONNX Runtime's dynamic quantization (int8 weights, activations quantized per call)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(fp32, dst, weight_type=QuantType.QInt8)


def variant_folder(source: Path, work: Path, name: str, make) -> Path:
    """A copy of the model folder whose `onnx/model_quantized.onnx` is the variant `make(fp32, dst)` writes, with the
    fp32 file's metadata (block_size, the vocabulary's hash: what OnnxBackend checks). Without the in-place decode
    graphs: every variant, the reference included, decodes on its Hugging Face layout graph."""
    ignore = shutil.ignore_patterns("*.png", "metrics.jsonl", INPLACE_FP32_FILE_NAME, INPLACE_INT8_FILE_NAME)
    folder = Path(shutil.copytree(source, work / name, ignore=ignore))
    if make is not None:
        fp32, dst = onnx_path(source), onnx_path(folder, quantized=True)
        make(fp32, dst)
        variant = onnx.load(str(dst))
        onnx.helper.set_model_props(variant, {p.key: p.value for p in onnx.load(str(fp32)).metadata_props})
        onnx.save(variant, str(dst))
    return folder


def measure(backend: OnnxBackend, prompt: str, tokens: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        generate_text(backend, backend.vocab, prompt, tokens, GREEDY, window_mode="refill")
        best = min(best, time.perf_counter() - start)
    return tokens / best


def window_forward_ms(backend: OnnxBackend, repeats: int, calls: int = 20) -> float:
    """ms per forward of a full window (block_size tokens, no cache): what exact mode runs per token past it."""
    ids = np.ones((1, backend.block_size), dtype=np.int64)
    positions = np.arange(backend.block_size)[None]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            backend.forward(ids, np.ones_like(ids), positions, None)
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e3


def agreement(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def rows_changed_by_batching(backend: OnnxBackend, batches=(2, 4, 16)) -> tuple[int, int]:
    """(rows whose logits differ at all from the row's alone, rows): one decode step of the graph on random
    batches (random ids and caches of up to 30 positions), each row then run alone."""
    rng = np.random.default_rng(0)
    past = min(30, backend.block_size - 1)
    changed = total = 0
    for rows in batches:
        shape = (rows, backend.n_head, past, backend.head_size)
        feeds = {
            INPUT_IDS_NAME: rng.integers(0, backend.vocab_size, (rows, 1)),
            ATTENTION_MASK_NAME: np.ones((rows, past + 1), np.int64),
            POSITION_IDS_NAME: np.full((rows, 1), past, np.int64),
        }
        for name in past_names(backend.n_layer):
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
        batched = backend.session.run([LOGITS_NAME], feeds)[0]
        for r in range(rows):
            alone = backend.session.run([LOGITS_NAME], {k: v[r : r + 1] for k, v in feeds.items()})[0]
            changed += not np.array_equal(alone[0], batched[r])
        total += rows
    return changed, total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        default="shakespeare",
        help="shipped model name, exported model folder, or 'lesson' (the lesson's 10.8M model, random weights)",
    )
    p.add_argument("--data", default=None, help="Tiny Shakespeare, for --model lesson's export (default: downloaded)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=300, help="greedy characters compared (crossing block_size)")
    p.add_argument("--speed-tokens", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt", default="ROMEO:")
    args = p.parse_args(argv)
    print(
        f"model {args.model!r}, {args.threads} threads, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f} at the start"
    )
    # name: (how to write the int8 file from the fp32 one, or None for the export's file; OnnxBackend's int8_compute)
    variants = {
        "fp32 (reference)": (None, True),
        "the export's int8 (`onnx-int8`: ONNX Runtime's int8 kernel)": (None, True),
        "the export's int8, folded to fp32 (`int8_compute=False`, the page's arithmetic)": (None, False),
        "int8 dynamic (ONNX Runtime's quantize_dynamic)": (dynamic, True),
        "MatMulNBits 8-bit, fp32 compute": (lambda src, dst: weight_only(src, dst, 8, None), True),
        "MatMulNBits 8-bit, int8 compute (accuracy_level 4)": (lambda src, dst: weight_only(src, dst, 8, 4), True),
        "MatMulNBits 4-bit, int8 compute (accuracy_level 4)": (lambda src, dst: weight_only(src, dst, 4, 4), True),
    }
    print(
        "| graph | file | decode tok/s, batch 1 | full-window forward | greedy chars equal to fp32 "
        "| rows changed by batching |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    reference = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.model == "lesson":
            from benchmarks.onnx_generation import lesson_model_dir
            from gpt_serve.folders.corpus import load_text

            source = lesson_model_dir(Path(tmp), load_text(args.data))
        else:
            source = model_path(args.model)
        for i, (name, (make, int8_compute)) in enumerate(variants.items()):
            folder = variant_folder(source, Path(tmp), f"v{i}", make)
            quantized = i > 0
            backend = OnnxBackend(folder, quantized=quantized, threads=args.threads, int8_compute=int8_compute)
            text = generate_text(backend, backend.vocab, args.prompt, args.tokens, GREEDY)
            reference = text if reference is None else reference
            speed = measure(backend, args.prompt, args.speed_tokens, args.repeats)
            window = window_forward_ms(backend, args.repeats)
            size = backend.path.stat().st_size / 2**20
            changed, rows = rows_changed_by_batching(backend)
            agree = f"{agreement(text, reference)} / {args.tokens}"
            print(f"| {name} | {size:.1f} MB | {speed:,.0f} | {window:.2f} ms | {agree} | {changed} / {rows} |")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
