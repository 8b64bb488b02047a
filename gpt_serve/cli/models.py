"""`gpt-serve models`: the shipped models, a line each (name, folder)."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from ..models import discover

    for name, folder in discover().items():
        print(f"{name:14s} {folder}")
    return 0


def add_parser(sub) -> None:
    m = sub.add_parser("models", help="list the shipped models")
    m.set_defaults(func=run)
