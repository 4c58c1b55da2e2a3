"""Shared links and the Back button on the decoder, training and pretrained pages (issue 13 §2, §4), in
a real browser (`streamlit run app.py` + Playwright + Chromium).

For each page: open it, change the controls that define the view, then
- reload: the same URL and the same picture (every chart's title and data);
- open the copied URL in a fresh browser context (a new session): the same again;
- press Back once: the browser leaves the page (view changes replace the history entry, they
  do not push one; nor does the reload's first run, which writes the same state).
One test a page does all three on one opened-and-changed view (each page's opening and changes took ~20-30 s on
2 busy cores; a separate Back test repeated them). Screenshots of each state go to
artifacts/screenshots/link-<page>-*.png.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest
from browser_support import NO_LM_WARM, SHOTS, VIEWPORT, wait_drawn

pytestmark = pytest.mark.browser
SERVER_ENV = NO_LM_WARM  # no page here shows SmolLM2: its server does not warm it (browser_support)

# Every drawn chart, as "title#hash of its data" (sorted): two pages with the same list draw the same picture.
PICTURE = r"""() => [...document.querySelectorAll('.js-plotly-plot')].filter(el => el.data).map(el => {
    const s = JSON.stringify(el.data.map(d => [d.type, d.name, d.x, d.y, d.z, d.customdata, d.text]));
    let h = 0;
    for (let i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) | 0;
    return (el.layout?.title?.text || '').replace(/<\/?b>/g, '') + '#' + h;  // Streamlit re-bolds titles per draw
}).sort()"""


def query(url: str) -> dict:
    return parse_qs(urlparse(url).query)


def settle(page, param: str, value: str, need_chart: bool = True) -> None:
    """Wait for the rerun a control caused: its value reaches the URL, then the page is drawn."""
    page.wait_for_function(
        f"() => new URLSearchParams(location.search).get({param!r}) === {value!r}", timeout=60_000)
    wait_drawn(page, need_chart=need_chart)


def select(page, label: str, option: str) -> None:
    page.locator('[data-testid="stSelectbox"]').get_by_role("combobox", name=label, exact=True).first.click()
    page.get_by_role("option", name=option, exact=True).click()


def pick(page, option: str) -> None:
    """A segmented control or radio option, by its visible text."""
    page.get_by_role("radio", name=option, exact=True).first.click(force=True)


def change_decoder(page) -> None:
    pick(page, "Beam search")
    settle(page, "dec_strategy", "beam")
    select(page, "Decoder layer", "0")
    settle(page, "dec_layer", "0")
    select(page, "Head", "head 1")
    settle(page, "dec_head", "1")
    step = page.locator('[data-testid="stSlider"] input[type="range"][aria-label="Step"]')
    last = step.input_value()
    step.focus()
    page.keyboard.press("ArrowLeft")
    settle(page, "dec_step", str(int(last) - 1))


def change_training(page) -> None:
    select(page, "Attention", "decoder self-attention")
    settle(page, "film_attn", "self_attn")
    select(page, "Layer", "0")
    settle(page, "film_layer", "0")
    select(page, "Head", "head 1")
    settle(page, "film_head", "1")


def change_pretrained(page) -> None:
    box = page.get_by_role("textbox", name="Sentence (English, up to 512 tokens)")
    box.fill("Tokenization is unbelievably hard")
    box.press("Control+Enter")
    settle(page, "pre_text", "Tokenization is unbelievably hard")
    page.get_by_text("Merge each word's pieces", exact=True).click()
    settle(page, "pre_merge", "1")
    page.locator('[data-testid="stRadio"] label').filter(has_text="−").first.click()
    settle(page, "pre_metric", "difference")


CHANGES = {"decoder": change_decoder, "training": change_training, "pretrained": change_pretrained}


def open_and_change(page, server: str, name: str) -> None:
    """Open the app, go to `name` by its sidebar link (a page change: one history entry), change its view.

    In-app navigation, as a user moves: the first script run of a freshly loaded page writes its
    state into the URL before the history patch is mounted, so that one write is still a push."""
    page.goto(server + "/")
    wait_drawn(page)
    page.locator(f'[data-testid="stSidebarNav"] a[href$="/{name}"]').click()  # url_path = the file stem
    page.wait_for_function(f"() => location.pathname === '/{name}'", timeout=30_000)
    wait_drawn(page)
    CHANGES[name](page)
    assert not page.locator('[data-testid="stException"]').count()


@pytest.mark.parametrize("name", list(CHANGES))
def test_reload_shared_link_and_back(name, server, browser, page):
    SHOTS.mkdir(parents=True, exist_ok=True)
    open_and_change(page, server, name)
    url, picture = page.url, page.evaluate(PICTURE)
    assert picture, "no chart drawn"
    page.screenshot(path=str(SHOTS / f"link-{name}-changed.png"), full_page=True)

    page.reload()
    wait_drawn(page)
    assert query(page.url) == query(url)
    assert page.evaluate(PICTURE) == picture, "a reload changed the picture"

    fresh = browser.new_context(viewport=VIEWPORT)  # a copied link, opened by someone else
    try:
        other = fresh.new_page()
        other.goto(url)
        wait_drawn(other)
        assert query(other.url) == query(url)
        assert other.evaluate(PICTURE) == picture, "the shared link opened another picture"
        other.screenshot(path=str(SHOTS / f"link-{name}-shared.png"), full_page=True)
    finally:
        fresh.close()

    # Back: view changes replaced the history entry; only the page change added one
    page.go_back()
    page.wait_for_function(f"() => location.pathname !== '/{name}'", timeout=30_000)
    assert urlparse(page.url).path == "/"
