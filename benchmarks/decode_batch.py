"""One decode step of the scheduler's batch at 1..64 rows, per backend and, for ONNX Runtime, per graph.

    python benchmarks/decode_batch.py --threads 2
    python benchmarks/decode_batch.py --threads 2 --rows 1 16 --backends onnx-int8 --repeats 7

For each backend (`torch`, `onnx`, `onnx-int8`) a `DecodeBatch` of `--rows` rows (`--cached` tokens each, plus 0-7;
the same step repeated, its new column taken back, so the cache does not grow) is stepped `--steps` times,
`--repeats` rounds; it prints the median ms per step (and the range over rounds), the tokens/s that makes, and,
for the ONNX backends, the same on the Hugging Face layout graph (`OnnxDecodeBatch`, whose `present = Concat(past,
new)` copies every row's cache at every step) and on the in-place graph (`OnnxInPlaceBatch`, the default where the
folder has it), the two taking turns, with the paired ratio. Also the cost of a row joining and leaving the batch
(`add` + `remove`, which the Hugging Face layout pays by rebuilding every row's cache). A script, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)  # the repository's packages, not this folder's scripts

import numpy as np  # noqa: E402

from gpt_serve.generation.backends.onnx_backend import OnnxBackend  # noqa: E402
from gpt_serve.generation.backends.onnx_batches import OnnxDecodeBatch, OnnxInPlaceBatch  # noqa: E402
from gpt_serve.models import model_path  # noqa: E402


def undoing_step(batch):
    """A step function for `batch` that leaves it as it found it (same cache, same lengths)."""
    if isinstance(batch, OnnxInPlaceBatch):

        def step(tokens):
            batch.step(tokens)
            batch.lengths[: len(batch)] -= 1  # the new column is overwritten next time

    elif isinstance(batch, OnnxDecodeBatch):

        def step(tokens):
            state = batch.cache, batch.mask, batch.lengths  # the step makes new ones and leaves these intact
            batch.step(tokens)
            batch.cache, batch.mask, batch.lengths = state

    else:  # TorchDecodeBatch
        kv = batch.kv

        def step(tokens):
            batch.step(tokens)
            kv.width -= 1
            kv.lengths[: kv.rows] -= 1

    return step


def fill(backend, rows: int, cached: int):
    batch = backend.new_batch(rows + 1)
    for i in range(rows):
        batch.add([1 + (j % 60) for j in range(min(cached + i % 8, backend.block_size - 2))])
    return batch


def paired(functions: list, steps: int, repeats: int) -> list[list[float]]:
    """ms per call of each function, `repeats` rounds of `steps` calls each, the functions taking turns within a
    round (so that a noisy moment of the machine hits all of them alike); a warm-up round first."""
    times = [[] for _ in functions]
    for round_ in range(repeats + 1):
        for f, out in zip(functions, times, strict=True):
            start = time.perf_counter()
            for _ in range(steps):
                f()
            if round_:
                out.append((time.perf_counter() - start) / steps * 1e3)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="shakespeare", help="shipped model name or model folder")
    p.add_argument("--backends", nargs="+", default=["torch", "onnx", "onnx-int8"])
    p.add_argument("--rows", nargs="+", type=int, default=[1, 4, 16, 64])
    p.add_argument("--cached", type=int, default=40, help="cached tokens per row (plus 0-7)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    folder = model_path(args.model)
    print(
        f"model {args.model!r}, {args.threads} threads, {os.cpu_count()} CPUs, {args.cached}-{args.cached + 7} "
        f"cached tokens a row, median (range) of {args.repeats} rounds of {args.steps} steps, the batches of a row "
        f"taking turns; load average {os.getloadavg()[0]:.1f} at the start"
    )
    print("| backend | batch | rows | ms/step | tok/s | vs the Hugging Face layout | join + leave, ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for key in args.backends:
        if key == "torch":
            import torch

            from gpt_serve.generation import load_backend

            torch.set_num_threads(args.threads)
            backends = [load_backend(folder, "torch", args.threads).backend]
        else:
            backends = [
                OnnxBackend(folder, quantized=key == "onnx-int8", threads=args.threads, inplace=inplace)
                for inplace in (False, True)
            ]
            if backends[1].inplace_session is None:
                print(f"| {key} | (no {backends[1].inplace_path.name}: re-export the folder) | | | | | |")
                backends = backends[:1]
        for rows in args.rows:
            batches = [fill(b, rows, args.cached) for b in backends]
            tokens = np.ones(rows, dtype=np.int64)
            steps = [undoing_step(batch) for batch in batches]
            step_times = paired([lambda s=s, t=tokens: s(t) for s in steps], args.steps, args.repeats)
            length = min(args.cached, backends[0].block_size - 2)

            def churn(batch, length=length):
                batch.add([1] * length)
                batch.remove(0)  # the new last row moves into row 0: the same rows, another order

            churn_times = paired([lambda b=b: churn(b) for b in batches], max(5, args.steps // 5), args.repeats)
            for i, (batch, ms) in enumerate(zip(batches, step_times, strict=True)):
                median = statistics.median(ms)
                ratio = "" if i == 0 else f"{statistics.median(a / b for a, b in zip(step_times[0], ms)):.2f}x"
                print(
                    f"| {key} | {type(batch).__name__} | {rows} | {median:.2f} ({min(ms):.2f}-{max(ms):.2f}) | "
                    f"{rows / median * 1e3:,.0f} | {ratio} | {statistics.median(churn_times[i]):.2f} |",
                    flush=True,
                )
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
