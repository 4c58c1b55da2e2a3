"""Long inputs on the Attention page (issue 24 §2-§3): a language model's prompt too long for a full trace gets
the lazy views (pooled overview + exact window, document view), limits in the UI's words with a keep-the-end
button. A tiny random Llama (max 256 positions) with the full-trace budget lowered so that its prompts count
as long; en and zh."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import APP, plotly_array, tiny_hf_lm
from conftest import figures_by_title as figs
from streamlit.testing.v1 import AppTest

from viz.ui import long_views

pytestmark = pytest.mark.slow
TIMEOUT = 600
TEXT = ("The cat sat on the mat. The dog ran in the park. Attention relates every token to every other one. " * 3)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return tiny_hf_lm(tmp_path_factory.mktemp("tiny-long"), "llama")


@pytest.fixture(autouse=True)
def long_everything(monkeypatch):
    monkeypatch.setattr(long_views, "FULL_BUDGET", 1)  # every prompt is "too long for a full trace"


def page(model: str, lang: str = "en", **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"checkpoint": model, "lang": lang, **{k: str(v) for k, v in query.items()}})
    at.switch_page("viz/pages/attention.py")
    return at.run()


def qp(at, name: str) -> str:
    v = at.query_params[name]
    return v[-1] if isinstance(v, list) else v


def clean(at) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def test_long_prompt_gets_overview_window_and_document_view(tiny):
    from viz.ui import lm_models

    lm = lm_models.load(tiny).obj
    T = lm.encode(TEXT).shape[1]
    at = page(tiny, text=TEXT, layer=1, head=2, win=f"{T - 16},{T - 16},16")
    clean(at)
    f = figs(at)
    over = next(v for k, v in f.items() if "pooled" in k)
    cells = plotly_array(over["data"][0]["z"])
    np.testing.assert_allclose(np.asarray(cells, float).sum(1), 1.0, atol=1e-5)  # pooled rows still sum to 1
    window = next(v for k, v in f.items() if k.startswith("Exact weights"))
    assert len(window["data"][0]["x"]) == 16 and window["data"][0]["y"][0].startswith(f"{T - 16}: ")
    assert any("attention-document" in h.proto.body for h in at.get("html"))
    assert qp(at, "layer") == "1" and qp(at, "head") == "2"
    # another head: the overview follows
    at.selectbox(key="attn_long_head").set_value(3)
    at.run()
    clean(at)
    assert any("head 3" in k for k in figs(at))


def test_context_length_is_said_in_words_and_the_end_can_be_kept(tiny):
    text = "word " * 400  # over the tiny model's 256 positions
    at = page(tiny, text=text)
    assert not at.exception
    msg = " ".join(e.value for e in at.error)
    assert "reads at most 256 tokens" in msg and "None" not in msg and "budget_bytes" not in msg
    keep = [b for b in at.button if b.label.startswith("Keep the last")]
    assert keep and keep[0].label == "Keep the last 256 tokens"
    keep[0].click()
    at.run()
    clean(at)
    assert qp(at, "keep") == "256"
    assert any("last 256 of the text's" in i.value for i in at.info)
    assert any("pooled" in k for k in figs(at))


def test_long_views_in_chinese(tiny):
    at = page(tiny, lang="zh", text=TEXT)
    clean(at)
    assert any("分块汇总" in k for k in figs(at))
    assert any("个词元" in i.value for i in at.info)


def llm_page(model: str, lang: str = "en", **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"checkpoint": model, "lang": lang, **{k: str(v) for k, v in query.items()}})
    at.switch_page("viz/pages/llm.py")
    return at.run()


def test_llm_heads_view_on_a_long_prompt(tiny):
    """Per-head statistics tile by tile, then the chosen head as a pooled map, a window and the document view."""
    from model.analysis import long as LG
    from viz.ui import lm_models

    at = llm_page(tiny, prompt=TEXT, view="heads", stat="sink", layer=2, head=1)
    clean(at)
    f = figs(at)
    over = next(v for k, v in f.items() if "pooled" in k)
    assert "head 1" in over["layout"]["title"]["text"]
    lm = lm_models.load(tiny).obj
    _, lazy = lm.run_with_trace(TEXT, lazy=True)
    want = LG.head_statistics_tiled(lazy, stats=("sink",))["sink"].scores
    grid = next(v for v in f.values() if v["data"][0].get("customdata") is not None and len(v["data"][0]["z"]) == 3)
    np.testing.assert_allclose(np.asarray(plotly_array(grid["data"][0]["z"]), float), want, atol=1e-6)
    assert any("attention-document" in h.proto.body for h in at.get("html"))


def test_llm_generation_on_a_long_prompt_streams_with_the_document_view(tiny):
    at = llm_page(tiny, prompt=TEXT, view="generate", max_new=3)
    clean(at)
    next(b for b in at.button if b.label == "Generate").click()
    at.run()
    clean(at)
    assert any("attention-document" in h.proto.body for h in at.get("html"))
    assert any("Where position" in c.value for c in at.caption)


# ---------------------------------------------------------------- /phenomena: a needle in a haystack (issue 24 §4)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_needle_section_draws_the_grid(tiny, lang):
    """?phen=needle: the depth × length grid is the analysis's p(answer) (the tiny model reads 256 positions, so
    the grid has one length, 128); the retrieval heads and their ablation are drawn or said in a sentence."""
    from model.analysis import long as LG
    from viz.ui import lm_models

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"checkpoint": tiny, "lang": lang, "phen": "needle"})
    at.switch_page("viz/pages/phenomena.py")
    at.run()
    clean(at)
    grid = next(v for v in figs(at).values() if v["data"][0].get("texttemplate") == "%{text}")
    z = np.asarray(plotly_array(grid["data"][0]["z"]), float)
    want = LG.needle_grid(lm_models.load(tiny).obj, (128,), (0.0, 0.5, 1.0), "71432")
    np.testing.assert_allclose(z, want.prob, rtol=1e-6, atol=1e-12)
    assert grid["data"][0]["x"] == ["128"]
    words = " ".join(m.value for m in at.markdown) + " ".join(i.value for i in at.info)
    if lang == "zh":
        from test_i18n import english_in_zh

        assert "密码 71432" in words, words[:500]
        assert not english_in_zh(at)
    else:
        assert "Where it fails" in words and "Pass key 71432" in words, words[:500]
