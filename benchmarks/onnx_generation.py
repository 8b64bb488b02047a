"""Decode speed of every generation path, batch 1: naive full recompute, the PyTorch engine, ONNX Runtime fp32/int8.

    python benchmarks/onnx_generation.py                       # lesson-size model (random weights) + shipped model
    python benchmarks/onnx_generation.py --models lesson --threads 2 --past-window-tokens 16

For each model it measures, on `--threads` threads (torch and ONNX Runtime alike):
  - time to first token (TTFT) for a prompt of a quarter window of Tiny Shakespeare;
  - decode tokens/s inside the window: from that prompt until the window is full (the first token excluded);
  - decode tokens/s past the window, from a full-window prompt, in both window modes ("exact": a full-window
    forward per token; "refill": the cache restarts from `refill_tokens` and grows again).
Naive recompute is the lesson's loop (`tests/lesson_reference.py`), re-running the window per token. The other rows
are what a single prompt runs on each backend (`generate_tokens`: the scheduler, stepped on this thread). The ONNX
Runtime rows decode on the folder's in-place graph where it has one.
The lesson-size model (CharGPTConfig defaults: block 256, n_embd 384, 6 heads, 6 layers, 10.8M parameters) has
random weights, exported on the fly into a temporary folder. Prints a markdown table. Not a test: numbers depend on
the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import onnxruntime as ort
import torch

from gpt_serve import CharGPTConfig, CharGPTForCausalLM, CharTokenizer
from gpt_serve.generation import SamplingParams, generate_tokens, load_backend
from gpt_serve.models import list_models, model_path
from gpt_serve.onnx_contract import onnx_path

# Run as a script, this folder is sys.path[0], and its other scripts (benchmarks/training.py) would shadow the
# repository's packages of the same name: look in the repository root first.
ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)
sys.path.insert(1, str(ROOT / "tests"))  # the lesson's loop, the reference the tests hold every path to
from lesson_reference import full_recompute_generate  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
GREEDY = SamplingParams(temperature=0)  # the sampler costs the same on every path; greedy keeps runs comparable


def engine_run(backend, prompt: list[int], n: int, window_mode: str = "exact") -> tuple[float, float]:
    """(seconds to the first token, decode tokens/s over tokens 2..n) through the shared engine."""
    start = time.perf_counter()
    stamps = [time.perf_counter() for _ in generate_tokens(backend, [prompt], n, GREEDY, window_mode=window_mode)]
    return stamps[0] - start, (n - 1) / (stamps[-1] - stamps[0])


def naive_run(model, prompt: list[int], n: int, window_mode: str = "exact") -> tuple[float, float]:
    """The same for the full-recompute loop, which yields nothing until the end: time 1 token, then n."""
    start = time.perf_counter()
    full_recompute_generate(model, prompt, 1, GREEDY, window_mode=window_mode)
    first = time.perf_counter() - start
    start = time.perf_counter()
    full_recompute_generate(model, prompt, n, GREEDY, window_mode=window_mode)
    total = time.perf_counter() - start
    return first, (n - 1) / max(total - first, 1e-9)


def best(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return min(r[0] for r in runs), max(r[1] for r in runs)


def lesson_model_dir(work: Path, text: str) -> Path:
    """The lesson's 10.8M architecture with random weights, saved and exported (fp32 + int8) into `work`."""
    from export.exporter import export_model

    folder = work / "lesson-10.8M"
    torch.manual_seed(0)
    CharGPTForCausalLM(CharGPTConfig(dropout=0.0)).save_pretrained(folder)
    CharTokenizer.from_corpus(text).save_pretrained(folder)
    report = export_model(folder, text=text, text_source="tinyshakespeare.txt", val_tokens=4096)
    if not report.passed:
        raise SystemExit(f"export of the lesson-size model failed: {report.failures}")
    return folder


def exported_copy(folder: Path, work: Path, text: str) -> Path:
    """`folder` itself when its ONNX files exist, else a copy exported into `work`."""
    if onnx_path(folder).is_file() and onnx_path(folder, quantized=True).is_file():
        return folder
    import shutil

    from export.exporter import export_model

    copy = Path(shutil.copytree(folder, work / folder.name))
    report = export_model(copy, text=text, text_source="tinyshakespeare.txt")
    if not report.passed:
        raise SystemExit(f"export of {folder} failed: {report.failures}")
    return copy


def bench_model(name: str, folder: Path, text: str, args) -> list[dict]:
    pytorch = load_backend(folder, "torch")
    model, vocab = pytorch.backend.pretrained, pytorch.vocab
    block = model.config.block_size
    ids = vocab.encode(text[: 10 * block])
    prompt = ids[: max(1, block // 4)]
    in_window = args.in_window_tokens or block - len(prompt)
    full_prompt = ids[:block]
    paths = {
        "naive recompute (PyTorch)": None,
        "PyTorch engine (KV cache)": pytorch.backend,
        "ONNX Runtime fp32": load_backend(folder, "onnx", threads=args.threads).backend,
        "ONNX Runtime int8": load_backend(folder, "onnx-int8", threads=args.threads).backend,
    }
    rows = []
    for label, backend in paths.items():
        run = (
            (lambda *a, **k: naive_run(model, *a, **k))
            if backend is None
            else (lambda *a, _b=backend, **k: engine_run(_b, *a, **k))
        )
        run(prompt, 3)  # warm-up: first-call allocations, thread pools
        ttft, inside = best([run(prompt, in_window) for _ in range(args.repeats)])
        _, exact = best([run(full_prompt, args.past_window_tokens, "exact") for _ in range(args.repeats)])
        _, refill = best([run(full_prompt, args.past_window_tokens, "refill") for _ in range(args.repeats)])
        rows.append(
            dict(
                model=name,
                path=label,
                ttft_ms=1e3 * ttft,
                inside=inside,
                exact=exact,
                refill=refill,
                prompt=len(prompt),
                in_window=in_window,
            )
        )
        print(f"  {name}: {label}: {inside:.1f} tok/s in window", file=sys.stderr)
    naive, engine = rows[0]["inside"], rows[1]["inside"]
    for row in rows:
        row["vs_naive"], row["vs_engine"] = row["inside"] / naive, row["inside"] / engine
    return rows


def markdown(rows: list[dict], args) -> str:
    lines = [
        f"Batch 1, greedy, {args.threads} threads (torch and ONNX Runtime), torch {torch.__version__}, "
        f"onnxruntime {ort.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at the end.",
        "",
        "| model | path | TTFT (ms) | tok/s in window | tok/s past window, exact | tok/s past window, refill "
        "| in-window speed-up vs naive | vs PyTorch engine |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]

    def rate(x: float) -> str:
        return f"{x:.1f}" if x < 100 else f"{x:.0f}"

    for r in rows:
        lines.append(
            f"| {r['model']} | {r['path']} | {r['ttft_ms']:.1f} | {rate(r['inside'])} | {rate(r['exact'])} | "
            f"{rate(r['refill'])} | {r['vs_naive']:.1f}x | {r['vs_engine']:.2f}x |"
        )
    lines.append("")
    lines.append(
        "TTFT: a prompt of block_size / 4 characters of Tiny Shakespeare; in window: the tokens that then fill the "
        f"window; past window: {args.past_window_tokens} tokens from a full-window prompt. Best of {args.repeats} "
        "run(s) each."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["lesson", "shakespeare"],
        help="'lesson' (10.8M, random weights), shipped model names or model folders",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Tiny Shakespeare (prompts, int8 check)")
    parser.add_argument("--in-window-tokens", type=int, default=None, help="default: fill the window")
    parser.add_argument("--past-window-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    text = args.data.read_text(encoding="utf-8")
    rows = []
    with tempfile.TemporaryDirectory(prefix="onnx-bench-") as tmp:
        for name in args.models:
            if name == "lesson":
                folder = lesson_model_dir(Path(tmp), text)
            elif name in list_models() or Path(name).is_dir():
                folder = exported_copy(model_path(name), Path(tmp), text)
            else:
                print(f"skipping {name!r}: not a shipped model ({list_models()}) nor a folder", file=sys.stderr)
                continue
            rows += bench_model(name if name != "lesson" else "lesson 10.8M (random)", folder, text, args)
    print(markdown(rows, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
