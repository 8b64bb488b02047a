"""No request, of any size or shape, gets a 500 or holds the server's memory or a connection: the body limits, the
JSON depth, numbers and unhashable values, refusals that keep nothing alive, a disconnect that frees its row, the
header and body timeouts, the shutdown deadline (`gpt_serve.api_limits`), and the port check."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from gpt_serve.api_limits import MAX_BODY_BYTES, MAX_JSON_DEPTH, ServerLimits, close_slow_headers, json_depth
from gpt_serve.cli import main
from gpt_serve.generation.registry import ModelRegistry
from tests.core.test_api import free_port
from tests.helpers import serving, wait_until

TIMEOUT = 1.0  # the test servers' header and body timeouts, seconds


def running(registry, limits: ServerLimits):
    """`create_app(registry)` served by uvicorn on 127.0.0.1 in a thread, with the header watchdog; yields its URL."""
    from gpt_serve.api import create_app

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


def test_a_content_length_over_the_limit_is_refused_unread(url):
    """The server answers from the headers alone: this client claims 100 MB and sends none of it."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.putrequest("POST", "/v1/completions")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(100 * 2**20))
    connection.endheaders()
    response = connection.getresponse()
    body = json.loads(response.read())
    assert response.status == 413 and response.getheader("connection") == "close"
    assert body["error"]["code"] == "request_too_large"
    assert "(104,857,600 bytes) is over this server's limit of 1,048,576 bytes" in body["error"]["message"]
    connection.close()


def test_a_chunked_body_is_cut_off_at_the_limit(url):
    chunks = (b" " * 65536 for _ in range(100 * 16))  # 100 MB without a Content-Length, never all sent
    response = httpx.post(f"{url}/v1/completions", content=chunks, headers={"content-type": "application/json"})
    assert_openai_error(response, 413, "or more bytes) is over this server's limit of 1,048,576 bytes")


def test_the_limit_fits_the_largest_request_the_specification_allows(url):
    """16 prompts of 10,000 characters, each written as a \\uXXXX escape: under 1 MiB."""
    body = json.dumps({"model": "tiny", "prompt": ["\u0100" * 10_000] * 16, "max_tokens": 1}).replace(
        "\\u0100", "\\u0061"
    )
    assert len(body) < MAX_BODY_BYTES
    answer = post(url, "/v1/completions", body.encode())
    assert answer.status_code == 200 and len(answer.json()["choices"]) == 16


def test_json_nested_5000_deep_is_a_400(url):
    for body in ("[" * 5000 + "]" * 5000, '{"model": "tiny", "prompt": ' + "[" * 5000 + "]" * 5000 + "}"):
        for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
            assert_openai_error(post(url, path, body.encode()), 400, f"deeper than {MAX_JSON_DEPTH} levels")
    # brackets inside strings do not count
    brackets = {"model": "tiny", "prompt": "[{" * 3000, "unk_policy": "replace"}  # (outside the vocabulary)
    answer = post(url, "/tokenize", json.dumps(brackets).encode())
    assert answer.status_code == 200 and answer.json()["count"] == 6000


def test_json_depth_scans_past_strings_and_escapes():
    assert json_depth(b'{"a": [1, {"b": "]]]\\"[[["}]}') == 3
    assert json_depth(b'"[[["') == 0 and json_depth(b"3") == 0
    assert json_depth(b"[" * 5000) == 5000


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_tokens": 10**400}, "max_new_tokens must be an integer in [1, 100000], got 1000000000000"),
        ({"seed": -(10**400)}, "seed must be an integer in [0, 9007199254740991]"),
        ({"top_k": 10**400}, "top_k must be an integer in [0, 1000000]"),
        ({"temperature": 10**400}, "temperature must be a number in [0, 2]"),
        ({"backend": ["torch"]}, "backend must be one of 'torch' (PyTorch)"),
        ({"backend": {"a": 1}}, "backend must be one of 'torch' (PyTorch)"),
        ({"n": 10**400}, "n must be an integer in [1, 16]"),
    ],
)
def test_huge_numbers_and_unhashable_values_are_a_400(url, fields, message):
    for path in ("/v1/completions", "/v1/chat/completions"):
        body = {"model": "tiny", "max_tokens": 2, **fields}
        body |= {"prompt": "A"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "A"}]}
        assert_openai_error(post(url, path, json.dumps(body).encode()), 400, message)


def test_an_integer_of_5000_digits_is_not_json_python_reads(url):
    body = b'{"model": "tiny", "prompt": "A", "max_tokens": ' + b"9" * 5000 + b"}"
    assert_openai_error(post(url, "/v1/completions", body), 400, "the request body is not valid JSON")
    assert_openai_error(
        post(url, "/tokenize", b'{"model": "tiny", "prompt": "A", "backend": ["torch"]}'), 400, "backend"
    )


def rss_mb(pid: int = os.getpid()) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.mark.slow
def test_refusals_of_huge_prompts_leave_memory_where_it_was(registry):
    """20 MB prompts of "你" (outside the vocabulary), each refused (400): through a server whose body limit is raised
    past them, and at the default limit, 16 prompts of 10,000 such characters; the server's RSS (this process's:
    it runs in a thread) stays within 50 MB of where it was."""
    huge = json.dumps({"model": "tiny", "prompt": "你" * 6_700_000, "max_tokens": 2}, ensure_ascii=False).encode()
    many = json.dumps({"model": "tiny", "prompt": ["你" * 10_000] * 16, "max_tokens": 2}).encode()
    bodies = [("/v1/completions", huge), ("/tokenize", huge), ("/v1/completions", many)]
    with running(registry, ServerLimits(max_body_bytes=64 * 2**20)) as url:
        for path, body in bodies:  # warm-up: every path once
            assert post(url, path, body).status_code == 400
        before = rss_mb()
        for i in range(20):
            path, body = bodies[i % len(bodies)]
            answer = post(url, path, body)
            assert answer.status_code == 400 and len(answer.content) < 2000, answer.text[:200]
        growth = rss_mb() - before
    print(f"RSS growth over 20 refusals of 20 MB prompts: {growth:.1f} MB")
    assert growth < 50, f"RSS grew by {growth:.1f} MB"


def running_rows(url: str) -> float:
    """`gpt_serve_num_requests_running` summed over the server's models and backends."""
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    return sum(float(x.split()[-1]) for x in lines if x.startswith("gpt_serve_num_requests_running{"))


def request_bytes(body: bytes) -> bytes:
    """A POST of the JSON `body` to /v1/completions, as a raw socket sends it."""
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def test_a_non_streaming_client_that_leaves_frees_its_row_within_a_second(url):
    body = json.dumps({"model": "tiny", "prompt": "A", "max_tokens": 100_000, "window_mode": "exact"}).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as client:
        client.sendall(request_bytes(body))
        assert wait_until(lambda: running_rows(url) == 1), running_rows(url)
    left = time.monotonic()
    assert wait_until(lambda: running_rows(url) == 0, timeout=1.0), "the row was still running a second later"
    print(f"row freed {time.monotonic() - left:.3f} s after the client left")


def closed_within(client: socket.socket, seconds: float, trickle: bytes = b"") -> tuple[bool, bytes]:
    """Sends `trickle` a byte every 0.1 s until the server closes the connection or `seconds` pass; (closed, what the
    server sent)."""
    client.settimeout(0.1)
    received, deadline = b"", time.monotonic() + seconds
    for byte in [trickle[i : i + 1] for i in range(len(trickle))] or [b""] * int(seconds * 10):
        if time.monotonic() > deadline:
            break
        try:
            if byte:
                client.sendall(byte)
            chunk = client.recv(65536)
            if not chunk:
                return True, received
            received += chunk
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return True, received
    return False, received


def test_slow_headers_and_slow_bodies_get_their_connection_closed(url):
    host, port = url.removeprefix("http://").split(":")
    slow_head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"x" * 200
    with socket.create_connection((host, int(port))) as client:  # a header trickling in, never finished
        start = time.monotonic()
        closed, _ = closed_within(client, 3 * TIMEOUT, slow_head)
        assert closed and time.monotonic() - start < 2 * TIMEOUT
    with socket.create_connection((host, int(port))) as client:  # connected, and silent
        closed, _ = closed_within(client, 3 * TIMEOUT)
        assert closed
    with socket.create_connection((host, int(port))) as client:  # the whole head, then a body trickling in
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n")
        start = time.monotonic()
        closed, answer = closed_within(client, 3 * TIMEOUT, b"{" + b" " * 199)
        assert closed and time.monotonic() - start < 2 * TIMEOUT
    assert answer.startswith(b"HTTP/1.1 408 ") and b'"code": "request_timeout"' in answer, answer


def test_a_stream_outlives_the_header_timeout(url):
    """The timeouts are for what a client sends: a long answer is not cut."""
    body = {"model": "tiny", "prompt": "A", "max_tokens": 100_000, "window_mode": "exact", "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=10) as response:
        start = time.monotonic()
        for line in response.iter_lines():
            assert line != "data: [DONE]"
            if time.monotonic() - start > 3 * TIMEOUT:
                break
        else:
            pytest.fail("the stream was cut")
    assert wait_until(lambda: running_rows(url) == 0)


def test_shutdown_ends_open_streams_with_done_within_the_deadline(models_root, tmp_path):
    """`gpt-serve serve --shutdown-timeout 1`, SIGTERM while a stream (read slowly) and a non-streaming request are
    open: after the deadline both end, the stream with finish_reason "abort" and `data: [DONE]`, the other answered
    with "abort"; a client that stops reading does not hold the exit past the deadline and its grace."""
    port, log = free_port(), tmp_path / "serve.log"
    command = [sys.executable, "-m", "gpt_serve", "serve", "--models-root", str(models_root), "--port", str(port)]
    command += ["--backend", "torch", "--threads", "1", "--shutdown-timeout", "1", "--log-level", "warning"]
    with open(log, "wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    long = {"model": "tiny", "prompt": "A", "max_tokens": 100_000, "window_mode": "exact"}
    try:
        assert wait_until(lambda: "on http://" in log.read_text() or server.poll() is not None, timeout=60)
        assert wait_until(lambda: _healthy(url), timeout=30), log.read_text()
        answers = {}
        plain = threading.Thread(
            target=lambda: answers.update(plain=httpx.post(f"{url}/v1/completions", json=long, timeout=30))
        )
        plain.start()
        stuck = socket.create_connection(("127.0.0.1", port))  # asks for a stream, then never reads
        stuck.sendall(request_bytes(json.dumps({**long, "stream": True}).encode()))
        with httpx.stream("POST", f"{url}/v1/completions", json={**long, "stream": True}, timeout=30) as response:
            chunks = response.iter_bytes(4096)
            text = next(chunks).decode()
            assert wait_until(lambda: running_rows(url) == 3), running_rows(url)
            server.send_signal(signal.SIGTERM)
            stopped = time.monotonic()
            for chunk in chunks:  # a slow reader: 4 kB every 20 ms
                text += chunk.decode()
                time.sleep(0.02)
        assert text.endswith("data: [DONE]\n\n"), text[-300:]
        last = json.loads(text.rstrip().split("\n\n")[-2].removeprefix("data: "))
        assert last["choices"][0]["finish_reason"] == "abort"
        plain.join(timeout=10)
        assert answers["plain"].json()["choices"][0]["finish_reason"] == "abort"
        # uvicorn raises the signal it caught again once it has shut down: the exit a service manager expects
        assert server.wait(timeout=10) == -signal.SIGTERM, log.read_text()[-2000:]
        took = time.monotonic() - stopped
        print(f"exited {took:.2f} s after SIGTERM (deadline 1 s)")
        assert 1.0 <= took < 1 + 2 + 1.5  # the deadline, its grace, and the interpreter's exit
        assert "Traceback" not in log.read_text()
        stuck.close()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("port", ["70000", "-1", "0", "x"])
def test_a_port_outside_the_tcp_range_is_a_usage_error(capsys, port):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--port", port])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --port" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-body-bytes", "0"], "argument --max-body-bytes: must be an integer >= 1"),
        (["--shutdown-timeout", "-1"], "argument --shutdown-timeout: must be a number > 0"),
        (["--header-timeout", "nan"], "argument --header-timeout: must be a number > 0"),
    ],
)
def test_bad_limits_are_usage_errors(capsys, flags, message):
    with pytest.raises(SystemExit):
        main(["serve", *flags])
    assert message in capsys.readouterr().err


def test_timeouts_of_the_connection_are_not_ray_flags(capsys):
    assert main(["serve", "--ray", "--header-timeout", "5"]) == 2
    assert "not with --ray: --header-timeout" in capsys.readouterr().err
