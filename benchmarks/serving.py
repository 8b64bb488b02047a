"""Concurrent streams through the library's scheduler (continuous batching), in one process, no HTTP.

    python benchmarks/serving.py --threads 2                       # shipped model, torch and onnx-int8, 1/4/16/64
    python benchmarks/serving.py --backends onnx --streams 1 16 --window-mode exact
    python benchmarks/serving.py --threads 2 --over api            # the same over HTTP: `gpt-serve serve`, openai
    python benchmarks/serving.py --threads 2 --over demo           # through the demo's /generate (Gradio's HTTP API)
    python benchmarks/serving.py --threads 2 --over demo --client gradio_client   # read with gradio_client
    python benchmarks/serving.py --threads 2 --over demo --tokens 2 --streams 64 --backends torch   # request cost
    python benchmarks/serving.py --threads 2 --model lesson        # the lesson's 10.8M model (random weights)
    python benchmarks/serving.py --threads 2 --n 8 --streams 1 8   # requests of 8 choices (the prompt forked)
    python benchmarks/serving.py --threads 2 --n 8 --streams 1 8 --unshared   # the same, each choice prefilled

For each backend and each number of concurrent streams N: N requests of `--tokens` tokens each are submitted at
once to the `Scheduler` of a `ModelRegistry` (as the servers get theirs: PyTorch models load and decode on the
shared `torch_runner()` thread) and read by N asyncio tasks on one event loop (`Stream.atake`, as the API server's
handlers read them), after a warm-up that includes a whole round of the most streams asked for. It prints the
aggregate tokens/s (all tokens over the wall time), the per-stream tokens/s (p50 of each stream's tokens over its
own time), and time to first token p50/p95. With `--over api` the streams go through the OpenAI-compatible API of
a `gpt-serve serve` process started here (on 127.0.0.1, a free port), read with the `openai` client; with
`--over demo`, through the `/generate` API of a `python -m demo` process, over Gradio's HTTP API read with `httpx`
(`--client gradio_client` for that client; each update is the text so far). Both also print the CPU time per
stream of the server process and of this one (the clients: they share the machine with the server); `--tokens 2`
shows what starting a request costs.

`--model lesson` builds the lesson's 10.8M architecture with random weights and exports it
(about a minute; its speed does not depend on the weights).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == ROOT / "benchmarks":
    sys.path[0] = str(ROOT)  # the repository's packages, not this folder's scripts

from gpt_serve.cli.flags import non_negative_float  # noqa: E402
from gpt_serve.generation import SamplingParams  # noqa: E402
from gpt_serve.generation.requests import Request  # noqa: E402
from gpt_serve.generation.scheduler import Scheduler  # noqa: E402
from gpt_serve.generation.spec import offset_seed  # noqa: E402
from gpt_serve.models import model_path  # noqa: E402
from gpt_serve.serving.registry import ModelRegistry  # noqa: E402

WARM_TOKENS = 8  # the warm-up streams' length


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def scheduler_stream(scheduler: Scheduler, prompt: list[int], tokens: int, window_mode: str, n: int = 1):
    """A consumer of one stream through `scheduler`, as the API server's handlers read theirs: an asyncio coroutine
    (`Stream.atake`), all of them on one event loop (`run` sees it is one). With `n` > 1, the stream is a request of
    `n` choices, submitted as the API submits them (together, choice j with seed `seed + j`): its first token is
    its first choice's, its tokens all of theirs."""

    async def consume(seed: int):
        start = time.perf_counter()
        with scheduler.together():
            streams = [
                scheduler.submit(Request(prompt, tokens, SamplingParams(0.8), offset_seed(seed, j), window_mode))
                for j in range(n)
            ]

        async def read(stream):
            count, first = 0, None
            while (chunk := await stream.atake()) is not None:
                first = first or time.perf_counter()
                count += len(chunk)
            return first, count

        read_all = await asyncio.gather(*(read(stream) for stream in streams))
        end, first, count = time.perf_counter(), min(f for f, _ in read_all), sum(c for _, c in read_all)
        return first - start, (count - 1) / max(end - first, 1e-9), count

    return consume


def api_stream(url: str, model: str, backend: str, prompt: str, tokens: int, window_mode: str, n: int = 1):
    """The same through the OpenAI-compatible API (characters are tokens here), `n` choices a request."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    extra = {"backend": backend, "window_mode": window_mode}

    def consume(seed: int):
        chunks = client.completions.create(
            model=model, prompt=prompt, max_tokens=tokens, temperature=0.8, seed=seed, n=n, stream=True,
            extra_body=extra,
        )  # fmt: skip
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].text:
                yield len(chunk.choices[0].text)

    return consume


def demo_stream(
    url: str, model: str, backend: str, prompt: str, tokens: int, window_mode: str, new_sessions: bool = False
):
    """The same through the demo's /generate over Gradio's HTTP API (`POST /gradio_api/call/generate`, then its
    server-sent events), one `httpx` client for all streams: each `generating` event is the whole text so far.

    Stream `seed` is visitor `seed`: its requests share one Gradio session, as a page's runs do (Gradio builds a
    session's state, a config of every block of the page, at its first event). With `new_sessions`, every request
    is a new visitor's first."""
    import json

    import httpx

    from demo.handlers import FIELDS  # /generate's parameters, in order

    unlimited = httpx.Limits(max_connections=None, max_keepalive_connections=None)  # a connection per stream
    http = httpx.Client(base_url=f"{url}/gradio_api/call/generate", timeout=600, limits=unlimited)
    visitors = secrets.token_hex(4)
    settings = dict(prompt=prompt, max_new_tokens=tokens, temperature=0.8, top_k=None, top_p=1.0)
    settings.update(backend=backend, model=model, window_mode=window_mode, unk_policy="error", structured_outputs=None)

    def consume(seed: int):
        session = None if new_sessions else f"{visitors}-{seed}"
        data = [seed if name == "seed" else settings[name] for name in FIELDS]
        posted = http.post("", json={"data": data, "session_hash": session})
        posted.raise_for_status()
        seen, event = 0, None
        with http.stream("GET", f"/{posted.json()['event_id']}") as response:
            for line in response.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event in ("generating", "complete"):
                    text = json.loads(line[6:])[0]
                    if len(text) > seen:
                        yield len(text) - seen
                        seen = len(text)
                elif line.startswith("data: ") and event == "error":
                    raise RuntimeError(f"/generate failed: {line[6:]}")

    return consume


def gradio_client_stream(
    url: str, model: str, backend: str, prompt: str, tokens: int, window_mode: str, streams: int = 64
):
    """The same with `gradio_client` (`--client gradio_client`). The client runs each job on a thread of its own
    pool, 40 by default: sized for `streams` here, or the streams past 40 would wait in the client for a free thread
    (that had put 16-30 s of client-side waiting into the 64-stream TTFT p95). Each job's thread polls for updates
    every millisecond and each request makes a new HTTP client (an SSL context each), so on a machine shared with
    the server these clients take a large part of the CPU (the last column)."""
    from gradio_client import Client

    client = Client(url, verbose=False, max_workers=streams + 2, analytics_enabled=False)
    settings = dict(prompt=prompt, max_new_tokens=tokens, temperature=0.8, top_k=None, top_p=1.0)
    settings.update(backend=backend, model=model, window_mode=window_mode, unk_policy="error", structured_outputs=None)

    def consume(seed: int):
        seen = 0
        for text in client.submit(**settings, seed=seed, api_name="/generate"):
            if len(text) > seen:
                yield len(text) - seen
                seen = len(text)

    return consume


def run(consume, n: int, tokens: int) -> dict:
    """N streams at once; per stream (time to first token, tokens/s after it), and the aggregate. `consume(seed)`
    is a coroutine (N tasks on one event loop) or a generator of chunk sizes (N threads)."""
    start = time.perf_counter()
    if asyncio.iscoroutinefunction(consume):

        async def all_streams():
            return await asyncio.gather(*(consume(seed) for seed in range(n)))

        results = asyncio.run(all_streams())
    else:
        results, lock = [], threading.Lock()

        def one(seed: int) -> None:
            begin, count, first = time.perf_counter(), 0, None
            for got in consume(seed):
                first = first or time.perf_counter()
                count += got
            end = time.perf_counter()
            with lock:
                results.append((first - begin, (count - 1) / max(end - first, 1e-9), count))

        threads = [threading.Thread(target=one, args=(seed,)) for seed in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.perf_counter() - start
    ttfts = [r[0] for r in results]
    return dict(
        streams=n,
        complete=sum(r[2] == tokens for r in results),
        aggregate=sum(r[2] for r in results) / wall,
        per_stream=statistics.median(r[1] for r in results),
        ttft_p50=percentile(ttfts, 0.5),
        ttft_p95=percentile(ttfts, 0.95),
    )


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far (Linux's /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(args, model_dirs: list[str]) -> tuple[subprocess.Popen, str]:
    """`gpt-serve serve` (`--over api`) or `python -m demo` (`--over demo`) on 127.0.0.1 on a free port; (process,
    URL) once it answers."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    extra = [arg for spec in model_dirs for arg in ("--model-dir", spec)]
    if args.over == "api":
        cli = [sys.executable, "-m", "gpt_serve", "serve", *([] if model_dirs else [args.model]), "--port", str(port)]
        cli += ["--threads", str(args.threads)]
        cli += ["--max-num-seqs", str(args.max_batch), "--max-queue", str(max(args.streams) * args.n)]
        cli += ["--log-level", "warning"]
        ready = "/health"
    else:
        cli = [sys.executable, "-m", "demo", "--port", str(port), "--threads", str(args.threads), "--no-preload"]
        cli += ["--max-num-seqs", str(max(args.streams)), "--max-tokens-limit", str(max(args.tokens, WARM_TOKENS))]
        if args.max_updates_per_second is not None:
            cli += ["--max-updates-per-second", str(args.max_updates_per_second)]
        ready = "/"
    process = subprocess.Popen(cli + extra, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{cli[2]} exited with status {process.returncode} before it answered (see above)")
        try:
            if httpx.get(f"{url}{ready}", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.2)
    process.terminate()
    raise SystemExit(f"{cli[2]} did not answer on {url}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", default="shakespeare", help="shipped model name, model folder, or 'lesson' (10.8M, random weights)"
    )
    p.add_argument("--data", default=None, help="Tiny Shakespeare, for --model lesson's export (default: downloaded)")
    p.add_argument("--backends", nargs="+", default=["torch", "onnx-int8"])
    p.add_argument("--streams", nargs="+", type=int, default=[1, 4, 16, 64])
    p.add_argument("--tokens", type=int, default=200, help="max_new_tokens of every stream")
    p.add_argument(
        "--n",
        type=int,
        default=1,
        help="choices a stream's request asks for (OpenAI's n; --over scheduler or api): they prefill the prompt "
        "once and fork it; TTFT is the request's first token, throughput counts every choice's tokens",
    )
    p.add_argument(
        "--unshared",
        action="store_true",
        help="with --over scheduler: rows with the same prompt each prefill it (no fork, no prompt cache), to "
        "compare with",
    )
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--window-mode", choices=["exact", "refill"], default="refill")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--over",
        choices=["scheduler", "api", "demo"],
        default="scheduler",
        help="in process, over the OpenAI-compatible API, or over the demo's /generate",
    )
    p.add_argument(
        "--client",
        choices=["http", "gradio_client"],
        default="http",
        help="with --over demo: Gradio's HTTP API read with httpx (default), or gradio_client",
    )
    p.add_argument(
        "--new-sessions",
        action="store_true",
        help="with --over demo: every request a new visitor's first (default: stream i is visitor i, whose Gradio "
        "session the warm-up opened)",
    )
    p.add_argument(
        "--max-updates-per-second",
        type=non_negative_float,
        default=None,
        help="with --over demo: the demo's flag of that name (default: the demo's default; 0 for no limit)",
    )
    args = p.parse_args(argv)
    demo_only = {
        "--client gradio_client": args.client != "http",
        "--new-sessions": args.new_sessions,
        "--max-updates-per-second": args.max_updates_per_second is not None,
    }
    given = [flag for flag, used in demo_only.items() if used]
    if given and args.over != "demo":
        p.error(f"only with --over demo: {', '.join(given)}")
    if args.n < 1:
        p.error(f"--n must be at least 1, got {args.n}")
    if args.n > 1 and args.over == "demo":
        p.error("--n is for --over scheduler or api (the demo's /generate makes one text a request)")
    if args.unshared and args.over != "scheduler":
        p.error("--unshared is for --over scheduler (a server always shares its requests' prompts)")
    if args.new_sessions and args.client == "gradio_client":
        p.error("--new-sessions is for the http client (gradio_client keeps one session per client)")
    with tempfile.TemporaryDirectory() as work:
        return bench(args, Path(work))


def bench(args, work: Path) -> int:
    model_dirs = []
    if args.model == "lesson":
        from benchmarks.onnx_generation import lesson_model_dir
        from gpt_serve.folders.corpus import load_text

        model_dirs = [f"lesson={lesson_model_dir(work, load_text(args.data))}"]
    print(
        f"model {args.model!r}, {args.tokens} tokens a stream from {args.prompt!r}, window {args.window_mode}, "
        f"{args.threads} threads, max_batch {args.max_batch}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at the start"
    )
    if args.n > 1:
        shared = "each choice prefills it" if args.unshared else "the prompt prefilled once and forked"
        print(f"each stream a request of n={args.n} choices ({shared}): TTFT is its first token, tokens all choices'")
    over = {
        "api": "the OpenAI-compatible API (HTTP, openai client)",
        "demo": f"the demo's /generate (HTTP, {'gradio_client' if args.client == 'gradio_client' else 'httpx'})",
        "scheduler": "the scheduler itself",
    }[args.over]
    print(f"over: {over}")
    server = start_server(args, model_dirs) if args.over != "scheduler" else None
    server_cpu = " server CPU per stream | clients' CPU per stream |" if server else ""
    header = "| backend | streams | complete | aggregate tok/s | per-stream tok/s p50 | TTFT p50 | TTFT p95 |"
    print(header + server_cpu)
    print("|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if server else ""))
    try:
        for key in args.backends:
            registry = None
            if server is None:  # the servers' way: a registry's loaded backend and scheduler (PyTorch: one thread)
                folder = model_dirs[0].split("=", 1)[1] if model_dirs else model_path(args.model)
                registry = ModelRegistry(
                    {"model": folder}, threads=args.threads, max_batch=args.max_batch,
                    max_queue=max(args.streams) * args.n,
                )  # fmt: skip
                loaded, scheduler = registry.backend("model", key), registry.scheduler("model", key)
                scheduler.share_prompts = not args.unshared
                if args.unshared:  # nor kept across iterations by the backend
                    loaded.backend.prompt_cache = None
                ids = loaded.vocab.encode(args.prompt)
                consume = scheduler_stream(scheduler, ids, args.tokens, args.window_mode, args.n)
                warm = scheduler_stream(scheduler, ids, WARM_TOKENS, args.window_mode, args.n)
            else:
                if args.over == "api":
                    stream = functools.partial(api_stream, n=args.n)
                elif args.client == "gradio_client":
                    stream = functools.partial(gradio_client_stream, streams=max(args.streams))
                else:
                    stream = functools.partial(demo_stream, new_sessions=args.new_sessions)
                consume = stream(server[1], args.model, key, args.prompt, args.tokens, args.window_mode)
                warm = stream(server[1], args.model, key, args.prompt, WARM_TOKENS, args.window_mode)
            try:
                run(warm, 2, WARM_TOKENS * args.n)  # loading, first-call allocations, thread pools
                # then a whole round at the most streams: every window length, the batch's largest shapes (a cold
                # first round ran slower: one stream ~40%, 64 over the demo 1.1-1.3 s to the first token against
                # 0.4-0.7 s in the next) and, over the demo, every visitor's Gradio session
                run(consume, max(args.streams), args.tokens * args.n)
                for n in args.streams:
                    cpu = process_cpu_seconds(server[0].pid) if server else None
                    client_cpu = time.process_time()
                    r = run(consume, n, args.tokens * args.n)
                    client_cpu = time.process_time() - client_cpu
                    after = process_cpu_seconds(server[0].pid) if server else None
                    used = " n/a | n/a |" if server else ""
                    if cpu is not None and after is not None:
                        used = f" {(after - cpu) / n * 1e3:.1f} ms | {client_cpu / n * 1e3:.1f} ms |"
                    print(
                        f"| {key} | {n} | {r['complete']}/{n} | {r['aggregate']:,.0f} | {r['per_stream']:,.0f} | "
                        f"{r['ttft_p50'] * 1e3:.0f} ms | {r['ttft_p95'] * 1e3:.0f} ms |{used}",
                        flush=True,
                    )
            finally:
                if registry is not None:
                    registry.close()
    finally:
        if server is not None:
            server[0].terminate()
            server[0].wait(timeout=30)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
