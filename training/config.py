"""Training options (`TrainConfig`, one command-line flag per field) and the learning-rate schedule.

Torch-free: the command line checks its flags with it before torch is imported (an error answers at once).
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, field, fields

from gpt_serve.generation.backends.threads import available_cpus

PRECISIONS = ("auto", "bf16", "fp32")

# The model config entries a checkpoint must share with the run resuming it (the architecture).
ARCH_KEYS = (
    "vocab_size",
    "block_size",
    "n_embd",
    "n_head",
    "n_layer",
    "dropout",
    "attn_proj",
    "ffwd_mult",
    "ffwd_proj",
    "residual",
    "layer_norm",
    "bias",
    "init",
    "initializer_range",
    "layer_norm_eps",
)

SCHEDULES = ("constant", "cosine")
MAX_SNAPSHOTS = 32  # each snapshot is a full copy of the weights: a bound on what a run may keep on disk

# The training options that decide the optimization a run does (the model card records them; a checkpoint must
# share them, and `eval_interval`, with the run resuming it).
OPTIMIZATION_KEYS = (
    "batch_size",
    "grad_accum",
    "learning_rate",
    "schedule",
    "warmup_iters",
    "min_lr",
    "max_iters",
    "seed",
    "weight_decay",
    "grad_clip",
    "eval_iters",
)


def _config_arguments() -> dict[str, object]:
    """The keyword arguments of `CharGPTConfig.__init__` and their defaults, read from its source: importing it
    imports transformers and torch (seconds), and a mistyped `--model.KEY` should be named before that."""
    path = importlib.util.find_spec("gpt_serve.chargpt.configuration_chargpt").origin
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CharGPTConfig")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    args = init.args.args[1:]  # without self
    defaults = [ast.literal_eval(d) for d in init.args.defaults]
    return dict(zip([a.arg for a in args], [None] * (len(args) - len(defaults)) + defaults))


CONFIG_DEFAULTS = _config_arguments()
# What `model` may set: CharGPTConfig's own arguments, except the vocabulary (its size and hash), which the corpus
# decides.
MODEL_KEYS = tuple(k for k in CONFIG_DEFAULTS if k not in ("vocab_size", "vocab_sha256"))
# What `model` may set in a run that starts from a model (`init_from`): the rest is the base's architecture.
FINETUNE_MODEL_KEYS = ("block_size", "dropout")


def flag(name: str) -> str:
    """The command-line flag of a `TrainConfig` field: `max_iters` -> `--max-iters`."""
    return "--" + name.replace("_", "-")


def _opt(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    """Training options. Every field except `model` is also a command-line flag of `python -m training`."""

    out_dir: str = _opt("out", "output folder: the model, metrics.jsonl, loss.png, checkpoints/")
    data: str | None = _opt(None, "UTF-8 corpus; default: Tiny Shakespeare, downloaded once into the user cache")
    data_name: str | None = _opt(
        None, "what the corpus is called on the model's pages (default: Tiny Shakespeare, else the file's name)"
    )
    data_description: str | None = _opt(
        None, "one short sentence about the corpus, for the model's pages (default: its length in characters)"
    )
    batch_size: int = _opt(32, "sequences per micro-batch (per process under torchrun)")
    grad_accum: int = _opt(1, "micro-batches per optimizer step (gradient accumulation)")
    learning_rate: float = _opt(1e-3, "peak AdamW learning rate")
    schedule: str = _opt("constant", "'constant' (the lesson) or 'cosine' (warmup, then cosine decay to --min-lr)")
    warmup_iters: int = _opt(0, "steps of linear warmup (both schedules)")
    min_lr: float = _opt(0.0, "final learning rate of the cosine schedule")
    max_iters: int = _opt(5000, "optimizer steps")
    weight_decay: float = _opt(0.01, "AdamW weight decay of matrices, not biases or LayerNorm (0.01: AdamW's default)")
    beta1: float = _opt(0.9, "AdamW beta1")
    beta2: float = _opt(0.999, "AdamW beta2")
    grad_clip: float = _opt(0.0, "clip the gradient norm to this value (0: no clipping)")
    eval_interval: int = _opt(500, "evaluate every this many steps (and at step 0 and at the end)")
    eval_iters: int = _opt(200, "batches per split averaged by each evaluation (the lesson's estimate_loss)")
    checkpoint_interval: int = _opt(0, "checkpoint every this many steps (0: at each evaluation)")
    keep_best: bool = _opt(False, "save the weights with the best validation loss rather than the last")
    snapshots: int = _opt(
        4,
        "also keep this many earlier states of the model, evenly spaced over the evaluations, as model folders "
        f"OUT/snapshots/step-NNNNNN/ (0: none; at most {MAX_SNAPSHOTS}; the demo compares the model with them)",
    )
    patience: int = _opt(0, "with --keep-best: stop after this many evaluations without improvement (0: never)")
    seed: int = _opt(1337, "seed of the initial weights, dropout and batch sampling")
    device: str = _opt("auto", "'auto' (CUDA if available), 'cpu', 'cuda' or 'cuda:N'")
    compile: bool | None = _opt(None, "torch.compile the model (default: on for CUDA, off for CPU)")
    precision: str = _opt(
        "auto", "'auto' (bf16 autocast + TF32 on CUDA, fp32 on CPU), 'bf16' (autocast) or 'fp32' (no TF32)"
    )
    threads: int = _opt(0, "CPU threads per process (default 0: PyTorch's choice)")
    resume: bool = _opt(False, "continue the run checkpointed in --out-dir exactly")
    sample_tokens: int = _opt(300, "length of the sample written into the model card")
    progress: bool = _opt(True, "show a progress bar (rank 0)")
    report_to: str = _opt(
        "none", "also log the metrics to 'tensorboard' (OUT/tensorboard/) or 'trackio'; comma-separate for both"
    )
    init_from: str | None = _opt(
        None,
        "start from a model you have: a shipped model's name (e.g. shakespeare) or a model folder (a run's, a "
        "snapshot, an imported checkpoint's); its architecture and weights, its vocabulary extended for new characters",
    )
    model: dict = field(default_factory=dict)  # CharGPTConfig keyword arguments

    def validate(self) -> None:
        """A ValueError naming the flag of the first option out of range (`--max-iters must be >= 1, got 0`)."""
        for name in ("batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters"):
            if getattr(self, name) < 1:
                raise ValueError(f"{flag(name)} must be >= 1, got {getattr(self, name)}")
        for name in (
            "grad_clip",
            "warmup_iters",
            "min_lr",
            "threads",
            "checkpoint_interval",
            "patience",
            "weight_decay",
            "sample_tokens",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{flag(name)} must be >= 0, got {getattr(self, name)}")
        cpus = available_cpus()
        if self.threads > cpus:
            raise ValueError(
                f"--threads must be 0 (PyTorch's default) or at most the {cpus} CPUs this process may use, "
                f"got {self.threads}"
            )
        if self.learning_rate <= 0:
            raise ValueError(f"--learning-rate must be > 0, got {self.learning_rate}")
        for name, choices in (("precision", PRECISIONS), ("schedule", SCHEDULES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{flag(name)} must be one of {choices}, got {getattr(self, name)!r}")
        if not 0 <= self.snapshots <= MAX_SNAPSHOTS:
            raise ValueError(
                f"--snapshots must be 0 (none) to {MAX_SNAPSHOTS} (each is a full copy of the weights), "
                f"got {self.snapshots}"
            )
        if self.patience and not self.keep_best:
            raise ValueError("--patience (early stopping) needs --keep-best, so the best weights are the ones saved")
        self._validate_model()

    def _validate_model(self) -> None:
        unknown = sorted(set(self.model) - set(MODEL_KEYS))
        if unknown:
            raise ValueError(
                f"unknown model config argument(s) {', '.join('--model.' + k for k in unknown)}; --model.KEY takes "
                f"CharGPTConfig's arguments: {', '.join(sorted(MODEL_KEYS))}"
            )
        fixed = sorted(set(self.model) - set(FINETUNE_MODEL_KEYS))
        if self.init_from is not None and fixed:
            raise ValueError(
                f"{', '.join('--model.' + k for k in fixed)}: a run with --init-from keeps the architecture of its "
                f"base ({self.init_from}); only {' and '.join('--model.' + k for k in FINETUNE_MODEL_KEYS)} may "
                f"change (drop the other --model flags, or train from scratch without --init-from)"
            )

    @classmethod
    def flag_fields(cls):
        return [f for f in fields(cls) if f.name != "model"]


def make_scheduler(cfg: TrainConfig, optimizer):
    """transformers' learning-rate schedule for `cfg`: linear warmup over `warmup_iters` steps (from 0), then
    constant, or a cosine decay to `min_lr` at `max_iters`."""
    from transformers import get_constant_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup

    if cfg.schedule == "constant":
        return get_constant_schedule_with_warmup(optimizer, cfg.warmup_iters)
    return get_cosine_with_min_lr_schedule_with_warmup(optimizer, cfg.warmup_iters, cfg.max_iters, min_lr=cfg.min_lr)
