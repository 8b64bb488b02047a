"""The demo's command line: `python -m demo [flags]` (also `gpt-serve demo` and `make demo`).

    python -m demo                                  # the shipped models, http://127.0.0.1:7860
    python -m demo runs/my-model shakespeare        # these models only, the first the default
    python -m demo --host 0.0.0.0 --port 8080       # serve other machines too (opt-in; or GRADIO_SERVER_NAME/PORT)
    python -m demo --share                          # and a public gradio.live link (opt-in, needs internet)
    python -m demo --mcp                            # also an MCP server: /generate as a tool (the `mcp` extra)

It loads and warms up the default model before serving, so the first visitor gets no loading delay. Beside the
Gradio page it serves the OpenAI-compatible API (/v1) and the in-browser page of the default model (/browser/).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import signal
import sys
import time
from pathlib import Path

from gpt_serve.cli.flags import (
    add_generation_config_argument,
    add_progress_argument,
    max_tokens_limit,
    non_negative_float,
    positive_int,
    quiet_model_loading,
    tcp_port,
    thread_count,
)
from gpt_serve.cli.server_flags import (
    add_api_arguments,
    add_limit_arguments,
    add_model_arguments,
    add_sharing_arguments,
    api_options,
    check_port_free,
    interrupt,
    models_named,
    preempt_after,
    prompt_cache_bytes,
    request_caps,
    served_model_names,
    server_limits,
)
from gpt_serve.generation import BACKENDS
from gpt_serve.generation.fields import DEFAULT_BACKEND, MAX_NEW_TOKENS
from gpt_serve.generation.scheduler import DEFAULT_MAX_BATCH
from gpt_serve.models import MODELS_DIR, is_model_folder

# The demo's largest request by default: a slider a visitor can set to the token (1 to 2,000 over a few hundred
# pixels; the specification's 100,000 made one pixel about 170 tokens), and no visitor's run holds a row for minutes.
# `--max-tokens-limit` raises it, up to the specification's MAX_NEW_TOKENS.
DEMO_MAX_TOKENS_LIMIT = 2_000
# Where the demo listens unless --host/--port say: what Gradio reads when `launch()` is given neither (Hugging Face
# Spaces set them), else this machine only
HOST_ENV, PORT_ENV, DEFAULT_HOST, DEFAULT_PORT = "GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT", "127.0.0.1", 7860


def bind_address(host: str | None, port: int | None) -> tuple[str, int]:
    """(host, port) to listen on: the flags when given, else `$GRADIO_SERVER_NAME` / `$GRADIO_SERVER_PORT`, else
    127.0.0.1:7860. A ValueError names a variable that holds no port."""
    host = host or os.environ.get(HOST_ENV) or DEFAULT_HOST
    if port is None:
        text = os.environ.get(PORT_ENV)
        try:
            port = tcp_port(text) if text else DEFAULT_PORT
        except (ValueError, argparse.ArgumentTypeError):
            raise ValueError(f"${PORT_ENV} must be a TCP port in [1, 65535], got {text!r}") from None
    return host, port


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m demo", description="Launch the gpt-serve web demo (Gradio).")
    # MODEL ..., --model (the model selected when the page opens), --served-model-name, --model-dir, --models-root
    add_model_arguments(p, none_named="none: the shipped models, the ladder's stages listed when missing")
    _add_address_arguments(p)
    _add_engine_arguments(p)
    _add_page_arguments(p)
    add_api_arguments(p)  # the mounted OpenAI-compatible API: the same access flags as `gpt-serve serve`
    add_limit_arguments(p)  # and the same bounds, for every request the demo's server takes
    add_sharing_arguments(p)  # and the same sharing of the engine
    return p


def _add_address_arguments(p) -> None:
    p.add_argument(
        "--host",
        default=None,
        help=f"interface to bind (default: ${HOST_ENV} if set, as Hugging Face Spaces set it, else 127.0.0.1: this "
        "machine only; 0.0.0.0: every interface)",
    )
    p.add_argument(
        "--port", type=tcp_port, default=None, help=f"TCP port (default: ${PORT_ENV} if set, else {DEFAULT_PORT})"
    )
    p.add_argument("--share", action="store_true", help="also open a public *.gradio.live link (needs internet)")


def _add_engine_arguments(p) -> None:
    """How the models run: the same flags as `gpt-serve serve` for the same knobs (their older spellings kept)."""
    p.add_argument(
        "--backend",
        choices=list(BACKENDS),
        default=DEFAULT_BACKEND,
        help="backend selected when the page opens (default torch)",
    )
    p.add_argument(
        "--threads",
        type=thread_count,
        default=1,
        help="threads per forward pass, PyTorch and ONNX Runtime (default 1: suits many users at once)",
    )
    p.add_argument(
        "--max-num-seqs",
        "--concurrency",
        dest="concurrency",
        metavar="N",
        type=positive_int,
        default=DEFAULT_MAX_BATCH,
        help=f"generations running at once, batched per model and backend (--concurrency: the older spelling; "
        f"default {DEFAULT_MAX_BATCH})",
    )
    add_generation_config_argument(p)
    p.add_argument(
        "--max-tokens-limit",
        "--max-new-tokens-limit",
        dest="max_tokens_limit",
        metavar="N",
        type=max_tokens_limit,
        default=DEMO_MAX_TOKENS_LIMIT,
        help=f"the largest max_new_tokens a request may ask for, on the page (its slider's top) and through /v1 "
        f"(--max-new-tokens-limit: the older spelling; default {DEMO_MAX_TOKENS_LIMIT}, at most {MAX_NEW_TOKENS})",
    )
    p.add_argument("--no-preload", action="store_true", help="load models on first use instead of at startup")


def _add_page_arguments(p) -> None:
    p.add_argument(
        "--stream-interval",
        type=non_negative_float,
        default=0.05,
        help="least seconds between two updates of one stream (default 0.05)",
    )
    p.add_argument(
        "--max-updates-per-second",
        type=non_negative_float,
        default=200.0,
        help="about how many updates all streams together send at most: with many streams at once each is updated "
        "less often (default 200; 0 for no limit)",
    )
    p.add_argument(
        "--mcp",
        action="store_true",
        help="also serve /generate as an MCP tool at /gradio_api/mcp/ (needs pip install 'gpt-serve[mcp]')",
    )
    p.add_argument(
        "--web-dir",
        default=None,
        metavar="FOLDER",
        help="the in-browser page's folder, served at /browser/ (default: the package's demo/web; a Space's folder "
        "has its own, `gpt-serve space`)",
    )
    p.add_argument(
        "--log-level",
        default=None,
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="the libraries' log level (default WARNING; INFO with --verbose; any case, as `gpt-serve serve` takes it)",
    )
    p.add_argument(
        "--verbose", action="store_true", help="INFO logs (every HTTP request Gradio makes) and progress bars"
    )
    add_progress_argument(p, help="show progress bars (transformers' weight-loading bar)")


def demo_registry(args):
    """The demo's models: those named (`ModelRegistry.serving`, as `gpt-serve serve` takes them), else those under
    --models-root (default: the shipped models), with the ladder's stages listed when missing; a `--model` folder
    that is not one of them is served beside them."""
    from gpt_serve.serving.registry import ModelRegistry

    named, served = models_named(args) if _positional_models(args) else [], served_model_names(args)
    options = dict(
        threads=args.threads,
        max_batch=args.concurrency,
        generation_config=args.generation_config,
        preempt_after=preempt_after(args),
        prompt_cache_bytes=prompt_cache_bytes(args),
    )
    if named or served is not None:
        return ModelRegistry.serving(named, served, args.models_root, **options)
    root = args.models_root if args.models_root is not None else MODELS_DIR
    extra = [args.model_flag] if args.model_flag is not None and is_model_folder(args.model_flag) else []
    return ModelRegistry.discover(extra, root, **options)


def _positional_models(args) -> bool:
    """Whether MODELs (or `--model-dir`s) were named: else the demo serves the models it finds, `--model` choosing
    the one the page opens with."""
    return bool([*getattr(args, "models", ()), *args.model_dir])


def default_model_name(args, registry) -> str | None:
    """The model the page opens with: the first MODEL (`--model` when given), else `--model` among the models
    found (a folder: by its name), else the registry's default."""
    flag = args.model_flag
    if flag is None or _positional_models(args) or served_model_names(args) is not None:
        return None  # `ModelRegistry.serving` made the first named the default
    return Path(flag).name if flag not in registry.names and is_model_folder(flag) else flag


def seconds_since_process_start() -> float | None:
    """How long this process has existed (Linux /proc; None elsewhere): startup including the interpreter and
    every import, whichever entry point (`python -m demo`, `gpt-serve demo`) ran first."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime, in clock ticks
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def preload(registry, model: str, backend: str) -> str:
    """Loads (model, backend) and the attention model, and runs a few tokens through both; returns a summary."""
    from .attention import prompt_attention

    start = time.perf_counter()
    reason = registry.unavailable_reason(model, backend)
    if reason:
        return f"not preloaded: {reason}"
    registry.warm_up(model, backend)
    try:
        torch_model = registry.backend(model, "torch").backend.pretrained
        registry.scheduler(model, "torch").call(prompt_attention, torch_model, [0, 1])
    except ImportError:
        pass
    return f"{model}/{backend} loaded and warmed up in {time.perf_counter() - start:.2f} s"


def mount_api(app, registry, default_backend: str, max_tokens_limit: int, **access):
    """Adds the OpenAI-compatible API (`gpt_serve.serving.api`) to the demo's FastAPI app: the same process, the same
    schedulers, with the same access options as `gpt-serve serve` (`access`: `api_options`). Returns the API's
    `Drain` (its open requests, for the shutdown), or None (with a message) where its dependencies are not
    installed."""
    try:
        from gpt_serve.serving.api import create_router
        from gpt_serve.serving.launcher import Drain
    except ImportError as e:
        print(f"demo: no OpenAI-compatible API ({e}; pip install 'gpt-serve[serve]')", file=sys.stderr)
        return None
    drain = Drain()
    app.include_router(create_router(registry, default_backend, max_tokens_limit, drain=drain, **access))
    return drain


def mount_at_start(
    options: dict, registry, browser_model: str, default_backend: str, max_tokens_limit: int, web_dir=None, **access
):
    """Makes `options` (`Blocks.launch` arguments, `launch_options`) mount the OpenAI-compatible API (`mount_api`)
    and the in-browser page of `browser_model` (`mount_browser`, the page's files from `web_dir`, None: the
    package's) before the server accepts its first connection: uvicorn runs the lifespan's start first (Gradio runs
    its own lifespan, then this one), so a request sent as soon as the page answers finds /v1 and /browser/. Returns
    a dict that holds, once the server has started, the API's `Drain` (`"drain"`) and why the browser page is
    missing, if it is (`"missing"`)."""
    from .browser import WEB_DIR, mount_browser

    mounted, folder = {}, registry.folder(browser_model)  # an unknown model: an error here, not a failed start

    @contextlib.asynccontextmanager
    async def mount_routes(app):
        mounted["drain"] = mount_api(app, registry, default_backend, max_tokens_limit, **access)
        mounted["missing"] = mount_browser(app, folder, web_dir=web_dir or WEB_DIR)
        yield

    options["app_kwargs"]["lifespan"] = mount_routes
    return mounted


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:  # before anything loads
        access, limits = _check_flags(args)
    except (OSError, ValueError) as e:
        print(f"demo: error: {e}", file=sys.stderr)
        return 2
    _setup(args)
    from .app import build_demo, launch_options

    try:
        registry = demo_registry(args)
        default_model = registry.default_model(default_model_name(args, registry))
    except ValueError as e:
        print(f"demo: error: {e}", file=sys.stderr)
        return 2
    missing = [n for n in registry.names if n not in registry.available]
    print(f"demo: models {registry.available or 'none'} (listed but missing: {missing or 'none'})")
    if not args.no_preload:
        try:
            print(f"demo: {preload(registry, default_model, args.backend)}")
        except (ValueError, OSError) as e:  # a bad model folder (ModelUnavailable is a ValueError): serve nothing
            print(f"demo: error: cannot load {default_model}/{args.backend}: {e}", file=sys.stderr)
            registry.close()
            return 2
    demo = build_demo(
        registry,
        default_model=default_model,
        default_backend=args.backend,
        max_tokens_limit=args.max_tokens_limit,
        stream_interval=args.stream_interval,
        max_updates_per_second=args.max_updates_per_second or None,
        concurrency=args.concurrency,
    )
    options = launch_options(limits, access["api_key"], access["metrics_need_key"], access["allow_origins"])
    mounted = mount_at_start(
        options, registry, default_model, args.backend, args.max_tokens_limit, args.web_dir, **access
    )
    if not _launch(demo, args, options, limits):
        return 2
    _announce(demo, args, mounted)
    _serve_until_stopped(demo, registry, mounted["drain"], limits)
    return 0


def _check_flags(args) -> tuple[dict, object]:
    """The API's access options and the server's limits from the flags, and the address checked free; a
    ValueError or OSError names the flag, before anything loads."""
    if args.mcp and importlib.util.find_spec("mcp") is None:
        raise ValueError("--mcp needs Gradio's MCP support: pip install 'gpt-serve[mcp]'")
    access, limits = {**api_options(args), "caps": request_caps(args)}, server_limits(args)
    args.host, args.port = bind_address(args.host, args.port)
    hint = f'is another demo running? pass --port N (make demo DEMO_ARGS="--port {args.port + 1}")'
    check_port_free(args.host, args.port, hint)
    return access, limits


def _setup(args) -> None:
    """Logging, progress bars, no analytics, torch's threads."""
    quiet_model_loading(args.verbose or args.progress)
    level = args.log_level or ("INFO" if args.verbose else "WARNING")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home unless the user asks for them
    try:
        import torch

        torch.set_num_threads(args.threads)
    except ImportError:
        print(
            "demo: torch is not installed: only the ONNX Runtime backends work, without the attention view",
            file=sys.stderr,
        )


def _launch(demo, args, options: dict, limits) -> bool:
    """Starts the server (not blocking); False, with a message, when it cannot listen."""
    try:
        demo.launch(
            server_name=args.host,
            server_port=args.port,
            share=args.share,
            quiet=not args.share,  # else Gradio's own hint names its launch() argument, not our --share flag
            prevent_thread_lock=True,
            max_threads=max(40, 2 * args.concurrency + 8),
            ssr_mode=False,
            **options,
            mcp_server=args.mcp,
        )
    except OSError as e:
        print(f"demo: error: cannot serve on {args.host}:{args.port}: {e}", file=sys.stderr)
        return False
    from gpt_serve.serving.launcher import close_slow_headers

    close_slow_headers(demo.server, limits.header_timeout)
    return True


def _announce(demo, args, mounted: dict) -> None:
    """Where the page, the API and the in-browser page are, and how long the start took."""
    if not args.share:
        print(f"demo: the page at {demo.local_url} (--share also opens a public *.gradio.live link)")
    if mounted["drain"] is not None:
        print(f"demo: OpenAI-compatible API at http://{args.host}:{args.port}/v1 (completions, chat, models)")
    missing = mounted["missing"]
    print(
        f"demo: in-browser page (onnxruntime-web) at http://{args.host}:{args.port}/browser/"
        + (f" (not available: {missing})" if missing else "")
    )
    age = seconds_since_process_start()
    print(
        f"demo: ready in {age:.1f} s (since the process started; Ctrl+C stops it)"
        if age is not None
        else "demo: ready (Ctrl+C stops it)"
    )


def _serve_until_stopped(demo, registry, drain, limits) -> None:
    """Serves until Ctrl-C or SIGTERM, then lets the API's open requests end and closes everything."""
    signal.signal(signal.SIGTERM, interrupt)  # a service manager's stop: the same clean exit as Ctrl-C
    try:
        while demo.is_running:  # not `demo.block_thread()`: on Ctrl-C it closes the server before the API drains
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    finally:
        if drain is not None:  # the API's open streams end with their [DONE], within --shutdown-timeout
            for stop in (signal.SIGINT, signal.SIGTERM):  # a second signal cuts them now, and never skips the drain
                signal.signal(stop, lambda signum, frame: drain.cut())
            print(f"demo: stopping: open API requests get up to {limits.shutdown_timeout:g} s", flush=True)
            drain.close(limits.shutdown_timeout)
        demo.close()
        demo.handlers.close()  # the comparison's own decode loops (a model's earlier checkpoints)
        registry.close()
