"""Issue 31 §4 in a real browser (Chromium): a copied /padding link opened by several people at once. The lines
reach the server and its run uses them; the text box is drawn as a skeleton while the browser still fetches the
text area's code (Streamlit loads a widget's JS on first use, up to ~10 s on a loaded 2-core machine), and a
look in that window saw "empty sentences". "Drawn" now means no skeleton left (browser_support.wait_drawn).

Run: pytest -m browser tests/test_browser_issue31.py
"""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from browser_support import NO_LM_WARM, VIEWPORT, wait_drawn

pytestmark = pytest.mark.browser
SERVER_ENV = NO_LM_WARM  # no page here shows SmolLM2: its server does not warm it (browser_support)
LINES = "3 march 2021 => 2021-03-03\n12 july 1999 => 1999-07-12\n1 jan 2000"


def test_a_copied_padding_link_opened_by_four_at_once_shows_its_lines(server, browser):
    url = server + "/padding?" + urlencode({"lang": "en", "checkpoint": "dates", "text": "3 november 2023",
                                           "pad_model": "dates", "pad_lines": LINES})
    for _ in range(2):  # two rounds: the first visitors fetch the widgets' code as the server starts
        contexts = [browser.new_context(viewport=VIEWPORT) for _ in range(4)]
        pages = [c.new_page() for c in contexts]
        for pg in pages:
            pg.goto(url, wait_until="commit")  # all four load at once
        try:
            for pg in pages:
                wait_drawn(pg, need_chart=False)
                box = pg.locator(".st-key-pad_lines_dates textarea")
                assert box.count() == 1, "the text box is not drawn yet (a skeleton) although the page looks done"
                assert box.input_value() == LINES
                assert "pad_lines=" in pg.url
        finally:
            for c in contexts:
                c.close()


def test_plotly_toolbar_tooltips_are_chinese_in_zh(server, page):
    page.goto(server + "/?lang=zh&checkpoint=dates&text=3+november+2023")
    wait_drawn(page)
    page.locator(".js-plotly-plot").first.hover()  # the toolbar shows on hover
    titles = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot .modebar-btn')]
        .map(b => b.getAttribute('data-title'))""")
    assert titles, "no plotly toolbar"
    assert "放大" in titles and "重置坐标轴" in titles, titles
    assert not {"Zoom in", "Zoom out", "Reset axes", "Pan"} & set(titles), titles


def test_flow_titles_readable_and_the_legend_off_the_title(server, browser):
    ctx = browser.new_context(viewport={"width": 1920, "height": 1080})
    page = ctx.new_page()
    try:
        page.goto(server + "/flow?lang=en&checkpoint=dates&text=3+november+2023&pos=2&tau=0.02")
        wait_drawn(page)
        sizes = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot .annotation-text')]
            .filter(a => a.textContent.includes('ρ =')).map(a => parseFloat(getComputedStyle(a).fontSize))""")
        assert sizes and min(sizes) >= 14, sizes  # each method's name and rho (11 px before: ~8 px when scaled)
        boxes = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].map(p => {
            const title = p.querySelector('.gtitle'), legend = p.querySelector('.legend');
            const r = (e) => { if (!e) return null; const b = e.getBoundingClientRect();
                               return [b.left, b.top, b.right, b.bottom]; };
            return {title: r(title), legend: r(legend), text: title ? title.textContent : ''};
        })""")
        routes = [b for b in boxes if b["text"].startswith("Routes to") and b["legend"]]
        assert routes, boxes
        t, lg = routes[0]["title"], routes[0]["legend"]
        overlap = min(t[2], lg[2]) > max(t[0], lg[0]) and min(t[3], lg[3]) > max(t[1], lg[1])
        assert not overlap, (t, lg)
    finally:
        ctx.close()
