"""What every HTTP server of gpt-serve bounds, so that no request can hold a server's memory or a connection for
long (`gpt-serve serve`, Ray Serve replicas and the demo all use it; needs the `serve` extra):

- the request body: at most `max_body_bytes` (a Content-Length over it is refused unread, a body without one is cut
  off as it passes the limit: 413) and whole within `body_timeout` seconds of the request's headers (408), read
  before the app sees it (`BodyLimits`, an ASGI middleware);
- the JSON's nesting: at most `MAX_JSON_DEPTH` levels, checked by a scan of the bytes before `json.loads`
  (`parse_json`: 400), so no parser or `repr` recurses past Python's limit;
- the request's headers: whole within `header_timeout` seconds of connecting, or of the previous answer on a kept-alive
  connection, or the connection is closed (`close_slow_headers`; uvicorn's own keep-alive timeout stops at a
  request's first byte);
- shutdown: open requests get `shutdown_timeout` seconds to end, then each is cut (its stream ends with
  `finish_reason: "abort"` and `data: [DONE]`), and a client that reads nothing more is dropped `SHUTDOWN_GRACE`
  seconds later (`Drain`, `run_server`).

Refusals are OpenAI's error JSON on every path, and close the connection (a client may still be sending).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
import time
from typing import Any

import anyio

from .api_protocol import APIError, error_body
from .server_limits import BODY_TIMEOUT, MAX_BODY_BYTES, ServerLimits  # the bounds' numbers (standard library only)

MAX_JSON_DEPTH = 64  # the deepest body the API reads is 3 levels (a list of token-id prompts, chat messages)
SHUTDOWN_GRACE = 2.0  # after the cut, for the streams' last chunks to leave


async def _refuse(send, status: int, message: str) -> None:
    body = json.dumps(error_body(APIError(status, message))).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers.append((b"connection", b"close"))  # the rest of the body is not read
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimits:
    """ASGI middleware: reads each request's body, at most `max_bytes` of it within `timeout` seconds, before the
    app runs; the app then reads it from memory. 413 or 408 in OpenAI's error format otherwise."""

    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES, timeout: float = BODY_TIMEOUT):
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    def _too_large(self, size: str) -> str:
        return f"the request body ({size} bytes) is over this server's limit of {self.max_bytes:,} bytes"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await _refuse(send, 413, self._too_large(f"{int(length):,}"))
        chunks, size = [], 0
        try:
            with anyio.fail_after(self.timeout):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":  # the client left: nobody to answer
                        return
                    chunks.append(message.get("body", b""))
                    size += len(chunks[-1])
                    if size > self.max_bytes:  # a body without Content-Length (chunked) past the limit
                        return await _refuse(send, 413, self._too_large(f"{size:,} or more"))
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            return await _refuse(send, 408, f"the request body did not arrive within {self.timeout:g} s")
        body, replayed = b"".join(chunks), False
        del chunks

        async def replay():
            nonlocal body, replayed
            if replayed:
                return await receive()  # after the body: the client's disconnect
            message, replayed, body = {"type": "http.request", "body": body, "more_body": False}, True, b""
            return message

        await self.app(scope, replay, send)


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def json_depth(body: bytes) -> int:
    """How deeply the arrays and objects of the JSON text `body` nest (its strings skipped), without parsing it."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def parse_json(body: bytes) -> Any:
    """The JSON value of a request body; APIError 400 for a body that is not JSON or nests past `MAX_JSON_DEPTH`."""
    if json_depth(body) > MAX_JSON_DEPTH:
        raise APIError(400, f"the request body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(body)
    except ValueError as e:  # UnicodeDecodeError too; a number of over 4,300 digits
        raise APIError(400, f"the request body is not valid JSON ({str(e)[:200]})") from None


class Drain:
    """The API's open requests (their `TextStream`s), for a shutdown: `begin()` refuses new ones (503), `cut()` ends
    the open ones now (`finish_reason` "abort"; a stream then sends its last chunk and `data: [DONE]`)."""

    def __init__(self):
        self.open: set = set()
        self.closing = False

    def cut(self) -> None:
        self.closing = True
        for text in list(self.open):
            text.cancel(reason="abort")

    def close(self, timeout: float, grace: float = SHUTDOWN_GRACE) -> None:
        """Blocks (outside the server's event loop) until the open requests have ended, at most `timeout` seconds,
        then cuts the rest and gives their last chunks `grace` seconds to leave."""
        self.closing = True
        for wait, then in ((timeout, self.cut), (grace, None)):
            deadline = time.monotonic() + wait
            while self.open and time.monotonic() < deadline:
                time.sleep(0.02)
            if then is not None:
                then()


def close_slow_headers(server, seconds: float) -> threading.Thread:
    """Closes every connection of the uvicorn `server` whose next request's headers have not all come `seconds`
    after it connected (or after its previous answer): a thread that looks four times per `seconds`. A request being
    answered (a stream too) is never touched."""

    def watch():
        waiting_since: dict[tuple, float] = {}
        while not server.should_exit:
            now, seen = time.monotonic(), {}
            for conn in list(server.server_state.connections):
                cycle = getattr(conn, "cycle", False)  # False: not an HTTP connection (a websocket)
                if cycle is False or (cycle is not None and not cycle.response_complete):
                    continue
                since = seen[conn, cycle] = waiting_since.get((conn, cycle), now)
                if now - since >= seconds and not conn.transport.is_closing():
                    conn.loop.call_soon_threadsafe(conn.transport.close)
            waiting_since = seen
            time.sleep(seconds / 4)

    thread = threading.Thread(target=watch, name="close-slow-headers", daemon=True)
    thread.start()
    return thread


def run_server(app, host: str, port: int, log_level: str, limits: ServerLimits, drain: Drain) -> None:
    """Serves `app` (`gpt_serve.api.create_app`) with uvicorn until SIGINT or SIGTERM, with the header timeout and
    the shutdown deadline of `limits`."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            drain.closing = True
            asyncio.get_running_loop().call_later(limits.shutdown_timeout, drain.cut)
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level,
        timeout_graceful_shutdown=limits.shutdown_timeout + SHUTDOWN_GRACE,  # type: ignore[arg-type]
    )  # fmt: skip
    server = Server(config)
    close_slow_headers(server, limits.header_timeout)
    server.run()
