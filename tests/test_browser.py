"""The app in a real browser: `streamlit run app.py` + Playwright driving Debian's Chromium.

Opens every page listed by st.navigation, waits until the script has finished and the
plotly charts are drawn, asserts no exception box, and saves artifacts/screenshots/<page>.png
(look at them). Interacts too: the attention page's head buttons and head select redraw the heatmap, the
decoder's play button advances the step by itself (a fragment timer, invisible to AppTest).

Run: pytest -m browser tests/test_browser.py   (CI installs Chromium with .ci/browser-setup.sh)
"""

from __future__ import annotations

import pytest
from browser_support import DEFAULT_PAGE, NO_CHARTS, NO_LM_WARM, PAGE_TIMEOUT_MS, SHOTS, charts_drawn, wait_drawn
from test_browser_layer import PAGES as LAYER_PAGES

pytestmark = pytest.mark.browser
SERVER_ENV = NO_LM_WARM  # no page here shows SmolLM2: its server does not warm it (browser_support)
# Pages tests/test_browser_layer.py's test_page_renders[en-<page>] opens on their defaults with the same checks (no
# exception box, at least its number of charts drawn, a full-page screenshot): not visited twice (~8 s each in CI).
ELSEWHERE = set(LAYER_PAGES)


def every_page(page, server: str) -> dict[str, str]:
    """Page name -> path for every page in the sidebar, including those behind "View N more"."""
    page.goto(server + "/")
    page.wait_for_selector('[data-testid="stSidebarNav"] a', timeout=PAGE_TIMEOUT_MS)
    more = page.locator('[data-testid="stSidebarNavViewButton"]')
    if more.count() and "more" in more.inner_text():
        n = page.locator('[data-testid="stSidebarNav"] a').count()
        more.click()
        page.wait_for_function(f"() => document.querySelectorAll('[data-testid=\"stSidebarNav\"] a').length > {n}")
    links = page.eval_on_selector_all('[data-testid="stSidebarNav"] a', "els => els.map(a => new URL(a.href).pathname)")
    return {path.strip("/") or DEFAULT_PAGE: path for path in links}


def test_every_page_renders(server, page):
    SHOTS.mkdir(parents=True, exist_ok=True)
    paths = every_page(page, server)
    assert {"attention", "decoder", "training"} | ELSEWHERE <= set(paths), paths
    problems = []
    for name, path in paths.items():
        if name in ELSEWHERE:
            continue
        page.goto(server + path, timeout=PAGE_TIMEOUT_MS)  # (Playwright's default 30 s ran out at load 30)
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


def test_head_buttons_and_the_head_select_switch_heads(server, paths, page):
    """A head button inside the heatmap redraws at once (plotly, no round trip); then the Head select,
    the view below and the URL follow, and a reload or a copied link opens on that head. Then the Head
    select, the other way round, redraws the heatmap (one page visit for both: a visit is ~10-20 s here)."""
    page.goto(server + paths["attention"] + "?view=pipeline")
    wait_drawn(page)
    heatmap = ".st-key-attn_head_fig .js-plotly-plot"
    title = f"() => document.querySelector('{heatmap}')?.layout?.title?.text || ''"
    assert "· head 0 ·" in page.evaluate(title)
    n_heads = page.locator(f"{heatmap} .updatemenu-button").count()
    assert n_heads >= 2, "the head heatmap carries every head with a button each"
    h = n_heads - 1
    # What the figure shows at the end of the click's own event dispatch: nothing from the server can
    # have arrived yet (JavaScript runs one task at a time), so a new head there was drawn by plotly alone.
    page.evaluate(f"() => document.addEventListener('click', () => {{ window.__shown = ({title})(); }}, "
                  "{once: true})")
    page.locator(f"{heatmap} .updatemenu-button").nth(h).click()
    assert f"· head {h} ·" in page.evaluate("() => window.__shown")
    # ... then the server catches up: the URL, the Head select and the score pipeline below.
    page.wait_for_function(f"() => new URLSearchParams(location.search).get('head') === '{h}'", timeout=30_000)
    wait_drawn(page)
    assert page.locator('.st-key-attn_head input[aria-label="Head"]').input_value() == str(h)
    titles = "() => [...document.querySelectorAll('.js-plotly-plot')].map(el => el.layout?.title?.text || '')"
    assert any(f"· head {h}: softmax" in t for t in page.evaluate(titles)), page.evaluate(titles)
    assert not page.locator('[data-testid="stException"]').count()
    # A copied link (a new context) opens on the same head, its button active.
    ctx = page.context.browser.new_context(viewport=page.viewport_size)
    other = ctx.new_page()
    try:
        other.goto(page.url)
        wait_drawn(other)
        assert f"· head {h} ·" in other.evaluate(title)
        active = other.evaluate(f"() => document.querySelector('{heatmap}').layout.updatemenus[0].active")
        assert active == h
    finally:
        ctx.close()
    # The Head select redraws the heatmap (and the view below) on another head.
    other_head = 1 if h != 1 else 0
    assert not any(f"· head {other_head} ·" in t for t in page.evaluate(titles)), page.evaluate(titles)
    select_option(page, "Head", str(other_head))
    page.wait_for_function(f"() => ({title})().includes('· head {other_head} ·')", timeout=30_000)
    wait_drawn(page)
    assert any(f"· head {other_head}: softmax" in t for t in page.evaluate(titles)), page.evaluate(titles)
    assert not page.locator('[data-testid="stException"]').count()
    page.screenshot(path=str(SHOTS / "attention-head1.png"), full_page=True)


def test_decoder_play_advances_by_itself(server, paths, page):
    page.goto(server + paths["decoder"])
    wait_drawn(page)
    slider = page.locator('[data-testid="stSlider"] input[type="range"][aria-label="Step"]')
    assert slider.count(), "the example's output has a single step: nothing to play"
    last = int(slider.input_value())  # the page opens on the last step; play restarts from step 1
    page.get_by_role("button", name="▶ Play").click()
    step = 'document.querySelector(\'[data-testid="stSlider"] input[type="range"][aria-label="Step"]\')'
    # Events, not sleeps: wait until the slider restarts below the last step, then until the
    # fragment timer (0.9 s a tick) moves it on by itself.
    first = page.wait_for_function(f"() => {{ const v = +{step}?.value; return v < {last} ? v : null; }}",
                                   timeout=30_000).json_value()
    page.wait_for_function(f"() => +{step}?.value > {first}", timeout=30_000)
    page.get_by_role("button", name="⏸ Pause").click()
    page.wait_for_selector("text=▶ Play", timeout=30_000)
    assert not page.locator('[data-testid="stException"]').count()

