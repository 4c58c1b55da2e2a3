"""Issue 31 §4, the teacher's items, under AppTest: the lessons caption counts its lessons, presentation mode
sizes the sentence box and the captions for a projector, lesson 15 asks anew when the prompt changes, the
empty-prompt message on "/" is in zh, and plotly's toolbar speaks zh."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import assert_clean
from streamlit.testing.v1 import AppTest
from test_app_lessons import open_lessons, question_radio

from viz import lessons as LS

APP = str(Path(__file__).resolve().parents[1] / "app.py")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_caption_counts_the_lessons(lang):
    at = open_lessons(lang)
    assert_clean(at)
    cap = at.caption[0].value
    n, lm = len(LS.LESSONS), [i for i, x in enumerate(LS.LESSONS, 1) if x.checkpoint == LS.LM_NAME]
    gemma = [i for i, x in enumerate(LS.LESSONS, 1) if x.checkpoint == LS.HORIZON_NAME]
    assert n >= 19 and (lm[0], lm[-1]) == (11, 19) and gemma == [18]  # 19: lesson 19 (SmolLM2, why a head looks)
    if lang == "en":
        assert cap.startswith(f"{n} short lessons") and f"Lessons {lm[0]}–{lm[-1]} open" in cap, cap
        assert f"Lesson {gemma[0]} opens Gemma 3 270M" in cap, cap
        assert "Ten" not in cap and "Sixteen" not in cap
    else:
        assert cap.startswith(f"{n} 节") and f"第 {lm[0]}–{lm[-1]} 课" in cap and "十节" not in cap, cap
        assert f"第 {gemma[0]} 课打开 Gemma 3 270M" in cap, cap


def _rem(css: str, selector_part: str) -> float:
    """The font size (rem) of the rule whose selector mentions selector_part."""
    for sel, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        if selector_part in sel and (m := re.search(r"font-size:\s*([\d.]+)rem", body)):
            return float(m.group(1))
    return 0.0


def test_presentation_mode_sizes_the_sentence_box_and_the_notes():
    at = open_lessons(lesson=12, present=1)  # a SmolLM2 lesson: its sentence box and the "stay English" note
    assert_clean(at)
    css = next(str(h.proto.body) for h in at.get("html") if "stSidebar" in str(h.proto.body))
    body = _rem(css, '[data-testid="stMarkdownContainer"] p')
    assert body >= 1.4
    assert _rem(css, "st-key-lesson_text_") >= body  # the sentence box, as large as the lesson's text
    assert _rem(css, "stCaptionContainer") >= 1.2  # the captions ("the prompts here stay English"): ~19 px
    assert any((w.key or "").startswith("lesson_text_") for w in at.text_input)


def test_lesson_15_asks_anew_when_the_prompt_changes():
    n = next(i for i, x in enumerate(LS.LESSONS, 1) if x.slug == "lens")
    at = open_lessons(lesson=n)
    assert_clean(at)
    for label in question_radio(at).options:  # "layer 12": the option's id is its number
        o = label.split()[-1]
        question_radio(at).set_value(o).run()
        if at.success:
            break
    assert at.success
    at.text_input(key="lesson_text_lens").set_value("The capital of Japan is").run()
    assert_clean(at)
    assert question_radio(at).value is None, "the old answer stays selected for the new prompt"
    assert not at.success


def test_an_empty_prompt_on_the_first_page_is_said_in_zh():
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"lang": "zh", "checkpoint": "smollm2", "text": ""})
    at.run()
    assert not at.exception
    msgs = [e.value for e in at.error]
    assert msgs and not any("The text is empty" in m for m in msgs), msgs
    assert any("为空" in m for m in msgs), msgs


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_plotly_toolbar_speaks_the_ui_language(lang):
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"lang": lang, "checkpoint": "dates", "text": "3 november 2023"})
    at.run()
    assert_clean(at)
    configs = [json.loads(c.proto.config) for c in at.get("plotly_chart")]
    assert configs
    for cfg in configs:
        if lang == "en":
            assert "locale" not in cfg
        else:
            assert cfg["locale"] == "zh-CN"
            words = cfg["locales"]["zh-CN"]["dictionary"]
            assert words["Zoom in"] == "放大" and words["Download plot as a PNG"] and words["Reset axes"]
