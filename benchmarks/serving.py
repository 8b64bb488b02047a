"""Concurrent streams through the library's scheduler (continuous batching), in one process, no HTTP.

    python benchmarks/serving.py --threads 2                       # shipped model, torch and onnx-int8, 1/4/16/64
    python benchmarks/serving.py --backends onnx --streams 1 16 --window-mode exact

For each backend and each number of concurrent streams N: N requests of `--tokens` tokens each are submitted at
once to one `Scheduler` and read by N consumer threads (as a server's request handlers would). It prints the
aggregate tokens/s (all tokens over the wall time), the per-stream tokens/s (p50 of each stream's tokens over its
own time), and time to first token p50/p95. The HTTP layers' costs (the demo's /generate) are measured by
`benchmarks/demo_load.py`; this script measures what the scheduler itself gives.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)  # the repository's packages, not this folder's scripts

from gpt_serve.generation import SamplingParams, load_backend  # noqa: E402
from gpt_serve.generation.scheduler import Request, Scheduler  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run(scheduler: Scheduler, prompt: list[int], n: int, tokens: int, window_mode: str) -> dict:
    """N streams at once; per stream (time to first token, tokens/s after it), and the aggregate."""
    results: list[tuple[float, float, int]] = []
    lock = threading.Lock()

    def consume(seed: int) -> None:
        start = time.perf_counter()
        stream = scheduler.submit(Request(prompt, tokens, SamplingParams(0.8), seed=seed, window_mode=window_mode))
        count, first = 0, None
        while (chunk := stream.take()) is not None:
            first = first or time.perf_counter()
            count += len(chunk)
        end = time.perf_counter()
        with lock:
            results.append((first - start, (count - 1) / max(end - first, 1e-9), count))

    threads = [threading.Thread(target=consume, args=(seed,)) for seed in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ttfts = [r[0] for r in results]
    return dict(
        streams=n,
        complete=sum(r[2] == tokens for r in results),
        aggregate=sum(r[2] for r in results) / wall,
        per_stream=statistics.median(r[1] for r in results),
        ttft_p50=percentile(ttfts, 0.5),
        ttft_p95=percentile(ttfts, 0.95),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="shakespeare", help="shipped model name or model folder")
    p.add_argument("--backends", nargs="+", default=["torch", "onnx-int8"])
    p.add_argument("--streams", nargs="+", type=int, default=[1, 4, 16, 64])
    p.add_argument("--tokens", type=int, default=200, help="max_new_tokens of every stream")
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--window-mode", choices=["exact", "refill"], default="refill")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    print(
        f"model {args.model!r}, {args.tokens} tokens a stream from {args.prompt!r}, window {args.window_mode}, "
        f"{args.threads} threads, max_batch {args.max_batch}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at the start"
    )
    print("| backend | streams | complete | aggregate tok/s | per-stream tok/s p50 | TTFT p50 | TTFT p95 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for key in args.backends:
        loaded = load_backend(args.model, key, threads=args.threads)
        prompt = loaded.vocab.encode(args.prompt)
        scheduler = Scheduler(loaded.backend, max_batch=args.max_batch, max_queue=max(args.streams))
        try:
            run(scheduler, prompt, 2, 8, args.window_mode)  # warm-up: first-call allocations, thread pools
            for n in args.streams:
                r = run(scheduler, prompt, n, args.tokens, args.window_mode)
                print(
                    f"| {key} | {n} | {r['complete']}/{n} | {r['aggregate']:,.0f} | {r['per_stream']:,.0f} | "
                    f"{r['ttft_p50'] * 1e3:.0f} ms | {r['ttft_p95'] * 1e3:.0f} ms |",
                    flush=True,
                )
        finally:
            scheduler.close()
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
