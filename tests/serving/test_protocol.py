"""The API's request (`protocol.Job`): OpenAI's own fields beside the one generation request, which holds the model,
the backend and the logprobs (no second copy of them)."""

from __future__ import annotations

from dataclasses import fields

from gpt_serve.generation.spec import GenerationRequest
from gpt_serve.serving.protocol import Job, parse_chat, parse_completion


def test_a_job_holds_no_copy_of_its_generation_request(registry):
    job = parse_completion({"model": "tiny", "prompt": "ROMEO:", "logprobs": 2, "n": 2}, registry, "onnx")
    assert not {f.name for f in fields(Job)} & {f.name for f in fields(GenerationRequest)} - {"stream"}
    assert (job.request.model, job.request.backend, job.request.logprobs) == ("tiny", "onnx", 2)
    assert (job.model, job.backend, job.logprobs, job.n) == ("tiny", "onnx", 2, 2)
    job = parse_completion({"model": "tiny", "prompt": "ROMEO:", "backend": "torch"}, registry, "onnx")
    assert (job.backend, job.logprobs) == ("torch", None)  # the request's own backend over the server's default
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hail."}], "logprobs": True, "top_logprobs": 3}
    job = parse_chat(chat, registry, "torch")
    assert (job.kind, job.model, job.backend, job.logprobs) == ("chat", "tiny", "torch", 3)
