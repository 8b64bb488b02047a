"""The API's edge against a client without the key and against bytes that are not what JSON should be: keyless
requests bounded apart from keyed ones, every body encoding a 4xx, the gate's 401 readable by an allowed page, no
server path in an error, and a body let go of once parsed (`gpt_serve.serving.http_guards`, `api.errors`)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import tracemalloc

import httpx
import pytest

from gpt_serve.serving.http_guards import MAX_JSON_DEPTH
from gpt_serve.serving.server_limits import MAX_BODY_BYTES, ServerLimits
from tests.helpers import serving, wait_until
from tests.serving.conftest import assert_openai_error, post

KEY = "s3cret"
ORIGIN = "https://page.example"
ROUTES = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")


@pytest.fixture(scope="module")
def keyed(registry):
    """A server with an API key, an allowed origin, room for 2 request bodies being received at once, and a 1 s body
    timeout."""
    from gpt_serve.serving.api import create_app

    limits = ServerLimits(max_bodies=2, body_timeout=1.0)
    with serving(create_app(registry, limits=limits, api_key=KEY, allow_origins=[ORIGIN])) as url:
        yield url


def stalled(url: str, head: str, sent: bytes = b"0123456789") -> socket.socket:
    """A client that sends `head` (a request line and headers) and `sent` of its body, then waits."""
    host, port = url.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)), timeout=10)
    client.sendall(head.encode() + b"\r\n" + sent)
    return client


def status_of(client: socket.socket) -> str:
    """The status the server answered `client` with ("closed" if it closed without one)."""
    line = client.makefile("rb").readline()
    return line.split()[1].decode() if line else "closed"


KEYED_SMALL = b'{"model": "tiny", "prompt": "A", "max_tokens": 1}'


def test_keyless_bodies_are_refused_from_their_headers_and_take_no_keyed_slot(keyed):
    """The issue's flood: `POST /health` and `OPTIONS /v1/completions` without the key, each with `Content-Length:
    1048576` and 10 bytes, then stalled, made every keyed request a 429 "receiving 256 request bodies already" for
    ~31 s. A route that needs no key takes no body: each is a 413 from its headers alone, and the keyed request sent
    while they are still open is served."""
    heads = [f"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY_BYTES}\r\n"] * 3
    heads += [f"OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY_BYTES}\r\n"] * 3
    heads += ["POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"] * 2  # a body of no length
    clients = [stalled(keyed, head) for head in heads]
    try:
        answer = post(keyed, "/v1/completions", KEYED_SMALL, authorization=f"Bearer {KEY}")
        assert answer.status_code == 200, answer.text
        assert [status_of(client) for client in clients] == ["413"] * len(clients)
    finally:
        for client in clients:
            client.close()
    refused = httpx.post(f"{keyed}/health", content=b"0123456789")
    assert_openai_error(refused, 413, "a request without the API key may send no body to /health")
    assert refused.headers["connection"] == "close"
    assert httpx.get(f"{keyed}/health").status_code == 200  # no body: served as before


def test_a_keyed_body_still_counts_and_a_keyless_one_is_never_read(keyed):
    """The keyed requests' budget is theirs: two stalled keyed bodies fill it (429), keyless ones are refused before
    it is looked at (401 for a route that needs the key, 413 for an open one)."""
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: 100\r\n"
    holders = [stalled(keyed, head), stalled(keyed, head)]
    try:
        key = {"authorization": f"Bearer {KEY}"}
        assert wait_until(lambda: post(keyed, "/v1/completions", KEYED_SMALL, **key).status_code == 429)
        assert_openai_error(post(keyed, "/v1/completions", KEYED_SMALL), 401, "a valid API key is needed")
        assert_openai_error(post(keyed, "/health", b"{}"), 413, "may send no body")
        assert [status_of(client) for client in holders] == ["408", "408"]  # cut by the 1 s body timeout
    finally:
        for client in holders:
            client.close()
    assert wait_until(lambda: post(keyed, "/v1/completions", KEYED_SMALL, **key).status_code == 200)


def test_the_gates_401_can_be_read_by_an_allowed_page(keyed):
    """A page of an allowed origin that sends no key (or a wrong one) can read why: the gate's 401 carries the CORS
    headers, as the routes' answers do; another origin gets none."""
    allowed = post(keyed, "/v1/completions", KEYED_SMALL, origin=ORIGIN, authorization="Bearer nope")
    assert_openai_error(allowed, 401, "a valid API key is needed")
    assert allowed.headers["access-control-allow-origin"] == ORIGIN and allowed.headers["vary"] == "Origin"
    other = post(keyed, "/v1/completions", KEYED_SMALL, origin="https://other.example")
    assert other.status_code == 401 and "access-control-allow-origin" not in other.headers
    assert httpx.get(f"{keyed}/v1/models", headers={"origin": ORIGIN}).headers["access-control-allow-origin"] == ORIGIN


def body_of(route: str, **fields) -> dict:
    base = {"/tokenize": {"prompt": "A"}, "/detokenize": {"tokens": [1]}}.get(route, {"max_tokens": 1})
    if route == "/v1/completions":
        base = {**base, "prompt": "A"}
    if route == "/v1/chat/completions":
        base = {**base, "messages": [{"role": "user", "content": "A"}]}
    return {"model": "tiny", **base, **fields}


@pytest.mark.parametrize("route", ROUTES)
def test_a_lone_surrogate_anywhere_is_a_400(url, route):
    """The issue's `{"\\ud800": 1}` made the 400's `param` a string no answer could encode: a 500 with a traceback.
    A lone surrogate escape, as a field name or inside a value, is a 400 of its own; a surrogate pair is a
    character like any other."""
    for body in ('{"\\ud800": 1}', json.dumps(body_of(route))[:-1] + ', "x": ["\\udfff"]}', '"\\uD83D"'):
        answer = post(url, route, body.encode())
        assert_openai_error(answer, 400, "lone surrogate escape")
        assert answer.json()["error"]["param"] is None
    paired = post(url, "/tokenize", b'{"model": "tiny", "prompt": "A\\ud83d\\ude00", "unk_policy": "replace"}')
    assert paired.status_code == 200 and paired.json()["count"] == 2


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be", "utf-16"])
@pytest.mark.parametrize("route", ROUTES)
def test_a_body_that_is_not_utf8_is_a_400_naming_its_encoding(url, route, encoding):
    """The issue's UTF-16/32 body with an escaped quote and a 3,000-deep array: the byte scan of the depth lost
    track of its strings, then `json.loads` raised RecursionError (500). JSON between systems is UTF-8 (RFC 8259):
    any other encoding is refused by name before any scan or parse."""
    text = '{"model": "tiny", "prompt": "a\\"b", "x": ' + "[" * 3000 + "]" * 3000 + ', "y": "z"}'
    answer = post(url, route, text.encode(encoding))
    assert_openai_error(answer, 400, "not UTF-8: send JSON as UTF-8 (RFC 8259)")
    assert encoding.removesuffix("-le").upper() in answer.json()["error"]["message"]
    assert_openai_error(post(url, route, text.encode()), 400, f"deeper than {MAX_JSON_DEPTH} levels")  # UTF-8


@pytest.mark.parametrize("route", ROUTES)
def test_bytes_that_are_no_encoding_are_a_400(url, route):
    for body in (b'{"model": "tiny", "prompt": "\xff"}', b'{"prompt": "\xed\xa0\x80"}', b"\xef\xbb\xbf\xff"):
        assert_openai_error(post(url, route, body), 400, "the request body is not valid UTF-8")
    with_bom = b"\xef\xbb\xbf" + json.dumps(body_of(route)).encode()  # UTF-8's BOM: read past, as json.loads does
    assert post(url, route, with_bom).status_code == 200


def test_a_503_names_no_path_of_the_server(url, models_root, caplog):
    """A model the server cannot serve is a 503 that says why, with the server's paths cut to their last part; the
    log has them whole."""
    caplog.set_level(logging.WARNING, logger="gpt_serve.serving.api.errors")
    for route in ("/tokenize", "/v1/completions"):
        answer = post(url, route, json.dumps(body_of(route, model="ladder-a", backend="onnx")).encode())
        assert_openai_error(answer, 503, "is missing; export it with `python -m export .../ladder-a`")
        message = answer.json()["error"]["message"]
        assert str(models_root) not in message and ".../model.onnx is missing" in message, message
    assert str(models_root / "ladder-a") in caplog.text


@pytest.mark.slow
def test_a_body_is_let_go_of_once_parsed(url):
    """Bodies held while their requests run: 270 keyed 1 MB bodies waiting added 260 MB of RSS (Starlette keeps a
    request's body for its life). Eight streams of 900 kB bodies, all open at once, now hold less than two of
    them (Python's allocations, traced)."""
    padding = " " * 900_000
    fields = json.dumps({"model": "tiny", "prompt": "A", "max_tokens": 100_000, "stream": True})
    body = (fields[:-1] + padding + "}").encode()  # made before the tracing starts: the clients' copy is not counted
    opened, done = threading.Barrier(9), threading.Event()

    def stream() -> None:
        with httpx.stream("POST", f"{url}/v1/completions", content=body, timeout=60) as answer:
            next(answer.iter_lines())
            opened.wait(timeout=60)
            done.wait(timeout=60)

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        clients = [threading.Thread(target=stream) for _ in range(8)]
        for client in clients:
            client.start()
        opened.wait(timeout=60)  # each stream's first chunk came: its body was parsed before it
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        done.set()
        tracemalloc.stop()
    for client in clients:
        client.join(timeout=60)
    assert held < 2 * len(padding), f"{held:,} bytes traced while 8 streams of 900 kB bodies are open"
