"""Fixtures of the demo tests: a models folder of tiny models (one exported to ONNX), and the app served once per
session on 127.0.0.1 (a free port), shared by the API and browser tests."""

from __future__ import annotations

import os
import re
import socket
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from tests.helpers import CHROMIUM, CHROMIUM_FLAGS, wait_until  # noqa: F401 (wait_until: for the demo tests)

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home from tests

# The served app accepts long generations so that a test can stop one that is still running (the tiny model makes
# ~1000 tokens/s on a loaded 2-core machine).
SERVER_MAX_NEW_TOKENS = 20_000


def pytest_configure(config):
    # gradio's queue analytics call pandas APIs that pandas 3 deprecates: not ours to fix, and noisy
    config.addinivalue_line("filterwarnings", "ignore:.*no_silent_downcasting:DeprecationWarning")
    config.addinivalue_line("filterwarnings", "ignore:The copy keyword is deprecated:DeprecationWarning")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(blocks, registry=None, browser_model: str = "tiny", api_key: str | None = None, limits=None, origins=()):
    """Launches `blocks` on 127.0.0.1 on a free port without blocking, with the OpenAI-compatible API of `registry`
    and the in-browser page of its model `browser_model` mounted as `python -m demo` does (with `api_key`, as
    `python -m demo --api-key`; `limits`, a `ServerLimits`; `origins`, as `--allow-origin`); yields its URL; closes
    it."""
    from demo.app import launch_options
    from demo.cli import mount_at_start

    options = launch_options(limits, api_key=api_key, allow_origins=origins)
    if registry is not None:  # the browser page's files are checked by tests/demo/test_browser_page.py
        mounted = mount_at_start(
            options, registry, browser_model, "torch", SERVER_MAX_NEW_TOKENS, api_key=api_key, allow_origins=origins
        )
    _, url, _ = blocks.launch(
        server_name="127.0.0.1",
        server_port=free_port(),
        prevent_thread_lock=True,
        quiet=True,
        ssr_mode=False,
        **options,
    )
    if registry is not None:
        assert mounted["drain"] is not None  # mounted before the launch returned
    try:
        yield url
    finally:
        blocks.close()


@pytest.fixture(scope="session")
def server(registry):
    """The demo served once per session: `.url`, `.demo`, `.activity` (server-side counters)."""
    from demo.app import build_demo
    from demo.progress import Activity

    activity = Activity()
    blocks = build_demo(
        registry,
        default_model="tiny",
        max_tokens_limit=SERVER_MAX_NEW_TOKENS,
        stream_interval=0.05,
        concurrency=16,
        activity=activity,
    )
    with serve(blocks, registry) as url:
        yield SimpleNamespace(url=url.rstrip("/"), demo=blocks, activity=activity)


# a good request to the tiny model (the /generate parameters); tests change one field at a time
GOOD = dict(
    prompt="ROMEO:",
    max_new_tokens=40,
    temperature=1.0,
    top_k=None,
    top_p=1.0,
    seed=3,
    backend="torch",
    model="tiny",
    window_mode="exact",
    unk_policy="error",
)


def form(**changes) -> list:
    """The page's inputs (in `PAGE_FIELDS` order): GOOD, the Format control on free text, with `changes`."""
    from demo.handlers import PAGE_FIELDS

    values = {**GOOD, "format": "text", "format_text": "", **changes}
    return [values[name] for name in PAGE_FIELDS]


@pytest.fixture(scope="module")
def handlers(registry):
    """The app's event functions, streaming every token (no throttle), without a server."""
    from demo.app import build_demo

    demo = build_demo(
        registry, default_model="tiny", stream_interval=0.0, max_updates_per_second=None, max_tokens_limit=500
    )
    return demo.handlers


# The in-browser page's form as it starts, by specification field name: the Gradio demo's defaults (demo/form.py,
# shipped to the page as form.json).
PAGE_FORM = dict(
    prompt="ROMEO:",
    max_new_tokens="300",
    temperature="0.8",
    top_k="0",
    top_p="1",
    seed="-1",
    window_mode="refill",
    unk_policy="error",
)

# What the in-browser page's form sends for a number field's text (demo/web/form.js `typedValue`): an integer as an
# int, a decimal number as a float, an empty seed as None (random), anything else as the text typed.
FORM_NUMBER_FIELDS = {"max_new_tokens", "temperature", "top_k", "top_p", "seed"}
INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
DECIMAL_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def form_value(name: str, text: str):
    """The value the page's form sends for the text `text` typed into the field `name` (its specification name)."""
    value = text.strip()
    if name not in FORM_NUMBER_FIELDS:
        return text
    if name == "seed" and not value:
        return None
    if INTEGER_TEXT.fullmatch(value):
        return int(value)
    if DECIMAL_TEXT.fullmatch(value):
        return float(value)
    return text


def python_reads_form(fields: dict[str, str], vocab):
    """(request, prompt ids) of the page's form texts `fields` (by specification name) as the Python surfaces read
    them: `parse_request`, then `encode_prompt` with the page's words for unknown characters; their RequestError
    otherwise."""
    from demo.form import FORM
    from gpt_serve.generation.spec import parse_request
    from gpt_serve.generation.text import encode_prompt

    request = parse_request({name: form_value(name, text) for name, text in fields.items()})
    return request, encode_prompt(vocab, request.prompt, request.unk_policy, FORM["unk_policy"]["hint"])


@pytest.fixture(scope="module")
def chromium():
    """Debian's headless Chromium driven by Playwright for Python (never `playwright install`)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (never `playwright install`)")
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's Chromium with `apt-get install -y chromium`")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


def wait_idle(activity, timeout: float = 5.0) -> None:
    """Waits until no generation runs on the server (earlier tests' streams have ended)."""
    assert wait_until(lambda: activity.snapshot()["active"] == 0, timeout), activity.snapshot()
