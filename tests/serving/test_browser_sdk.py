"""The official OpenAI JS SDK (the `openai` npm package, pinned in demo/web's package-lock.json) in Debian's
headless Chromium, from a page on another origin, against `gpt-serve serve --api-key K --allowed-origins ORIGIN`:
a streamed chat and a completion come back as the Python client gets them; a page from an origin not allowed gets
nothing. No network: the page and the SDK's files are served from this machine."""

from __future__ import annotations

import functools
import http.server
import json
import threading

import openai
import pytest

from tests.conftest import ROOT
from tests.demo.conftest import chromium  # noqa: F401 (the fixture)
from tests.helpers import free_port, wait_until
from tests.serving.conftest import healthy, start_server

pytestmark = pytest.mark.browser

KEY = "browser-key"
SDK = ROOT / "demo" / "web" / "node_modules" / "openai"
CHAT = [{"role": "user", "content": "Good morrow, Juliet."}]
PAGE = """<!doctype html><meta charset="utf-8"><title>the OpenAI JS SDK</title>
<script type="module">
import OpenAI from "./openai/index.mjs";
const client = new OpenAI({baseURL: "%(api)s/v1", apiKey: "%(key)s", dangerouslyAllowBrowser: true, maxRetries: 0});
try {
  const stream = await client.chat.completions.create(
    {model: "tiny", messages: %(chat)s, max_tokens: 24, temperature: 0, stream: true});
  let chat = "", chunks = 0;
  for await (const chunk of stream) { chat += chunk.choices[0]?.delta?.content ?? ""; chunks += 1; }
  const completion = await client.completions.create({model: "tiny", prompt: "ROMEO:", max_tokens: 24, temperature: 0});
  window.result = {chat, chunks, completion: completion.choices[0].text};
} catch (e) {
  window.result = {error: `${e.name}: ${e.message}`};
}
</script>
"""


class StaticFiles(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript"}

    def log_message(self, *args):  # no request lines in the test's output
        pass


@pytest.fixture(scope="module")
def api(models_root, tmp_path_factory):
    """(API URL, page origin): `gpt-serve serve` allowing the page's origin, and the page's static server."""
    if not (SDK / "index.mjs").is_file():
        pytest.fail(f"{SDK} is missing: run `make install` (npm ci in demo/web installs the pinned openai package)")
    page_port = free_port()
    origin = f"http://127.0.0.1:{page_port}"
    folder = tmp_path_factory.mktemp("page")
    server, url = start_server(models_root, folder / "serve.log", "--api-key", KEY, "--allowed-origins", origin)
    (folder / "openai").symlink_to(SDK)
    page = PAGE % {"api": url, "key": KEY, "chat": json.dumps(CHAT)}
    (folder / "index.html").write_text(page, encoding="utf-8")
    files = http.server.ThreadingHTTPServer(("127.0.0.1", page_port), functools.partial(StaticFiles, directory=folder))
    thread = threading.Thread(target=files.serve_forever, daemon=True)
    thread.start()
    try:
        assert wait_until(lambda: healthy(url) or server.poll() is not None, 120) and server.poll() is None, (
            folder / "serve.log"
        ).read_text()
        yield url, page_port
    finally:
        files.shutdown()
        server.terminate()
        server.wait(timeout=30)


def run_page(browser, url: str) -> dict:
    page = browser.new_page()
    try:
        page.goto(url)
        page.wait_for_function("() => window.result !== undefined", timeout=60_000)
        return page.evaluate("() => window.result")
    finally:
        page.close()


def test_the_openai_js_sdk_streams_a_chat_and_completes_from_an_allowed_origin(chromium, api):  # noqa: F811
    url, page_port = api
    result = run_page(chromium, f"http://127.0.0.1:{page_port}/index.html")
    assert "error" not in result, result
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    chat = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=24, temperature=0)
    completion = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=24, temperature=0)
    assert result["chat"] == chat.choices[0].message.content and result["chunks"] > 2
    assert result["completion"] == completion.choices[0].text and result["completion"]


def test_a_page_from_another_origin_is_refused_by_the_browser(chromium, api):  # noqa: F811
    _, page_port = api
    result = run_page(chromium, f"http://localhost:{page_port}/index.html")  # localhost: not the allowed origin
    assert "Connection error" in result.get("error", ""), result  # the SDK sees no answer: the browser blocked it
