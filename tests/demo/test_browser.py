"""The demo in a real browser: Debian's headless Chromium driven by Playwright for Python.

Loads the page (nothing empty drawn before a run, a Stop that looks disabled), types a prompt, generates, watches
the output grow, stops it (and checks the server stopped computing), sees the attention heat maps (drawn without
scrolling to them, a weight read by hovering a cell) and their labelled caption, sees them cleared when the next
run starts, sees a bad prompt's message once beside an empty output, a clamped value's note, the ladder comparison
(aligned columns, its own Stop, the prompt in its status, the main output cleared), the layout at phone width, and
checks that closing the page mid-stream stops the server's generation loop. Saves a screenshot in the test's tmp
folder (GPT_SERVE_SCREENSHOT=PATH also copies it there).
"""

from __future__ import annotations

import os
import re
import shutil
import time

import pytest

from tests.demo.conftest import wait_idle, wait_until

pytestmark = pytest.mark.browser


TIMER = re.compile(r"\d\.\ds|processing")  # Gradio's progress text ("0.2s", "processing | 0.1s")


def open_demo(browser, url: str, width: int = 1280):
    page = browser.new_page(viewport={"width": width, "height": 1400})
    page.set_default_timeout(15_000)
    page.goto(url)
    page.locator("#prompt textarea").wait_for(state="visible")
    return page


def output_length(page) -> int:
    return len(page.locator("#output textarea").input_value())


def output_scroll(page) -> dict:
    """The output box's scrollTop, clientHeight and scrollHeight."""
    return page.locator("#output textarea").evaluate(
        "t => ({scrollTop: t.scrollTop, clientHeight: t.clientHeight, scrollHeight: t.scrollHeight})"
    )


def start_generation(page, prompt: str, max_new_tokens: int) -> None:
    page.locator("#max-new-tokens input[type=number]").fill(str(max_new_tokens))
    page.locator("#max-new-tokens input[type=number]").press("Enter")
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#generate-btn").click()


RECORD_TEXTS = """ids => {
  window.seenTexts = new Set();
  const record = () => ids.forEach(id => window.seenTexts.add(document.getElementById(id)?.innerText ?? ""));
  new MutationObserver(record).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def record_texts(page, *elem_ids: str) -> None:
    """From now on the page keeps every text those elements show, however briefly (`seen_texts`)."""
    page.evaluate(RECORD_TEXTS, list(elem_ids))


def seen_texts(page) -> list[str]:
    return page.evaluate("() => [...window.seenTexts]")


BACKGROUND = "el => getComputedStyle(el).backgroundColor"


def test_generate_stream_stop_and_attention(chromium, server, tmp_path):
    wait_idle(server.activity)
    page = open_demo(chromium, server.url)
    stop = page.locator("#stop-btn")
    assert stop.is_disabled(), "Stop looks active before anything runs"
    # before a run: no empty picture or tall empty box, and a Stop that looks like a disabled button
    assert page.locator("#output textarea").bounding_box()["height"] < 150
    assert page.locator("#attention").bounding_box()["height"] < 40
    disabled_look = stop.evaluate(BACKGROUND)
    assert disabled_look != page.locator("#generate-btn").evaluate(BACKGROUND)
    record_texts(page, "stats", "status", "attention-caption")
    start_generation(page, "ROMEO:", 20_000)

    assert wait_until(lambda: output_length(page) > len("ROMEO:") + 5, timeout=15), "no output appeared"
    assert stop.is_enabled() and stop.evaluate(BACKGROUND) != disabled_look
    lengths = [output_length(page)]
    for _ in range(3):
        time.sleep(0.3)
        lengths.append(output_length(page))
    assert lengths == sorted(lengths) and lengths[-1] > lengths[0], f"the output did not grow: {lengths}"
    assert "tokens/s" in page.locator("#stats").inner_text()
    # past block_size in the default window mode (refill): no slow-down to explain
    assert "tokens/s" in page.locator("#stats").inner_text() and "exact mode" not in page.locator("#stats").inner_text()
    assert wait_until(lambda: output_scroll(page)["scrollHeight"] > 2 * output_scroll(page)["clientHeight"], 15)

    stop.click()
    assert wait_until(lambda: server.activity.snapshot()["active"] == 0, timeout=1.0), "the server kept generating"
    tokens = server.activity.snapshot()["tokens"]
    assert wait_until(lambda: page.locator("#status").inner_text() == "Stopped.", timeout=10)
    shown = output_length(page)  # the page may show the last updates in flight a moment after the click
    time.sleep(1.0)
    assert output_length(page) == shown, "the output kept growing after Stop"
    box = output_scroll(page)  # the box shows its latest text, not its top
    assert box["scrollTop"] + box["clientHeight"] >= box["scrollHeight"] - 2, box
    assert server.activity.snapshot()["tokens"] == tokens, "tokens were generated after Stop"
    assert len("ROMEO:") < shown < len("ROMEO:") + 20_000
    assert page.locator(".error").count() == 0, "an output shows an error state"
    assert wait_until(stop.is_disabled, timeout=5), "Stop stays active after the run"

    heatmap = page.locator("#attention .attn-view")
    heatmap.wait_for(state="visible")  # drawn where it is, not scrolled to: nothing loads lazily
    assert page.locator("#attention .attn-head").count() == 4 and page.locator("#attention button").count() == 0
    cell = page.locator("#attention .attn-grid").nth(2).locator("i").nth(4)  # head 2: query 2 "M", key 1 "O"
    assert cell.bounding_box()["width"] >= 8
    cell.hover()
    readout = page.locator("#attention .attn-readout")
    assert re.fullmatch(r"head 2 · query 2 “M” → key 1 “O”: weight [01]?\.\d{3}", readout.inner_text()), (
        readout.inner_text()
    )
    assert readout.inner_text().endswith(cell.get_attribute("title"))
    caption = page.locator("#attention-caption")
    # the characters drawn on the axes, as the caption names them
    assert wait_until(lambda: "Layer 0 (of layers 0–1) · heads 0–3" in caption.inner_text(), timeout=5)
    assert "the last 6 prompt characters on both axes: ROMEO: (query ↓, key →)" in caption.inner_text()
    before = heatmap.inner_html()
    page.locator("#layer label", has_text="layer 1").click()
    assert wait_until(lambda: "Layer 1 (of layers 0–1)" in caption.inner_text(), timeout=5)
    assert wait_until(lambda: heatmap.inner_html() != before, timeout=5)
    leaked = [text for text in seen_texts(page) if TIMER.search(text)]
    assert not leaked, f"progress text in the stats, status or caption: {leaked}"

    screenshot = tmp_path / "demo.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000
    if os.environ.get("GPT_SERVE_SCREENSHOT"):
        shutil.copy(screenshot, os.environ["GPT_SERVE_SCREENSHOT"])

    # the next run clears the view of the previous prompt at once, and draws the new one when it ends
    start_generation(page, "JULIET:\nO Romeo", 20_000)
    assert wait_until(lambda: heatmap.count() == 0, timeout=2), "the previous prompt's heat maps stay on"
    assert caption.inner_text().startswith("⏳ The attention view of the prompt is drawn when this run ends")
    assert wait_until(lambda: output_length(page) > 30, timeout=15)
    stop.click()
    assert wait_until(lambda: "on both axes: JULIET:↵O·Romeo" in caption.inner_text(), timeout=10)
    page.close()


def test_bad_prompt_shows_a_clear_message_once_beside_an_empty_output(chromium, server):
    page = open_demo(chromium, server.url)
    start_generation(page, "ROMEO:", 50)
    assert wait_until(lambda: page.locator("#status").inner_text() == "Done.", timeout=15)
    start_generation(page, "ROMEO: ¿qué?", 50)
    status = page.locator("#status")
    assert wait_until(lambda: "outside this model's vocabulary" in status.inner_text(), timeout=10)
    assert "'¿' (position 7)" in status.inner_text() and "'é' (position 10)" in status.inner_text()
    page.locator("#generate-btn").wait_for(state="visible")
    assert wait_until(page.locator("#stop-btn").is_disabled, timeout=5)
    time.sleep(0.5)  # the attention step has run: it adds nothing
    assert page.locator("#attention-caption").inner_text() == "" and page.locator(".toast-item").count() == 0
    assert output_length(page) == 0 and page.locator("#attention .attn-view").count() == 0  # no earlier run shown
    page.close()


def test_a_clamped_value_gets_a_note(chromium, server):
    page = open_demo(chromium, server.url)
    box = page.locator("#max-new-tokens input[type=number]")
    box.fill("999999")
    note = page.locator("#settings-note")
    assert wait_until(lambda: "Max new tokens goes from 1 to 20000: 999999 becomes 20000." in note.inner_text(), 5)
    page.locator("#prompt textarea").click()  # the box loses focus: the slider clamps the value
    assert box.input_value() == "20000"
    box.fill("50")
    assert wait_until(lambda: note.inner_text() == "", timeout=5)
    page.close()


def test_at_phone_width_a_short_page_the_prompt_and_output_first(chromium, server, tmp_path):
    page = open_demo(chromium, server.url, width=390)

    def top(selector: str) -> float:
        return page.locator(selector).bounding_box()["y"]

    assert top("#prompt") < top("#generate-btn") < top("#output") < top("#model") < top("#attention")
    assert top("#prompt") < 844 / 3  # the intro is short: the prompt is in the first third of the screen
    assert top("#generate-btn") == top("#stop-btn")  # side by side
    assert not page.locator("#max-new-tokens").is_visible()  # the settings start folded
    # a fixed seed: the page's height follows the text's lines, and a drawn seed's text may be a few lines taller
    page.locator("#sampling").get_by_text("Sampling").first.click()
    page.locator("#seed input").fill("1")
    page.locator("#sampling").get_by_text("Sampling").first.click()
    assert not page.locator("#max-new-tokens").is_visible()  # folded again
    start_generation_folded(page, "ROMEO:")
    page.locator("#attention .attn-view").wait_for()
    heads = [page.locator("#attention .attn-head").nth(i).bounding_box() for i in range(2)]
    assert heads[0]["width"] > 220 and heads[0]["y"] == heads[1]["y"]  # wide maps, side by side, scrolled sideways
    assert page.locator("#attention button").count() == 0  # no image buttons over the maps
    height = page.evaluate("document.documentElement.scrollHeight")
    page.screenshot(path=str(tmp_path / "phone.png"), full_page=True)
    assert height < 2000, f"the page is {height} px tall at phone width"
    page.get_by_text("Compare the ladder: what each lesson component buys").click()
    assert "tiny" in page.locator("#compare-tiny").inner_text()  # the default model's column
    page.close()


def start_generation_folded(page, prompt: str) -> None:
    """Generates the default number of tokens (the settings folded, as on a phone) and waits for the end."""
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#generate-btn").click()
    assert wait_until(lambda: page.locator("#status").inner_text() == "Done.", timeout=15)


def test_the_ladder_comparison(chromium, server):
    """Aligned columns, its own Stop, the prompt in its status, the attention view not left showing the run before,
    and Generate's output kept (a comparison is not Generate's run)."""
    wait_idle(server.activity)
    page = open_demo(chromium, server.url, width=1440)
    start_generation(page, "ROMEO:", 30)
    assert wait_until(lambda: page.locator("#status").inner_text() == "Done.", timeout=15)
    page.locator("#attention .attn-view").wait_for()
    generated = page.locator("#output textarea").input_value()
    page.get_by_text("Compare the ladder: what each lesson component buys").click()
    boxes = page.locator(".ladder textarea")
    boxes.first.wait_for()
    assert len({round(boxes.nth(i).bounding_box()["y"]) for i in range(boxes.count())}) == 1  # one height
    compare_stop = page.locator("#compare-stop-btn")
    assert (
        compare_stop.is_disabled()
        and abs(compare_stop.bounding_box()["y"] - page.locator("#compare-btn").bounding_box()["y"]) < 2
    )
    page.locator("#prompt textarea").fill("JULIET:")
    page.locator("#max-new-tokens input[type=number]").fill("20000")
    page.locator("#max-new-tokens input[type=number]").press("Enter")
    page.locator("#compare-btn").click()
    status = page.locator("#compare-status")
    assert wait_until(lambda: status.inner_text().startswith("Running the prompt JULIET: (seed "), timeout=15)
    assert page.locator("#attention .attn-view").count() == 0  # the previous run's view: gone
    assert page.locator("#output textarea").input_value() == generated != "" and generated.startswith("ROMEO:")  # kept
    assert compare_stop.is_enabled() and page.locator("#stop-btn").is_disabled()
    compare_stop.click()
    assert wait_until(lambda: status.inner_text().startswith("Stopped: the prompt JULIET: (seed "), timeout=10)
    assert wait_until(compare_stop.is_disabled, timeout=5)
    assert wait_until(lambda: "on both axes: JULIET:" in page.locator("#attention-caption").inner_text(), timeout=10)
    assert wait_until(lambda: server.activity.snapshot()["active"] == 0, timeout=2)
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


def pick_format(page, label: str) -> None:
    page.locator("#format input").click()
    page.get_by_role("option", name=label, exact=True).click()


def test_the_format_control_choices_a_bad_regex_and_the_note_about_the_browser_page(chromium, server):
    """Choices typed one per line: the text is one of them. The box and the note that the in-browser page has no
    format show only while a format is chosen; a malformed regex is one line in the status."""
    wait_idle(server.activity)
    page = open_demo(chromium, server.url)
    box, note, status = page.locator("#format-text textarea"), page.locator("#format-note"), page.locator("#status")
    assert not box.is_visible() and note.inner_text() == ""
    pick_format(page, "Choices")
    box.wait_for(state="visible")
    assert "one per line" in page.locator("#format-text").inner_text()
    assert wait_until(lambda: "in-browser page" in note.inner_text(), timeout=5), note.inner_text()
    assert "does not support a format" in note.inner_text() and note.locator("a").get_attribute("href") == "browser/"
    box.fill("Ay.\nNo, my lord.")
    start_generation(page, "ROMEO:\n", 40)
    assert wait_until(lambda: status.inner_text() == "Done.", timeout=15), status.inner_text()
    assert page.locator("#output textarea").input_value() in ("ROMEO:\nAy.", "ROMEO:\nNo, my lord.")

    pick_format(page, "Regex")
    assert wait_until(lambda: "must match" in page.locator("#format-text").inner_text(), timeout=5)
    box.fill("[A-Z")
    page.locator("#generate-btn").click()
    assert wait_until(lambda: "Format (Regex): the regex is malformed" in status.inner_text(), timeout=10)
    assert "\n" not in status.inner_text() and output_length(page) == 0 and page.locator(".toast-item").count() == 0

    pick_format(page, "Free text")
    assert wait_until(lambda: not box.is_visible() and note.inner_text() == "", timeout=5)
    start_generation(page, "ROMEO:", 30)  # the page serves on, free text again (the box's regex is not sent)
    assert wait_until(lambda: status.inner_text() == "Done.", timeout=15), status.inner_text()
    assert output_length(page) == len("ROMEO:") + 30
    page.close()


def test_the_training_curve_follows_the_model_chosen(chromium, server, tmp_path):
    page = open_demo(chromium, server.url)
    note = page.locator("#curve-note")
    assert wait_until(lambda: "has no metrics.jsonl" in note.inner_text(), 10)  # tiny: an imported checkpoint
    assert not page.locator("#curve-plot").is_visible()
    page.locator("#model input").click()
    page.get_by_role("option", name="ladder-a", exact=True).click()
    plot = page.locator("#curve-plot img")
    plot.wait_for(state="visible")
    assert wait_until(lambda: note.inner_text().startswith("ladder-a: 2 evaluations"), 10)
    assert "A (one head) to E" in note.inner_text()  # trained on Tiny Shakespeare: the ladder's lines
    box = plot.bounding_box()
    assert box["width"] > 300 and box["height"] > 200
    page.screenshot(path=str(tmp_path / "curve.png"))
    page.locator("#model input").click()
    page.get_by_role("option", name="tiny", exact=True).click()
    assert wait_until(lambda: "has no metrics.jsonl" in note.inner_text(), 10)
    assert wait_until(lambda: not page.locator("#curve-plot").is_visible(), 5)
    page.close()
