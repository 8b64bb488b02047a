"""What a run shows and leaves behind: the progress bar, the loss-curve PNG and the model card."""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def progress_bar(initial: int, total: int, disable: bool = False):
    from tqdm.auto import tqdm

    return tqdm(initial=initial, total=total, disable=disable, unit="step", dynamic_ncols=True)


def save_loss_plot(history: list[dict], path: Path, title: str = "loss") -> None:
    """Train and val loss against step, as a PNG (written to a temporary name, then renamed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in history]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    ax.plot(steps, [m["train_loss"] for m in history], label="train")
    ax.plot(steps, [m["val_loss"] for m in history], label="val")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = Path(path).with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)


def hardware() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    return f"{platform.machine()} CPU, {torch.get_num_threads()} PyTorch threads"


def generate_sample(model, tokenizer, n_tokens: int, seed: int = 0) -> str:
    from gpt_serve.engine import generate_text
    from gpt_serve.torch_backend import TorchBackend

    if n_tokens <= 0:
        return ""
    return generate_text(TorchBackend(model), tokenizer.vocab, "\n", max_new_tokens=n_tokens, temperature=1.0, seed=seed)


def write_model_card(trainer, result: dict) -> None:
    cfg, mc = trainer.cfg, trainer.model_config
    sample = generate_sample(trainer.model, trainer.tokenizer, cfg.sample_tokens)
    val, train = result["val_loss"], result["train_loss"]
    hours, rem = divmod(int(result["train_time_s"]), 3600)
    wall = f"{hours}h {rem // 60}m {rem % 60}s" if hours else f"{rem // 60}m {rem % 60}s"
    arch = {k: getattr(mc, k) for k in ("block_size", "n_embd", "n_head", "n_layer", "dropout", "attn_proj",
                                         "ffwd_mult", "ffwd_proj", "residual", "layer_norm", "init")}
    train_opts = {k: getattr(cfg, k) for k in ("batch_size", "grad_accum", "learning_rate", "schedule",
                                               "warmup_iters", "min_lr", "max_iters", "weight_decay", "grad_clip",
                                               "seed", "keep_best")}
    card = f"""---
library_name: transformers
pipeline_tag: text-generation
tags:
- gpt-serve
- chargpt
- character-level
datasets:
- tiny_shakespeare
model-index:
- name: {Path(cfg.out_dir).name}
  results:
  - task:
      type: text-generation
    dataset:
      name: Tiny Shakespeare (last 10% as validation)
      type: tiny_shakespeare
    metrics:
    - type: loss
      name: validation cross-entropy (nats/char)
      value: {val:.4f}
    - type: loss
      name: train cross-entropy (nats/char)
      value: {train:.4f}
---

# {Path(cfg.out_dir).name}

A character-level GPT from the "Let's build GPT" lesson, trained with gpt-serve on Tiny Shakespeare
({result['parameters']:,} parameters).

| | |
|---|---|
| validation loss | **{val:.4f}** (mean of {cfg.eval_iters} random batches, step {result['step']}) |
| train loss | {train:.4f} |
| steps | {result['final_step']} x {cfg.batch_size * cfg.grad_accum} sequences of {mc.block_size} characters |
| training wall time | {wall} (excluding evaluation) |
| hardware | {hardware()} |

Command:

```
{trainer.command or "(trained from Python)"}
```

Architecture: `{arch}`

Training: `{train_opts}`

## Use

```python
import gpt_serve  # registers the model with the Auto classes
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("PATH")  # or trust_remote_code=True without gpt_serve
tokenizer = AutoTokenizer.from_pretrained("PATH")
ids = tokenizer("ROMEO:", return_tensors="pt").input_ids
print(tokenizer.decode(model.generate(ids, max_new_tokens=200, do_sample=True)[0]))
```

## Sample (temperature 1.0, seed 0, from a newline)

```
{sample}
```

![loss curve](loss.png)
"""
    (Path(cfg.out_dir) / "README.md").write_text(card, encoding="utf-8")
