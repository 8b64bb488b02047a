"""What `gpt-serve serve` and the demo share as servers of the OpenAI-compatible API: its access flags
(`add_api_arguments`, read by `api_options`), the server's bounds (`add_limit_arguments`, read by `server_limits`),
how requests share the engine (`add_sharing_arguments`, read by `preempt_after` and `request_caps`), the port
check before any model loads (`check_port_free`) and the SIGTERM handler (`interrupt`)."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal

from ..generation.backends.prompt_cache import DEFAULT_PROMPT_CACHE_BYTES
from ..generation.scheduler import DEFAULT_PREEMPT_AFTER
from ..serving.request_caps import RequestCaps
from ..serving.server_limits import ServerLimits
from .flags import non_negative_int, positive_float, positive_int

API_KEY_ENV = "GPT_SERVE_API_KEY"


def add_api_arguments(parser) -> None:
    """The OpenAI-compatible API's access flags, the same for `gpt-serve serve` and the demo."""
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"every API route but /health then needs 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}, if set)",
    )
    parser.add_argument(
        "--metrics-need-key", action="store_true", help="/metrics needs the API key too (default: open, as /health)"
    )
    parser.add_argument(
        "--allowed-origins",
        "--allow-origin",
        dest="allow_origin",
        action="extend",
        type=origins,
        default=[],
        metavar="ORIGIN",
        help="let a browser page from ORIGIN (e.g. https://example.org) call the API (CORS), with the key; "
        'repeatable, or a JSON list as vLLM takes it (\'["https://a.org", "https://b.org"]\')',
    )


def origins(text: str) -> list[str]:
    """argparse type: one browser origin (`scheme://host[:port]`, as a browser's `Origin` header spells it), or a
    JSON list of them (vLLM's `--allowed-origins`)."""
    try:
        given = json.loads(text) if text.lstrip().startswith("[") else [text]
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not a JSON list of origins ({e}): {text}") from None
    if not isinstance(given, list) or not all(isinstance(origin, str) for origin in given):
        raise argparse.ArgumentTypeError(f"must be an origin or a JSON list of origins (strings), got {text}")
    for origin in given:
        if origin == "*":
            raise argparse.ArgumentTypeError("'*' is not accepted: name each origin a page may call the API from")
        if not _ORIGIN.match(origin):
            raise argparse.ArgumentTypeError(
                f"{origin!r} is not an origin: scheme://host[:port], no path or trailing slash "
                "(e.g. https://example.org or http://127.0.0.1:8080)"
            )
    return given


_ORIGIN = re.compile(r"^[a-z][a-z0-9+.-]*://[^/\s?#]+$")


def add_model_arguments(parser, none_named: str) -> None:
    """What a server serves, the same for `gpt-serve serve` and the demo: MODEL ... (positional, the first the
    default), `--model` (the default model, as `gpt-serve generate` and vLLM take it), `--served-model-name`,
    `--model-dir` (the older spelling of a MODEL) and `--models-root`; `none_named` says what is served when no
    model is named. `models_named` reads them."""
    parser.add_argument(
        "models",
        nargs="*",
        default=argparse.SUPPRESS,  # left out: no attribute (`models_named`), and no "(default: ...)" in the help
        metavar="MODEL",
        help=f"a shipped model's name or a model folder, the first the default ({none_named})",
    )
    parser.add_argument(
        "--model",
        dest="model_flag",
        default=None,
        metavar="MODEL",
        help="the default model (vLLM's spelling): one of the MODELs, or one more, served first",
    )
    parser.add_argument(
        "--served-model-name",
        nargs="+",
        default=argparse.SUPPRESS,  # left out: no attribute (`served_model_names`)
        metavar="NAME",
        help="the name each MODEL is served as, in order (default: a shipped model's name, a folder's own name)",
    )
    parser.add_argument(
        "--model-dir",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="one more MODEL, after the positional ones (the older spelling; NAME=PATH names it); repeatable",
    )
    parser.add_argument(
        "--models-root", default=None, metavar="FOLDER", help="serve every model folder directly under FOLDER too"
    )


def _given(args) -> tuple[list[str], str | None, int | None]:
    """MODEL ... then each `--model-dir`, as given; `--model`; and where `--model` is among them (the same spelling,
    or the NAME of a `NAME=PATH`; None when absent or not given)."""
    named = [*getattr(args, "models", ()), *args.model_dir]
    flag = getattr(args, "model_flag", None)
    for i, spec in enumerate(named):
        if flag is not None and (spec == flag or ("=" in spec and spec.partition("=")[0] == flag)):
            return named, flag, i
    return named, flag, None


def _first(items: list, i: int) -> list:
    """`items` with item `i` moved to the front."""
    return [items[i], *items[:i], *items[i + 1 :]]


def models_named(args) -> list[str]:
    """The models of `add_model_arguments`' flags, in order: MODEL ..., then each `--model-dir`; `--model` first
    (moved there when it is one of them, by its spelling or a `NAME=PATH`'s NAME; added there when not)."""
    named, flag, i = _given(args)
    if flag is None:
        return named
    return [flag, *named] if i is None else _first(named, i)


def served_model_names(args) -> list[str] | None:
    """`--served-model-name`'s names (in the order of `models_named`), or None when it is not given."""
    names = getattr(args, "served_model_name", None)
    named, flag, i = _given(args)
    if names is None or flag is None or len(names) != len(named):  # a count that differs: `model_folders` says so
        return names
    if i is None:
        raise ValueError(
            f"--model {flag!r} is not one of the MODELs that --served-model-name names: give it as a MODEL too"
        )
    return _first(names, i)


def api_options(args) -> dict:
    """`create_router`'s access options from the flags of `add_api_arguments`."""
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    if key is not None and not key.strip():
        raise ValueError("--api-key is empty")
    return dict(api_key=key, metrics_need_key=args.metrics_need_key, allow_origins=tuple(args.allow_origin))


LIMIT_FLAGS = {  # flag: (ServerLimits field, argparse type, help)
    "--max-body-bytes": ("max_body_bytes", positive_int, "the largest request body accepted (past it: 413)"),
    "--body-timeout": ("body_timeout", "seconds", "seconds a request's body may take to arrive (past them: 408)"),
    "--header-timeout": ("header_timeout", "seconds", "seconds a client may take to send a request's headers"),
    "--shutdown-timeout": (
        "shutdown_timeout", "seconds",
        "on SIGTERM or Ctrl-C, seconds open requests get to end before they are cut (their streams end with "
        "finish_reason 'abort' and [DONE])",
    ),
}  # fmt: skip


def add_limit_arguments(parser) -> None:
    """The server's bounds (`gpt_serve.serving.server_limits.ServerLimits`), the same for `gpt-serve serve` and the
    demo."""
    defaults = ServerLimits()
    for flag, (field, kind, text) in LIMIT_FLAGS.items():
        parser.add_argument(
            flag,
            type=positive_float if kind == "seconds" else kind,
            default=argparse.SUPPRESS,  # left out: no attribute, and `server_limits` takes the default
            help=f"{text} (default {getattr(defaults, field):,})",
        )


def server_limits(args) -> ServerLimits:
    """The `ServerLimits` of the flags of `add_limit_arguments` (a flag left out: the default)."""
    given = {field: getattr(args, field) for field, _, _ in LIMIT_FLAGS.values() if hasattr(args, field)}
    return ServerLimits(**given)


def add_sharing_arguments(parser) -> None:
    """How requests share the engine (docs/serving.md, "Fair sharing"), the same for `gpt-serve serve` and the
    demo."""
    caps = RequestCaps()
    parser.add_argument(
        "--preempt-after",
        type=non_negative_int,
        default=DEFAULT_PREEMPT_AFTER,
        help="tokens a row makes before it yields to a waiting request (it drops its cache and rejoins later with "
        f"the same tokens; 0: never; default {DEFAULT_PREEMPT_AFTER})",
    )
    parser.add_argument(
        "--prompt-cache-mb",
        type=non_negative_int,
        default=DEFAULT_PROMPT_CACHE_BYTES // 2**20,
        help="MiB each loaded model and backend keeps of the prompts it prefilled more than once, so that such a "
        f"prompt is copied in, not computed again (0: none; default {DEFAULT_PROMPT_CACHE_BYTES // 2**20})",
    )
    parser.add_argument(
        "--max-request-tokens",
        type=positive_int,
        default=caps.max_request_tokens,
        help="the most choices x max_tokens one request may ask for (past it: 400; default "
        f"{caps.max_request_tokens:,})",
    )
    parser.add_argument(
        "--max-request-logprobs",
        type=positive_int,
        default=caps.max_request_logprobs,
        help="the most logprob entries one request may accumulate, choices x max_tokens x (logprobs + 1) (past it: "
        f"400; default {caps.max_request_logprobs:,})",
    )


def preempt_after(args) -> int | None:
    """The scheduler's `preempt_after` of `--preempt-after` (0: None, never)."""
    return args.preempt_after or None


def prompt_cache_bytes(args) -> int:
    """The registry's `prompt_cache_bytes` of `--prompt-cache-mb`."""
    return args.prompt_cache_mb * 2**20


def request_caps(args) -> RequestCaps:
    """The `RequestCaps` of `--max-request-tokens` and `--max-request-logprobs`."""
    return RequestCaps(args.max_request_tokens, args.max_request_logprobs)


def check_port_free(host: str, port: int, hint: str) -> None:
    """An OSError naming `hint` (how to choose another port) when (host, port) cannot be bound: checked before any
    model loads, so a busy port costs no wait."""
    import socket

    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
            probe.bind((host, port))
    except OSError as e:
        raise OSError(f"cannot serve on {host}:{port} ({e.strerror or e}): {hint}") from None


def interrupt(signum, frame):
    """A SIGTERM handler: KeyboardInterrupt, as Ctrl-C raises."""
    for stop in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut the shutdown short
        signal.signal(stop, signal.SIG_IGN)
    raise KeyboardInterrupt
