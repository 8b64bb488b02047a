"""What the load-time check that every weight is finite costs
(`gpt_serve.generation.backends.loading.check_finite_weights`).

    python benchmarks/finite_weights.py                 # the shipped model's shape and the lesson's 10.8M model
    python benchmarks/finite_weights.py --repeats 5 --threads 2

Random models of those shapes (the check reads every parameter and buffer once). Prints the best time of the
repeats, and that of the obvious `torch.isfinite(t).all()` per tensor, which it replaced.
Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from gpt_serve import CharGPTConfig, CharGPTForCausalLM
from gpt_serve.generation.backends.loading import check_finite_weights

SHAPES = {
    "shakespeare (shipped)": dict(n_embd=192, n_head=6, n_layer=4, block_size=128),
    "the lesson's model": dict(n_embd=384, n_head=6, n_layer=6, block_size=256),
}


def best_ms(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--n-embd", type=int, default=None, help="one model of this width (4 layers, 4 heads) instead")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    shapes = SHAPES if args.n_embd is None else {"custom": dict(n_embd=args.n_embd, n_head=4, n_layer=4)}
    for name, shape in shapes.items():
        model = CharGPTForCausalLM(CharGPTConfig(vocab_size=65, **shape)).eval()
        n = sum(p.numel() for p in model.parameters())
        check = best_ms(lambda m=model: check_finite_weights(m, Path("model.safetensors")), args.repeats)
        naive = best_ms(lambda m=model: all(bool(torch.isfinite(t).all()) for t in m.parameters()), args.repeats)
        print(
            f"{name}: {n / 1e6:.2f}M parameters, check_finite_weights {check:.1f} ms "
            f"(isfinite().all() per tensor: {naive:.1f} ms), best of {args.repeats}, {args.threads} thread(s)"
        )


if __name__ == "__main__":
    main()
