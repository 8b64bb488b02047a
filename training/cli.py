"""Command line of the trainer: `python -m training` / `gpt-serve train`.

Flags mirror `TrainConfig` (`--max-iters 100`, `--keep-best` or `--no-keep-best`, also `--keep-best false`); a
`--preset` fills in
defaults, explicit flags override it, and `--model.KEY VALUE` overrides a model config (`CharGPTConfig`)
argument, e.g. `--model.n_layer 8`. Under `torchrun` the same command trains with DDP.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import sys
import time
from pathlib import Path

from .config import TrainConfig
from .preflight import prepare
from .presets import FINETUNE_PRESET, PRESET_ALIASES, PRESETS, get_preset

_TYPES = {"int": int, "float": float, "str": str, "str | None": str}
DEFAULT_PRESET = "small-cpu"


def _bool(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {value!r}")


def _parse_model_value(value: str):
    """`8` -> 8, `false` -> False, `0.1` -> 0.1, anything else stays a string."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def build_parser(prog: str = "python -m training") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Train a character-level GPT (the 'Let's build GPT' model).",
        epilog="--model.KEY VALUE overrides an argument of the model config (CharGPTConfig), e.g. --model.n_layer 8.",
    )
    p.add_argument(
        "--preset",
        default=None,
        help=f"one of: {', '.join(PRESETS)} (default: {DEFAULT_PRESET}; with --init-from, {FINETUNE_PRESET})",
    )
    p.add_argument("--list-presets", action="store_true", help="print the presets and exit")
    default_preset, finetune = get_preset(DEFAULT_PRESET), get_preset(FINETUNE_PRESET)
    for f in TrainConfig.flag_fields():
        flags = ["--" + f.name.replace("_", "-")] + (["--out"] if f.name == "out_dir" else [])
        help_text = f.metadata.get("help")
        if any(f.name in preset.train for preset in PRESETS.values()):
            value = default_preset.train.get(f.name, f.default)
            tuned = finetune.train.get(f.name, f.default)
            help_text += f" (default: the preset's; {DEFAULT_PRESET}: {value}, {FINETUNE_PRESET}: {tuned})"
        elif "default" not in help_text:
            help_text += f" (default: {f.default})"
        if f.type in ("bool", "bool | None"):
            # `--progress` / `--no-progress`, as every other command spells a switch (argparse's BooleanOptional
            # style); `--progress false` still works too. `--no-keep-best` switches off what a preset switched on.
            no = "--no-" + f.name.replace("_", "-")
            p.add_argument(*flags, type=_bool, nargs="?", const=True, default=None, metavar="BOOL", help=help_text)
            p.add_argument(no, dest=f.name, action="store_const", const=False, help=f"the same as {flags[0]} false")
        else:
            p.add_argument(*flags, type=_TYPES[f.type], default=None, help=help_text)
    return p


def split_model_overrides(argv: list[str]) -> tuple[dict, list[str]]:
    """Takes the `--model.KEY VALUE` / `--model.KEY=VALUE` pairs out of argv."""
    overrides, rest, i = {}, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--model."):
            key, eq, value = arg[len("--model.") :].partition("=")
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"{arg} needs a value")
                value, i = argv[i + 1], i + 1
            if not key:
                raise ValueError(f"{arg}: give a model config argument, e.g. --model.n_layer 8")
            overrides[key] = _parse_model_value(value)
        else:
            rest.append(arg)
        i += 1
    return overrides, rest


def choose_preset(name: str | None, init_from: str | None):
    """The preset of a run: `--preset`, else `small-cpu` from scratch and `finetune` from a model (`--init-from`).
    A preset that sets an architecture does not go with `--init-from` (the base's is kept), nor one without with a
    run from scratch."""
    if name is None:
        return get_preset(FINETUNE_PRESET if init_from is not None else DEFAULT_PRESET)
    preset = get_preset(name)
    if init_from is not None and preset.model:
        raise ValueError(
            f"--preset {name} sets an architecture, and --init-from {init_from} keeps the base's: leave --preset out "
            f"(a run with --init-from uses --preset {FINETUNE_PRESET}) and set the training flags you want"
        )
    if init_from is None and not preset.model:
        raise ValueError(
            f"--preset {name} fine-tunes a model you have: give it with --init-from NAME|FOLDER (e.g. --init-from "
            f"shakespeare), or choose a preset that trains from scratch ({DEFAULT_PRESET}, tiny, ladder-a ...)"
        )
    return preset


def config_from_args(args: argparse.Namespace, model_overrides: dict) -> TrainConfig:
    preset = choose_preset(args.preset, args.init_from)
    values = {**preset.train}
    for f in TrainConfig.flag_fields():
        v = getattr(args, f.name, None)
        if v is not None:
            values[f.name] = v
    values["model"] = {**preset.model, **model_overrides}
    return TrainConfig(**values)


def program_name(module: str = "training", subcommand: str = "train") -> str:
    """How this process was launched: `gpt-serve train`, `python -m gpt_serve train` or `python -m training`."""
    launcher = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    if launcher == "gpt-serve":
        return f"gpt-serve {subcommand}"
    if launcher == "__main__.py" and Path(sys.argv[0]).parent.name == "gpt_serve":
        return f"python -m gpt_serve {subcommand}"
    return f"python -m {module}"


def invocation(argv: list[str], module: str = "training", subcommand: str = "train") -> str:
    """The command line that is running, for the model card (`torchrun` included when it launched us)."""
    import torch.distributed as dist

    prog = program_name(module, subcommand)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 or dist.is_torchelastic_launched():
        local = os.environ.get("LOCAL_WORLD_SIZE", str(world))
        nodes = world // max(1, int(local))
        prog = prog.replace("python -m ", "-m ")
        prog = f"torchrun --nproc_per_node={local}" + (f" --nnodes={nodes}" if nodes > 1 else "") + f" {prog}"
    return " ".join([prog, shlex.join(argv)]).strip()


def setup_logging() -> None:
    """INFO on rank 0, warnings only on the other ranks of a torchrun job."""
    level = logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING
    logging.basicConfig(level=level, format="%(message)s")


def report_error(message: str) -> int:
    """Prints `error: MESSAGE` (once per torchrun job: rank 0) and returns the exit status 2.

    Under torchrun it also writes the message into this worker's error file, so that torchrun's failure summary
    (which it prints after the worker exits) names it rather than a link to its documentation.
    """
    if os.environ.get("RANK", "0") == "0":
        print(f"error: {message}", file=sys.stderr)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:  # the layout of torch.distributed.elastic's ErrorHandler.record_exception, minus the traceback
        data = {"message": {"message": f"error: {message}", "extraInfo": {"timestamp": str(int(time.time()))}}}
        with contextlib.suppress(OSError):
            Path(error_file).write_text(json.dumps(data), encoding="utf-8")
    return 2


def main(argv: list[str] | None = None) -> int:
    from tqdm.contrib.logging import logging_redirect_tqdm

    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()
    try:
        model_overrides, rest = split_model_overrides(argv)
        args = build_parser(program_name()).parse_args(rest)
        if args.list_presets:
            for name, preset in PRESETS.items():
                print(f"{name:16s} {preset.description}")
            for old, new in PRESET_ALIASES.items():
                print(f"{old:16s} the former name of {new}")
            return 0
        cfg = config_from_args(args, model_overrides)
        prepared = prepare(cfg)  # flags, folders, the base model and the text: checked before torch is imported
        from .trainer import Trainer

        with logging_redirect_tqdm():
            result = Trainer(cfg, text=prepared.text, command=invocation(argv)).fit()
    except (ValueError, TypeError, OSError) as e:  # CheckpointError is a ValueError
        return report_error(str(e))
    except KeyboardInterrupt:
        print("interrupted; continue with --resume", file=sys.stderr)
        return 130
    if os.environ.get("RANK", "0") == "0":
        print(json.dumps(result))
    return 0
