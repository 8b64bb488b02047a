"""The `gpt-serve` command (also `python -m gpt_serve`).

    gpt-serve generate [MODEL] --prompt "ROMEO:" --max-new-tokens 300 [--backend torch|onnx|onnx-int8]
    gpt-serve models                  # the shipped models
    gpt-serve train ...               # training/ (python -m training)
    gpt-serve ladder ...              # the lesson's loss ladder (python -m training.ladder)
    gpt-serve export MODEL ...        # ONNX export (python -m export)
    gpt-serve demo ...                # the Gradio demo (python -m demo)

The application subcommands are imported only when used, so `generate --backend onnx` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import sys
import time

APPS = {
    "train": ("training.cli", "train a model (see `gpt-serve train --help`)"),
    "ladder": ("training.ladder", "train the lesson's ladder stages and write the table"),
    "export": ("export.cli", "export a model folder to ONNX and validate it"),
    "demo": ("demo.cli", "launch the Gradio web demo"),
}
BACKENDS = ("torch", "onnx", "onnx-int8")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def load_backend(model: str, backend: str, threads: int | None = None):
    """(backend, vocab) for a model name or folder; torch is imported only for the torch backend."""
    from .models import model_path

    folder = model_path(model)
    if backend == "torch":  # (OnnxBackend checks its own `threads`)
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be None (PyTorch's default) or an integer >= 1, got {threads!r}")
        import torch

        from . import CharGPTForCausalLM, CharTokenizer
        from .torch_backend import TorchBackend

        if threads is not None:
            torch.set_num_threads(threads)
        return TorchBackend(CharGPTForCausalLM.from_pretrained(folder)), CharTokenizer.from_pretrained(folder).vocab
    if backend in ("onnx", "onnx-int8"):
        from .onnx_backend import OnnxBackend

        ort = OnnxBackend(folder, quantized=backend == "onnx-int8", threads=threads)
        return ort, ort.vocab
    raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")


def _generate(args: argparse.Namespace) -> int:
    from .engine import stream_text

    if args.refill_tokens is not None and args.window_mode != "refill":
        raise ValueError("--refill-tokens applies only with --window-mode refill")
    backend, vocab = load_backend(args.model, args.backend, args.threads)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    stream = stream_text(
        backend,
        vocab,
        prompt,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        window_mode=args.window_mode,
        refill_tokens=args.refill_tokens,
        unk_policy=args.unk_policy,
    )
    out = sys.stdout
    start = time.perf_counter()
    first = next(stream, None)  # checks every argument and the prompt before anything is printed
    if not args.no_echo:
        out.write(prompt)
    n = 0
    for piece in itertools.chain([] if first is None else [first], stream):
        out.write(piece)
        out.flush()
        n += 1
    out.write("\n")
    if args.stats:
        elapsed = time.perf_counter() - start
        rate = n / max(elapsed, 1e-9)
        print(f"[{n} tokens in {elapsed:.2f} s, {rate:.1f} tokens/s, {args.backend}]", file=sys.stderr)
    return 0


def _models(args: argparse.Namespace) -> int:
    from .models import list_models, model_path

    for name in list_models():
        print(f"{name:14s} {model_path(name)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpt-serve", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="stream text from a model")
    g.add_argument("model", nargs="?", default="shakespeare", help="shipped model name or model folder")
    g.add_argument("--prompt", default="", help='the text to continue ("-" reads stdin; empty starts from a newline)')
    g.add_argument("--max-new-tokens", type=int, default=500)
    g.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument(
        "--window-mode",
        choices=["exact", "refill"],
        default="exact",
        help="past block_size: exact lesson semantics, or faster cache refill",
    )
    g.add_argument("--refill-tokens", type=int, default=None, help="tokens kept by --window-mode refill")
    g.add_argument(
        "--unk-policy",
        choices=["error", "drop", "replace"],
        default=None,
        help="characters outside the vocabulary (default: error)",
    )
    g.add_argument("--backend", choices=BACKENDS, default="torch")
    g.add_argument("--threads", type=positive_int, default=None, help="threads per forward pass (default: all)")
    g.add_argument("--no-echo", action="store_true", help="do not print the prompt before the continuation")
    g.add_argument("--stats", action="store_true", help="print tokens/s to stderr")
    g.set_defaults(func=_generate)
    m = sub.add_parser("models", help="list the shipped models")
    m.set_defaults(func=_models)
    for name, (_, help_text) in APPS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in APPS:
        module = importlib.import_module(APPS[argv[0]][0])
        return module.main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError) as e:  # OSError: unreadable files (transformers' bad config.json)
        print(f"gpt-serve: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
