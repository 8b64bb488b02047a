"""The demo in a real browser: Debian's headless Chromium driven by Playwright for Python.

Loads the page, types a prompt, generates, watches the output grow, stops it (and checks the server stopped
computing), sees the attention heat map, sees a bad prompt's message, and checks that closing the page mid-stream
stops the server's generation loop. Saves a screenshot in the test's tmp folder (GPT_SERVE_SCREENSHOT=PATH also
copies it there).
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from tests.demo.conftest import wait_idle, wait_until

pytestmark = pytest.mark.browser


def open_demo(browser, url: str):
    page = browser.new_page(viewport={"width": 1280, "height": 1400})
    page.set_default_timeout(15_000)
    page.goto(url)
    page.locator("#prompt textarea").wait_for(state="visible")
    return page


def output_length(page) -> int:
    return len(page.locator("#output textarea").input_value())


def start_generation(page, prompt: str, max_new_tokens: int) -> None:
    page.locator("#max-new-tokens input[type=number]").fill(str(max_new_tokens))
    page.locator("#max-new-tokens input[type=number]").press("Enter")
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#generate-btn").click()


def test_generate_stream_stop_and_attention(chromium, server, tmp_path):
    wait_idle(server.activity)
    page = open_demo(chromium, server.url)
    start_generation(page, "ROMEO:", 20_000)

    assert wait_until(lambda: output_length(page) > len("ROMEO:") + 5, timeout=15), "no output appeared"
    lengths = [output_length(page)]
    for _ in range(3):
        time.sleep(0.3)
        lengths.append(output_length(page))
    assert lengths == sorted(lengths) and lengths[-1] > lengths[0], f"the output did not grow: {lengths}"
    assert "tokens/s" in page.locator("#stats").inner_text()

    page.locator("#stop-btn").click()
    assert wait_until(lambda: server.activity.snapshot()["active"] == 0, timeout=1.0), "the server kept generating"
    tokens = server.activity.snapshot()["tokens"]
    assert wait_until(lambda: page.locator("#status").inner_text() == "Stopped.", timeout=10)
    shown = output_length(page)  # the page may show the last updates in flight a moment after the click
    time.sleep(1.0)
    assert output_length(page) == shown, "the output kept growing after Stop"
    assert server.activity.snapshot()["tokens"] == tokens, "tokens were generated after Stop"
    assert len("ROMEO:") < shown < len("ROMEO:") + 20_000
    assert page.locator(".error").count() == 0, "an output shows an error state"

    heatmap = page.locator("#attention img")
    heatmap.wait_for(state="visible")
    assert wait_until(lambda: heatmap.evaluate("img => img.complete && img.naturalWidth > 0"), timeout=10)
    caption = page.locator("#attention-caption")
    assert "Layer 0 of 2 · 4 heads · the last 6 prompt characters" in caption.inner_text()
    before = heatmap.get_attribute("src")
    page.locator("#layer label", has_text="layer 1").click()
    assert wait_until(lambda: "Layer 1 of 2" in caption.inner_text(), timeout=5)
    assert wait_until(lambda: heatmap.get_attribute("src") != before, timeout=5)

    screenshot = tmp_path / "demo.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000
    if os.environ.get("GPT_SERVE_SCREENSHOT"):
        shutil.copy(screenshot, os.environ["GPT_SERVE_SCREENSHOT"])
    page.close()


def test_bad_prompt_shows_a_clear_message(chromium, server):
    page = open_demo(chromium, server.url)
    start_generation(page, "ROMEO: ¿qué?", 50)
    status = page.locator("#status")
    assert wait_until(lambda: "outside this model's vocabulary" in status.inner_text(), timeout=10)
    assert "'¿' (position 7)" in status.inner_text() and "'é' (position 10)" in status.inner_text()
    page.locator("#generate-btn").wait_for(state="visible")
    page.close()


def test_closing_the_page_stops_the_generation(chromium, server):
    wait_idle(server.activity)
    page = open_demo(chromium, server.url)
    start_generation(page, "JULIET:", 20_000)
    assert wait_until(lambda: output_length(page) > 20, timeout=15)
    assert server.activity.snapshot()["active"] == 1
    page.close()
    assert wait_until(lambda: server.activity.snapshot()["active"] == 0, timeout=3), "generation outlived its client"
    tokens = server.activity.snapshot()["tokens"]
    time.sleep(0.5)
    assert server.activity.snapshot()["tokens"] == tokens


def test_a_second_click_never_runs_two_streams_into_one_box(chromium, server):
    wait_idle(server.activity)
    started = server.activity.snapshot()["started"]
    page = open_demo(chromium, server.url)
    start_generation(page, "ROMEO:", 20_000)
    assert wait_until(lambda: output_length(page) > 20, timeout=15)
    page.locator("#generate-btn").click()  # ignored by the page while its run is on (the server would also stop
    time.sleep(1.0)  # the older run of the page: StopRequests.supersede)
    assert server.activity.snapshot()["active"] == 1 and server.activity.snapshot()["started"] == started + 1
    page.locator("#stop-btn").click()
    assert wait_until(lambda: server.activity.snapshot()["active"] == 0, timeout=2)
    page.close()
