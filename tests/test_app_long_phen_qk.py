"""/phenomena and /qk with a long prompt in the sidebar (issue 24 §3): a tiny random Llama whose full-trace budget
is lowered (tests/test_app_long_pages.py's way) so that the sidebar's ~100-token prompt gets a lazy trace, and the
pages' own thresholds lowered too. What a user sees must be the numbers of the full capture of the same prompt
(computed here with the budget raised): the head statistics tile by tile, the sink share, the blocked runs, a
head's top keys and clarity on the Q/K map; figures stay bounded. en + zh."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import APP, lower_full_budget, plotly_array, tiny_hf_lm
from streamlit.testing.v1 import AppTest
from tolerance import f32_tol

from model.analysis import long as LG
from model.analysis import phenomena as PH
from model.core import recorder
from model.core.trace import LazyTrace
from viz.figures.attention import num

TIMEOUT = 300
TEXT = "The cat sat on the mat. The dog ran in the park. Attention relates every token to every other one. " * 2
BIG = 2**31  # the reference's budget: the full capture of every map


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return tiny_hf_lm(tmp_path_factory.mktemp("tiny-long-phen-qk"), "llama")


@pytest.fixture(scope="module")
def lm(tiny):
    from viz.ui import lm_models

    return lm_models.load(tiny).obj


@pytest.fixture(scope="module")
def full(lm):
    """(logits, full trace) of TEXT with every map, the budget raised."""
    return lm.run_with_trace(TEXT, budget_bytes=BIG)


@pytest.fixture
def small_budget(monkeypatch, lm):
    budget = lm.trace_bytes(32)  # a full trace of 32 tokens fits; TEXT (~100 tokens) does not
    lower_full_budget(monkeypatch, budget)
    from viz.ui import models, qk_batch

    monkeypatch.setattr(qk_batch, "FULL_UP_TO", 32)
    yield budget
    models._cached_lm_trace.clear()


def run(page: str, model: str, lang: str, state: dict | None = None, **query) -> AppTest:
    """One run (a second AppTest run of a zh page cannot find the model list's labels: widgets are set here)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"checkpoint": model, "lang": lang, **query})
    at.session_state["source_text"] = TEXT
    for k, v in (state or {}).items():
        at.session_state[k] = v
    at.switch_page(f"viz/pages/{page}.py")
    return at.run()


def figures(at) -> dict[str, dict]:
    return {c.proto.id: json.loads(c.proto.spec) for c in at.get("plotly_chart")}


def by_title(at, words: str) -> dict:
    (fig,) = [f for f in figures(at).values() if words in json.dumps(f["layout"].get("title", ""))]
    return fig


def assert_ok(at, lang: str = "en"):
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    for c in at.get("plotly_chart"):
        assert len(c.proto.spec) < 1.5e6
    if lang == "zh":
        from test_i18n import english_in_zh

        found = english_in_zh(at)
        assert not found, "\n".join(found)


# ---------------------------------------------------------------- the analysis at short length


def test_tiled_statistics_and_long_sink_effect_equal_the_full_capture(lm, full):
    _, tr = full
    ref = PH.head_statistics(tr)
    _, lazy = lm.run_with_trace(TEXT, lazy=True, budget_bytes=BIG)
    assert isinstance(lazy, LazyTrace)
    got = LG.head_statistics_tiled(lazy)
    T = tr["decoder.layers.0.self_attn.weights"].shape[-1]
    for k, s in ref.items():  # float32 weights (recomputed in tiles) summed over rows of T keys (tests/tolerance.py)
        np.testing.assert_allclose(got[k].scores, s.scores, rtol=0, atol=f32_tol(1, s.scores, n=T), err_msg=k)
    eff = PH.sink_effect(lm, TEXT)
    long = PH.sink_effect_long(lm, TEXT, got["sink"])
    assert long.block == eff.block == PH.block_sink(lm, TEXT)
    assert (long.loss_before, long.loss_after) == (eff.loss_before, eff.loss_after)
    assert long.top_before == eff.top_before and long.top_after == eff.top_after
    assert long.mean_share == pytest.approx(eff.mean_share, abs=f32_tol(1, n=T))  # a mean of those shares


# ---------------------------------------------------------------- /phenomena


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_phenomena_long_prompt(tiny, lm, full, small_budget, lang):
    from viz.ui import models

    assert isinstance(models.get_trace(tiny, TEXT), LazyTrace)  # the page's trace is the lazy one
    ref = PH.head_statistics(full[1])
    # the page's tiled statistics against the full capture's: shares <= 1 of float32 weights over rows of T keys
    row_tol = f32_tol(1, n=full[1]["decoder.layers.0.self_attn.weights"].shape[-1])
    at = run("phenomena", tiny, lang, phen="patterns", pat_src="prompt")
    assert_ok(at, lang)
    maps = figures(at)
    for key in ("previous_token", "duplicate_token"):
        (fig,) = [f for k, f in maps.items() if f"phen_{key}_map" in k]
        np.testing.assert_allclose(plotly_array(fig["data"][0]["z"]), ref[key].scores, rtol=0, atol=row_tol)

    at = run("phenomena", tiny, lang)  # sinks: the share from the tiled statistics, the blocked runs when asked
    assert_ok(at, lang)
    (fig,) = [f for k, f in figures(at).items() if "phen_sink_map" in k]
    np.testing.assert_allclose(plotly_array(fig["data"][0]["z"]), ref["sink"].scores, rtol=0, atol=row_tol)
    assert not at.metric and at.toggle(key="phen_sink_long_block").value is False
    assert at.toggle(key="phen_sink_long_block").label.startswith(
        {"en": "Run the model with token 0 blocked", "zh": "屏蔽第 0 个词元后运行模型"}[lang])
    at = run("phenomena", tiny, lang, state={"phen_sink_long_block": True})
    assert_ok(at, lang)
    b = PH.block_sink(lm, TEXT)
    said = {"en": "Measuring every head alone takes 12 runs", "zh": "逐个测量每个头需要运行模型 12 次"}[lang]
    assert any(c.value.startswith(said) for c in at.caption)  # not the L x H runs of a long prompt
    assert [m.value for m in at.metric][2] == f"{num(b.answer_logit_before)} → {num(b.answer_logit_after)}"


# ---------------------------------------------------------------- /qk


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_qk_long_prompt(tiny, lm, full, small_budget, monkeypatch, lang):
    from viz.figures import qk as FQ
    from viz.ui import qk_batch as QB

    monkeypatch.setattr(FQ, "MAX_POINTS", 16)
    _, tr = full
    T = len(tr.meta["tgt_ids"][0])
    layer, head = 1, 3
    at = run("qk", tiny, lang, batch="prompt", layer=str(layer), head=str(head), color="token")
    assert_ok(at, lang)
    assert at.number_input(key="qk_query_pos").value == T - 1  # the last position, picked by default
    if lang == "en":
        at.number_input(key="qk_query_pos").set_value(40).run()
    else:
        at = run("qk", tiny, lang, batch="prompt", layer=str(layer), head=str(head), color="token", query="0.40")
    assert_ok(at, lang)
    assert at.number_input(key="qk_query_pos").value == 40
    s = -(-T // 16)  # every s-th position drawn
    said = {"en": f"the picture draws the query and key of one position in {s}", "zh": f"图中每 {s} 个位置只画出"}[lang]
    assert any(said in c.value for c in at.caption), "\n".join(c.value for c in at.caption)
    assert at.query_params["query"] in ("0.40", ["0.40"])
    # the ringed top keys: the full capture's weights of that head and row
    w = tr[f"decoder.layers.{layer}.self_attn.weights"][0, head, 40].double().numpy()
    (fig,) = [f for k, f in figures(at).items() if "qk_fig" in k]
    top = [d for d in fig["data"] if d.get("name") == "_top_keys"][0]
    order = np.argsort(-w[:41], kind="stable")[:FQ.TOP_K]
    assert [float(x) for x in top["text"]] == pytest.approx([round(float(w[j]), 2) for j in order], abs=0.006)
    drawn = sum(len(d["x"]) for d in fig["data"] if not d.get("name", "").startswith("_"))
    assert drawn <= 2 * 16 + 2 < 2 * T
    # clarity: the long batch's table equals the full batch's (T <= CLARITY_QUERIES: every query counts)
    long_b = QB.trace_batch(lm, lm.run_with_trace(TEXT, lazy=True, budget_bytes=BIG)[1], TEXT)
    full_b = QB.lm_batch(lm, "prompt", text=TEXT)
    rows_long, ch_long = FQ.clarity_table(long_b, "decoder_self")
    rows_full, ch_full = FQ.clarity_table(full_b, "decoder_self")
    assert len(rows_long) == len(rows_full) == 3 * 4
    np.testing.assert_allclose(np.array(sorted(r[1:] for r in rows_long)), np.array(sorted(r[1:] for r in rows_full)),
                               atol=1e-12)
    assert ch_long == pytest.approx(ch_full)


def test_past_the_lazy_budget_both_pages_say_the_limit(tiny, lm, small_budget, monkeypatch):
    """A prompt even a lazy trace cannot hold here: the limit in the UI's words with the keep-the-end button."""
    import streamlit as st

    from viz.ui import lm_models

    st.cache_resource.clear()  # the pages' results for TEXT under the earlier tests' budget
    monkeypatch.setattr(recorder, "DEFAULT_BUDGET_BYTES", 1)
    monkeypatch.setattr(lm_models, "LAZY_BUDGET_BYTES", lm.trace_bytes(48, lazy=True, layers=True))
    fit = lm.max_tokens_within(lm_models.LAZY_BUDGET_BYTES, lazy=True, layers=True)
    for page, query in (("phenomena", {}), ("phenomena", {"phen": "patterns", "pat_src": "prompt"}),
                        ("qk", {"batch": "prompt"})):
        at = run(page, tiny, "en", **query)
        assert not at.exception, [e.value for e in at.exception]
        assert [b.label for b in at.button if b.label.startswith("Keep the last")] == [f"Keep the last {fit} tokens"]
        assert not at.get("plotly_chart")


def test_clarity_top_k_by_partition_is_the_stable_sorts():
    """A long prompt's clarity marks each row's k smallest by a partition: the first k of a stable argsort (what
    QKMap.clarity marks), ties by the lowest index."""
    from viz.figures.qk import _smallest

    rng = np.random.default_rng(0)
    for _ in range(100):
        x = rng.integers(0, 6, (7, int(rng.integers(6, 60)))).astype(float)  # many ties
        x[rng.random(x.shape) < 0.2] = np.inf  # keys a query cannot see
        ref = np.zeros(x.shape, bool)
        np.put_along_axis(ref, np.argsort(x, axis=1, kind="stable")[:, :5], True, 1)
        assert (_smallest(x, 5) == ref).all()
