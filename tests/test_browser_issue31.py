"""Issue 31 §4 in a real browser (Chromium): a copied /padding link opened by several people at once. The lines
reach the server and its run uses them; the text box is drawn as a skeleton while the browser still fetches the
text area's code (Streamlit loads a widget's JS on first use, up to ~10 s on a loaded 2-core machine), and a
look in that window saw "empty sentences". "Drawn" now means no skeleton left (browser_support.wait_drawn).

Run: pytest -m browser tests/test_browser_issue31.py
"""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from browser_support import VIEWPORT, wait_drawn

pytestmark = pytest.mark.browser
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
