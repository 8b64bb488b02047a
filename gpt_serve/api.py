"""An OpenAI-compatible completions API over the scheduler, as a FastAPI router (needs the `serve` extra).

    POST /v1/completions   model, prompt (a string or a list of strings), max_tokens, temperature, top_p, seed,
                           stop (a string or a list of up to 4), stream, n=1; extras: top_k, window_mode, backend
    GET  /v1/models        the models this server can serve
    GET  /health           {"status": "ok", ...}
    GET  /metrics          Prometheus text format: active rows, waiting requests, tokens, time to first token

The answers follow OpenAI's wire format: `text_completion` objects with `usage`, server-sent chunks ending with
`data: [DONE]`, and errors as `{"error": {"message", "type", "param", "code"}}` with 400 (a bad request, named),
404 (an unknown model), 429 (the scheduler's queue is full) and 503 (a model that cannot be served here). Every
request runs through the model's `Scheduler` (`ModelRegistry.scheduler`); a client that disconnects frees its row.

    app = create_app(ModelRegistry.discover())          # `gpt-serve serve` runs this with uvicorn
    demo_app.include_router(create_router(registry))    # or beside the Gradio demo, in the same process

Behind a load balancer of several replicas (`gpt_serve.ray_serve`), each answer names its replica in an
`x-gpt-serve-replica` header (`create_app(..., replica_id=...)`).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .generation.engine import WINDOW_MODES, encode_prompt
from .generation.loading import BACKENDS
from .generation.registry import ModelRegistry, ModelUnavailable, RequestError
from .generation.sampling import SamplingParams
from .generation.scheduler import Request as Job
from .generation.scheduler import ServerBusy, Stream

MAX_STOP_SEQUENCES = 4
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
    """A checked completions request."""

    model: str
    backend: str
    prompts: list[str]
    max_tokens: int
    sampling: SamplingParams
    seed: int | None
    stop: list[str]
    stream: bool
    window_mode: str
    include_usage: bool


def _number(body: dict, name: str, default, lo: float, hi: float, integer: bool = False, lo_open: bool = False):
    value = body.get(name, default)
    if value is None:
        return default
    kind = "an integer" if integer else "a number"
    bounds = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
        raise APIError(400, f"{name} must be {kind} in {bounds}, got {value!r}", name)
    if not (lo < value if lo_open else lo <= value) or value > hi:
        raise APIError(400, f"{name} must be in {bounds}, got {value!r}", name)
    return int(value) if integer else float(value)


def parse_completion(body: Any, registry: ModelRegistry, default_backend: str, max_tokens_limit: int) -> Completion:
    """Checks a request body; APIError (400/404) naming the bad field otherwise."""
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
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOP_SEQUENCES:
        message = f"stop must be a string or a list of at most {MAX_STOP_SEQUENCES} non-empty strings"
        raise APIError(400, message, "stop")
    window_mode = body.get("window_mode") or "exact"
    if window_mode not in WINDOW_MODES:
        raise APIError(400, f"window_mode must be one of {list(WINDOW_MODES)}, got {window_mode!r}", "window_mode")
    backend = body.get("backend") or default_backend
    if backend not in BACKENDS:
        raise APIError(400, f"backend must be one of {list(BACKENDS)}, got {backend!r}", "backend")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(400, f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    sampling = SamplingParams(
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_k=_number(body, "top_k", 0, 0, 1_000_000, integer=True) or None,
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
    )
    return Completion(
        model=model,
        backend=backend,
        prompts=prompts,
        max_tokens=_number(body, "max_tokens", 16, 1, max_tokens_limit, integer=True),
        sampling=sampling,
        seed=_number(body, "seed", None, 0, 2**63 - 1, integer=True),
        stop=stop,
        stream=stream,
        window_mode=window_mode,
        include_usage=isinstance(options, dict) and bool(options.get("include_usage")),
    )


class _Choice:
    """One prompt's generation: its stream of tokens turned into text, cut at the first stop sequence."""

    def __init__(self, index: int, stream: Stream, vocab, stop: list[str], prompt_tokens: int, metrics: _Metrics):
        self.index, self.stream, self.vocab, self.stop, self.metrics = index, stream, vocab, stop, metrics
        self.prompt_tokens, self.tokens, self.text, self.sent = prompt_tokens, 0, "", 0
        self.finish_reason: str | None = None

    async def take(self) -> str:
        """Waits for the next tokens (on the event loop, no thread); returns the new text (may be empty once
        finished)."""
        chunk = await self.stream.atake()
        if chunk is None:
            self.finish_reason = self.finish_reason or "length"
            return self._new_text(final=True)
        if not self.tokens:
            self.metrics.ttft.observe(self.stream.first_token_at - self.stream.submitted_at)
        self.tokens += len(chunk)
        self.text += self.vocab.decode(chunk)
        cut = min((i for i in (self.text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.finish_reason = self.text[:cut], "stop"
            self.stream.cancel()
            return self._new_text(final=True)
        return self._new_text(final=False)

    def _new_text(self, final: bool) -> str:
        # hold back a tail that could still become a stop sequence
        hold = 0 if final else max((len(s) - 1 for s in self.stop), default=0)
        end = max(self.sent, len(self.text) - hold)
        piece, self.sent = self.text[self.sent : end], end
        return piece

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


def create_router(registry: ModelRegistry, default_backend: str = "torch", max_tokens_limit: int = 2000) -> APIRouter:
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
                choice.stream.cancel()
        out = [{"text": c.text, "index": c.index, "logprobs": None, "finish_reason": c.finish_reason} for c in choices]
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


def _start(registry: ModelRegistry, request: Completion, metrics: _Metrics) -> list[_Choice]:
    """Loads the model (first use) and submits every prompt; APIError for what cannot be served."""
    try:
        loaded = registry.backend(request.model, request.backend)
        scheduler = registry.scheduler(request.model, request.backend)
    except ModelUnavailable as e:
        raise APIError(503, str(e), "model", "model_unavailable") from None
    choices = []
    try:
        for i, prompt in enumerate(request.prompts):
            try:
                ids = encode_prompt(loaded.vocab, prompt)  # "" starts from a newline, as the lesson does
            except ValueError as e:
                raise APIError(400, f"prompt {i}: {e}", "prompt") from None
            seed = None if request.seed is None else request.seed + i
            job = Job(ids, request.max_tokens, request.sampling, seed, request.window_mode)
            try:
                stream = scheduler.submit(job)
            except ServerBusy as e:
                raise APIError(429, str(e), None, "server_busy") from None
            except (RequestError, ValueError) as e:
                raise APIError(400, str(e)) from None
            choices.append(_Choice(i, stream, loaded.vocab, request.stop, len(ids), metrics))
    except APIError:
        for choice in choices:
            choice.stream.cancel()
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
            choice.stream.cancel()


def _usage(choices: list[_Choice]) -> dict[str, int]:
    prompt = sum(c.prompt_tokens for c in choices)
    completion = sum(c.tokens for c in choices)
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
