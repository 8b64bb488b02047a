"""A decode step's attention alone: one query per row over a `BatchKV`-shaped cache, each way PyTorch can compute it.

    python benchmarks/decode_attention.py --threads 2 --rows 1 16 64 256     # both sizes, every variant
    python benchmarks/decode_attention.py --size lesson --rows 256 --threads 1 2 --fill empty
    python benchmarks/decode_attention.py --steps --rows 1 16 64 256 --data ../shared/data/tinyshakespeare.txt

For each model size (`shipped`: n_embd 192, 6 heads, 4 layers, block 128, 64 cached; `lesson`: the lesson's 10.8M
architecture, 384/6/6, block 256, 128 cached), each `--rows` count and each `--threads` count, the time of every
layer's attention of one query per row (q (rows, H, 1, hs)) over views `[:rows, :, 0:past + 1]` of buffers shaped as
`BatchKV`'s (rows, H, 2 x block, hs) (`--capacity` columns instead of 2 x block: `past + 1` makes the views
contiguous), one pair per layer, without a mask and with one (boolean (rows, 1, 1, columns),
every eighth row left-padded by 1-5 columns, as `TorchBackend.decode_step` builds it), for each variant:

- `sdpa`: `F.scaled_dot_product_attention`, what the decode step runs (`DecodePlan`, `decode_attention`);
- `sdpa, contiguous` and `matmul, contiguous`: over contiguous copies of the views (the copies not timed);
- `matmul`: `torch.matmul(q, k^T) * scale`, the mask filled with the dtype's finite minimum, softmax, `@ v`;
- `bmm`: the same with the batch and head dimensions folded into one (`torch.bmm` on views, no copies);
- `baddbmm`: `torch.baddbmm` with the scale as alpha and the mask as an additive bias (0 or the finite minimum);
- `gemv`: batched matrix-vector products (the keys times the query, the values' transpose times the weights);
- `einsum`: the two products as `torch.einsum`.

`--fill empty` leaves the buffers as `torch.empty` makes them, never written: on Linux a read of such memory maps the
kernel's one zero page, which stays in the CPU's cache, so attention then reads no memory at all (a probe that does
this times 3-4x too fast). `BatchKV` zeroes its buffers; the default `randn` writes them too.

`--steps` times whole decode steps instead: a `TorchDecodeBatch` of `--rows` rows at `past` cached tokens each (random
weights for the lesson's size, the shipped weights for the other), its `DecodePlan` calling SDPA and `matmul` in turn
(the module's `F.scaled_dot_product_attention` swapped for the run), stepped with the new column taken back each time,
and prints the medians and the median of the paired ratios (matmul / sdpa) of `--rounds` rounds.

Each cell: ms per call over every layer, no mask / mask, and the largest |difference| of the variant's output from
SDPA's. The variants take turns within each of `--rounds` rounds of `--repeats` calls (the median is printed), so
that the machine's drifting memory bandwidth reaches them alike. A script, not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)  # the repository's packages, not this folder's scripts

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# (n_embd, n_head, n_layer, block_size, cached positions)
SIZES = {"shipped": (192, 6, 4, 128, 64), "lesson": (384, 6, 6, 256, 128)}


def sdpa(q, k, v, mask, scale):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def matmul(q, k, v, mask, scale):
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, H, 1, T)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.matmul(scores.softmax(-1), v)  # (B, H, 1, hs)


def bmm(q, k, v, mask, scale):
    B, H, _, D = q.shape
    T = k.shape[2]
    scores = torch.bmm(q.reshape(B * H, 1, D), k.reshape(B * H, T, D).transpose(1, 2)).mul_(scale)  # (BH, 1, T)
    if mask is not None:
        scores = scores.view(B, H, 1, T).masked_fill_(~mask, torch.finfo(scores.dtype).min).view(B * H, 1, T)
    return torch.bmm(scores.softmax(-1), v.reshape(B * H, T, D)).view(B, H, 1, D)


def baddbmm(q, k, v, mask, scale):
    B, H, _, D = q.shape
    T = k.shape[2]
    qs, ks = q.reshape(B * H, 1, D), k.reshape(B * H, T, D).transpose(1, 2)  # (BH, 1, hs), (BH, hs, T)
    if mask is None:
        scores = torch.bmm(qs, ks).mul_(scale)
    else:
        bias = torch.zeros(B, 1, 1, T, dtype=q.dtype).masked_fill_(~mask, torch.finfo(q.dtype).min)
        scores = torch.baddbmm(bias.expand(B, H, 1, T).reshape(B * H, 1, T), qs, ks, alpha=scale)
    return torch.bmm(scores.softmax(-1), v.reshape(B * H, T, D)).view(B, H, 1, D)


def gemv(q, k, v, mask, scale):
    B, H, _, D = q.shape
    T = k.shape[2]
    scores = torch.bmm(k.reshape(B * H, T, D), q.reshape(B * H, D, 1)).mul_(scale)  # (BH, T, 1)
    if mask is not None:
        scores = scores.view(B, H, T).masked_fill_(~mask[:, :, 0], torch.finfo(scores.dtype).min).view(B * H, T, 1)
    return torch.bmm(v.reshape(B * H, T, D).transpose(1, 2), scores.softmax(1)).view(B, H, 1, D)


def einsum(q, k, v, mask, scale):
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v)


# name: (function, over contiguous copies)
VARIANTS = {
    "sdpa": (sdpa, False),
    "sdpa, contiguous": (sdpa, True),
    "matmul": (matmul, False),
    "matmul, contiguous": (matmul, True),
    "bmm": (bmm, False),
    "baddbmm": (baddbmm, False),
    "gemv": (gemv, False),
    "einsum": (einsum, False),
}


def timed(fns: dict, repeats: int, rounds: int) -> dict:
    """Median ms per call of each of `fns` over `rounds` rounds of `repeats` calls (taking turns), after warm-up."""
    times = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(2):
            fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(repeats):
                fn()
            times[name].append((time.perf_counter() - start) / repeats * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def measure(size: str, rows: int, args) -> None:
    n_embd, H, n_layer, block, past = SIZES[size]
    D, T = n_embd // H, past + 1
    torch.manual_seed(0)
    make = torch.randn if args.fill == "randn" else torch.empty
    capacity = args.capacity or 2 * block
    buffers = [(make(rows, H, capacity, D), make(rows, H, capacity, D)) for _ in range(n_layer)]
    views = [(k[:, :, :T], v[:, :, :T]) for k, v in buffers]
    copies = [(k.contiguous(), v.contiguous()) for k, v in views]
    q = torch.randn(rows, H, 1, D)
    padding = torch.zeros(rows, T, dtype=torch.bool)
    for r in range(0, rows, 8):
        padding[r, : 1 + r % 5] = True
    masks = {"no mask": None, "mask": (~padding)[:, None, None, :]}  # (rows, 1, 1, T), True = may attend
    for threads in args.threads:
        torch.set_num_threads(threads)
        fns, diffs = {}, {}
        with torch.inference_mode():
            for name, (fn, contiguous) in VARIANTS.items():
                kv = copies if contiguous else views
                for label, mask in masks.items():

                    def attend(fn=fn, kv=kv, mask=mask):
                        for k, v in kv:
                            fn(q, k, v, mask, D**-0.5)

                    fns[name, label] = attend
                    ref = sdpa(q, *views[0], mask, D**-0.5)
                    diffs[name, label] = (fn(q, *kv[0], mask, D**-0.5) - ref).abs().max().item()
            ms = timed(fns, args.repeats, args.rounds)
        cells = [
            " / ".join(f"{ms[name, m]:.2f}" for m in masks) + f" ({max(diffs[name, m] for m in masks):.0e})"
            for name in VARIANTS
        ]
        print(f"| {size} | {rows} | {threads} | " + " | ".join(cells) + f" | {os.getloadavg()[0]:.1f} |", flush=True)


def step_ratios(size: str, args, work: Path) -> None:
    """Whole decode steps with SDPA and with `matmul` taking turns, paired, at each `--rows` count."""
    from benchmarks.decode_batch import undoing_step
    from benchmarks.decode_gap import size_folder
    from gpt_serve.generation import load_backend
    from gpt_serve.generation.backends import torch_decode

    attention = {"use": sdpa}

    def chosen(q, k, v, attn_mask=None, scale=None, **kwargs):  # one query per row: the decode step's call
        if q.shape[2] > 1:  # a prefill (`decode_attention`)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale, **kwargs)
        return attention["use"](q, k, v, attn_mask, scale)

    functional = types.SimpleNamespace(**{name: getattr(F, name) for name in dir(F) if not name.startswith("_")})
    functional.scaled_dot_product_attention = chosen
    backend = load_backend(size_folder(size, ["torch"], work, args.data), "torch", max(args.threads)).backend
    past = SIZES[size][4]
    real, torch_decode.F = torch_decode.F, functional  # what `DecodePlan.__call__` calls
    try:
        for rows in args.rows:
            batch = backend.new_batch(rows)
            batch.add_rows([[1 + j % 60 for j in range(past)]] * rows)
            step, tokens = undoing_step(batch), np.ones(rows, dtype=np.int64)
            times = {name: [] for name in ("sdpa", "matmul")}
            for r in range(args.rounds):
                for name in ("sdpa", "matmul") if r % 2 == 0 else ("matmul", "sdpa"):
                    attention["use"] = globals()[name]
                    for _ in range(2):
                        step(tokens)
                    start = time.perf_counter()
                    for _ in range(args.repeats):
                        step(tokens)
                    times[name].append((time.perf_counter() - start) / args.repeats * 1e3)
            ratio = statistics.median(m / s for m, s in zip(times["matmul"], times["sdpa"], strict=True))
            a, b = (statistics.median(times[name]) for name in ("sdpa", "matmul"))
            print(f"| {size} | {rows} | {a:.2f} | {b:.2f} | {ratio:.3f} | {os.getloadavg()[0]:.1f} |", flush=True)
    finally:
        torch_decode.F = real


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", nargs="+", choices=list(SIZES), default=list(SIZES), help="model sizes (default both)")
    p.add_argument("--rows", nargs="+", type=int, default=[1, 16, 64, 256], help="rows (queries) a step decodes")
    p.add_argument("--threads", nargs="+", type=int, default=[2], help="PyTorch thread counts to time each at")
    p.add_argument("--fill", choices=["randn", "empty"], default="randn", help="write the cache buffers, or not")
    p.add_argument("--capacity", type=int, default=0, help="the buffers' columns (default 2 x block, as BatchKV's)")
    p.add_argument("--steps", action="store_true", help="time whole decode steps, sdpa against matmul")
    p.add_argument("--data", default=None, help="Tiny Shakespeare, the lesson size's vocabulary (with --steps)")
    p.add_argument("--repeats", type=int, default=10, help="calls a round")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    past_max = max(SIZES[name][4] for name in args.size)
    if args.capacity and args.capacity < past_max + 1:
        p.error(f"--capacity must hold the {past_max} cached positions and the new one, got {args.capacity}")
    for name in ("rows", "threads", "repeats", "rounds"):
        value = getattr(args, name)
        value = min(value) if isinstance(value, list) else value
        if value < 1:
            p.error(f"--{name} must be >= 1, got {value}")
    if args.steps:
        torch.set_num_threads(max(args.threads))
        print(
            f"{max(args.threads)} threads, {os.cpu_count()} CPUs, median of {args.rounds} paired rounds of "
            f"{args.repeats} steps; load average {os.getloadavg()[0]:.1f}"
        )
        print("| size | rows | step with sdpa, ms | with matmul, ms | matmul / sdpa, paired | load |")
        print("|---|---:|---:|---:|---:|---:|")
        with tempfile.TemporaryDirectory() as work:
            for size in args.size:
                step_ratios(size, args, Path(work))
        return 0
    print(
        f"{os.cpu_count()} CPUs, buffers {args.fill}, median of {args.rounds} rounds of {args.repeats} calls, ms a "
        f"call over every layer, no mask / mask (max |difference| from sdpa); load average {os.getloadavg()[0]:.1f}"
    )
    print("| size | rows | threads | " + " | ".join(VARIANTS) + " | load |")
    print("|---|---:|---:|" + "---:|" * len(VARIANTS) + "---:|")
    for size in args.size:
        for rows in args.rows:
            measure(size, rows, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
