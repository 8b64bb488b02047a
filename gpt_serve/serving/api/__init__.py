"""An OpenAI-compatible API over the scheduler, as FastAPI routers (needs the `serve` extra): /v1/completions,
/v1/chat/completions, /v1/models, vLLM's /tokenize and /detokenize, /health, /version, /metrics. Answers and errors
follow OpenAI's wire format; every choice is a `TextStream` on the model's `Scheduler`, as on every other surface.
docs/serving.md lists the fields, the status codes and the server's bounds.

    app = create_app(ModelRegistry.discover(), api_key="s3cret", allow_origins=["https://example.org"])
    demo_app.include_router(create_router(registry, api_key=...))    # beside the Gradio demo, in the same process

The routers, by concern, reach the server's state through the `api_state` dependency (`state`): `models`,
`completions` (its choices in `choices`, its streams in `streaming`), `tokens`, `health`, `errors` (OpenAI's error
JSON); `access` checks the API key and answers CORS; `app` assembles them (`create_router`, `create_app`).
"""

from __future__ import annotations

from .app import REPLICA_HEADER, create_app, create_router

__all__ = ["REPLICA_HEADER", "create_app", "create_router"]
