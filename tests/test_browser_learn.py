"""/learn in Chromium: the step slider moved with the keyboard redraws the head's map and writes the step into the
URL; the copied link reopens the same step and the same map in a fresh context. Screenshot:
artifacts/screenshots/learn-step.png."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest
from browser_support import NO_LM_WARM, SHOTS, wait_drawn

pytestmark = pytest.mark.browser
SERVER_ENV = NO_LM_WARM  # no page here shows SmolLM2: its server does not warm it (browser_support)

MAP = """() => {
  const gd = [...document.querySelectorAll('.js-plotly-plot')]
    .find(g => (g.layout.title.text || '').includes('attention on the repeated probe'));
  const z = gd ? gd._fullData[0].z : null;
  return gd ? {title: gd.layout.title.text, z: [25, 26, 27].map(i => Array.from(z[i]).slice(0, 12))} : null;
}"""


def query(page) -> dict:
    return {k: v[0] for k, v in parse_qs(urlparse(page.url).query).items()}


def test_move_the_step_slider_then_the_copied_link_reopens_it(server, browser, page):
    page.goto(f"{server}/learn?step=515&lhead=1.1", timeout=600_000)
    wait_drawn(page, timeout=600_000)  # the first open measures the recorded run (once per server)
    before = page.evaluate(MAP)
    assert before is not None and "at step 515" in before["title"], before
    thumb = page.locator('[data-testid="stSlider"] input[type="range"]').first
    thumb.focus()
    thumb.press("ArrowRight")
    page.wait_for_function("() => new URLSearchParams(location.search).get('step') !== '515'", timeout=60_000)
    wait_drawn(page)
    step = query(page)["step"]
    after = page.evaluate(MAP)
    assert int(step) > 515 and f"at step {step}" in after["title"] and after["z"] != before["z"]
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "learn-step.png"), full_page=False)
    fresh = browser.new_context(viewport=page.viewport_size)
    try:
        other = fresh.new_page()
        other.goto(page.url)
        wait_drawn(other)
        assert query(other)["step"] == step and query(other)["lhead"] == "1.1"
        assert other.evaluate(MAP) == after
    finally:
        fresh.close()
