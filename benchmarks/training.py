"""Training throughput: our trainer's optimizer step against a straightforward lesson-style implementation.

    python benchmarks/training.py --threads 2                   # CPU preset and stage F on CPU
    python benchmarks/training.py --device cuda --presets ladder-f   # on a GPU (bf16, compiled)

For each preset it times full optimizer steps (forward, backward, clipping, AdamW) of

- "ours": `training.trainer.Trainer.train_step`, exactly what `python -m training` runs (fused attention, fp32 on
  CPU; bf16 autocast, fused AdamW and torch.compile on CUDA), and
- "lesson": the lesson's `gpt.py` written out below (a `Head` module per head, explicit masked softmax, the
  same feed-forward, LayerNorm, dropout and init), trained with the same batches, optimizer and clipping,
  in fp32 eager mode, as the lesson does.

Rounds alternate between the two so that load from other processes hits both alike; the report is the median
over rounds. Achieved FLOP/s count the model FLOPs of a step as 6 * N * tokens (N = parameters outside the
embeddings) plus 12 * n_layer * block_size * n_embd * tokens for attention (the PaLM appendix's formula; causal
masking is not discounted), so both implementations are credited with the same work.

Other processes change the result a lot: with 2 threads on a busy 2-core machine every parallel operator waits for
its slower thread, which costs the lesson's many small operators far more than ours. The script prints the load
average it started under; compare figures taken on a quiet machine.

This is a script that prints numbers, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.presets import get_preset  # noqa: E402
from training.trainer import TrainConfig, Trainer  # noqa: E402

# -- the lesson's gpt.py, written the straightforward way: the tests' reference (tests/folders/checkpoint_sources.py),
# with the lesson's final init and its loss


def lesson_gpt(vocab_size, block_size, n_embd, n_head, n_layer, dropout) -> nn.Module:
    from tests.folders.checkpoint_sources import GPTLanguageModel

    model = GPTLanguageModel(vocab_size, n_embd, n_head, n_layer, block_size, dropout)

    def init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    return model.apply(init_weights)


# -- timing -------------------------------------------------------------------------------------------------


def model_flops_per_token(n_params_non_embedding: int, n_layer: int, block_size: int, n_embd: int) -> int:
    return 6 * n_params_non_embedding + 12 * n_layer * block_size * n_embd


class Ours:
    """Our trainer, as `python -m training` builds it, stepping on its own batches."""

    def __init__(self, preset: str, data: str, device: str, compile: bool | None):
        p = get_preset(preset)
        cfg = TrainConfig(
            **{
                **p.train,
                "out_dir": "/nonexistent",
                "data": data,
                "device": device,
                "compile": compile,
                "progress": False,
            },
            model=dict(p.model),
        )
        self.trainer = Trainer(cfg)
        self.trainer.model.train()
        self.tokens_per_step = self.trainer.tokens_per_step
        mc = self.trainer.model_config
        emb = mc.vocab_size * mc.n_embd + mc.block_size * mc.n_embd
        n = sum(p.numel() for p in self.trainer.model.parameters()) - emb
        self.flops_per_step = model_flops_per_token(n, mc.n_layer, mc.block_size, mc.n_embd) * self.tokens_per_step

    def step(self):
        self.trainer.train_step()


class Lesson:
    """The lesson-style model in fp32 eager mode, with the same batches, optimizer settings and clipping."""

    def __init__(self, ours: Ours):
        t = ours.trainer
        mc, cfg = t.model_config, t.cfg
        torch.manual_seed(cfg.seed)
        self.model = lesson_gpt(mc.vocab_size, mc.block_size, mc.n_embd, mc.n_head, mc.n_layer, mc.dropout)
        self.model.to(t.rt.device).train()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay
        )
        self.grad_clip = cfg.grad_clip
        self.dataset, self.batch_size = t.dataset, cfg.batch_size
        self.gen = torch.Generator().manual_seed(cfg.seed)
        n_ours = sum(p.numel() for p in t.model.parameters())
        n_lesson = sum(p.numel() for p in self.model.parameters())
        assert n_ours == n_lesson, f"not the same model: {n_ours} vs {n_lesson} parameters"

    def step(self):
        x, y = self.dataset.get_batch("train", self.batch_size, self.gen)
        logits = self.model(x)  # (B, T, vocab_size)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(fn, steps: int, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / steps


def bench_preset(preset: str, args) -> dict:
    load_at_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    ours = Ours(preset, args.data, args.device, args.compile)
    device = ours.trainer.rt.device
    lesson = Lesson(ours)
    t0 = time.perf_counter()
    for _ in range(args.warmup):  # includes torch.compile's first compilations
        ours.step()
        lesson.step()
    warmup_s = time.perf_counter() - t0
    times = {"ours": [], "lesson": []}
    for _ in range(args.rounds):
        times["ours"].append(time_steps(ours.step, args.steps, device))
        times["lesson"].append(time_steps(lesson.step, args.steps, device))
    out = {
        "preset": preset,
        "load_average_at_start": load_at_start,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "compiled": ours.trainer.compiled,
        "autocast": str(ours.trainer.rt.autocast_dtype),
        "tokens_per_step": ours.tokens_per_step,
        "model_flops_per_step": ours.flops_per_step,
        "warmup_s": round(warmup_s, 1),
    }
    for name, ts in times.items():
        med = statistics.median(ts)
        out[name] = {
            "step_s_median": round(med, 4),
            "step_s_min": round(min(ts), 4),
            "tokens_per_s": round(ours.tokens_per_step / med, 1),
            "tflops": round(ours.flops_per_step / med / 1e12, 4),
        }
    ratios = [lt / ot for ot, lt in zip(times["ours"], times["lesson"], strict=True)]
    out["speedup_median"] = round(statistics.median(ratios), 3)
    out["speedup_per_round"] = [round(r, 3) for r in ratios]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="small-cpu,ladder-f", help="comma-separated presets")
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/tinyshakespeare.txt"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--compile",
        default=None,
        type=lambda s: s.lower() in ("1", "true", "on", "yes"),
        help="torch.compile ours (default: the trainer's default, on for CUDA only)",
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed steps of each first")
    p.add_argument("--steps", type=int, default=3, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds, alternating ours and lesson")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    print(
        f"# torch {torch.__version__}, {platform.machine()} ({os.cpu_count()} CPUs, load average {load}), "
        f"{torch.get_num_threads()} threads, device {args.device}"
    )
    results = []
    for preset in args.presets.split(","):
        r = bench_preset(preset, args)
        results.append(r)
        print(
            f"{preset:16s} ours {r['ours']['tokens_per_s']:>10,.0f} tok/s {r['ours']['tflops'] * 1e3:8.1f} GFLOP/s"
            f" | lesson {r['lesson']['tokens_per_s']:>10,.0f} tok/s {r['lesson']['tflops'] * 1e3:8.1f} GFLOP/s"
            f" | speedup {r['speedup_median']:.2f}x (rounds {r['speedup_per_round']})",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
