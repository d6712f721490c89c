"""The web demo end to end in a real headless Chromium: draw, predict, step through the routing,
move a slider, upload; a colour model of named classes.

Needs Debian's `chromium` (apt-get install chromium) and the `playwright` Python package
(its own browser download is not used). Skipped only where either is missing.
"""
from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest
import torch
from image_files import COLOUR_CLASSES, colour_bar_png, train_colour_model

from capsnet.checkpoint import load_model
from capsnet.web import create_app, make_server

CHROMIUM = Path(os.environ.get("CAPSNET_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 60_000  # generous: the CPU may be shared with training jobs
RECON_IS = "(src) => document.getElementById('recon').src === src"
RECON_IS_NOT = "(src) => document.getElementById('recon').src !== src"
CANVAS_PIXELS = "(id) => document.getElementById(id).toDataURL()"

if not CHROMIUM.exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")


def serve(model):
    """A running demo server for ``model``: yields its URL, stops it afterwards."""
    server = make_server(create_app(model), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.port}/"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(scope="module")
def server_url(small_checkpoint):
    yield from serve(load_model(small_checkpoint))


@pytest.fixture(scope="module")
def colour_url(tmp_path_factory):
    yield from serve(load_model(train_colour_model(tmp_path_factory.mktemp("colour"))))


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def open_page(browser, url):
    """A page at ``url``; fails the test on any JavaScript error."""
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url)
    yield page
    page.close()
    assert errors == [], f"JavaScript errors: {errors}"


@pytest.fixture()
def page(browser, server_url):
    yield from open_page(browser, server_url)


@pytest.fixture()
def colour_page(browser, colour_url):
    yield from open_page(browser, colour_url)


def draw_seven(page) -> None:
    box = page.locator("#pad").bounding_box()
    points = [(0.3, 0.2), (0.7, 0.2), (0.45, 0.85)]
    x, y = box["x"] + points[0][0] * box["width"], box["y"] + points[0][1] * box["height"]
    page.mouse.move(x, y)
    page.mouse.down()
    for px, py in points[1:]:
        page.mouse.move(box["x"] + px * box["width"], box["y"] + py * box["height"], steps=12)
    page.mouse.up()


def test_draw_predict_and_move_a_slider(page, tmp_path):
    expect = sync_api.expect
    draw_seven(page)
    expect(page.locator("#digit")).to_have_text(re.compile(r"^[0-9]$"))
    expect(page.locator("#status")).to_contain_text("Predicted")
    expect(page.locator("#bars .bar")).to_have_count(10)
    expect(page.locator("#bars .bar.winner")).to_have_count(1)
    expect(page.locator("#sliders input.slider")).to_have_count(16)
    recon = page.locator("#recon")
    before = recon.get_attribute("src")
    assert before.startswith("data:image/png;base64,")
    assert page.locator("#seen").get_attribute("src").startswith("data:image/png;base64,")

    page.locator("#dim-0").focus()
    page.keyboard.press("End")  # a user dragging the slider to +0.25
    expect(page.locator("output[for=dim-0]")).to_have_text("+0.25")
    page.wait_for_function(RECON_IS_NOT, arg=before)
    assert recon.get_attribute("src").startswith("data:image/png;base64,")

    page.locator("#reset").click()  # back to the original pose, and so the original picture
    page.wait_for_function(RECON_IS, arg=before)

    shot = tmp_path / "demo.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_routing_panel_steps_iterations_and_switches_capsules(page):
    expect = sync_api.expect
    draw_seven(page)
    expect(page.locator("#status")).to_contain_text("Predicted")
    panel = page.locator("#routing-panel")
    expect(panel).to_be_visible()
    digit = int(page.locator("#digit").inner_text())
    capsules, iterations = page.locator("#routing-capsules button"), page.locator(
        "#routing-iterations button")
    expect(capsules).to_have_count(10)
    expect(iterations).to_have_count(3)
    expect(page.locator(f"#caps-{digit}")).to_have_class(re.compile(r"\bwinner\b"))
    expect(page.locator(f"#caps-{digit}")).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#iter-3")).to_have_attribute("aria-pressed", "true")
    caption = page.locator("#routing-caption")
    expect(caption).to_contain_text(f"Capsule {digit} (the prediction), iteration 3 of 3")
    expect(page.locator("#routing-support")).to_have_attribute("data-input", "drawn")
    last = page.evaluate(CANVAS_PIXELS, "routing-couplings")

    page.locator("#iter-1").click()  # the uniform first iteration draws another map
    expect(caption).to_contain_text("iteration 1 of 3 (uniform)")
    expect(page.locator("#iter-1")).to_have_attribute("aria-pressed", "true")
    first = page.evaluate(CANVAS_PIXELS, "routing-couplings")
    assert first != last
    page.locator("#routing-step").click()  # Step: on to iteration 2
    expect(caption).to_contain_text("iteration 2 of 3")

    support = page.evaluate(CANVAS_PIXELS, "routing-support")
    other = (digit + 1) % 10
    page.locator(f"#caps-{other}").click()
    expect(caption).to_contain_text(f"Capsule {other}, iteration 2 of 3")
    expect(page.locator(f"#caps-{other}")).to_have_attribute("aria-pressed", "true")
    expect(page.locator(f"#caps-{digit}")).to_have_attribute("aria-pressed", "false")
    assert page.evaluate(CANVAS_PIXELS, "routing-support") != support

    page.locator("#clear").click()
    expect(panel).to_be_hidden()


def test_bad_upload_shows_a_message(page):
    page.locator("#upload").set_input_files(
        files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"not a picture"}])
    status = page.locator("#status")
    sync_api.expect(status).to_contain_text("not an image")
    sync_api.expect(status).to_have_class(re.compile(r"\berror\b"))
    draw_seven(page)  # the page still works afterwards
    sync_api.expect(page.locator("#digit")).to_have_text(re.compile(r"^[0-9]$"))


def test_colour_model_upload_shows_class_names(colour_page):
    expect = sync_api.expect
    status = colour_page.locator("#status")
    expect(status).to_contain_text("Upload an image: this model (folder, 32\u00d732 colour)")
    expect(colour_page.locator("#input-title")).to_have_text("Your image")
    colour_page.locator("#upload").set_input_files(
        files=[{"name": "bar.png", "mimeType": "image/png", "buffer": colour_bar_png()}])
    expect(status).to_contain_text("Predicted")
    name = colour_page.locator("#digit").inner_text()
    assert name in COLOUR_CLASSES
    expect(colour_page.locator("#bars .bar .label")).to_have_text(list(COLOUR_CLASSES))
    expect(colour_page.locator("#routing-capsules button")).to_have_text(list(COLOUR_CLASSES))
    index = COLOUR_CLASSES.index(name)
    expect(colour_page.locator(f"#caps-{index}")).to_have_class(re.compile(r"\bwinner\b"))
    expect(colour_page.locator("#routing-caption")).to_contain_text(
        f"Capsule {name} (the prediction), iteration 3 of 3")
    expect(colour_page.locator("#routing-support")).to_have_attribute("data-input", "drawn")
    assert colour_page.locator("#seen").get_attribute("src").startswith("data:image/png;base64,")
    expect(colour_page.locator("#sliders input.slider")).to_have_count(16)


@pytest.fixture(scope="module")
def efficient_url():
    from capsnet.models import build_model, make_config

    torch.manual_seed(0)
    yield from serve(build_model(make_config("efficient", "small")).eval())


@pytest.fixture()
def efficient_page(browser, efficient_url):
    yield from open_page(browser, efficient_url)


def test_efficient_capsnet_routing_is_shown_per_capsule_type(efficient_page):
    """Its primary capsules sit on one 1x1 cell: the grid maps are hidden, the strip of
    capsule types shows the self-attention couplings C of the one pass."""
    page, expect = efficient_page, sync_api.expect
    draw_seven(page)
    expect(page.locator("#status")).to_contain_text("Predicted")
    expect(page.locator("#routing-panel")).to_be_visible()
    expect(page.locator("#support-figure")).to_be_hidden()
    expect(page.locator("#types-figure")).to_be_visible()
    expect(page.locator("#routing-iterations button")).to_have_count(1)
    expect(page.locator("#routing-hint")).to_contain_text("self-attention")
    expect(page.locator("#types-caption")).to_contain_text("coupling C per capsule type (0\u20137)")
    expect(page.locator("#routing-caption")).to_contain_text("of the primary capsules' output")
    digit = int(page.locator("#digit").inner_text())
    strip = page.evaluate(CANVAS_PIXELS, "routing-types")
    page.locator(f"#caps-{(digit + 1) % 10}").click()
    expect(page.locator("#routing-caption")).to_contain_text(f"Capsule {(digit + 1) % 10},")
    assert page.evaluate(CANVAS_PIXELS, "routing-types") != strip
