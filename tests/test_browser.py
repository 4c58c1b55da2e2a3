"""The app in a real browser: `streamlit run app.py` + Playwright driving Debian's Chromium.

Opens every page listed by st.navigation, waits until the script has finished and the
plotly charts are drawn, asserts no exception box, and saves artifacts/screenshots/<page>.png
(look at them). Interacts too: the attention page's head select redraws the heatmap, the
decoder's play button advances the step by itself (a fragment timer, invisible to AppTest).

Run: pytest -m browser tests/test_browser.py   (CI installs Chromium with .ci/browser-setup.sh)
"""

from __future__ import annotations

import time

import pytest
from browser_support import NO_CHARTS, SHOTS, charts_drawn, wait_drawn

pytestmark = pytest.mark.browser


def test_every_page_renders(server, paths, page):
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert {"attention", "decoder", "training"} <= set(paths), paths
    problems = []
    for name, path in paths.items():
        page.goto(server + path)
        wait_drawn(page, need_chart=name not in NO_CHARTS)
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
        if page.locator('[data-testid="stException"]').count():
            problems.append(f"{name}: {page.locator('[data-testid=stException]').first.inner_text()[:500]}")
        if name not in NO_CHARTS and charts_drawn(page) == 0:
            problems.append(f"{name} ({path}): no plotly chart drawn")
    assert not problems, "\n".join(problems)


def select_option(page, label: str, option: str) -> None:
    """Pick `option` in the Streamlit selectbox labelled `label`."""
    page.locator('[data-testid="stSelectbox"]').get_by_role("combobox", name=label, exact=True).first.click()
    page.get_by_role("option", name=option, exact=True).click()


def test_changing_the_head_redraws_the_heatmap(server, paths, page):
    page.goto(server + paths["attention"])
    wait_drawn(page)
    titles = "() => [...document.querySelectorAll('.js-plotly-plot')].map(el => el.layout?.title?.text || '')"
    assert any("· head 0" in t for t in page.evaluate(titles))
    select_option(page, "Head", "1")
    page.wait_for_function(f"() => ({titles})().some(t => t.includes('· head 1'))", timeout=30_000)
    wait_drawn(page)
    assert not page.locator('[data-testid="stException"]').count()
    page.screenshot(path=str(SHOTS / "attention-head1.png"), full_page=True)


def test_decoder_play_advances_by_itself(server, paths, page):
    page.goto(server + paths["decoder"])
    wait_drawn(page)
    slider = page.locator('[data-testid="stSlider"] input[type="range"][aria-label="Step"]')
    if not slider.count():
        pytest.skip("the example's output has a single step: nothing to play")
    value = lambda: int(slider.input_value())  # noqa: E731
    last = value()  # the page opens on the last step; play restarts from step 1
    page.get_by_role("button", name="▶ Play").click()
    deadline = time.monotonic() + 30
    while value() >= last and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    first = value()
    assert first < last, "play did not restart from the first step"
    page.wait_for_timeout(3000)  # the fragment timer ticks every 0.9 s
    assert value() > first
    page.get_by_role("button", name="⏸ Pause").click()
    page.wait_for_selector("text=▶ Play", timeout=30_000)
    assert not page.locator('[data-testid="stException"]').count()
