"""What the API's hardening tests share: a server of the test models with short header and body timeouts, and
how its refusals are read."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from gpt_serve.serving.launcher import close_slow_headers
from gpt_serve.serving.registry import ModelRegistry
from gpt_serve.serving.server_limits import ServerLimits
from tests.helpers import serving
from tests.serving.test_api import free_port

TIMEOUT = 1.0  # the test servers' header and body timeouts, seconds


def running(registry, limits: ServerLimits):
    """`create_app(registry)` served by uvicorn on 127.0.0.1 in a thread, with the header watchdog; yields its URL."""
    from gpt_serve.serving.api import create_app

    return serving(
        create_app(registry, limits=limits), lambda server: close_slow_headers(server, limits.header_timeout)
    )


@pytest.fixture(scope="module")
def registry(models_root):
    registry = ModelRegistry.discover(models_root=models_root, expected=(), threads=1)
    yield registry
    registry.close()


@pytest.fixture(scope="module")
def url(registry):
    """The default body limit (1 MiB), and short header and body timeouts."""
    with running(registry, ServerLimits(header_timeout=TIMEOUT, body_timeout=TIMEOUT)) as url:
        yield url


def post(url: str, path: str, body: bytes, **headers) -> httpx.Response:
    return httpx.post(url + path, content=body, headers={"content-type": "application/json", **headers}, timeout=60)


def assert_openai_error(response: httpx.Response, status: int, message: str) -> None:
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and message in error["message"], error


def start_server(models_root, log, *flags: str) -> tuple[subprocess.Popen, str]:
    """`gpt-serve serve` of the test models (torch, one thread) in a child process on a free port of 127.0.0.1, its
    output in `log`; (the process, its URL)."""
    port = free_port()
    command = [sys.executable, "-m", "gpt_serve", "serve", "--models-root", str(models_root), "--port", str(port)]
    command += ["--backend", "torch", "--threads", "1", *flags]
    with open(log, "wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    return server, f"http://127.0.0.1:{port}"


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def rss_mb(pid: int = os.getpid()) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
