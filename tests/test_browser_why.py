"""'Why here?' in Chromium (issue 39 §3): a click on a cell of /llm's head heatmap opens the panel on that cell,
writes it to the URL (why=Q,K), and the link reopens it in a fresh context. Screenshot: artifacts/screenshots/
why-panel.png."""

from __future__ import annotations

from urllib.parse import parse_qs, quote, urlparse

import pytest
from browser_support import SHOTS, wait_drawn

pytestmark = pytest.mark.browser
IOI = "When Mary and John went to the store, John gave a drink to"
TITLES = r"""() => [...document.querySelectorAll('.js-plotly-plot')].map(
  gd => String((gd.layout && gd.layout.title && (gd.layout.title.text || gd.layout.title)) || '')
    .replace(/<\/?b>/g, ''))"""  # titles are drawn in bold (<b>…</b>)


def query(page) -> dict:
    return {k: v[0] for k, v in parse_qs(urlparse(page.url).query).items()}


def test_a_click_on_a_head_heatmap_cell_opens_why_here(server, browser, page):
    page.goto(f"{server}/llm?checkpoint=smollm2&prompt={quote(IOI)}&layer=17&head=3")
    wait_drawn(page)
    # the cell (query 13, key 2) of the head heatmap: its axes are categories, so l2p takes the index
    xy = page.evaluate("""() => {
      const gd = document.querySelector('.st-key-llm_head_fig .js-plotly-plot');
      const fl = gd._fullLayout, r = gd.querySelector('.nsewdrag').getBoundingClientRect();
      return [r.left + fl.xaxis.l2p(2), r.top + fl.yaxis.l2p(13)];
    }""")
    page.mouse.click(*xy)
    page.wait_for_function("() => new URLSearchParams(location.search).get('why') === '13,2'", timeout=120_000)
    page.locator(".st-key-llm_why_pairs").scroll_into_view_if_needed(timeout=120_000)  # drawn when in view
    page.wait_for_function(f"() => ({TITLES})().some(t => String(t).startsWith('Query 13 '))", timeout=120_000)
    page.locator(".st-key-llm_why_vs_pairs").scroll_into_view_if_needed(timeout=120_000)
    wait_drawn(page)
    titles = [str(t) for t in page.evaluate(TITLES)]
    assert any(t.startswith("Query 13 ") and "key 2 " in t for t in titles), titles
    assert any("over key" in t for t in titles), titles  # the contrast with the runner-up
    assert page.get_by_text("L17H3", exact=False).first.is_visible()
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "why-panel.png"), full_page=True)
    # the link reopens the same cell for another user
    fresh = browser.new_context(viewport=page.viewport_size).new_page()
    fresh.goto(page.url)
    wait_drawn(fresh)
    fresh.locator(".st-key-llm_why_pairs").scroll_into_view_if_needed(timeout=120_000)
    fresh.wait_for_function(f"() => ({TITLES})().some(t => String(t).startsWith('Query 13 '))", timeout=120_000)
    assert query(fresh)["why"] == "13,2"


def test_a_click_on_learns_head_map_opens_why_here(server, page):
    """/learn's head map (same server): a click on a cell off the induction stripe (query 25, key 3; the stripe's
    markers sit on 25 → 6) opens the panel on it, from the checkpoint's own forward."""
    page.goto(f"{server}/learn?lmodel=attn2&lhead=1.0&step=1015")
    wait_drawn(page)
    page.locator(".st-key-learn_map").scroll_into_view_if_needed(timeout=120_000)
    xy = page.evaluate("""() => {
      const gd = document.querySelector('.st-key-learn_map .js-plotly-plot');
      const fl = gd._fullLayout, r = gd.querySelector('.nsewdrag').getBoundingClientRect();
      return [r.left + fl.xaxis.l2p(3), r.top + fl.yaxis.l2p(25)];
    }""")
    page.mouse.click(*xy)
    page.wait_for_function("() => new URLSearchParams(location.search).get('why') === '25,3'", timeout=120_000)
    page.locator(".st-key-learn_why_pairs").scroll_into_view_if_needed(timeout=120_000)
    page.wait_for_function(f"() => ({TITLES})().some(t => String(t).startsWith('Query 25 '))", timeout=120_000)
    assert page.get_by_text("L1H0", exact=False).first.is_visible()
