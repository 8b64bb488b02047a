"""`gpt-serve record-vocab FOLDER`: record the sha256 of a folder's vocab.json in its config.json."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from ..generation.model_folder import record_vocab_sha256

    path, digest = record_vocab_sha256(args.model)
    print(f"gpt-serve record-vocab: {path} now records vocab_sha256 {digest}")
    return 0


def add_parser(sub) -> None:
    v = sub.add_parser(
        "record-vocab",
        help="record the sha256 of a folder's vocab.json in its config.json (vocab_sha256)",
        description="Write the sha256 of MODEL's vocab.json into its config.json as vocab_sha256, which every loader "
        "then checks. A folder without it loads only if its vocabulary is in the lesson's sorted order; run this "
        "only for a vocabulary you know to be the one the model was trained with.",
    )
    v.add_argument("model", help="a model folder (or a shipped model name)")
    v.set_defaults(func=run)
