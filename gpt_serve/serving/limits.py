"""What every HTTP server of gpt-serve bounds, so that no request can hold a server's memory or a connection for
long (`gpt-serve serve`, Ray Serve replicas and the demo all use it; needs the `serve` extra):

- who may send a body: with an API key, a request's headers must bear it before a byte of its body is read (401,
  `KeyGate`, an ASGI middleware outside `BodyLimits`);
- the request body: at most `max_body_bytes` (a Content-Length over it is refused unread, a body without one is cut
  off as it passes the limit: 413) and whole within `body_timeout` seconds of the request's headers (408), read
  before the app sees it (`BodyLimits`, an ASGI middleware); the bodies being received at once, at most
  `max_bodies` of them and `max_bodies_bytes` in all (429 `server_busy` past either);
- the JSON's nesting: at most `MAX_JSON_DEPTH` levels, checked by a scan of the bytes before `json.loads`
  (`parse_json`: 400), so no parser or `repr` recurses past Python's limit;
- the request's headers: whole within `header_timeout` seconds of connecting, or of the previous answer on a kept-alive
  connection, or the connection is closed (`close_slow_headers`; uvicorn's own keep-alive timeout stops at a
  request's first byte);
- shutdown: open requests get `shutdown_timeout` seconds to end, then each is cut (its stream ends with
  `finish_reason: "abort"` and `data: [DONE]`), and a client that reads nothing more is dropped `SHUTDOWN_GRACE`
  seconds later (`Drain`, `run_server`); a second SIGINT or SIGTERM cuts them at once, the same way, and never
  skips the drain.

Refusals are OpenAI's error JSON on every path, and close the connection (a client may still be sending).
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import logging
import re
import threading
import time
from typing import Any

import anyio

from .protocol import APIError, error_body
from .server_limits import (  # the bounds' numbers (standard library only)
    BODY_TIMEOUT,
    MAX_BODIES,
    MAX_BODIES_BYTES,
    MAX_BODY_BYTES,
    ServerLimits,
)

logger = logging.getLogger(__name__)

MAX_JSON_DEPTH = 64  # the deepest body the API reads is 3 levels (a list of token-id prompts, chat messages)
SHUTDOWN_GRACE = 2.0  # after the cut, for the streams' last chunks to leave


async def _refuse(send, status: int, message: str, type_: str = "invalid_request_error") -> None:
    body = json.dumps(error_body(APIError(status, message, None, type_))).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers.append((b"connection", b"close"))  # the rest of the body is not read
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def bears_key(authorization: str, api_key: str) -> bool:
    """Whether an `Authorization` header's value is `Bearer <api_key>`, compared in constant time."""
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


def open_paths(metrics_need_key: bool = False) -> tuple[str, ...]:
    """The paths that need no API key: /health, and /metrics unless `metrics_need_key`."""
    return ("/health",) if metrics_need_key else ("/health", "/metrics")


class KeyGate:
    """ASGI middleware: with `api_key`, a request whose headers do not bear it (`Authorization: Bearer <key>`) gets
    a 401 in OpenAI's format, and its connection closed, before a byte of its body is read. Exempt: a CORS preflight
    (OPTIONS: a browser sends no key with it), a request for which `exempt(method, path)` is true, and one that
    `session(scope)` vouches for (the demo's Gradio login). Added outside `BodyLimits`, so that it runs first."""

    MESSAGE = "a valid API key is needed: send it as 'Authorization: Bearer <key>'"

    def __init__(self, app, api_key: str | None, exempt=lambda method, path: False, session=None):
        self.app, self.api_key, self.exempt, self.session = app, api_key, exempt, session

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.api_key is None or scope["method"] == "OPTIONS":
            return await self.app(scope, receive, send)
        authorization = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        if (
            bears_key(authorization, self.api_key)
            or self.exempt(scope["method"], scope["path"])
            or (self.session is not None and self.session(scope))
        ):
            return await self.app(scope, receive, send)
        return await _refuse(send, 401, self.MESSAGE, "authentication_error")


class BodyLimits:
    """ASGI middleware: reads each request's body, at most `max_bytes` of it within `timeout` seconds, before the
    app runs; the app then reads it from memory. 413 or 408 in OpenAI's error format otherwise. At most
    `max_bodies` bodies are being received at once, holding at most `max_bodies_bytes` in all: a request past
    either is refused (429 `server_busy`) unread, or as its body passes the budget."""

    def __init__(
        self,
        app,
        max_bytes: int = MAX_BODY_BYTES,
        timeout: float = BODY_TIMEOUT,
        max_bodies: int = MAX_BODIES,
        max_bodies_bytes: int = MAX_BODIES_BYTES,
    ):
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout
        self.max_bodies, self.max_bodies_bytes = max_bodies, max_bodies_bytes
        self.receiving, self.received_bytes = 0, 0  # the bodies being received now, and their bytes so far

    def _too_large(self, size: str) -> str:
        return f"the request body ({size} bytes) is over this server's limit of {self.max_bytes:,} bytes"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await _refuse(send, 413, self._too_large(f"{int(length):,}"))
        if length in (None, b"0") and b"transfer-encoding" not in headers:  # no body (a GET): nothing to hold
            return await self.app(scope, receive, send)
        if self.receiving >= self.max_bodies:
            busy = f"this server is receiving {self.max_bodies} request bodies already: try again shortly"
            return await _refuse(send, 429, busy, "server_busy")
        self.receiving += 1
        size = 0
        try:
            chunks = []
            with anyio.fail_after(self.timeout):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":  # the client left: nobody to answer
                        return
                    chunks.append(message.get("body", b""))
                    size += len(chunks[-1])
                    self.received_bytes += len(chunks[-1])
                    if size > self.max_bytes:  # a body without Content-Length (chunked) past the limit
                        return await _refuse(send, 413, self._too_large(f"{size:,} or more"))
                    if self.received_bytes > self.max_bodies_bytes:
                        busy = f"the request bodies being received are over {self.max_bodies_bytes:,} bytes in all"
                        return await _refuse(send, 429, f"{busy}: try again shortly", "server_busy")
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            return await _refuse(send, 408, f"the request body did not arrive within {self.timeout:g} s")
        finally:
            self.receiving -= 1
            self.received_bytes -= size
        body, replayed = b"".join(chunks), False
        del chunks

        async def replay():
            nonlocal body, replayed
            if replayed:
                return await receive()  # after the body: the client's disconnect
            message, replayed, body = {"type": "http.request", "body": body, "more_body": False}, True, b""
            return message

        await self.app(scope, replay, send)


def body_limits(limits: ServerLimits) -> dict:
    """`BodyLimits`' arguments from a server's `limits`."""
    return dict(
        max_bytes=limits.max_body_bytes,
        timeout=limits.body_timeout,
        max_bodies=limits.max_bodies,
        max_bodies_bytes=limits.max_bodies_bytes,
    )


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


def run_server(
    app, host: str, port: int, log_level: str, limits: ServerLimits, drain: Drain, access_log: bool = False
) -> None:
    """Serves `app` (`gpt_serve.serving.api.create_app`) with uvicorn until SIGINT or SIGTERM, with the header timeout
    and
    the shutdown deadline of `limits`; a line per request in the log only with `access_log` (uvicorn's access log).
    A second signal (uvicorn's "force exit", which would skip the drain and drop
    the open streams without their last chunk) cuts the open requests at once instead: each still ends with
    `finish_reason: "abort"` and `data: [DONE]`, and the server exits when they have."""
    import uvicorn

    class Server(uvicorn.Server):
        loop: asyncio.AbstractEventLoop | None = None

        async def serve(self, sockets=None):
            self.loop = asyncio.get_running_loop()
            await super().serve(sockets)

        def handle_exit(self, sig, frame):
            if not self.should_exit or self.loop is None:
                return super().handle_exit(sig, frame)
            logger.warning("signal %s during the shutdown: the open requests are cut now", sig)
            self.loop.call_soon_threadsafe(drain.cut)  # (not force_exit: the drain goes on)

        async def shutdown(self, sockets=None):
            drain.closing = True
            asyncio.get_running_loop().call_later(limits.shutdown_timeout, drain.cut)
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=access_log,
        timeout_graceful_shutdown=limits.shutdown_timeout + SHUTDOWN_GRACE,  # type: ignore[arg-type]
    )  # fmt: skip
    server = Server(config)
    close_slow_headers(server, limits.header_timeout)
    server.run()
