"""A ~2,048-token prompt in Chromium (issue 24, "Done when"): pasted into /llm and into the Attention page on
SmolLM2, it gets the lazy views. The test opens a head, zooms (the window lives in the URL), uses the document
view, clicks another head, and finds no exception; its link reopens the same view. Screenshots go to
artifacts/screenshots/long-*.png. One server, one browser context per page; the second page reuses the server's
cached lazy trace."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlparse

import pytest
from browser_support import SHOTS, wait_drawn

pytestmark = [pytest.mark.browser, pytest.mark.slow]
TIMEOUT = 300_000  # a 2,048-token forward + per-head statistics on a shared 2-core CPU
TITLES = """() => [...document.querySelectorAll('.js-plotly-plot')].map(
  gd => (gd.layout && gd.layout.title && (gd.layout.title.text || gd.layout.title)) || '')"""

# Varied English sentences, deterministic: 197 of them are 2,04x SmolLM2 tokens (checked below).
SUBJ = ["The old lighthouse keeper", "A young botanist", "The river pilot", "Our neighbour's cat", "The village baker",
        "A travelling painter", "The night train", "The museum guard"]
VERB = ["watched the harbour", "counted the seeds", "followed the current", "slept by the stove", "kneaded the dough",
        "mixed a deep blue", "crossed the valley", "walked the long gallery"]
WHEN = ["before dawn", "after the storm", "every Sunday", "in late autumn", "while it rained", "at noon"]
LONG = " ".join(f"{SUBJ[i % 8]} {VERB[(i * 3) % 8]} {WHEN[(i * 5) % 6]}." for i in range(197))


# The chosen position's token is inside the document box's visible part, and the box does scroll (a long text).
POSITION_IN_VIEW = """() => {
  const box = document.querySelector('.attention-document'), s = document.getElementById('attention-position');
  if (!box || !s) return false;
  const b = box.getBoundingClientRect(), r = s.getBoundingClientRect();
  return box.scrollHeight > box.clientHeight + 10 && r.top >= b.top && r.bottom <= b.bottom;
}"""


def titles(page) -> list[str]:
    return [re.sub(r"</?b>", "", str(t).split("<br>")[0]) for t in page.evaluate(TITLES)]


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"long-{name}.png"), full_page=False)


def no_exception(page) -> None:
    exc = page.locator('[data-testid="stException"]')
    assert exc.count() == 0, exc.first.inner_text()[:800]


def wait_param(page, param: str, value: str) -> None:
    page.wait_for_function(f"() => new URLSearchParams(location.search).get({param!r}) === {value!r}",
                           timeout=TIMEOUT)
    wait_drawn(page, timeout=TIMEOUT)


def pick(page, key: str, option: str) -> None:
    """Pick `option` in the selectbox with Streamlit key `key`."""
    box = page.locator(f".st-key-{key}").get_by_role("combobox")
    box.click()
    box.press_sequentially(option)  # the list is virtualized (30 layers): filter it to the option
    page.get_by_role("option", name=option, exact=True).click()


def number(page, key: str, value: int) -> None:
    box = page.locator(f".st-key-{key} input")
    box.fill(str(value))
    box.press("Enter")


def paste(page, box, text: str) -> None:
    box.fill(text)  # fill(): typing 10,000 characters key by key would take minutes
    box.press("Control+Enter")


def drive_long_views(page, key: str, other_head: str) -> None:
    """Zoom to a window, the document view at a chosen position and scope, then another head."""
    number(page, f"{key}_long_q0", 1000)
    page.wait_for_function("() => (new URLSearchParams(location.search).get('win') || '').startsWith('1000,')",
                           timeout=TIMEOUT)
    wait_drawn(page, timeout=TIMEOUT)
    number(page, f"{key}_long_k0", 980)
    wait_param(page, "win", "1000,980,32")
    assert any(t.startswith("Exact weights: queries 1000–1031, keys 980–1011") for t in titles(page)), titles(page)
    number(page, f"{key}_long_pos", 1500)
    wait_param(page, "pos", "1500")
    page.get_by_role("radio", name="this layer's mean over heads", exact=True).first.click(force=True)
    wait_param(page, "scope", "layer")
    # the text before the position (DOC_BEFORE tokens, one span a token), the box scrolled so it shows the position
    assert page.locator(".attention-document span").count() > 1000
    assert page.evaluate(POSITION_IN_VIEW), "the document view does not show the chosen position"
    assert page.get_by_text("Top 10 source tokens of position 1500", exact=False).count() == 1
    no_exception(page)
    pick(page, other_head[0], other_head[1])
    wait_param(page, "head", other_head[1])
    no_exception(page)


def test_long_prompt_on_llm_and_attention(server, browser):
    from model import load_model

    n = load_model("smollm2").encode(LONG).shape[1]
    assert 2000 <= n <= 2100, n
    # /llm: paste into the page's prompt box; a head opens from the Layer/Head selects.
    ctx = browser.new_context(viewport={"width": 1400, "height": 3400})
    try:
        page = ctx.new_page()
        page.goto(f"{server}/llm?checkpoint=smollm2")
        wait_drawn(page, timeout=TIMEOUT)
        paste(page, page.locator(".st-key-llm_prompt textarea"), LONG)
        page.get_by_text(f"{n:,} tokens: every attention map would take", exact=False).wait_for(timeout=TIMEOUT)
        wait_drawn(page, timeout=TIMEOUT)
        pick(page, "llm_layer", "17")
        wait_param(page, "layer", "17")
        pick(page, "llm_head", "3")
        wait_param(page, "head", "3")
        assert any(t.startswith("Layer 17, head 3: the whole input, pooled") for t in titles(page)), titles(page)
        shot(page, "llm-head")
        drive_long_views(page, "llm", ("llm_head", "5"))
        assert any(t.startswith("Layer 17, head 5: the whole input, pooled") for t in titles(page)), titles(page)
        page.locator(".st-key-llm_long_window").scroll_into_view_if_needed()
        shot(page, "llm-zoom")
        page.locator(".attention-document").scroll_into_view_if_needed()
        assert page.evaluate(POSITION_IN_VIEW)
        shot(page, "llm-document")
        link = page.url
    finally:
        ctx.close()
    # The link, copied into a new context: the prompt is not in it (a reload would send 10,000 characters in the
    # request line) but named, as this server's copy; the same prompt, head and window come back.
    query = parse_qs(urlparse(link).query)
    assert "prompt" not in query and "text" not in query and query["prompt_ref"], query
    ctx = browser.new_context(viewport={"width": 1400, "height": 3400})
    try:
        page = ctx.new_page()
        page.goto(link)
        wait_drawn(page, timeout=TIMEOUT)
        no_exception(page)
        assert page.locator(".st-key-llm_prompt textarea").input_value() == LONG
        assert any(t.startswith("Layer 17, head 5: the whole input, pooled") for t in titles(page)), titles(page)
        assert any(t.startswith("Exact weights: queries 1000–1031, keys 980–1011") for t in titles(page)), titles(page)
    finally:
        ctx.close()
    # The Attention page: paste into the sidebar's prompt; the page chooses layer and head itself.
    ctx = browser.new_context(viewport={"width": 1400, "height": 3400})
    try:
        page = ctx.new_page()
        page.goto(f"{server}/?checkpoint=smollm2")
        wait_drawn(page, timeout=TIMEOUT)
        paste(page, page.locator('[data-testid="stSidebar"] textarea').first, LONG)
        page.get_by_text(f"{n:,} tokens: every attention map would take", exact=False).wait_for(timeout=TIMEOUT)
        wait_drawn(page, timeout=TIMEOUT)
        pick(page, "attn_long_layer", "11")
        wait_param(page, "layer", "11")
        drive_long_views(page, "attn", ("attn_long_head", "1"))
        assert any(t.startswith("Layer 11, head 1: the whole input, pooled") for t in titles(page)), titles(page)
        shot(page, "attention")
    finally:
        ctx.close()
