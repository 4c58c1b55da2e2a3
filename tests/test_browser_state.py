"""State in a real browser (issue 13): a shared link reopens the same view in a fresh browser, and
Back leaves a page in one press (changing the view replaces the URL instead of pushing entries).

Run: pytest -m browser tests/test_browser_state.py
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest
from browser_support import NO_LM_WARM, SHOTS, wait_drawn

pytestmark = pytest.mark.browser
SERVER_ENV = NO_LM_WARM  # no page here shows SmolLM2: its server does not warm it (browser_support)

TITLES = "() => [...document.querySelectorAll('.js-plotly-plot')].map(el => el.layout?.title?.text || '')"


def select_option(page, label: str, option: str) -> None:
    """Pick `option` in the Streamlit selectbox labelled `label`, and wait until the app has redrawn."""
    page.locator('[data-testid="stSelectbox"]').get_by_role("combobox", name=label, exact=True).first.click()
    page.get_by_role("option", name=option, exact=True).click()
    wait_drawn(page)


def click_and_wait(page, locator, param: str, value: str) -> None:
    """Click, then wait for the URL to say so (the view is in the URL once the rerun has finished)."""
    locator.click()
    page.wait_for_function(f"() => new URLSearchParams(location.search).get({param!r}) === {value!r}",
                           timeout=60_000)
    wait_drawn(page)


def at_path(page, path: str) -> None:
    page.wait_for_function(f"() => location.pathname === {path!r}", timeout=60_000)
    wait_drawn(page)


def view_of(page) -> dict:
    """What the page shows: figure titles (module, layer, head), the chosen view, the text, the URL."""
    return {
        "titles": page.evaluate(TITLES),
        "view": page.locator('[data-testid="stMain"] button[role=radio][aria-checked=true]').all_inner_texts(),
        "kind": page.locator('[data-testid="stRadio"] label:has(input:checked)').all_inner_texts(),
        "layer, head": [page.locator(f".st-key-attn_{k} input").input_value() for k in ("layer", "head")],
        "text": page.locator('[data-testid="stSidebar"] textarea').first.input_value(),
        "query": {k: v for k, v in parse_qs(urlparse(page.url).query).items()},
    }


def choose_a_view(page) -> None:
    """Decoder self-attention, layer 1, head 2, the score pipeline, on another sentence."""
    click_and_wait(page, page.locator('[data-testid="stRadio"] label').filter(has_text="Decoder self"),
                   "attn_kind", "dec")
    select_option(page, "Layer", "1")
    select_option(page, "Head", "2")
    click_and_wait(page, page.locator("button", has_text="Score pipeline"), "view", "pipeline")
    box = page.locator('[data-testid="stSidebar"] textarea').first
    box.fill("5 may 2021")
    box.press("Control+Enter")
    page.wait_for_function("() => new URLSearchParams(location.search).get('text') === '5 may 2021'",
                           timeout=60_000)
    wait_drawn(page)


def test_a_shared_link_reopens_the_same_view(server, paths, browser, page):
    page.goto(server + paths["attention"])
    wait_drawn(page)
    choose_a_view(page)
    before = view_of(page)
    assert any("decoder layer 1 · self-attention · head 2 · " in t for t in before["titles"]), before
    assert any("decoder layer 1 · self-attention · head 2: softmax" in t for t in before["titles"]), before
    fresh = browser.new_context(viewport=page.viewport_size)  # another user: no cookies, no session
    try:
        other = fresh.new_page()
        other.goto(page.url)
        wait_drawn(other)
        after = view_of(other)
        other.screenshot(path=str(SHOTS / "attention-shared-link.png"), full_page=True)
    finally:
        fresh.close()
    assert after == before


def type_text(page, text: str) -> None:
    box = page.locator('[data-testid="stSidebar"] textarea').first
    box.fill(text)
    box.press("Control+Enter")
    page.wait_for_function(f"() => (new URLSearchParams(location.search).get('text') || '') === {text!r}",
                           timeout=60_000)
    wait_drawn(page, need_chart=bool(text))


def test_the_controls_show_the_view_after_an_input_error(server, paths, page):
    """Issue 13 #1 as the browser shows it: after an empty text (a message, no chart) and a new sentence,
    the radio and the selects show the kept kind, layer and head, as the chart and the URL do."""
    page.goto(server + paths["attention"])
    wait_drawn(page)
    choose_a_view(page)
    before = view_of(page)
    assert before["layer, head"] == ["1", "2"], before
    type_text(page, "")
    assert page.locator('[data-testid="stAlert"]').filter(has_text="empty").count()
    type_text(page, "5 may 2021")
    assert view_of(page) == before


def test_back_leaves_the_page_in_one_press(server, paths, page):
    page.goto(server + paths["tokens"])
    wait_drawn(page)
    page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name="Attention", exact=True).click()
    at_path(page, paths["attention"])
    wait_drawn(page)
    entries = page.evaluate("history.length")
    choose_a_view(page)  # five changes of the view, each written into the URL
    select_option(page, "Head", "3")
    assert page.evaluate("history.length") == entries, "changing the view pushed history entries"
    page.go_back()
    at_path(page, paths["tokens"])
    wait_drawn(page)
    assert not page.locator('[data-testid="stException"]').count()
    page.go_forward()  # and Forward returns to the view as it was left
    at_path(page, paths["attention"])
    wait_drawn(page)
    assert any("decoder layer 1 · self-attention · head 3 · " in t for t in page.evaluate(TITLES))
