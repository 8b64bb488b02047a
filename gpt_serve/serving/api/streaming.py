"""A streamed completions or chat answer: OpenAI's server-sent chunks (`data: {...}`), ending with `data: [DONE]`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from ...generation.requests import EngineError
from ..launcher import Drain
from ..protocol import Job, chat_logprobs, completion_logprobs, error_body, usage
from .choices import Choice, end_choices
from .errors import model_failure


async def events(job: Job, choices: list[Choice], cid: str, created: int, drain: Drain) -> AsyncIterator[str]:
    """OpenAI's server-sent chunks, choice after choice (each stream keeps its tokens meanwhile); the rows are
    cancelled when the client goes away (the task is cancelled). A model that fails the request (`EngineError`)
    ends the stream with an error event (OpenAI's clients raise it), then `[DONE]`."""
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
                yield chunk([choice_item(job, choice, piece, sent)])
                sent += len(piece)
        if job.include_usage:
            yield chunk([], usage(choices, job))
    except EngineError as e:
        yield f"data: {json.dumps(error_body(model_failure(e)))}\n\n"
        yield "data: [DONE]\n\n"
    else:
        yield "data: [DONE]\n\n"
    finally:  # after [DONE] has left: the drain waits for it
        end_choices(choices, drain)


def choice_item(job: Job, choice: Choice, piece: str, sent: int) -> dict:
    """A chunk's item for `piece`, the choice's text after its first `sent` characters."""
    chat, logprobs, t = job.kind == "chat", None, choice.text
    if job.logprobs is not None:
        held = t.stream.logprobs  # one entry per token (a character): forgotten once sent
        ids, entries = t.vocab.encode(piece), held[sent : sent + len(piece)]
        held.release(sent + len(piece))
        logprobs = chat_logprobs(t.vocab, ids, entries) if chat else completion_logprobs(t.vocab, ids, entries, sent)
    item = {"index": choice.index, "logprobs": logprobs, "finish_reason": t.finish_reason}
    item.update({"delta": {"content": piece} if piece else {}} if chat else {"text": piece})
    return item
