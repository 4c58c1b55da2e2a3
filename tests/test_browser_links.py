"""Addresses and links in a real browser (Chromium), issue 17 items 3 and 7: an /attention link (the
Attention page is served at the root) or an unknown address lands on the Attention page with a note in
the UI language, never Streamlit's English "Page not found" dialog; no "Deploy" button; in zh the
sidebar's section and page are not both named 实验.

Run: pytest -m browser tests/test_browser_links.py
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest
from browser_support import NO_LM_WARM, wait_drawn

pytestmark = pytest.mark.browser
SERVER_ENV = NO_LM_WARM  # no page here shows SmolLM2: its server does not warm it (browser_support)


def alerts(page) -> list[str]:
    return page.locator('[data-testid="stAlert"]').all_inner_texts()


def test_attention_link_in_zh_lands_on_the_attention_page(server, page):
    page.goto(server + "/attention?lang=zh&head=2")
    wait_drawn(page)
    page.wait_for_timeout(1000)  # Streamlit's "Page not found" dialog would be up by now
    url = urlparse(page.url)
    assert url.path == "/" and parse_qs(url.query)["head"] == ["2"]  # the link's view is kept
    assert page.locator("h1").first.inner_text() == "注意力"
    assert any("首页" in a and "/attention" in a for a in alerts(page)), alerts(page)
    assert page.locator('[role="dialog"]').count() == 0
    assert "Page not found" not in page.locator("body").inner_text()
    # The sidebar's section and page were both 实验: the section now reads 动手实验.
    sections = page.locator('[data-testid="stNavSectionHeader"]').all_inner_texts()
    links = [x.split("\n")[-1].strip() for x in page.locator('[data-testid="stSidebarNav"] a').all_inner_texts()]
    assert "动手实验" in sections and "实验" in links, (sections, links)  # (a link's text starts with its icon's name)
    assert not set(sections) & set(links)


def test_an_unknown_address_lands_on_the_start_page_with_a_note(server, page):
    page.goto(server + "/no-such-page?lang=en")
    wait_drawn(page)
    page.wait_for_timeout(1000)
    assert urlparse(page.url).path == "/"
    assert page.locator("h1").first.inner_text() == "Attention"
    assert any("There is no page at /no-such-page" in a for a in alerts(page)), alerts(page)
    assert page.locator('[role="dialog"]').count() == 0


def test_no_deploy_button(server, page):
    page.goto(server + "/experiments?lang=zh")
    wait_drawn(page, need_chart=False)
    page.wait_for_selector('[data-testid="stToolbar"]', state="attached")
    assert page.locator('[data-testid="stAppDeployButton"]').count() == 0
    assert "Deploy" not in page.locator('[data-testid="stToolbar"]').inner_text()


def test_a_top_head_link_opens_that_head_on_the_attention_page(server, page):
    page.goto(server + "/experiments?lang=zh&checkpoint=dates&text=3+november+2023&exp_view=heads")
    wait_drawn(page)
    link = page.locator('[data-testid="stPageLink"] a').first
    label = link.inner_text()
    module, _, rest = label.partition(", ")
    link.click()
    page.wait_for_url(lambda u: urlparse(u).path == "/", timeout=60_000)
    wait_drawn(page)
    query = parse_qs(urlparse(page.url).query)
    assert page.locator("h1").first.inner_text() == "注意力" and page.locator('[role="dialog"]').count() == 0
    layer = module.split(".")[2]
    assert query["layer"] == [layer] and query["head"][0] in rest, (label, query)
