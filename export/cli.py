"""`python -m export [MODEL_DIR]` (also `gpt-serve export`): export, validate, report, update the model card."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

from gpt_serve.cli.flags import add_progress_argument, quiet_model_loading, thread_count
from gpt_serve.models import DEFAULT_MODEL

from .onnx_export import OPSET
from .validate import FP32_LOGITS_ATOL, INT8_MAX_VAL_LOSS_INCREASE


def build_parser(prog: str = "python -m export") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            f"Export a CharGPT model folder to ONNX (opset {OPSET}): onnx/model.onnx (fp32) and "
            "onnx/model_quantized.onnx (int8), validated against PyTorch and on real text before they are written. "
            "Exits 1 when a check fails (nothing is written then)."
        ),
    )
    parser.add_argument(
        "model",
        nargs="?",
        default=DEFAULT_MODEL,
        help=f"a save_pretrained model folder, or a shipped model name (default: {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="the training corpus, whose validation split measures the int8 loss change (default: the text the "
        "model folder's corpus.json records, found where training read it and checked by its sha256; Tiny "
        "Shakespeare is downloaded once into the user cache)",
    )
    parser.add_argument("--no-quantize", action="store_true", help="write only the fp32 graph")
    parser.add_argument(
        "--decode-steps",
        type=int,
        default=4,
        help="cached decode steps compared after the prefill (default 4; at most block_size - 1)",
    )
    parser.add_argument(
        "--atol",
        type=float,
        default=FP32_LOGITS_ATOL,
        help=f"largest fp32 |logits difference| from PyTorch (default {FP32_LOGITS_ATOL:g})",
    )
    parser.add_argument(
        "--max-int8-loss-increase",
        type=float,
        default=INT8_MAX_VAL_LOSS_INCREASE,
        help=f"largest int8 validation-loss increase, nats/char (default {INT8_MAX_VAL_LOSS_INCREASE})",
    )
    parser.add_argument(
        "--val-tokens",
        type=int,
        default=32768,
        help="about how many validation characters the int8 loss is measured on (default 32768)",
    )
    parser.add_argument(
        "--threads", type=thread_count, default=None, help="torch and ONNX Runtime threads (default: all CPUs)"
    )
    parser.add_argument("--no-model-card", action="store_true", help="leave MODEL_DIR/README.md alone")
    parser.add_argument("--verbose", action="store_true", help="show progress bars and INFO logs")
    add_progress_argument(parser, help="show progress bars (transformers' weight-loading bar)")
    return parser


class TrainingTextGone(ValueError):
    """The text a folder's `corpus.json` records is no longer where it was read from, or has changed since."""


def validation_text(folder: Path, data: Path | None) -> tuple[str, str]:
    """The text the int8 check measures on, and how the report names it: `--data`, else the text the folder's
    `corpus.json` records (found where it was read from, checked by its sha256; Tiny Shakespeare from the user
    cache), else Tiny Shakespeare (a folder from before corpus.json). A `TrainingTextGone` (a ValueError) asks for
    a recorded text that is gone."""
    from gpt_serve.folders.corpus import load_text
    from gpt_serve.folders.corpus_record import TINY_SHAKESPEARE_NAME, read_corpus_record

    if data is not None:
        return load_text(data), f"{data.name} (validation split)"
    record = read_corpus_record(folder)
    if record is None:
        return load_text(None), f"{TINY_SHAKESPEARE_NAME} (validation split; {folder} records no corpus.json)"
    text = record.find_text()  # the text whose sha256 was checked, not read again
    if text is None:
        raise TrainingTextGone(f"{record.missing_text_message()}: pass --data PATH to that text, or --no-quantize")
    return text, f"{record.name} (validation split)"


def training_text_hint(folder: Path) -> str:
    """How to pass the right text when the validation text is not the model's: by the name its corpus.json records
    (a broken record is logged and left out), else without a name."""
    from gpt_serve.folders.corpus_record import corpus_record_or_none

    record = corpus_record_or_none(folder)
    if record is None:
        return "Pass --data PATH to the text this model was trained on, or --no-quantize"
    named = f"{record.name}, the text this model was trained on (its corpus.json names it)"
    return f"Pass --data PATH to {named}, or --no-quantize"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    via_gpt_serve = Path(sys.argv[0]).name in ("gpt-serve", "gpt_serve")
    args = build_parser("gpt-serve export" if via_gpt_serve else "python -m export").parse_args(argv)
    quiet_model_loading(args.verbose or args.progress)
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for name, value in (("--decode-steps", args.decode_steps), ("--val-tokens", args.val_tokens)):
        if value < 1:
            print(f"error: {name} must be >= 1, got {value}", file=sys.stderr)
            return 2
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)

    from gpt_serve.generation import ModelFolder

    from .exporter import NotTheTrainingText, export_model
    from .report import card_section, format_report, update_model_card

    try:
        opened = ModelFolder.open(args.model)  # a bad folder is named before the validation text is looked for
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    folder, text, source = opened.path, None, ""
    if not args.no_quantize:
        try:
            text, source = validation_text(folder, args.data)
        except (OSError, ValueError) as e:  # a recorded text that is gone says its own remedy
            remedy = "" if isinstance(e, TrainingTextGone) else "; pass --data PATH or --no-quantize"
            print(f"error: no validation text for the int8 check: {e}{remedy}", file=sys.stderr)
            return 2
    try:
        report = export_model(
            opened,
            text=text,
            text_source=source,
            quantize=not args.no_quantize,
            decode_steps=args.decode_steps,
            atol=args.atol,
            int8_max_loss_increase=args.max_int8_loss_increase,
            val_tokens=args.val_tokens,
            threads=args.threads,
        )
    except NotTheTrainingText as e:
        print(f"error: {e}. {training_text_hint(folder)}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_report(report))
    if report.passed and not args.no_model_card:
        card = update_model_card(report.model_dir, card_section(report, shlex.join(["python", "-m", "export", *argv])))
        print(f"model card: {card}")
    return 0 if report.passed else 1
