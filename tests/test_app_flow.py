"""The "Why this token?" page (viz/pages/flow.py, issue 25 §2) under AppTest, en and zh: a tiny random Llama,
SmolLM2, MiniLM and the toy translator 'dates'. The page's numbers are model/analysis/flow.py's on the same input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_clean
from streamlit.testing.v1 import AppTest
from test_app_llm import tiny  # noqa: F401  (tiny: the fixture)
from test_i18n import english_in_zh

from model import load_checkpoint, load_model
from model.analysis import flow as FL
from viz.ui import lm_models

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parents[1] / "app.py")
PAGE = "viz/pages/flow.py"
TIMEOUT = 900
IOI_TEXT = "When Mary and John went to the store, John gave a drink to"


def run(query: dict) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({k: str(v) for k, v in query.items()})
    at.switch_page(PAGE)
    at.run()
    return at


def figs(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def text_of(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown)


def rho_table(at: AppTest) -> list:
    return at.dataframe[0].value


def check_comparison(at: AppTest, cmp: FL.Comparison) -> None:
    """The methods figure and the table carry the analysis' own rho for each method."""
    (methods,) = [f for f in figs(at) if len(f["data"]) >= 5 and all(d["type"] == "bar" for d in f["data"])]
    titles = [a["text"] for a in methods["layout"]["annotations"]]
    for m, r in cmp.rho.items():
        assert any(f"{r:.2g}" in title or (np.isnan(r) and "NaN" in title) for title in titles), (m, r, titles)
    df = rho_table(at)
    assert len(df) == len(cmp.methods)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_tiny_llama(tiny, lang):  # noqa: F811
    at = run({"checkpoint": tiny, "text": IOI_TEXT, "lang": lang, "tau": 0.005})
    assert_clean(at)
    lm = lm_models.load(tiny).obj
    s = FL.prepare(lm, IOI_TEXT)
    cmp = FL.compare(s, flow=True)
    check_comparison(at, cmp)
    r = FL.routes(s)
    edges = r.edges(0.005)
    (graph,) = [f for f in figs(at) if any(d.get("customdata") and d["customdata"][0][0] == "node" for d in f["data"])]
    dots = [d for d in graph["data"] if d.get("customdata") and d["customdata"][0][0] == "edge"]
    assert sum(len(d["customdata"]) for d in dots) == len(edges)
    heads = [e for e in edges if e["kind"] == "head"]
    links = list(at.get("page_link"))
    assert len(links) == min(8, len(heads))
    best = max(heads, key=lambda e: e["weight"])
    assert links[0].proto.page.endswith("llm") or "llm" in links[0].proto.page
    assert f"layer {best['layer']}" in links[0].proto.label or lang == "zh"
    if lang == "zh":
        assert not english_in_zh(at), english_in_zh(at)


def test_tiny_llama_position_and_tau_from_the_url(tiny):  # noqa: F811
    at = run({"checkpoint": tiny, "text": IOI_TEXT, "pos": 3, "tau": 0.2})
    assert_clean(at)
    assert at.selectbox(key="flow_pos").value == 3
    assert at.select_slider(key="flow_tau").value == 0.2
    s = FL.prepare(lm_models.load(tiny).obj, IOI_TEXT, position=3)
    n = len(FL.routes(s).edges(0.2))
    assert any(f"{n} of" in c.value for c in at.caption), [c.value for c in at.caption]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_smollm2(lang):
    at = run({"checkpoint": "smollm2", "text": IOI_TEXT, "lang": lang})
    assert_clean(at)
    cmp = FL.compare(FL.prepare(load_model("smollm2"), IOI_TEXT), flow=True)
    check_comparison(at, cmp)
    if lang == "zh":
        assert not english_in_zh(at), english_in_zh(at)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_minilm(lang):
    at = run({"checkpoint": "minilm", "text": FL.ANIMAL, "lang": lang})
    assert_clean(at)
    cmp = FL.compare(FL.prepare(load_model("minilm"), FL.ANIMAL), flow=True)
    check_comparison(at, cmp)
    if lang == "zh":
        assert not english_in_zh(at), english_in_zh(at)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_translator_alignment_vs_routes(lang):
    at = run({"checkpoint": "dates", "text": "3 november 2023", "lang": lang, "pos": 2})
    assert_clean(at)
    s = FL.prepare(load_checkpoint("dates"), "3 november 2023", position=2)
    tr = FL.capture(s)
    al = FL.cross_alignment(s, tr)
    (fig,) = [f for f in figs(at) if f["data"][0]["type"] == "bar" and len(f["data"]) == len(al)]
    routes = np.asarray(al["routes"]) / np.sum(al["routes"])
    from conftest import plotly_array

    np.testing.assert_allclose(plotly_array(fig["data"][-1]["y"]), routes, rtol=1e-6)
    check_comparison(at, FL.compare(s, flow=True))
    if lang == "zh":
        assert not english_in_zh(at), english_in_zh(at)


# ---------------------------------------------------------------- lesson 16


def lesson16(lang: str = "en") -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"lesson": "16", "lang": lang})
    at.switch_page("viz/pages/lessons.py")
    at.run()
    assert_clean(at)
    return at


def test_lesson_16_norm_share_from_scratch():
    """The lesson's answer bin: token 0's share of the head's ||alpha_j v_j W^O_h||, computed here by hand."""
    from viz import lessons as LS

    smol = load_model("smollm2")
    sh = FL.sink_head(smol, LS.IOI_TEXT)
    _, tr = smol.run_with_trace(LS.IOI_TEXT, names=[f"{sh.module}.weights", f"{sh.module}.v"])
    attn = smol.model.decoder.layers[sh.layer].self_attn
    a = tr[f"{sh.module}.weights"][0, sh.head, -1].double()
    v = tr[f"{sh.module}.v"][0, sh.head // (attn.n_heads // attn.n_kv_heads)].double()
    hs = attn.d_head
    W = attn.w_o.weight.detach().double()[:, sh.head * hs:(sh.head + 1) * hs]
    norms = np.array([float((a[j] * (W @ v[j])).norm()) for j in range(len(a))])
    share = norms[0] / norms.sum()
    assert share == pytest.approx(sh.norm_share_on_first, rel=1e-4)
    assert sh.weight_on_first == pytest.approx(float(a[0]), rel=1e-5) and sh.weight_on_first > share
    right = next(k for k, hi in LS.SINK_BINS.items() if share < hi)
    at = lesson16()
    assert at.get("plotly_chart")
    radio = next(r for r in at.radio if r.key and r.key.startswith("lesson_q_"))
    radio.set_value(next(o for o in LS.SINK_BINS if o != right)).run()
    assert at.warning and not at.success
    radio = next(r for r in at.radio if r.key and r.key.startswith("lesson_q_"))
    radio.set_value(right).run()
    assert at.success and not at.warning


def test_lesson_16_in_zh_has_no_english():
    import re

    at = lesson16("zh")
    assert at.get("plotly_chart")
    found = [f for f in english_in_zh(at) if not re.search(r"text_input|Sentence", f)]
    assert not found, found
