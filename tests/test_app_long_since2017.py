"""What changed since 2017 on a long prompt (issue 24 §3): every section the page draws for a short prompt is
drawn, in views that keep meaning at that length, from a lazy trace, and each drawn number is the trace's.

The lazy path is made to bite at ~130 tokens on tiny random models (a lowered full-trace budget, as
tests/test_app_long_pages.py does) and the page's thresholds are lowered: T × T maps are pooled beyond
CELLS_UP_TO = 32 tokens (to 8 × 8 blocks), per-token figures show a window of 16 tokens around the chosen one.

- a tiny Llama (RoPE, GQA, RMSNorm, SwiGLU, pre-LN): the RoPE angles and the SwiGLU rows are the window's,
  the pre-LN norms every layer's;
- a tiny Gemma 3 (sliding window, q/k norm, RoPE scaling): the sliding mask pooled to the share of
  open cells per block, the reach pooled from the live masks walked layer by layer, the q/k lengths of every
  token;
- a tiny Gemma 2 (soft-cap: Gemma 3's attention ignores its config's cap, as transformers' does): the soft-cap's
  points (the chosen token's row) and its numbers over every visible cell;
- a tiny Qwen2-MoE: the router map is the window's rows, the loads every token's picks.

en + zh; no heatmap axis spans the whole prompt. Models: tests/test_app_new_families.py's builders.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import model_page, plotly_array, tiny_hf_lm
from streamlit.testing.v1 import AppTest
from test_app_new_families import W, figure_with, save_family, texts
from test_i18n import english_in_zh

from model.analysis import long as LG
from model.core import recorder
from model.core.trace import LazyTrace
from viz.figures import attention as F
from viz.figures import modern as FM
from viz.ui import lm_models, long_views, models

TEXT = "The cat sat on the mat. The dog ran in the park. Attention relates every token to every other one. " * 2
CELLS, ROWS, BLOCKS = 32, 16, 8  # the page's thresholds, lowered: pooled beyond 32 tokens, 16-token windows
MAX_SPEC = 40_000  # bytes of one figure's JSON on these tiny models (SmolLM2 at 2,048 tokens: ≤ 0.25 MB)
HEADERS = ("1. Positions", "2. Grouped-query", "3. RMSNorm", "4. SwiGLU", "5. Pre-LN", "6. Sliding windows",
           "7. q/k norm", "8. Soft-capping", "9. RoPE scaling", "10. Mixture of experts", "11. Attention sinks")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """family -> its server label, each built once ("llama": conftest's tiny Llama)."""
    cache: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in cache:
            d = tmp_path_factory.mktemp(f"s17{family}")  # the label: no English word in it (zh checks)
            cache[family] = tiny_hf_lm(d, "llama") if family == "llama" else save_family(d, family)
        return cache[family]

    return get


@pytest.fixture(autouse=True)
def thresholds(monkeypatch):
    monkeypatch.setattr(long_views, "CELLS_UP_TO", CELLS)
    monkeypatch.setattr(FM, "WINDOW_ROWS", ROWS)
    monkeypatch.setattr(FM, "POOL_BLOCKS", BLOCKS)
    models._cached_lm_trace.clear()  # traces made under another budget
    yield
    models._cached_lm_trace.clear()


def long_trace(monkeypatch, label: str, lazy: bool = True):
    """Lower the full-trace budget below this model's TEXT (a full trace of 32 tokens fits) and return the page's
    trace of TEXT: a LazyTrace. lazy=False: the budget is left as it is, so the page gets a full trace (a server
    with a larger budget), and still draws its long views."""
    lm = lm_models.load(label).obj
    if lazy:
        monkeypatch.setattr(recorder, "DEFAULT_BUDGET_BYTES", lm.trace_bytes(32))
    trace = models.get_trace(label, TEXT)
    assert isinstance(trace, LazyTrace) == lazy and LG.n_tokens(trace) > 3 * CELLS
    return trace


def run_page(label: str, lang: str, **query) -> AppTest:
    return model_page(label, "since2017", lang, state={"source_text": TEXT}, **query)


def bounded(at, T: int) -> list[dict]:
    """The page's figures, each small, with no heatmap axis as long as the prompt (per-token rows are a window,
    T × T maps pooled)."""
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    for c in at.get("plotly_chart"):
        assert len(c.proto.spec) <= MAX_SPEC, len(c.proto.spec)
    for f in figs:
        for d in f["data"]:
            if d["type"] == "heatmap":
                assert T not in plotly_array(d["z"]).shape, (d["z"], T)
    return figs


def every_section(at, lang: str) -> None:
    assert len(at.header) == len(HEADERS)
    if lang == "en":
        body = texts(at)
        assert all(h in body for h in HEADERS), body[:500]
    else:
        assert not english_in_zh(at), english_in_zh(at)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_llama_long_prompt_draws_windows_of_the_traces_numbers(built, monkeypatch, lang):
    label = built("llama")
    trace = long_trace(monkeypatch, label)
    T, layer, head, pos = LG.n_tokens(trace), 1, 2, 50
    at = run_page(label, lang, layer=layer, head=head, pos=pos)
    every_section(at, lang)
    figs = bounded(at, T)
    assert len(figs) == 5  # RoPE, GQA, norms, SwiGLU, pre-LN: as on a short prompt
    w0, w1 = FM.token_window(T, pos)
    assert (w0, w1) == (pos - ROWS // 2, pos + ROWS // 2)
    # RoPE: the window's rows are the model's own angles at those positions.
    rope = figs[0]["data"][0]
    np.testing.assert_array_equal(plotly_array(rope["y"]), np.arange(w0, w1))
    angles = trace["decoder.rope.angles"].double().numpy()
    np.testing.assert_allclose(plotly_array(rope["z"]), np.mod(angles[w0:w1], 2 * np.pi), atol=1e-9)
    # SwiGLU: the window's rows of the gate and the up projection, units chosen over every token.
    gate_map, up_map = figs[3]["data"][:2]
    labels = F.token_labels(trace.meta["tgt_tokens"], T)
    assert list(gate_map["y"]) == labels[w0:w1]
    L = f"decoder.layers.{layer}"
    gate, hidden = trace[f"{L}.ffn.gate"][0].double().numpy(), trace[f"{L}.ffn.hidden"][0].double().numpy()
    units = [int(u) for u in gate_map["x"]]
    assert units == sorted(np.argsort(-np.abs(hidden).mean(0), kind="stable")[:32].tolist())
    np.testing.assert_allclose(plotly_array(gate_map["z"]), gate[w0:w1][:, units], atol=1e-12)
    ffn = lm_models.load(label).obj.model.decoder.layers[layer].ffn
    up = ffn.linear1(trace[f"{L}.norm2.out"][0]).detach().double().numpy()
    np.testing.assert_allclose(plotly_array(up_map["z"]), up[w0:w1][:, units], atol=1e-6)
    # Pre-LN: the median norm after every layer, from the stored layer outputs.
    outs = ["decoder.embed.out"] + [f"decoder.layers.{i}.out" for i in range(3)]
    want = [np.median(np.linalg.norm(trace[n][0].double().numpy(), axis=-1)) for n in outs]
    np.testing.assert_allclose(plotly_array(figs[4]["data"][0]["y"]), want, rtol=1e-12)
    if lang == "en":
        captions = " ".join(c.value for c in at.caption)
        assert f"tokens {w0} to {w1 - 1} of {T}, the {ROWS} around the chosen token" in captions


def opened(built, monkeypatch, family: str, lang: str, lazy: bool, head: int = 1, pos: int = 60):
    """(trace, page, T): the page on `family`'s long TEXT at layer 0, every section drawn, every figure bounded."""
    label = built(family)
    trace = long_trace(monkeypatch, label, lazy)
    T = LG.n_tokens(trace)
    at = run_page(label, lang, layer=0, head=head, pos=pos)
    every_section(at, lang)
    bounded(at, T)
    return trace, at, T


@pytest.mark.parametrize("lang, lazy", [("en", True), ("zh", True), ("en", False)])
def test_gemma3_long_prompt_pools_the_window(built, monkeypatch, lang, lazy):
    head = 1
    trace, at, T = opened(built, monkeypatch, "gemma3", lang, lazy, head)
    edges = LG.block_edges(T, BLOCKS)
    # The sliding layer's mask, pooled: the share of open cells of each block, from the trace's own mask.
    fig = figure_with(at, "滑动窗口掩码" if lang == "zh" else f"sliding-window mask, W = {W}")
    mask = trace["decoder.layers.0.self_attn.mask"][0, 0].numpy()
    want = np.array([[(~mask[a0:a1, b0:b1]).mean() for b0, b1 in zip(edges[:-1], edges[1:], strict=True)]
                     for a0, a1 in zip(edges[:-1], edges[1:], strict=True)])
    np.testing.assert_allclose(plotly_array(fig["data"][0]["z"]), want, atol=1e-6)
    i, j = np.indices((T, T))
    np.testing.assert_array_equal(mask, (j > i) | (i - j >= W))  # the window the closed form assumes
    assert list(fig["data"][0]["x"]) == FM.block_labels(edges)
    # What reaches the last token: the live masks walked layer by layer (not the closed form), pooled.
    live = FM.live_reach([trace[f"decoder.layers.{i}.self_attn.mask"][0, 0].numpy() for i in range(2)])
    reach = plotly_array(fig["data"][1]["z"])
    np.testing.assert_allclose(reach, [FM.pooled_share(r, edges) for r in live], atol=1e-6)
    assert list(fig["data"][2]["y"]) == [0, W - 1, 5000]
    # q/k norm: every token's query length, before and after the norm.
    fig = figure_with(at, "‖q‖")
    q_in = trace["decoder.layers.0.self_attn.q_norm.in"][0, head].double().numpy()
    np.testing.assert_allclose(plotly_array(fig["data"][0]["y"]), np.linalg.norm(q_in, axis=-1), rtol=1e-5)
    assert len(fig["data"][0]["x"]) == T


@pytest.mark.parametrize("lang, lazy", [("en", True), ("en", False)])
def test_gemma2_long_prompt_tiles_the_soft_cap(built, monkeypatch, lang, lazy):
    head, pos = 1, 60
    trace, at, T = opened(built, monkeypatch, "gemma2", lang, lazy, head, pos)
    mask = trace["decoder.layers.0.self_attn.mask"][0, 0].numpy()
    # Soft-cap: the chosen token's visible scores drawn; the numbers over every visible cell of the head.
    fig = figure_with(at, "c = 3")
    scores = trace["decoder.layers.0.self_attn.scores"][0, head].double().numpy()
    capped = trace["decoder.layers.0.self_attn.scores_capped"][0, head].double().numpy()
    open_ = ~mask
    pts = fig["data"][2]
    np.testing.assert_allclose(plotly_array(pts["x"]), scores[pos][open_[pos]], atol=1e-6)
    np.testing.assert_allclose(plotly_array(pts["y"]), capped[pos][open_[pos]], atol=1e-6)
    if lang == "en":
        bent = (np.abs(capped[open_] - scores[open_]) > 0.01 * np.abs(scores[open_])).mean()
        assert (f"The largest score before the cap is {F.num(np.abs(scores[open_]).max())}, after it "
                f"{F.num(np.abs(capped[open_]).max())}; {bent:.0%} of the visible cells") in texts(at)
        assert f"over the {W} keys it sees" in texts(at)


def test_moe_long_prompt_draws_the_windows_routing(built, monkeypatch):
    label = built("qwen2moe")
    trace = long_trace(monkeypatch, label)
    T, pos = LG.n_tokens(trace), 3  # near the start: the window is the first 16 tokens
    at = run_page(label, "en", layer=1, pos=pos)
    every_section(at, "en")
    bounded(at, T)
    R = "decoder.layers.1.ffn.router"
    fig = figure_with(at, "router probabilities")
    np.testing.assert_allclose(plotly_array(fig["data"][0]["z"]), trace[f"{R}.probs"][0, :ROWS].numpy(), atol=1e-6)
    assert list(fig["data"][0]["y"]) == F.token_labels(trace.meta["tgt_tokens"], T)[:ROWS]
    loads = plotly_array(fig["data"][2]["z"])  # every token's picks, not the window's
    assert (loads.sum(1) == 2 * T).all()
    choice = figure_with(at, "the router's choice")
    np.testing.assert_allclose(plotly_array(choice["data"][0]["y"]), trace[f"{R}.probs"][0, pos].numpy(), atol=1e-6)


def test_gpt_oss_long_prompt_draws_the_windows_sinks(built, monkeypatch):
    """gpt-oss's section 11 on a lazy trace: the chosen head's weight on the sink for the window of queries, from the
    trace's `.sink` (computed a block of rows at a time, never every head's T × T), beside the layer's logits."""
    label = built("gpt_oss")
    trace = long_trace(monkeypatch, label)
    T, pos = LG.n_tokens(trace), 3
    at = run_page(label, "en", layer=1, head=1, pos=pos)
    every_section(at, "en")
    bounded(at, T)
    fig = figure_with(at, "each query's weight on the sink")
    sink = trace["decoder.layers.1.self_attn.sink"][0, 1].double().numpy()
    np.testing.assert_allclose(plotly_array(fig["data"][1]["y"]), sink[:ROWS], rtol=1e-6)
    assert list(fig["data"][1]["x"]) == F.token_labels(trace.meta["tgt_tokens"], T)[:ROWS]
    assert f"from {sink.min():.1%} to {sink.max():.1%} of a query's weight" in texts(at)


def test_long_prompt_helpers_equal_their_whole_matrix_forms():
    rng = np.random.default_rng(0)
    T = 23
    i, j = np.indices((T, T))
    kinds, windows = ["sliding", "full", "sliding"], [4, None, 3]
    masks = [(j > i) | ((i - j >= w) if w else False) for w in windows]
    for q in (T - 1, 7, 0):  # the closed-form reach is the live one
        for a, b in zip(FM.window_reach(kinds, windows, T, q), FM.live_reach(masks, q), strict=True):
            np.testing.assert_array_equal(a, b)
    edges = LG.block_edges(T, 5)
    m = rng.random((T, T)) < 0.3
    want = [[(~m[a0:a1, b0:b1]).mean() for b0, b1 in zip(edges[:-1], edges[1:], strict=True)]
            for a0, a1 in zip(edges[:-1], edges[1:], strict=True)]
    np.testing.assert_allclose(FM.pooled_open(m, edges), want)
    assert FM.block_labels([0, 1, 5]) == ["0", "1–4"]
    assert FM.token_window(100, 99, 16) == (84, 100) and FM.token_window(100, 0, 16) == (0, 16)
    assert FM.token_window(10, 5, 16) == (0, 10)
    s = rng.normal(0, 4, (T, T))
    c = FM.soft_cap(s, 3.0)
    whole = FM.softcap_summary([(s[~masks[0]], c[~masks[0]])])
    tiled = FM.softcap_summary((s[r:r + 5][~masks[0][r:r + 5]], c[r:r + 5][~masks[0][r:r + 5]])
                               for r in range(0, T, 5))
    assert whole == tiled and whole["cells"] == (~masks[0]).sum()
