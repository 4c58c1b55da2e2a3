"""Issue 26 §4 in a real browser:

- Back: one press per page change, and the page Back returns to keeps its own parameters. Found by a user: a
  fresh /llm link took 6 presses to leave (Streamlit pushed entries before the history patch ran), and Back from
  a page opened by st.switch_page reopened the first page with the second's parameters;
- zh: Streamlit's own "Help for …" labels and its status widget ("Stop") in Chinese (viz/ui/chrome.py).

Run: pytest -m browser tests/test_browser_issue26.py
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest
from browser_support import wait_drawn

pytestmark = pytest.mark.browser


def query(page) -> dict:
    return parse_qs(urlparse(page.url).query)


def at_path(page, path: str) -> None:
    page.wait_for_function(f"() => location.pathname === {path!r}", timeout=120_000)
    wait_drawn(page, need_chart=False)


def test_a_fresh_link_leaves_in_one_press(server, paths, page):
    page.goto("about:blank")
    page.goto(server + paths["llm"] + "?checkpoint=dates")  # a toy model: the page offers SmolLM2
    wait_drawn(page, need_chart=False)
    page.get_by_role("button", name="Open this page with").first.click()
    page.wait_for_function("() => new URLSearchParams(location.search).get('checkpoint') === 'smollm2'",
                           timeout=120_000)
    wait_drawn(page)
    page.go_back()
    page.wait_for_function("() => location.href === 'about:blank'", timeout=60_000)


def test_back_from_a_switched_page_keeps_the_first_pages_parameters(server, paths, page):
    page.goto(server + paths["lessons"] + "?lesson=15")
    wait_drawn(page)
    before = query(page)
    page.get_by_role("button", name="Open the full page").click()
    at_path(page, paths["llm"])
    assert query(page)["view"] == ["lens"]
    page.go_back()
    at_path(page, paths["lessons"])
    after = query(page)
    assert after["lesson"] == ["15"] and "view" not in after and "prompt" not in after, (before, after)


def test_streamlits_own_words_in_chinese(server, paths, page):
    page.goto(server + paths["phenomena"] + "?checkpoint=smollm2&lang=zh")
    # while the page runs (SmolLM2's analyses take seconds here), the status widget says 停止, not Stop
    page.wait_for_selector('[data-testid="stStatusWidget"]', timeout=120_000)
    page.wait_for_function("""() => { const w = document.querySelector('[data-testid="stStatusWidget"]');
        return !w || w.innerText.includes('停止'); }""", timeout=30_000)
    wait_drawn(page)
    labels = page.eval_on_selector_all("[aria-label]", "els => els.map(e => e.getAttribute('aria-label'))")
    assert not [x for x in labels if x.startswith("Help for")], labels
    assert [x for x in labels if x.endswith("的帮助")], labels
    page.goto(server + paths["phenomena"] + "?checkpoint=smollm2&lang=en")  # English stays English
    wait_drawn(page)
    labels = page.eval_on_selector_all("[aria-label]", "els => els.map(e => e.getAttribute('aria-label'))")
    assert [x for x in labels if x.startswith("Help for")] and not [x for x in labels if x.endswith("的帮助")]
