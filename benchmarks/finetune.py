"""Fine-tuned against from scratch on a text of your own: the table of docs/training.md ("A useful model of your own
text in minutes").

    python benchmarks/finetune.py --data TEXT --threads 2            # ~15 minutes: three runs of 3 to 6 minutes
    python benchmarks/finetune.py --data TEXT --max-iters 20         # a smoke test of the script itself

Runs, one after the other, through the training's own command line:

- `python -m training --init-from shakespeare --data TEXT` (the `finetune` preset's defaults),
- the same architecture from random weights (`--preset small-cpu`) for the same steps, warmup and evaluations, so
  for about the same minutes, and
- the same from random weights for twice the steps (about 5 minutes on 2 cores);

(`--runs` picks some of them: tuned, scratch, scratch-longer), then prints a Markdown row per run: steps, minutes in
optimizer steps and in all, the val loss at step 0 and the best one. TEXT should be English and not Tiny
Shakespeare (which the base was trained on). It prints the load average it started under: compare figures taken on
a quiet machine. A script that prints numbers, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.cli import main as train  # noqa: E402
from training.presets import get_preset  # noqa: E402


def runs(data: str, out: Path, threads: int, max_iters: int | None) -> dict[str, tuple[str, list[str]]]:
    """The three runs: (the row's name, the command line after `python -m training`), by run."""
    tuned = get_preset("finetune").train
    steps = max_iters or tuned["max_iters"]
    same = ["--max-iters", str(steps), "--threads", str(threads), "--data", data, "--no-progress", "--snapshots", "0"]
    if max_iters:  # a shorter run: evaluate about as often as the preset does, on fewer batches (a smoke run's
        # evaluations at 40 batches a split were most of its minutes)
        same += ["--eval-interval", str(max(1, steps // 6)), "--warmup-iters", str(steps // 12)]
        same += ["--eval-iters", str(min(8, tuned["eval_iters"]))]
    scratch = ["--preset", "small-cpu", "--warmup-iters", str(tuned["warmup_iters"])]
    scratch += ["--eval-interval", str(tuned["eval_interval"]), "--eval-iters", str(tuned["eval_iters"])]
    longer = [*same, "--max-iters", str(2 * steps)]  # the later --max-iters wins: twice the steps, about 5 minutes
    return {
        "tuned": (
            "`--init-from shakespeare` (preset `finetune`)",
            ["--init-from", "shakespeare", "--out", str(out / "tuned")] + same,
        ),
        "scratch": (
            "from scratch, `small-cpu` architecture, same steps",
            [*scratch, "--out", str(out / "scratch"), *same],
        ),
        "scratch-longer": ("from scratch, twice the steps", [*scratch, "--out", str(out / "scratch-longer"), *longer]),
    }


RUNS = ("tuned", "scratch", "scratch-longer")


def row(name: str, folder: Path) -> str:
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    card = (folder / "README.md").read_text()
    wall = card.split("| wall time | ")[1].split(" (")[0]
    best = min(m["val_loss"] for m in metrics)
    start = metrics[0]["val_loss"]
    minutes = metrics[-1]["time_s"] / 60
    return f"| {name} | {metrics[-1]['step']} | {minutes:.1f} ({wall} in all) | {start:.4f} | **{best:.4f}** |"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="an English text of some hundred KB (not Tiny Shakespeare)")
    p.add_argument("--out", default="runs/finetune-bench", help="where the two runs go (replaced)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-iters", type=int, default=None, help="fewer steps than the preset's 600 (a smoke test)")
    p.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS), help="which runs (default: all three)")
    args = p.parse_args()
    out = Path(args.out)
    for run in args.runs:
        shutil.rmtree(out / run, ignore_errors=True)
    load = os.getloadavg()
    rows = []
    for name, argv in (runs(args.data, out, args.threads, args.max_iters)[run] for run in args.runs):
        if train(argv) != 0:
            return 1
        rows.append(row(name, Path(argv[argv.index("--out") + 1])))
    print(f"\nload average at the start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} CPUs")
    print("| run | steps | minutes in optimizer steps | val loss at step 0 | best val loss |")
    print("|---|---:|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
