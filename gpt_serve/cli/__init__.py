"""The `gpt-serve` command (also `python -m gpt_serve`).

    gpt-serve generate [MODEL] --prompt "ROMEO:" --max-new-tokens 300 [--backend torch|onnx|onnx-int8]
    gpt-serve models                  # the shipped models
    gpt-serve serve [MODEL ...] --port 8000  # the OpenAI-compatible API (POST /v1/completions), no web page
    gpt-serve serve --ray --replicas 2 --threads 1   # the same API, as Ray Serve replicas (the `ray` extra)
    gpt-serve import ckpt.pt my-model  # bring your own model: the lesson's gpt.py or nanoGPT, then ONNX-exported
    gpt-serve copy MODEL OUT          # a self-contained copy (its code included): plain transformers, the Hub
    gpt-serve record-vocab FOLDER     # record vocab.json's sha256 in config.json (a folder that lacks it)
    gpt-serve train ...               # the training pipeline (python -m training from a clone)
    gpt-serve ladder ...              # the lesson's loss ladder (python -m training.ladder)
    gpt-serve export MODEL ...        # ONNX export (python -m export)
    gpt-serve demo ...                # the Gradio demo (python -m demo)
    gpt-serve space MODEL OUT         # a folder that runs the demo as a Hugging Face Space (python -m demo.space)

`generate`, `models`, `serve`, `import`, `copy` and `record-vocab` are the library's own, a module each in this
package (`import_cmd.py` for `import`), each with its `add_parser(sub)` and its handler; `flags.py` holds the argparse
types and switches every command shares (the applications' too), `server_flags.py` what `serve` shares with the demo.
The other subcommands are the applications, which the library never imports: each registers itself as an entry point
of the `gpt_serve.commands` group (see pyproject.toml, and `apps.py`), and only the one asked for is loaded, so
`generate --backend onnx` never imports torch. `import` runs the `export` application the same way on the folder it
wrote. Every command imports what it needs when it runs (`generate --backend onnx` and `models`: numpy and
onnxruntime alone); one that cannot import a dependency prints one line naming the extra to install
(`missing_dependency`) and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import EntryPoint

from ..extras import MissingDependency, missing_base, missing_extra
from ..generation import EngineError
from . import copy, generate, import_cmd, models, record_vocab, serve
from .apps import add_parsers as add_app_parsers
from .apps import app_commands
from .flags import quiet_model_loading

# The library's own commands, in `gpt-serve --help`'s order: each module's `add_parser(sub)` adds its subparser, with
# the module's handler as its `func`
COMMANDS = (generate, models, serve, import_cmd, copy, record_vocab)
# The extra each command needs beyond gpt-serve's own dependencies (numpy, torch, transformers, safetensors); the
# others need only those, or less (`generate --backend onnx` and `models`: numpy and onnxruntime)
EXTRAS = {
    "train": "train", "ladder": "train", "export": "export", "demo": "demo", "serve": "serve", "serve --ray": "ray",
}  # fmt: skip


def build_parser(apps: dict[str, EntryPoint] | None = None) -> argparse.ArgumentParser:
    """`gpt-serve`'s parser: the library's commands, then a subparser per application of `apps` (None: those
    installed, `app_commands`), for the help only."""
    from .. import __version__

    p = argparse.ArgumentParser(prog="gpt-serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"gpt-serve {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    add_app_parsers(sub, apps if apps is not None else app_commands())
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    apps = app_commands()
    if argv and argv[0] in apps:
        return _run_app(apps[argv[0]], argv[1:])
    args = build_parser(apps).parse_args(argv)
    args.argv = argv  # as typed, for what a command records of itself (`import`'s model card)
    quiet_model_loading(getattr(args, "verbose", False) or getattr(args, "progress", False))
    try:
        return args.func(args)
    except ImportError as e:  # a dependency the command needs is not installed: what to install, never a traceback
        print(missing_dependency("serve --ray" if getattr(args, "ray", False) else args.command, e), file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError, EngineError) as e:  # OSError: missing or unreadable files
        print(f"gpt-serve: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def missing_dependency(command: str, error: ImportError) -> str:
    """The one line `gpt-serve COMMAND` prints when an import fails: an error that already says what to install (a
    `MissingDependency`, e.g. the torch backend's) as it is, else the extra the command needs (`EXTRAS`; none:
    gpt-serve's own dependencies, which `pip install --no-deps` leaves out)."""
    if isinstance(error, MissingDependency):
        return f"gpt-serve {command}: {error}"
    if not error.name or error.name.split(".")[0].startswith("gpt_serve"):  # not a dependency: gpt-serve's own
        return f"gpt-serve {command}: error: {error}"
    what, extra = f"gpt-serve {command}", EXTRAS.get(command)
    return str(missing_extra(what, extra, error) if extra else missing_base(what, error))


def _run_app(entry: EntryPoint, argv: list[str]) -> int:
    try:  # the app's module, then what it imports as it runs: e.g. a torch-free install running `gpt-serve train`
        return entry.load()(argv)
    except ImportError as e:
        print(missing_dependency(entry.name, e), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
