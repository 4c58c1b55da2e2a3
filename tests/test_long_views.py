"""The document view keeps the chosen position in view (issue 24 §3): a long prompt is shown as the text before
the position plus each top source's context, with "⋯ n tokens" for what is skipped, in a box that opens at its
end (where the position is); the top-10 table gives each source's context. Pure builders, then the Attention
page on a tiny random Llama with the thresholds lowered, en and zh."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from conftest import APP, tiny_hf_lm
from streamlit.testing.v1 import AppTest

from model.analysis.long import DocumentView
from viz.figures import long as FL
from viz.ui import long_views

TIMEOUT = 600
TEXT = ("The cat sat on the mat. The dog ran in the park. Attention relates every token to every other one. " * 3)


def shown_positions(page: str) -> list[int]:
    return [int(i) for i in re.findall(r'<span(?: id="attention-position")? title="\D*(\d+)', page)]  # en and zh


def test_document_html_shows_the_position_and_the_sources_contexts():
    toks = [f"␣w{i}" for i in range(3000)]
    w = np.zeros(2001)
    w[[0, 10, 1500, 1990]] = [0.5, 0.2, 0.2, 0.1]
    view = DocumentView(2000, w, [(0, 0.5), (10, 0.2), (1500, 0.2), (1990, 0.1)], 1, 1)
    page = FL.document_html(toks, view, before=300, after=24, context=8)
    pos = shown_positions(page)
    # the window before the position, each source ±8 (0 and 10 merge), nothing else; after it 24 grey tokens
    assert pos == list(range(0, 19)) + list(range(1492, 1509)) + list(range(1700, 2001))
    assert page.count('<span style="color:#999">') == 24
    gaps = re.findall(r'class="attention-gap"[^>]*>([^<]*)<', page)
    assert gaps == ["⋯ 1,473 tokens not shown ⋯", "⋯ 191 tokens not shown ⋯",
                    "⋯ 975 more tokens after position 2000 (it cannot see them) ⋯"]
    assert page.count('id="attention-position"') == 1 and 'id="attention-position" title="position 2000:' in page
    assert "flex-direction:column-reverse" in page  # the box opens at its end, where the position is
    assert " w5" in page and "␣" not in page  # the text reads as text: spaces, not ␣
    assert len(page) < 60_000  # 3,000 tokens, ~350 shown
    whole = FL.document_html(toks, view, before=None, after=24)
    assert shown_positions(whole) == list(range(2001)) and whole.count("attention-gap") == 1
    rows = FL.top_sources(toks, view, width=3)
    ctx = [r["context"] for r in rows]
    assert ctx[0] == "⟦ w0⟧ w1 w2 w3…" and ctx[2] == "… w1497 w1498 w1499⟦ w1500⟧ w1501 w1502 w1503…"


def test_what_a_head_switch_sends_at_2380_tokens():
    """Issue 31 §2 (a head switch <= 1 s in the browser at 2,380 tokens): the pooled overview's JSON (what Streamlit
    sends) stays under 120 kB, its z the pooled numbers in float32 (to the digits the hover shows), the window of a
    cell in its meta (edges), not 4 integers a cell (278 kB before); the document view's HTML under 100 kB (121 kB
    before), every token still with its weight in its tooltip."""
    import json

    import plotly.io as pio

    from model.analysis.long import Overview, block_edges

    T, rng = 2380, np.random.default_rng(0)
    toks = [f"␣word{i}" for i in range(T)]
    cells = np.tril(rng.random((128, 128)))
    cells /= cells.sum(1, keepdims=True)
    edges = block_edges(T, 128)
    fig = FL.overview_figure(Overview(cells, edges, edges, 3, 5), toks)
    sent = pio.to_json(fig, validate=False)  # what st.plotly_chart puts in its message
    assert len(sent) < 120_000, len(sent)
    z = fig.data[0].z
    assert z.dtype == np.float32 and np.array_equal(z, cells.astype(np.float32)) and fig.data[0].customdata is None
    assert "%{z:.4f}" in fig.data[0].hovertemplate and json.loads(sent)["data"][0]["meta"]["q_edges"] == edges
    w = rng.random(T)
    w /= w.sum()
    view = DocumentView(T - 1, w, [(int(i), float(w[i])) for i in np.argsort(-w)[:10]], 3, 5)
    page = FL.document_html(toks, view, before=long_views.DOC_BEFORE, after=long_views.DOC_AFTER)
    assert len(page.encode()) < 100_000, len(page.encode())
    assert len(shown_positions(page)) > long_views.DOC_BEFORE and f'title="position {T - 1}: weight ' in page


def test_the_views_cache_leaves_the_figure_cache_alone():
    """Pooled maps and document views are kept for every session (a zoom, a switch back: nothing recomputed), in
    a bounded cache of their own: a class clicking through heads and positions never pushes /llm's per-head
    statistics out of the shared figure cache (recomputed: ~10 s at 2,380 tokens)."""
    from viz.ui import attention_views as AV

    class Trace:  # any object a weak reference can point to
        pass

    trace = Trace()

    def statistics(tr):
        return object()

    def pooled(tr, head):
        return [head]

    stats = AV.cached_figure(trace, statistics, shared=True)
    views = [long_views.shared_view(trace, pooled, h) for h in range(long_views.VIEWS_KEPT + 40)]
    assert AV.cached_figure(trace, statistics, shared=True) is stats
    assert long_views.shared_view(trace, pooled, long_views.VIEWS_KEPT + 39) is views[-1]
    assert len(long_views._VIEWS) <= long_views.VIEWS_KEPT


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return tiny_hf_lm(tmp_path_factory.mktemp("tiny-doc"), "llama")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_attention_page_document_view_in_parts(tiny, monkeypatch, lang):
    from viz.ui import lm_models

    monkeypatch.setattr(long_views, "FULL_BUDGET", 1)  # every prompt is "too long for a full trace"
    monkeypatch.setattr(long_views, "DOC_BEFORE", 20)
    T = lm_models.load(tiny).obj.encode(TEXT).shape[1]
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"checkpoint": tiny, "lang": lang, "text": TEXT, "layer": "1", "head": "2",
                            "pos": str(T - 30)})
    at.switch_page("viz/pages/attention.py")
    at.run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    page = next(h.proto.body for h in at.get("html") if "attention-document" in h.proto.body)
    pos = shown_positions(page)
    assert T - 30 in pos and set(range(T - 50, T - 29)) <= set(pos) and len(pos) < T - 29
    assert 'id="attention-position" title="' in page
    assert ("tokens not shown" in page) == (lang == "en") and ("省略" in page) == (lang == "zh")
    if lang == "zh":  # (AppTest re-runs a zh page's sidebar select by its English label: the toggle in en only)
        return
    at.toggle(key="attn_long_whole").set_value(True).run()
    page = next(h.proto.body for h in at.get("html") if "attention-document" in h.proto.body)
    assert shown_positions(page) == list(range(T - 29))
    assert not at.exception


def test_statistics_over_the_last_query_rows(monkeypatch):
    """head_statistics_tiled(first_query=f): each score's mean over query rows f..T-1 only (each over all keys),
    equal to the definitions applied to those rows of the full weights."""
    from model.analysis import long as lg
    from model.families.lm import DecoderLM, LMConfig

    torch.manual_seed(0)
    m = DecoderLM(LMConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=256,
                           positional="rotary", norm="rmsnorm", ffn="gated", activation="silu", qkv_bias=False,
                           out_bias=False, ffn_bias=False, bos_id=0)).eval()
    ids = torch.randint(0, 20, (1, 120), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, full = m.run_with_trace(ids)
        _, lazy = m.run_with_trace(ids, lazy=True)
    monkeypatch.setattr(lg, "TILE_BYTES", 4 * 120 * 8 * 7)  # 7 rows a tile: a ragged first and last tile
    f, T = 83, 120
    got = lg.head_statistics_tiled(lazy, first_query=f)
    i = torch.arange(f, T)
    for layer, name in enumerate(lg._modules(full)):
        w = full[f"{name}.weights"][0].double()[:, f:]  # (H, R, T)
        want = {"sink": w[..., 0].mean(-1), "entropy": -torch.special.xlogy(w, w).sum(-1).mean(-1),
                "distance": (w * (i[:, None] - torch.arange(T)[None]).abs()).sum(-1).mean(-1),
                "previous_token": w[:, torch.arange(T - f), i - 1].mean(-1)}
        for k, v in want.items():
            np.testing.assert_allclose(got[k].scores[layer], v.numpy(), atol=1e-6, err_msg=k)
    whole = lg.head_statistics_tiled(lazy)
    assert not np.allclose(whole["sink"].scores, got["sink"].scores)


def test_step_attention_figure_draws_a_long_contexts_last_keys():
    from viz.figures import llm as FLLM

    attn = torch.rand(3, 2, 40)
    toks = [f"w{i}" for i in range(40)]
    fig = FLLM.step_attention_figure(attn, toks, head=1, first=30)
    z = np.asarray(fig.data[0].z, dtype=float)
    np.testing.assert_array_equal(z, attn[:, 1, 30:].numpy().astype(float))
    assert list(fig.data[0].x)[0].startswith("30: w30") and len(fig.data[0].x) == 10


def test_llm_statistics_of_a_very_long_prompt_are_over_its_last_rows(tiny, monkeypatch):
    """Past STATS_CELLS, /llm's per-head statistics are over the prompt's last rows (long_views.stats_first_query),
    said in a caption; the grid equals head_statistics_tiled(first_query=...) on the same trace."""
    import json

    from conftest import plotly_array

    from model.analysis import long as LG
    from viz.ui import lm_models

    assert long_views.stats_first_query(2048) == 0 and 8192 - long_views.stats_first_query(8192) == 478
    monkeypatch.setattr(long_views, "FULL_BUDGET", 1)
    monkeypatch.setattr(long_views, "STATS_CELLS", 60 * 60 // 2)
    lm = lm_models.load(tiny).obj
    _, lazy = lm.run_with_trace(TEXT, lazy=True)
    T = LG.n_tokens(lazy)  # ~190 tokens: 60 x 60 / 2 cells leave 9 rows, at least STATS_MIN_ROWS
    monkeypatch.setattr(long_views, "STATS_MIN_ROWS", 16)
    first = long_views.stats_first_query(T)
    assert T - first == 16
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"checkpoint": tiny, "lang": "en", "prompt": TEXT, "view": "heads", "stat": "sink"})
    at.switch_page("viz/pages/llm.py")
    at.run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert any(f"over its last 16 positions (of {T:,})" in c.value for c in at.caption)
    want = LG.head_statistics_tiled(lazy, stats=("sink",), first_query=first)["sink"].scores
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    grid = next(s for s in specs if s["data"][0].get("customdata") is not None and len(s["data"][0]["z"]) == 3)
    np.testing.assert_allclose(np.asarray(plotly_array(grid["data"][0]["z"]), float), want, atol=1e-6)
