"""The demo with an API key against a visitor without it (`demo/access.py`): keyless connections bounded apart from
the logged-in and keyed ones, nothing of the API described before the login, the in-browser page's model behind
it."""

from __future__ import annotations

import socket
from contextlib import contextmanager
from urllib.parse import urlsplit

import httpx
import pytest

from gpt_serve.serving.http_guards import KEYLESS_BODY_BYTES
from gpt_serve.serving.server_limits import ServerLimits

KEY = "s3cret"
ORIGIN = "https://page.example"


@pytest.fixture(scope="module")
def demo(registry):
    """The demo with a key, room for 2 request bodies being received at once and a 1 s body timeout: its URL."""
    from demo.app import build_demo
    from tests.demo.conftest import serve

    limits = ServerLimits(max_bodies=2, body_timeout=1.0)
    blocks = build_demo(registry, default_model="tiny")
    with serve(blocks, registry, api_key=KEY, limits=limits, origins=(ORIGIN,)) as url:
        yield url.rstrip("/")


def stalled(url: str, head: str, sent: bytes = b"0123456789") -> socket.socket:
    split = urlsplit(url)
    client = socket.create_connection((split.hostname, split.port), timeout=10)
    client.sendall(head.encode() + b"\r\n" + sent)
    return client


def status_of(client: socket.socket) -> str:
    line = client.makefile("rb").readline()
    return line.split()[1].decode() if line else "closed"


@contextmanager
def logged_in(url: str):
    """A client of the demo logged in as a page is (any name, the key as password), with the session's cookie."""
    with httpx.Client(base_url=url, timeout=30) as client:
        answer = client.post("/login", data={"username": "anyone", "password": KEY})
        assert answer.status_code == 200 and client.cookies, answer.text
        yield client


def test_slow_keyless_bodies_block_neither_a_login_nor_a_keyed_request(demo):
    """The issue's demo: 300 slow GET bodies took every body slot, and a login got no cookie meanwhile. A GET takes
    no body without the key (413 from its headers); the login form's tiny body is read apart from the keyed
    requests' budget, so stalled ones (more than that budget's 2) leave a login and a keyed request served, and are
    cut by the body timeout (408)."""
    gets = [stalled(demo, "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n") for _ in range(3)]
    logins = [stalled(demo, "POST /login HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n") for _ in range(4)]
    try:
        assert [status_of(client) for client in gets] == ["413"] * 3
        with logged_in(demo) as page:
            assert page.get("/").status_code == 200
        body = {"model": "tiny", "prompt": "A", "max_tokens": 1}
        keyed = httpx.post(f"{demo}/v1/completions", json=body, headers={"authorization": f"Bearer {KEY}"})
        assert keyed.status_code == 200, keyed.text
        assert [status_of(client) for client in logins] == ["408"] * 4
    finally:
        for client in (*gets, *logins):
            client.close()
    large = httpx.post(f"{demo}/login", content=b"x" * (KEYLESS_BODY_BYTES + 1))
    assert large.status_code == 413 and "at most 4,096 bytes of body to /login" in large.json()["error"]["message"]


def test_the_gates_401_can_be_read_by_an_allowed_page(demo):
    answer = httpx.post(f"{demo}/v1/completions", json={"model": "tiny"}, headers={"origin": ORIGIN})
    assert answer.status_code == 401 and answer.headers["access-control-allow-origin"] == ORIGIN


def test_a_visitor_without_login_is_described_no_api(demo):
    """Gradio's login page embedded the app's API description (`/generate` and its parameters); a visitor without
    the login now gets an empty one, and a logged-in page the whole."""
    page = httpx.get(f"{demo}/")
    assert page.status_code == 200 and "/generate" not in page.text and "prompt" not in page.text
    assert 'window.gradio_api_info = {"named_endpoints": {}, "unnamed_endpoints": {}};' in page.text
    assert int(page.headers["content-length"]) == len(page.content)
    with logged_in(demo) as client:
        assert '"/generate"' in client.get("/").text


def test_the_browser_pages_model_is_behind_the_login(demo):
    """/browser/ served the model's weights and vocabulary without the key; with a key it needs the login's cookie
    or the key itself."""
    for path in ("/browser/", "/browser/model/config.json", "/browser/model/onnx/model_quantized.onnx"):
        answer = httpx.get(demo + path)
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key", path
    with logged_in(demo) as client:
        assert client.get("/browser/model/config.json").json()["model_type"] == "chargpt"
    bearer = httpx.get(f"{demo}/browser/model/vocab.json", headers={"authorization": f"Bearer {KEY}"})
    assert bearer.status_code == 200
