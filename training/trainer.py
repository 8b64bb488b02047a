"""The training loop: AdamW, LR schedule, clipping, accumulation, evaluation, checkpoints, snapshots, DDP.

GPU-first (bf16 autocast, TF32, fused AdamW, torch.compile on CUDA) and plain fp32 on CPU (`precision` and
`compile` choose otherwise). Under `torchrun` it runs DDP (NCCL on CUDA, gloo on CPU); only rank 0 logs, plots and
saves.

Exact resume: the model's dropout draws from the global torch RNG, batches from `batch_gen`, and evaluation from
a generator seeded by the step, so saving the model, optimizer, scheduler, step, both RNG states and the
sampler state is enough for a resumed run to repeat an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from gpt_serve import CharGPTConfig, CharGPTForCausalLM, CharTokenizer
from gpt_serve.chargpt.modeling_chargpt import quiet_weight_loading, upgrade_state_dict
from gpt_serve.files import write_new_folder
from gpt_serve.folders.corpus_record import CorpusRecord, write_corpus_record
from gpt_serve.folders.snapshots import StepRecord, snapshot_folder, write_step_record

from .checkpoint import BEST_NAME, CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from .config import ARCH_KEYS, MODEL_KEYS, OPTIMIZATION_KEYS, SCHEDULES, TrainConfig, make_scheduler  # noqa: F401
from .data import CharDataset
from .finetune import model_from_base
from .kernels import use_cpu_training_kernels
from .outputs import checkpoint_file, lock_folder, publish_folder, remove_stale_temp_files
from .preflight import check_folder, prepare
from .report import (
    append_metric,
    format_duration,
    progress_bar,
    read_metrics,
    save_loss_plot,
    time_left,
    write_metrics,
    write_model_card,
    write_snapshot_card,
)
from .runtime import setup_runtime
from .snapshots import remove_snapshots, snapshot_steps
from .tracking import Trackers, parse_report_to

logger = logging.getLogger(__name__)
ETA_STEPS = 20  # after this many steps of a session, the run logs how long it has left (and at each evaluation)


class Trainer:
    """Trains a `CharGPTForCausalLM` on a text corpus and writes a `save_pretrained` folder.

    `text` is the corpus (default: read from `cfg.data`); `command` is recorded in the model card.
    """

    def __init__(self, cfg: TrainConfig, text: str | None = None, command: str | None = None):
        self.prepared = prepare(cfg, text)  # the options, folders, base model and text, checked before any work
        self.cfg = cfg
        self.report_to = parse_report_to(cfg.report_to)  # before any work: a missing package is named now
        self.trackers: Trackers | None = None
        self.command = command
        self.rt = setup_runtime(cfg.device, cfg.threads, cfg.precision)
        self.out = Path(cfg.out_dir)
        text, base = self.prepared.text, self.prepared.base
        self.corpus = CorpusRecord.of(text, cfg.data, cfg.data_name, cfg.data_description)
        self.tokenizer = CharTokenizer(chars=self.prepared.vocab.chars)
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank (and rows for the new characters)
        if base is not None:
            self.model = model_from_base(base, self.prepared.vocab, self.prepared.block_size, cfg.model.get("dropout"))
        else:
            vocab = self.tokenizer.vocab
            self.model = CharGPTForCausalLM(
                CharGPTConfig(vocab_size=len(vocab), vocab_sha256=vocab.sha256, **cfg.model)
            )
        self.model_config = self.model.config
        self.model.to(self.rt.device)
        self.dataset = CharDataset(text, self.tokenizer, self.model_config.block_size).to(self.rt.device)
        self.compiled = cfg.compile if cfg.compile is not None else self.rt.device.type == "cuda"
        if self.rt.device.type == "cpu" and not self.compiled and self.rt.autocast_dtype is None:
            use_cpu_training_kernels(self.model)  # eager fp32 CPU training: the cheaper dropout paths (see `kernels`)
        if self.rt.ddp:
            torch.manual_seed(cfg.seed + 1 + self.rt.rank)  # but each rank its own dropout masks
        # Dropout draws from the global RNG: `fit` starts from this state, whatever ran in between.
        self._initial_rng = self._rng_state()
        self.optimizer = self._make_optimizer()
        self.scheduler = make_scheduler(cfg, self.optimizer)
        # Each rank draws its own batches; the generator state is the sampler state saved in checkpoints.
        self.batch_gen = torch.Generator().manual_seed(cfg.seed + 1000 * self.rt.rank)
        self.step = 0
        self.best_val, self.best_step, self.evals_since_best, self.stopped_early = float("inf"), None, 0, False
        self.history: list[dict] = []
        # the earlier states kept as model folders (OUT/snapshots/step-NNNNNN/): the same steps after a resume
        self.snapshot_steps = snapshot_steps(cfg.max_iters, cfg.eval_interval, cfg.snapshots)
        self.train_time = 0.0  # seconds spent in optimizer steps, over all sessions of this run
        self.wall_time = 0.0  # seconds from start to end, evaluation and checkpoints included, over all sessions
        self.tokens_per_step = cfg.batch_size * cfg.grad_accum * self.model_config.block_size * self.rt.world_size
        self.ddp_model = self.model
        if self.rt.ddp:
            ids = [self.rt.device.index] if self.rt.device.type == "cuda" else None
            self.ddp_model = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.forward_model = torch.compile(self.ddp_model) if self.compiled else self.ddp_model
        logger.info("training on %s", self.describe_setup())

    def describe_setup(self) -> str:
        """Device, precision, DDP, optimizer and compilation in one line (logged at the start of a run)."""
        fused = self.optimizer.defaults.get("fused")
        return ", ".join(
            [self.rt.describe(), "fused AdamW" if fused else "AdamW", "torch.compile" if self.compiled else "eager"]
        )

    def _make_optimizer(self) -> torch.optim.Optimizer:
        # Weight decay on matrices (Linear weights and embeddings), not on biases or LayerNorm gains.
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": self.cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        extra = {"fused": True} if self.rt.device.type == "cuda" else {}
        return torch.optim.AdamW(groups, lr=self.cfg.learning_rate, betas=(self.cfg.beta1, self.cfg.beta2), **extra)

    # -- state -------------------------------------------------------------------------------------------------

    def run_identity(self) -> dict:
        """Settings a checkpoint must share with the run resuming it."""
        return {
            "model_config": {k: getattr(self.model_config, k) for k in ARCH_KEYS},
            "vocab": self.tokenizer.vocab.sha256,
            "data_sha256": self.corpus.sha256,
            "world_size": self.rt.world_size,
            "init_from": str(self.prepared.base.folder.resolve()) if self.prepared.base is not None else None,
            "betas": [self.cfg.beta1, self.cfg.beta2],
            **{k: getattr(self.cfg, k) for k in (*OPTIMIZATION_KEYS, "eval_interval")},
        }

    def _rng_state(self) -> dict:
        cuda = self.rt.device.type == "cuda"
        return {
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.rt.device) if cuda else None,
            "batch_gen": self.batch_gen.get_state() if hasattr(self, "batch_gen") else None,
        }

    def _set_rng_state(self, state: dict) -> None:
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] is not None and self.rt.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.rt.device)
        if state["batch_gen"] is not None:
            self.batch_gen.set_state(state["batch_gen"])

    def state_dict(self) -> dict:
        """The checkpoint; collective under DDP (every rank contributes its RNG and sampler states)."""
        mine = self._rng_state()
        return {
            "run": self.run_identity(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "best_val": self.best_val,
            "best_step": self.best_step,
            "evals_since_best": self.evals_since_best,
            "stopped_early": self.stopped_early,
            "train_time": self.train_time,
            "wall_time": self.wall_time,
            "rank_states": self.rt.all_gather_object(mine),
        }

    def load_state_dict(self, state: dict) -> None:
        try:
            self.model.load_state_dict(upgrade_state_dict(state["model"]))
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        except (RuntimeError, KeyError, ValueError) as e:
            raise CheckpointError(f"checkpoint does not fit this model/optimizer: {e}") from None
        self._set_rng_state(state["rank_states"][self.rt.rank])
        self.step = state["step"]
        self.best_val = state["best_val"]
        self.best_step = state.get("best_step")
        self.evals_since_best = state.get("evals_since_best", 0)
        self.stopped_early = state.get("stopped_early", False)
        self.train_time = state["train_time"]
        self.wall_time = state.get("wall_time", self.train_time)

    def checkpoint_path(self) -> Path:
        return checkpoint_file(self.out)

    def best_weights_path(self) -> Path:
        return checkpoint_file(self.out, BEST_NAME)

    def save_checkpoint(self) -> None:
        state = self.state_dict()  # every rank takes part in gathering it
        if self.rt.is_main:
            save_checkpoint(self.checkpoint_path(), state)

    def resume(self) -> None:
        state = load_checkpoint(self.checkpoint_path(), self.run_identity())
        self.load_state_dict(state)
        if self.rt.is_main:
            # Drop what a killed run logged after its last checkpoint; the resumed run logs it again.
            self.history = [m for m in read_metrics(self.out) if m["step"] <= self.step]
            write_metrics(self.out, self.history)
            if self.history:
                save_loss_plot(self.history, self.out / "loss.png", title=self.out.name)
        logger.info("resumed %s from step %d", self.checkpoint_path(), self.step)

    # -- the loop ----------------------------------------------------------------------------------------------

    def loss_on(self, x: torch.Tensor, y: torch.Tensor, model=None) -> torch.Tensor:
        """Mean cross-entropy of predicting `y` from `x`, both (B, T), in fp32 (the forward under the autocast)."""
        model = model if model is not None else self.forward_model
        with self.rt.autocast():
            logits = model(input_ids=x, use_cache=False).logits  # (B, T, vocab)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))

    @torch.no_grad()
    def estimate_loss(self) -> dict[str, float]:
        """The lesson's `estimate_loss`: mean loss over `eval_iters` random batches of each split (all ranks').

        Uses its own generator, seeded by the step, so evaluating never shifts the training batches.
        """
        self.model.eval()
        out = {}
        for split in ("train", "val"):
            gen = torch.Generator().manual_seed(self.cfg.seed + 7919 * (self.step + 1) + self.rt.rank)
            losses = torch.zeros(self.cfg.eval_iters, device=self.rt.device)
            for i in range(self.cfg.eval_iters):
                x, y = self.dataset.get_batch(split, self.cfg.batch_size, gen)
                losses[i] = self.loss_on(x, y, self.model)
            out[split] = float(self.rt.mean(losses.mean()))
        self.model.train()
        return out

    def train_step(self) -> torch.Tensor:
        """One optimizer step over `grad_accum` micro-batches; returns the mean loss (a tensor, not synced)."""
        total = torch.zeros((), device=self.rt.device)
        for micro in range(self.cfg.grad_accum):
            x, y = self.dataset.get_batch("train", self.cfg.batch_size, self.batch_gen)
            last = micro == self.cfg.grad_accum - 1
            # Under DDP, gradients are all-reduced only on the last micro-batch.
            sync = contextlib.nullcontext() if (last or not self.rt.ddp) else self.ddp_model.no_sync()
            with sync:
                loss = self.loss_on(x, y) / self.cfg.grad_accum
                loss.backward()
            total += loss.detach()
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return total

    def fit(self) -> dict:
        """Runs to `max_iters` (or early stop), evaluating and checkpointing; returns the final metrics."""
        lock = None
        try:
            lock = lock_folder(self.out) if self.rt.is_main else None  # one run per output folder
            self._start()
            self._loop()
            return self._finish()
        finally:
            if self.trackers is not None:
                self.trackers.close()
            if lock is not None:
                lock.close()
            self.rt.close()

    def _start(self) -> None:
        if self.rt.is_main:  # under the folder's lock: what is left is an interrupted run's
            remove_stale_temp_files(self.out)
        if self.cfg.resume:
            self.resume()
            self._start_trackers(resume_step=self.step)
            self._session = (self.step, self.train_time, self.wall_time, len(self.history))
            return
        check_folder(self.cfg)  # again, under the folder's lock
        if self.rt.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            write_metrics(self.out, [])  # a fresh run starts a fresh log
            remove_snapshots(self.out)  # and keeps no earlier run's states
            self.best_weights_path().unlink(missing_ok=True)
        self._start_trackers()
        self._set_rng_state(self._initial_rng)
        self.model.train()
        self._session = (self.step, self.train_time, self.wall_time, len(self.history))
        t0 = time.perf_counter()
        self._evaluate()  # step 0, as in the lesson
        self.wall_time += time.perf_counter() - t0

    def _start_trackers(self, resume_step: int | None = None) -> None:
        if self.rt.is_main and self.report_to:
            settings = {**dataclasses.asdict(self.cfg), "model": self.model_config.to_diff_dict()}
            self.trackers = Trackers(self.report_to, self.out, settings, resume_step)

    def _loop(self) -> None:
        cfg = self.cfg
        bar = progress_bar(self.step, cfg.max_iters, disable=not (cfg.progress and self.rt.is_main))
        ckpt_every = cfg.checkpoint_interval or cfg.eval_interval
        t_last = time.perf_counter()
        shown_step, shown_time = self.step, self.train_time  # tokens/s on the bar: over the last few steps
        while self.step < cfg.max_iters and not self.stopped_early:
            loss = self.train_step()
            self.step += 1
            evaluate = self.step % cfg.eval_interval == 0 or self.step == cfg.max_iters
            if evaluate:
                self.rt.synchronize()  # CUDA runs ahead of Python: the steps still queued count as training time
            now = time.perf_counter()
            self.train_time += now - t_last
            self.wall_time += now - t_last
            t_last = now
            bar.update(1)
            if not bar.disable and (self.step % 10 == 0 or self.step == cfg.max_iters):
                tok_s = (self.step - shown_step) * self.tokens_per_step / max(self.train_time - shown_time, 1e-9)
                bar.set_postfix(loss=f"{float(loss):.4f}", tok_s=f"{tok_s:,.0f}", refresh=False)
                shown_step, shown_time = self.step, self.train_time
            if evaluate:
                self.stopped_early = self._evaluate()
                if self.step in self.snapshot_steps and self.rt.is_main:
                    self.save_snapshot()
            if self.step % ckpt_every == 0 or self.step == cfg.max_iters or self.stopped_early:
                self.save_checkpoint()
            now = time.perf_counter()
            self.wall_time += now - t_last  # evaluation and checkpoints count as wall time, not training time
            t_last = now
            early = self.step - self._session[0] == ETA_STEPS and not evaluate  # an evaluation's line says it too
            if early and self.rt.is_main:
                logger.info("step %d of %d: %s", self.step, cfg.max_iters, self.time_left())
        bar.close()

    def _evaluate(self) -> bool:
        """Evaluates, logs, plots and keeps the best weights; returns whether patience ran out."""
        left = f"; {self.time_left()}" if 0 < self.step < self.cfg.max_iters else ""  # before this evaluation counts
        losses = self.estimate_loss()
        previous = self.history[-1] if self.history else None
        tokens = self.step * self.tokens_per_step
        record = {
            "step": self.step,
            "train_loss": losses["train"],
            "val_loss": losses["val"],
            "lr": self.scheduler.get_last_lr()[0],  # the learning rate of the next step
            "tokens": tokens,
            "time_s": round(self.train_time, 2),
        }
        if previous is not None and "tokens" in previous and self.train_time > previous["time_s"]:
            record["tokens_per_s"] = round((tokens - previous["tokens"]) / (self.train_time - previous["time_s"]), 1)
        self.history.append(record)
        improved = losses["val"] < self.best_val
        if improved:
            self.best_val, self.best_step, self.evals_since_best = losses["val"], self.step, 0
        else:
            self.evals_since_best += 1
        if self.rt.is_main:
            if self.cfg.keep_best and improved:
                save_checkpoint(self.best_weights_path(), {"model": self.model.state_dict(), "step": self.step})
            logger.info("step %d: train loss %.4f, val loss %.4f%s", self.step, losses["train"], losses["val"], left)
            append_metric(self.out, record)
            if self.trackers is not None:
                self.trackers.log(record)
            save_loss_plot(self.history, self.out / "loss.png", title=self.out.name)
        stop = bool(self.cfg.patience) and self.evals_since_best >= self.cfg.patience
        if stop:
            logger.info("early stop at step %d: no better val loss in %d evaluations", self.step, self.cfg.patience)
        return stop

    def time_left(self) -> str:
        """'about 3m 40s left (0.31 s a step, 2.4 s an evaluation)': measured over this session's steps so far."""
        start_step, start_train, start_wall, start_evals = self._session
        steps, evals = self.step - start_step, len(self.history) - start_evals
        step_s = (self.train_time - start_train) / max(steps, 1)
        eval_s = ((self.wall_time - start_wall) - (self.train_time - start_train)) / max(evals, 1)
        left = time_left(self.step, self.cfg.max_iters, self.cfg.eval_interval, step_s, eval_s)
        left = format_duration(left) if left >= 60 else f"{left:.0f}s"
        return f"about {left} left ({step_s:.2f} s a step, {eval_s:.1f} s an evaluation)"

    def write_model_folder(self, folder: Path, record: StepRecord | None, result: dict | None = None) -> None:
        """Writes the model as it is now into `folder`, a `save_pretrained` folder: weights and config, tokenizer,
        corpus record, the step record (`record`: which step, its losses) and a card: with `result`, the model's
        (`write_model_card`), else a snapshot's (`write_snapshot_card`)."""
        # transformers' "Writing model shards" bar only with the progress bars (`--progress`), and only for the final
        # folder: a snapshot is written while the training's bar is on the screen
        loud = self.cfg.progress and result is not None
        with contextlib.nullcontext() if loud else quiet_weight_loading():
            self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        write_corpus_record(folder, self.corpus)  # what the surfaces and the export read of the text
        if record is not None:
            write_step_record(folder, record)
        if result is not None:
            write_model_card(self, result, folder)
        elif record is not None:  # a snapshot
            write_snapshot_card(self, record, folder)

    def save_snapshot(self) -> Path:
        """Keeps the model as it is at this evaluation in `OUT/snapshots/step-NNNNNN/` (written whole, replacing one
        an interrupted run wrote at the same step); returns the folder."""
        last = self.history[-1]
        record = StepRecord(self.step, last["val_loss"], last["train_loss"])
        folder = write_new_folder(
            snapshot_folder(self.out, self.step), lambda tmp: self.write_model_folder(tmp, record), replace=True
        )
        logger.info("kept the model of step %d in %s", self.step, folder)
        return folder

    def _finish(self) -> dict:
        chosen = self.history[-1] if self.history else {}
        if self.cfg.keep_best and self.best_weights_path().exists():
            best = read_checkpoint(self.best_weights_path())
            self.model.load_state_dict(upgrade_state_dict(best["model"]))
            chosen = next((m for m in self.history if m["step"] == best["step"]), chosen)
        result = {
            "step": chosen.get("step"),
            "train_loss": chosen.get("train_loss"),
            "val_loss": chosen.get("val_loss"),
            "final_step": self.step,
            "stopped_early": self.stopped_early,
            "train_time_s": round(self.train_time, 1),
            "wall_time_s": round(self.wall_time, 1),
            "parameters": sum(p.numel() for p in self.model.parameters()),
        }
        if self.rt.is_main:
            self.model.eval()
            known = result["step"] is not None and result["val_loss"] is not None and result["train_loss"] is not None
            record = StepRecord(result["step"], result["val_loss"], result["train_loss"]) if known else None
            # a complete folder, or the previous one
            publish_folder(self.out, lambda folder: self.write_model_folder(folder, record, result))
            logger.info("saved the model to %s (val loss %.4f, step %s)", self.out, result["val_loss"], result["step"])
        self.rt.barrier()
        return result
