"""Who may call the API's routes, and from which browser origins: the route class that checks the API key and adds
the CORS headers, and the answer to a browser's CORS preflight.

Both live in the routes themselves, not in a middleware, so both hold wherever the router is mounted: `gpt-serve
serve`'s app, or the demo's, which has started before the API is added to it. (`gpt-serve serve`'s app adds
`http_guards.KeyGate` too, which refuses a request without the key before its body is read.)
"""

from __future__ import annotations

import re

from fastapi import APIRouter, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from ..http_guards import KeyGate, bears_key
from ..protocol import APIError
from .errors import error_response
from .state import APIState, APIStateDep, bind_state

CORS_HEADERS = {"access-control-allow-methods": "GET, POST", "access-control-max-age": "600"}
# The request headers a preflight allows when it names none: what a plain `fetch` with a key and JSON sends
BASE_ALLOWED_HEADERS = ("authorization", "content-type")
# A header name as HTTP spells it (RFC 9110's token), and the most a preflight may ask for: an SDK's headers (the
# OpenAI SDKs' `x-stainless-*`, `openai-organization`, ...) are allowed by echoing them, never anything else
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
MAX_REQUESTED_HEADERS = 64
PREFLIGHT_PATHS = ("/v1/{path:path}", "/tokenize", "/detokenize", "/version", "/health", "/metrics")


def guarded_route(state: APIState, api_key: str | None) -> type[APIRoute]:
    """A route class for the API's routes: each request gets `state` (`api_state`), a 401 in OpenAI's format unless
    it bears `api_key` (None: no check), and CORS headers for the state's `allow_origins`."""

    class GuardedRoute(APIRoute):
        def get_route_handler(self):
            handler = super().get_route_handler()

            async def route(raw_request: Request) -> Response:
                bind_state(raw_request, state)
                if api_key is not None and not bears_key(raw_request.headers.get("authorization", ""), api_key):
                    response = error_response(APIError(401, KeyGate.MESSAGE, None, "authentication_error"))
                else:
                    response = await handler(raw_request)
                origin = raw_request.headers.get("origin")
                if origin is not None and origin in state.allow_origins:
                    response.headers["access-control-allow-origin"] = origin
                    response.headers.add_vary_header("Origin")
                return response

            return route

    return GuardedRoute


def preflight(raw_request: Request, state: APIStateDep):
    """A browser's CORS preflight (it sends no API key): for a named origin, the allowed methods, and as allowed
    headers those it asks for (`Access-Control-Request-Headers`, each a valid header name) with `authorization` and
    `content-type`; for any other origin, none. What is allowed still needs the key."""
    if raw_request.headers.get("origin") not in state.allow_origins:
        return Response(status_code=204)
    headers = {**CORS_HEADERS, "access-control-allow-headers": ", ".join(allowed_headers(raw_request))}
    response = Response(status_code=204, headers=headers)
    response.headers.add_vary_header("Access-Control-Request-Headers")  # and `Origin`, by the route class
    return response


def allowed_headers(raw_request: Request) -> list[str]:
    """`BASE_ALLOWED_HEADERS` and the header names the preflight asks for, lower-cased, once each; a name that is
    not a header name, or past `MAX_REQUESTED_HEADERS`, is left out (the browser then refuses the request)."""
    asked = [name.strip().lower() for name in raw_request.headers.get("access-control-request-headers", "").split(",")]
    valid = [name for name in asked if _HEADER_NAME.match(name)][:MAX_REQUESTED_HEADERS]
    return list(dict.fromkeys((*BASE_ALLOWED_HEADERS, *valid)))


preflight_router = APIRouter()
for _path in PREFLIGHT_PATHS:
    preflight_router.add_api_route(_path, preflight, methods=["OPTIONS"], include_in_schema=False)
