"""A client without the API key against a keyed server: the latency of keyed requests while it floods.

    python benchmarks/keyless_flood.py                          # gpt-serve serve --api-key, then the demo's
    python benchmarks/keyless_flood.py --target demo --sockets 300 --seconds 20
    python benchmarks/keyless_flood.py --checkout ../main       # the same attack on another checkout's code

Starts the server of this checkout (or `--checkout`'s) on 127.0.0.1 with `--api-key`, then opens `--sockets`
connections without the key, each sending the headers of a 1 MiB body and 10 bytes of it, and stalling; a
connection the server closes is opened again half a second later, as an attacker would. `serve`: `POST /health` and
`OPTIONS /v1/completions` (routes that need no key); `demo`: `GET /` (and the login form). Meanwhile, twice a
second, a keyed `POST /v1/completions` (1 token) and, for the demo, a login (`POST /login`) are timed; it prints
their statuses and latencies, and what the flood's connections were answered.

A script, not a test. Run it on a quiet machine (the figures: docs/serving.md, "Limits and timeouts").
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
KEY = "flood-test-key"
BODY = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(target: str, checkout: Path, port: int, log) -> subprocess.Popen:
    common = ["--port", str(port), "--api-key", KEY, "--backend", "onnx-int8", "--threads", "1"]
    command = ["-m", "gpt_serve", "serve", *common] if target == "serve" else ["-m", "demo", *common]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    return subprocess.Popen([sys.executable, *command], cwd=checkout, stdout=log, stderr=subprocess.STDOUT, env=env)


def wait_ready(url: str, server: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server did not start (exit status {server.poll()})")


async def attacker(port: int, heads: list[bytes], answers: collections.Counter, stop: asyncio.Event, i: int):
    """One keyless connection after another: the headers of a 1 MiB body, 10 bytes of it, then nothing."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            answers["refused"] += 1
            await asyncio.sleep(0.5)
            continue
        try:
            writer.write(heads[i % len(heads)] + b"0123456789")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), timeout=120)
            answers[line.split()[1].decode() if line else "closed"] += 1
            while await reader.read(65536):  # until the server closes it
                pass
        except (OSError, asyncio.TimeoutError):
            answers["reset"] += 1
        finally:
            writer.close()
        await asyncio.sleep(0.5)


async def timed(client: httpx.AsyncClient, method: str, path: str, **kwargs) -> tuple[str, float]:
    start = time.perf_counter()
    try:
        answer = await client.request(method, path, **kwargs)
        status = str(answer.status_code)
    except httpx.HTTPError as e:
        status = type(e).__name__
    return status, time.perf_counter() - start


async def flood(target: str, port: int, sockets: int, seconds: float) -> dict:
    if target == "serve":
        heads = [f"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY}\r\n\r\n".encode(),
                 f"OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY}\r\n\r\n".encode()]  # fmt: skip
    else:
        heads = [f"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY}\r\n\r\n".encode()]
    answers, stop = collections.Counter(), asyncio.Event()
    tasks = [asyncio.create_task(attacker(port, heads, answers, stop, i)) for i in range(sockets)]
    await asyncio.sleep(2)  # the flood in place
    probes = {"keyed completion": [], "login": []} if target == "demo" else {"keyed completion": []}
    body = {"model": "shakespeare", "prompt": "A", "max_tokens": 1}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            keyed = {"authorization": f"Bearer {KEY}"}
            probes["keyed completion"].append(await timed(client, "POST", "/v1/completions", json=body, headers=keyed))
            if target == "demo":
                login = {"username": "anyone", "password": KEY}
                probes["login"].append(await timed(client, "POST", "/login", data=login))
            await asyncio.sleep(0.5)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"probes": probes, "flood answers": dict(answers)}


def report(target: str, checkout: Path, result: dict) -> None:
    print(f"{target} ({checkout}):")
    for name, samples in result["probes"].items():
        seconds = [s for _, s in samples]
        statuses = dict(collections.Counter(status for status, _ in samples))
        print(f"  {name}: {len(samples)} requests, statuses {statuses}, latency median {statistics.median(seconds):.3f}"
              f" s, max {max(seconds):.3f} s")  # fmt: skip
    print(f"  the flood's connections were answered: {result['flood answers']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=["serve", "demo", "both"], default="both")
    p.add_argument("--sockets", type=int, default=300)
    p.add_argument("--seconds", type=float, default=10.0, help="how long keyed requests are timed during the flood")
    p.add_argument("--checkout", type=Path, default=ROOT, help="the repository whose code is served")
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()}")
    for target in ("serve", "demo") if args.target == "both" else (args.target,):
        port = free_port()
        with tempfile.TemporaryFile() as log:
            server = start(target, args.checkout.resolve(), port, log)
            try:
                wait_ready(f"http://127.0.0.1:{port}", server)
                result = asyncio.run(flood(target, port, args.sockets, args.seconds))
            finally:
                server.terminate()
                server.wait(timeout=60)
        report(target, args.checkout.resolve(), result)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
