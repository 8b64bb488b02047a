"""Fixtures of the training tests: a small slice of Tiny Shakespeare and tiny training configs."""

from __future__ import annotations

import contextlib

import pytest

SMALL_CHARS = 60_000  # enough for both splits of a block-16 model, small enough to encode instantly


@pytest.fixture(scope="session")
def small_data_path(tmp_path_factory, corpus):
    path = tmp_path_factory.mktemp("data") / "small.txt"
    path.write_text(corpus[:SMALL_CHARS], encoding="utf-8")
    return path


def tiny_config(out_dir, data, **overrides):
    """A TrainConfig that trains in about a second on one thread."""
    from training.presets import get_preset
    from training.trainer import TrainConfig

    preset = get_preset("tiny")
    values = {
        **preset.train,
        "out_dir": str(out_dir),
        "data": str(data),
        "threads": 1,
        "progress": False,
        "sample_tokens": 20,
    }
    model = dict(preset.model)
    model.update(overrides.pop("model", {}))
    values.update(overrides)
    return TrainConfig(**values, model=model)


def tiny_args(out_dir, data, *extra) -> list[str]:
    """The same as command-line arguments of `python -m training`."""
    return [
        "--preset",
        "tiny",
        "--out",
        str(out_dir),
        "--data",
        str(data),
        "--threads",
        "1",
        "--progress",
        "false",
        "--sample-tokens",
        "20",
        *map(str, extra),
    ]


@pytest.fixture(scope="session")
def make_config(small_data_path):
    """`make_config(out_dir, **overrides)`: a tiny TrainConfig on the small corpus."""
    return lambda out_dir, **overrides: tiny_config(out_dir, small_data_path, **overrides)


@pytest.fixture(scope="session")
def make_args(small_data_path):
    """`make_args(out_dir, *extra)`: the same as `python -m training` arguments."""
    return lambda out_dir, *extra: tiny_args(out_dir, small_data_path, *extra)


@contextlib.contextmanager
def crash_at(step: int):
    """Inside the block, a run raises `RuntimeError("simulated crash")` when it is about to train step `step + 1`, as a
    killed run would stop; the test expects it (`pytest.raises`) and the trainer trains normally again after it."""
    from training.trainer import Trainer

    real_step = Trainer.train_step

    def crashing_step(self):
        if self.step == step:
            raise RuntimeError("simulated crash")
        return real_step(self)

    Trainer.train_step = crashing_step
    try:
        with pytest.raises(RuntimeError, match="simulated crash"):
            yield
    finally:
        Trainer.train_step = real_step
