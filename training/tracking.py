"""Experiment tracking: the scalars of metrics.jsonl, also sent to TensorBoard or trackio (`--report-to`).

metrics.jsonl stays the record (resume and the model card read it); a tracker gets each evaluation's record as it
is written: `train_loss`, `val_loss`, `lr`, `tokens`, `time_s` and `tokens_per_s`, against the optimizer step.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

TRACKERS = {
    # name: (the module it needs, where it writes)
    "tensorboard": ("tensorboard", "event files in OUT/tensorboard/ (tensorboard --logdir OUT/tensorboard)"),
    "trackio": ("trackio", "a run named after OUT in the local trackio project 'gpt-serve' (trackio show)"),
}
TENSORBOARD_SUBDIR = "tensorboard"
TRACKIO_PROJECT = "gpt-serve"


def parse_report_to(value: str) -> list[str]:
    """'none', or tracker names separated by commas; a ValueError names unknown or uninstalled ones."""
    names = [] if value.strip() in ("", "none") else [n.strip() for n in value.split(",")]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ValueError(f"report_to: unknown tracker(s) {unknown}; choose 'none' or any of {list(TRACKERS)}")
    missing = [n for n in names if importlib.util.find_spec(TRACKERS[n][0]) is None]
    if missing:
        raise ValueError(
            f"report_to {missing} needs {', '.join(TRACKERS[n][0] for n in missing)}: pip install 'gpt-serve[tracking]'"
        )
    return list(dict.fromkeys(names))


class Trackers:
    """The trackers of one run (rank 0 only). `resume_step`: the step a resumed run restarts from, so TensorBoard
    drops what an interrupted session logged after that step."""

    def __init__(self, names: list[str], out: Path, config: dict, resume_step: int | None = None):
        self._writers = []
        if "tensorboard" in names:
            from torch.utils.tensorboard import SummaryWriter

            self._writers.append(_TensorBoard(SummaryWriter(str(out / TENSORBOARD_SUBDIR), purge_step=resume_step)))
        if "trackio" in names:
            import trackio

            resume = "allow" if resume_step is not None else "never"  # a resumed run continues the same trackio run
            run = trackio.init(project=TRACKIO_PROJECT, name=out.resolve().name, config=config, resume=resume)
            self._writers.append(_Trackio(trackio, run))

    def log(self, record: dict) -> None:
        step = record["step"]
        scalars = {k: float(v) for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
        for writer in self._writers:
            writer.log(scalars, step)

    def close(self) -> None:
        for writer in self._writers:
            writer.close()
        self._writers = []


class _TensorBoard:
    def __init__(self, writer):
        self.writer = writer

    def log(self, scalars: dict, step: int) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Trackio:
    def __init__(self, module, run):
        self.module, self.run = module, run

    def log(self, scalars: dict, step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()
