"""One process that runs N streams through a `Scheduler` on one backend, then exits: for timing whole processes
against each other from outside (start-up included), e.g. the ONNX Runtime backend's two batches:

    python benchmarks/scheduler_process.py --graph inplace              # one stream of 2,000 tokens, int8
    python benchmarks/scheduler_process.py --graph hf                   # the same on the Hugging Face layout batch
    python benchmarks/scheduler_process.py --graph inplace --streams 16 --tokens 400

`--graph inplace` decodes on the folder's in-place graph (`OnnxInPlaceBatch`, the default), `--graph hf` on the
Hugging Face layout graph (`OnnxDecodeBatch`, `OnnxBackend(..., inplace=False)`); `--backend torch` ignores it. The
streams sample at temperature 0.8 (seeds 0..N-1) in refill mode from a 3-token prompt. Prints nothing but the
tokens made; the figure is the process's wall time. A script, not a test.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)  # the repository's packages, not this folder's scripts

from gpt_serve.generation import SamplingParams  # noqa: E402
from gpt_serve.generation.requests import Request  # noqa: E402
from gpt_serve.generation.scheduler import Scheduler  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="shakespeare", help="shipped model name or model folder")
    p.add_argument("--backend", choices=["torch", "onnx", "onnx-int8"], default="onnx-int8")
    p.add_argument("--graph", choices=["inplace", "hf"], default="inplace", help="the ONNX Runtime batch")
    p.add_argument("--streams", type=int, default=1)
    p.add_argument("--tokens", type=int, default=2000, help="max_new_tokens of every stream")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    if args.backend == "torch":
        from gpt_serve.generation import load_backend

        backend = load_backend(args.model, "torch", args.threads).backend
    else:
        from gpt_serve.generation.backends.onnx_backend import OnnxBackend

        quantized, inplace = args.backend == "onnx-int8", args.graph == "inplace"
        backend = OnnxBackend(args.model, quantized=quantized, threads=args.threads, inplace=inplace)
    scheduler = Scheduler(backend, max_batch=max(1, args.streams), max_queue=max(1, args.streams))
    try:
        sampling = SamplingParams(0.8)
        requests = [
            Request([1, 2, 3], args.tokens, sampling, seed=i, window_mode="refill") for i in range(args.streams)
        ]
        streams = [scheduler.submit(r) for r in requests]
        made = sum(len(list(stream)) for stream in streams)
    finally:
        scheduler.close()
    print(f"{made} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
