"""The lesson's loss ladder: train stages A-E (F is GPU work) and set our losses beside the lesson's.

    python -m training.ladder --data PATH --threads 1 --ship-dir gpt_serve/models \\
        --table docs/ladder.md --plot docs/ladder.png

Each stage is an ordinary training run (`python -m training --preset ladder-X`) into `--out/ladder-X`. A stage
whose folder already holds a checkpoint is resumed (exactly), so a killed ladder continues where it stopped and
a finished stage is not trained again. The table gives, per stage, the loss of the lesson's `estimate_loss`
(200 random batches) and, to show how much of a difference is sampling noise, the mean loss over the whole
validation split in non-overlapping windows.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from gpt_serve.cli.flags import add_progress_argument, thread_count
from gpt_serve.folders.corpus import load_text

from .cli import invocation, program_name, report_error, setup_logging
from .data import CharDataset
from .presets import LADDER_STAGES, LADDER_TOLERANCE, PRESETS
from .report import read_metrics, save_val_curves
from .trainer import TrainConfig, Trainer

logger = logging.getLogger(__name__)
DEFAULT_STAGES = "a-e"


def parse_stages(spec: str) -> list[str]:
    """`"a-e"`, `"a,c,f"` or `"ladder-b"` -> preset names, in ladder order."""
    letters = [name[-1] for name in LADDER_STAGES]
    chosen = set()
    for part in spec.lower().replace(" ", "").split(","):
        part = part.removeprefix("ladder-")
        if len(part) == 3 and part[1] == "-" and part[0] in letters and part[2] in letters:
            lo, hi = letters.index(part[0]), letters.index(part[2])
            chosen.update(letters[lo : hi + 1])
        elif part in letters:
            chosen.add(part)
        else:
            raise ValueError(f"unknown ladder stage {part!r}; stages are {', '.join(letters)} (e.g. 'a-e' or 'a,c')")
    return [f"ladder-{c}" for c in letters if c in chosen]


@torch.no_grad()
def tiled_loss(model, dataset: CharDataset, split: str = "val", batch_size: int = 512) -> float:
    """Mean cross-entropy over the whole split, in non-overlapping `block_size` windows (no sampling noise)."""
    model.eval()
    device = next(model.parameters()).device
    x_all, y_all = dataset.tiled_windows(split)
    total, count = 0.0, 0
    for i in range(0, len(x_all), batch_size):
        x, y = x_all[i : i + batch_size].to(device), y_all[i : i + batch_size].to(device)
        logits = model(input_ids=x, use_cache=False).logits  # (B, T, vocab)
        total += float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"))
        count += y.numel()
    return total / count


def stage_config(preset_name: str, args: argparse.Namespace) -> TrainConfig:
    preset = PRESETS[preset_name]
    out_dir = Path(args.out) / preset_name
    values = {
        **preset.train,
        "out_dir": str(out_dir),
        "data": args.data,
        "threads": args.threads,
        "device": args.device,
        "seed": args.seed,
        "progress": args.progress,
        "resume": (out_dir / "checkpoints" / "checkpoint.pt").exists(),
    }
    for key in ("max_iters", "eval_interval", "eval_iters"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    return TrainConfig(**values, model=dict(preset.model))


def equivalent_command(preset_name: str, cfg: TrainConfig) -> str:
    """The single-stage `python -m training` command that trains the same model."""
    parts = ["python -m training", f"--preset {preset_name}", f"--out {cfg.out_dir}"]
    if cfg.data:
        parts.append(f"--data {cfg.data}")
    defaults = TrainConfig(**PRESETS[preset_name].train)
    for key in ("seed", "max_iters", "eval_interval", "eval_iters", "threads", "device"):
        if getattr(cfg, key) != getattr(defaults, key):
            parts.append(f"--{key.replace('_', '-')} {getattr(cfg, key)}")
    return " ".join(parts)


def run_stage(preset_name: str, args: argparse.Namespace, text: str, ladder_command: str) -> dict:
    cfg = stage_config(preset_name, args)
    logger.info("== %s: %s%s", preset_name, PRESETS[preset_name].description, " (resuming)" if cfg.resume else "")
    alone = equivalent_command(preset_name, cfg)
    command = f"{ladder_command}\n# stage {preset_name}; the same run on its own:\n{alone}"
    trainer = Trainer(cfg, text=text, command=command)
    result = trainer.fit()
    whole_val = tiled_loss(trainer.model, trainer.dataset, "val")
    lesson = PRESETS[preset_name].lesson_val_loss
    return {
        "stage": preset_name,
        "adds": PRESETS[preset_name].adds,
        "parameters": result["parameters"],
        "train_loss": result["train_loss"],
        "val_loss": result["val_loss"],
        "whole_val_loss": whole_val,
        "lesson_val_loss": lesson,
        "difference": None if lesson is None else result["val_loss"] - lesson,
        "steps": result["final_step"],
        "eval_iters": cfg.eval_iters,
        "seed": cfg.seed,
        "train_time_s": result["train_time_s"],
        "out_dir": cfg.out_dir,
    }


def ship(src: Path, dest: Path) -> None:
    """Copies a finished run into the package: the save_pretrained folder, card, plot and metrics, no checkpoints.

    What others added to a shipped folder stays: sub-folders (the ONNX exports in `onnx/`) and the marked
    sections of its README (`<!-- gpt-serve:NAME:begin ... -->` to `<!-- gpt-serve:NAME:end -->`).
    """
    dest.mkdir(parents=True, exist_ok=True)
    kept = _marked_sections((dest / "README.md").read_text(encoding="utf-8")) if (dest / "README.md").exists() else []
    for path in src.iterdir():
        if path.is_file() and not path.name.startswith(".") and not path.name.endswith(".tmp"):
            shutil.copy2(path, dest / path.name)
    if kept:
        card = (dest / "README.md").read_text(encoding="utf-8").rstrip("\n")
        (dest / "README.md").write_text(card + "\n\n" + "\n\n".join(kept) + "\n", encoding="utf-8")


_MARKED_SECTION = re.compile(r"<!-- gpt-serve:([\w-]+):begin.*?<!-- gpt-serve:\1:end -->", re.S)


def _marked_sections(text: str) -> list[str]:
    return [m.group(0) for m in _MARKED_SECTION.finditer(text)]


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| stage | what it adds | parameters | train loss | val loss | the lesson's val loss | difference "
        f"| within ±{LADDER_TOLERANCE} | val loss, whole split |",
        "|---|---|---:|---:|---:|---:|---:|:---:|---:|",
    ]
    for r in rows:
        lesson = "—" if r["lesson_val_loss"] is None else f"{r['lesson_val_loss']:.2f}"
        diff = "—" if r["difference"] is None else f"{r['difference']:+.3f}"
        ok = "—" if r["difference"] is None else ("yes" if abs(r["difference"]) <= LADDER_TOLERANCE else "**no**")
        lines.append(
            f"| {r['stage'][-1].upper()} | {r['adds']} | {r['parameters']:,} | {r['train_loss']:.4f} "
            f"| {r['val_loss']:.4f} | {lesson} | {diff} | {ok} | {r['whole_val_loss']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def write_report(rows: list[dict], path: Path, command: str, plot: Path | None) -> None:
    first = PRESETS[rows[0]["stage"]].train
    text = f"""# The lesson's loss ladder, reproduced

Produced by:

```
{command}
```

Every stage: batch {first["batch_size"]}, AdamW lr {first["learning_rate"]:g} (constant), {rows[0]["steps"]} steps,
seed {rows[0]["seed"]}; "train/val loss" is the lesson's `estimate_loss` at the last step (the mean of
{rows[0]["eval_iters"]} random batches per split); "val loss, whole split" is the mean over every
non-overlapping window of the validation split, free of that sampling noise. Stage presets: `training/presets.py`.

{markdown_table(rows)}"""
    if plot is not None:
        text += f"\n![validation loss of every stage]({_relative(plot, path.parent)})\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _relative(target: Path, start: Path) -> str:
    try:
        return str(target.resolve().relative_to(start.resolve()))
    except ValueError:
        return str(target)


def build_parser(prog: str = "python -m training.ladder") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n\n")[0],
        epilog="The shipped stages A-E took 8-51 s each, 1m51s in all, on one thread (their model cards' wall time).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--stages", default=DEFAULT_STAGES, help="stages to train, e.g. 'a-e', 'a,c' or 'f'")
    p.add_argument("--data", default=None, help="the corpus (none: Tiny Shakespeare, downloaded once)")
    p.add_argument("--out", default="runs/ladder", help="where the runs go, one folder per stage")
    p.add_argument("--ship-dir", default=None, help="also copy each model to SHIP_DIR/ladder-X (no checkpoints)")
    p.add_argument("--table", default=None, help="write the markdown table here (e.g. docs/ladder.md)")
    p.add_argument("--plot", default=None, help="write the val-loss curves of all stages here (e.g. docs/ladder.png)")
    p.add_argument("--threads", type=thread_count, default=1, help="CPU threads (1 is fastest for these tiny models)")
    p.add_argument("--device", default="auto", help="'auto', 'cpu', 'cuda' or 'cuda:N'")
    p.add_argument("--seed", type=int, default=1337, help="seed of every stage's weights, dropout and batches")
    add_progress_argument(p, default=True, help="show progress bars")
    quick = p.add_argument_group("quick runs (tests); the lesson's values need the presets' settings")
    quick.add_argument("--max-iters", type=int, default=None, help="optimizer steps (none: the preset's 5000)")
    quick.add_argument("--eval-interval", type=int, default=None, help="steps between evaluations (none: the preset's)")
    quick.add_argument("--eval-iters", type=int, default=None, help="batches per evaluation (none: the preset's)")
    return p


def main(argv: list[str] | None = None) -> int:
    from tqdm.contrib.logging import logging_redirect_tqdm

    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()
    try:
        args = build_parser(program_name("training.ladder", "ladder")).parse_args(argv)
        stages = parse_stages(args.stages)
        text = load_text(args.data)
        command = invocation(argv, module="training.ladder", subcommand="ladder")
        rows = []
        with logging_redirect_tqdm():
            for name in stages:
                rows.append(run_stage(name, args, text, command))
                if args.ship_dir:
                    ship(Path(args.out) / name, Path(args.ship_dir) / name)
        if args.plot:
            curves = {r["stage"]: read_metrics(r["out_dir"]) for r in rows}
            targets = {r["stage"]: r["lesson_val_loss"] for r in rows if r["lesson_val_loss"] is not None}
            Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
            save_val_curves(curves, args.plot, targets, title="the lesson's ladder: validation loss")
        if args.table:
            write_report(rows, Path(args.table), command, Path(args.plot) if args.plot else None)
    except (ValueError, TypeError, OSError) as e:
        return report_error(str(e))
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    print(markdown_table(rows), end="")
    (Path(args.out) / "ladder.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
