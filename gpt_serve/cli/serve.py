"""`gpt-serve serve`: the OpenAI-compatible completions API (`gpt_serve.serving`), no web page; with `--ray`, the
same API as Ray Serve replicas behind Ray's HTTP proxy (the `ray` extra)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time

from ..generation import BACKENDS
from ..generation.fields import DEFAULT_BACKEND, MAX_NEW_TOKENS
from ..generation.scheduler import DEFAULT_MAX_BATCH, DEFAULT_MAX_QUEUE
from ..models import DEFAULT_MODEL
from . import server_flags
from .flags import (
    add_generation_config_argument,
    add_verbose_and_progress,
    max_tokens_limit,
    positive_float,
    positive_int,
    tcp_port,
    thread_count,
)

PORT_HINT = "another server holds the port? choose another with --port N"  # `gpt-serve serve`, with or without Ray


def run(args: argparse.Namespace) -> int:
    if args.ray:
        return _serve_ray(args)
    ray_only = {"--replicas": args.replicas, "--replica-cpus": args.replica_cpus, "--ray-address": args.ray_address}
    given = [flag for flag, value in ray_only.items() if value is not None]
    if given:
        raise ValueError(f"only with --ray: {', '.join(given)}")
    from ..serving.api import create_app  # fastapi: the `serve` extra (a message, not a traceback: `main`)
    from ..serving.launcher import run_server
    from ..serving.registry import ModelRegistry

    server_flags.check_port_free(args.host, args.port, PORT_HINT)
    registry = ModelRegistry.serving(
        server_flags.models_named(args), server_flags.served_model_names(args), args.models_root, threads=args.threads,
        max_batch=args.max_batch, max_queue=args.max_queue, generation_config=args.generation_config,
        preempt_after=server_flags.preempt_after(args), prompt_cache_bytes=server_flags.prompt_cache_bytes(args),
    )  # fmt: skip
    if not args.no_preload:  # the first request should not wait for a model to load
        print(f"gpt-serve serve: {registry.preload(args.backend)[1]}", file=sys.stderr)
    options, limits = server_flags.api_options(args), server_flags.server_limits(args)
    app = create_app(
        registry, default_backend=args.backend, max_tokens_limit=args.max_tokens_limit, limits=limits,
        caps=server_flags.request_caps(args), **options,
    )  # fmt: skip
    print(f"gpt-serve serve: models {registry.available} on http://{args.host}:{args.port}/v1", file=sys.stderr)
    run_server(app, args.host, args.port, args.log_level, limits, app.state.drain, args.access_log)
    return 0


def _serve_ray(args: argparse.Namespace) -> int:
    limits = ("--header-timeout", "--shutdown-timeout")
    not_with_ray = [flag for flag in limits if hasattr(args, server_flags.LIMIT_FLAGS[flag][0])]
    not_with_ray += ["--access-log"] if args.access_log else []  # the replicas' request lines: --log-level info
    if not_with_ray:  # Ray's proxy holds the connections, and the replicas' shutdown is Ray's
        raise ValueError(f"not with --ray: {', '.join(not_with_ray)}")
    from ..serving.ray_serve import require_ray, serving  # the `ray` extra (a message: `main`)

    require_ray()  # before anything starts
    options = _ray_options(args)
    if args.ray_address is None:  # a new local instance: its proxy binds the port
        server_flags.check_port_free(args.host, args.port, PORT_HINT)
    models = options.registry().available  # checked here, before Ray starts; each replica finds its own
    with serving(options, args.host, args.port, args.ray_address, args.log_level) as url:
        replicas = f"{options.replicas} Ray Serve replica{'s' if options.replicas > 1 else ''}"
        print(f"gpt-serve serve: models {models} on {url}/v1, {replicas}; Ctrl-C stops", file=sys.stderr)
        signal.signal(signal.SIGTERM, server_flags.interrupt)  # a service manager's stop: the same clean exit as Ctrl-C
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


def _ray_options(args: argparse.Namespace):
    """The flags as `RayServeOptions` (what each replica is built from)."""
    from ..serving.ray_serve import RayServeOptions

    limits = server_flags.server_limits(args)
    served = server_flags.served_model_names(args)
    return RayServeOptions(
        replicas=args.replicas or 1,
        replica_cpus=args.replica_cpus or 1.0,
        threads=args.threads,
        models=tuple(server_flags.models_named(args)),
        served_model_names=tuple(served) if served is not None else None,
        models_root=args.models_root,
        backend=args.backend,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        max_tokens_limit=args.max_tokens_limit,
        generation_config=args.generation_config,
        preempt_after=server_flags.preempt_after(args),
        prompt_cache_bytes=server_flags.prompt_cache_bytes(args),
        max_request_tokens=args.max_request_tokens,
        max_request_logprobs=args.max_request_logprobs,
        max_body_bytes=limits.max_body_bytes,
        body_timeout=limits.body_timeout,
        preload=not args.no_preload,
        **server_flags.api_options(args),
    )


def add_parser(sub) -> None:
    s = sub.add_parser(
        "serve",
        help="serve the OpenAI-compatible completions API (no web page)",
        description="Serve MODEL ... through the OpenAI-compatible API (completions, chat, models), each model's "
        "requests batched by one decode loop; vLLM's flag names are accepted where they mean the same.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    server_flags.add_model_arguments(s, none_named=f"none: {DEFAULT_MODEL}")
    s.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0: every interface, opt-in)")
    s.add_argument("--port", type=tcp_port, default=8000)
    s.add_argument("--backend", choices=list(BACKENDS), default=DEFAULT_BACKEND, help="when a request names none")
    threads = "threads per forward pass (none: all CPUs; with --ray: the replica's CPUs)"
    s.add_argument("--threads", type=thread_count, default=None, help=threads)
    batch = "requests decoded at once, per model (--max-batch: the older spelling)"
    s.add_argument(
        "--max-num-seqs", "--max-batch", dest="max_batch", metavar="N", type=positive_int, default=DEFAULT_MAX_BATCH,
        help=batch,
    )  # fmt: skip
    s.add_argument("--max-queue", type=positive_int, default=DEFAULT_MAX_QUEUE, help="requests waiting; past it: 429")
    s.add_argument(
        "--max-tokens-limit",
        type=max_tokens_limit,
        default=MAX_NEW_TOKENS,
        help=f"the largest max_tokens accepted (at most {MAX_NEW_TOKENS})",
    )
    add_generation_config_argument(s)
    _add_logging_arguments(s)
    add_verbose_and_progress(s)
    server_flags.add_api_arguments(s)
    server_flags.add_limit_arguments(s)
    server_flags.add_sharing_arguments(s)
    s.add_argument(
        "--no-preload",
        action="store_true",
        help="load models on first use (default: the default model for --backend is loaded and warmed up first)",
    )
    _add_ray_arguments(s)
    s.set_defaults(func=run)


def _add_logging_arguments(s) -> None:
    s.add_argument(
        "--log-level",
        default="info",
        type=str.lower,
        choices=["debug", "info", "warning", "error"],
        help="the server's (with --ray: the replicas'; any case, as the demo takes it)",
    )
    s.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="a line per request in the server's log (uvicorn's access log; not with --ray)",
    )


def _add_ray_arguments(s) -> None:
    r = s.add_argument_group("Ray Serve (pip install 'gpt-serve[ray]')")
    r.add_argument("--ray", action="store_true", help="serve through Ray Serve replicas behind Ray's HTTP proxy")
    r.add_argument("--replicas", type=positive_int, default=None, help="replicas, each with its own models (none: 1)")
    r.add_argument("--replica-cpus", type=positive_float, default=None, help="CPUs Ray reserves per replica (none: 1)")
    r.add_argument(
        "--ray-address", default=None, help="join this Ray cluster ('auto': this machine's; none: a new local one)"
    )
