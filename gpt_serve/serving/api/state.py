"""What every route of the API reaches: the server's `APIState`, through the `api_state` dependency.

The state travels with the routes, not with an app: `create_router` binds it to the routes it makes (their route
class puts it on each request), so the router serves the same wherever it is mounted, `gpt-serve serve`'s app or
the demo's. A test that serves one route alone overrides the dependency:
`app.dependency_overrides[api_state] = lambda: APIState(registry, Metrics(registry))`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from ...generation.fields import DEFAULT_BACKEND
from ..launcher import Drain
from ..metrics import Metrics
from ..registry import ModelRegistry
from ..request_caps import RequestCaps


@dataclass(frozen=True)
class APIState:
    """The API's shared state: the models, the metrics, the open requests (`drain`, for the server's shutdown), the
    backend of a request that names none, the server's limit of max_tokens, the browser origins allowed (CORS) and
    the caps on what one request may ask in all."""

    registry: ModelRegistry
    metrics: Metrics
    drain: Drain = field(default_factory=Drain)
    default_backend: str = DEFAULT_BACKEND
    max_tokens_limit: int | None = None
    allow_origins: tuple[str, ...] = ()
    caps: RequestCaps = RequestCaps()


def bind_state(raw_request: Request, state: APIState) -> None:
    """Makes `state` the one `api_state` gives the routes that serve `raw_request` (`access.guarded_route` calls it)."""
    raw_request.state.gpt_serve_api = state


def api_state(raw_request: Request) -> APIState:
    """The dependency that gives a route the API's state (`bind_state`)."""
    return raw_request.state.gpt_serve_api


APIStateDep = Annotated[APIState, Depends(api_state)]
