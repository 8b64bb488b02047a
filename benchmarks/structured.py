"""Structured outputs' cost: N streams all constrained by one regex, or by one grammar of the same language, vs the
same N unconstrained, aggregate tokens/s per backend, and the compile time of a small JSON schema, a speaker-line
regex, the same line as a Lark grammar, and `json_object`.

    python benchmarks/structured.py --threads 2
    python benchmarks/structured.py --threads 1 --streams 4 --tokens 20 --rounds 1 --backends onnx

Each round runs the N streams on one scheduler (`max_batch` N), sampled at temperature 1, every stream `--tokens`
tokens long (a regex whose language goes on, `[A-Za-z ,.\\n]+`, so neither side stops early; the grammar's is the
same, masked per step by llguidance's parser instead of a table); the sides take turns, and the median of the rounds
and the constrained/unconstrained ratios are printed. Compile times are of a
first compile (a cache miss: the constraint is made new each time by a counter in it), in ms, median of
`--compiles`. A script, not a test: the figures need a quiet machine (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)  # the repository's packages, not this folder's scripts

from gpt_serve.generation import load_backend, parse_request  # noqa: E402
from gpt_serve.generation.constraints import compile_constraint  # noqa: E402
from gpt_serve.generation.scheduler import Scheduler  # noqa: E402
from gpt_serve.generation.structured import Constraint, check_structured_outputs  # noqa: E402
from gpt_serve.generation.text import TextStream  # noqa: E402

REGEX = "[A-Za-z ,.\\n]+"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer"}}}
SPEAKER_LINE = r"[A-Z][A-Z ]{1,20}:\n[A-Z][a-z ,]{3,40}[.!?]"
SPEAKER_GRAMMAR = 'start: NAME ":\\n" LINE\nNAME: /[A-Z][A-Z ]{1,20}/\nLINE: /[A-Z][a-z ,]{3,40}[.!?]/\n'
SIDES = {  # what each side's streams are constrained by
    "unconstrained": {},
    "regex": {"structured_outputs": {"regex": REGEX}},
    "grammar": {"structured_outputs": {"grammar": f"start: /{REGEX}/"}},
}


def aggregate_rate(loaded, streams: int, tokens: int, side: str) -> float:
    """Tokens/s of `streams` streams of `tokens` tokens each, run together, constrained as `SIDES[side]`."""
    extra = SIDES[side]
    request = parse_request({"prompt": "ROMEO:\n", "max_tokens": tokens, "temperature": 1, "seed": 0, **extra})
    compile_constraint(request.constraint, loaded.vocab.chars)
    scheduler = Scheduler(loaded.backend, max_batch=streams, max_queue=streams)
    try:
        start = time.perf_counter()
        texts = [TextStream(scheduler, loaded.vocab, request, i) for i in range(streams)]
        made = sum(len("".join(t)) for t in texts)
        return made / (time.perf_counter() - start)
    finally:
        scheduler.close()


def compile_ms(structured: dict, chars, repeats: int) -> float:
    times = []
    for i in range(repeats):
        value = dict(structured)
        if "json" in value:  # a new schema each time: a cache miss
            value["json"] = {**value["json"], "title": f"run {i}"}
        elif "grammar" in value:
            value["grammar"] = f"{value['grammar']}// run {i}\n"
        elif "json_object" in value:  # (what json_object compiles, made new)
            value = {"json_object": True}
            constraint = check_structured_outputs(value)
            constraint = Constraint(
                "json_object", json.dumps({"type": "object", "title": f"run {i}"}), constraint.source
            )
        else:
            value["regex"] = f"{value['regex']}(?:x{{{i}}})?"
        if "json_object" not in value:
            constraint = check_structured_outputs(value)
        start = time.perf_counter()
        compile_constraint(constraint, chars)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="shakespeare")
    p.add_argument("--backends", nargs="+", default=["torch", "onnx", "onnx-int8"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--compiles", type=int, default=7)
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    results: dict = {"backends": {}}
    for key in args.backends:
        loaded = load_backend(args.model, key, args.threads)
        for side in SIDES:  # warm up every path
            aggregate_rate(loaded, args.streams, min(args.tokens, 5), side)
        rates: dict[str, list[float]] = {side: [] for side in SIDES}
        for _ in range(args.rounds):
            for side in rates:
                rates[side].append(aggregate_rate(loaded, args.streams, args.tokens, side))
        plain, masked, parsed = (statistics.median(rates[s]) for s in SIDES)
        results["backends"][key] = {"unconstrained": plain, "constrained": masked, "ratio": masked / plain,
                                    "grammar": parsed, "grammar_ratio": parsed / plain}  # fmt: skip
        print(f"{key:10s} {args.streams} streams x {args.tokens} tokens: unconstrained {plain:8.0f} tok/s, "
              f"regex {masked:8.0f} tok/s (ratio {masked / plain:.2f}), grammar {parsed:8.0f} tok/s (ratio "
              f"{parsed / plain:.2f})")  # fmt: skip
    chars = load_backend(args.model, args.backends[0], args.threads).vocab.chars
    printable = [chr(c) for c in range(32, 127)] + ["\n"]
    results["compile_ms"] = {
        "small JSON schema (a printable-ASCII vocabulary)": compile_ms({"json": SCHEMA}, printable, args.compiles),
        "speaker-line regex (the model's vocabulary)": compile_ms({"regex": SPEAKER_LINE}, chars, args.compiles),
        "speaker-line Lark grammar (the model's vocabulary)": compile_ms(
            {"grammar": SPEAKER_GRAMMAR}, chars, args.compiles
        ),
        "json_object (a printable-ASCII vocabulary)": compile_ms({"json_object": True}, printable, args.compiles),
    }
    for name, ms in results["compile_ms"].items():
        print(f"compile, {name}: {ms:.1f} ms (median of {args.compiles})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
