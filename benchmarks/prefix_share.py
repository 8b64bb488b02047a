"""A prompt seen before: prefilled again, against copied in from the backend's prompt cache, for a model's examples.

    python benchmarks/prefix_share.py --threads 2                         # the shipped model, torch and onnx-int8
    python benchmarks/prefix_share.py --model ladder-e --backends torch --rows 1 16

The scheduler prefills once the rows admitted together whose windows are the same (the `n` choices of a request,
and requests for the same prompt that arrive in the same iteration: `RunningBatch.join`); the backend's
`PromptCache` spares the prefill of a request that arrives later with a window prefilled before (the demo's
examples), copying the stored keys and values in. For each example prompt of the model folder (its `corpus.json`)
and each backend, this prints:

- prefill: the prompt added as a new row (`add_rows`) with no prompt cache, then removed, ms;
- cached: the same with the backend's prompt cache holding it, ms;
- the request: the machine time of a whole request of `--tokens` new tokens (the folder's `max_new_tokens` by
  default) when it decodes among `rows` rows: its prefill + `--tokens` x (a step of `rows` rows) / rows, at each
  `--rows` (every row at half the block of cached positions), and the share of it the cache saves
  ((prefill - cached) / request).

Every figure is the median of `--rounds` rounds of `--repeats` calls. A script, not a test.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)  # the repository's packages, not this folder's scripts

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.decode_batch import undoing_step  # noqa: E402
from benchmarks.decode_gap import timed  # noqa: E402
from gpt_serve import CharGPTConfig, CharTokenizer  # noqa: E402
from gpt_serve.folders.corpus_record import read_corpus_record  # noqa: E402
from gpt_serve.generation import load_backend  # noqa: E402
from gpt_serve.generation.backends.prompt_cache import PromptCache  # noqa: E402
from gpt_serve.models import model_path  # noqa: E402


def prompt_costs(backend, ids: list[int], repeats: int, rounds: int) -> tuple[float, float]:
    """ms to add `ids` as a new row, undone after: prefilled (no prompt cache), and copied from the prompt cache."""
    kept, batch = backend.prompt_cache, backend.new_batch(1)

    def add():
        batch.add_rows([ids])
        batch.remove(0)

    backend.prompt_cache = None
    prefill = timed(add, repeats, rounds)
    backend.prompt_cache = PromptCache()
    cached = timed(add, repeats, rounds)  # the warm-up calls: seen, kept, then copied in from the third
    assert backend.prompt_cache.hits >= repeats * rounds, backend.prompt_cache
    backend.prompt_cache = kept
    return prefill, cached


def step_ms(backend, rows: int, past: int, repeats: int, rounds: int) -> float:
    """ms per decode step of `rows` rows at `past` cached positions."""
    batch = backend.new_batch(rows)
    batch.add_rows([[1 + (j % 60) for j in range(past)]] * rows)
    step, tokens = undoing_step(batch), np.ones(rows, dtype=np.int64)
    return timed(lambda: step(tokens), repeats, rounds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="shakespeare", help="shipped model name or model folder with ONNX files")
    p.add_argument("--backends", nargs="+", choices=("torch", "onnx", "onnx-int8"), default=["torch", "onnx-int8"])
    p.add_argument("--rows", nargs="+", type=int, default=[1, 64], help="rows the request decodes among")
    p.add_argument("--tokens", type=int, default=None, help="new tokens a request (default: the folder's)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30, help="calls a round")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    for name in ("repeats", "rounds", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if min(args.rows) < 1:
        p.error(f"--rows must be >= 1, got {min(args.rows)}")
    if args.tokens is not None and args.tokens < 1:
        p.error(f"--tokens must be >= 1, got {args.tokens}")
    folder = Path(args.model) if Path(args.model).is_dir() else model_path(args.model)
    record = read_corpus_record(folder)
    if record is None or not record.prompts:
        p.error(f"{folder} records no example prompts (corpus.json)")
    tokens = args.tokens
    if tokens is None:
        from transformers import GenerationConfig

        tokens = GenerationConfig.from_pretrained(folder).max_new_tokens
    torch.set_num_threads(args.threads)
    config = CharGPTConfig.from_pretrained(folder)
    tokenizer = CharTokenizer.from_pretrained(folder)
    past = config.block_size // 2
    print(
        f"{folder.name}: {args.threads} threads, {os.cpu_count()} CPUs, requests of {tokens} new tokens, steps at "
        f"{past} cached positions, median of {args.rounds} rounds of {args.repeats} calls; load average "
        f"{os.getloadavg()[0]:.2f}\n"
    )
    header = "| backend | prompt | chars | prefill, ms | cached, ms | "
    header += " | ".join(f"request among {r} rows, ms (saved)" for r in args.rows) + " |"
    print(header + "\n|---|---|---:|---:|---:|" + "---:|" * len(args.rows))
    for key in args.backends:
        backend = load_backend(folder, key, args.threads).backend
        steps = {rows: step_ms(backend, rows, past, args.repeats, args.rounds) for rows in args.rows}
        for prompt in record.prompts:
            ids = tokenizer.encode(prompt)[-config.block_size :]
            prefill, cached = prompt_costs(backend, ids, args.repeats, args.rounds)
            cells = []
            for rows in args.rows:
                request = prefill + tokens * steps[rows] / rows
                cells.append(f"{request:.1f} ({(prefill - cached) / request:.1%})")
            shown = prompt.split("\n")[0][:24].replace("|", "\\|")
            print(f"| {key} | {shown} | {len(ids)} | {prefill:.2f} | {cached:.2f} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
