"""Benchmark of the web demo: startup, time to first token and tokens/s per backend, and N concurrent streams.

    .venv/bin/python benchmarks/demo_load.py                          # the shipped default model
    .venv/bin/python benchmarks/demo_load.py --model-dir NAME=PATH --model NAME   # another model folder
    .venv/bin/python benchmarks/demo_load.py --url http://127.0.0.1:7860/         # a demo already running
    .venv/bin/python benchmarks/demo_load.py --browser                # also click Generate in headless Chromium

Unless --url is given, it starts the demo the way `make demo` does (`python -m demo`, in its own process so the
clients here do not share its interpreter) and reports how long that took. Then, on 127.0.0.1:

- HTTP: the /generate API's server-sent events (POST /gradio_api/call/generate, then GET the stream), as curl or
  any HTTP client sees them. TTFT = POST -> first event with text; tokens/s = tokens after the first event / time
  from the first event to the last.
- gradio_client: the same through `Client.submit` (its own threads add latency; shown for reference).
- Browser (--browser): click Generate -> the first generated character in the output box, in headless Chromium.
- N concurrent streams: N HTTP clients (threads, one connection each, different seeds) start at once; aggregate
  tokens/s = all tokens / (first request -> last completion).
- The engine alone in this process (no HTTP, no Gradio), with the same threads: what the server's loop costs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
from tests.helpers import CHROMIUM, CHROMIUM_FLAGS  # noqa: E402 (the browser tests launch it the same way)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_demo(args) -> tuple[subprocess.Popen, str, str]:
    """`python -m demo` on a free port; returns (process, url, its startup lines)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "demo",
        "--port",
        str(port),
        "--threads",
        str(args.threads),
        "--model",
        args.model,
        "--max-num-seqs",
        str(args.concurrency),
        "--log-level",
        "WARNING",
    ]
    for spec in args.model_dir:
        cmd += ["--model-dir", spec]
    start = time.perf_counter()
    process = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines = []
    for line in process.stdout:
        lines.append(line.rstrip())
        if line.startswith("demo: ready"):
            break
    else:
        raise SystemExit("the demo did not start:\n" + "\n".join(lines))
    threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()  # keep the pipe drained
    summary = [x for x in lines if x.startswith("demo: ")]
    summary.append(f"demo: serving {time.perf_counter() - start:.1f} s after `python -m demo` was launched")
    return process, f"http://127.0.0.1:{port}/", "\n".join(summary)


def api_data(args, backend: str, seed: int, max_new_tokens: int) -> list:
    """/generate's parameters in order: prompt, max_new_tokens, temperature, top_k, top_p, seed, backend, model,
    window_mode, unk_policy."""
    return [args.prompt, max_new_tokens, 0.8, None, 1.0, seed, backend, args.model, args.window_mode, "error"]


def http_stream(http, url: str, data: list) -> dict:
    """One /generate call over the raw event stream: TTFT, tokens/s, tokens, and the final text."""
    start = time.perf_counter()
    response = http.post(url + "gradio_api/call/generate", json={"data": data})
    response.raise_for_status()
    event_id = response.json()["event_id"]
    first, text, last, event = None, "", start, None
    with http.stream("GET", url + f"gradio_api/call/generate/{event_id}") as stream:
        for line in stream.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                payload = json.loads(line[5:])
                if event == "error":
                    raise RuntimeError(f"/generate failed: {payload}")
                if event in ("generating", "complete") and payload and payload[0]:
                    now = time.perf_counter()
                    text, last = payload[0], now
                    first = first or (now, len(text))
                if event == "complete":
                    break
    if first is None:
        raise RuntimeError("/generate returned no text")
    decode = last - first[0]
    return dict(
        ttft=first[0] - start, tps=(len(text) - first[1]) / decode if decode > 0 else float("nan"), tokens=len(text)
    )


def client_ttft(client, args, backend: str, seed: int) -> float:
    start = time.perf_counter()
    job = client.submit(*api_data(args, backend, seed, args.max_new_tokens), api_name="/generate")
    for out in job:
        if out:
            ttft = time.perf_counter() - start
            job.cancel()
            return ttft
    raise RuntimeError("no output")


def p50(values) -> float:
    return statistics.median(values)


def per_backend(url: str, args) -> tuple[list, list]:
    import httpx
    from gradio_client import Client

    client = Client(url, verbose=False)
    http_rows, client_rows = [], []
    with httpx.Client(timeout=600) as http:
        for backend in args.backends:
            try:
                http_stream(http, url, api_data(args, backend, 0, 20))  # warm-up: loads an ONNX session once
            except RuntimeError as e:  # an unavailable backend: say so and go on
                http_rows.append((backend, f"unavailable: {str(e)[:160]}"))
                continue
            runs = [
                http_stream(http, url, api_data(args, backend, i, args.max_new_tokens)) for i in range(args.requests)
            ]
            http_rows.append(row(backend, [r["ttft"] for r in runs], [r["tps"] for r in runs]))
            ttfts = [client_ttft(client, args, backend, i) for i in range(args.requests)]
            client_rows.append(row(backend, ttfts, None))
    return http_rows, client_rows


def row(backend: str, ttfts: list[float], tps: list[float] | None) -> tuple:
    return (backend, p50(ttfts) * 1000, max(ttfts) * 1000, p50(tps) if tps else None)


def concurrent_streams(url: str, args) -> dict:
    import httpx

    n = args.streams
    barrier = threading.Barrier(n)
    start_at: list[float] = []

    def run(i):
        with httpx.Client(timeout=600) as http:
            barrier.wait()
            if i == 0:
                start_at.append(time.perf_counter())
            result = http_stream(http, url, api_data(args, args.stream_backend, i, args.stream_tokens))
            return result, time.perf_counter()

    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(run, range(n)))
    wall = max(end for _, end in results) - start_at[0]
    tokens = [r["tokens"] for r, _ in results]
    return dict(
        streams=n,
        complete=sum(t == args.stream_tokens for t in tokens),
        wall=wall,
        aggregate=sum(tokens) / wall,
        ttft=[r["ttft"] for r, _ in results],
    )


# In the page: on each click of Generate, poll every 2 ms until the output box holds new text longer than the
# prompt (the first generated character); record the milliseconds since the click.
_TIME_CLICKS_JS = """n => {
    window.__ttft = [];
    document.querySelector('#generate-btn').addEventListener('click', () => {
        const clicked = performance.now();
        const before = document.querySelector('#output textarea').value;
        const timer = setInterval(() => {
            const now = document.querySelector('#output textarea').value;
            if (now !== before && now.length > n) {
                window.__ttft.push(performance.now() - clicked);
                clearInterval(timer);
            }
        }, 2);
    }, true);
}"""


def browser_ttft(url: str, args) -> list[float]:
    """Click Generate -> first generated character in the output box, timed inside headless Chromium (the demo's
    default model and backend: start it with --model)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page()
        page.goto(url)
        page.locator("#prompt textarea").fill(args.prompt)
        page.locator("#max-new-tokens input[type=number]").fill(str(args.max_new_tokens))
        page.locator("#max-new-tokens input[type=number]").press("Enter")
        page.evaluate(_TIME_CLICKS_JS, len(args.prompt))
        for i in range(args.requests + 1):
            page.locator("#generate-btn").click()
            page.wait_for_function(f"() => window.__ttft.length > {i}", timeout=120_000)
            page.wait_for_function(
                "() => document.querySelector('#status').innerText.includes('Done.')", polling=50, timeout=120_000
            )
        ttfts = page.evaluate("() => window.__ttft")
        browser.close()
    return [t / 1000 for t in ttfts[1:]]  # the first click also warms the page up


def engine_alone(args) -> list[tuple]:
    """TTFT and tokens/s of the engine called directly (what the server's loop costs without HTTP)."""
    import torch

    from demo.progress import parse_form, stream_progress
    from gpt_serve.generation.fields import MAX_NEW_TOKENS
    from gpt_serve.serving.registry import ModelRegistry

    torch.set_num_threads(args.threads)
    registry = ModelRegistry.discover(args.model_dir, threads=args.threads)
    rows = []
    for backend in args.backends:
        reason = registry.unavailable_reason(args.model, backend)
        if reason:
            rows.append((backend, f"unavailable: {reason[:160]}"))
            continue
        runs = []
        for seed in range(args.requests + 1):
            form = dict(
                prompt=args.prompt,
                max_new_tokens=args.max_new_tokens,
                temperature=0.8,
                top_k=None,
                top_p=1.0,
                seed=seed,
                backend=backend,
                model=args.model,
                window_mode=args.window_mode,
                unk_policy="error",
            )
            request = parse_form(registry, MAX_NEW_TOKENS, form)
            runs.append(list(stream_progress(registry, request))[-1])
        runs = runs[1:]  # the first one loaded the backend
        rows.append(row(backend, [r.time_to_first_token for r in runs], [r.tokens_per_second for r in runs]))
    return rows


def print_table(title: str, rows: list[tuple]) -> None:
    print(f"\n{title}")
    print(f"  {'backend':10s} {'TTFT p50':>10s} {'TTFT max':>10s} {'tokens/s p50':>13s}")
    for r in rows:
        if isinstance(r[1], str):
            print(f"  {r[0]:10s} {r[1]}")
        else:
            tps = "" if r[3] is None else f"{r[3]:13.0f}"
            print(f"  {r[0]:10s} {r[1]:8.1f} ms {r[2]:8.1f} ms {tps}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="benchmark a demo already running there instead of starting one")
    p.add_argument("--model", default="shakespeare")
    p.add_argument("--model-dir", action="append", default=[], metavar="[NAME=]PATH")
    p.add_argument("--backends", default="torch,onnx,onnx-int8")
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--requests", type=int, default=10, help="sequential requests per backend")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--window-mode", default="exact", choices=["exact", "refill"])
    p.add_argument("--streams", type=int, default=16, help="concurrent streams")
    p.add_argument("--stream-tokens", type=int, default=200, help="max_new_tokens of each concurrent stream")
    p.add_argument("--stream-backend", default="torch")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=16, help="the demo's concurrency limit (when started here)")
    p.add_argument("--browser", action="store_true", help=f"also measure clicks in headless {CHROMIUM}")
    args = p.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]

    print(
        f"demo benchmark: model {args.model!r}, prompt {args.prompt!r}, {args.max_new_tokens} new tokens "
        f"(window {args.window_mode}), {args.threads} thread(s) per forward, {os.cpu_count()} CPUs, load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    process, url = None, args.url
    if url is None:
        process, url, startup = start_demo(args)
        print(startup)
    try:
        http_rows, client_rows = per_backend(url, args)
        print_table(f"one stream at a time, HTTP event stream ({args.requests} requests each)", http_rows)
        print_table("one stream at a time, gradio_client (TTFT only)", client_rows)
        if args.browser:
            t = browser_ttft(url, args)
            print(
                f"\nbrowser ({args.model}, default backend): click Generate -> first character: p50 "
                f"{p50(t) * 1000:.0f} ms, max {max(t) * 1000:.0f} ms ({len(t)} clicks)"
            )
        c = concurrent_streams(url, args)
        print(
            f"\n{c['streams']} concurrent streams ({args.stream_backend}, {args.stream_tokens} tokens each): "
            f"{c['complete']}/{c['streams']} complete in {c['wall']:.2f} s, aggregate {c['aggregate']:.0f} "
            f"tokens/s; TTFT p50 {p50(c['ttft']) * 1000:.0f} ms, max {max(c['ttft']) * 1000:.0f} ms"
        )
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=10)
    print_table(f"engine alone, in this process, no HTTP ({args.requests} requests each)", engine_alone(args))
    print(f"\nload average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
