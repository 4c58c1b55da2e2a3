"""The Q/K map in Chromium: a link opens a toy model's cross-attention head, a click on a query rings its top-5 keys
and puts the query in the URL, and the copied link reopens the same picture (same head, same ringed keys) in a
fresh context. Then SmolLM2's previous-token head. Screenshots: artifacts/screenshots/qk-*.png."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest
from browser_support import SHOTS, wait_drawn

pytestmark = pytest.mark.browser

FIND = """[...document.querySelectorAll('.js-plotly-plot')]
  .find(g => (g.layout.title.text || '').includes(' · head '))"""
MAP = """() => {
  const gd = """ + FIND + """;
  const top = gd._fullData.find(d => d.name === '_top_keys');
  return {title: gd.layout.title.text.replaceAll('<b>', '').replaceAll('</b>', ''),
          top: top ? Array.from(top.customdata, c => c[0]) : null,
          n: gd._fullData.filter(d => d.name !== '_top_keys').reduce((a, d) => a + d.x.length, 0)};
}"""
POINT = """(i) => {
  const gd = """ + FIND + """;
  const q = gd._fullData.find(d => d.name === 'queries');
  const fl = gd._fullLayout, r = gd.querySelector('.nsewdrag').getBoundingClientRect();
  return [r.left + fl.xaxis.l2p(q.x[i]), r.top + fl.yaxis.l2p(q.y[i]), q.customdata[i][0]];
}"""


def query(page) -> dict:
    return {k: v[0] for k, v in parse_qs(urlparse(page.url).query).items()}


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"qk-{name}.png"), full_page=False)


def test_click_a_query_then_copied_link_reopens_the_picture(server, browser, page):
    page.goto(f"{server}/qk?checkpoint=dates&qk_kind=cross&layer=1&head=2&color=kind")
    wait_drawn(page)
    before = page.evaluate(MAP)
    assert before["title"].startswith("decoder layer 1 · cross-attention · head 2") and before["top"] is None
    # Click a query point that lies on top (the last drawn of the queries may hide under keys: try a few).
    for i in (30, 60, 90, 120):
        x, y, idx = page.evaluate(POINT, i)
        page.mouse.click(x, y)
        try:
            page.wait_for_function("() => new URLSearchParams(location.search).get('query') !== null", timeout=20_000)
            break
        except Exception:  # noqa: BLE001  (the click landed on a key above it: a key keeps no pick)
            continue
    wait_drawn(page)
    picked = query(page)["query"]
    after = page.evaluate(MAP)
    assert after["top"] is not None and len(after["top"]) == 5, after
    shot(page, "toy-picked")
    # A copied link, in a fresh context (another user): the same head, the same query, the same ringed keys.
    fresh = browser.new_context(viewport=page.viewport_size)
    try:
        other = fresh.new_page()
        other.goto(page.url)
        wait_drawn(other)
        assert query(other)["query"] == picked
        assert other.evaluate(MAP) == after
    finally:
        fresh.close()


def test_smollm2_previous_token_head(server, page):
    page.goto(f"{server}/qk?checkpoint=smollm2&layer=16&head=0&color=position")
    wait_drawn(page, timeout=900_000)
    m = page.evaluate(MAP)
    assert m["title"].startswith("layer 16 · self-attention · head 0") and m["n"] > 400
    shot(page, "smollm2-prev")
