"""Bounded server state: every event of the page is reachable over HTTP (Gradio serves private ones too), so what
each keeps per client is bounded in size and count, and malformed calls get a message."""

from __future__ import annotations

import json
import urllib.request

import pytest

from demo.progress import StopRequests
from tests.demo.conftest import wait_idle

HUGE = "x" * 1_000_000
LARGE = "x" * 20_000  # eleven of them stay under the request-body limit; each is over every field's own limit


def test_stop_requests_keep_a_bounded_number_of_short_tickets():
    stops = StopRequests(max_tickets=100)
    stops.stop(HUGE, "", None, 12, "bad ticket!")  # not tickets: ignored
    assert len(stops) == 0
    for i in range(1000):
        stops.supersede((f"session{i}", "generate"), f"t{i}")
        stops.stop(f"s{i}")
    assert len(stops) <= 200
    assert stops.is_stopped("s999") and not stops.is_stopped("s0")  # the oldest went first
    stops.supersede((HUGE, "generate"), "t1")  # a session hash of a megabyte is not kept either
    assert len(stops) <= 200


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read().decode()[:300]}


def oversized(block) -> object:
    """A value of the right kind but far too big for an input of the page."""
    return 10**18 if type(block).__name__ in ("Slider", "Number", "Radio") else LARGE


def call_every_event(server, session: str) -> list:
    """Calls every event of the page (the public API and the private handlers) once with oversized values."""
    answers = []
    for index, fn in server.demo.fns.items():
        if fn.fn is None:  # the page's own JavaScript steps (new tickets)
            continue
        data = [oversized(block) for block in fn.inputs if not block.stateful]
        body = {"fn_index": index, "data": data, "session_hash": session, "event_data": None}
        answers.append(post(server.url + "/gradio_api/run/predict", body))
    return answers


@pytest.mark.slow
def test_memory_stays_flat_under_repeated_oversized_calls_of_every_handler(server):
    """Each call comes from a new session (Gradio keeps ~1 MB per session: a copy of the page's config), so the
    warm-up fills the server's session capacity first; from then on nothing may grow."""
    kept = len(server.demo.handlers.stops)  # what the module's other tests left (they may run first)
    for i in range(8):  # 8 x ~11 events: more sessions than the capacity (64), and every cache warmed
        call_every_event(server, f"warm{i}")
    wait_idle(server.activity, timeout=30)
    before = rss_bytes()
    for i in range(30):
        answers = call_every_event(server, f"s{i}")
    wait_idle(server.activity, timeout=30)
    growth = rss_bytes() - before
    print(f"RSS growth over 30 rounds: {growth / 2**20:.1f} MB")
    assert growth < 30 * 2**20, f"RSS grew by {growth / 2**20:.1f} MB over 30 rounds of oversized calls"
    assert len(server.demo.handlers.stops) - kept < 100
    unexplained = [answer for answer in answers if "data" not in answer and '"error":null' in answer.get("body", "")]
    assert not unexplained  # every refusal says why


def test_stop_tickets_of_the_largest_accepted_size_stay_bounded(server):
    """Valid tickets (64 characters, the most accepted) from fresh sessions: remembered up to the bound only."""
    import secrets

    stops = server.demo.handlers.stops
    stop_index = next(i for i, fn in server.demo.fns.items() if fn.name == "ui_stop")
    before = rss_bytes()
    for _ in range(300):
        tickets = [secrets.token_hex(32), secrets.token_hex(32)]
        answer = post(server.url + "/gradio_api/run/predict", {"fn_index": stop_index, "data": tickets})
        assert "data" in answer, answer
    assert len(stops) <= 2 * stops.max_tickets
    assert rss_bytes() - before < 30 * 2**20


def test_a_request_body_over_the_limit_is_refused_unread(server):
    """The Content-Length alone decides: the server answers 413 before reading the body (a client still sending
    one would see its pipe closed, so this one claims a size it does not send)."""
    import http.client
    from urllib.parse import urlsplit

    for path in ("/gradio_api/run/predict", "/v1/completions"):  # the Gradio events and the API mounted beside
        url = urlsplit(server.url)
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        connection.putrequest("POST", path)
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(10**7))
        connection.endheaders(b"{}")
        response = connection.getresponse()
        assert response.status == 413, path
        error = json.loads(response.read())["error"]  # OpenAI's error JSON, on every path
        assert "over this server's limit of 1,048,576 bytes" in error["message"]
        assert error["code"] == "request_too_large"
        connection.close()


def test_a_chunked_body_is_cut_off_at_the_limit():
    """A body sent without Content-Length is counted as it arrives, and refused (413) when it runs past the limit."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from starlette.middleware import Middleware

    from gpt_serve.serving.http_guards import BodyLimits

    app = FastAPI(middleware=[Middleware(BodyLimits, max_bytes=1000)])

    @app.post("/echo")
    def echo(body: dict) -> dict:
        return body

    client = TestClient(app)
    chunks = (b"x" * 500 for _ in range(10))
    assert client.post("/echo", content=chunks, headers={"content-type": "application/json"}).status_code == 413
    assert client.post("/echo", json={"a": 1}).json() == {"a": 1}


def test_too_few_values_and_file_shaped_values_get_a_message(server):
    fn_index = next(i for i, fn in server.demo.fns.items() if fn.api_name == "generate")
    answer = post(server.url + "/gradio_api/run/predict", {"fn_index": fn_index, "data": ["ROMEO:"]})
    assert "generate takes 11 values (prompt, max_new_tokens," in json.dumps(answer), answer
    for count in (12, 100):  # extra values are not ignored either
        answer = post(server.url + "/gradio_api/run/predict", {"fn_index": fn_index, "data": ["ROMEO:"] * count})
        assert "generate takes 11 values (prompt, max_new_tokens," in json.dumps(answer), answer
        assert f"got {count}" in json.dumps(answer), answer
    file_like = {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}
    answer = post(server.url + "/gradio_api/run/predict", {"fn_index": fn_index, "data": [file_like] + [None] * 10})
    assert "prompt takes text or a number, got a dict (files are not accepted)" in json.dumps(answer), answer


def test_json_nested_5000_deep_is_a_400_on_every_path(server):
    deep = ("[" * 5000 + "]" * 5000).encode()
    for path in ("/gradio_api/run/predict", "/gradio_api/queue/join", "/v1/completions"):
        request = urllib.request.Request(server.url + path, deep, {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(request, timeout=30)
        assert 400 <= error.value.code < 500, (path, error.value.code)
    assert "deeper than 64 levels" in json.loads(error.value.read())["error"]["message"]  # the API's, named


def test_uploads_are_refused_past_a_few_kilobytes(server):
    boundary = "gpt-serve-test"
    payload = b"x" * 100_000
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="big.txt"\r\n'
            f"Content-Type: text/plain\r\n\r\n"
        ).encode()
        + payload
        + f"\r\n--{boundary}--\r\n".encode()
    )
    request = urllib.request.Request(
        server.url + "/gradio_api/upload", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, timeout=30)
    assert error.value.code == 413
