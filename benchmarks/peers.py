"""Our scheduler beside vLLM's CPU engine and transformers' continuous batching, on the same folder and prompt ids.

    python benchmarks/peers.py                                     # shakespeare, 1/16/64/256 streams, 100 tokens
    python benchmarks/peers.py --engines torch vllm-eager --rounds 5
    python benchmarks/peers.py --streams 1 4 --tokens 10 --rounds 1   # a smoke run

N streams of `--tokens` tokens each from the same prompt ("ROMEO:", 6 tokens), sampled at temperature 0.8 (stream i
with seed i), all submitted at once; the figure is the aggregate tokens/s (every stream's tokens over the wall time
of the whole batch), after a warm-up round of N streams of 8 tokens in the same process. Every measurement is a
fresh process (load, warm-up, one timed round), the engines take turns in an order that rotates each round, and the
table gives the median over `--rounds` (each round's figure beside it). The folder is a `gpt-serve copy` of
`--model` (its code and its ONNX graphs), which every engine reads:

- `torch`, `onnx-int8`: our scheduler, as the servers run it (`benchmarks/serving.py`'s streams: a `ModelRegistry`
  backend, N asyncio readers), `--max-batch` rows at once (default: the most streams asked for);
- `vllm-eager`, `vllm-compiled`: vLLM's CPU build (`vllm.LLM` from `.venv-vllm`, `make vllm`), fp32,
  `max_model_len` = `block_size`, `max_num_seqs` = `--max-batch`, its engine in the process, OpenMP bound to CPUs
  0..threads-1; `--enforce-eager`, or vLLM's default compiled mode (compiling counts as loading, not in the figure);
- `hf-cb`: transformers' continuous batching (`model.generate_batch`) on our model; `hf-cb-gpt2`: the same on a
  GPT-2 of the same size (`n_embd`, `n_head`, `n_layer`, `block_size`, vocabulary) built from a config, random
  weights (its speed does not depend on them).

`--threads` per forward pass everywhere (torch and ONNX Runtime intra-op threads, vLLM's OpenMP threads). Prints a
markdown table. A script, not a test; the timed round must fit the window (prompt + tokens <= block_size: vLLM and
continuous batching do not slide).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)  # the repository's packages, not this folder's scripts

# What each engine's child runs in: our venv's Python, or vLLM's (nothing of gpt-serve is installed there, so this
# module imports nothing of it at the top).
ENGINES = ("torch", "onnx-int8", "vllm-eager", "vllm-compiled", "hf-cb", "hf-cb-gpt2")
WARM_TOKENS = 8
TEMPERATURE = 0.8


# --- the children: one engine, one measurement, one JSON line ---------------------------------------------------


def child_ours(args, prompt: list[int]) -> dict:
    from benchmarks.serving import run, scheduler_stream
    from gpt_serve.serving.registry import ModelRegistry

    registry = ModelRegistry(
        {"model": args.folder}, threads=args.threads, max_batch=args.max_batch, max_queue=max(args.streams, 1)
    )
    try:
        scheduler = registry.scheduler("model", args.engine)
        run(scheduler_stream(scheduler, prompt, WARM_TOKENS, "refill"), args.streams, WARM_TOKENS)
        result = run(scheduler_stream(scheduler, prompt, args.tokens, "refill"), args.streams, args.tokens)
        tuner = getattr(scheduler.backend, "tuner", None)  # PyTorch's: steps that stalled, then ran on one thread
    finally:
        registry.close()
    figures = {"aggregate": result["aggregate"], "tokens": args.tokens * result["complete"]}
    return {**figures, "stalls": tuner.stalls} if tuner is not None else figures


def child_vllm(args, prompt: list[int]) -> dict:
    from vllm import LLM, SamplingParams

    block_size = json.loads((Path(args.folder) / "config.json").read_text(encoding="utf-8"))["block_size"]
    llm = LLM(
        model=args.folder,
        trust_remote_code=True,
        model_impl="transformers",
        dtype="float32",
        max_model_len=block_size,
        max_num_seqs=args.max_batch,
        enforce_eager=args.engine == "vllm-eager",
        distributed_executor_backend="uni",
        seed=0,
    )
    requests = [{"prompt_token_ids": prompt}] * args.streams

    def round_of(tokens: int) -> tuple[int, float]:
        sampling = [
            SamplingParams(temperature=TEMPERATURE, seed=i, max_tokens=tokens, ignore_eos=True)
            for i in range(args.streams)
        ]
        start = time.perf_counter()
        outputs = llm.generate(requests, sampling, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs), time.perf_counter() - start

    round_of(WARM_TOKENS)
    made, seconds = round_of(args.tokens)
    return {"aggregate": made / seconds, "tokens": made}


def child_hf(args, prompt: list[int]) -> dict:
    import torch
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from gpt_serve import CharGPTForCausalLM

    torch.set_num_threads(args.threads)
    model = CharGPTForCausalLM.from_pretrained(args.folder).eval()
    if args.engine == "hf-cb-gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        c = model.config
        shape = dict(n_embd=c.n_embd, n_head=c.n_head, n_layer=c.n_layer, n_positions=c.block_size)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=c.vocab_size, **shape)).eval()
    # one page of 256 tokens holds a stream; the prefill of all of them fits one batch
    sizes = ContinuousBatchingConfig(num_blocks=args.streams + 4, max_batch_tokens=max(256, len(prompt) * args.streams))

    def round_of(tokens: int) -> tuple[int, float]:
        config = GenerationConfig(
            max_new_tokens=tokens, do_sample=True, temperature=TEMPERATURE, top_k=0, eos_token_id=-1, pad_token_id=0
        )
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate_batch(
                [prompt] * args.streams, generation_config=config, continuous_batching_config=sizes, progress_bar=False
            )
        return sum(len(r.generated_tokens) for r in out.values()), time.perf_counter() - start

    round_of(WARM_TOKENS)
    made, seconds = round_of(args.tokens)
    return {"aggregate": made / seconds, "tokens": made}


def child(args) -> int:
    prompt = json.loads(args.prompt_ids)
    (args.streams,) = args.streams  # one measurement: one number of streams
    run_one = {"vllm": child_vllm, "hf": child_hf}.get(args.engine.split("-")[0], child_ours)
    print(json.dumps(run_one(args, prompt)), flush=True)
    return 0


# --- the parent: the folder, the rounds, the table ---------------------------------------------------------------


def measure(args, engine: str, folder: Path, prompt: list[int], streams: int, work: Path) -> dict:
    """One fresh process of `engine`: {"aggregate": tokens/s, "tokens": made} or {"error": "..."}."""
    command = [__file__, "--child", engine, "--folder", str(folder), "--prompt-ids", json.dumps(prompt)]
    command += ["--streams", str(streams), "--tokens", str(args.tokens), "--threads", str(args.threads)]
    command += ["--max-batch", str(args.max_batch or max(args.streams))]
    if engine.startswith("vllm"):
        from tests import vllm_venv

        python = vllm_venv.python()
        # the compile cache in this run's folder: nothing left behind, every round compiles alike
        env = vllm_venv.env(args.threads, VLLM_CACHE_ROOT=str(work / "vllm-cache"))
    else:
        python, env = Path(sys.executable), {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    try:
        done = subprocess.run(
            [str(python), *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:] or ['no output']}"}
    return json.loads(lines[-1])


def copy_folder(model: str, work: Path) -> tuple[Path, list[int]]:
    """`gpt-serve copy MODEL` into `work`, and the prompt's ids in its vocabulary."""
    from gpt_serve import CharTokenizer
    from gpt_serve.folders.publishing import write_self_contained

    folder = write_self_contained(model, work / "model")
    return folder, CharTokenizer.from_pretrained(folder).encode("ROMEO:")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="shakespeare", help="shipped model name or model folder")
    p.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    p.add_argument("--streams", nargs="+", type=int, default=[1, 16, 64, 256])
    p.add_argument("--tokens", type=int, default=100, help="new tokens of every stream")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="measurements of each engine and streams (the median)")
    p.add_argument("--max-batch", type=int, default=None, help="rows at once (default: the most streams)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds for one measurement's process")
    p.add_argument("--child", choices=ENGINES, dest="engine", help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    p.add_argument("--prompt-ids", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.engine is not None:
        return child(args)
    if min(args.streams) < 1 or args.tokens < 1 or args.rounds < 1 or args.threads < 1:
        p.error("--streams, --tokens, --rounds and --threads must be at least 1")
    with tempfile.TemporaryDirectory() as work:
        return bench(args, Path(work))


def bench(args, work: Path) -> int:
    folder, prompt = copy_folder(args.model, work)
    block_size = json.loads((folder / "config.json").read_text(encoding="utf-8"))["block_size"]
    if len(prompt) + args.tokens > block_size:
        raise SystemExit(f"{len(prompt)} prompt + {args.tokens} tokens do not fit the window ({block_size})")
    print(
        f"model {args.model!r} (a gpt-serve copy), {args.tokens} tokens a stream from {len(prompt)} prompt tokens, "
        f"temperature {TEMPERATURE}, {args.threads} threads, {args.rounds} rounds, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at the start",
        flush=True,
    )
    figures: dict[tuple[str, int], list[dict]] = {}
    for r in range(args.rounds):
        order = args.engines[r % len(args.engines) :] + args.engines[: r % len(args.engines)]
        for n in args.streams:
            for engine in order:
                figures.setdefault((engine, n), []).append(measure(args, engine, folder, prompt, n, work))
    print("| engine | streams | aggregate tok/s (median) | each round | tokens a round |")
    print("|---|---:|---:|---|---:|")
    for engine in args.engines:
        for n in args.streams:
            runs = figures[(engine, n)]
            errors = [run["error"] for run in runs if "error" in run]
            if errors:
                print(f"| {engine} | {n} | failed | {errors[0]} | |")
                continue
            # a PyTorch round whose thread tuner saw stalls ran some steps on one thread (`ThreadTuner`)
            stalled = [f" ({run['stalls']} stalls)" if run.get("stalls") else "" for run in runs]
            each = " / ".join(f"{run['aggregate']:,.0f}{note}" for run, note in zip(runs, stalled, strict=True))
            median = statistics.median(run["aggregate"] for run in runs)
            print(f"| {engine} | {n} | {median:,.0f} | {each} | {runs[0]['tokens']} |")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":  # vLLM's children may start processes with spawn, which import this file again
    raise SystemExit(main())
