"""The API assembled: `create_router` puts every concern's routes under the access rules (`access`), with the
server's state (`state`); `create_app` serves that router alone, with the bounds of every server of gpt-serve."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute

from ...generation.fields import DEFAULT_BACKEND
from ..http_guards import BodyLimits, KeyGate, body_limits, open_paths
from ..launcher import Drain
from ..metrics import Metrics
from ..registry import ModelRegistry
from ..request_caps import RequestCaps
from ..server_limits import ServerLimits
from . import completions, errors, health, models, tokens
from .access import guarded_route, preflight_router
from .errors import add_error_handlers
from .state import APIState

REPLICA_HEADER = "x-gpt-serve-replica"
# The routers by concern, in the order they are matched: the catch-all of /v1 (`errors.router`) goes last.
ROUTERS = (models.router, health.router, tokens.router, completions.router, errors.router)


def create_router(
    registry: ModelRegistry,
    default_backend: str = DEFAULT_BACKEND,
    max_tokens_limit: int | None = None,
    api_key: str | None = None,
    metrics_need_key: bool = False,
    allow_origins: tuple[str, ...] | list[str] = (),
    drain: Drain | None = None,
    caps: RequestCaps | None = None,
) -> APIRouter:
    """The API's routes over `registry` (see the package docstring); `drain` holds the open requests, for the
    server's shutdown (`gpt_serve.serving.launcher`); `caps` bound what one request may ask in all. With `api_key`,
    every route but those of `http_guards.open_paths` (and the CORS preflights) needs it."""
    state = APIState(registry, Metrics(registry), drain or Drain(), default_backend, max_tokens_limit,
                     tuple(allow_origins), caps or RequestCaps())  # fmt: skip
    router = APIRouter(route_class=guarded_route(state, api_key))
    unlocked = APIRouter(route_class=guarded_route(state, None))
    unlocked_paths = open_paths(metrics_need_key)
    for concern in ROUTERS:
        for route in concern.routes:
            add_route(unlocked if route.path in unlocked_paths else router, route)
    for route in preflight_router.routes:
        add_route(unlocked, route)
    router.include_router(unlocked)
    return router


def add_route(router: APIRouter, route: APIRoute) -> None:
    """`route` declared again on `router`, under that router's route class (FastAPI's `include_router` would keep
    the route's own)."""
    router.add_api_route(
        route.path, route.endpoint, methods=sorted(route.methods), name=route.name,
        include_in_schema=route.include_in_schema,
    )  # fmt: skip


def create_app(
    registry: ModelRegistry, replica_id: str | None = None, limits: ServerLimits | None = None, **router_options
) -> FastAPI:
    """A FastAPI app serving only the API (`gpt-serve serve`); its shutdown stops the registry's decode loops.

    `replica_id` (set by `gpt_serve.serving.ray_serve` for each replica) is sent back in an `x-gpt-serve-replica`
    header on every answer; without it the answers carry no such header. `limits` bound the request bodies
    (`BodyLimits`); `app.state.drain` holds the open requests, for `launcher.run_server`'s shutdown. `router_options`
    are `create_router`'s (the API key, CORS origins, the max_tokens limit)."""
    limits = limits or ServerLimits()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        registry.close()

    app = FastAPI(title="gpt-serve", description="OpenAI-compatible API of gpt-serve", lifespan=lifespan)
    app.state.drain = Drain()
    app.include_router(create_router(registry, drain=app.state.drain, **router_options))
    add_error_handlers(app)
    app.add_middleware(BodyLimits, **body_limits(limits))
    # outside BodyLimits: a request without the key is refused from its headers, its body never read; every path
    # needs it (the OpenAPI pages /docs, /redoc and /openapi.json too) but /health and, unless so configured, /metrics,
    # which take no body without it (what keyless requests hold is not what keyed ones may)
    unlocked = open_paths(router_options.get("metrics_need_key", False))
    app.add_middleware(
        KeyGate, api_key=router_options.get("api_key"), keyless=lambda method, path: 0 if path in unlocked else None,
        allow_origins=router_options.get("allow_origins", ()), body_timeout=limits.body_timeout,
    )  # fmt: skip
    if replica_id is not None:
        app.add_middleware(ReplicaHeader, replica_id=replica_id)
    return app


class ReplicaHeader:
    """ASGI middleware: every HTTP answer names the replica that made it (`REPLICA_HEADER`)."""

    def __init__(self, app, replica_id: str):
        self.app, self.header = app, (REPLICA_HEADER.encode(), replica_id.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_header(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_header)
