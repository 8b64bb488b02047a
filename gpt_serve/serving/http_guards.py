"""The ASGI guards in front of every HTTP server of gpt-serve (`gpt-serve serve`, Ray Serve replicas and the demo),
so that no request can hold a server's memory or a connection for long (needs the `serve` extra):

- who may send a body: with an API key, a request's headers must bear it before a byte of its body is read (401,
  `KeyGate`, an ASGI middleware outside `BodyLimits`); a request without it, to a route that needs none, may send no
  body (413 from its headers) but what its route takes without the key (the demo's login form, at most
  `KEYLESS_BODY_BYTES`), read by the gate itself and never counted in the keyed requests' budget below;
- the request body: at most `max_body_bytes` (a Content-Length over it is refused unread, a body without one is cut
  off as it passes the limit: 413) and whole within `body_timeout` seconds of the request's headers (408), read
  before the app sees it (`BodyLimits`, an ASGI middleware); the bodies being received at once, at most
  `max_bodies` of them and `max_bodies_bytes` in all (429 `server_busy` past either);
- the JSON: UTF-8 only (RFC 8259), at most `MAX_JSON_DEPTH` levels deep, checked by a scan of the bytes before
  `json.loads`, so no parser or `repr` recurses past Python's limit, and no lone surrogate (`parse_json`: 400); the
  body let go of once parsed (`read_json`).

The header timeout and the shutdown's drain are the server's own (`gpt_serve.serving.launcher`). Refusals are
OpenAI's error JSON on every path, and close the connection (a client may still be sending).
"""

from __future__ import annotations

import hmac
import itertools
import json
import re
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

MAX_JSON_DEPTH = 64  # the deepest body the API reads is 3 levels (a list of token-id prompts, chat messages)


BODY_READ = "gpt_serve.body_read"  # the scope key `KeyGate` sets on a keyless request whose (tiny) body it read
KEYLESS_BODY_BYTES = 4096  # what the demo's login form (a name and the key) may send without the key


class Refused(Exception):
    """A request refused before the app sees it: its status and OpenAI's error, answered by `_refuse`."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_


async def _refuse(send, refused: Refused, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(error_body(APIError(refused.status, refused.message, None, refused.type))).encode()
    fields = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    fields += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    fields.append((b"connection", b"close"))  # the rest of the body is not read
    await send({"type": "http.response.start", "status": refused.status, "headers": fields})
    await send({"type": "http.response.body", "body": body})


def bears_key(authorization: str, api_key: str) -> bool:
    """Whether an `Authorization` header's value is `Bearer <api_key>`, compared in constant time."""
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


def open_paths(metrics_need_key: bool = False) -> tuple[str, ...]:
    """The paths that need no API key: /health, and /metrics unless `metrics_need_key`."""
    return ("/health",) if metrics_need_key else ("/health", "/metrics")


def cors_headers(origin: str | None, allow_origins) -> dict[str, str]:
    """The CORS headers of an answer to a request from `origin`: none unless it is one of `allow_origins`."""
    if origin is None or origin not in allow_origins:
        return {}
    return {"access-control-allow-origin": origin, "vary": "Origin"}


def _declared_body(headers: dict) -> int | None:
    """The body a request's headers announce: its Content-Length, -1 for one of unknown length (chunked, or a
    Content-Length that is not a number), None for none."""
    length = headers.get(b"content-length")
    if length is None:
        return -1 if b"transfer-encoding" in headers else None
    return (int(length) or None) if length.isdigit() else -1


async def read_body(receive, max_bytes: int, timeout: float, too_large, budget=None) -> bytes | None:
    """A request's body, whole, at most `max_bytes` within `timeout` seconds: Refused 413 (`too_large(size)` says
    so) or 408 otherwise; None when the client left. `budget(n)` is told of every `n` bytes received (negative once
    they are let go of) and may refuse them."""
    chunks, size = [], 0
    try:
        with anyio.fail_after(timeout):
            while True:
                message = await receive()
                if message["type"] != "http.request":  # the client left: nobody to answer
                    return None
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                if budget is not None:
                    budget(len(chunks[-1]))
                if size > max_bytes:  # a body without Content-Length (chunked) past the limit
                    raise Refused(413, too_large(f"{size:,} or more"))
                if not message.get("more_body", False):
                    return b"".join(chunks)
    except TimeoutError:
        raise Refused(408, f"the request body did not arrive within {timeout:g} s") from None
    finally:
        if budget is not None:
            budget(-size)


async def call_with_body(app, scope, receive, send, held: list[bytes]) -> None:
    """`app` called with the body already read, `held` (a one-item list, emptied as the app reads it: nothing here
    keeps the bytes while the app works); the client's disconnect comes after it."""

    async def replay():
        if not held:
            return await receive()
        return {"type": "http.request", "body": held.pop(), "more_body": False}

    await app(scope, replay, send)


class KeyGate:
    """ASGI middleware: with `api_key`, a request whose headers do not bear it (`Authorization: Bearer <key>`) gets
    a 401 in OpenAI's format, and its connection closed, before a byte of its body is read. A request that
    `session(scope)` vouches for (the demo's Gradio login) counts as bearing it.

    Keyless requests are bounded apart: `keyless(method, path)` is the most body bytes a request without the key may
    send to (method, path), None where the key is needed (a CORS preflight, OPTIONS, may send none). A body past that
    is a 413 from the headers; a tiny one (the demo's login form) is read here, within `body_timeout`, and never
    counts against `BodyLimits`' budget, which is the keyed requests' alone. The gate's refusals carry the CORS
    headers of an origin in `allow_origins`, so that a page can read them. Added outside `BodyLimits`."""

    MESSAGE = "a valid API key is needed: send it as 'Authorization: Bearer <key>'"

    def __init__(
        self, app, api_key: str | None, keyless=lambda method, path: None, session=None, allow_origins=(),
        body_timeout: float = BODY_TIMEOUT,
    ):  # fmt: skip
        self.app, self.api_key, self.keyless, self.session = app, api_key, keyless, session
        self.allow_origins, self.timeout = tuple(allow_origins), body_timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.api_key is None:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if bears_key(authorization, self.api_key) or (self.session is not None and self.session(scope)):
            return await self.app(scope, receive, send)
        allowed = 0 if scope["method"] == "OPTIONS" else self.keyless(scope["method"], scope["path"])
        try:
            if allowed is None:
                raise Refused(401, self.MESSAGE, "authentication_error")
            declared = _declared_body(headers)
            if declared is None:  # no body (a GET): nothing to hold
                return await self.app(scope, receive, send)
            most = f"at most {allowed:,} bytes of body" if allowed else "no body"
            too_large = f"a request without the API key may send {most} to {scope['path']}"
            if declared > allowed or (declared < 0 and allowed == 0):
                raise Refused(413, f"{too_large}; this one sends {declared:,}" if declared > 0 else too_large)
            held = [await read_body(receive, allowed, self.timeout, lambda size: f"{too_large} ({size} sent)")]
        except Refused as refused:
            origin = headers.get(b"origin", b"").decode("latin-1") or None
            return await _refuse(send, refused, cors_headers(origin, self.allow_origins))
        if held[0] is not None:
            await call_with_body(self.app, {**scope, BODY_READ: True}, receive, send, held)


class BodyLimits:
    """ASGI middleware: reads each request's body, at most `max_bytes` of it within `timeout` seconds, before the
    app runs; the app then reads it from memory. 413 or 408 in OpenAI's error format otherwise. At most
    `max_bodies` bodies are being received at once, holding at most `max_bodies_bytes` in all: a request past
    either is refused (429 `server_busy`) unread, or as its body passes the budget. A keyless body `KeyGate` read
    (`BODY_READ`) is not read again, nor counted."""

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

    def _count(self, size: int) -> None:
        self.received_bytes += size
        if size > 0 and self.received_bytes > self.max_bodies_bytes:
            busy = f"the request bodies being received are over {self.max_bodies_bytes:,} bytes in all"
            raise Refused(429, f"{busy}: try again shortly", "server_busy")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get(BODY_READ):
            return await self.app(scope, receive, send)
        declared = _declared_body(dict(scope.get("headers") or []))
        if declared is None:  # no body (a GET): nothing to hold
            return await self.app(scope, receive, send)
        try:
            if declared > self.max_bytes:
                raise Refused(413, self._too_large(f"{declared:,}"))
            if self.receiving >= self.max_bodies:
                busy = f"this server is receiving {self.max_bodies} request bodies already: try again shortly"
                raise Refused(429, busy, "server_busy")
            self.receiving += 1
            try:
                held = [await read_body(receive, self.max_bytes, self.timeout, self._too_large, self._count)]
            finally:
                self.receiving -= 1
        except Refused as refused:
            return await _refuse(send, refused)
        if held[0] is not None:
            await call_with_body(self.app, scope, receive, send, held)


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


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # a \uD800-\uDFFF escape: half of a pair, or alone


def parse_json(body: bytes) -> Any:
    """The JSON value of a request body; APIError 400 for a body that is not UTF-8 JSON (RFC 8259: JSON between
    systems is UTF-8; a UTF-16 or UTF-32 body is refused by name, before any scan), nests past `MAX_JSON_DEPTH`, or
    holds a lone surrogate (a `\\ud800` escape not part of a pair: no Unicode character, and no answer could
    encode it)."""
    encoding = json.detect_encoding(body)
    if encoding not in ("utf-8", "utf-8-sig"):
        raise APIError(400, f"the request body is {encoding.upper()}, not UTF-8: send JSON as UTF-8 (RFC 8259)")
    try:
        text = body.decode(encoding)
    except UnicodeDecodeError as e:
        raise APIError(400, f"the request body is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if json_depth(body) > MAX_JSON_DEPTH:  # UTF-8: its quotes, backslashes and brackets are single bytes
        raise APIError(400, f"the request body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(text)
    except ValueError as e:  # a number of over 4,300 digits too
        raise APIError(400, f"the request body is not valid JSON ({str(e)[:200]})") from None
    if _SURROGATE_ESCAPE.search(body) and _holds_lone_surrogate(value):
        raise APIError(400, "the request body holds a lone surrogate escape (\\ud800-\\udfff not part of a pair)")
    return value


def _holds_lone_surrogate(value: Any) -> bool:
    """Whether a string of the JSON `value` (a key or a value, at any depth) cannot be encoded as UTF-8."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and not item.isascii():
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


async def read_json(raw_request) -> Any:
    """The JSON of a Starlette request's body (`parse_json`). Its bytes are let go of once parsed: `Request.body()`
    would keep them for as long as the request lives, a whole wait in a scheduler's queue."""
    return parse_json(b"".join([chunk async for chunk in raw_request.stream()]))
