"""GET /v1/models and /v1/models/{id}: the models this server serves, in OpenAI's format."""

from __future__ import annotations

import time

from fastapi import APIRouter

from ..protocol import APIError, require_model
from .errors import error_response
from .state import APIStateDep

router = APIRouter()


def model_object(name: str) -> dict:
    return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "gpt-serve"}


@router.get("/v1/models")
def list_models(state: APIStateDep):
    return {"object": "list", "data": [model_object(n) for n in state.registry.available]}


@router.get("/v1/models/{model_id}")
def retrieve_model(model_id: str, state: APIStateDep):
    try:
        return model_object(require_model({"model": model_id}, state.registry, state.registry.available))
    except APIError as e:
        return error_response(e)
