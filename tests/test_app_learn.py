"""The Watch attention learn page (/learn, issue 33) in AppTest, en and zh: it opens from the shipped run, says
the sentence computed from the checkpoints, keeps the step in the URL, and the step slider redraws the map."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from conftest import assert_clean, figure_titled
from streamlit.testing.v1 import AppTest
from test_app import z_of
from test_i18n import english_in_zh
from tolerance import f32_tol

from model.analysis import phenomena as PH
from model.toy import learn as LR
from viz.ui.learn_run import shipped

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PAGE = "viz/pages/learn.py"
TIMEOUT = 300


def run(query: dict) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(query)
    at.switch_page(PAGE)
    at.run()
    return at


def titles(at: AppTest) -> list[str]:
    return [json.loads(c.proto.spec)["layout"].get("title", {}).get("text", "") for c in at.get("plotly_chart")]


def test_learn_page_opens_in_english_with_the_computed_sentence_and_the_step_in_the_url():
    at = run({"step": "1015"})
    assert_clean(at)
    sm = shipped()[2]  # the server's own measured run (the page's cache): measured once in this process
    info = " ".join(i.value for i in at.info)
    assert f"At step {sm.step} " in info and f"head {sm.layer}.{sm.head}'s induction score" in info
    assert at.select_slider(key="learn_step").value == 1015
    assert any("at step 1015" in x for x in titles(at))
    at.select_slider(key="learn_step").set_value(sm.step).run()
    assert_clean(at)
    assert at.query_params["step"] == [str(sm.step)] or at.query_params["step"] == str(sm.step)
    assert any(f"at step {sm.step}" in x for x in titles(at))
    assert len(at.get("plotly_chart")) >= 8  # curves, the map, 3 scores x 2 models, K-composition
    opens_on_the_other_pages(at, sm.step)


def own_trace(step: int):
    """The shipped 2-layer checkpoint at `step`, run by itself on the probe's first row: (trace, settings)."""
    run = LR.load_run(score=False)["attn2"]
    probe = LR.probe_ids(run.settings)[:1]
    return run.model_at(run.steps.index(step)).run_with_trace(probe, names="*.self_attn.weights")[1], run.settings


def opens_on_the_other_pages(at: AppTest, step: int) -> None:
    """One click on /learn opens the chosen checkpoint on the Attention page, one more in the Language model page's
    head overview: both show that checkpoint's own numbers, and it is in the session's model list."""
    layer, head = map(int, at.selectbox(key="learn_head").value.split("."))
    trace, s = own_trace(step)
    name = f"learn: 2 layers, step {step}"
    at.button(key="learn_open_attention").click().run()
    assert_clean(at)
    assert any(x.value == "Attention" for x in at.title)
    assert at.session_state["checkpoint"] == name and name in at.sidebar.selectbox(key="checkpoint").options
    assert (at.session_state["attn_layer"], at.session_state["attn_head"]) == (layer, head)
    fig = figure_titled(at, f"decoder.layers.{layer}.self_attn · head {head} · softmax weights")
    z = z_of(next(d for d in fig["data"] if d["type"] == "heatmap" and d.get("visible", True) is True))
    want = trace[f"decoder.layers.{layer}.self_attn.weights"][0, head].double().numpy()
    assert z.shape == want.shape and np.abs(z - want).max() <= f32_tol(want, n=s.d_model)
    at.switch_page(PAGE).run()
    at.button(key="learn_open_llm").click().run()
    assert_clean(at)
    assert at.query_params["rep"] in ([f"{s.n}:{s.probe_seed}"], f"{s.n}:{s.probe_seed}")
    ind = PH.head_statistics(trace, period=s.n)["induction"].scores  # [L, H], Olsson's recipe on its period
    z = z_of(figure_titled(at, "Induction score")["data"][0])
    assert z.shape == ind.shape and np.abs(z - ind).max() <= f32_tol(ind, n=s.d_model)


def test_learn_page_opens_in_chinese_without_english():
    at = run({"lang": "zh"})
    assert_clean(at)
    assert at.get("plotly_chart")
    leftover = english_in_zh(at)
    assert not leftover, leftover[:10]


def test_a_link_with_a_step_that_is_not_a_checkpoint_falls_back_with_a_note():
    at = run({"step": "12345", "lhead": "9.9"})
    assert_clean(at)
    assert at.select_slider(key="learn_step").value in LR.load_run(score=False)["attn2"].steps
    assert any("12345" in w.value for w in at.warning)


def test_train_it_yourself_runs_in_a_thread_shows_progress_and_stops():
    at = run({"change": "one_layer", "seed": "3"})
    assert at.radio(key="learn_change").value == "one_layer" and at.number_input(key="learn_seed").value == 3
    next(b for b in at.get("form_submit_button") if "Train" in b.label).click()
    at.run()
    assert_clean(at)
    job = at.session_state["learn_job"]
    assert job.settings.change == "one_layer" and job.settings.seed == 3
    assert at.button(key="learn_stop") and at.get("progress")  # the live view while it runs
    time.sleep(1.0)
    job.stop.set()
    assert job.finished.wait(120), "training did not stop"
    at.run()
    assert_clean(at)
    assert job.run is not None and job.run.steps[0] == 0 and len(job.run.loss) < job.settings.steps
    assert "1 layer, seed 3" in at.success[0].value
    assert any("Your run against the shipped one" in x for x in titles(at))
    mine = [n for n in at.session_state["session_models"] if n.startswith("learn: run ")]  # joins the model list
    assert len(mine) == 1 and mine[0].endswith(f"(one layer, seed 3), step {job.run.steps[-1]}")
    at.radio(key="learn_model").set_value("yours").run()  # its checkpoints on the step slider, each one click away
    assert_clean(at)
    assert at.select_slider(key="learn_step").options == [str(x) for x in job.run.steps]
    step = at.select_slider(key="learn_step").value
    assert at.button(key="learn_open_attention").label == f"Open step {step} on the Attention page"


def test_lesson_17_is_answered_from_the_shipped_run_and_opens_the_learn_page():
    from test_app_lessons import open_lessons, question_radio

    from viz import lessons as LS

    n = next(i for i, x in enumerate(LS.LESSONS, 1) if x.slug == "induction-forms")
    at = open_lessons(lesson=n)
    assert_clean(at)
    assert at.header[0].value == f"{n}. Watch an induction head form" and len(at.get("plotly_chart")) == 1
    sm = shipped()[2]
    ids = [label.split()[-1] for label in question_radio(at).options]  # "step 675": the option's id is its step
    wrong = next(o for o in ids if o != str(sm.step))
    question_radio(at).set_value(wrong).run()
    assert not at.success
    question_radio(at).set_value(str(sm.step)).run()
    assert at.success and f"At step {sm.step} " in at.success[0].value
    assert "induction-forms" in at.session_state["lessons_done"]
    at.button(key="lesson_open").click().run()
    assert_clean(at)
    assert any(x.value == "Watch attention learn" for x in at.title)
