"""Regenerates the README's screenshot of the demo (docs/demo.png) in headless Chromium.

    .venv/bin/python benchmarks/demo_screenshot.py                         # the shipped default model
    .venv/bin/python benchmarks/demo_screenshot.py --model ladder-e --out /tmp/demo.png

Starts `python -m demo` on a free port, generates from a prompt with a fixed seed, runs the ladder comparison,
and saves a full-page screenshot once the attention view is drawn.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_load import CHROMIUM, ROOT, start_demo  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="shakespeare")
    p.add_argument("--model-dir", action="append", default=[], metavar="[NAME=]PATH")
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--max-new-tokens", type=int, default=400)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--out", default=str(ROOT / "docs" / "demo.png"))
    args = p.parse_args(argv)
    args.threads, args.concurrency = 1, 16

    from playwright.sync_api import sync_playwright

    process, url, startup = start_demo(args)
    print(startup)
    flags = [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ]
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=flags)
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(120_000)
            page.goto(url)
            page.locator("#prompt textarea").fill(args.prompt)
            for elem_id, value in (("max-new-tokens", args.max_new_tokens), ("seed", args.seed)):
                page.locator(f"#{elem_id} input[type=number]").fill(str(value))
                page.locator(f"#{elem_id} input[type=number]").press("Enter")
            page.locator("#generate-btn").click()
            page.locator("#status").filter(has_text="Done.").wait_for()
            page.locator("#attention img").wait_for(state="visible")
            page.get_by_text("Compare the ladder: what each lesson component buys").click()
            page.locator("#compare-btn").click()
            page.get_by_text("Done: same prompt, seed").wait_for()
            os.makedirs(Path(args.out).parent, exist_ok=True)
            page.screenshot(path=args.out, full_page=True)
            browser.close()
    finally:
        process.terminate()
        process.wait(timeout=10)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
