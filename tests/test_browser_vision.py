"""/vision in Chromium at 1920×1080: the page opens with its maps and no exception; a square drawn on the canvas gets
a prediction and a map. Screenshots go to the test's tmp dir (vision.png, vision-drawn.png)."""

from __future__ import annotations

import pytest
from browser_support import NO_LM_WARM, wait_drawn

pytestmark = pytest.mark.browser
SERVER_ENV = NO_LM_WARM  # no page here shows SmolLM2: its server does not warm it (browser_support)

FULL_HD = {"width": 1920, "height": 1080}


@pytest.fixture
def hd(browser):
    context = browser.new_context(viewport=FULL_HD)
    yield context.new_page()
    context.close()


def test_vision_opens_with_its_maps(server, hd, tmp_path):
    hd.goto(f"{server}/vision?seed=5", timeout=300_000)
    wait_drawn(hd, timeout=300_000)
    assert hd.locator('[data-testid="stException"]').count() == 0
    titles = hd.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].map(g => g.layout.title.text)")
    assert any("Attention of [CLS]" in (x or "") for x in titles), titles
    assert hd.get_by_text("The model says").count() >= 1
    hd.screenshot(path=str(tmp_path / "vision.png"))


def test_a_drawn_square_gets_a_prediction(server, hd, tmp_path):
    hd.goto(f"{server}/vision?img=draw", timeout=300_000)
    wait_drawn(hd, need_chart=False, timeout=300_000)
    canvas = hd.locator("canvas.upper-canvas").first
    canvas.wait_for(timeout=60_000)
    box = canvas.bounding_box()
    x0, y0 = box["x"] + box["width"] * 0.30, box["y"] + box["height"] * 0.30  # inside patch (1, 1) of 4 × 4
    hd.mouse.move(x0, y0)
    hd.mouse.down()
    hd.mouse.move(x0 + box["width"] * 0.17, y0 + box["height"] * 0.17, steps=8)
    hd.mouse.up()
    hd.get_by_text("The model says").first.wait_for(timeout=120_000)
    wait_drawn(hd, timeout=120_000)
    assert hd.locator('[data-testid="stException"]').count() == 0
    hd.screenshot(path=str(tmp_path / "vision-drawn.png"))
