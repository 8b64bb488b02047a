"""The OpenAI-compatible API, driven by the official `openai` client against a server on 127.0.0.1."""

from __future__ import annotations

import socket
import time

import httpx
import openai
import pytest

from gpt_serve.generation import SamplingParams, generate_text
from gpt_serve.serving.registry import ModelRegistry
from tests.helpers import serving, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def api(models_root):
    """The API alone (`gpt_serve.serving.api.create_app`) over its own registry: 2 rows at once, 2 waiting at most."""
    from gpt_serve.serving.api import create_app

    registry = ModelRegistry.discover(models_root=models_root, expected=(), threads=1, max_batch=2, max_queue=2)
    with serving(create_app(registry)) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0), url, registry


def expected(registry, prompt: str, n: int, seed: int, backend: str = "torch", temperature: float | None = None) -> str:
    """The engine's text for the request alone (the temperature of a request that names none: the folder's)."""
    loaded = registry.backend("tiny", backend)
    temperature = registry.generation_defaults("tiny")["temperature"] if temperature is None else temperature
    return generate_text(loaded.backend, loaded.vocab, prompt, n, SamplingParams(temperature), seed=seed)


def test_models_and_health(api):
    client, url, _ = api
    assert "tiny" in [m.id for m in client.models.list().data]
    assert httpx.get(f"{url}/health").json()["status"] == "ok"


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_completion_is_the_engines_text_for_its_seed(api, backend):
    client, _, registry = api
    out = client.completions.create(
        model="tiny", prompt="ROMEO:", max_tokens=30, temperature=0.8, seed=5, extra_body={"backend": backend}
    )
    assert out.object == "text_completion" and out.choices[0].finish_reason == "length"
    assert out.choices[0].text == expected(registry, "ROMEO:", 30, 5, backend, temperature=0.8)
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (6, 30, 36)


def test_streaming_gives_the_same_text_in_chunks_ending_with_done(api):
    client, url, registry = api
    chunks = list(client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=40, seed=7, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == expected(registry, "ROMEO:", 40, 7)
    assert chunks[-1].choices[0].finish_reason == "length" and len(chunks) > 2
    body = {"model": "tiny", "prompt": "A", "max_tokens": 3, "stream": True}
    assert httpx.post(f"{url}/v1/completions", json=body).text.rstrip().endswith("data: [DONE]")


def test_a_list_of_prompts_gets_one_choice_each_and_usage_in_the_stream(api):
    client, _, registry = api
    out = client.completions.create(model="tiny", prompt=["ROMEO:", "JULIET:"], max_tokens=12, seed=3)
    assert [c.index for c in out.choices] == [0, 1]
    assert [c.text for c in out.choices] == [expected(registry, "ROMEO:", 12, 3), expected(registry, "JULIET:", 12, 4)]
    chunks = list(
        client.completions.create(
            model="tiny", prompt=["A", "B"], max_tokens=5, seed=1, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].usage.completion_tokens == 10 and chunks[-1].choices == []


def test_a_stop_sequence_ends_the_text_before_it(api):
    client, _, registry = api
    free = expected(registry, "ROMEO:", 60, 11)
    stop = free[20:22]
    out = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=60, seed=11, stop=[stop, "@@"])
    assert out.choices[0].text == free[: free.index(stop)] and out.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=60, seed=11, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == free[: free.index(stop)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(temperature=5), "temperature must be a number in [0, 2] (0 = greedy), got 5"),
        (dict(max_tokens=0), "max_new_tokens must be an integer in [1, 100000], got 0"),
        (dict(top_p=0), "top_p must be a number in (0, 1], got 0"),
        (dict(n=0), "n must be an integer in [1, 16], got 0"),
        (dict(prompt="ROMEO é"), "1 character outside this model's vocabulary: 'é' (position 6)"),
        (dict(prompt=[[1, 2], "x", []]), "prompt 2 must be a string or a non-empty list of token ids"),
        (dict(stop=["a", "b", "c", "d", "e"]), "stop must be a string or a list of at most 4"),
        (dict(extra_body={"window_mode": "slide"}), "window_mode must be one of ['exact', 'refill']"),
        (dict(extra_body={"top_k": -1}), "top_k must be an integer in [0, 1000000] (0 = no limit), got -1"),
        (dict(extra_body={"backend": "cuda"}), "backend must be one of 'torch' (PyTorch), 'onnx' (ONNX Runtime fp32)"),
        (dict(extra_body={"nucleus": 0.1}), "unknown field 'nucleus'; the fields are ['prompt', 'max_new_tokens'"),
        (dict(extra_body={"min_p": 2}), "min_p must be a number in [0, 1] (0 = off), got 2"),
        (dict(frequency_penalty=3), "frequency_penalty must be a number in [-2, 2] (0 = off), got 3"),
        (dict(n=17), "n must be an integer in [1, 16], got 17"),
        (dict(n=2, best_of=1), "best_of (1) must be at least n (2)"),
        (dict(best_of=2, stream=True), "best_of greater than n cannot stream"),
        (dict(logprobs=21), "logprobs must be an integer in [0, 20], got 21"),
        (dict(prompt=[1, 2, 999]), "prompt holds ids [999] outside the vocabulary [0, 64]"),
        (dict(logit_bias={"1": 500}), "logit_bias must map token ids to numbers in [-100, 100]"),
        (dict(extra_body={"refill_tokens": 16}), "refill_tokens must be an integer in [1, block_size - 1] = [1, 15]"),
    ],
)
def test_bad_requests_get_a_400_naming_the_problem(api, kwargs, message):
    client, _, _ = api
    args = dict(model="tiny", prompt="ROMEO:", max_tokens=5) | kwargs
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(**args)
    assert message in error.value.message


def test_an_unknown_model_is_a_404_and_a_missing_export_a_503(api):
    client, _, _ = api
    with pytest.raises(openai.NotFoundError, match="the model 'gpt-4' does not exist"):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    with pytest.raises(openai.InternalServerError, match="is not available for model 'ladder-a'"):
        client.completions.create(model="ladder-a", prompt="x", max_tokens=2, extra_body={"backend": "onnx"})


BAD_CONFIGS = {  # issue 32: each was a 500 (or no answer) before the config's numbers were bounded
    "huge-block": ({"block_size": 10**400}, "block_size must be a positive integer of at most 65,536"),
    "code-dtype": ({"dtype": "__import__('os')"}, "dtype must be one of ['float32', 'float16', 'bfloat16']"),
    "million-layers": ({"n_layer": 1000000}, "n_layer must be a positive integer of at most 256, got 1000000"),
}


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_model_whose_config_is_out_of_bounds_is_a_503_naming_the_field(models_root, tmp_path, backend):
    import shutil

    from gpt_serve.serving.api import create_app
    from tests.conftest import edit_json

    for name, (change, _) in BAD_CONFIGS.items():
        shutil.copytree(models_root / "tiny", tmp_path / name)
        edit_json(tmp_path / name / "config.json", lambda c, change=change: c.update(change))
    registry = ModelRegistry.discover(models_root=tmp_path, expected=(), threads=1)
    with serving(create_app(registry)) as url:
        for name, (_, message) in BAD_CONFIGS.items():
            body = {"model": name, "prompt": "ROMEO:", "max_tokens": 2, "backend": backend}
            response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            assert response.status_code == 503, (name, response.text)
            assert message in response.json()["error"]["message"], response.text


def test_a_full_queue_is_a_429_and_a_client_that_leaves_frees_its_row(api):
    client, url, registry = api
    long = {"model": "tiny", "prompt": "ROMEO:", "max_tokens": 2000, "stream": True, "window_mode": "refill"}
    scheduler = registry.scheduler("tiny", "torch")
    with httpx.Client(timeout=30) as http:
        streams, responses = [], []
        for active, waiting in ((1, 0), (2, 0), (2, 1), (2, 2)):  # 2 rows decoding, then 2 waiting
            streams.append(http.stream("POST", f"{url}/v1/completions", json=long))
            responses.append(streams[-1].__enter__())
            assert responses[-1].status_code == 200
            expected = {"active": active, "waiting": waiting}
            assert wait_until(lambda e=expected: {k: scheduler.stats()[k] for k in e} == e), scheduler.stats()
        with pytest.raises(openai.RateLimitError, match="server busy"):
            client.completions.create(model="tiny", prompt="x", max_tokens=2)
        next(responses[0].iter_lines())
        for s in streams:  # the clients go away mid-stream
            s.__exit__(None, None, None)
    assert wait_until(lambda: scheduler.stats()["active"] == 0 and scheduler.stats()["waiting"] == 0)
    steps = scheduler.stats()["steps"]
    time.sleep(0.1)
    assert scheduler.stats()["steps"] == steps  # no forward pass for them any more
    metrics = httpx.get(f"{url}/metrics").text
    assert 'gpt_serve_num_requests_running{backend="torch",model="tiny"} 0.0' in metrics
    assert "gpt_serve_time_to_first_token_seconds_count" in metrics
