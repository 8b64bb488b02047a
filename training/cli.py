"""Command line of the trainer: `python -m training` / `gpt-serve train`.

Flags mirror `TrainConfig`; a `--preset` fills in defaults, explicit flags override it, and `--model.KEY VALUE`
pairs override the model config (`CharGPTConfig` arguments), e.g. `--model.n_layer 8`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shlex
import sys

from .presets import PRESETS, get_preset
from .trainer import TrainConfig, Trainer


def _bool(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {value!r}")


def _parse_model_value(value: str):
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training", description="Train a character-level GPT.")
    p.add_argument("--preset", default="shakespeare-cpu", help=f"one of: {', '.join(PRESETS)}")
    p.add_argument("--list-presets", action="store_true", help="print the presets and exit")
    for f in dataclasses.fields(TrainConfig):
        if f.name == "model":
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", "bool | None"):
            p.add_argument(flag, type=_bool, default=None, metavar="BOOL")
        elif f.name == "resume":
            p.add_argument(flag, action="store_true", default=None)
        else:
            kind = {"int": int, "float": float}.get(f.type, str)
            p.add_argument(flag, type=kind, default=None)
    p.add_argument("--model.", dest="model_overrides", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                   help=argparse.SUPPRESS)
    return p


def config_from_args(argv: list[str]) -> TrainConfig:
    # `--model.n_layer 8` -> ("n_layer", "8")
    model_overrides, rest, i = {}, [], 0
    while i < len(argv):
        if argv[i].startswith("--model."):
            if i + 1 >= len(argv):
                raise SystemExit(f"{argv[i]} needs a value")
            model_overrides[argv[i][len("--model."):]] = _parse_model_value(argv[i + 1])
            i += 2
        else:
            rest.append(argv[i])
            i += 1
    args = build_parser().parse_args(rest)
    if args.list_presets:
        for name, preset in PRESETS.items():
            print(f"{name:16s} {preset.description}")
        raise SystemExit(0)
    preset = get_preset(args.preset)
    values = {**preset.train}
    for f in dataclasses.fields(TrainConfig):
        v = getattr(args, f.name, None)
        if v is not None and f.name != "model":
            values[f.name] = v
    values["model"] = {**preset.model, **model_overrides}
    return TrainConfig(**values)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = config_from_args(argv)
        command = "python -m training " + shlex.join(argv)
        result = Trainer(cfg, command=command).fit()
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0
