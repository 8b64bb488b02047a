"""Decode speed with and without a CPU-burning neighbour process, for each thread setting of the backends.

    python benchmarks/contention.py                        # torch and onnx-int8, 1 and 16 streams, quiet and busy
    python benchmarks/contention.py --backends torch --settings default passive

Each cell is a fresh process (the settings are read at start-up: OpenMP's wait policy is fixed when the OpenMP
runtime loads) that loads the shipped model, warms up with one round, then times N streams of the scheduler
(temperature 0.8, refill mode, a 3-token prompt) and prints tokens/s of the timed round. "busy" starts one
neighbour process that keeps one core busy (a pure-Python loop) for the whole cell. Settings:

- `default`: what a process gets unless it sets anything (gpt-serve's own default included, see docs/serving.md);
- `spin`: `OMP_WAIT_POLICY=ACTIVE`, OpenMP threads spin between parallel regions (PyTorch's behaviour before);
- `passive`: `OMP_WAIT_POLICY=PASSIVE`, they sleep;
- `threads1`: one intra-op thread.

A script, not a test. Run it on a machine with nothing else running; it is one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)  # the repository's packages, not this folder's scripts

SETTINGS = {
    "default": ({}, 2),
    "spin": ({"OMP_WAIT_POLICY": "ACTIVE"}, 2),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, 2),
    "threads1": ({}, 1),
    "spincount10k": ({"GOMP_SPINCOUNT": "10000"}, 2),
    "spincount1k": ({"GOMP_SPINCOUNT": "1000"}, 2),
}


def child(backend_key: str, streams: int, tokens: int, threads: int) -> dict:
    """One cell, the servers' way: a `ModelRegistry`'s backend and scheduler (PyTorch models load and decode on the
    process's one shared runner thread)."""
    import torch

    from gpt_serve.generation import SamplingParams
    from gpt_serve.generation.requests import Request
    from gpt_serve.models import model_path
    from gpt_serve.serving.registry import ModelRegistry

    torch.set_num_threads(threads)  # what `gpt-serve serve --threads` sets for the process
    registry = ModelRegistry({"m": model_path("shakespeare")}, threads=threads, max_batch=streams, max_queue=streams)
    try:
        registry.backend("m", backend_key)
        scheduler = registry.scheduler("m", backend_key)

        def round_(seed0: int) -> tuple[int, float]:
            requests = [
                Request([1, 2, 3], tokens, SamplingParams(0.8), seed=seed0 + i, window_mode="refill")
                for i in range(streams)
            ]
            start = time.perf_counter()
            made = sum(len(list(s)) for s in [scheduler.submit(r) for r in requests])
            return made, time.perf_counter() - start

        round_(1000)  # warm-up
        made, seconds = round_(0)
    finally:
        registry.close()
    return {"tokens": made, "seconds": seconds, "tok_s": made / seconds}


def run_cell(backend: str, streams: int, tokens: int, setting: str, busy: bool) -> float:
    env_extra, threads = SETTINGS[setting]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    env.update(env_extra)
    neighbour = None
    if busy:
        neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
    try:
        code = f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); from benchmarks.contention import child; "
        code += f"print(json.dumps(child({backend!r}, {streams}, {tokens}, {threads})))"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])["tok_s"]
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", nargs="+", default=["torch", "onnx-int8"])
    p.add_argument("--streams", nargs="+", type=int, default=[1, 16])
    p.add_argument("--tokens", type=int, default=300, help="max_new_tokens of every stream")
    p.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    p.add_argument("--repeats", type=int, default=1, help="cells per configuration (the median is shown)")
    args = p.parse_args(argv)
    print(f"load average at the start: {os.getloadavg()[0]:.1f}", flush=True)
    print("| backend | streams | setting | quiet tok/s | busy tok/s | busy / quiet |")
    print("|---|---:|---|---:|---:|---:|")
    for backend in args.backends:
        for streams in args.streams:
            for setting in args.settings:
                quiet, busy = (
                    statistics.median(run_cell(backend, streams, args.tokens, setting, b) for _ in range(args.repeats))
                    for b in (False, True)
                )
                print(
                    f"| {backend} | {streams} | {setting} | {quiet:,.0f} | {busy:,.0f} | {busy / quiet:.2f} |",
                    flush=True,
                )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
