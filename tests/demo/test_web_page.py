"""The in-browser page (`demo/web/`: onnxruntime-web, WASM) in Debian's headless Chromium, served the two ways the
README gives: as a static site by Python's http.server (`demo/web` itself, whose `ort` and `model` links point at
node_modules and the shipped model), and by the demo at /browser/.

Greedy decoding gives exactly the Python engine's tokens (`OnnxBackend`) for 300 tokens past block_size, in both
window modes, on the int8 graph (the page's default) and on the fp32 one. The page computes the int8 file in fp32
(its int8 weights dequantized once at load) on the Hugging Face layout graph, so it is compared with
`OnnxBackend(..., int8_compute=False, inplace=False)`, which does the same. Prints the in-browser tokens/s (the
README's figures come from this test). The form starts from the request specification's defaults and says what
`gpt_serve` says of a bad field, word for word (tests/demo/test_web_engine.py compares every limit under Node).
"""

from __future__ import annotations

import functools
import shutil
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from demo.browser import ORT_DIST, PAGE_FILES, WEB_DIR, browser_files, missing_files
from demo.form import FORM
from gpt_serve.chargpt.vocab import CharVocab
from gpt_serve.folders.corpus_record import read_corpus_record
from gpt_serve.generation import SamplingParams, generate_tokens
from gpt_serve.generation.backends.onnx_backend import OnnxBackend
from gpt_serve.generation.fields import RequestError
from gpt_serve.generation.sampling import GREEDY_BELOW, draw, probabilities
from gpt_serve.models import model_path
from tests.demo.conftest import PAGE_FORM, python_reads_form, wait_until

pytestmark = pytest.mark.browser

PROMPT = "ROMEO:"
NEW_TOKENS = 300  # 6 + 300 > block_size 128: both window modes slide past it
GRAPHS = ("int8", "fp32")  # the page's default, onnx/model_quantized.onnx, and ?onnx=model.onnx
UNKNOWN_MESSAGE = (
    "the prompt has 2 characters outside this model's vocabulary: '¿' (position 7), 'é' (position 10). Remove them, "
    'or choose "replace each with a space" or "drop them" under "Characters outside the vocabulary" (in Sampling)'
)  # the page's control, as the demo names it (demo.form), not the API's unk_policy
VOCAB = CharVocab.from_file(model_path("shakespeare") / "vocab.json")


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A static site by Python's http.server: demo/web as is at /page/ (as `cd demo/web && python -m http.server`
    serves it), and beside it model folders whose ONNX file lacks block_size in its metadata, or is not ONNX."""
    if missing_files(browser_files(model_path("shakespeare"))):
        pytest.fail(f"{WEB_DIR / 'node_modules'} is incomplete: run `make install` (npm ci in demo/web)")
    root = tmp_path_factory.mktemp("site")
    (root / "page").symlink_to(WEB_DIR, target_is_directory=True)
    _model_without_block_size(root / "no-block-size")
    not_onnx = root / "not-onnx"  # what a server's fallback page would give
    shutil.copytree(root / "no-block-size", not_onnx)
    (not_onnx / "onnx" / "model_quantized.onnx").write_text("<!doctype html><p>Not here</p>")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _model_without_block_size(folder):
    import onnx

    shipped = model_path("shakespeare")
    (folder / "onnx").mkdir(parents=True)
    for name in ("config.json", "vocab.json"):
        shutil.copy(shipped / name, folder / name)
    graph = onnx.load(shipped / "onnx" / "model_quantized.onnx")
    kept = [p for p in graph.metadata_props if p.key != "block_size"]
    del graph.metadata_props[:]
    graph.metadata_props.extend(kept)
    onnx.save(graph, folder / "onnx" / "model_quantized.onnx")


def open_page(chromium, url: str, ready: bool = True):
    page = chromium.new_page(viewport={"width": 1100, "height": 1200})
    page.set_default_timeout(30_000)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    if ready:
        page.locator("#model-status.done").wait_for()
        assert not errors, errors
    return page


def page_generate(page, **options) -> dict:
    return page.evaluate("options => gptServe.generate(options)", options)


def timed_greedy(page, window_mode: str) -> dict:
    """The page's greedy run of the test, after a short warm-up run (a fresh page's first run is slower)."""
    page_generate(page, prompt=PROMPT, maxNewTokens=64, temperature=0, windowMode=window_mode)
    return page_generate(page, prompt=PROMPT, maxNewTokens=NEW_TOKENS, temperature=0, windowMode=window_mode)


def page_arithmetic(folder) -> dict[str, OnnxBackend]:
    """The Python engine's backends that compute as the page does: fp32, and int8 weights folded to fp32, every step
    on the Hugging Face layout graph (the page's one graph; the in-place decode graph rounds differently)."""
    return {
        graph: OnnxBackend(folder, quantized=graph == "int8", threads=1, int8_compute=False, inplace=False)
        for graph in GRAPHS
    }


@pytest.fixture(scope="module")
def python_backends():
    return page_arithmetic(model_path("shakespeare"))


def python_greedy(backend: OnnxBackend, window_mode: str, tokens: int = NEW_TOKENS) -> list[int]:
    prompt = backend.vocab.encode(PROMPT)
    greedy = SamplingParams(temperature=0)
    steps = generate_tokens(backend, [prompt], tokens, greedy, window_mode=window_mode)
    return [int(t[0]) for t in steps]


@pytest.mark.slow
@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("window_mode", ["exact", "refill"])
def test_greedy_gives_the_python_engines_tokens(chromium, site, python_backends, graph, window_mode):
    page = open_page(chromium, f"{site}/page/" + ("?onnx=model.onnx" if graph == "fp32" else ""))
    got = timed_greedy(page, window_mode)
    page.close()
    assert got["ids"] == python_greedy(python_backends[graph], window_mode)
    print(f"\nin-browser {graph} {window_mode}: {got['tokensPerSecond']:.0f} tok/s over {NEW_TOKENS} tokens")


def generated_length(page) -> int:
    return page.evaluate("document.getElementById('generated').textContent.length")


def test_the_page_streams_with_live_stats_and_stops(chromium, site):
    page = open_page(chromium, f"{site}/page/")
    page.locator("#max-new-tokens").fill("20000")
    page.locator("#seed").fill("7")
    page.locator("#generate-btn").click()
    assert wait_until(lambda: generated_length(page) > 10, timeout=15), "no output appeared"
    lengths = [generated_length(page)]
    for _ in range(3):
        time.sleep(0.3)
        lengths.append(generated_length(page))
    assert lengths == sorted(lengths) and lengths[-1] > lengths[0], f"the output did not grow: {lengths}"
    assert "tokens/s" in page.locator("#stats").inner_text() and "seed 7" in page.locator("#stats").inner_text()
    assert page.locator("#status").inner_text() == "Generating…"
    page.locator("#stop-btn").click()
    assert wait_until(lambda: page.locator("#status").inner_text() == "Stopped.", timeout=5)
    shown = generated_length(page)
    time.sleep(0.5)
    assert generated_length(page) == shown < 20_000, "the output kept growing after Stop"
    assert page.locator("#generate-btn").is_enabled() and not page.locator("#stop-btn").is_enabled()
    assert page.locator("#prompt-echo").inner_text() == PROMPT
    page.close()


def test_a_seed_repeats_a_sampled_run(chromium, site):
    page = open_page(chromium, f"{site}/page/")
    options = dict(prompt=PROMPT, maxNewTokens=60, temperature=0.8, topK=20, topP=0.9, windowMode="refill")
    first, again = (page_generate(page, seed=1337, **options) for _ in range(2))
    other = page_generate(page, seed=1338, **options)
    assert first["ids"] == again["ids"] and first["ids"] != other["ids"]
    page.close()


def test_the_sampler_computes_the_python_samplers_distribution(chromium, site):
    """sampling.js against gpt_serve.generation.sampling: the same filtered softmax and inverse-CDF draw."""
    page = open_page(chromium, f"{site}/page/", ready=False)
    rng = np.random.default_rng(0)
    cases = []
    settings = [(1.0, None, 1.0), (0.7, 5, 1.0), (1.3, None, 0.8), (0.5, 10, 0.6), (2.0, 64, 0.1)]
    for temperature, top_k, top_p in settings:
        logits = (rng.standard_normal(65) * 3).astype(np.float32)
        logits[[3, 9]] = logits.max()  # ties with the top value
        us = rng.random(8).tolist()
        cases.append(dict(logits=logits.tolist(), temperature=temperature, topK=top_k, topP=top_p, us=us))
    got = page.evaluate(
        """async (cases) => {
            const s = await import("./sampling.js");
            const tiny = s.samplingParams({ temperature: 5e-324 }); // below GREEDY_BELOW: argmax, no draw, no NaN
            const token = s.sampleNext(Float32Array.from(cases[0].logits), tiny, null);
            const greedy = { below: s.GREEDY_BELOW, token };
            return [greedy, ...cases.map((c) => {
                const probs = s.probabilities(Float32Array.from(c.logits), s.samplingParams(c));
                return { probs: Array.from(probs), tokens: c.us.map((u) => s.draw(probs, u)) };
            })];
        }""",
        cases,
    )
    greedy, got = got[0], got[1:]
    assert greedy == {"below": GREEDY_BELOW, "token": int(np.argmax(cases[0]["logits"]))}
    for case, out in zip(cases, got, strict=True):
        params = SamplingParams(case["temperature"], case["topK"], case["topP"])
        expected = probabilities(np.array([case["logits"]], dtype=np.float32), params)
        np.testing.assert_allclose(out["probs"], expected[0], rtol=0, atol=1e-12)
        assert out["tokens"] == draw(expected.repeat(len(case["us"]), 0), np.array(case["us"])).tolist()
    page.close()


def form_texts(page) -> dict[str, str]:
    """The form's texts by specification name (the window mode: the checked radio's value)."""
    return page.evaluate(
        """() => ({
            prompt: document.getElementById("prompt").value,
            max_new_tokens: document.getElementById("max-new-tokens").value,
            temperature: document.getElementById("temperature").value,
            top_k: document.getElementById("top-k").value,
            top_p: document.getElementById("top-p").value,
            seed: document.getElementById("seed").value,
            window_mode: document.querySelector("input[name=window-mode]:checked").value,
            unk_policy: document.querySelector("input[name=unk-policy]:checked").value,
        })"""
    )


def test_the_form_asks_what_the_demo_asks_with_its_defaults(chromium, site):
    """The same fields as the Gradio demo's form, with its labels, choices (in its order) and defaults; the window
    mode starts on the fast one, refill."""
    page = open_page(chromium, f"{site}/page/")
    texts = form_texts(page)
    labels = page.evaluate(
        "() => [...document.querySelectorAll('[data-field]')].map(e => [e.dataset.field, e.innerText])"
    )
    choices = {
        name: page.locator(f"#{name.replace('_', '-')} label").all_inner_texts()
        for name in ("window_mode", "unk_policy")
    }
    corpus, examples, title = page.inner_text("#corpus"), page.locator("#examples .example"), page.title()
    record = read_corpus_record(model_path("shakespeare"))  # the page's model/: the shipped one
    assert examples.count() == len(record.prompts) and title.endswith("on Tiny Shakespeare")
    examples.nth(1).click()
    picked = page.input_value("#prompt")
    page.close()
    assert corpus == f"This one was trained on Tiny Shakespeare ({record.description})."
    assert picked == record.prompts[1]  # an example fills in the prompt
    assert texts == PAGE_FORM and texts["window_mode"] == "refill"
    assert dict(labels) == {name: field["label"] for name, field in FORM.items()}
    assert choices == {name: [label for label, _ in FORM[name]["choices"]] for name in choices}
    shown = {
        name: f"{f['default']:g}" if isinstance(f["default"], float | int) else f["default"] for name, f in FORM.items()
    }
    assert shown == {**texts, "prompt": ""}  # the prompt: the model's own first sample prompt replaces form.json's
    assert texts["prompt"] == record.default_prompt


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max-new-tokens", "12x", "max_new_tokens must be an integer in [1, 100000], got '12x'"),
        ("max-new-tokens", "0", "max_new_tokens must be an integer in [1, 100000], got 0"),
        ("max-new-tokens", "100001", "max_new_tokens must be an integer in [1, 100000], got 100001"),
        ("max-new-tokens", "", "max_new_tokens must be an integer in [1, 100000], got ''"),
        ("temperature", "-1", "temperature must be a number in [0, 2] (0 = greedy), got -1"),
        ("temperature", "5", "temperature must be a number in [0, 2] (0 = greedy), got 5"),
        ("temperature", "hot", "temperature must be a number in [0, 2] (0 = greedy), got 'hot'"),
        ("top-k", "2.5", "top_k must be an integer in [0, 1000000] (0 = no limit), got 2.5"),
        ("top-p", "0", "top_p must be a number in (0, 1], got 0"),
        ("top-p", "1.5", "top_p must be a number in (0, 1], got 1.5"),
        ("seed", "-2", "seed must be an integer in [0, 9007199254740991] (null or -1 = random), got -2"),
        (
            "prompt",
            "x" * 10_001,
            "prompt is 10,001 characters long; the limit is 10,000 (the model reads only the "
            "last block_size characters)",
        ),
        ("prompt", "ROMEO: ¿qué?", UNKNOWN_MESSAGE),
    ],
)
def test_bad_input_gets_the_specifications_message(chromium, site, field, value, message):
    with pytest.raises(RequestError) as python:  # the message is gpt_serve's for the value the form sends
        python_reads_form({field.replace("-", "_"): value}, VOCAB)
    assert str(python.value) == message
    page = open_page(chromium, f"{site}/page/")
    page.locator(f"#{field}").fill(value)
    page.locator("#generate-btn").click()
    status = page.locator("#status")
    assert wait_until(lambda: page.locator("#status.error").count() == 1, timeout=5), status.inner_text()
    assert status.inner_text() == message
    assert page.locator(f"#{field}.invalid").count() == 1  # the field is marked
    assert generated_length(page) == 0 and page.locator("#generate-btn").is_enabled()
    page.close()


def run_form(page, **texts) -> None:
    """Fills the form's inputs (by their ids) and the unknown-character policy, runs it and waits until done."""
    policy = texts.pop("unk_policy", None)
    for field, text in texts.items():
        page.locator(f"#{field.replace('_', '-')}").fill(text)
    if policy:
        page.locator(f"input[name=unk-policy][value={policy}]").check()
    page.locator("#generate-btn").click()
    assert wait_until(lambda: page.locator("#status.done").count() == 1, timeout=15), page.locator(
        "#status"
    ).inner_text()


def test_the_empty_prompt_starts_after_a_newline(chromium, site, python_backends):
    page = open_page(chromium, f"{site}/page/")
    run_form(page, prompt="", max_new_tokens="40", temperature="0")
    shown = page.locator("#output").text_content()
    page.close()
    greedy = generate_tokens(python_backends["int8"], [[0]], 40, SamplingParams(temperature=0))
    assert shown == VOCAB.decode([int(t[0]) for t in greedy])  # no prompt shown: the text from id 0 (a newline)


def test_unknown_characters_can_be_replaced(chromium, site):
    page = open_page(chromium, f"{site}/page/")
    run_form(page, prompt="ROMEO: ¿qué?", max_new_tokens="10", unk_policy="replace")
    assert page.locator("#prompt-echo").text_content() == "ROMEO:  qu ?"  # as the model reads it
    assert len(page.locator("#generated").text_content()) == 10
    page.close()


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("?model=../nowhere/", "/nowhere/config.json answered 404"),
        ("?model=../no-block-size/", "lacks the metadata [block_size] that `python -m export` writes"),
        ("?model=../not-onnx", "not-onnx/onnx/model_quantized.onnx: the file is not an ONNX model"),
        ("?onnx=weights.bin", "the ONNX file must be one of model_quantized.onnx, model.onnx (?onnx=...)"),
    ],
)
def test_a_bad_model_gets_a_clear_message(chromium, site, query, message):
    page = open_page(chromium, f"{site}/page/{query}", ready=False)
    status = page.locator("#model-status.error")
    status.wait_for()
    assert message in status.inner_text() and "could not be loaded" in status.inner_text()
    assert not page.locator("#generate-btn").is_enabled()
    page.close()


def test_the_demo_serves_the_page_on_its_default_model(chromium, server):
    """Through the Gradio demo's /browser/ (the tiny test model, block_size 16): the link, the page, a run."""
    page = open_page(chromium, server.url, ready=False)  # the Gradio page
    link = page.locator("a", has_text="in your browser")
    link.wait_for()
    assert link.get_attribute("href") == "browser/"
    page.goto(f"{server.url}/browser/")
    page.locator("#model-status.done").wait_for()
    assert "block_size 16" in page.locator("#model-status").inner_text()
    got = page_generate(page, prompt=PROMPT, maxNewTokens=40, temperature=0, windowMode="refill")
    page.locator("#back-link").click()  # and back to the demo
    page.locator("#prompt textarea").wait_for()
    assert page.url.rstrip("/") == server.url
    page.close()
    backend = page_arithmetic(server.demo.registry.folder("tiny"))["int8"]
    assert got["ids"] == python_greedy(backend, "refill", 40)


def test_from_the_demos_format_control_to_the_page_which_says_it_has_none(chromium, server):
    """A visitor who chose a format in the demo and follows the note's link to the in-browser page reads there, beside
    its settings, that the page writes free text only, with a link back to the demo."""
    page = open_page(chromium, server.url, ready=False)  # the Gradio page
    page.locator("#format input").click()
    page.get_by_role("option", name="Regex", exact=True).click()
    link = page.locator("#format-note a", has_text="in-browser page")
    assert link.get_attribute("href") == "browser/"  # Gradio opens a Markdown link in a new tab: followed here
    page.goto(f"{server.url}/browser/")
    page.locator("#model-status.done").wait_for()
    note = page.locator("#format-note")
    assert note.is_visible() and note.inner_text().startswith("No Format here: this page always writes free text.")
    assert note.locator("a").get_attribute("href") == "../"
    assert note.bounding_box()["y"] > page.locator("#unk-policy").bounding_box()["y"]  # under the settings
    page.close()


STYLE = """selector => { const s = getComputedStyle(document.querySelector(selector));
  return {background: s.backgroundColor, color: s.color, radius: s.borderRadius, width: s.width}; }"""


@pytest.mark.parametrize("width", [1440, 390])
def test_the_page_is_styled_like_the_demo_at_desktop_and_phone_widths(chromium, site, width, tmp_path):
    """Styled inputs of a readable size in an even grid, an orange Generate, a Stop that looks disabled until a run
    is on, nothing wider than the screen; a screenshot in the test's tmp folder."""
    page = open_page(chromium, f"{site}/page/")
    page.set_viewport_size({"width": width, "height": 900})
    boxes = [page.locator(f"#{i}").bounding_box() for i in ("max-new-tokens", "temperature", "top-k", "top-p")]
    assert all(box["height"] >= 30 and box["width"] >= 120 for box in boxes), boxes  # not the tiny defaults
    assert boxes[0]["y"] == boxes[1]["y"] and boxes[2]["y"] == boxes[3]["y"] > boxes[0]["y"]  # two by two
    assert boxes[0]["width"] == boxes[1]["width"] == boxes[2]["width"] == boxes[3]["width"]  # an even grid
    assert page.evaluate("document.documentElement.scrollWidth") <= width  # no sideways scrolling
    generate, stop = page.evaluate(STYLE, "#generate-btn"), page.evaluate(STYLE, "#stop-btn")
    assert generate["background"] == "rgb(249, 115, 22)" and generate["radius"] == "8px"  # Gradio's orange
    assert stop["radius"] == "8px" and stop["color"] != "rgb(255, 255, 255)"  # disabled: grey, not a red button
    page.locator("#max-new-tokens").fill("20000")
    page.locator("#generate-btn").click()
    assert wait_until(lambda: page.locator("#stop-btn").is_enabled(), timeout=10)
    assert page.evaluate(STYLE, "#stop-btn")["background"] == "rgb(239, 68, 68)"  # enabled: red
    page.screenshot(path=str(tmp_path / f"browser-{width}.png"), full_page=True)
    page.locator("#stop-btn").click()
    assert wait_until(lambda: page.locator("#status").inner_text() == "Stopped.", timeout=5)
    page.close()


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("ort", "onnxruntime-web is missing"),  # and how to install it: `npm ci`
        ("spec.json", "The page's request limits could not be loaded"),
        ("form.json", "The page's form could not be loaded"),
    ],
)
def test_the_page_says_what_is_wrong_when_a_file_is_missing(chromium, tmp_path, missing, message):
    for name in PAGE_FILES:
        if name != missing:
            shutil.copy(WEB_DIR / name, tmp_path / name)
    (tmp_path / "model").symlink_to(model_path("shakespeare"), target_is_directory=True)
    if missing != "ort":
        (tmp_path / "ort").symlink_to(WEB_DIR / ORT_DIST, target_is_directory=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page = open_page(chromium, f"http://127.0.0.1:{server.server_address[1]}/", ready=False)
        status = page.locator("#model-status.error")
        status.wait_for()
        assert message in status.inner_text() and missing in status.inner_text(), status.inner_text()
        assert missing != "ort" or "npm ci" in status.inner_text()
        assert not page.locator("#generate-btn").is_enabled()
        page.close()
    finally:
        server.shutdown()
        server.server_close()
