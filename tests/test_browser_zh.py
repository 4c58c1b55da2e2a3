"""The Chinese UI and the lessons on a 1280×720 projector, in a real browser (Chromium).

Saves artifacts/screenshots/zh-*.png (look at them): the lessons page normal and in presentation
mode, and a few main pages. Checks what AppTest cannot see: the sidebar really is hidden in
presentation mode, the figure is on screen without scrolling, and ← / → change the lesson.

Run: pytest -m browser tests/test_browser_zh.py
"""

from __future__ import annotations

import pytest
from browser_support import SHOTS, wait_drawn

pytestmark = pytest.mark.browser

PROJECTOR = {"width": 1280, "height": 720}
MAIN_PAGES = ("attention", "decoder", "tokens")


@pytest.fixture
def projector(browser):
    context = browser.new_context(viewport=PROJECTOR, locale="zh-CN")
    pg = context.new_page()
    yield pg
    context.close()


def lesson_header(page) -> str:
    return page.locator('[data-testid="stHeading"] h2').first.inner_text()


def no_exception(page) -> None:
    boxes = page.locator('[data-testid="stException"]')
    assert not boxes.count(), boxes.first.inner_text()[:500]


def test_lessons_in_zh_normal_and_presentation(server, projector):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = projector
    page.goto(f"{server}/lessons?lang=zh&lesson=5")
    wait_drawn(page)
    no_exception(page)
    assert lesson_header(page).startswith("5. 多头注意力")
    assert page.locator('[data-testid="stSidebar"]').is_visible()
    page.screenshot(path=str(SHOTS / "zh-lessons.png"))

    page.goto(f"{server}/lessons?lang=zh&lesson=5&present=1")
    wait_drawn(page)
    no_exception(page)
    assert not page.locator('[data-testid="stSidebar"]').is_visible()
    chart = page.locator(".js-plotly-plot").first.bounding_box()
    assert chart and chart["y"] + chart["height"] <= PROJECTOR["height"] + 40, chart  # on screen, no scrolling
    size = page.evaluate("() => parseFloat(getComputedStyle(document.querySelector("
                         "'[data-testid=stMarkdownContainer] p')).fontSize)")
    assert size >= 22, size
    page.screenshot(path=str(SHOTS / "zh-lessons-present.png"))


def test_arrow_keys_change_the_lesson(server, projector):
    page = projector
    page.goto(f"{server}/lessons?lang=zh&lesson=3&present=1")
    wait_drawn(page)
    page.locator('[data-testid="stHeading"] h2').first.click()  # focus the page, not a widget
    page.keyboard.press("ArrowRight")
    page.wait_for_function("() => new URL(location.href).searchParams.get('lesson') === '4'", timeout=60_000)
    wait_drawn(page)
    assert lesson_header(page).startswith("4. ")
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("() => new URL(location.href).searchParams.get('lesson') === '3'", timeout=60_000)
    wait_drawn(page)
    assert lesson_header(page).startswith("3. ")
    assert "present=1" in page.url
    no_exception(page)
    page.screenshot(path=str(SHOTS / "zh-lessons-present-3.png"))


@pytest.mark.parametrize("name", MAIN_PAGES)
def test_main_pages_in_zh(server, projector, name):
    page = projector
    page.goto(f"{server}/{'' if name == 'attention' else name}?lang=zh")
    wait_drawn(page)
    no_exception(page)
    page.set_viewport_size({"width": 1280, "height": 2400})  # the full page, at the projector's width
    wait_drawn(page)
    page.screenshot(path=str(SHOTS / f"zh-{name}.png"))


def test_language_switch_click(server, projector):
    page = projector
    page.goto(f"{server}/lessons?lang=zh&lesson=9")
    wait_drawn(page)
    assert lesson_header(page).startswith("9. 学习率预热")
    page.locator('[data-testid="stSidebar"]').get_by_role("radio", name="English").click()
    page.wait_for_function("() => new URL(location.href).searchParams.get('lang') === 'en'", timeout=60_000)
    wait_drawn(page)
    assert lesson_header(page).startswith("9. Learning-rate warmup")
    assert "lesson=9" in page.url  # the lesson stays
