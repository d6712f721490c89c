"""Take docs/web-demo.png: serve the demo, draw a digit in headless Chromium, move a slider.

The routing panel shows the winning capsule's last iteration (the page's default).

    python docs/screenshot_web_demo.py --checkpoint runs/latest/best.pt --out docs/web-demo.png

Needs Debian's `chromium` and the `playwright` Python package (as tests/test_browser.py).
"""
from __future__ import annotations

import argparse
import threading

from playwright.sync_api import expect, sync_playwright

from capsnet.checkpoint import load_model
from capsnet.web import create_app, make_server

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = (1480, 700)  # wide enough for the four panels side by side
# A hand-drawn '4' as strokes of (x, y) in the unit square of the drawing pad.
STROKES = [[(0.58, 0.15), (0.26, 0.62), (0.78, 0.62)], [(0.62, 0.38), (0.6, 0.88)]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="default: the shipped model")
    parser.add_argument("--out", default="docs/web-demo.png")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--slider", type=int, default=3, help="dimension moved in the picture")
    parser.add_argument("--steps", type=int, default=8, help="arrow-key presses (0.01 each)")
    args = parser.parse_args()

    server = make_server(create_app(load_model(args.checkpoint)), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": VIEWPORT[0], "height": VIEWPORT[1]})
            page.goto(f"http://127.0.0.1:{server.port}/")
            box = page.locator("#pad").bounding_box()
            for stroke in STROKES:
                x0, y0 = stroke[0]
                page.mouse.move(box["x"] + x0 * box["width"], box["y"] + y0 * box["height"])
                page.mouse.down()
                for x, y in stroke[1:]:
                    page.mouse.move(box["x"] + x * box["width"], box["y"] + y * box["height"],
                                    steps=15)
                page.mouse.up()
            expect(page.locator("#status")).to_contain_text("Predicted", timeout=60_000)
            expect(page.locator("#routing-support")).to_have_attribute("data-input", "drawn")
            before = page.locator("#recon").get_attribute("src")
            page.locator(f"#dim-{args.slider}").focus()
            for _ in range(args.steps):
                page.keyboard.press("ArrowRight")
            page.wait_for_function("(b) => document.getElementById('recon').src !== b", arg=before)
            page.wait_for_timeout(300)
            page.screenshot(path=args.out, full_page=True)
            print(f"wrote {args.out}: predicted {page.locator('#digit').inner_text()}")
            browser.close()
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
