"""POST /v1/completions and /v1/chat/completions: a request parsed by `protocol`, its choices started on the
model's scheduler (`choices`), then answered whole or streamed (`streaming`)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from ...generation.requests import EngineError
from ..http_guards import read_json
from ..launcher import Drain
from ..protocol import SHUTTING_DOWN, APIError, Job, answer, check_caps, parse_chat, parse_completion
from .choices import Choice, cancel_on_disconnect, end_choices, score_prompts, start_choices
from .errors import error_response, model_failure, run_on_worker
from .state import APIState, APIStateDep
from .streaming import events

router = APIRouter()


@router.post("/v1/completions")
async def completions(raw_request: Request, state: APIStateDep):
    return await serve(raw_request, state, parse_completion)


@router.post("/v1/chat/completions")
async def chat_completions(raw_request: Request, state: APIStateDep):
    return await serve(raw_request, state, parse_chat)


async def serve(raw_request: Request, state: APIState, parse: Callable[..., Job]) -> Response | dict:
    """A completions or chat request (`parse` reads its body), answered in OpenAI's format, streamed or whole."""
    try:
        job = parse(await read_json(raw_request), state.registry, state.default_backend, state.max_tokens_limit)
        check_caps(job, state.caps)
        if state.drain.closing:
            raise APIError(503, "the server is shutting down", None, "server_error", SHUTTING_DOWN)
        choices = await run_on_worker(start_choices, state.registry, job, state.metrics, state.drain)
        scorings = score_prompts(state.registry, job, choices, state.drain)
    except APIError as e:
        return error_response(e)
    cid = f"{'chatcmpl' if job.kind == 'chat' else 'cmpl'}-{secrets.token_hex(12)}"
    if job.stream:
        stream = events(job, choices, cid, int(time.time()), state.drain)
        return StreamingResponse(stream, media_type="text/event-stream")
    return await whole_answer(raw_request, job, choices, scorings, cid, state.drain)


async def whole_answer(
    raw_request: Request, job: Job, choices: list[Choice], scorings: list, cid: str, drain: Drain
) -> Response | dict:
    """The answer of every choice once all have ended (and, for `echo`, the prompts' own logprobs). A client that
    leaves frees its rows and stops its prompts' scoring at once, whether it streams or not."""
    watcher = asyncio.ensure_future(cancel_on_disconnect(raw_request, [*choices, *scorings]))
    try:
        for choice in choices:
            while not choice.text.done:
                await choice.take()
        echoed = [await s.aresult() if s is not None else None for s in scorings] if job.echo else None
    except EngineError as e:
        return error_response(model_failure(e))
    finally:
        watcher.cancel()
        end_choices(choices, drain)
        for scoring in scorings:
            if scoring is not None:
                scoring.cancel()  # a no-op once done
    return answer(job, choices, cid, echoed)
