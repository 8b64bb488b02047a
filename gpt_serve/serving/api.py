"""An OpenAI-compatible API over the scheduler, as FastAPI routers (needs the `serve` extra).

    POST /v1/completions        model, prompt (a string, token ids, or a list of up to 16 of either), stream,
                                stream_options, n, best_of, echo, logprobs, and the generation fields of the request
                                specification (`gpt_serve.generation.spec`): max_tokens, temperature, top_p, seed,
                                stop, presence_penalty, frequency_penalty; extras top_k, min_p, repetition_penalty,
                                window_mode, refill_tokens, unk_policy, backend. An unknown field is a 400 naming it.
    POST /v1/chat/completions   model, messages (a play script: `gpt_serve.serving.chat`), stream, n, logprobs,
                                top_logprobs, speakers, and the same generation fields
    GET  /v1/models, /v1/models/{id}     the models this server serves
    POST /tokenize, /detokenize          vLLM's shapes: a prompt's ids, and ids' text
    GET  /health, /version, /metrics     liveness, the package version, Prometheus' text format (`api_metrics`)

Answers follow OpenAI's wire format, errors included (`{"error": {"message", "type", "param", "code"}}`: 400 a bad
request, named; 401 without the API key; 404 an unknown model or route; 405; 429 the scheduler's queue is full; 503
a model that cannot be served here; 422 `model_error` when the model computes NaN or infinite logits, which are
never sampled: that request ends, the others go on; a stream then ends with an `error` event and `[DONE]`;
413/408 for a body over the limit or too slow, `gpt_serve.serving.limits`, whose `BodyLimits` `create_app` adds and the
demo adds too; 503 once the server is shutting down). Every choice is a `TextStream` on the model's `Scheduler`, as
on every other surface; a client that disconnects frees its rows, whether it streams or not. `max_tokens_limit`
lowers the specification's limit of max_tokens. With `api_key`, every route but /health (and /metrics unless
`metrics_need_key`) needs `Authorization: Bearer <key>`, compared in constant time.

    app = create_app(ModelRegistry.discover(), api_key="s3cret", allow_origins=["https://example.org"])
    demo_app.include_router(create_router(registry, api_key=...))    # beside the Gradio demo, in the same process

Behind a load balancer of several replicas (`gpt_serve.serving.ray_serve`), each answer names its replica in an
`x-gpt-serve-replica` header (`create_app(..., replica_id=...)`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
import time
from collections.abc import AsyncIterator

import anyio.to_thread
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute

from .. import __version__
from ..generation.fields import DEFAULT_BACKEND, RequestError, check_value, show_value
from ..generation.requests import EngineError, ServerBusy
from ..generation.text import TextStream, encode_prompt
from .limits import BodyLimits, Drain, KeyGate, ServerLimits, bears_key, body_limits, open_paths, parse_json
from .metrics import Metrics
from .protocol import (
    SHUTTING_DOWN,
    APIError,
    Job,
    answer,
    chat_logprobs,
    completion_logprobs,
    error_body,
    parse_chat,
    parse_completion,
    require_model,
    usage,
)
from .registry import ModelRegistry, ModelUnavailable

REPLICA_HEADER = "x-gpt-serve-replica"
API_KEY_ENV = "GPT_SERVE_API_KEY"
# A request the model failed (`EngineError`: NaN or infinite logits): the request could not be processed, and no
# server error either, for the server goes on serving every other request.
MODEL_ERROR_STATUS = 422


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(error_body(e), status_code=e.status)


def model_failure(e: EngineError) -> APIError:
    return APIError(MODEL_ERROR_STATUS, str(e), None, "model_error")


class _Choice:
    """One choice: its text stream, and what the metrics and the answer need of it."""

    def __init__(self, index: int, text: TextStream, job: Job, metrics: Metrics):
        self.index, self.text, self.job, self.metrics, self.seen = index, text, job, metrics, 0

    async def take(self) -> str:
        """Waits for the next tokens (on the event loop, no thread); the new text (may be "")."""
        piece = await self.text.atake()
        stream = self.text.stream
        if stream.generated > self.seen:
            self.metrics.tokens_arrived(stream, self.job.model, self.job.backend, self.seen, time.perf_counter())
            self.seen = stream.generated
        if self.text.done:
            self.metrics.finish(
                self.job.model, self.job.backend, len(self.text.prompt_ids), self.text.tokens,
                self.text.finish_reason, stream.submitted_at,
            )  # fmt: skip
        return piece or ""

    @property
    def score(self) -> float:
        """The text's log-probability (best_of ranks choices by it)."""
        return sum(e[0] for e in self.text.logprobs)


CORS_HEADERS = {
    "access-control-allow-methods": "GET, POST",
    "access-control-allow-headers": "authorization, content-type",
    "access-control-max-age": "600",
}


def _route_class(api_key: str | None, allow_origins: tuple[str, ...]) -> type[APIRoute]:
    """A route class for the API's routes: 401 in OpenAI's format unless the request bears `api_key` (none: no
    check), and CORS headers for the `allow_origins`. In the routes themselves, not in a middleware, so both hold
    wherever the router is mounted: `gpt-serve serve`'s app or the demo's, which has started before it is added."""

    class Route(APIRoute):
        def get_route_handler(self):
            handler = super().get_route_handler()

            async def route(http: Request) -> Response:
                if api_key is not None and not _bears(http, api_key):
                    message = "a valid API key is needed: send it as 'Authorization: Bearer <key>'"
                    response = error_response(APIError(401, message, None, "authentication_error"))
                else:
                    response = await handler(http)
                origin = http.headers.get("origin")
                if origin is not None and origin in allow_origins:
                    response.headers["access-control-allow-origin"] = origin
                    response.headers["vary"] = "Origin"
                return response

            return route

    return Route


def _bears(http: Request, api_key: str) -> bool:
    return bears_key(http.headers.get("authorization", ""), api_key)


def create_router(
    registry: ModelRegistry,
    default_backend: str = DEFAULT_BACKEND,
    max_tokens_limit: int | None = None,
    api_key: str | None = None,
    metrics_need_key: bool = False,
    allow_origins: tuple[str, ...] | list[str] = (),
    drain: Drain | None = None,
) -> APIRouter:
    """The API's routes over `registry` (see the module docstring); `drain` holds the open requests, for the
    server's shutdown (`gpt_serve.serving.limits`)."""
    metrics = Metrics(registry)
    drain = drain or Drain()
    origins = tuple(allow_origins)
    open_routes = APIRouter(route_class=_route_class(None, origins))
    router = APIRouter(route_class=_route_class(api_key, origins))
    metrics_router = router if metrics_need_key else open_routes

    def model_object(name: str) -> dict:
        return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "gpt-serve"}

    @router.get("/v1/models")
    def list_models():
        return {"object": "list", "data": [model_object(n) for n in registry.available]}

    @router.get("/v1/models/{model_id}")
    def retrieve_model(model_id: str):
        try:
            return model_object(require_model({"model": model_id}, registry, registry.available))
        except APIError as e:
            return error_response(e)

    def preflight(http: Request):
        """A browser's CORS preflight (it sends no API key): the allowed methods and headers, for a named origin."""
        allowed = http.headers.get("origin") in origins
        return Response(status_code=204, headers=CORS_HEADERS if allowed else {})

    for path in ("/v1/{path:path}", "/tokenize", "/detokenize", "/version", "/health", "/metrics"):
        open_routes.add_api_route(path, preflight, methods=["OPTIONS"], include_in_schema=False)

    @open_routes.get("/health")
    def health():
        return {"status": "ok", "models": registry.available}

    @router.get("/version")
    def version():
        return {"version": __version__}

    @metrics_router.get("/metrics")
    def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def body_of(http: Request):
        return parse_json(await http.body())

    async def vocab_request(http: Request, field: str, extra: tuple[str, ...] = ()):
        """The body and the loaded model of a /tokenize or /detokenize request (a model's first use loads it on a
        worker thread: the event loop, and every stream on it, goes on meanwhile)."""
        body = await body_of(http)
        _known_fields(body, ("model", "backend", field, *extra))
        loaded = await anyio.to_thread.run_sync(_load_or_refusal, registry, body, default_backend)
        if isinstance(loaded, APIError):
            raise loaded
        return body, loaded

    @router.post("/tokenize")
    async def tokenize(http: Request):
        try:
            body, loaded = await vocab_request(http, "prompt", ("unk_policy",))
            ids = _encode(loaded.vocab, body.get("prompt"), body.get("unk_policy"))
        except APIError as e:
            return error_response(e)
        return {"count": len(ids), "max_model_len": loaded.block_size, "tokens": ids}

    @router.post("/detokenize")
    async def detokenize(http: Request):
        try:
            body, loaded = await vocab_request(http, "tokens")
            text = _decode(loaded.vocab, body.get("tokens"), "tokens")
        except APIError as e:
            return error_response(e)
        return {"prompt": text}

    async def serve(http: Request, parse) -> Response:
        try:
            job = parse(await body_of(http), registry, default_backend, max_tokens_limit)
            if drain.closing:
                raise APIError(503, "the server is shutting down", None, "server_error", SHUTTING_DOWN)
            choices = await anyio.to_thread.run_sync(_start_or_refusal, registry, job, metrics, drain)
            if isinstance(choices, APIError):
                raise choices
            scorings = _score(registry, job, choices)
        except APIError as e:
            return error_response(e)
        cid = f"{'chatcmpl' if job.kind == 'chat' else 'cmpl'}-{secrets.token_hex(12)}"
        if job.stream:
            events = _events(job, choices, cid, int(time.time()), drain)
            return StreamingResponse(events, media_type="text/event-stream")
        # a client that leaves frees its rows and stops its prompts' scoring at once, whether it streams or not
        watcher = asyncio.ensure_future(_cancel_on_disconnect(http, [*choices, *scorings]))
        try:
            for choice in choices:
                while not choice.text.done:
                    await choice.take()
            echoed = [await s.aresult() if s is not None else None for s in scorings] if job.echo else None
        except EngineError as e:
            return error_response(model_failure(e))
        finally:
            watcher.cancel()
            _end(choices, drain)
            for scoring in scorings:
                if scoring is not None:
                    scoring.cancel()  # a no-op once done
        return answer(job, choices, cid, echoed)

    @router.post("/v1/completions")
    async def completions(http: Request):
        return await serve(http, parse_completion)

    @router.post("/v1/chat/completions")
    async def chat_completions(http: Request):
        return await serve(http, parse_chat)

    @router.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
    def unknown(path: str, http: Request):
        if f"/v1/{path}" in ("/v1/completions", "/v1/chat/completions", "/v1/models"):
            return error_response(APIError(405, f"{http.method} is not allowed on /v1/{path}"))
        return error_response(APIError(404, f"no route {http.method} /v1/{path} on this server"))

    router.include_router(open_routes)
    return router


def _known_fields(body, known: tuple[str, ...]) -> None:
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    unknown = [k for k in body if k not in known]
    if unknown:
        raise APIError(400, f"unknown field {show_value(unknown[0])}; the fields are {list(known)}", unknown[0])


def _load(registry: ModelRegistry, body: dict, default_backend: str):
    """The loaded (model, backend) a /tokenize or /detokenize body names (loading it on first use: blocks)."""
    model = require_model(body, registry, registry.available)
    try:
        return registry.backend(model, check_value("backend", body.get("backend")) or default_backend)
    except ModelUnavailable as e:
        raise APIError(503, str(e), "model", "model_unavailable") from None
    except RequestError as e:
        raise APIError(400, str(e), e.field) from None


def _load_or_refusal(registry: ModelRegistry, body: dict, default_backend: str):
    """`_load` on a worker thread, its refusal returned bare (see `_start_or_refusal`)."""
    try:
        return _load(registry, body, default_backend)
    except APIError as e:
        e.__context__ = None
        return e.with_traceback(None)


def _encode(vocab, prompt, unk_policy) -> list[int]:
    try:
        prompt = check_value("prompt", prompt)  # text, within the specification's length
        return encode_prompt(vocab, prompt, check_value("unk_policy", unk_policy))
    except RequestError as e:
        raise APIError(400, str(e), e.field) from None


def _decode(vocab, ids, field: str) -> str:
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise APIError(400, f"{field} must be a list of token ids, got {show_value(ids)}", field)
    bad = [t for t in ids if not 0 <= t < len(vocab)]
    if bad:
        raise APIError(400, f"{field} holds ids {bad[:10]} outside the vocabulary [0, {len(vocab) - 1}]", field)
    return vocab.decode(ids)


def _start(registry: ModelRegistry, job: Job, metrics: Metrics, drain: Drain) -> list[_Choice]:
    """Loads the model (first use) and submits every choice (prompt i's choice j is index i * best_of + j, with
    seed `seed + index`), each held open in `drain` until `_end`; APIError for what cannot be served."""
    try:
        loaded = registry.backend(job.model, job.backend)
        scheduler = registry.scheduler(job.model, job.backend)
    except ModelUnavailable as e:
        raise APIError(503, str(e), "model", "model_unavailable") from None
    request = job.request
    if job.best_of > job.n and request.logprobs is None:
        request = dataclasses.replace(request, logprobs=0)  # best_of ranks the choices by their logprobs
    choices: list[_Choice] = []
    try:
        for i, prompt in enumerate(job.prompts):
            if not isinstance(prompt, str):
                prompt = _decode(loaded.vocab, prompt, "prompt")
            for j in range(job.best_of):
                index = i * job.best_of + j
                try:
                    text = TextStream(scheduler, loaded.vocab, request, index, prompt=prompt)
                except ServerBusy as e:
                    raise APIError(429, str(e), None, "server_busy") from None
                except RequestError as e:
                    where = f"prompt {i}: " if len(job.prompts) > 1 else ""
                    raise APIError(400, f"{where}{e}", e.field) from None
                drain.open.add(text)
                choices.append(_Choice(index, text, job, metrics))
    except APIError:
        _end(choices, drain)
        raise
    return choices


def _start_or_refusal(registry: ModelRegistry, job: Job, metrics: Metrics, drain: Drain) -> list[_Choice] | APIError:
    """`_start`, with its refusal returned bare instead of raised: an exception that crosses anyio's worker thread
    sits in a reference cycle (its future, its traceback, their frames) until the garbage collector runs, and with
    it every local of those frames (a refused 20 MB prompt among them)."""
    try:
        return _start(registry, job, metrics, drain)
    except APIError as e:
        e.__context__ = None  # the RequestError it came from, and that one's frames
        return e.with_traceback(None)


def _end(choices: list[_Choice], drain: Drain) -> None:
    """The choices' rows freed (a no-op for those that ended) and forgotten by `drain`."""
    for choice in choices:
        choice.text.cancel()
        drain.open.discard(choice.text)


async def _cancel_on_disconnect(http: Request, work: list) -> None:
    """Waits for the client to leave (once the body is read, `receive` has nothing else to say), then cancels
    `work` (choices and scorings)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass
    for item in work:
        if item is not None:
            (item.text if isinstance(item, _Choice) else item).cancel()


def _score(registry: ModelRegistry, job: Job, choices: list[_Choice]) -> list:
    """Per prompt, the scheduled scoring of its own tokens (OpenAI's echo with logprobs), None where there is
    nothing to score (no echo of logprobs, or a stream): chunks between decode steps, beside the generation."""
    if not job.echo or job.stream:
        return []
    if job.logprobs is None:
        return [None] * (len(choices) // job.best_of)
    scheduler = registry.scheduler(job.model, job.backend)
    scorings = []
    try:
        for k in range(0, len(choices), job.best_of):
            scorings.append(scheduler.score(choices[k].text.prompt_ids, job.logprobs))
    except ServerBusy as e:
        for scoring in scorings:
            scoring.cancel()
        for choice in choices:
            choice.text.cancel()
        raise APIError(429, str(e), None, "server_busy") from None
    return scorings


async def _events(job: Job, choices: list[_Choice], cid: str, created: int, drain: Drain) -> AsyncIterator[str]:
    """OpenAI's server-sent chunks, choice after choice (each stream keeps its tokens meanwhile); the rows are
    cancelled when the client goes away (the task is cancelled)."""
    chat = job.kind == "chat"
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(items, usage=None) -> str:
        body = {"id": cid, "object": kind, "created": created, "model": job.model, "choices": items}
        if usage is not None:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"

    try:
        for choice in choices:
            if chat:
                yield chunk([{"index": choice.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])  # fmt: skip
            sent = 0
            while not choice.text.done:
                piece = await choice.take()
                if not piece and not choice.text.done:
                    continue
                logprobs = None
                if job.logprobs is not None:
                    t = choice.text
                    ids, entries = t.vocab.encode(piece), t.logprobs[sent : sent + len(piece)]
                    lp = (
                        chat_logprobs(t.vocab, ids, entries)
                        if chat
                        else completion_logprobs(t.vocab, ids, entries, sent)
                    )
                    logprobs = lp
                sent += len(piece)
                reason = choice.text.finish_reason
                item = {"index": choice.index, "logprobs": logprobs, "finish_reason": reason}
                item.update({"delta": {"content": piece} if piece else {}} if chat else {"text": piece})
                yield chunk([item])
        if job.include_usage:
            yield chunk([], usage(choices, job))
    except EngineError as e:  # the model failed this request: an error event (OpenAI's clients raise it), the end
        yield f"data: {json.dumps(error_body(model_failure(e)))}\n\n"
        yield "data: [DONE]\n\n"
    else:
        yield "data: [DONE]\n\n"
    finally:
        _end(choices, drain)


class _ReplicaHeader:
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


def add_error_handlers(app: FastAPI) -> None:
    """OpenAI's error JSON for an unknown route and a wrong method anywhere on `app` (the router answers its own)."""
    from starlette.exceptions import HTTPException

    @app.exception_handler(HTTPException)
    async def http_error(request, exc):
        message = {404: f"no route {request.method} {request.url.path} on this server"}.get(exc.status_code)
        return error_response(APIError(exc.status_code, message or str(exc.detail)))


def create_app(
    registry: ModelRegistry, replica_id: str | None = None, limits: ServerLimits | None = None, **router_options
) -> FastAPI:
    """A FastAPI app serving only the API (`gpt-serve serve`); its shutdown stops the registry's decode loops.

    `replica_id` (set by `gpt_serve.serving.ray_serve` for each replica) is sent back in an `x-gpt-serve-replica` header
    on every answer; without it the answers carry no such header. `limits` bound the request bodies (`BodyLimits`);
    `app.state.drain` holds the open requests, for `api_limits.run_server`'s shutdown. `router_options` are
    `create_router`'s (the API key, CORS origins, the max_tokens limit)."""
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
    # needs it (the OpenAPI pages /docs, /redoc and /openapi.json too) but /health and, unless so configured, /metrics
    unlocked = open_paths(router_options.get("metrics_need_key", False))
    app.add_middleware(KeyGate, api_key=router_options.get("api_key"), exempt=lambda method, path: path in unlocked)
    if replica_id is not None:
        app.add_middleware(_ReplicaHeader, replica_id=replica_id)
    return app
