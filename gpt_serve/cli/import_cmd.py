"""`gpt-serve import SOURCE OUT`: a model folder of a checkpoint of the lesson's gpt.py or of nanoGPT
(`gpt_serve.folders.importing`), then its ONNX export by the `export` application, found as `main` finds it (its
entry point), and named with the command to run later where it is not installed."""

from __future__ import annotations

import argparse
import shlex
import sys

from . import apps
from .flags import add_force_argument, add_verbose_and_progress, thread_count, writer_parser


def run(args: argparse.Namespace) -> int:
    """`gpt-serve import`: the model folder (`gpt_serve.folders.importing`), then its ONNX export by the export app."""
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    from ..folders.importing import SOURCE_NAMES, import_checkpoint

    command = shlex.join(["gpt-serve", *args.argv])
    imported = import_checkpoint(
        args.source, args.out, corpus=args.corpus, meta=args.meta, attn_scale=args.attn_scale, force=args.force,
        command=command,
    )  # fmt: skip
    config = imported.model.config
    print(
        f"gpt-serve import: wrote {args.out} from {SOURCE_NAMES[imported.source_format]} ({config.n_layer} layers, "
        f"{config.n_head} heads, n_embd {config.n_embd}, block_size {config.block_size}, {len(imported.vocab)} "
        f"characters: {imported.vocab_source})",
        file=sys.stderr,
    )
    export_argv = [args.out, *(["--data", str(imported.corpus)] if imported.corpus else [])]
    export_argv += ["--threads", str(args.threads)] if args.threads is not None else []
    return _export(args, export_argv)


def _export(args: argparse.Namespace, export_argv: list[str]) -> int:
    """The export application run on the folder written (`export_argv`), or the command that would, and why not."""
    later = f"gpt-serve export {shlex.join(export_argv)}"
    if args.no_export:
        print(f"gpt-serve import: not exported to ONNX (--no-export); to export it: {later}", file=sys.stderr)
        return 0
    entry, export_main = apps.app_commands().get("export"), None
    try:
        export_main = entry.load() if entry is not None else None
        missing = "the export application is not installed"
    except ImportError as e:
        missing = f"the export application cannot import {e.name or e}"
    if export_main is None:
        print(
            f"gpt-serve import: not exported to ONNX ({missing}): pip install 'gpt-serve[export]', then {later}",
            file=sys.stderr,
        )
        return 0
    code = export_main(export_argv)
    if code != 0:
        print(f"gpt-serve import: {args.out} is written, but its ONNX export failed (above); {later}", file=sys.stderr)
    return code


# What `gpt-serve --help` and `gpt-serve import --help` say of the command
HELP = "make a model folder of a checkpoint of the lesson's gpt.py or of nanoGPT (and export it to ONNX)"
DESCRIPTION = (
    "Convert a checkpoint into a gpt-serve model folder, written whole or not at all, then export it to ONNX. The "
    "format is read from the file: the lesson's gpt.py (torch.save(model.state_dict())) or nanoGPT (out-*/ckpt.pt "
    "with the meta.pkl of its character vocabulary). Checkpoints are read with torch.load(weights_only=True) and "
    "meta.pkl by an unpickler that admits only dicts, strings and integers."
)
SOURCE_HELP = "the checkpoint: a gpt.py state dict, or nanoGPT's ckpt.pt"


def add_parser(sub) -> None:
    i = writer_parser(sub, "import", "source", SOURCE_HELP, "the model folder", HELP, DESCRIPTION)
    i.add_argument(
        "--corpus",
        default=None,
        help="the text the model was trained on: the lesson's vocabulary is its sorted(set(text)) (default: Tiny "
        "Shakespeare's 65 characters); also the export's validation text",
    )
    i.add_argument("--meta", default=None, help="nanoGPT's meta.pkl (default: beside SOURCE, or data/DATASET/meta.pkl)")
    i.add_argument(
        "--attn-scale",
        default=None,  # checked by CharGPTConfig (its module imports transformers: not while parsing)
        metavar="head_size|n_embd",
        help="the lesson's gpt.py only: n_embd for a gpt.py that scaled attention by C**-0.5, as typed in the video "
        "(default: head_size, the final gpt.py's k.shape[-1]**-0.5)",
    )
    add_force_argument(i)
    i.add_argument("--no-export", action="store_true", help="write the folder only, no ONNX export")
    i.add_argument("--threads", type=thread_count, default=None, help="torch and ONNX Runtime threads (none: all CPUs)")
    add_verbose_and_progress(i)
    i.set_defaults(func=run)
