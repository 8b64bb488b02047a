"""Your own model, end to end (issue 33's check): a tiny model trained for a few steps on a text that is not Tiny
Shakespeare (a few KB of this package's Python source), exported without `--data` (the export finds the text its
folder recorded), then served: the demo page, the in-browser page's `model/corpus.json`, the model card and
`gpt-serve generate` present that text, its name and its prompts, and none of them says Shakespeare. No ladder stage
reads its characters: the page compares it with its own earlier checkpoints instead (the snapshots its training
kept). The browser test opens both pages of the demo in Chromium and runs that comparison."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpt_serve.folders.corpus_record import read_corpus_record

SHAKESPEARE = ("Shakespeare", "ROMEO", "JULIET")
# gpt_serve's own modules: a text with its own characters
SOURCES = ("chargpt/window.py", "chargpt/vocab.py", "folders/corpus.py")
CHECKPOINT_COLUMNS = ("step-000004", "step-000008", "mine")  # the comparison's columns: its snapshots, then itself


def says_shakespeare(text: str) -> list[str]:
    return [word for word in SHAKESPEARE if word.lower() in text.lower()]


@pytest.fixture(scope="module")
def own_model(tmp_path_factory) -> Path:
    """The model folder: trained (12 steps of the tiny preset, evaluated every 4: snapshots of steps 4 and 8) on 6,000
    characters of Python, then exported."""
    from export.cli import main as export
    from training.cli import main as train

    root = tmp_path_factory.mktemp("own")
    package = Path(__file__).resolve().parents[2] / "gpt_serve"
    text = "".join((package / name).read_text(encoding="utf-8") for name in SOURCES)[:6000]
    (root / "code.py").write_text(text, encoding="utf-8")
    folder = root / "model"
    argv = ["--preset", "tiny", "--data", str(root / "code.py"), "--out", str(folder), "--max-iters", "12"]
    assert train([*argv, "--eval-interval", "4", "--threads", "1", "--no-progress"]) == 0
    assert export([str(folder), "--threads", "1"]) == 0  # no --data: the recorded text, found by its hash
    return folder


@pytest.fixture(scope="module")
def own_registry(own_model):
    """The shipped models and this one, as `gpt-serve demo --model-dir mine=PATH --model mine` serves them."""
    from gpt_serve.serving.registry import ModelRegistry

    registry = ModelRegistry.discover([f"mine={own_model}"])
    yield registry
    registry.close()


def test_the_folder_the_card_and_generate_present_the_models_own_text(own_model, capsys):
    from gpt_serve.cli import main

    record = read_corpus_record(own_model)
    text = Path(record.source).read_text(encoding="utf-8")
    assert record.name == "code.py" and len(record.prompts) >= 3 and all(p in text for p in record.prompts)
    card = (own_model / "README.md").read_text(encoding="utf-8")
    assert json.dumps(record.default_prompt) in card and "code.py (validation split)" in card  # the export's figures
    assert not says_shakespeare(card) and (own_model / "onnx" / "model_quantized.onnx").is_file()
    assert main(["generate", str(own_model), "--max-new-tokens", "5", "--seed", "0"]) == 0
    assert capsys.readouterr().out.startswith(record.default_prompt)  # its own prompt, not "ROMEO:"


def test_the_demo_presents_it_and_compares_it_with_its_checkpoints_not_the_ladder(own_model, own_registry):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from demo.app import build_demo
    from demo.browser import mount_browser

    record = read_corpus_record(own_model)
    blocks = build_demo(own_registry, default_model="mine")
    config = blocks.get_config_file()
    props = {c["props"].get("elem_id"): c["props"] for c in config["components"] if c["props"].get("elem_id")}
    assert "trained on **code.py**" in props["intro"]["value"] and config["title"].endswith("on code.py")
    assert props["prompt"]["value"] == record.default_prompt
    examples = [sample[0] for sample in props["examples"]["samples"]]
    assert examples == list(record.prompts)
    # the ladder reads Shakespeare's characters: the model is compared with its own earlier states instead
    assert [props[f"compare-{n}"]["label"].split(" · ")[0] for n in CHECKPOINT_COLUMNS] == ["step 4", "step 8", "mine"]
    assert props["compare-btn"]["value"] == "Compare with earlier checkpoints"
    assert "ladder" not in json.dumps(props["compare-intro"]) and not [n for n in props if "compare-ladder" in n]
    shown = [props["intro"]["value"], config["title"], props["prompt"]["value"], *examples]
    assert not says_shakespeare("\n".join(shown))
    app = FastAPI()
    mount_browser(app, own_model)
    answer = TestClient(app).get("/browser/model/corpus.json")
    assert answer.status_code == 200 and answer.json() == record.public()  # what a page shows, not where it was read


@pytest.mark.browser
def test_both_pages_present_it_in_a_browser(chromium, own_model, own_registry):
    from demo.app import build_demo
    from tests.demo.conftest import serve

    record = read_corpus_record(own_model)
    with serve(build_demo(own_registry, default_model="mine"), own_registry, browser_model="mine") as url:
        page = chromium.new_page(viewport={"width": 1440, "height": 1000})
        page.set_default_timeout(30_000)
        page.goto(url)
        page.locator("#prompt textarea").wait_for(state="visible")
        intro, prompt = page.inner_text("#intro"), page.locator("#prompt textarea").input_value()
        # the examples' samples render after their header
        page.wait_for_function("document.querySelector('#examples').innerText.length > 'Examples'.length")
        examples = page.inner_text("#examples")
        compare_title = page.inner_text("#compare > .label-wrap")
        page.locator("#compare > .label-wrap").click()
        page.locator("#compare-btn").click()
        page.locator("#compare-status").filter(has_text="Done: the prompt").wait_for()
        compare = page.inner_text("#compare")
        columns = [page.locator(f"#compare-{n} textarea").input_value() for n in CHECKPOINT_COLUMNS]
        labels = [page.inner_text(f"#compare-{n} [data-testid='block-info']") for n in CHECKPOINT_COLUMNS]
        page.goto(f"{url.rstrip('/')}/browser/")
        page.locator("#model-status.done").wait_for()
        corpus, browser_prompt = page.inner_text("#corpus"), page.input_value("#prompt")
        buttons, body = page.locator("#examples .example").count(), page.inner_text("body")
        page.close()
    assert "trained on code.py" in intro and prompt == record.default_prompt
    assert record.prompts[1].split("\n")[0] in examples
    assert corpus.startswith("This one was trained on code.py") and browser_prompt == record.default_prompt
    assert buttons == len(record.prompts)
    assert not says_shakespeare(intro + examples + body + compare)
    assert "Compare with earlier checkpoints" in compare_title and "ladder" not in compare.lower()
    assert "Done: the prompt" in compare and "the same settings in every column" in compare  # every column ran
    assert all(len(text) > 0 for text in columns) and len(set(columns)) == 3
    assert labels[0].startswith("step 4 · val loss ") and labels[2].startswith("mine · step 12 · val loss ")
