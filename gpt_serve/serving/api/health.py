"""GET /health, /version and /metrics: liveness (the models present), the package version, and the API's
Prometheus metrics (`gpt_serve.serving.metrics`)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from ... import __version__
from .state import APIStateDep

router = APIRouter()


@router.get("/health")
def health(state: APIStateDep):
    return {"status": "ok", "models": state.registry.available}


@router.get("/version")
def version():
    return {"version": __version__}


@router.get("/metrics")
def prometheus(state: APIStateDep):
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
