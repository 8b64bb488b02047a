"""The attacks of issue 40 on the engine, against a `gpt-serve serve` process started here (127.0.0.1, a free port):
how long a 1-token request waits beside one greedy request and beside a flood of prompt scoring, the pace of a
stream beside the flood, what `/metrics` reads meanwhile, and the server's RSS after each memory case.

    python benchmarks/fairness.py                           # shipped model, torch, the defaults
    python benchmarks/fairness.py --backend onnx-int8 --flags --preempt-after 0   # without preemption (the old way)

Cases (each prints one line):
- greedy: the issue's `{"n": 16, "max_tokens": 100000}` (the server's `--max-request-tokens` raised to let it in),
  streamed; once it runs, `--probes` 1-token requests one after another: their latency p50 / max (a probe that waits
  past `--probe-timeout` counts as that long).
- scoring: 8 concurrent clients, each sending echo + logprobs 20 requests of 10 prompts x 10,000 characters, in a
  loop; beside them the 1-token probes and one stream of 200 tokens (its gaps between tokens p50 / max), and the
  running / waiting gauges of `/metrics` read during the flood.
- memory: the server's RSS before and after `{"n": 16, "logprobs": 20, "max_tokens": 8000}` (now a 400 naming
  `--max-request-logprobs`), then after the largest request under that cap (n 16 x 6,000 tokens x 21), with its
  answer's size.
- refusals: `--max-batch 1 --max-queue 4`, the queue at 2, 300 requests `n: 2, echo, logprobs` on a 10,000-character
  prompt (each a 429 from its scoring): the RSS growth, and how long SIGTERM then takes on the idle server.

Figures depend on the machine: quote them from a quiet one, with the load average this prints.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
LONG_PROMPT = (TEXT * (10_000 // len(TEXT) + 1))[:10_000]
MODEL = "shakespeare"  # the shipped model
SERVERS: list[subprocess.Popen] = []  # started and not stopped yet


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "gpt_serve", "serve", "--port", str(port), "--backend", args.backend]
    command += ["--threads", str(args.threads), "--log-level", "warning", *args.flags, *flags]
    server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    SERVERS.append(server)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return server, url
        except httpx.HTTPError:
            time.sleep(0.5)
    server.kill()
    raise SystemExit("the server did not start")


def stop(server: subprocess.Popen) -> float:
    """SIGTERM; seconds until it exited."""
    SERVERS.remove(server)
    start_at = time.monotonic()
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
    return time.monotonic() - start_at


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def probe(url: str, timeout: float) -> float:
    """Seconds a 1-token request takes (at most `timeout`)."""
    start_at = time.perf_counter()
    try:
        httpx.post(
            f"{url}/v1/completions",
            json={"model": MODEL, "prompt": "ROMEO:", "max_tokens": 1, "seed": 0},
            timeout=timeout,
        )
    except httpx.TimeoutException:
        return timeout
    return time.perf_counter() - start_at


def probes(url: str, count: int, timeout: float) -> str:
    times = [probe(url, timeout) for _ in range(count)]
    return f"1-token p50 {statistics.median(times):.2f} s, max {max(times):.2f} s ({count} probes)"


def in_background(function, *args) -> threading.Thread:
    thread = threading.Thread(target=function, args=args, daemon=True)
    thread.start()
    return thread


def greedy(args) -> None:
    server, url = start(args, "--max-request-tokens", "1600000")
    stop_event = threading.Event()

    def hold():
        body = {"model": MODEL, "prompt": "ROMEO:", "n": 16, "max_tokens": 100_000, "stream": True, "seed": 1}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=None) as answer:
            for _ in answer.iter_lines():
                if stop_event.is_set():
                    return

    in_background(hold)
    time.sleep(3)  # its 16 rows decoding
    print(f"greedy   : {probes(url, args.probes, args.probe_timeout)}", flush=True)
    stop_event.set()
    stop(server)


def gauges(url: str) -> tuple[float, float]:
    lines = httpx.get(f"{url}/metrics", timeout=10).text.splitlines()
    read = lambda name: sum(float(x.split()[-1]) for x in lines if x.startswith(f"gpt_serve_num_requests_{name}{{"))  # noqa: E731
    return read("running"), read("waiting")


def scoring(args) -> None:
    server, url = start(args)
    stop_event = threading.Event()
    body = {"model": MODEL, "prompt": [LONG_PROMPT] * 10, "echo": True, "logprobs": 20, "max_tokens": 1}

    def flood():
        while not stop_event.is_set():
            httpx.post(f"{url}/v1/completions", json=body, timeout=None)

    for _ in range(8):
        in_background(flood)
    time.sleep(3)
    read = [gauges(url) for _ in range(3)]
    gaps, last, texts = [], None, ""
    stream_body = {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 200, "stream": True, "seed": 2}
    with httpx.stream("POST", f"{url}/v1/completions", json=stream_body, timeout=None) as answer:
        for line in answer.iter_lines():
            now = time.perf_counter()
            if line.startswith("data: {"):
                texts += json.loads(line[6:])["choices"][0]["text"]
                if last is not None:
                    gaps.append(now - last)
                last = now
    gaps = gaps or [0.0]
    gap = f"stream: {len(texts)} characters in {len(gaps) + 1} chunks, gap p50 {statistics.median(gaps) * 1000:.0f} ms"
    gap += f", max {max(gaps) * 1000:.0f} ms"
    print(f"scoring  : {probes(url, args.probes, args.probe_timeout)}; {gap}; /metrics running/waiting {read}")
    stop_event.set()


def memory(args) -> None:
    server, url = start(args)
    before = rss_mb(server.pid)
    refused = httpx.post(
        f"{url}/v1/completions",
        json={"model": MODEL, "prompt": "ROMEO:", "n": 16, "logprobs": 20, "max_tokens": 8000},
        timeout=None,
    )
    after_refusal = rss_mb(server.pid)
    answer = httpx.post(
        f"{url}/v1/completions",
        json={"model": MODEL, "prompt": "ROMEO:", "n": 16, "logprobs": 20, "max_tokens": 6000, "seed": 0},
        timeout=None,
    )
    why = refused.json().get("error", {}).get("message", "")[:70]
    print(
        f"memory   : RSS {before:.0f} MB; n 16 x 8000 x logprobs 20: {refused.status_code} ({why}...), RSS "
        f"{after_refusal:.0f} MB; n 16 x 6000 x logprobs 20: {answer.status_code}, {len(answer.content) / 1e6:.0f} MB "
        f"answer, RSS {rss_mb(server.pid):.0f} MB"
    )
    stop(server)


def refusals(args) -> None:
    server, url = start(args, "--max-batch", "1", "--max-queue", "4", "--preempt-after", "0")
    long = {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 100_000, "stream": True}
    held = [httpx.stream("POST", f"{url}/v1/completions", json=long, timeout=None) for _ in range(3)]
    answers = [h.__enter__() for h in held]  # one running, two waiting
    time.sleep(2)
    before, statuses = rss_mb(server.pid), []
    body = {"model": MODEL, "prompt": LONG_PROMPT, "n": 2, "echo": True, "logprobs": 1, "max_tokens": 1}
    for _ in range(300):
        statuses.append(httpx.post(f"{url}/v1/completions", json=body, timeout=None).status_code)
    growth = rss_mb(server.pid) - before
    for h, a in zip(held, answers, strict=True):
        a.close()
        h.__exit__(None, None, None)
    time.sleep(2)  # idle
    counts = {s: statuses.count(s) for s in set(statuses)}
    print(f"refusals : statuses {counts}, RSS growth {growth:+.0f} MB, SIGTERM on the idle server {stop(server):.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--probes", type=int, default=10)
    parser.add_argument("--probe-timeout", type=float, default=60.0)
    parser.add_argument("--cases", nargs="+", default=["greedy", "scoring", "memory", "refusals"])
    parser.add_argument("--flags", nargs=argparse.REMAINDER, default=[], help="more `gpt-serve serve` flags (last)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; backend {args.backend}, threads {args.threads}, flags {args.flags}")
    cases = {"greedy": greedy, "scoring": scoring, "memory": memory, "refusals": refusals}
    try:
        for case in args.cases:
            cases[case](args)
    finally:
        for server in list(SERVERS):  # one a case left running (it stopped its own)
            stop(server)
    print(json.dumps({"load_average_after": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
