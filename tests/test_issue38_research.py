"""Issue 38 §5, what a researcher and an engineer saw: /llm's head heatmap sized to its tokens, /since2017 §6's reach
labels, /flow's agreement labels, interval, edge links, routes legend and link note; /learn's estimate, its first
seconds, its comparison chart, its step axis and the head lesson 17 cites; a model brought to the server that cannot
open (the missing file said, the URL and the sidebar agreeing, one label), the refusal naming what a view needs, and
/since2017 saying which model it draws."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest
from conftest import APP, assert_clean, figures, tiny_bpe_tokenizer

from model.toy import learn as LR
from viz.figures import flow as FF
from viz.figures import learn as FLN
from viz.figures import llm as FLLM
from viz.figures import modern as FM
from viz.ui import lm_models

TIMEOUT = 600


def new_app():
    """The app under AppTest (imported here: the module's figure tests stay in the fast subset; each test that
    runs the app is marked slow itself)."""
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(APP, default_timeout=TIMEOUT)


# ---------------------------------------------------------------- (a) /llm's head heatmap, /since2017 §6, /flow


def head_heatmap(n: int = 14, long_labels: bool = True) -> go.Figure:
    """/llm's head heatmap (attention_heatmap with its head buttons) of a real language model's trace: the shipped
    /learn run's last checkpoint (4 heads) on n tokens; `long_labels`: SmolLM2-like labels ("12: ␣drink → ␣to")."""
    from viz.figures.attention import attention_heatmap
    from viz.ui import learn_run as LRUN

    run = LR.load_run(score=False)["attn2"]
    rm = LRUN.LearnModel("learn test", LR.language_model(run, len(run.steps) - 1, "learn test"), "decoder_lm")
    _, trace = rm.trace(" ".join(str(1 + i % 30) for i in range(n - 1)))
    fig = attention_heatmap(trace, "decoder.layers.1.self_attn", 0, meta=trace.meta, all_heads=True)
    if long_labels:
        for d in fig.data:
            d.x = [f"{i}: ␣tokenpiece{i}" for i in range(n)]
            d.y = [f"{i}: ␣tokenpiece{i} → ␣next{i}" for i in range(n)]
    return fig


def plot_area(fig: go.Figure) -> tuple[float, float]:
    m = fig.layout.margin
    return fig.layout.width - m.l - m.r, fig.layout.height - m.t - m.b


def test_the_llm_head_heatmap_is_sized_to_its_tokens_and_its_labels():
    fig = FLLM.with_min_cells(head_heatmap(14))
    x, y = list(fig.data[0].x), list(fig.data[0].y)
    w, h = plot_area(fig)
    cell = h / 14
    assert 14 * FLLM.MIN_CELL <= h <= 14 * FLLM.MAX_CELL
    assert w >= cell * 14 - 1  # the plot's width holds the square cells (the head buttons may widen the figure)
    assert cell * 14 >= 300  # 14 tokens fill a readable square (was ~140 px at 1920 px)
    assert cell >= 14  # a rotated 12 px label needs ~14 px across: neighbours never overlap
    from viz.figures.attention import text_width

    # the margins hold the labels: plotly's automatic margins then leave the plot as sized
    assert fig.layout.margin.b >= max(text_width(s, 12) for s in x) * math.sin(math.radians(60))
    assert fig.layout.margin.l >= max(text_width(s, 12) for s in y)
    long = FLLM.with_min_cells(go.Figure(go.Heatmap(z=np.ones((300, 300)))))  # a long prompt
    assert long.layout.height <= FLLM.MAX_HEATMAP_HEIGHT and long.layout.width <= FLLM.MAX_HEATMAP_WIDTH


def test_a_two_line_title_sits_above_the_subplot_titles():
    """Lesson 3 at 1920 px: the title's second line (the capture name, the model, the sentence), centred with the
    first in an 80 px top margin, ran into the first subplot's title "QKᵀ". The margin grows by a line: both lines
    (each at most 1.3 × the title's font, centred in the margin) end above the subplot titles."""
    from model import load_checkpoint
    from viz import notebook as nb

    _, trace = load_checkpoint("dates").trace("3 november 2023")
    for fig in (nb.pipeline(trace, 0, 0, "encoder_self"), nb.masks(trace, 0, 0, "encoder_self"),
                nb.qkvz(trace, 0, 0, "encoder_self")):
        title = fig.layout.title
        assert "<br><sup>" in title.text and title.y is None  # plotly's auto: centred in the top margin
        size = (title.font.size if title.font and title.font.size else None) or 17  # the app's template: 17 px
        bottom = fig.layout.margin.t / 2 + 1.3 * size  # two lines centred on the margin's middle
        sub = [a for a in fig.layout.annotations if a.yref == "paper" and a.y >= 1.0]  # the subplot titles
        assert sub and bottom <= fig.layout.margin.t - 1.3 * (sub[0].font.size or 16), (bottom, fig.layout.margin.t)


def test_reach_labels_are_written_where_the_reach_changes():
    far = [0, 511, 1022, 1533, 2044, 2555, 5000, 5000, 5000, 5000]
    assert FM.reach_labels(far) == ["0", "511", "1,022", "1,533", "2,044", "2,555", "5,000", "", "", ""]
    mask = np.tril(np.ones((6, 6), bool))
    fig = FM.sliding_figure(~mask, [mask[-1]] * (len(far)), far, 5000, [str(i) for i in range(6)], 4)
    (line,) = [d for d in fig.data if d.type == "scatter"]
    assert list(line.text) == FM.reach_labels(far) and list(line.y) == far  # every point still drawn and hovered


def test_an_interval_is_written_alike_at_both_ends():
    assert FF.interval_text(-0.02, 0.047) == {"lo": "−0.020", "hi": "0.047"}
    assert FF.interval_text(0.1, 0.35) == {"lo": "0.10", "hi": "0.35"}
    assert FF.interval_text(-1.2, -0.5) == {"lo": "−1.20", "hi": "−0.50"}

    class W:
        method, wins, losses, p, low, high = "norm", 7, 5, 0.77, -0.02, 0.047

    class Lead:
        top, rivals, clear, weakest, threshold = "routes", ["norm", "raw"], False, W(), 0.025

    said = FF.lead_sentence(Lead(), {"routes": "0.41", "norm": "0.38", "raw": "0.2"})
    assert "−0.020 to 0.047" in said and "-0.02" not in said


def test_agreement_labels_sit_past_the_error_bars():
    summ = {"raw": {"mean": 0.2, "std": 0.3, "top_k": 0.5, "n": 12},
            "norm": {"mean": -0.1, "std": 0.25, "top_k": 0.4, "n": 12},
            "routes": {"mean": 0.45, "std": 0.2, "top_k": 0.6, "n": 12}}
    fig = FF.agreement_figure({"12 IOI prompts": summ})
    bar, text = fig.data
    assert bar.type == "bar" and not bar.text  # no label on the bar, where the whisker is
    assert text.mode == "text" and list(text.text) == [FF.rho_text(v["mean"]) for v in summ.values()]
    for y, pos, v in zip(text.y, text.textposition, summ.values(), strict=True):
        end = v["mean"] + (v["std"] if v["mean"] >= 0 else -v["std"])
        assert abs(y) > abs(end) and y * end > 0 and abs(y - end) < 0.1  # past the whisker's end, written away
        assert pos == ("top center" if v["mean"] >= 0 else "bottom center")
    lo, hi = fig.layout.yaxis.range
    assert lo < min(text.y) and hi > max(text.y)
    assert bar.offsetgroup == text.offsetgroup and fig.layout.scattermode == "group"  # over its own bar


def test_routes_legend_names_every_kind_drawn_whatever_its_width():
    """SmolLM2: 270 of 388 edges are residual, all wider than the one width bin that carried the legend entry."""
    from model import load_checkpoint
    from model.analysis import flow as FL

    ck = load_checkpoint("dates")
    s = FL.prepare(ck, "3 november 2023")
    r = FL.routes(s)
    wide = [e for e in r.edges(0.002) if e["kind"] == "resid" and e["weight"] > FF.WIDTH_BINS[2]]
    assert wide
    fig = FF.routes_figure(r, wide, s.tokens)
    named = [d.name for d in fig.data if d.showlegend is not False and d.mode == "lines"]
    assert named == ["residual"]
    both = FF.routes_figure(r, r.edges(0.002), s.tokens)
    kinds = {e["kind"] for e in r.edges(0.002)}
    names = {"head": "attention head", "resid": "residual", "ffn": "FFN"}
    shown = [d.name for d in both.data if d.showlegend is not False and d.mode == "lines"]
    assert sorted(shown) == sorted(names[k] for k in kinds)  # each kind once


@pytest.mark.slow
def test_flow_warns_about_pos_only_when_the_url_carried_it():
    """A position the session chose (the last model's last token) is clamped for a shorter prompt without a word
    about a link; a link's own out-of-range pos is said once."""
    at = new_app()
    at.query_params.update({"checkpoint": "dates", "text": "3 november 2023"})
    at.session_state["flow_pos"] = 40  # as switching from a longer prompt leaves it
    at.switch_page("viz/pages/flow.py")
    at.run()
    assert_clean(at)
    assert not [w.value for w in at.warning if "pos=" in str(w.value)]
    links = list(at.get("page_link"))
    assert links and all(len(c.get("page_link")) <= math.ceil(len(links) / 2) for c in at.columns
                         if c.get("page_link"))  # two columns: labels not cut at 1600 px

    at = new_app()
    at.query_params.update({"checkpoint": "dates", "text": "3 november 2023", "pos": "40"})
    at.switch_page("viz/pages/flow.py")
    at.run()
    assert_clean(at)
    assert len([w.value for w in at.warning if "`pos=40`" in str(w.value)]) == 1


# ---------------------------------------------------------------- (b) /learn


@pytest.fixture(scope="module")
def shipped():
    runs = LR.load_run()
    return runs, LR.summary(runs["attn2"], runs["attn1"])


def test_step_zero_has_its_own_place_on_the_step_axis(shipped):
    runs, sm = shipped
    two = runs["attn2"]
    fig = FLN.curves_figure({"attn2": {"label": "2 layers", "loss": two.loss, "steps": two.steps,
                                       "icl": two.series("icl")}}, sm.step, total_steps=two.steps[-1])
    icl = next(d for d in fig.data if d.mode == "lines+markers")
    assert list(icl.customdata) == two.steps  # the hover's step is the checkpoint's own (step 0 said "step 1")
    assert list(icl.x) == [s + 1 for s in two.steps] and len(set(icl.x)) == len(two.steps)  # 0 and 1 apart
    assert "%{customdata" in icl.hovertemplate and "%{x}" not in icl.hovertemplate
    ax = fig.layout.xaxis
    labels = dict(zip(ax.tickvals, ax.ticktext, strict=True))
    assert labels[1] == "0" and labels[101] == "100" and labels[1001] == "1,000"  # each label at its step
    loss = next(d for d in fig.data if d.mode == "lines")
    assert loss.customdata[0] == 1 and loss.x[0] == 2  # the training loss starts at step 1
    k = FLN.kcomp_figure(two.steps, np.zeros(len(two.steps)), np.zeros(len(two.steps)), "pair", sm.step)
    assert list(k.data[0].customdata) == two.steps and k.layout.xaxis.tickvals[0] == 1


def test_the_comparison_chart_labels_both_phase_changes_and_keeps_the_shipped_line(shipped):
    from viz.ui import learn_run as LRUN

    runs, sm = shipped
    two = runs["attn2"]
    fig = LRUN.comparison_figure(two, two.settings, two)  # your run with the shipped setup: the same curves
    lines = [d for d in fig.data if d.mode == "lines"]
    assert [d.name for d in lines] == ["shipped run", "your run"]
    assert lines[0].line.width > lines[1].line.width and lines[0].opacity < 1  # beneath, wider: both seen
    said = [a.text for a in fig.layout.annotations]
    assert f"your run's phase change (step {sm.step})" in said
    assert f"shipped run's phase change (step {sm.step})" in said
    ys = [a.y for a in fig.layout.annotations if "phase change" in a.text]
    assert all(y <= 1 for y in ys)  # inside the panel, under its title


def test_the_live_status_says_not_measured_yet_before_a_score():
    from viz.ui import learn_run as LRUN

    text = LRUN.status_text(0, 2000, None, 3.0)
    assert "not measured yet" in text and "NaN" not in text
    run = LR.Run(LR.Settings())
    assert "not measured yet" in LRUN.status_text(5, 2000, run, 4.0)
    later = LRUN.status_text(100, 2000, run, 10.0)
    assert "about 190 s left at this run's pace" in later  # 10 s for 100 steps: 1,900 steps more


def test_the_estimate_is_this_servers_measured_pace(monkeypatch):
    from viz.ui import learn_run as LRUN

    s = LR.Settings()
    p = LR.pace(s, n_steps=4)
    assert p.step_s > 0 and p.checkpoint_s > 0 and p.steps_timed == 4
    assert p.seconds(s) == pytest.approx(s.steps * p.step_s + len(LR.log_steps(s.steps, s.n_checkpoints))
                                         * p.checkpoint_s)
    fake = LR.Pace(0.05, 0.1, 12)
    monkeypatch.setattr(LRUN, "measured_pace", lambda settings: fake)
    monkeypatch.setattr(LRUN, "_run_paces", lambda: {})
    text = LRUN.estimate_text(s)
    assert f"about {fake.seconds(s):.0f} s on this server now" in text and "50 ms a step" in text
    assert "minute" not in text
    paces = {"none": (0.14, 283.0, __import__("time").time() - 60)}  # the run that was promised a minute
    monkeypatch.setattr(LRUN, "_run_paces", lambda: paces)
    assert "about 280 s on this server (the last run here with this change took 283 s, 1 min ago)" in \
        LRUN.estimate_text(s)


def test_lesson_18s_cold_wait_is_scaled_to_this_servers_load(monkeypatch):
    """The idle figure (10 s) was said for a 35-53 s wait on a class's busy server: a busy server says its load and
    the wait scaled by load / cores; an idle one keeps the idle figures alone."""
    import os

    from viz import i18n

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.2, 1.0, 1.0))
    idle = lm_models.cold_waits("gemma3")
    assert "busy" not in " ".join(idle) and "12–35 s" in idle[0] and "about 10 s" in idle[1]
    monkeypatch.setattr(os, "getloadavg", lambda: (11.0, 9.0, 7.0))
    load, run = lm_models.cold_waits("gemma3")
    assert load.startswith(idle[0]) and run.startswith(idle[1])
    assert load.endswith("This server is busy now (load 11.0 on 2 cores): expect about 66–192 s.")
    assert run.endswith("This server is busy now (load 11.0 on 2 cores): expect about 55 s.")
    monkeypatch.setattr(i18n, "current_lang", lambda: "zh")
    assert lm_models.cold_waits("gemma3")[1].endswith("这台服务器现在很忙（2 个核，负载 11.0）：预计约 55 秒。")
    assert lm_models.cold_waits("smollm2") == ("正在加载 SmolLM2-135M-Instruct…", "正在运行模型…")


def test_lesson_17_cites_the_heatmaps_brightest_head_at_its_step(shipped):
    """One claim, one number: the head and the scores the lesson and /learn's sentence cite are those of the
    heatmap's cells at the phase change and the checkpoint before it."""
    from viz.lessons import live_learn

    runs, sm = shipped
    two = runs["attn2"]
    live = live_learn((runs, sm))
    z = np.asarray(live.figure.data[0].z)  # rows "layer.head", columns the checkpoints
    cols = list(live.figure.data[0].x)
    rows = list(live.figure.data[0].y)
    at, before = cols.index(str(sm.step)), cols.index(str(sm.step)) - 1
    last = [i for i, r in enumerate(rows) if r.startswith(f"{two.settings.layers - 1}.")]
    best = last[int(np.argmax(z[last, at]))]
    assert rows[best] == f"{sm.layer}.{sm.head}"
    sentence = FLN.sentence(sm)
    cited = f"head {sm.layer}.{sm.head}'s induction score rose from {FLN.fmt(z[best, before])} to " \
            f"{FLN.fmt(z[best, at])}"
    assert cited in sentence and cited in live.feedback
    assert f"Head {sm.layer}.{sm.head}'s induction score rises most" in live.feedback
    assert (sm.layer, sm.head, FLN.fmt(sm.induction_before), FLN.fmt(sm.induction_after)) == (1, 0, "0.087", "0.61")


@pytest.mark.slow
def test_the_learn_page_estimates_from_this_server():
    at = new_app()
    at.switch_page("viz/pages/learn.py")
    at.run()
    assert_clean(at)
    said = "\n".join(str(c.value) for c in at.caption)
    assert "on this server now (timed just now:" in said and "about a minute" not in said
    assert any("phase change (step" in a.get("text", "") for f in figures(at)
               for a in f["layout"].get("annotations", []))


# ---------------------------------------------------------------- (c) a model brought to the server


def test_a_missing_gguf_is_said_to_be_missing(tmp_path):
    from model import load_model

    gone = tmp_path / "nothere" / "model.gguf"
    with pytest.raises(FileNotFoundError, match="file not found"):
        load_model(str(gone))
    (label,) = lm_models.add_server_models([str(gone)])
    with pytest.raises(ValueError) as e:
        lm_models.load(label)
    assert str(e.value).startswith(f"{label}: file not found") and str(tmp_path) not in str(e.value)


def falcon_dir(d: Path, weights: bool = True) -> Path:
    """A tiny random Falcon (a type the lab opens via transformers); without weights, one that cannot open."""
    import torch
    import transformers

    d.mkdir(parents=True, exist_ok=True)
    tok = tiny_bpe_tokenizer(d)
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model("falcon", vocab_size=tok.get_vocab_size(), hidden_size=32,
                                            num_hidden_layers=2, num_attention_heads=4, bos_token_id=0,
                                            eos_token_id=0)
    if weights:
        transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").save_pretrained(
            d, safe_serialization=True)
    else:
        cfg.save_pretrained(d)
    return d


def options(at) -> list[str]:
    return list(at.sidebar.selectbox[0].options)


@pytest.mark.slow
def test_a_broken_model_keeps_url_and_sidebar_together_and_both_broken_labels_agree(tmp_path):
    broken_dir = falcon_dir(tmp_path / "falcon-noweights", weights=False)
    gone = tmp_path / "gone.gguf"
    labels = lm_models.add_server_models([str(broken_dir), str(gone)])
    at = new_app()
    at.query_params.update({"checkpoint": "dates"})
    at.run()
    assert_clean(at)
    at.sidebar.selectbox[0].set_value(labels[0]).run()  # the user picks the broken directory
    assert at.error  # its sentence
    assert at.sidebar.selectbox[0].value == labels[0]
    assert at.query_params["checkpoint"] == [labels[0]] or at.query_params["checkpoint"] == labels[0]
    shown = options(at)
    mine = [o for o in shown if o.startswith(tuple(labels))]
    assert len(mine) == 2 and all(o.endswith("(started with the server, cannot be opened)") for o in mine), mine
    assert not any("via transformers" in o for o in mine)
    at.sidebar.selectbox[0].set_value(labels[1]).run()  # the missing GGUF
    assert any("file not found" in str(e.value) for e in at.error)
    assert at.sidebar.selectbox[0].value == labels[1]
    assert labels[1] in str(at.query_params["checkpoint"])
    (other,) = lm_models.add_server_models([str(falcon_dir(tmp_path / "falcon-noweights-2", weights=False))])
    fresh = new_app()  # a link straight to another broken directory, never loaded: labelled so on its first run
    fresh.query_params.update({"checkpoint": other})
    fresh.run()
    assert fresh.error and fresh.sidebar.selectbox[0].value == other
    assert f"{other} (started with the server, cannot be opened)" in options(fresh)


@pytest.fixture(scope="module")
def falcon(tmp_path_factory) -> str:
    (label,) = lm_models.add_server_models([str(falcon_dir(tmp_path_factory.mktemp("falcon-ok")))])
    return label


def infos(at) -> str:
    return "\n".join(str(e.value) for kind in ("info", "warning", "markdown", "caption") for e in at.get(kind))


@pytest.mark.slow
@pytest.mark.parametrize("page, need", [
    ("flow", "This view needs each head's value vectors and output z, and the norms inside each layer"),
    ("layer", "This view needs the norms inside a layer and the feed-forward network's internals")])
def test_the_refusal_names_what_the_view_needs(falcon, page, need):
    at = new_app()
    at.query_params.update({"checkpoint": falcon})
    at.switch_page(f"viz/pages/{page}.py")
    at.run()
    assert_clean(at)
    said = infos(at)
    assert "runs via transformers" in said and need in said
    assert "this view needs the lab's own model" not in said


@pytest.mark.slow
def test_since2017_says_which_model_it_draws_for_another_one(falcon):
    at = new_app()
    at.query_params.update({"checkpoint": falcon})
    at.switch_page("viz/pages/since2017.py")
    at.run()
    assert_clean(at)
    said = "\n".join(str(w.value) for w in at.warning)
    assert f"The sidebar's model is {falcon} (via transformers, started with the server)" in said
    assert "the modern side of this page shows SmolLM2-135M-Instruct (language model) instead" in said


def test_plotly_json_of_the_agreement_figure_is_what_the_browser_gets():
    """The figure JSON (what AppTest's proto.spec carries) keeps the labels' trace apart from the bars."""
    fig = FF.agreement_figure({"set": {"raw": {"mean": 0.3, "std": 0.1, "top_k": 1.0, "n": 3}}})
    spec = json.loads(fig.to_json())
    assert [d["type"] for d in spec["data"]] == ["bar", "scatter"] and spec["data"][1]["text"] == ["0.3"]
