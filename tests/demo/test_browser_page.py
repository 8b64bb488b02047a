"""The in-browser page's files as the demo serves them at /browser/ (`demo.browser`), over plain HTTP: exactly the
table's files, nothing past it, and a clear 503 when onnxruntime-web is not installed. The page itself runs in
Chromium in tests/demo/test_web_page.py."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from demo.browser import JS_MODULES, ORT_FILES, WEB_DIR, browser_files, missing_files, mount_browser


def get(url: str) -> tuple[int, str, bytes]:
    """(status, content type, body) of a GET, error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["content-type"], response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["content-type"], e.read()


def test_the_page_the_ort_files_and_the_model_files_are_served(server, models_root):
    if missing_files(browser_files(models_root / "tiny")):
        pytest.fail(f"{WEB_DIR / 'node_modules'} is incomplete: run `make install` (npm ci in demo/web)")
    status, kind, body = get(f"{server.url}/browser/")
    assert status == 200 and kind.startswith("text/html") and b'<script type="module" src="app.js">' in body
    for name in JS_MODULES:
        status, kind, body = get(f"{server.url}/browser/{name}")
        assert status == 200 and kind.startswith("text/javascript"), name  # a module script needs a JS type
        assert body == (WEB_DIR / name).read_bytes()
    for name in ("spec.json", "form.json"):  # the request specification, and the demo's form
        status, kind, body = get(f"{server.url}/browser/{name}")
        assert status == 200 and kind == "application/json" and body == (WEB_DIR / name).read_bytes()
    status, kind, _ = get(f"{server.url}/browser/ort/ort-wasm-simd-threaded.wasm")
    assert status == 200 and kind == "application/wasm"  # what WebAssembly.instantiateStreaming requires
    assert get(f"{server.url}/browser/ort/{ORT_FILES[0]}")[1].startswith("text/javascript")
    status, _, body = get(f"{server.url}/browser/model/config.json")
    assert status == 200 and json.loads(body)["block_size"] == 16  # the served model: the demo's default, tiny
    status, _, body = get(f"{server.url}/browser/model/onnx/model_quantized.onnx")
    assert status == 200 and body == (models_root / "tiny" / "onnx" / "model_quantized.onnx").read_bytes()
    assert get(f"{server.url}/browser")[0] == 200  # redirected to /browser/


@pytest.mark.parametrize(
    "path",
    [
        "model/model.safetensors",  # in the model folder, but not what the page needs
        "model/onnx/model.onnx",
        "model/tokenizer_config.json",
        "ort/ort.all.min.mjs",  # in onnxruntime-web's dist, but not the WASM build
        "package.json",
        "node_modules/onnxruntime-web/package.json",
        "../pyproject.toml",
        "..%2F..%2Fpyproject.toml",
        "model/..%2F..%2F..%2Fpyproject.toml",
        "%2e%2e/%2e%2e/README.md",
        "model/",
        "ort/",
    ],
)
def test_nothing_else_is_served(server, path):
    status, _, body = get(f"{server.url}/browser/{path}")
    assert status == 404, (path, status)
    assert b"[build-system]" not in body


def test_the_gradio_page_links_to_it(server):
    _, _, body = get(f"{server.url}/config")
    assert "(browser/)" in body.decode()  # the intro's Markdown: a relative link, right under any root path


def test_without_node_modules_the_page_says_how_to_install_it(tmp_path, models_root):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    web = tmp_path / "web"  # the page's files without node_modules, as in a wheel or before `npm ci`
    web.mkdir()
    for name, file in browser_files(models_root / "tiny").items():
        if not name.startswith(("ort/", "model/")):
            (web / name).write_bytes(file.read_bytes())
    app = FastAPI()
    problem = mount_browser(app, models_root / "tiny", web_dir=web)
    assert problem and "npm ci" in problem
    client = TestClient(app)
    response = client.get("/browser/")
    assert response.status_code == 503 and "npm ci" in response.text and "make install" in response.text
    response = client.get(f"/browser/ort/{ORT_FILES[2]}")
    assert response.status_code == 503 and "npm ci" in response.text


def test_a_model_without_the_int8_graph_is_named(tmp_path, models_root):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    app = FastAPI()
    folder = models_root / "ladder-a"  # saved, never exported
    problem = mount_browser(app, folder)
    assert problem and "onnx/model_quantized.onnx" in problem and "python -m export" in problem
    response = TestClient(app).get("/browser/")
    assert response.status_code == 503 and str(folder) in response.text


def test_the_pages_form_is_the_demos():
    """demo/web/form.json is `form_json()`, written by
    `python -c "from demo.form import form_json; print(form_json(), end='')" > demo/web/form.json`; its defaults
    are requests the specification accepts, and its choices are the specification's."""
    from demo.form import FORM, form_json
    from gpt_serve.generation.fields import FIELDS_BY_NAME
    from gpt_serve.generation.spec import parse_request

    assert (WEB_DIR / "form.json").read_text(encoding="utf-8") == form_json(), "regenerate demo/web/form.json"
    request = parse_request({name: field["default"] for name, field in FORM.items()})
    assert request.max_new_tokens == FORM["max_new_tokens"]["default"] and request.seed_was_random  # seed -1
    for name, field in FORM.items():
        if "choices" in field:
            assert sorted(value for _, value in field["choices"]) == sorted(FIELDS_BY_NAME[name].choices), name


def test_model_corpus_json_is_the_checked_records_public_part_never_the_file(tmp_path, models_root):
    """`model/corpus.json` is built from the checked record (name, description, prompts: not the source path), and
    a 404 when the folder records none or its record is broken (hostile, huge, a FIFO)."""
    import shutil

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from gpt_serve.folders.corpus_record import CorpusRecord, write_corpus_record

    folder = Path(shutil.copytree(models_root / "tiny", tmp_path / "tiny"))
    record = CorpusRecord("my text", "a slice", ("A:",), "a" * 64, str(tmp_path / "secret" / "text.txt"), 10)
    write_corpus_record(folder, record)
    app = FastAPI()
    mount_browser(app, folder)
    client = TestClient(app)
    response = client.get("/browser/model/corpus.json")
    assert response.status_code == 200 and response.json() == {"name": "my text", "description": "a slice",
                                                                  "prompts": ["A:"]}  # fmt: skip
    assert "secret" not in response.text and "a" * 64 not in response.text
    for hostile in ("[" * 60_000, " " * 100_000, '{"name": "x"}'):
        (folder / "corpus.json").write_text(hostile, encoding="utf-8")
        assert client.get("/browser/model/corpus.json").status_code == 404
    (folder / "corpus.json").unlink()
    os.mkfifo(folder / "corpus.json")  # would block a reader that opened it
    assert client.get("/browser/model/corpus.json").status_code == 404
    (folder / "corpus.json").unlink()
    assert client.get("/browser/model/corpus.json").status_code == 404
