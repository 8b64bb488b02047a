"""Regenerates the README's screenshots of the demo in headless Chromium: docs/demo.png (light, 1440 pixels wide),
docs/demo-dark.png (the page in dark mode), docs/demo-phone.png (390 pixels wide) and docs/demo-browser.png (the
in-browser page, /browser/).

    .venv/bin/python benchmarks/demo_screenshot.py                         # the shipped default model
    .venv/bin/python benchmarks/demo_screenshot.py --model ladder-e --out /tmp/demo.png   # and /tmp/demo-dark.png ...
    .venv/bin/python benchmarks/demo_screenshot.py --model-dir py=runs/py --model py --out docs/demo-own.png \
        --prompt 'def load_backend(model, backend="torch", threads=None):'   # a model trained on another text

Starts `python -m demo` on a free port; for each screenshot of the demo, opens a page, generates from a prompt with a
fixed seed (on a phone the settings start folded: it unfolds them to set it, then folds them again), runs the
comparison (desktop ones, when the page has one: the ladder, or a model's own earlier checkpoints when its training
kept snapshots; a model trained on another text without them has none), and saves a
full-page screenshot once the attention view is drawn. The prompt is longer than the attention maps' 32 positions, so
they show their first column of earlier keys.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_load import CHROMIUM, CHROMIUM_FLAGS, ROOT, start_demo  # noqa: E402

# (file name suffix, Playwright page options, run the comparison too)
SHOTS = [
    ("", dict(viewport={"width": 1440, "height": 1000}), True),
    ("-dark", dict(viewport={"width": 1440, "height": 1000}, color_scheme="dark"), True),
    ("-phone", dict(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True), False),
]


def take(browser, url: str, args, out: Path, options: dict, compare: bool) -> None:
    page = browser.new_page(**options)
    page.set_default_timeout(120_000)
    page.goto(url)
    page.locator("#prompt textarea").fill(args.prompt)
    folded = not page.locator("#seed").is_visible()
    if folded:
        page.locator("#sampling > .label-wrap").click()
    for elem_id, value in (("max-new-tokens", args.max_new_tokens), ("seed", args.seed)):
        page.locator(f"#{elem_id} input[type=number]").fill(str(value))
        page.locator(f"#{elem_id} input[type=number]").press("Enter")
    if folded:
        page.locator("#sampling > .label-wrap").click()
    if compare and page.locator("#compare").count():  # a model on another text, without snapshots, has none
        page.locator("#compare > .label-wrap").click()  # the ladder, or the model's earlier checkpoints
        page.locator("#compare-btn").click()
        page.locator("#compare-status").filter(has_text="Done: the prompt").wait_for()
    page.locator("#generate-btn").click()
    page.locator("#status").filter(has_text="Done.").wait_for()
    page.locator("#attention-caption").filter(has_text="on both axes").wait_for()
    page.locator("#attention .attn-grid").nth(1).locator("i").nth(500).hover()  # a weight in the readout
    page.screenshot(path=str(out), full_page=True)
    page.close()
    print(f"wrote {out}")


def take_browser_page(browser, url: str, args, out: Path) -> None:
    """The in-browser page at /browser/, after a run of the same prompt and seed."""
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(120_000)
    page.goto(f"{url}browser/")
    page.locator("#model-status.done").wait_for()
    for elem_id, value in (("prompt", args.prompt), ("max-new-tokens", args.max_new_tokens), ("seed", args.seed)):
        page.locator(f"#{elem_id}").fill(str(value))
    page.locator("#generate-btn").click()
    page.locator("#status.done").wait_for()
    page.screenshot(path=str(out), full_page=True)
    page.close()
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="shakespeare")
    p.add_argument("--model-dir", action="append", default=[], metavar="[NAME=]PATH")
    p.add_argument("--prompt", default="JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?")
    p.add_argument("--max-new-tokens", type=int, default=400)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--out", default=str(ROOT / "docs" / "demo.png"), help="the light one; the others beside it")
    args = p.parse_args(argv)
    args.threads, args.concurrency = 1, 16

    from playwright.sync_api import sync_playwright

    process, url, startup = start_demo(args)
    print(startup)
    out = Path(args.out)
    os.makedirs(out.parent, exist_ok=True)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
            for suffix, options, compare in SHOTS:
                take(browser, url, args, out.with_name(f"{out.stem}{suffix}{out.suffix}"), options, compare)
            take_browser_page(browser, url, args, out.with_name(f"{out.stem}-browser{out.suffix}"))
            browser.close()
    finally:
        process.terminate()
        process.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
