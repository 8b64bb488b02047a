"""Numbers that would make NaN: a temperature too small to divide by is greedy, and NaN or infinite logits are never
sampled (the request ends with an `EngineError` naming the backend; the other requests go on), on every surface."""

from __future__ import annotations

import json
import shutil

import httpx
import numpy as np
import pytest

from gpt_serve.generation import EngineError, SamplingParams, generate_text, load_backend
from gpt_serve.generation.requests import Request, Stream
from gpt_serve.generation.rows import Row, next_tokens
from gpt_serve.generation.sampling import GREEDY_BELOW
from gpt_serve.generation.scheduler import Scheduler
from tests.sampler import sample_next, sample_rows

from .conftest import FakeBackend

TINY = (5e-324, 1e-320, 1e-300, GREEDY_BELOW / 2)  # the smallest float, the CLI value, ..., just below


@pytest.mark.parametrize("temperature", TINY)
def test_a_tiny_temperature_is_greedy_and_draws_nothing(temperature):
    logits = np.array([[0.5, 2.0, 1.9, -3.0], [4.0, 1.0, 4.0, 0.0]], dtype=np.float32)
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature)
    assert params.greedy and not SamplingParams(GREEDY_BELOW).greedy
    assert sample_next(logits, params, rng).tolist() == [1, 0]  # the first of equal maxima, as argmax
    assert sample_rows(logits, [params, SamplingParams(0)], [rng, rng]).tolist() == [1, 0]
    assert rng.random() == np.random.default_rng(0).random()  # no uniform number was drawn


def test_the_smallest_temperature_that_samples_gives_finite_probabilities():
    logits = np.array([[0.5, 2.0, 2.0 - 1e-4, -3.0]], dtype=np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no overflow, no NaN on the way
        assert sample_next(logits, SamplingParams(GREEDY_BELOW), np.random.default_rng(1)).tolist()[0] in (1, 2)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_logits_are_refused_by_the_sampler(bad):
    logits = np.zeros((2, 5), dtype=np.float32)
    logits[1, 3] = bad
    for params in (SamplingParams(0), SamplingParams(0.8)):
        rows = [Row(Stream(Request([1], 5, params, seed=s), None), 16, 5) for s in (0, 1)]
        out = next_tokens(rows, logits, "the backend")
        assert list(out.errors) == [1] and out.tokens[0] >= 0 and out.tokens[1] == -1
        assert "the backend computed NaN or infinite logits for token 1" in str(out.errors[1])
        with pytest.raises(ValueError, match=r"logits of row\(s\) \[1\] hold NaN or infinite values"):
            sample_next(logits, params, np.random.default_rng(0))
        with pytest.raises(ValueError, match="NaN or infinite"):
            sample_rows(logits, [params, SamplingParams(1.0)], [np.random.default_rng(0)] * 2)


class NanOnTokenBackend(FakeBackend):
    """The fake, except that a window starting with token 3 gives NaN logits (an overflow only some inputs reach)."""

    description = "the fake backend"

    def logits_of(self, ids, mask):
        logits = super().logits_of(ids, mask)
        logits[ids[np.arange(len(ids)), mask.argmax(axis=1)] == 3] = np.nan
        return logits


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_row_with_nan_logits_ends_alone_and_the_others_go_on(temperature):
    backend = NanOnTokenBackend(vocab_size=11)
    scheduler = Scheduler(backend, max_batch=4)
    try:
        sampling = SamplingParams(temperature)
        good = [scheduler.submit(Request([1, 2], 5, sampling, seed=s)) for s in (0, 1)]  # inside the window of 8
        bad = scheduler.submit(Request([3], 5, sampling, seed=2))
        with pytest.raises(EngineError, match="the fake backend computed NaN or infinite logits for token 1 of"):
            list(bad)
        # the good rows get the tokens they get alone: none lost to the failed row, none sampled from NaN
        alone = Scheduler(FakeBackend(vocab_size=11))
        try:
            assert [list(s) for s in good] == [list(alone.submit(Request([1, 2], 5, sampling, seed=s))) for s in (0, 1)]
        finally:
            alone.close()
    finally:
        scheduler.close()


@pytest.fixture(scope="module")
def overflowing_dir(tmp_path_factory, tiny_model_dir):
    """A tiny model whose weights are finite but so large that its logits overflow to inf (and NaN)."""
    from gpt_serve import CharGPTForCausalLM

    folder = shutil.copytree(tiny_model_dir, tmp_path_factory.mktemp("overflow") / "overflow")
    model = CharGPTForCausalLM.from_pretrained(folder)
    with __import__("torch").no_grad():
        model.lm_head.weight.fill_(3e38)  # finite, but a sum of 32 of them is not
    model.save_pretrained(folder)
    return folder


def test_a_model_whose_logits_overflow_is_an_engine_error_naming_it(overflowing_dir):
    loaded = load_backend(overflowing_dir, "torch", threads=1)  # every weight is finite: it loads
    with pytest.raises(EngineError, match=rf"torch backend \(PyTorch\) of {overflowing_dir}.* NaN or infinite logits"):
        generate_text(loaded.backend, loaded.vocab, "ROMEO:", 5, SamplingParams(0.8), seed=0)


def test_gpt_serve_generate_exits_2_naming_the_model(overflowing_dir, capsys):
    from gpt_serve.cli import main

    code = main(["generate", str(overflowing_dir), "--max-new-tokens", "3", "--threads", "1", "--seed", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "NaN or infinite logits" in err and str(overflowing_dir) in err


@pytest.mark.parametrize("backend", ["torch", "onnx", "onnx-int8"])
def test_tiny_temperatures_give_the_greedy_text_on_every_backend(exported_dir, backend):
    loaded = load_backend(exported_dir, backend, threads=1)
    greedy = generate_text(loaded.backend, loaded.vocab, "ROMEO:", 20, SamplingParams(0), seed=0)
    for temperature in (5e-324, 1e-320):
        assert generate_text(loaded.backend, loaded.vocab, "ROMEO:", 20, SamplingParams(temperature), seed=3) == greedy


@pytest.fixture(scope="module")
def api_url(overflowing_dir, exported_dir, tmp_path_factory):
    """The API over two models: `overflow` (logits overflow) and `tiny` (a good one)."""
    from gpt_serve.serving.api import create_app
    from gpt_serve.serving.registry import ModelRegistry
    from tests.helpers import serving

    root = tmp_path_factory.mktemp("api-models")
    shutil.copytree(exported_dir, root / "tiny")
    shutil.copytree(overflowing_dir, root / "overflow")
    registry = ModelRegistry.discover(models_root=root, expected=(), threads=1, max_batch=4)
    with serving(create_app(registry)) as url:
        yield url
    registry.close()


def test_the_api_answers_a_model_error_and_goes_on_serving(api_url):
    body = {"model": "overflow", "prompt": "ROMEO:", "max_tokens": 5, "temperature": 5e-324}
    answer = httpx.post(f"{api_url}/v1/completions", json=body, timeout=30)
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == ("model_error", "model_error")
    assert "NaN or infinite logits" in error["message"] and "overflow" in error["message"]
    events = httpx.post(f"{api_url}/v1/completions", json={**body, "stream": True}, timeout=30).text.split("\n\n")
    data = [e.removeprefix("data: ") for e in events if e]
    assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["code"] == "model_error"
    good = httpx.post(f"{api_url}/v1/completions", json={**body, "model": "tiny", "temperature": 1e-320}, timeout=30)
    greedy = httpx.post(f"{api_url}/v1/completions", json={**body, "model": "tiny", "temperature": 0}, timeout=30)
    assert good.status_code == 200 and good.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
