"""What a run shows and leaves behind: the progress bar, metrics.jsonl, the loss-curve PNG and the model card."""

from __future__ import annotations

import json
import logging
import os
import platform
from pathlib import Path

import torch
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from gpt_serve.folders.corpus_record import CorpusRecord
from gpt_serve.folders.markdown import escape
from gpt_serve.folders.snapshots import StepRecord

from .config import ARCH_KEYS, OPTIMIZATION_KEYS
from .outputs import explain_write_error, temp_path
from .runtime import Runtime

METRICS_NAME = "metrics.jsonl"
logger = logging.getLogger(__name__)


def progress_bar(initial: int, total: int, disable: bool = False):
    """A tqdm bar over optimizer steps (it shows the ETA; the trainer adds loss and tokens/s)."""
    from tqdm.auto import tqdm

    return tqdm(initial=initial, total=total, disable=disable, unit="step", dynamic_ncols=True)


def time_left(step: int, max_iters: int, eval_interval: int, step_seconds: float, eval_seconds: float) -> float:
    """Seconds a run at `step` has left: its steps at `step_seconds` each, and its evaluations (every
    `eval_interval` steps and at the last, with their checkpoints and snapshots) at `eval_seconds` each."""
    evals = max_iters // eval_interval - step // eval_interval + (1 if max_iters % eval_interval else 0)
    return (max_iters - step) * step_seconds + evals * eval_seconds


# -- metrics.jsonl: one JSON object per evaluation -----------------------------------------------------------


def read_metrics(out: str | os.PathLike) -> list[dict]:
    """The records of `out/metrics.jsonl`. A torn last line (a kill or a full disk in the middle of writing it) is
    dropped with a warning; a bad line before it is a ValueError naming the file and the line."""
    path = Path(out) / METRICS_NAME
    if not path.exists():
        return []
    lines = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.strip()]
    records = []
    for i, (n, line) in enumerate(lines):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "step" not in record:
                raise ValueError("not a metrics record")
        except ValueError as e:
            if i == len(lines) - 1:
                logger.warning("%s: dropping its torn last line %d (%s)", path, n, str(e)[:80])
                break
            raise ValueError(
                f"{path} line {n} is not a metrics record ({e}); the lines after it are intact, so it was edited "
                f"or damaged: fix or delete that line"
            ) from None
        records.append(record)
    return records


def write_metrics(out: str | os.PathLike, records: list[dict]) -> None:
    """Replaces metrics.jsonl with `records` (atomically)."""
    path = Path(out) / METRICS_NAME
    tmp = temp_path(path)
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, path)


def append_metric(out: str | os.PathLike, record: dict) -> None:
    path = Path(out) / METRICS_NAME
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as e:  # a torn line is dropped when the run resumes (`read_metrics`)
        raise explain_write_error(e, path) from None


# -- plots ---------------------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | os.PathLike) -> None:
    """Saves a figure under a temporary name, then renames it, so a reader never sees half a PNG."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        fig.savefig(tmp)
    except (OSError, RuntimeError) as e:
        raise explain_write_error(e, tmp) from None
    finally:
        _pyplot().close(fig)
    os.replace(tmp, path)


def save_loss_plot(history: list[dict], path: str | os.PathLike, title: str = "loss") -> None:
    """Train and val loss against step, as a PNG."""
    plt = _pyplot()
    steps = [m["step"] for m in history]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    ax.plot(steps, [m["train_loss"] for m in history], marker=".", label="train")
    ax.plot(steps, [m["val_loss"] for m in history], marker=".", label="val")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (nats/char)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    _save(fig, path)


def save_val_curves(
    curves: dict[str, list[dict]],
    path: str | os.PathLike,
    targets: dict[str, float] | None = None,
    title: str = "validation loss",
) -> None:
    """The val-loss curves of several runs on one plot; `targets` adds a dotted line per run (e.g. the lesson's)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    lows = []
    for i, (name, history) in enumerate(curves.items()):
        color = f"C{i}"
        ax.plot([m["step"] for m in history], [m["val_loss"] for m in history], color=color, label=name)
        lows += [m["val_loss"] for m in history]
        if targets and name in targets:
            ax.axhline(targets[name], color=color, linestyle=":", linewidth=1)
    if lows:  # the step-0 losses (~4.2) would flatten everything else
        ax.set_ylim(min(lows + list((targets or {}).values())) - 0.05, min(max(lows), 3.0))
    ax.set_xlabel("step")
    ax.set_ylabel("val loss (nats/char)")
    ax.set_title(title + (" (dotted: the lesson's)" if targets else ""))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    _save(fig, path)


# -- the model card ------------------------------------------------------------------------------------------


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware(rt: Runtime) -> str:
    """A one-line description of what trained the model."""
    if rt.device.type == "cuda":
        what = f"{torch.cuda.get_device_name(rt.device)} (CUDA {torch.version.cuda}, {rt.precision})"
    else:
        threads = rt.threads or torch.get_num_threads()
        what = f"{cpu_name()} CPU ({os.cpu_count()} cores), PyTorch threads: {threads}, {rt.precision}"
    procs = f"{rt.world_size} DDP process{'es' if rt.world_size > 1 else ''} x " if rt.ddp else ""
    return f"{procs}{what}; torch {torch.__version__}"


def format_duration(seconds: float) -> str:
    hours, rem = divmod(int(round(seconds)), 3600)
    return f"{hours}h {rem // 60}m {rem % 60}s" if hours else f"{rem // 60}m {rem % 60}s"


def generate_sample(model, tokenizer, n_tokens: int, seed: int = 0) -> str:
    from gpt_serve.generation import generate_text
    from gpt_serve.generation.backends.torch_backend import TorchBackend

    if n_tokens <= 0:
        return ""
    threads = torch.get_num_threads()  # the backend's thread tuner may change the count while it decodes
    try:
        return generate_text(TorchBackend(model), tokenizer.vocab, "", n_tokens, seed=seed)  # temperature 1
    finally:
        torch.set_num_threads(threads)


TINY_SHAKESPEARE_HUB_ID = "karpathy/tiny_shakespeare"


def hub_id(corpus: CorpusRecord) -> str | None:
    """The Hub dataset id of the training text, when there is one."""
    return TINY_SHAKESPEARE_HUB_ID if corpus.is_tiny_shakespeare else None


def card_name(corpus: CorpusRecord) -> str:
    """How the card names the training text: 'Tiny Shakespeare', else 'NAME (sha256 ...)'."""
    return corpus.name if hub_id(corpus) else f"{corpus.name} (sha256 {corpus.sha256})"


def card_data(
    name: str, val: float, train: float, corpus: CorpusRecord, base_model: str | None = None
) -> ModelCardData:
    """The model card's metadata (the YAML the Hub reads): license, task, library, dataset, the losses, the model it
    was fine-tuned from (`base_model`), and the corpus's sample prompts as the Hub's widget examples."""
    dataset_id = hub_id(corpus)
    split = "first 90% train, last 10% validation"
    dataset = {"dataset_type": dataset_id or "text", "dataset_name": f"{card_name(corpus)} ({split})"}
    losses = [
        ("validation cross-entropy (nats/char)", val, "validation"),
        ("train cross-entropy (nats/char)", train, "train"),
    ]
    results = [
        EvalResult(
            task_type="text-generation",
            task_name="character-level language modeling",
            metric_type="loss",
            metric_name=metric,
            metric_value=round(float(value), 4),
            dataset_split=split,
            **dataset,
        )
        for metric, value, split in losses
    ]
    return ModelCardData(
        model_name=name,
        base_model=base_model,
        license="mit",
        language=["en"] if dataset_id else None,  # other corpora: the author knows their language
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["gpt-serve", "chargpt", "character-level"],
        datasets=[dataset_id] if dataset_id else None,
        metrics=["loss"],
        eval_results=results,
        widget=[{"text": prompt} for prompt in corpus.prompts] or None,
    )


def save_card(folder: Path, data: ModelCardData, body: str) -> None:
    """Writes `folder/README.md`: the Hub's YAML front matter (`data`), then `body` (Markdown)."""
    ModelCard(f"---\n{data.to_yaml()}\n---\n{body}").save(folder / "README.md")


def use_section(corpus: CorpusRecord) -> str:
    """The card's "## Use" section: loading the folder with transformers, and `gpt-serve generate`, from the
    model's own first sample prompt."""
    prompt = json.dumps(corpus.default_prompt)
    return f"""## Use

```python
import gpt_serve
from transformers import AutoModelForCausalLM, AutoTokenizer

gpt_serve.register_auto_classes()  # "chargpt" for the Auto classes

model = AutoModelForCausalLM.from_pretrained("PATH")  # or trust_remote_code=True without gpt_serve
tokenizer = AutoTokenizer.from_pretrained("PATH")
ids = tokenizer({prompt}, return_tensors="pt").input_ids
print(tokenizer.decode(model.generate(ids, max_new_tokens=200, do_sample=True)[0]))
```

```bash
gpt-serve generate PATH --max-new-tokens 200  # the prompt: {prompt}
```
"""


def base_model_name(trainer) -> str | None:
    """What the card's `base_model` says: the name of the model the run started from (`--init-from`), if any."""
    base = trainer.prepared.base
    return base.name if base is not None else None


def trained(trainer) -> str:
    """'trained with gpt-serve', or 'fine-tuned with gpt-serve from `BASE`'."""
    name = base_model_name(trainer)
    return f"fine-tuned with gpt-serve from `{escape(name)}`" if name else "trained with gpt-serve"


def base_rows(trainer) -> str:
    """The card's table rows about the base model (none for a run from scratch): its name, and its losses on this
    text before fine-tuning (the run's step-0 evaluation)."""
    base = trainer.prepared.base
    if base is None:
        return ""
    where = "a model shipped with gpt-serve" if base.shipped else "a model folder"
    added = trainer.prepared.new_chars
    vocab = f"{len(added)} new character{'s' if len(added) != 1 else ''} added" if added else "its vocabulary"
    rows = f"| base model | `{escape(base.name)}` ({where}; {vocab}) |\n"
    start = next((m for m in trainer.history if m["step"] == 0), None)
    if start is not None:
        rows += (
            f"| base model on this text | validation loss {start['val_loss']:.4f}, train loss "
            f"{start['train_loss']:.4f} (before fine-tuning: step 0) |\n"
        )
    return rows


def write_snapshot_card(trainer, record: StepRecord, folder: str | os.PathLike) -> None:
    """README.md of a snapshot (`--snapshots`): which run and step it is, its losses, the training text and how to
    use it. No sample: the model is mid-run (in training mode, its RNG the run's), and nothing may change what the
    run does next."""
    cfg = trainer.cfg
    run = Path(cfg.out_dir).resolve().name
    name = f"{run} at step {record.step}"
    body = f"""
# {escape(name)}

An earlier state of the character-level GPT trained in `{run}/`, kept by gpt-serve's training at step
{record.step} of {cfg.max_iters} (`--snapshots`), on {escape(card_name(trainer.corpus))}:
{escape(trainer.corpus.description)}. The demo compares the model with it; the run's own card, loss curve and
metrics are in the run's folder.

| | |
|---|---|
| validation loss | **{record.val_loss:.4f}** (step {record.step}; mean of {cfg.eval_iters} random batches) |
| train loss | {record.train_loss:.4f} |
{base_rows(trainer)}
Command:

```
{trainer.command or "(trained from Python)"}
```

{use_section(trainer.corpus)}"""
    data = card_data(name, record.val_loss, record.train_loss, trainer.corpus, base_model_name(trainer))
    save_card(Path(folder), data, body)


def write_model_card(trainer, result: dict, folder: str | os.PathLike | None = None) -> None:
    """README.md with Hugging Face YAML front matter (`card_data`): losses, command, hardware, wall time, a sample."""
    cfg, mc = trainer.cfg, trainer.model_config
    name = Path(cfg.out_dir).resolve().name
    sample = generate_sample(trainer.model, trainer.tokenizer, cfg.sample_tokens)
    val, train = result["val_loss"], result["train_loss"]
    arch = {k: getattr(mc, k) for k in ARCH_KEYS}
    train_opts = {k: getattr(cfg, k) for k in (*OPTIMIZATION_KEYS, "keep_best")}
    chosen = "best validation loss" if cfg.keep_best else "last step"
    early = f", stopped early at step {result['final_step']}" if result.get("stopped_early") else ""
    sequences = cfg.batch_size * cfg.grad_accum * trainer.rt.world_size
    steps = f"{result['final_step']}{early}, each {trainer.tokens_per_step:,} tokens ({sequences} x {mc.block_size})"
    wall = (
        f"{format_duration(result['wall_time_s'])} ({format_duration(result['train_time_s'])} in optimizer steps, "
        f"the rest in evaluation and checkpoints)"
    )
    body = f"""
# {name}

A character-level GPT from the "Let's build GPT" lesson, {trained(trainer)} on {escape(card_name(trainer.corpus))}:
{escape(trainer.corpus.description)} ({result["parameters"]:,} parameters).

| | |
|---|---|
| validation loss | **{val:.4f}** (step {result["step"]}, the {chosen}; mean of {cfg.eval_iters} random batches) |
| train loss | {train:.4f} |
{base_rows(trainer)}| steps | {steps} |
| wall time | {wall} |
| hardware | {hardware(trainer.rt)} |

Command:

```
{trainer.command or "(trained from Python)"}
```

Architecture: `{arch}`

Training: `{train_opts}`

{use_section(trainer.corpus)}
## Sample (temperature 1.0, seed 0, from a newline)

```
{sample}
```

![loss curve](loss.png)
"""
    data = card_data(name, val, train, trainer.corpus, base_model_name(trainer))
    save_card(Path(folder if folder is not None else cfg.out_dir), data, body)
