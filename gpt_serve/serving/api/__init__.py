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
    GET  /health, /version, /metrics     liveness, the package version, Prometheus' text format (`serving.metrics`)

Answers follow OpenAI's wire format, errors included (`{"error": {"message", "type", "param", "code"}}`: 400 a bad
request, named; 401 without the API key; 404 an unknown model or route; 405; 429 the scheduler's queue is full; 503
a model that cannot be served here; 422 `model_error` when the model computes NaN or infinite logits, which are
never sampled: that request ends, the others go on; a stream then ends with an `error` event and `[DONE]`;
413/408 for a body over the limit or too slow, `gpt_serve.serving.http_guards`, whose `BodyLimits` `create_app` adds and
the demo adds too; 503 once the server is shutting down). Every choice is a `TextStream` on the model's `Scheduler`, as
on every other surface; a client that disconnects frees its rows, whether it streams or not. `max_tokens_limit`
lowers the specification's limit of max_tokens. With `api_key`, every route but /health (and /metrics unless
`metrics_need_key`) needs `Authorization: Bearer <key>`, compared in constant time.

    app = create_app(ModelRegistry.discover(), api_key="s3cret", allow_origins=["https://example.org"])
    demo_app.include_router(create_router(registry, api_key=...))    # beside the Gradio demo, in the same process

Behind a load balancer of several replicas (`gpt_serve.serving.ray_serve`), each answer names its replica in an
`x-gpt-serve-replica` header (`create_app(..., replica_id=...)`).

The routes are plain functions in routers by concern, each reaching the server's state through the `api_state`
dependency (`state`): `models` (/v1/models), `completions` (/v1/completions, /v1/chat/completions, their choices in
`choices`, their streams in `streaming`), `tokens` (/tokenize, /detokenize), `health` (/health, /version,
/metrics) and `errors` (OpenAI's error JSON, the 404 and 405 of /v1). `access` checks the API key and answers CORS;
`app` assembles them (`create_router`, `create_app`).
"""

from __future__ import annotations

from .app import REPLICA_HEADER, create_app, create_router

__all__ = ["REPLICA_HEADER", "create_app", "create_router"]
