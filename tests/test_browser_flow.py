""""Why this token?" in a real browser (issue 25 §2): a click on an attention edge of the routes graph opens that
head on the Language model page (what AppTest cannot do: it has no plotly clicks)."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlparse

import pytest
from browser_support import SHOTS, wait_drawn

pytestmark = pytest.mark.browser

PROMPT = "The capital of France is"

# The routes chart (its Streamlit key: flow_routes), its edge dots (customdata ["edge", i]); of the attention
# edges, the dot farthest from every other dot and node (a click lands on it, not on a neighbour): its index
# and its hover text.
PICK = """() => {
  const gd = document.querySelector('.st-key-flow_routes .js-plotly-plot');
  if (!gd || !gd.data) return null;
  const ti = gd.data.findIndex(d => d.customdata && d.customdata.length && d.customdata[0][0] === 'edge');
  const ni = gd.data.findIndex(d => d.customdata && d.customdata.length && d.customdata[0][0] === 'node');
  const dots = gd.data[ti], nodes = gd.data[ni];
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  const px = (x, y) => [xa.l2p(x), ya.l2p(y)];
  const all = [];
  dots.x.forEach((x, i) => all.push(px(x, dots.y[i])));
  nodes.x.forEach((x, i) => all.push(px(x, nodes.y[i])));
  let best = -1, far = -1;
  dots.x.forEach((x, i) => {
    if (!/head/.test(dots.text[i]) || dots.marker.color[i] !== '#1f77b4') return;
    const [a, b] = px(x, dots.y[i]);
    const d = Math.min(...all.filter((_, j) => j !== i).map(([c, e]) => Math.hypot(a - c, b - e)));
    if (d > far) { far = d; best = i; }
  });
  return {trace: ti, index: best, text: best >= 0 ? dots.text[best] : null, gap: far};
}"""


def test_clicking_an_edge_opens_its_head(server, paths, page):
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert "flow" in paths, sorted(paths)
    page.goto(f"{server}{paths['flow']}?checkpoint=smollm2&text={PROMPT.replace(' ', '+')}&tau=0.05&lang=en")
    wait_drawn(page)
    assert not page.locator('[data-testid="stException"]').count()
    page.screenshot(path=str(SHOTS / "flow-routes.png"), full_page=True)
    page.wait_for_function(f"({PICK})() !== null", timeout=120_000)
    pick = page.evaluate(PICK)
    assert pick and pick["index"] >= 0, pick
    layer, head = map(int, re.search(r"layer (\d+) · head (\d+)", pick["text"]).groups())
    plot = page.locator(".st-key-flow_routes .js-plotly-plot")
    point = plot.locator(".scatterlayer .trace").nth(pick["trace"]).locator(".point").nth(pick["index"])
    point.click(force=True)
    page.wait_for_url(lambda url: "/llm" in url and "head=" in url, timeout=120_000)
    wait_drawn(page)
    q = parse_qs(urlparse(page.url).query)
    assert (int(q["layer"][0]), int(q["head"][0])) == (layer, head), (page.url, pick)
    assert q["checkpoint"] == ["smollm2"]
    titles = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')]"
                           ".map(el => el.layout?.title?.text || '')")
    assert any(f"decoder.layers.{layer}.self_attn" in t for t in titles), titles
    page.screenshot(path=str(SHOTS / "flow-click.png"), full_page=True)
