"""The API's errors on the wire: OpenAI's error JSON (`protocol.error_body`) as a response, the 422 of a request the
model failed, OpenAI's 404 and 405 for an unknown route or method, and a worker thread's refusal raised without the
worker's frames."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import TypeVar

import anyio.to_thread
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from ...generation.requests import EngineError
from ..protocol import APIError, error_body
from ..registry import ModelUnavailable

logger = logging.getLogger(__name__)

# A request the model failed (`EngineError`: NaN or infinite logits): the request could not be processed, and no
# server error either, for the server goes on serving every other request.
MODEL_ERROR_STATUS = 422
# An absolute path of the server's (two components or more), and its last component
SERVER_PATH = re.compile(r"(?<![\w.~/:-])/(?:[^\s'\"`,;:()\[\]{}<>/]+/)+([^\s'\"`,;:()\[\]{}<>/]*)")
# The /v1 paths the API serves (another method on one of them is a 405, any other /v1 path a 404).
V1_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/models")

T = TypeVar("T")

router = APIRouter()


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(error_body(e), status_code=e.status)


def unavailable(e: ModelUnavailable) -> APIError:
    """The 503 of a model this server cannot serve: why, with every path of the server's cut to its last part
    (`.../decoder.onnx`): a client learns what is missing, not where the server keeps it. The log has it whole."""
    logger.warning("model unavailable: %s", e)
    return APIError(503, SERVER_PATH.sub(lambda m: f".../{m[1]}", str(e)), "model", "model_unavailable")


def model_failure(e: EngineError) -> APIError:
    return APIError(MODEL_ERROR_STATUS, str(e), None, "model_error")


@router.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
def unknown(path: str, raw_request: Request):
    """Any other /v1 request (this router goes after the API's own routes)."""
    if f"/v1/{path}" in V1_PATHS:
        return error_response(APIError(405, f"{raw_request.method} is not allowed on /v1/{path}"))
    return error_response(APIError(404, f"no route {raw_request.method} /v1/{path} on this server"))


def add_error_handlers(app: FastAPI) -> None:
    """OpenAI's error JSON for an unknown route and a wrong method anywhere on `app` (the router answers its own)."""
    from starlette.exceptions import HTTPException

    @app.exception_handler(HTTPException)
    async def http_error(request, exc):
        message = {404: f"no route {request.method} {request.url.path} on this server"}.get(exc.status_code)
        return error_response(APIError(exc.status_code, message or str(exc.detail)))


async def run_on_worker(function: Callable[..., T], *args) -> T:
    """`function(*args)` on a worker thread (the event loop, and every stream on it, goes on meanwhile), its
    APIError raised here. The refusal crosses the thread bare: an exception that crosses anyio's worker thread sits
    in a reference cycle (its future, its traceback, their frames) until the garbage collector runs, and with it
    every local of those frames (a refused 20 MB prompt among them)."""
    result = await anyio.to_thread.run_sync(_result_or_refusal, function, *args)
    if isinstance(result, APIError):
        raise result
    return result


def _result_or_refusal(function: Callable[..., T], *args) -> T | APIError:
    try:
        return function(*args)
    except APIError as e:
        e.__context__ = None  # the RequestError it came from, and that one's frames
        return e.with_traceback(None)
