"""Architecture map, Tokens & embeddings, Inside a layer and Snapshots with SmolLM2 in Chromium (issue 19 §1): each
page draws with no exception (screenshots artifacts/screenshots/lm-*.png), and what AppTest cannot do: a real
click on the LM map's attention block opens the Attention page at the chosen layer and head."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from browser_support import SHOTS, charts_drawn, wait_drawn

pytestmark = pytest.mark.browser
IOI = "When Mary and John went to the store, John gave a drink to"
PAGES = {"architecture": 1, "tokens": 2, "layer": 2, "snapshots": 0}  # page -> charts drawn up front
TITLES = "() => [...document.querySelectorAll('.js-plotly-plot')].map(el => el.layout?.title?.text || '')"


@pytest.mark.parametrize("name", list(PAGES))
def test_smollm2_page_renders(server, paths, page, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.goto(f"{server}{paths[name]}?checkpoint=smollm2&text={quote(IOI)}&layer=17&head=3&token=11")
    wait_drawn(page, need_chart=PAGES[name] > 0)
    page.screenshot(path=str(SHOTS / f"lm-{name}.png"), full_page=True)
    assert not page.locator('[data-testid="stException"]').count()
    assert charts_drawn(page) >= PAGES[name]


def test_clicking_the_lm_attention_block_opens_that_head(server, paths, page):
    page.goto(f"{server}{paths['architecture']}?checkpoint=smollm2&text={quote(IOI)}&layer=17&head=3")
    wait_drawn(page)
    # The map's one scatter trace: one marker per block, in viz.figures.arch.lm_blocks order; 2 = attention.
    page.locator(".js-plotly-plot .scatterlayer .point").nth(2).click(force=True)
    page.wait_for_url(lambda url: "attn_kind=dec" in url and "/architecture" not in url, timeout=120_000)
    wait_drawn(page)
    titles = page.evaluate(TITLES)
    assert any("layer 17 · self-attention · head 3" in t for t in titles), titles
    page.screenshot(path=str(SHOTS / "lm-architecture-click.png"), full_page=True)
