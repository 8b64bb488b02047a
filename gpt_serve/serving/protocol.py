"""The OpenAI wire format of the API's requests and answers: what a completions or chat body means (its OpenAI
fields here, every generation field by the request specification, `generation.spec`), and the answers of both
formats, `logprobs` objects included. No I/O: `gpt_serve.serving.api` serves it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..generation.fields import RequestError, check_value, show_value
from ..generation.spec import GenerationRequest, check_prompts, parse_request
from . import chat
from .registry import ModelRegistry, ModelUnavailable
from .request_caps import RequestCaps

MAX_CHOICES = 16  # n (and best_of): choices a request may ask for, each a row of its own
# OpenAI fields accepted only at the value that means "off" (what this server does not implement)
OFF = {"suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none")}
# OpenAI fields that change nothing here (bookkeeping of OpenAI's own service)
IGNORED = ("user", "store", "metadata", "service_tier", "parallel_tool_calls")


SHUTTING_DOWN = "server_shutting_down"  # the code of the 503 a request gets once its server is shutting down


class APIError(Exception):
    """An error answered in OpenAI's format (`error_body`)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type_: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code


# OpenAI's `code` of an error, by HTTP status, unless the error names its own (a 400 has none; a 404 of a model is
# "model_not_found")
ERROR_CODES = {401: "invalid_api_key", 404: "not_found", 405: "method_not_allowed", 408: "request_timeout"}
ERROR_CODES |= {413: "request_too_large", 422: "model_error", 429: "server_busy", 503: "model_unavailable"}


def error_body(e: APIError) -> dict:
    """OpenAI's error JSON: `{"error": {"message", "type", "param", "code"}}`."""
    code = e.code or ("model_not_found" if e.status == 404 and e.param == "model" else ERROR_CODES.get(e.status))
    return {"error": {"message": e.message, "type": e.type, "param": e.param, "code": code}}


@dataclass(frozen=True)
class Job:
    """A checked completions or chat request: OpenAI's own fields beside the generation request its choices share,
    held as it is (`request.prompt` is the first prompt; `prompts` are all of them, as text or token ids); `end`
    ends each choice's text as a stop string does (a chat's reply is one speech). The model, the backend and the
    logprobs are the request's: `model`, `backend` and `logprobs` read them there."""

    kind: str  # "completion" or "chat"
    prompts: list  # str, or a list of token ids
    request: GenerationRequest
    stream: bool
    include_usage: bool
    n: int = 1
    best_of: int = 1
    echo: bool = False
    end: str = ""

    @property
    def model(self) -> str:
        return self.request.model

    @property
    def backend(self) -> str:
        return self.request.backend

    @property
    def logprobs(self) -> int | None:
        """Top logprobs per token (None: no logprobs object)."""
        return self.request.logprobs


def _choices(body: dict, name: str, default: int) -> int:
    value = body.get(name, default)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CHOICES:
        raise APIError(400, f"{name} must be an integer in [1, {MAX_CHOICES}], got {show_value(value)}", name)
    return value


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise APIError(400, f"{name} must be true or false, got {show_value(value)}", name)
    return value


def require_model(body: Any, registry: ModelRegistry, names: list[str]) -> str:
    """The request's `model`: APIError 400 without one, 404 unless it is one of `names`."""
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str) or not model:
        raise APIError(400, "model is required: one of " + ", ".join(registry.available), "model")
    if model not in names:
        raise APIError(404, f"the model {model!r} does not exist; this server has {registry.available}", "model")
    return model


def _common(body: Any, registry: ModelRegistry, wire: tuple[str, ...]) -> tuple[str, dict]:
    """The model (400 without one, 404 for an unknown one) and the body's generation fields."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    model = require_model(body, registry, registry.names)
    for name, allowed in OFF.items():
        if body.get(name) not in allowed:
            raise APIError(400, f"{name} is not supported by this server (got {show_value(body.get(name))})", name)
    known = (*wire, *OFF, *IGNORED)
    return model, {k: v for k, v in body.items() if k not in known}


def _parse_fields(fields: dict, prompt: str, model: str, server: tuple[int | None, str, dict]) -> GenerationRequest:
    """The generation request of a body's generation `fields`, its `prompt` and `model`; `server`: the server's
    cap of max_tokens, its default backend and the model folder's defaults."""
    max_tokens_limit, default_backend, defaults = server
    try:
        return parse_request(
            {**fields, "prompt": prompt, "model": model}, max_tokens_limit, {"backend": default_backend, **defaults}
        )
    except RequestError as e:
        raise APIError(400, str(e), e.field) from None


def _folder(read, model: str):
    """What the model's folder says (`read(model)`: its generation defaults, its chat format); a 503 naming the bad
    file otherwise."""
    try:
        return read(model)
    except ModelUnavailable as e:
        raise APIError(503, str(e), "model") from None


def _stream_options(body: dict, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise APIError(400, "stream_options must be an object, and only with stream: true", "stream_options")
    return bool((options or {}).get("include_usage"))


COMPLETION_WIRE = ("model", "prompt", "stream", "stream_options", "n", "best_of", "echo", "logprobs")


def parse_completion(
    body: Any, registry: ModelRegistry, default_backend: str, max_tokens_limit: int | None = None
) -> Job:
    """A `/v1/completions` body; APIError (400/404) naming the bad field otherwise."""
    model, fields = _common(body, registry, COMPLETION_WIRE)
    prompts = body.get("prompt", "")
    if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and all(_is_id(t) for t in prompts)):
        prompts = [prompts]  # one text, or one prompt of token ids
    if not isinstance(prompts, list) or not prompts or len(prompts) > MAX_CHOICES:
        raise APIError(
            400,
            f"prompt must be a string, a list of token ids, or a list of 1 to {MAX_CHOICES} of these, "
            f"got {show_value(body.get('prompt'))}",
            "prompt",
        )
    for i, p in enumerate(prompts):
        if not isinstance(p, str) and not (isinstance(p, list) and p and all(_is_id(t) for t in p)):
            raise APIError(400, f"prompt {i} must be a string or a non-empty list of token ids", "prompt")
    stream = _flag(body, "stream")
    n = _choices(body, "n", 1)
    best_of = _choices(body, "best_of", n)
    if best_of < n:
        raise APIError(400, f"best_of ({best_of}) must be at least n ({n})", "best_of")
    if best_of > n and stream:
        raise APIError(400, "best_of greater than n cannot stream (the best are known only at the end)", "best_of")
    if len(prompts) * best_of > MAX_CHOICES:
        raise APIError(400, f"{len(prompts)} prompts x {best_of} choices is over the limit of {MAX_CHOICES} rows", "n")
    echo = _flag(body, "echo")
    if echo and stream:
        raise APIError(400, "echo cannot stream here: send it with stream: false (or leave echo out)", "echo")
    _check_prompts(prompts, best_of)
    first = prompts[0] if isinstance(prompts[0], str) else ""  # token ids are checked against the model's vocabulary
    server = (max_tokens_limit, default_backend, _folder(registry.generation_defaults, model))
    request = _parse_fields({**fields, "logprobs": body.get("logprobs")}, first, model, server)
    return Job(
        kind="completion",
        prompts=prompts,
        request=request,
        stream=stream,
        include_usage=_stream_options(body, stream),
        n=n,
        best_of=best_of,
        echo=echo,
    )


def check_caps(job: Job, caps: RequestCaps) -> None:
    """A 400 naming the cap when `job` asks more than `caps` allow one request: its rows times max_tokens, or the
    logprob entries its rows would accumulate (each token's own and its top ones; echoed prompts are bounded by the
    specification's limit of a request's prompt tokens)."""
    rows, tokens = len(job.prompts) * job.best_of, job.request.max_new_tokens
    if rows * tokens > caps.max_request_tokens:
        raise APIError(
            400,
            f"{rows} choices x max_tokens {tokens:,} = {rows * tokens:,} tokens is over this server's limit of "
            f"{caps.max_request_tokens:,} tokens a request (--max-request-tokens): ask for fewer choices or tokens",
            "max_tokens",
        )
    if job.logprobs is None:
        return
    entries = rows * tokens * (job.logprobs + 1)
    if entries > caps.max_request_logprobs:
        raise APIError(
            400,
            f"{rows} choices x max_tokens {tokens:,} x {job.logprobs + 1} logprobs a token = {entries:,} logprobs is "
            f"over this server's limit of "
            f"{caps.max_request_logprobs:,} a request (--max-request-logprobs): ask for fewer choices, tokens or "
            f"top logprobs",
            "logprobs",
        )


def _check_prompts(prompts: list, rows_each: int) -> None:
    """Every prompt's length, and their sum times the rows each gets, within the specification's limits
    (`spec.check_prompts`): token-id prompts and a list's later prompts too, before anything is decoded."""
    try:
        check_prompts(prompts, rows_each)
    except RequestError as e:
        raise APIError(400, str(e), e.field) from None


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


CHAT_WIRE = ("model", "messages", "stream", "stream_options", "n", "logprobs", "top_logprobs", "speakers")


def parse_chat(body: Any, registry: ModelRegistry, default_backend: str, max_tokens_limit: int | None = None) -> Job:
    """A `/v1/chat/completions` body: the messages in the model's chat format (`gpt_serve.serving.chat`), the reply
    ending with the speech; APIError naming the bad field otherwise."""
    model, fields = _common(body, registry, CHAT_WIRE)
    if "prompt" in fields:  # the messages make the prompt: a prompt beside them would be silently replaced
        raise APIError(400, "prompt is not a chat field: send the conversation as messages", "prompt")
    fmt = _folder(registry.chat_format, model)
    if fmt is None:
        raise APIError(
            400, f"the model {model!r} has no chat format (its vocabulary cannot write one): use /v1/completions",
            "messages",
        )  # fmt: skip
    try:
        prompt = chat.render(body.get("messages"), body.get("speakers"), fmt)
    except RequestError as e:
        raise APIError(400, str(e), e.field or "messages") from None
    stream = _flag(body, "stream")
    logprobs = _flag(body, "logprobs")
    top = _top_logprobs(body.get("top_logprobs"), logprobs)
    n = _choices(body, "n", 1)
    _check_prompts([prompt], n)
    server = (max_tokens_limit, default_backend, _folder(registry.generation_defaults, model))
    request = _parse_fields({**fields, "logprobs": top if logprobs else None}, prompt, model, server)
    return Job(
        kind="chat",
        prompts=[prompt],
        request=request,
        stream=stream,
        include_usage=_stream_options(body, stream),
        n=n,
        best_of=n,
        end=chat.END_OF_SPEECH,  # the reply is one speech (a constraint's text, then the end of the speech)
    )


def _top_logprobs(top: Any, logprobs: bool) -> int:
    """Chat's `top_logprobs`: an integer in the range of the specification's `logprobs`, only with logprobs: true."""
    if top is None:
        return 0
    if not logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    try:
        return check_value("logprobs", top)
    except RequestError as e:
        raise APIError(400, "top_" + str(e), "top_logprobs") from None


def completion_logprobs(vocab, ids: list[int], entries: list, offset: int) -> dict:
    """OpenAI's completions `logprobs` object for tokens `ids` (`entries`: None or (logprob, top) each), the first
    token's text at character `offset` of the answer's text."""
    tokens = [vocab.chars[t] for t in ids]
    return {
        "tokens": tokens,
        "token_logprobs": [None if e is None else e[0] for e in entries],
        "top_logprobs": [None if e is None else {vocab.chars[t]: lp for t, lp in e[1]} for e in entries],
        "text_offset": [offset + i for i in range(len(tokens))],  # one character per token
    }


def chat_logprobs(vocab, ids: list[int], entries: list) -> dict:
    """OpenAI's chat `logprobs` object (`choices[].logprobs.content`)."""

    def item(t: int, lp: float) -> dict:
        c = vocab.chars[t]
        return {"token": c, "logprob": lp, "bytes": list(c.encode("utf-8"))}

    return {
        "content": [{**item(t, e[0]), "top_logprobs": [item(i, lp) for i, lp in e[1]]} for t, e in zip(ids, entries)]
    }


def best_choices(job: Job, choices: list) -> list:
    """The n best of each prompt's best_of choices (by their text's logprob), numbered 0.. in order."""
    if job.best_of == job.n:
        return choices
    kept = []
    for k in range(0, len(choices), job.best_of):
        kept += sorted(choices[k : k + job.best_of], key=lambda c: -c.score)[: job.n]
    return kept


def usage(choices: list, job: Job) -> dict[str, int]:
    prompt = sum(len(c.text.prompt_ids) for c in choices[:: job.best_of])  # each prompt once
    completion = sum(c.text.tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _completion_choice(job: Job, choice, index: int, echoed) -> dict:
    t, vocab = choice.text, choice.text.vocab
    text, logprobs = t.text, None
    ids = vocab.encode(t.text)
    if job.logprobs is not None:
        entries = t.logprobs
        if echoed is not None:
            ids, entries = [*t.prompt_ids, *ids], [*echoed, *entries]
        logprobs = completion_logprobs(vocab, ids, entries, 0)
    if job.echo:
        text = t.prompt + t.text
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": t.finish_reason}


def _chat_choice(job: Job, choice, index: int) -> dict:
    t = choice.text
    logprobs = chat_logprobs(t.vocab, t.vocab.encode(t.text), t.logprobs) if job.logprobs is not None else None
    message = {"role": "assistant", "content": t.text}
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": t.finish_reason}


def answer(job: Job, choices: list, cid: str, echoed) -> dict:
    """The whole answer (not streamed) of `choices` (the API's, each a `TextStream` as `.text`), in OpenAI's format;
    `echoed`: the prompts' own logprobs, per prompt, for `echo`."""
    kept = best_choices(job, choices)
    if job.kind == "chat":
        out = [_chat_choice(job, c, i) for i, c in enumerate(kept)]
        kind = "chat.completion"
    else:
        per_prompt = [echoed[i // job.n] if echoed else None for i in range(len(kept))]
        out = [_completion_choice(job, c, i, e) for i, (c, e) in enumerate(zip(kept, per_prompt))]
        kind = "text_completion"
    return {
        "id": cid,
        "object": kind,
        "created": int(time.time()),
        "model": job.model,
        "choices": out,
        "usage": usage(choices, job),
    }
