"""`gpt-serve copy MODEL OUT`: a self-contained copy of a model, its code included (`gpt_serve.folders.publishing`),
which plain transformers loads with trust_remote_code=True."""

from __future__ import annotations

import argparse
import sys

from .flags import add_force_argument, add_progress_argument, writer_parser


def run(args: argparse.Namespace) -> int:
    from ..folders.publishing import plan_copy, write_self_contained
    from ..models import model_path

    skipped = plan_copy(model_path(args.model)).skipped
    out = write_self_contained(args.model, args.out, replace=args.force)
    for name, why in skipped:
        print(f"gpt-serve copy: skipped {name}: {why}", file=sys.stderr)
    print(
        f"gpt-serve copy: wrote {out}: it loads without gpt-serve, "
        f'AutoModelForCausalLM.from_pretrained("{out}", trust_remote_code=True)',
        file=sys.stderr,
    )
    return 0


# What `gpt-serve --help` and `gpt-serve copy --help` say of the command
HELP = "write a self-contained copy of a model (its code included): for plain transformers or the Hub"
DESCRIPTION = (
    "Copy a shipped model (by name) or a model folder into a new folder that also holds the model's code, so that "
    "plain transformers loads it with trust_remote_code=True: what a Hugging Face Hub repository holds (upload the "
    "folder as it is). It holds the model's files only: other code files, pickles, symbolic links and unknown files "
    "are skipped, and named. Written whole or not at all."
)


def add_parser(sub) -> None:
    c = writer_parser(sub, "copy", "model", "shipped model name or model folder", "the folder", HELP, DESCRIPTION)
    add_force_argument(c)
    add_progress_argument(c)
    c.set_defaults(func=run)
