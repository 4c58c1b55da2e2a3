"""Inside a layer, Architecture map, A batch with padding, Tokenizer playground in a real browser:
each page draws its charts with no exception (screenshots in artifacts/screenshots/), and what AppTest
cannot do: clicking a block of the architecture map opens that block's view."""

from __future__ import annotations

import pytest
from browser_support import NO_LM_WARM, SHOTS, charts_drawn, wait_drawn

pytestmark = pytest.mark.browser
SERVER_ENV = NO_LM_WARM  # no page here shows SmolLM2: its server does not warm it (browser_support)

PAGES = {"layer": 2, "architecture": 1, "padding": 3, "tokenizers": 1}  # page -> charts drawn up front (first tab)
TITLES = "() => [...document.querySelectorAll('.js-plotly-plot')].map(el => el.layout?.title?.text || '')"


@pytest.mark.parametrize("name", list(PAGES))
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_page_renders(server, paths, page, name, lang):
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert name in paths, f"{name} is not in the navigation: {sorted(paths)}"
    page.goto(f"{server}{paths[name]}?lang={lang}")
    wait_drawn(page)
    page.screenshot(path=str(SHOTS / f"{name}-{lang}.png"), full_page=True)
    assert not page.locator('[data-testid="stException"]').count()
    assert charts_drawn(page) >= PAGES[name]


def test_clicking_a_block_opens_its_view(server, paths, page):
    page.goto(server + paths["architecture"])
    wait_drawn(page)
    # The map's only scatter trace: one marker per block, in viz.figures.arch.BLOCKS order; 8 = cross-attention.
    page.locator(".js-plotly-plot .scatterlayer .point").nth(8).click(force=True)
    # The Attention page is the app's default page, served at "/".
    page.wait_for_url(lambda url: "attn_kind=cross" in url and "/architecture" not in url, timeout=60_000)
    wait_drawn(page)
    titles = page.evaluate(TITLES)
    assert any("decoder.layers.0.cross_attn" in t for t in titles), titles
    page.screenshot(path=str(SHOTS / "architecture-click.png"), full_page=True)


def test_every_layer_tab_draws(server, paths, page):
    page.goto(server + paths["layer"] + "?stack=decoder&sub=cross_attn&token=2&head=1")
    wait_drawn(page)
    tabs = page.get_by_role("tab")
    assert tabs.count() == 5
    for i in range(5):
        tabs.nth(i).click()
        page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some(el => "
                               "el.getBoundingClientRect().width > 50 && el.data?.length)", timeout=30_000)
        wait_drawn(page)
        page.screenshot(path=str(SHOTS / f"layer-tab{i}.png"), full_page=True)
        assert charts_drawn(page) >= 1, f"tab {i} drew no chart"
    assert not page.locator('[data-testid="stException"]').count()
