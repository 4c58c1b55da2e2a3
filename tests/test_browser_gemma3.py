"""Gemma 3 270M in Chromium, in Chinese (issue 30 §3): a Chinese sentence pasted into /llm's prompt box on
`?checkpoint=gemma3&lang=zh` is cut into Chinese pieces (我 / 爱 / 机器学习), not byte fallbacks, and the tokens
heading names SentencePiece. Screenshot: artifacts/screenshots/gemma3-zh-tokens.png."""

from __future__ import annotations

import pytest
from browser_support import NO_LM_WARM, SHOTS, wait_drawn

pytestmark = pytest.mark.browser
SERVER_ENV = NO_LM_WARM  # no page here shows SmolLM2: its server does not warm it (browser_support)
TIMEOUT = 240_000
ZH = "我爱机器学习，今天天气很好。"


def test_a_pasted_chinese_sentence_is_chinese_pieces(server, page):
    page.goto(f"{server}/llm?checkpoint=gemma3&lang=zh")
    wait_drawn(page, timeout=TIMEOUT)
    box = page.locator(".st-key-llm_prompt textarea")
    box.fill(ZH)
    box.press("Control+Enter")
    page.wait_for_function(f"() => new URLSearchParams(location.search).get('prompt') === {ZH!r}", timeout=TIMEOUT)
    wait_drawn(page, timeout=TIMEOUT)
    heading = page.get_by_text("个词元（SentencePiece 片段", exact=False).first
    heading.click()  # open the token list
    line = page.locator("p", has_text="0:<bos>").first  # the token list: one `i:piece` code span each
    line.wait_for(timeout=TIMEOUT)
    text = line.inner_text()
    assert "0:<bos>" in text and "1:我" in text and "2:爱" in text and "3:机器学习" in text, text
    assert "\\x" not in text and "<0x" not in text, text  # no byte fallbacks
    assert page.get_by_text("第 0 个词元是", exact=False).count() >= 1  # the BOS rule, said
    assert page.locator('[data-testid="stException"]').count() == 0
    SHOTS.mkdir(parents=True, exist_ok=True)
    line.scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "gemma3-zh-tokens.png"), full_page=False)
