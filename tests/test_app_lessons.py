"""Lessons page (AppTest) and the lessons' answer checkers against independent references; the
toy tasks' grammar, examples and input problems; the sidebar's task help."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import assert_clean, figures, open_page
from streamlit.testing.v1 import AppTest
from test_app import z_of
from test_i18n import english_sentences, english_words, figure_texts, halfwidth_punctuation, shown_texts, walk

from model import noam_lr
from model.toy.checkpoint import load_checkpoint
from model.toy.tasks import TASKS, closest_zh, date_fields, parse_date
from viz import lessons as LS
from viz.figures import attention as F

PAGE = "viz/pages/lessons.py"
TIMEOUT = 300


def open_lessons(lang: str = "en", **query) -> AppTest:
    return open_page(PAGE, query={"lang": lang, **query}, timeout=TIMEOUT)


def question_radio(at: AppTest):
    return next(r for r in at.radio if r.key and r.key.startswith("lesson_q_"))


# ---------------------------------------------------------------- the page


@pytest.mark.slow
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_lesson_runs_with_one_live_view(lang):
    at = open_lessons(lang)
    for n in range(1, len(LS.LESSONS) + 1):
        assert_clean(at)
        assert at.session_state["lesson_n"] == n and at.query_params["lesson"] == str(n)
        assert len(at.get("plotly_chart")) == 1, f"lesson {n}: one live view"
        assert at.header[0].value.startswith(f"{n}. ")
        assert question_radio(at).options, f"lesson {n}: a question with options"
        assert any("🧪" == e.proto.icon for e in at.info), f"lesson {n}: a try-this task"
        if lang == "zh":  # the lesson itself (the sidebar is the app shell's) has no English sentence
            english = [(k, hit) for k, text in shown_texts(at, at.main) for hit in english_sentences(text)]
            english += [(k, hit) for k, text in figure_texts(at)
                        for hit in english_sentences(text) + english_words(text)]
            assert not english, f"lesson {n}: {english}"
            texts = shown_texts(at, at.main) + figure_texts(at)
            halfwidth = [(k, text[:80]) for k, text in texts if halfwidth_punctuation(text)]
            assert not halfwidth, f"lesson {n}: half-width punctuation in Chinese: {halfwidth}"
        if n < len(LS.LESSONS):
            at.button(key="lesson_next").click().run()
    assert at.button(key="lesson_next").disabled


def test_url_opens_a_lesson_and_answers_are_checked():
    at = open_lessons(lesson=5)
    assert_clean(at)
    assert at.header[0].value == "5. Multi-head attention"
    # The drawn grid is the captured cross-attention of decoder layer 0 (the lesson's default), head by head.
    trace = load_checkpoint("dates").trace("3 november 2023")[1]
    w = trace["decoder.layers.0.cross_attn.weights"][0]  # (H, T, S)
    for h, panel in enumerate(figures(at)[0]["data"]):
        np.testing.assert_array_equal(z_of(panel), w[h].numpy())
    # Independent answer: month digits are ISO positions 5, 6; "november" is characters 2..9.
    share = w[:, 5:7, 2:10].sum(-1).mean(-1)
    best = str(int(share.argmax()))
    wrong = next(str(h) for h in range(len(share)) if float(share[h]) < float(share.max()) - 0.05)
    question_radio(at).set_value(wrong).run()
    assert at.warning and not at.success
    assert f"0 of {len(LS.LESSONS)} questions" in at.get("progress")[0].proto.text
    question_radio(at).set_value(best).run()
    assert_clean(at)
    assert at.success and at.session_state["lessons_done"] == {"multi-head"}
    assert f"1 of {len(LS.LESSONS)} questions" in at.get("progress")[0].proto.text


def test_presentation_mode_is_in_the_url_and_puts_the_figure_first():
    at = open_lessons(lesson=3, present=1)
    assert_clean(at)
    assert at.toggle(key="lesson_present").value is True
    assert any("stSidebar" in str(h.proto.body) and "display: none" in str(h.proto.body) for h in at.get("html"))
    # at least 440 px; a heatmap with many rows gets more (26 px a row: viz.figures.present, issue 26 §2)
    assert figures(at)[0]["layout"]["height"] >= 440
    order = [e.type for e in walk(at.main) if e.type in ("plotly_chart", "markdown")]
    assert order.index("plotly_chart") < order.index("markdown"), order
    at.toggle(key="lesson_present").set_value(False).run()
    assert "present" not in at.query_params
    order = [e.type for e in walk(at.main) if e.type in ("plotly_chart", "markdown")]
    assert order.index("markdown") < order.index("plotly_chart")


def test_keyboard_script_clicks_the_nav_buttons():
    at = open_lessons(lesson=2)
    script = next(str(h.proto.body) for h in at.get("html") if "keydown" in str(h.proto.body))
    assert ".st-key-lesson_" in script and "ArrowRight" in script and "ArrowLeft" in script
    assert "http" not in script  # offline: no external resource


def test_full_page_link_carries_the_lesson_model_and_sentence():
    at = open_lessons(lesson=7)
    at.text_input(key="lesson_text_alignment").set_value("我们明天会喝两杯茶").run()
    at.button(key="lesson_open").click().run()
    assert_clean(at)
    assert at.session_state["checkpoint"] == "zh-en"
    assert at.session_state["source_text"] == "我们明天会喝两杯茶"
    assert at.query_params["text"] == "我们明天会喝两杯茶"
    assert any(t.value == "Step-by-step decoder" for t in at.title)
    at.switch_page(PAGE).run()  # back to the lessons: the same lesson, not lesson 1
    assert at.header[0].value.startswith("7. ")


def test_full_page_link_opens_the_same_view():
    at = open_lessons(lesson=3)
    at.get_by_key("lesson_param_one-head").set_value(2).run()
    at.button(key="lesson_open").click().run()
    assert_clean(at)
    assert (at.session_state["attn_kind"], at.session_state["attn_view"]) == ("enc", "pipeline")
    assert at.session_state["attn_head"] == 2 and at.session_state["checkpoint"] == "dates"
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    assert any(tt.startswith("encoder layer 0 · self-attention · head 2: softmax") for tt in titles), titles


def test_lesson_sentence_and_value_are_kept_in_the_link():
    at = open_lessons(lesson=5)
    at.text_input(key="lesson_text_multi-head").set_value("2023年11月3日").run()
    at.get_by_key("lesson_param_multi-head").set_value(1).run()
    assert (at.query_params["lesson_text"], at.query_params["lesson_value"]) == ("2023年11月3日", "1")
    fresh = open_lessons(**{k: at.query_params[k] for k in at.query_params if k != "lang"})  # the copied link
    assert_clean(fresh)
    assert fresh.text_input(key="lesson_text_multi-head").value == "2023年11月3日"
    assert fresh.get_by_key("lesson_param_multi-head").value == 1
    assert figures(fresh)[0]["layout"]["title"]["text"] == figures(at)[0]["layout"]["title"]["text"]
    fresh.button(key="lesson_next").click().run()  # the next lesson opens on its own sentence
    assert fresh.text_input(key="lesson_text_masks").value == LS.LESSONS[5].text
    assert "lesson_text" not in fresh.query_params and "lesson_value" not in fresh.query_params


def test_a_default_sentence_stays_out_of_the_link_and_a_long_one_goes_as_a_reference():
    at = open_lessons(lesson=1)
    assert "lesson_text" not in at.query_params and "lesson_text_ref" not in at.query_params
    at.text_input(key="lesson_text_tokens").set_value("我" * 1001).run()
    assert "lesson_text" not in at.query_params and "lesson_text_ref" in at.query_params
    assert any("reference to a copy kept on this server" in c.value for c in at.caption)
    ref = at.query_params["lesson_text_ref"]
    fresh = open_lessons(lesson=1, lesson_text_ref=ref[-1] if isinstance(ref, list) else ref)
    assert fresh.text_input(key="lesson_text_tokens").value == "我" * 1001


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_an_empty_sentence_points_to_the_box_on_the_page(lang):
    at = open_lessons(lang, lesson=1)
    for text in ("", "   "):
        at.text_input(key="lesson_text_tokens").set_value(text).run()
        assert not at.exception and len(at.error) == 1
        assert "sidebar" not in at.error[0].value and "侧边栏" not in at.error[0].value
        assert ("box above" if lang == "en" else "上面的输入框") in at.error[0].value


@pytest.mark.parametrize(("lang", "words"), [("en", "Chinese blog posts"), ("zh", "中文博客")])
def test_the_first_page_says_what_the_seed_posts_are(lang, words):
    at = open_lessons(lang, lesson=1)
    assert any(words in c.value and "001" in c.value for c in at.caption), [c.value for c in at.caption]


def test_input_outside_the_grammar_warns_but_runs():
    at = open_lessons(lesson=1)
    at.text_input(key="lesson_text_tokens").set_value("我爱吃苹果").run()
    assert_clean(at)
    assert any("Closest sentence it knows" in w.value for w in at.warning)
    assert len(at.get("plotly_chart")) == 1


# ---------------------------------------------------------------- answers against independent references


def trace_of(name: str, text: str):
    return load_checkpoint(name).trace(text)[1]


def test_tokens_answer_is_the_token_count():
    ckpt = load_checkpoint("zh-en")
    live = LS.live_tokens(trace_of("zh-en", "我爱机器学习"))
    assert live.correct == (str(len(ckpt.src_tokens("我爱机器学习"))),) == ("7",)


def test_positions_answer_is_half_d_model():
    trace = trace_of("zh-en", "我爱机器学习")
    live = LS.live_positions(trace, 100)
    assert live.correct == ("half",)
    pe = trace["encoder.embed.pos"].double()
    torch.testing.assert_close((pe * pe).sum(-1), torch.full((pe.shape[0],), pe.shape[1] / 2, dtype=torch.float64))


def test_one_head_answer_is_the_argmax_of_the_captured_row():
    trace = trace_of("dates", "3 november 2023")
    for head in range(trace["encoder.layers.0.self_attn.weights"].shape[1]):
        live = LS.live_one_head(trace, head)
        k = int(trace["encoder.layers.0.self_attn.weights"][0, head, 0].argmax())
        assert live.correct == (F.token_labels(trace.meta["src_tokens"], k + 1)[k],)


def test_sqrt_dk_answer_matches_the_drawn_samples():
    for d_k in (4, 64, 512):
        live = LS.live_sqrt_dk(None, d_k)
        assert live.correct == ("d",)
        drawn = live.figure.data[0].name  # "q·k (Var = … ≈ d_k = …)": the figure's own samples
        assert f"{LS.dot_variance(d_k):.3g}" in drawn


def test_month_head_answer_in_other_date_formats():
    for text in ("2023年11月3日", "Nov 3, 2023"):
        trace = trace_of("dates", text)
        a, b = date_fields(text)["month"]
        share = trace["decoder.layers.0.cross_attn.weights"][0, :, 5:7, a:b].sum(-1).mean(-1)
        live = LS.live_multi_head(trace, 0)
        assert str(int(share.argmax())) in live.correct
    assert LS.live_multi_head(trace_of("dates", "hello"), 0).correct == ()  # not a date: no question


def test_mask_answer_counts_the_causal_mask():
    trace = trace_of("zh-en", "我昨天吃了一个苹果")
    T = len(trace.meta["tgt_tokens"])
    live = LS.live_masks(trace)
    assert live.correct == (str(T * (T - 1) // 2),)
    assert float(trace["decoder.layers.0.self_attn.weights"][0][:, torch.ones(T, T).triu(1).bool()].max()) == 0.0


def test_alignment_answer_follows_yesterday():
    trace = trace_of("zh-en", "我昨天吃了一个苹果")
    live = LS.live_alignment(trace)
    assert live.args == {"word": "yesterday"}
    rows = trace["decoder.layers.1.cross_attn.weights"][0].mean(0)
    np.testing.assert_allclose(live.figure.data[0].z, rows.numpy(), rtol=1e-6)  # the drawn alignment
    assert live.figure.data[0].y[5] == "5: ##le → yesterday"  # the row that predicts "yesterday"
    k = int(rows[trace.meta["next_tokens"].index("yesterday")].argmax())
    assert live.correct == (F.token_labels(trace.meta["src_tokens"], k + 1)[k],)
    assert trace.meta["src_tokens"][k] in "昨天"


def test_teacher_forcing_answer_compares_decode_with_one_pass():
    ckpt = load_checkpoint("dates")
    out = ckpt.translate("3 november 2023")
    trace = ckpt.trace("3 november 2023")[1]
    live = LS.live_teacher_forcing((trace, out.steps))
    assert live.correct == ("zero",)
    forced = torch.softmax(trace["logits"][0].double(), -1)
    ids = [s.token_id for s in out.steps]
    np.testing.assert_allclose(forced[range(len(ids)), ids].numpy(), [s.prob for s in out.steps], atol=1e-4)


def test_noam_answer_is_the_warmup():
    for warmup in (500, 4000, 12345):
        live = LS.live_noam(None, warmup)
        assert live.correct == (str(warmup),)
        assert noam_lr(warmup, 512, warmup) > max(noam_lr(warmup - 1, 512, warmup), noam_lr(warmup + 1, 512, warmup))
        assert math.isclose(noam_lr(warmup, 512, warmup), F.noam_curve(np.array([warmup]), 512, warmup)[0])


@pytest.mark.slow
def test_bert_answer_from_minilm_weights():
    from model.loaders.minilm import load_minilm

    enc = load_minilm()
    tired, wide = (enc.run_with_trace(s, names="encoder.layers.*.self_attn.weights")[1]
                   for s in (LS.BERT_TIRED, LS.BERT_WIDE))
    live = LS.live_bert((tired, wide))
    layer, head = live.args["layer"], live.args["head"]
    toks = tired.meta["src_tokens"]
    it, animal, street = (toks.index(w) for w in ("it", "animal", "street"))  # single WordPiece tokens
    w_tired = torch.stack([tired[f"encoder.layers.{i}.self_attn.weights"][0, :, it] for i in range(6)])
    assert (layer, head) == np.unravel_index(int(w_tired[..., animal].argmax()), w_tired.shape[:2])
    w = wide[f"encoder.layers.{layer}.self_attn.weights"][0, head, it]
    assert live.correct == ("street" if w[street] > w[animal] else "animal",)


# ---------------------------------------------------------------- tasks: grammar, examples, input problems


@pytest.mark.parametrize("name", sorted(TASKS))
def test_examples_are_in_the_grammar_and_translated_right(name):
    task, ckpt = TASKS[name], load_checkpoint(name)
    assert task.grammar and task.example in task.examples
    expected = {"reverse": lambda s: s[::-1], "dates": lambda s: parse_date(s).isoformat(),
                "zh-en": dict(task.all_pairs() if task.finite else []).get}[name]
    for src in task.examples:
        assert task.input_problems(src) == [], src
        assert ckpt.translate(src).text == expected(src), src


def test_input_problems_name_what_is_wrong():
    zh, dates, rev = TASKS["zh-en"], TASKS["dates"], TASKS["reverse"]
    kinds = lambda task, text: [p.kind for p in task.input_problems(text)]  # noqa: E731
    assert kinds(zh, "I love you") == ["vocabulary"]
    assert kinds(zh, "我爱吃苹果") == ["grammar"]  # every character known, not a sentence of the grammar
    assert kinds(zh, "我爱机器学习学习学习学习学习学习") == ["length", "grammar"]
    assert kinds(zh, "  ") == ["empty"]
    assert kinds(dates, "3 november 2099") == ["range"]
    assert kinds(dates, "31 february 2020") == ["range"]
    assert kinds(dates, "03.11.2023") == ["vocabulary"]
    assert kinds(dates, "november") == ["grammar"]
    assert kinds(rev, "ab") == ["length"] and kinds(rev, "Hello") == ["vocabulary"]
    problem = zh.input_problems("我爱吃苹果")[0]
    assert problem.args["closest"] in {s for s, _ in zh.all_pairs()}
    assert closest_zh("我爱机器学习") == "我爱机器学习"


def test_every_zh_source_is_in_the_grammar():
    zh = TASKS["zh-en"]
    sources = [s for s, _ in zh.all_pairs()]
    assert all(not zh.input_problems(s) for s in sources[::97])


def test_date_fields_agree_with_parse_date():
    for src, _ in TASKS["dates"].sample(300, seed=1):
        day, f = parse_date(src), date_fields(src)
        assert day is not None and int(src[slice(*f["year"])]) == day.year


# ---------------------------------------------------------------- task help in the sidebar

TASK_HELP_SCRIPT = """
import streamlit as st
from viz.ui.sidebar import Selection
from viz.ui.task_help import task_help
st.session_state.setdefault("source_text", "我爱吃苹果")
task_help(Selection("zh-en", st.session_state["source_text"], None))
"""


def test_task_help_shows_grammar_examples_and_warnings():
    at = AppTest.from_string(TASK_HELP_SCRIPT, default_timeout=TIMEOUT)
    at.query_params["lang"] = "zh"
    at.run()
    assert_clean(at)
    assert [w.value for w in at.sidebar.warning] == [
        "所有字符都认识，但这个玩具语法生成不了这个句子，所以模型从没训练过类似的句子。它认识的最接近的句子：我吃苹果"]
    assert any("主语" in m.value for m in at.sidebar.markdown)
    picker = at.sidebar.selectbox(key="task_example")
    assert picker.options == list(TASKS["zh-en"].examples)
    picker.set_value("我昨天吃了一个苹果").run()
    assert at.session_state["source_text"] == "我昨天吃了一个苹果"
    assert not at.sidebar.warning  # the example is in the grammar
