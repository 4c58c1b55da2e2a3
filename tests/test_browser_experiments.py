"""The Experiments page in a real browser: choose an intervention, see the before/after diff drawn.

Saves artifacts/screenshots/experiments.png (look at it).
"""

from __future__ import annotations

import pytest
from browser_support import NO_LM_WARM, PAGE_TIMEOUT_MS, SHOTS, charts_drawn, wait_drawn

pytestmark = pytest.mark.browser
SERVER_ENV = NO_LM_WARM  # no page here shows SmolLM2: its server does not warm it (browser_support)

TITLES = "() => [...document.querySelectorAll('.js-plotly-plot')].map(el => el.layout?.title?.text || '')"


def test_choose_an_intervention_and_see_the_diff(server, paths, page):
    page.goto(server + paths["experiments"] + "?checkpoint=dates&text=3+november+2023")
    wait_drawn(page)
    assert not page.locator('[data-testid="stException"]').count()
    # Add seed 001's attention bug to the default experiment, through the multiselect.
    box = page.locator('[data-testid="stMultiSelect"]').first
    box.locator("input").click()
    box.locator("input").fill("Seed 001")
    page.get_by_role("option", name="Seed 001: Q/K swapped, heads concatenated without transpose").click()
    page.keyboard.press("Escape")
    page.wait_for_selector("text=Seed 001's attention takes its arguments", timeout=PAGE_TIMEOUT_MS)
    wait_drawn(page)
    titles = page.evaluate(TITLES)
    assert any("Output tokens and their log-probabilities" in t for t in titles), titles
    assert any("attention after − before" in t for t in titles), titles
    assert charts_drawn(page) >= 3
    assert "seed_qk_swap_concat" in page.url
    codes = page.locator('[data-testid="stCode"]').all_inner_texts()
    assert codes[0].strip() == "2023-11-03" and codes[1].strip() != "2023-11-03"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "experiments.png"), full_page=True)
