"""One PyTorch decode step on the thread that loaded the model, on a second thread, and on the shared runner.

    python benchmarks/decode_threads.py --threads 2
    python benchmarks/decode_threads.py --threads 2 --rows 1 4 16 --repeats 5

PyTorch's CPU ops run on OpenMP (libgomp) thread teams, one per thread that has run a parallel op. Once the teams'
threads outnumber the CPUs, libgomp stops letting them spin between ops and every op waits for its team to wake
up. Each layout runs in a fresh process (`--layout` runs one), prints the median step time (`--repeats` runs of
`--steps` steps) of a `TorchDecodeBatch` with `--rows` rows of 40+ tokens each:

- `main`: the model loaded and decoded on the main thread (one team: what `gpt-serve generate` does);
- `second-thread`: loaded on the main thread, which keeps its team (one more parallel op there after loading, as a
  server's other threads may run), decoded on another thread: two teams;
- `runner`: loaded and decoded on the shared runner (`ModelRegistry`, `runner.torch_runner()`), the main thread
  never running a parallel op: the servers' way.

A script, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)

LAYOUTS = ("main", "second-thread", "runner")


def step_ms(backend, rows: int, steps: int, repeats: int) -> float:
    """Median ms per decode step of `rows` rows (the same step repeated: the cache does not grow)."""
    import numpy as np

    batch = backend.new_batch(max(rows, 1))
    for i in range(rows):
        batch.add([1 + (j % 60) for j in range(min(40 + i, backend.block_size - 2))])
    tokens = np.ones(rows, dtype=np.int64)
    kv = batch.kv

    def step() -> None:
        batch.step(tokens)
        kv.width -= 1  # undo the step's column: every step sees the same cache
        kv.lengths[:rows] -= 1

    for _ in range(5):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(times)


def one_layout(args) -> list[float]:
    import torch

    from gpt_serve.generation import load_backend
    from gpt_serve.models import model_path
    from gpt_serve.serving.registry import ModelRegistry

    def measure(backend) -> list[float]:
        return [step_ms(backend, n, args.steps, args.repeats) for n in args.rows]

    if args.layout == "runner":
        registry = ModelRegistry({"model": model_path(args.model)}, threads=args.threads)
        try:
            backend = registry.backend("model", "torch").backend
            return registry.scheduler("model", "torch").call(measure, backend)
        finally:
            registry.close()
    backend = load_backend(args.model, "torch", args.threads).backend
    if args.layout == "main":
        return measure(backend)
    x = torch.randn(2_000_000)
    float((x * 2).sum())  # a parallel op on the loading thread after loading: its team stays
    out: list[float] = []

    def second():
        torch.set_num_threads(args.threads)
        out.extend(measure(backend))

    thread = threading.Thread(target=second)
    thread.start()
    thread.join()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="shakespeare", help="shipped model name or model folder")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3, help="processes per layout, the layouts alternating")
    p.add_argument("--layout", choices=LAYOUTS, help="run one layout in this process and print its figures")
    args = p.parse_args(argv)
    if args.layout:
        print(" ".join(f"{t:.3f}" for t in one_layout(args)))
        return 0
    print(
        f"model {args.model!r}, {args.threads} threads, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f} at the start"
    )
    results: dict[str, list[list[float]]] = {layout: [] for layout in LAYOUTS}
    passthrough = ["--model", args.model, "--threads", str(args.threads), "--steps", str(args.steps)]
    passthrough += ["--repeats", str(args.repeats), "--rows", *map(str, args.rows)]
    for _ in range(args.rounds):
        for layout in LAYOUTS:
            cmd = [sys.executable, __file__, "--layout", layout, *passthrough]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
            results[layout].append([float(v) for v in out.split()[-len(args.rows) :]])
    print("| layout | " + " | ".join(f"{n} row{'s' if n > 1 else ''}, ms/step" for n in args.rows) + " |")
    print("|---|" + "---:|" * len(args.rows))
    for layout, runs in results.items():
        cells = []
        for i in range(len(args.rows)):
            values = sorted(r[i] for r in runs)
            cells.append(f"{statistics.median(values):.2f} ({values[0]:.2f}-{values[-1]:.2f})")
        print(f"| {layout} | " + " | ".join(cells) + " |")
    print(f"median (range) over {args.rounds} processes each; load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
