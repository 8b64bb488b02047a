"""Small helpers several test modules (and the browser benchmarks) share."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

# Debian's Chromium, launched headless and offline, with no first-run work (the browser tests and the benchmarks)
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextlib.contextmanager
def serving(app, prepare=None):
    """Serves the ASGI `app` with uvicorn on a thread, on a free port of 127.0.0.1, for as long as the block runs;
    yields its URL. `prepare(server)`, if given, is called on the `uvicorn.Server` before it starts."""
    import socket
    import threading

    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    if prepare is not None:
        prepare(server)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert wait_until(lambda: server.started, timeout=30)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def python_with_only(package: str, venv: Path) -> Path:
    """The interpreter of a new venv at `venv` (no pip, no system site-packages) that can import `package`, from this
    environment's installed copy, and nothing else installed: a user's machine with only that package. Offline and
    fast (a `.pth` file points at a folder that links to the one package)."""
    import importlib.util
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    only = venv / "only"
    only.mkdir()
    (only / package).symlink_to(Path(importlib.util.find_spec(package).origin).parent)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / f"only-{package}.pth").write_text(f"{only}\n", encoding="utf-8")
    return venv / "bin" / "python"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Polls `condition()` until it is true or `timeout` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


def genai_greedy(og, model, ids: list[int], max_length: int) -> list[int]:
    """onnxruntime-genai's own greedy loop from prompt `ids` up to `max_length` tokens in all (prompt included)."""
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=max_length)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    out = []
    while not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out
