"""Who may use the demo when it is started with an API key (`--api-key` or `$GPT_SERVE_API_KEY`).

Without a key the demo is open, as a public page is. With one, the key guards everything that generates text, the
Gradio page and its API included (Gradio's API can call every event of the page, so a key on /v1 alone would guard
nothing):

- the page asks for it at login (Gradio's `auth`): any user name, the key as the password; a `gradio_client` client
  passes `auth=(name, key)`;
- the OpenAI-compatible API (/v1, /tokenize, /detokenize, /version, and /metrics with `--metrics-need-key`) wants
  `Authorization: Bearer <key>`, as on `gpt-serve serve`; /health stays open;
- a request that carries a body is refused (401) from its headers alone, before its body is read, unless it bears
  the key or the cookie of a logged-in page (`gpt_serve.serving.limits.KeyGate`); the login form itself and requests
  without a body (GET) are let through to the routes, each of which checks its own access;
- FastAPI's own /openapi.json is turned off.
"""

from __future__ import annotations

import hmac

from starlette.requests import cookie_parser

from gpt_serve.serving.limits import KeyGate, open_paths

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


def access_options(api_key: str | None, metrics_need_key: bool = False) -> dict:
    """The parts of `Blocks.launch`'s arguments that the key sets: Gradio's login, the `KeyGate` middleware (to go
    before the body limits in `app_kwargs["middleware"]`) and no /openapi.json; nothing without a key."""
    if api_key is None:
        return {"middleware": [], "auth": None, "app_kwargs": {}}
    from starlette.middleware import Middleware

    unlocked = (*open_paths(metrics_need_key), *LOGIN_PATHS)

    def exempt(method: str, path: str) -> bool:
        return method in ("GET", "HEAD") or path in unlocked

    def login(user: str, password: str) -> bool:
        return hmac.compare_digest(password.encode(), api_key.encode())

    gate = Middleware(KeyGate, api_key=api_key, exempt=exempt, session=gradio_session)
    return {"middleware": [gate], "auth": login, "app_kwargs": {"openapi_url": None}}
