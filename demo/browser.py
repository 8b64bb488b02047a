"""The in-browser page (`demo/web/`: onnxruntime-web runs the int8 ONNX model in the visitor's browser), served by
the demo's FastAPI app under `/browser/`.

What is served is a fixed table of files, nothing else (no directory is exposed, so no path can reach outside it):
the page's own files (among them its request limits `spec.json`, generated from `gpt_serve.generation.spec`, and
the demo's form `form.json`, generated from `demo.form`),
onnxruntime-web's WASM build under `ort/` (the page folder's `ort/`: in a clone a link into `node_modules`, installed
by `npm ci`, see the Makefile; in a Space's folder, `gpt-serve space`, the files themselves), and
three files of one model folder under `model/`, the page's default model URL. Its `model/corpus.json` is not the
folder's file but what the page may show of it (name, description, sample prompts: `CorpusRecord.public`, built from
the checked record; 404 when the folder records none or its record is broken). Without `node_modules` the page's
URL answers 503 with how to install it.
"""

from __future__ import annotations

import html
from pathlib import Path

from gpt_serve.folders.corpus_record import corpus_record_or_none
from gpt_serve.models import CORPUS_FILE_NAME
from gpt_serve.onnx_contract import INT8_FILE_NAME, ONNX_SUBDIR

WEB_DIR = Path(__file__).resolve().parent / "web"
JS_MODULES = ("app.js", "engine.js", "form.js", "model.js", "rng.js", "sampling.js", "spec.js", "vocab.js")
PAGE_FILES = ("index.html", "style.css", "spec.json", "form.json", *JS_MODULES)
ORT_DIST = Path("node_modules") / "onnxruntime-web" / "dist"  # relative to WEB_DIR
# where the page's folder holds them: in a clone, a link to ORT_DIST; in a Space's folder (`gpt-serve space`), files
ORT_DIR = "ort"
# onnxruntime-web's WASM-only ES module and the WebAssembly build (with its loader) it fetches
ORT_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
PAGE_ONNX_FILE = f"{ONNX_SUBDIR}/{INT8_FILE_NAME}"  # the int8 graph, the page's default (`?onnx=` picks another)
MODEL_FILES = ("config.json", "vocab.json", PAGE_ONNX_FILE)
# What the page shows of the model when the folder records it (its training text: `gpt_serve.folders.corpus`), built
# from
# the checked record, never the file itself; a folder without it is served all the same, and the page then says so.
CORPUS_URL = f"model/{CORPUS_FILE_NAME}"
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".wasm": "application/wasm",
    ".onnx": "application/octet-stream",
}
BROWSER_PREFIX = "/browser"  # where the demo serves the page
INSTALL_HINT = (
    "run `make install` in the repository (it runs `npm ci` in demo/web), or `cd demo/web && npm ci`, "
    "then restart the demo"
)


NOT_AVAILABLE = (
    "<!doctype html><meta charset='utf-8'><title>gpt-serve in the browser: not available</title>"
    "<h1>The in-browser page is not available</h1><p>{problem}</p>"
)


def browser_files(model_dir: str | Path, web_dir: str | Path = WEB_DIR) -> dict[str, Path]:
    """URL path under the mount (e.g. `ort/ort.wasm.min.mjs`) -> the file served there."""
    web_dir, model_dir = Path(web_dir), Path(model_dir)
    files = {name: web_dir / name for name in PAGE_FILES}
    files.update({f"ort/{name}": web_dir / ORT_DIR / name for name in ORT_FILES})
    files.update({f"model/{name}": model_dir / name for name in MODEL_FILES})
    return files


def missing_files(files: dict[str, Path]) -> list[str]:
    return [path for path, file in files.items() if not file.is_file()]


def problem(missing: list[str], web_dir: Path, model_dir: Path) -> str | None:
    """What is wrong when files of the table are missing, and how to fix it (None when all are there)."""
    if any(path.startswith("ort/") for path in missing):
        if not (web_dir / "package.json").is_file():  # an installed wheel carries the page, not the npm files
            return (
                f"onnxruntime-web is not installed ({web_dir / ORT_DIST} is missing), and this installation has no "
                f"npm files (a wheel): run the demo from a clone (`make install` runs `npm ci`), or put the files "
                f"{', '.join(ORT_FILES)} of onnxruntime-web's dist/ folder there."
            )
        return f"onnxruntime-web is not installed ({web_dir / ORT_DIST} is missing): {INSTALL_HINT}."
    if any(path.startswith("model/") for path in missing):
        shown = ", ".join(p.removeprefix("model/") for p in missing if p.startswith("model/"))
        return (
            f"the model folder {model_dir} lacks {shown}; export it with `python -m export {model_dir}` "
            f"(the page runs {PAGE_ONNX_FILE})."
        )
    if missing:
        return f"the page's files {missing} are missing from {web_dir}: reinstall gpt-serve."
    return None


def mount_browser(
    app, model_dir: str | Path, prefix: str = BROWSER_PREFIX, web_dir: str | Path = WEB_DIR
) -> str | None:
    """Adds the page to the demo's FastAPI `app` at `prefix/`, running the model folder `model_dir`. Returns None
    when every file is there, else what is missing and how to fix it (what `prefix/` then answers, with a 503)."""
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse

    web_dir, model_dir = Path(web_dir), Path(model_dir)
    files = browser_files(model_dir, web_dir)

    def page_root():
        wrong = problem(missing_files(files), web_dir, model_dir)  # checked per request: `npm ci` may come later
        if wrong:
            return HTMLResponse(NOT_AVAILABLE.format(problem=html.escape(wrong)), status_code=503)
        return FileResponse(files["index.html"], media_type=MEDIA_TYPES[".html"])

    def serve(path: str):
        if path == CORPUS_URL:  # absent or broken (logged): not an error, the page presents the model without it
            record = corpus_record_or_none(model_dir)  # read per request: the folder may be trained again
            if record is None:
                return PlainTextResponse(f"{prefix}/{path}: the model folder records no readable one", 404)
            return JSONResponse(record.public())
        file = files.get(path)  # only the table's entries: "../x", "model/model.safetensors", ... are not in it
        if file is None:
            return PlainTextResponse(f"not found: {prefix}/{path}", status_code=404)
        if not file.is_file():
            return PlainTextResponse(f"{prefix}/{path} is not available: {problem([path], web_dir, model_dir)}", 503)
        return FileResponse(file, media_type=MEDIA_TYPES.get(file.suffix, "application/octet-stream"))

    app.add_api_route(prefix, lambda: RedirectResponse(f"{prefix}/"), methods=["GET"], include_in_schema=False)
    app.add_api_route(f"{prefix}/", page_root, methods=["GET"], include_in_schema=False)
    app.add_api_route(f"{prefix}/{{path:path}}", serve, methods=["GET"], include_in_schema=False)
    return problem(missing_files(files), web_dir, model_dir)
