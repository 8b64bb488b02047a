"""The training loop: AdamW, LR schedule, clipping, accumulation, evaluation, checkpoints, DDP.

GPU-first (bf16 autocast, TF32, fused AdamW, torch.compile on CUDA) and plain fp32 on CPU. Under `torchrun` it
runs DDP (NCCL on CUDA, gloo on CPU); only rank 0 logs, plots and saves.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from gpt_serve import CharGPTConfig, CharGPTForCausalLM, CharTokenizer

from .checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from .data import CharDataset, load_text

logger = logging.getLogger(__name__)
SCHEDULES = ("constant", "cosine")


@dataclass
class TrainConfig:
    """Training options. Every field is also a command-line flag of `python -m training`."""

    out_dir: str = "out"
    data: str | None = None  # path to the corpus; None downloads Tiny Shakespeare
    batch_size: int = 32
    grad_accum: int = 1  # micro-batches per optimizer step
    learning_rate: float = 1e-3
    schedule: str = "constant"  # "constant" (the lesson) or "cosine" (warmup + cosine decay to min_lr)
    warmup_iters: int = 0
    min_lr: float = 0.0
    max_iters: int = 5000
    weight_decay: float = 0.01  # AdamW's default, as in the lesson
    beta1: float = 0.9
    beta2: float = 0.999
    grad_clip: float = 0.0  # 0 disables clipping
    eval_interval: int = 500
    eval_iters: int = 200
    checkpoint_interval: int = 0  # 0: checkpoint at each evaluation
    keep_best: bool = False  # save the weights with the best validation loss rather than the last
    seed: int = 1337
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:N"
    compile: bool | None = None  # None: on for CUDA, off for CPU
    threads: int = 0  # CPU threads per process (0: PyTorch's default)
    resume: bool = False
    sample_tokens: int = 300  # length of the sample written into the model card
    model: dict = field(default_factory=dict)  # CharGPTConfig keyword arguments

    def validate(self) -> None:
        positive = ["batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters"]
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.grad_clip < 0 or self.warmup_iters < 0 or self.min_lr < 0 or self.threads < 0:
            raise ValueError("grad_clip, warmup_iters, min_lr and threads must be >= 0")


def lr_factor(cfg: TrainConfig, step: int) -> float:
    """Multiplier of `learning_rate` at `step` (what LambdaLR applies)."""
    if step < cfg.warmup_iters:
        return (step + 1) / cfg.warmup_iters
    if cfg.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - cfg.warmup_iters) / max(1, cfg.max_iters - cfg.warmup_iters))
    floor = cfg.min_lr / cfg.learning_rate
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class Runtime:
    """Where and how this process runs: device, precision, DDP rank."""

    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def ddp(self) -> bool:
        return self.world_size > 1

    @property
    def autocast_dtype(self):
        return torch.bfloat16 if self.device.type == "cuda" else None


def setup_runtime(cfg: TrainConfig) -> Runtime:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    want = cfg.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {cfg.device!r} asked for CUDA, but no CUDA device is available")
    if want == "cuda" and world_size > 1:
        want = f"cuda:{local_rank}"
    device = torch.device(want)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if world_size > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend=backend)
    return Runtime(device, rank, world_size, local_rank)


class Trainer:
    """Trains a `CharGPTForCausalLM` on a text corpus and writes a `save_pretrained` folder."""

    def __init__(self, cfg: TrainConfig, text: str | None = None, command: str | None = None):
        cfg.validate()
        self.cfg = cfg
        self.command = command
        self.rt = setup_runtime(cfg)
        self.out = Path(cfg.out_dir)
        text = text if text is not None else load_text(cfg.data)
        self.tokenizer = CharTokenizer.from_corpus(text)
        self.model_config = CharGPTConfig(vocab_size=self.tokenizer.vocab_size, **cfg.model)
        self.dataset = CharDataset(text, self.tokenizer, self.model_config.block_size)
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.model = CharGPTForCausalLM(self.model_config).to(self.rt.device)
        self.optimizer = self._make_optimizer()
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(cfg, s))
        # Each rank draws its own batches; the generator state is the sampler state saved in checkpoints.
        self.batch_gen = torch.Generator().manual_seed(cfg.seed + 1000 * self.rt.rank)
        self.step = 0
        self.best_val = float("inf")
        self.history: list[dict] = []
        self.train_time = 0.0
        self.forward_model = self.model
        if self.rt.ddp:
            ids = [self.rt.device.index] if self.rt.device.type == "cuda" else None
            self.forward_model = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        use_compile = cfg.compile if cfg.compile is not None else self.rt.device.type == "cuda"
        if use_compile:
            self.forward_model = torch.compile(self.forward_model)

    def _make_optimizer(self) -> torch.optim.Optimizer:
        # Weight decay on matrices only (not on biases, LayerNorm gains or... embeddings are matrices too).
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": self.cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        extra = {"fused": True} if self.rt.device.type == "cuda" else {}
        return torch.optim.AdamW(
            groups, lr=self.cfg.learning_rate, betas=(self.cfg.beta1, self.cfg.beta2), **extra
        )

    # -- state -------------------------------------------------------------------------------------------------

    def _run_identity(self) -> dict:
        """Settings a checkpoint must share with the run resuming it."""
        keys = ["batch_size", "grad_accum", "learning_rate", "schedule", "warmup_iters", "min_lr", "max_iters", "seed"]
        return {
            "model_config": self.model_config.to_diff_dict(),
            "vocab": self.tokenizer.vocab.sha256,
            "world_size": self.rt.world_size,
            **{k: getattr(self.cfg, k) for k in keys},
        }

    def state_dict(self) -> dict:
        return {
            "run": self._run_identity(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "best_val": self.best_val,
            "train_time": self.train_time,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "batch_gen": self.batch_gen.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        self.best_val = state["best_val"]
        self.train_time = state["train_time"]
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.batch_gen.set_state(state["batch_gen"])

    def checkpoint_path(self) -> Path:
        # Each DDP rank keeps its own sampler and RNG state.
        name = CHECKPOINT_NAME if self.rt.world_size == 1 else f"checkpoint-rank{self.rt.rank}.pt"
        return self.out / "checkpoints" / name

    def resume(self) -> None:
        state = load_checkpoint(self.checkpoint_path(), self._run_identity())
        self.load_state_dict(state)
        self.history = [m for m in read_metrics(self.out) if m["step"] <= self.step]
        if self.rt.is_main:
            write_metrics(self.out, self.history)  # drop what a killed run logged after its last checkpoint
        logger.info("resumed from step %d", self.step)

    # -- the loop ----------------------------------------------------------------------------------------------

    def loss_on(self, x: torch.Tensor, y: torch.Tensor, model=None) -> torch.Tensor:
        model = model or self.forward_model
        x, y = x.to(self.rt.device, non_blocking=True), y.to(self.rt.device, non_blocking=True)
        with torch.autocast(self.rt.device.type, dtype=self.rt.autocast_dtype, enabled=self.rt.autocast_dtype is not None):
            logits = model(input_ids=x, use_cache=False).logits  # (B, T, vocab)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))

    @torch.no_grad()
    def estimate_loss(self) -> dict[str, float]:
        """The lesson's `estimate_loss`: mean loss over `eval_iters` random batches of each split.

        Uses its own generator (seeded by the step) so evaluating never shifts the training batches.
        """
        self.model.eval()
        out = {}
        for split in ("train", "val"):
            gen = torch.Generator().manual_seed(self.cfg.seed + 7919 * (self.step + 1) + self.rt.rank)
            losses = torch.zeros(self.cfg.eval_iters)
            for i in range(self.cfg.eval_iters):
                x, y = self.dataset.get_batch(split, self.cfg.batch_size, gen)
                losses[i] = self.loss_on(x, y, self.model)
            mean = losses.mean().to(self.rt.device)
            if self.rt.ddp:
                torch.distributed.all_reduce(mean)
                mean /= self.rt.world_size
            out[split] = float(mean)
        self.model.train()
        return out

    def train_step(self) -> float:
        total = 0.0
        for micro in range(self.cfg.grad_accum):
            x, y = self.dataset.get_batch("train", self.cfg.batch_size, self.batch_gen)
            sync = micro == self.cfg.grad_accum - 1
            ctx = self.forward_model.no_sync() if (self.rt.ddp and not sync and hasattr(self.forward_model, "no_sync")) else _nullcontext()
            with ctx:
                loss = self.loss_on(x, y) / self.cfg.grad_accum
                loss.backward()
            total += float(loss.detach())
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return total

    def fit(self) -> dict:
        """Runs to `max_iters`, evaluating and checkpointing; returns the final metrics."""
        from .report import progress_bar, save_loss_plot

        cfg = self.cfg
        if cfg.resume:
            self.resume()
        elif self.rt.is_main and self.checkpoint_path().exists():
            raise ValueError(
                f"{self.out} already holds a checkpoint; pass --resume to continue it or choose another --out"
            )
        if self.rt.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
        self.model.train()
        tokens_per_step = cfg.batch_size * cfg.grad_accum * self.model_config.block_size * self.rt.world_size
        bar = progress_bar(self.step, cfg.max_iters, disable=not self.rt.is_main)
        ckpt_every = cfg.checkpoint_interval or cfg.eval_interval
        t_last = time.perf_counter()
        while self.step < cfg.max_iters:
            loss = self.train_step()
            self.step += 1
            now = time.perf_counter()
            self.train_time += now - t_last
            t_last = now
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_step * (bar.format_dict['rate'] or 0):,.0f}")
            if self.step % cfg.eval_interval == 0 or self.step == cfg.max_iters:
                losses = self.estimate_loss()
                record = {"step": self.step, "train_loss": losses["train"], "val_loss": losses["val"],
                          "lr": self.scheduler.get_last_lr()[0], "time_s": round(self.train_time, 2)}
                self.history.append(record)
                if cfg.keep_best and losses["val"] < self.best_val and self.rt.is_main:
                    save_checkpoint(self.best_weights_path(), {"model": self.model.state_dict(), "step": self.step})
                self.best_val = min(self.best_val, losses["val"])
                if self.rt.is_main:
                    bar.write(f"step {self.step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                    append_metric(self.out, record)
                    save_loss_plot(self.history, self.out / "loss.png")
                t_last = time.perf_counter()  # evaluation is not training time
            if self.step % ckpt_every == 0 and self.step < cfg.max_iters:
                save_checkpoint(self.checkpoint_path(), self.state_dict())
        bar.close()
        return self._finish()

    def best_weights_path(self) -> Path:
        return self.out / "checkpoints" / "best.pt"

    def _finish(self) -> dict:
        from .report import write_model_card

        chosen = self.history[-1] if self.history else {}
        if self.cfg.keep_best and self.best_weights_path().exists():
            best = load_checkpoint(self.best_weights_path(), {})
            self.model.load_state_dict(best["model"])
            chosen = next(m for m in self.history if m["step"] == best["step"])
        result = {
            "step": chosen.get("step"), "train_loss": chosen.get("train_loss"), "val_loss": chosen.get("val_loss"),
            "final_step": self.step, "train_time_s": round(self.train_time, 1),
            "parameters": sum(p.numel() for p in self.model.parameters()),
        }
        if self.rt.is_main:
            self.model.eval()
            self.model.config.window_mode = "exact"
            self.model.save_pretrained(self.out)
            self.tokenizer.save_pretrained(self.out)
            write_model_card(self, result)
        if self.rt.ddp:
            torch.distributed.barrier()
        return result


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def read_metrics(out: Path) -> list[dict]:
    path = Path(out) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_metrics(out: Path, records: list[dict]) -> None:
    path = Path(out) / "metrics.jsonl"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


def append_metric(out: Path, record: dict) -> None:
    with open(Path(out) / "metrics.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
