"""Who may use the demo when it is started with an API key (`--api-key` or `$GPT_SERVE_API_KEY`).

Without a key the demo is open, as a public page is. With one, the key guards everything that generates text, the
Gradio page and its API included (Gradio's API can call every event of the page, so a key on /v1 alone would guard
nothing):

- the page asks for it at login (Gradio's `auth`): any user name, the key as the password; a `gradio_client` client
  passes `auth=(name, key)`;
- the OpenAI-compatible API (/v1, /tokenize, /detokenize, /version, and /metrics with `--metrics-need-key`) wants
  `Authorization: Bearer <key>`, as on `gpt-serve serve`; /health stays open;
- a request that carries a body is refused (401) from its headers alone, before its body is read, unless it bears
  the key or the cookie of a logged-in page (`gpt_serve.serving.http_guards.KeyGate`); the login form itself (its
  body at most 4 KiB, read apart from the keyed budget) and requests without a body (GET; one with a body is a 413)
  are let through to the routes, each of which checks its own access; `/browser/` (the model's files) needs the key
  or the cookie;
- the login page describes no endpoint (`NoAPIForVisitors`: Gradio's own embeds the app's API description);
- FastAPI's own /openapi.json is turned off.
"""

from __future__ import annotations

import hmac
import re

from starlette.requests import cookie_parser

from gpt_serve.serving.http_guards import KEYLESS_BODY_BYTES, KeyGate, open_paths
from gpt_serve.serving.server_limits import BODY_TIMEOUT

from .browser import BROWSER_PREFIX

LOGIN_PATHS = ("/login", "/login/")  # Gradio's login form: how a page gets its session cookie


def gradio_session(scope) -> bool:
    """Whether the request bears the cookie of a page logged in to the Gradio app that serves it."""
    app = scope.get("app")
    tokens, cookie_id = getattr(app, "tokens", None), getattr(app, "cookie_id", None)
    if not tokens or cookie_id is None:
        return False
    header = dict(scope.get("headers") or []).get(b"cookie", b"").decode("latin-1")
    cookies = cookie_parser(header)
    return any(cookies.get(f"{name}-{cookie_id}") in tokens for name in ("access-token", "access-token-unsecure"))


API_INFO = re.compile(rb"window\.gradio_api_info = .*?;</script>", re.S)  # (its JSON escapes every "<")
NO_API_INFO = b'window.gradio_api_info = {"named_endpoints": {}, "unnamed_endpoints": {}};</script>'


class NoAPIForVisitors:
    """ASGI middleware: a page served to a visitor who has not logged in describes no endpoint. Gradio's login page
    embeds the app's whole API description (`window.gradio_api_info`: /generate and its parameters) though the
    config beside it holds nothing; an HTML answer to a request without a session gets an empty one instead."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "GET" or gradio_session(scope):
            return await self.app(scope, receive, send)
        start, chunks = None, []

        async def send_page(message):
            nonlocal start
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                if not headers.get(b"content-type", b"").startswith(b"text/html"):
                    return await send(message)
                start = message
            elif start is None:
                return await send(message)
            else:
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    page = API_INFO.sub(NO_API_INFO, b"".join(chunks))
                    headers = [(k, v) for k, v in start.get("headers") or [] if k != b"content-length"]
                    await send({**start, "headers": [*headers, (b"content-length", str(len(page)).encode())]})
                    await send({"type": "http.response.body", "body": page})

        await self.app(scope, receive, send_page)


def access_options(
    api_key: str | None, metrics_need_key: bool = False, allow_origins=(), body_timeout: float = BODY_TIMEOUT
) -> dict:
    """The parts of `Blocks.launch`'s arguments that the key sets: Gradio's login, the `KeyGate` middleware (to go
    before the body limits in `app_kwargs["middleware"]`) and no /openapi.json; nothing without a key."""
    if api_key is None:
        return {"middleware": [], "auth": None, "app_kwargs": {}}
    from starlette.middleware import Middleware

    unlocked = open_paths(metrics_need_key)

    def keyless(method: str, path: str) -> int | None:
        """The body a request without the key (nor a logged-in page's cookie) may send: the login form's, or none."""
        if path in LOGIN_PATHS:
            return KEYLESS_BODY_BYTES
        if path == BROWSER_PREFIX or path.startswith(f"{BROWSER_PREFIX}/"):  # the model's files: behind the login
            return None
        return 0 if method in ("GET", "HEAD") or path in unlocked else None

    def login(user: str, password: str) -> bool:
        return hmac.compare_digest(password.encode(), api_key.encode())

    gate = Middleware(KeyGate, api_key=api_key, keyless=keyless, session=gradio_session, allow_origins=allow_origins,
                      body_timeout=body_timeout)  # fmt: skip
    middleware = [gate, Middleware(NoAPIForVisitors)]
    return {"middleware": middleware, "auth": login, "app_kwargs": {"openapi_url": None}}
