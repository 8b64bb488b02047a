"""Request size limits for the demo's server: every client can reach every event, so nothing it sends is
processed (or kept) past a bound."""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException

MAX_BODY_BYTES = 256 * 1024  # a 10,000-character prompt (the request limit) is at most ~60 kB of JSON


class BodySizeLimit:
    """ASGI middleware: a request body over `max_bytes` gets 413 with a JSON message, and is never read whole."""

    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._refuse(send, int(length))
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:  # a body without Content-Length (chunked) that runs past the limit
                raise BodyTooLarge(received)
            return message

        try:
            await self.app(scope, limited_receive, send)
        except BodyTooLarge as e:
            await self._refuse(send, e.size)

    async def _refuse(self, send, size: int) -> None:
        body = json.dumps(
            {"error": f"the request body ({size:,} bytes or more) is over this server's limit of {self.max_bytes:,}"}
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class BodyTooLarge(HTTPException):
    """Raised from `receive`: an HTTPException, because FastAPI turns any other error while it reads a body into
    400 "There was an error parsing the body"; this one it re-raises, and the middleware answers 413."""

    def __init__(self, size: int):
        super().__init__(413)
        self.size = size
