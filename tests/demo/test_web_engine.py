"""The browser page's JavaScript (`demo/web/`) against the Python library, under Node 20 with onnxruntime-web's
WebAssembly build (no browser, so it runs by default): the JS engine cannot drift from the Python one, nor the JS
form from the request specification, without a test failing.

`web_engine.mjs`, beside this file, runs the page's modules on tables of cases in one Node process:

- greedy runs (`RUNS`): the page's form read (`form.js`), then its engine (`engine.js`, `model.js`) on the shipped
  model's fp32 graph, against `generate_tokens` with `SamplingParams(temperature=0)` on an `OnnxBackend` that
  computes as the page does (`int8_compute=False, inplace=False`: the Hugging Face layout graph at every step, see
  tests/demo/test_web_page.py): the prompt's ids and every token, case by case;
- the form's messages (`FORMS`): each field's limit just past its edge and at it, text that is no number,
  characters outside the vocabulary; the JS message must be `parse_request`'s or `encode_prompt`'s for the value the
  form sends, word for word, and a value the specification accepts must be read as it reads it;
- the constants the JS keeps of its own (window modes, unknown-character policies, the ONNX contract's names).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from demo.browser import WEB_DIR
from gpt_serve import onnx_contract
from gpt_serve.chargpt.vocab import UNK_POLICIES, CharVocab
from gpt_serve.chargpt.window import WINDOW_MODES
from gpt_serve.generation import generate_tokens
from gpt_serve.generation.backends.onnx_backend import OnnxBackend
from gpt_serve.generation.fields import FIELDS_BY_NAME, RANDOM_SEEDS, RequestError
from gpt_serve.generation.text import UNK_HINT
from gpt_serve.models import model_path
from tests.demo.conftest import PAGE_FORM, python_reads_form

HARNESS = Path(__file__).with_name("web_engine.mjs")
SHIPPED = model_path("shakespeare")  # block_size 128
ONNX_FILE = f"{onnx_contract.ONNX_SUBDIR}/{onnx_contract.FP32_FILE_NAME}"
VOCAB = CharVocab.from_file(SHIPPED / "vocab.json")


@dataclass(frozen=True)
class Run:
    """A greedy run of the page's form: `prompt`, `new_tokens` tokens, `window_mode`."""

    name: str
    prompt: str
    new_tokens: int
    window_mode: str = "refill"

    def fields(self) -> dict[str, str]:
        changes = dict(prompt=self.prompt, max_new_tokens=str(self.new_tokens), window_mode=self.window_mode)
        return {**PAGE_FORM, "temperature": "0", **changes}


LONG_PROMPT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n" * 3)[:150]
RUNS = (
    Run("spaces", "ROMEO:  and   JULIET, with  two spaces ", 40),
    Run("newlines", "First Citizen:\nBefore we proceed\n\n\nAll:\n", 40),
    Run("punctuation", "Nay, 'tis true! What?-- Ay; & $3... O, -- farewell:", 40),
    Run("every vocabulary character", "".join(VOCAB.chars), 100, "exact"),  # 65 + 100 tokens: past block_size
    Run("the empty prompt", "", 40),  # starts after a newline (id 0)
    Run("the empty prompt, exact past block_size", "", 150, "exact"),
    Run("exact past block_size", "ROMEO:", 180, "exact"),  # 58 full-window steps
    Run("refill past block_size", "ROMEO:", 200, "refill"),  # two refills
    Run("a prompt longer than block_size, exact", LONG_PROMPT, 30, "exact"),
    Run("a prompt longer than block_size, refill", LONG_PROMPT, 80, "refill"),
)


@dataclass(frozen=True)
class Form:
    """The page's form with `changes` to PAGE_FORM (field name -> the text typed)."""

    name: str
    changes: dict[str, str] = field(default_factory=dict)

    def fields(self) -> dict[str, str]:
        return {**PAGE_FORM, **self.changes}


FORMS = (
    Form("the defaults"),
    Form("max_new_tokens at its top", {"max_new_tokens": "100000"}),
    Form("max_new_tokens 0", {"max_new_tokens": "0"}),
    Form("max_new_tokens past its top", {"max_new_tokens": "100001"}),
    Form("max_new_tokens written 1e3", {"max_new_tokens": "1e3"}),
    Form("max_new_tokens a fraction", {"max_new_tokens": "2.5"}),
    Form("max_new_tokens not a number", {"max_new_tokens": "12x"}),
    Form("max_new_tokens empty", {"max_new_tokens": ""}),
    Form("temperature 0", {"temperature": "0"}),
    Form("temperature at its top", {"temperature": " 2 "}),
    Form("temperature below 0", {"temperature": "-0.1"}),
    Form("temperature a hair below 0", {"temperature": "-1e-7"}),
    Form("temperature past its top", {"temperature": "2.1"}),
    Form("temperature one ulp past its top", {"temperature": "2.0000000000000004"}),
    Form("temperature infinite", {"temperature": "1e400"}),
    Form("temperature not a number", {"temperature": "hot"}),
    Form("top_k at its top", {"top_k": "1000000"}),
    Form("top_k below 0", {"top_k": "-1"}),
    Form("top_k past its top", {"top_k": "1000001"}),
    Form("top_k a fraction", {"top_k": "2.5"}),
    Form("top_p at its top", {"top_p": "1"}),
    Form("top_p 0", {"top_p": "0"}),
    Form("top_p -0", {"top_p": "-0"}),
    Form("top_p that rounds to 0", {"top_p": "1e-400"}),
    Form("top_p past its top", {"top_p": "1.0001"}),
    Form("seed 0", {"seed": "0"}),
    Form("seed at its top", {"seed": "9007199254740991"}),
    Form("seed -1 (random)", {"seed": "-1"}),
    Form("seed -2", {"seed": "-2"}),
    Form("seed past its top", {"seed": "9007199254740992"}),
    Form("seed past its top, not a double", {"seed": "9007199254740993"}),
    Form("seed of 71 digits", {"seed": "1" + "0" * 70}),
    Form("seed a fraction", {"seed": "1.5"}),
    Form("seed not a number", {"seed": "abc"}),
    Form("window_mode exact", {"window_mode": "exact"}),
    Form("window_mode unknown", {"window_mode": "sideways"}),
    Form("unk_policy unknown", {"unk_policy": "ignore"}),
    Form("the empty prompt", {"prompt": ""}),
    Form("a prompt at its top", {"prompt": "x" * 10_000}),
    Form("a prompt past its top", {"prompt": "x" * 10_001}),
    Form("one unknown character", {"prompt": "café"}),
    Form("unknown characters", {"prompt": "ROMEO: ¿qué?"}),
    Form("twelve unknown characters", {"prompt": "é" * 12}),
    Form("escaped unknown characters", {"prompt": 'a\ttab, "quotes", back\\slash, zero\u200bwidth, nul\x00, 😀'}),
    Form("unknown characters replaced", {"prompt": "¿qué?", "unk_policy": "replace"}),
    Form("unknown characters dropped", {"prompt": "¿qué?", "unk_policy": "drop"}),
    Form("nothing left once dropped", {"prompt": "¿é", "unk_policy": "drop"}),
)


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> dict:
    """Every case run once by web_engine.mjs in one Node process (the model loaded once)."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: install Node.js 20 (it also runs `npm ci` for the page, `make install`)")
    if not (WEB_DIR / "node_modules" / "onnxruntime-web").is_dir():
        pytest.fail(f"{WEB_DIR / 'node_modules'} is incomplete: run `make install` (npm ci in demo/web)")
    cases = dict(
        model_dir=str(SHIPPED),
        onnx_file=ONNX_FILE,
        forms=[dict(name=f.name, fields=f.fields()) for f in FORMS],
        runs=[dict(name=r.name, fields=r.fields()) for r in RUNS],
    )
    path = tmp_path_factory.mktemp("web-engine") / "cases.json"
    path.write_text(json.dumps(cases), encoding="utf-8")
    done = subprocess.run([node, str(HARNESS), str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{HARNESS.name} failed:\n{done.stderr}"
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def python_backend() -> OnnxBackend:
    return OnnxBackend(SHIPPED, quantized=False, threads=1, int8_compute=False, inplace=False)


@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
def test_greedy_tokens_are_the_python_engines(node, python_backend, run):
    request, prompt_ids = python_reads_form(run.fields(), VOCAB)
    steps = generate_tokens(
        python_backend, [prompt_ids], request.max_new_tokens, request.sampling, window_mode=run.window_mode
    )
    expected = [int(step[0]) for step in steps]
    got = node["runs"][run.name]
    assert "message" not in got, f"{run.name}: the page refused the run: {got}"
    assert got["promptIds"] == prompt_ids, f"{run.name}: the page encodes the prompt differently"
    assert len(got["ids"]) == len(expected) == run.new_tokens, run.name
    first = next((i for i, (a, b) in enumerate(zip(got["ids"], expected)) if a != b), None)
    assert first is None, (
        f"{run.name}: the page's token {first} is {got['ids'][first]} ({VOCAB.decode([got['ids'][first]])!r}), "
        f"the Python engine's {expected[first]} ({VOCAB.decode([expected[first]])!r}), "
        f"after {VOCAB.decode(expected[:first])[-40:]!r}"
    )


@pytest.mark.parametrize("form", FORMS, ids=[f.name for f in FORMS])
def test_the_form_reads_each_field_as_the_specification_does(node, form):
    got = node["forms"][form.name]
    try:
        request, prompt_ids = python_reads_form(form.fields(), VOCAB)
    except RequestError as e:
        assert got.get("message") == str(e), f"{form.name}: the page says {got}"
        assert got["field"] == e.field.replace("_", "-"), f"{form.name}: the page marks another input"
        return
    assert "message" not in got, f"{form.name}: the page refuses what the specification accepts: {got['message']}"
    page = got["request"]
    assert page["promptIds"] == prompt_ids, form.name
    read = (page["maxNewTokens"], page["windowMode"], page["unkPolicy"], page["refillTokens"])
    assert read == (request.max_new_tokens, request.window_mode, request.unk_policy, request.refill_tokens)
    sampling = page["sampling"]
    assert (sampling["temperature"], sampling["topK"], sampling["topP"], sampling["repetitionPenalty"]) == (
        request.temperature,
        request.top_k or None,
        request.top_p,
        request.repetition_penalty,
    ), form.name
    assert page["seedWasRandom"] == request.seed_was_random, form.name
    if request.seed_was_random:  # drawn on each side: the same range
        assert 0 <= page["seed"] < RANDOM_SEEDS and 0 <= request.seed < RANDOM_SEEDS
    else:
        assert page["seed"] == request.seed, form.name


def test_the_constants_the_javascript_keeps_are_the_librarys(node):
    js = node["constants"]
    assert js["WINDOW_MODES"] == list(WINDOW_MODES) == list(FIELDS_BY_NAME["window_mode"].choices)
    assert js["UNK_POLICIES"] == list(UNK_POLICIES) == list(FIELDS_BY_NAME["unk_policy"].choices)
    assert js["UNK_HINT"] == UNK_HINT  # the API's words; the page's form passes its own (form.json)
    assert js["ONNX_SUBDIR"] == f"{onnx_contract.ONNX_SUBDIR}/"
    assert js["ONNX_FILES"] == [onnx_contract.INT8_FILE_NAME, onnx_contract.FP32_FILE_NAME]
    assert js["INPUT_NAMES"] == list(onnx_contract.INPUT_NAMES) and js["LOGITS_NAME"] == onnx_contract.LOGITS_NAME
    assert (js["ONNX_FORMAT"], js["ONNX_FORMAT_VERSION"]) == (
        onnx_contract.ONNX_FORMAT,
        onnx_contract.ONNX_FORMAT_VERSION,
    )
    assert js["REQUIRED_METADATA"] == list(onnx_contract.REQUIRED_METADATA)
    assert js["pastNames"] == onnx_contract.past_names(2) and js["presentNames"] == onnx_contract.present_names(2)
