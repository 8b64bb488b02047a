"""An OpenAI-compatible completions API over the scheduler, as a FastAPI router (needs the `serve` extra).

    POST /v1/completions   model, prompt (a string or a list of strings), stream, stream_options, n=1, and the
                           generation fields of the request specification (`gpt_serve.generation.spec`): max_tokens,
                           temperature, top_p, seed, stop; extras top_k, repetition_penalty, window_mode,
                           refill_tokens, unk_policy, backend. An unknown field is a 400 naming it.
    GET  /v1/models        the models this server can serve
    GET  /health           {"status": "ok", ...}
    GET  /metrics          Prometheus text format: active rows, waiting requests, tokens, time to first token

The answers follow OpenAI's wire format: `text_completion` objects with `usage`, server-sent chunks ending with
`data: [DONE]`, and errors as `{"error": {"message", "type", "param", "code"}}` with 400 (a bad request, named),
404 (an unknown model), 429 (the scheduler's queue is full) and 503 (a model that cannot be served here). Every
prompt is a `TextStream` on the model's `Scheduler` (`ModelRegistry.scheduler`), as on every other surface; a client
that disconnects frees its row. `max_tokens_limit` lowers the specification's limit of max_tokens.

    app = create_app(ModelRegistry.discover())          # `gpt-serve serve` runs this with uvicorn
    demo_app.include_router(create_router(registry))    # or beside the Gradio demo, in the same process

Behind a load balancer of several replicas (`gpt_serve.ray_serve`), each answer names its replica in an
`x-gpt-serve-replica` header (`create_app(..., replica_id=...)`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .generation.registry import ModelRegistry, ModelUnavailable
from .generation.requests import ServerBusy
from .generation.spec import GenerationRequest, RequestError, parse_request
from .generation.text import TextStream

REPLICA_HEADER = "x-gpt-serve-replica"
# OpenAI parameters this server does not implement: accepted only at the value that means "off".
UNSUPPORTED = {
    "logprobs": (None,),
    "echo": (False, None),
    "best_of": (1, None),
    "suffix": (None, ""),
    "frequency_penalty": (0, 0.0, None),
    "presence_penalty": (0, 0.0, None),
    "logit_bias": (None, {}),
}
# OpenAI fields the API itself reads; every other field is the request specification's (`generation.spec`)
WIRE_FIELDS = ("model", "prompt", "stream", "stream_options", "n", "user", *UNSUPPORTED)


class APIError(Exception):
    """An error answered in OpenAI's format."""

    def __init__(self, status: int, message: str, param: str | None = None, type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.type = status, message, param, type_

    def response(self) -> JSONResponse:
        code = {404: "model_not_found", 429: "server_busy", 503: "model_unavailable"}.get(self.status)
        error = {"message": self.message, "type": self.type, "param": self.param, "code": code}
        return JSONResponse({"error": error}, status_code=self.status)


@dataclass(frozen=True)
class Completion:
    """A checked completions request: the OpenAI fields, and the generation request every prompt shares."""

    model: str
    backend: str
    prompts: list[str]
    request: GenerationRequest
    stream: bool
    include_usage: bool


def parse_completion(
    body: Any, registry: ModelRegistry, default_backend: str, max_tokens_limit: int | None = None
) -> Completion:
    """Checks a request body; APIError (400/404) naming the bad field otherwise. The generation fields are parsed by
    the request specification (`parse_request`), as on every other surface."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, "model is required: one of " + ", ".join(registry.available), "model")
    if model not in registry.names:
        raise APIError(404, f"the model {model!r} does not exist; this server has {registry.available}", "model")
    prompts = body.get("prompt", "")
    prompts = [prompts] if isinstance(prompts, str) else prompts
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        message = "prompt must be a string or a non-empty list of strings (token arrays are not supported)"
        raise APIError(400, message, "prompt")
    for name, allowed in UNSUPPORTED.items():
        if body.get(name) not in allowed:
            raise APIError(400, f"{name} is not supported by this server (got {body.get(name)!r})", name)
    if body.get("n", 1) not in (1, None):
        raise APIError(400, f"n must be 1 (one completion per prompt), got {body.get('n')!r}", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(400, f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    fields = {k: v for k, v in body.items() if k not in WIRE_FIELDS}
    try:
        request = parse_request({**fields, "prompt": prompts[0]}, max_new_tokens_limit=max_tokens_limit)
        for p in prompts[1:]:
            parse_request({"prompt": p})
    except RequestError as e:
        raise APIError(400, str(e), e.field) from None
    return Completion(
        model=model,
        backend=request.backend or default_backend,
        prompts=prompts,
        request=request,
        stream=stream,
        include_usage=isinstance(options, dict) and bool(options.get("include_usage")),
    )


class _Choice:
    """One prompt's text stream, and its time to first token for the metrics."""

    def __init__(self, index: int, text: TextStream, metrics: _Metrics):
        self.index, self.text, self.metrics = index, text, metrics

    async def take(self) -> str:
        """Waits for the next tokens (on the event loop, no thread); returns the new text (may be empty)."""
        before = self.text.tokens
        piece = await self.text.atake()
        if not before and self.text.tokens:
            stream = self.text.stream
            self.metrics.ttft.observe(stream.first_token_at - stream.submitted_at)
        return piece or ""

    @property
    def done(self) -> bool:
        return self.text.done

    @property
    def finish_reason(self) -> str | None:
        return self.text.finish_reason


def create_router(
    registry: ModelRegistry, default_backend: str = "torch", max_tokens_limit: int | None = None
) -> APIRouter:
    """The API's routes over `registry` (see the module docstring)."""
    router = APIRouter()
    metrics = _Metrics(registry)

    @router.get("/v1/models")
    def list_models():
        created = int(time.time())
        data = [{"id": n, "object": "model", "created": created, "owned_by": "gpt-serve"} for n in registry.available]
        return {"object": "list", "data": data}

    @router.get("/health")
    def health():
        return {"status": "ok", "models": registry.available}

    @router.get("/metrics")
    def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @router.post("/v1/completions")
    async def completions(http: Request):
        try:
            try:
                body = await http.json()
            except ValueError as e:
                raise APIError(400, f"the request body is not valid JSON ({e})") from None
            request = parse_completion(body, registry, default_backend, max_tokens_limit)
            choices = await anyio.to_thread.run_sync(_start, registry, request, metrics)
        except APIError as e:
            return e.response()
        cid, created = f"cmpl-{secrets.token_hex(12)}", int(time.time())
        if request.stream:
            return StreamingResponse(_events(request, choices, cid, created, metrics), media_type="text/event-stream")
        try:
            for choice in choices:
                while not choice.done:
                    await choice.take()
        finally:
            for choice in choices:
                choice.text.cancel()
        out = [
            {"text": c.text.text, "index": c.index, "logprobs": None, "finish_reason": c.finish_reason} for c in choices
        ]
        usage = _usage(choices)
        return {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": request.model,
            "choices": out,
            "usage": usage,
        }

    return router


def _start(registry: ModelRegistry, completion: Completion, metrics: _Metrics) -> list[_Choice]:
    """Loads the model (first use) and submits every prompt; APIError for what cannot be served."""
    try:
        loaded = registry.backend(completion.model, completion.backend)
        scheduler = registry.scheduler(completion.model, completion.backend)
    except ModelUnavailable as e:
        raise APIError(503, str(e), "model", "model_unavailable") from None
    choices: list[_Choice] = []
    try:
        for i, prompt in enumerate(completion.prompts):
            request = dataclasses.replace(completion.request, prompt=prompt)
            try:
                choices.append(_Choice(i, TextStream(scheduler, loaded.vocab, request, index=i), metrics))
            except ServerBusy as e:
                raise APIError(429, str(e), None, "server_busy") from None
            except RequestError as e:
                raise APIError(400, f"prompt {i}: {e}" if len(completion.prompts) > 1 else str(e), e.field) from None
            except ValueError as e:
                raise APIError(400, str(e)) from None
    except APIError:
        for choice in choices:
            choice.text.cancel()
        raise
    return choices


async def _events(request: Completion, choices: list[_Choice], cid: str, created: int, metrics) -> AsyncIterator[str]:
    """OpenAI's server-sent chunks; the rows are cancelled when the client goes away (the task is cancelled)."""

    def chunk(choice_list, usage=None) -> str:
        body = {"id": cid, "object": "text_completion", "created": created, "model": request.model}
        body["choices"] = choice_list
        if usage is not None:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"

    try:
        for choice in choices:  # prompts one after the other: each stream keeps its tokens meanwhile
            while not choice.done:
                text = await choice.take()
                if text or choice.done:
                    item = {
                        "text": text,
                        "index": choice.index,
                        "logprobs": None,
                        "finish_reason": choice.finish_reason,
                    }
                    yield chunk([item])
        if request.include_usage:
            yield chunk([], _usage(choices))
        yield "data: [DONE]\n\n"
    finally:
        for choice in choices:
            choice.text.cancel()


def _usage(choices: list[_Choice]) -> dict[str, int]:
    prompt = sum(len(c.text.prompt_ids) for c in choices)
    completion = sum(c.text.tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class _Metrics:
    """Prometheus metrics: the schedulers' live state, read at scrape time, and a time-to-first-token histogram."""

    def __init__(self, registry: ModelRegistry):
        from prometheus_client import CollectorRegistry, Histogram, generate_latest
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        self._generate = generate_latest
        self.registry = CollectorRegistry()
        self.ttft = Histogram(
            "gpt_serve_time_to_first_token_seconds",
            "Seconds from a request's arrival to its first token",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        models = registry

        class Live:
            def collect(self):
                active = GaugeMetricFamily(
                    "gpt_serve_active_rows", "Requests decoding now", labels=["model", "backend"]
                )
                waiting = GaugeMetricFamily(
                    "gpt_serve_waiting_requests", "Requests queued", labels=["model", "backend"]
                )
                tokens = CounterMetricFamily(
                    "gpt_serve_generated_tokens", "Tokens generated", labels=["model", "backend"]
                )
                for (name, key), scheduler in models.schedulers().items():
                    stats = scheduler.stats()
                    active.add_metric([name, key], stats["active"])
                    waiting.add_metric([name, key], stats["waiting"])
                    tokens.add_metric([name, key], stats["tokens"])
                yield from (active, waiting, tokens)

        self.registry.register(Live())

    def render(self) -> bytes:
        return self._generate(self.registry)


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


def create_app(registry: ModelRegistry, replica_id: str | None = None, **router_options) -> FastAPI:
    """A FastAPI app serving only the API (`gpt-serve serve`); its shutdown stops the registry's decode loops.

    `replica_id` (set by `gpt_serve.ray_serve` for each replica) is sent back in an `x-gpt-serve-replica` header
    on every answer; without it the answers carry no such header."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        registry.close()

    app = FastAPI(title="gpt-serve", description="OpenAI-compatible completions API of gpt-serve", lifespan=lifespan)
    app.include_router(create_router(registry, **router_options))
    if replica_id is not None:
        app.add_middleware(_ReplicaHeader, replica_id=replica_id)
    return app
