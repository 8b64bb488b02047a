"""POST /tokenize and /detokenize, in vLLM's shapes: a prompt's token ids, and token ids' text, by a model's
vocabulary (a model's first use loads it, on a worker thread)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ...generation.backends.interface import check_token_ids
from ...generation.fields import RequestError, check_value, show_value
from ...generation.text import encode_prompt
from ..http_guards import read_json
from ..protocol import APIError, require_model
from ..registry import ModelRegistry, ModelUnavailable
from .errors import error_response, run_on_worker, unavailable
from .state import APIState, APIStateDep

router = APIRouter()


@router.post("/tokenize")
async def tokenize(raw_request: Request, state: APIStateDep):
    try:
        body, loaded = await vocab_request(raw_request, state, "prompt", ("unk_policy",))
        ids = encode_text(loaded.vocab, body.get("prompt"), body.get("unk_policy"))
    except APIError as e:
        return error_response(e)
    return {"count": len(ids), "max_model_len": loaded.block_size, "tokens": ids}


@router.post("/detokenize")
async def detokenize(raw_request: Request, state: APIStateDep):
    try:
        body, loaded = await vocab_request(raw_request, state, "tokens")
        text = decode_ids(loaded.vocab, body.get("tokens"), "tokens")
    except APIError as e:
        return error_response(e)
    return {"prompt": text}


async def vocab_request(raw_request: Request, state: APIState, field: str, extra: tuple[str, ...] = ()):
    """The body and the loaded model of a /tokenize or /detokenize request (a model's first use loads it on a
    worker thread: the event loop, and every stream on it, goes on meanwhile)."""
    body = await read_json(raw_request)
    check_fields(body, ("model", "backend", field, *extra))
    loaded = await run_on_worker(load_model, state.registry, body, state.default_backend)
    return body, loaded


def check_fields(body, known: tuple[str, ...]) -> None:
    """APIError 400 unless `body` is a JSON object of `known` fields only (naming the first other one)."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    unknown = [k for k in body if k not in known]
    if unknown:
        raise APIError(400, f"unknown field {show_value(unknown[0])}; the fields are {list(known)}", unknown[0])


def load_model(registry: ModelRegistry, body: dict, default_backend: str):
    """The loaded (model, backend) a /tokenize or /detokenize body names (loading it on first use: blocks)."""
    model = require_model(body, registry, registry.available)
    try:
        return registry.backend(model, check_value("backend", body.get("backend")) or default_backend)
    except ModelUnavailable as e:
        raise unavailable(e) from None
    except RequestError as e:
        raise APIError(400, str(e), e.field) from None


def encode_text(vocab, prompt, unk_policy) -> list[int]:
    """The ids of `prompt`, checked as the request parser checks a completion's prompt and unk_policy (the same 400,
    naming the field)."""
    try:
        prompt = check_value("prompt", prompt)  # text, within the specification's length
        return encode_prompt(vocab, prompt, check_value("unk_policy", unk_policy))
    except RequestError as e:
        raise APIError(400, str(e), e.field) from None


def decode_ids(vocab, ids, field: str) -> str:
    """The text of token ids (`field` of the request); APIError 400 for what is not a list of the vocabulary's ids."""
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise APIError(400, f"{field} must be a list of token ids, got {show_value(ids)}", field)
    try:
        check_token_ids(ids, len(vocab), field)
    except ValueError as e:
        raise APIError(400, str(e), field) from None
    return vocab.decode(ids)
