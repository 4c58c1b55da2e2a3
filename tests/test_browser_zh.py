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


def test_presentation_mode_lesson_picker_is_big(server, projector):
    page = projector
    page.goto(f"{server}/lessons?lang=zh&lesson=2&present=1")
    wait_drawn(page)
    no_exception(page)
    # The chosen lesson's text inside the drop-down, as large as the body text (~23 px), not 14 px.
    picker = page.locator(".st-key-lesson_n input")
    assert picker.input_value().startswith("2. ")
    size = float(picker.evaluate("el => parseFloat(getComputedStyle(el).fontSize)"))
    assert size >= 22, size
    picker.click()
    option = page.get_by_role("option").first
    option.wait_for(timeout=10_000)
    assert float(option.evaluate("el => parseFloat(getComputedStyle(el).fontSize)")) >= 22
    page.screenshot(path=str(SHOTS / "zh-lessons-present-picker.png"))


ANNOTATION_SIZES = """() => [...document.querySelectorAll('.js-plotly-plot .annotation-text')]
  .filter(el => el.textContent.trim()).map(el => ({text: el.textContent,
    size: parseFloat(el.style.fontSize || getComputedStyle(el).fontSize), fill: el.style.fill}))"""


def dark(fill: str) -> bool:
    """An rgb(...) fill whose every channel is under 100 (near-black ink, not light grey)."""
    nums = [int(x) for x in fill[fill.index("(") + 1:fill.index(")")].split(",")[:3]]
    return max(nums) < 100


def test_architecture_map_in_zh_is_readable_on_a_projector(server, projector):
    page = projector
    page.goto(f"{server}/architecture?lang=zh")
    wait_drawn(page)
    no_exception(page)
    labels = page.evaluate(ANNOTATION_SIZES)
    blocks = [a for a in labels if "交叉注意力" in a["text"] or "残差连接" in a["text"]]
    assert blocks and all(a["size"] >= 14 and dark(a["fill"]) for a in blocks), blocks
    # The link list: every label is shown whole (no ellipsis, nothing cut).
    links = page.locator(".st-key-arch_links [data-testid='stPageLink']")
    assert links.count() == 14
    cut = page.evaluate("() => [...document.querySelectorAll(\".st-key-arch_links [data-testid='stPageLink'] *\")]"
                        ".filter(el => el.scrollWidth > el.clientWidth + 1 && el.childElementCount === 0)"
                        ".map(el => el.textContent)")
    assert not cut, cut
    assert links.filter(has_text="解码器：多头交叉注意力（Q 来自解码器，K、V 来自编码器）").count() == 1
    page.set_viewport_size({"width": 1280, "height": 1600})
    wait_drawn(page)
    page.screenshot(path=str(SHOTS / "zh-architecture.png"))
    page.goto(f"{server}/architecture?lang=zh&present=1")
    wait_drawn(page)
    big = [a for a in page.evaluate(ANNOTATION_SIZES) if "交叉注意力" in a["text"]]
    assert big and all(a["size"] >= 18 for a in big), big
    page.screenshot(path=str(SHOTS / "zh-architecture-present.png"))
