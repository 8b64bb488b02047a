"""What the commands' parsers share: the argparse types (`positive_int`, `thread_count`, `max_tokens_limit`, ...),
the progress switch and its effect (`add_progress_argument`, `quiet_model_loading`), and the two positionals of a
command that writes a folder (`writer_parser`: `import`, `copy`). The applications (`training`, `export`, the demo)
import these too, so that every command spells a flag alike (tests/cli/test_flags.py)."""

from __future__ import annotations

import argparse
import os
import sys

from ..generation.backends.threads import check_threads
from ..generation.fields import MAX_NEW_TOKENS
from ..generation.folder_defaults import GENERATION_CONFIG_MODES


def quiet_model_loading(show: bool = False) -> None:
    """No "Loading weights" progress bar from transformers in the commands' output, unless `show` (`--progress`,
    `--verbose`) or `HF_HUB_DISABLE_PROGRESS_BARS=0` in the environment (which `show` sets, so that the library's
    own quiet loading, `modeling_chargpt.quiet_weight_loading`, keeps the bar too)."""
    if show:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "0"
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] != "0":  # read at its import
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


def add_progress_argument(parser, default: bool = False, help: str = "show transformers' weight-loading bar") -> None:
    """`--progress` / `--no-progress`, the one spelling of every command's progress switch (`gpt-serve` and its
    subcommands, `python -m training`, the ladder, the export, the demo)."""
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=default, help=help)


def add_verbose_and_progress(parser) -> None:
    """`--verbose` (the same as `--progress`, what `main` reads too) and `--progress`: the library's commands that
    load a model."""
    parser.add_argument("--verbose", action="store_true", help="the same as --progress")
    add_progress_argument(parser)


def add_generation_config_argument(parser) -> None:
    """`--generation-config auto|vllm`, vLLM's flag: where a request's defaults come from."""
    parser.add_argument(
        "--generation-config",
        choices=GENERATION_CONFIG_MODES,
        default="auto",
        help="the defaults of a request that names none (max tokens, temperature, top_k, top_p, repetition "
        "penalty, min_p): auto, the model folder's generation_config.json; vllm, the built-in ones",
    )


def writer_parser(
    sub, name: str, source: str, source_help: str, written: str, help: str, description: str
) -> argparse.ArgumentParser:
    """The subparser `name` of a command that writes a folder from `source` (`import`, `copy`), with its `help` and
    `description`, and its two positionals: `source`, then OUT, `written` ("the folder"), which must not exist unless
    --force (`add_force_argument`, where the command lists it)."""
    parser = sub.add_parser(name, help=help, description=description)
    parser.add_argument(source, help=source_help)
    parser.add_argument("out", help=f"{written} to write (must not exist, unless --force)")
    return parser


def add_force_argument(parser) -> None:
    """`--force`, for a command of `writer_parser`."""
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def tcp_port(text: str) -> int:
    """argparse type: a TCP port, in [1, 65535]."""
    value = int(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"must be a TCP port in [1, 65535], got {text}")
    return value


def max_tokens_limit(text: str) -> int:
    """argparse type: a server's limit of max_tokens, in [1, MAX_NEW_TOKENS] (the request specification's)."""
    value = positive_int(text)
    if value > MAX_NEW_TOKENS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_NEW_TOKENS} (the request specification's limit)")
    return value


def thread_count(text: str) -> int:
    """argparse type: a thread count in [1, the CPUs this process may use]."""
    try:
        return check_threads(int(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            str(e).replace("threads must be None (the runtime's default) or ", "must be ")
        ) from None


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value
