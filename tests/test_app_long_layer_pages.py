"""Tokens & embeddings, Inside a layer and the Architecture map on a long prompt (issue 24 §3), headless: a tiny
random Llama (256 positions) whose full-trace budget is lowered so that its ~100-token prompt gets a LazyTrace, as
SmolLM2's does past 276 tokens, and the figures' thresholds lowered so that the windows bite. Each page runs in en
and zh with no exception; a figure with one row per token shows a window (its first token in the URL, `first`),
its cells are the trace's rows for that window, and the chosen token stays selectable among every token."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import APP, lower_full_budget, plotly_array, tiny_hf_lm
from conftest import figure_titled as fig
from conftest import figures_by_title as figs
from streamlit.testing.v1 import AppTest

from model.core import recorder
from model.core.trace import LazyTrace
from model.loaders.lm import LanguageModel
from viz.figures import layer as FL

TIMEOUT = 300
TEXT = "The cat sat on the mat. The dog ran in the park. Attention relates every token to every other one. " * 2
ROWS, CELLS = 24, 2000  # the lowered thresholds: 24 tokens at most, 2,000 cells (the gated FFN: 15 tokens)
values = plotly_array


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return tiny_hf_lm(tmp_path_factory.mktemp("tiny-llama-w"), "llama")


@pytest.fixture(scope="module")
def budget(tiny) -> int:
    """A full trace of 32 tokens fits; TEXT (~100 tokens) does not: the pages get a LazyTrace."""
    from viz.ui import lm_models

    return lm_models.load(tiny).obj.trace_bytes(32)


@pytest.fixture(autouse=True)
def small(monkeypatch, budget):
    lower_full_budget(monkeypatch, budget)
    monkeypatch.setattr(FL, "ROWS_UP_TO", ROWS)
    monkeypatch.setattr(FL, "FIGURE_CELLS", CELLS)
    from viz.ui import long_views

    monkeypatch.setattr(long_views, "CELLS_UP_TO", 16)


@pytest.fixture(scope="module")
def traces(tiny, budget):
    """(the lazy trace the pages get, the full capture of the same prompt): the numbers every figure must show."""
    from viz.ui import lm_models

    rm = lm_models.load(tiny)
    ids = rm.obj.encode(TEXT)
    _, full = rm.obj.run_with_trace(ids, budget_bytes=2**30)
    d = list(LanguageModel.run_with_trace.__defaults__)
    try:
        LanguageModel.run_with_trace.__defaults__ = tuple([*d[:2], budget, *d[3:]])
        recorder.DEFAULT_BUDGET_BYTES, old = budget, recorder.DEFAULT_BUDGET_BYTES
        lazy = rm.trace(TEXT)[1]
    finally:
        LanguageModel.run_with_trace.__defaults__ = tuple(d)
        recorder.DEFAULT_BUDGET_BYTES = old
    assert isinstance(lazy, LazyTrace) and lazy.n_tokens > 3 * ROWS
    return lazy, full


@pytest.fixture
def no_whole_maps(monkeypatch):
    """A page may read rows of a lazy trace's attention, never a module's whole [B, H, T, T] map."""
    compute = LazyTrace._compute

    def only_the_mask(self, module, role):
        assert role == "mask", f"{module}.{role}: a whole map of a long prompt"
        return compute(self, module, role)

    monkeypatch.setattr(LazyTrace, "_compute", only_the_mask)


def run(page: str, model: str, lang: str = "en", **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"checkpoint": model, "lang": lang, **query})
    at.session_state["source_text"] = TEXT
    at.switch_page(f"viz/pages/{page}.py")
    return at.run()


def clean(at, lang: str = "en") -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    if lang == "zh":
        from test_i18n import english_in_zh

        found = english_in_zh(at)
        assert not found, found


def bounded(at) -> None:
    """No heatmap has more than ROWS token rows or CELLS cells; no figure is over 200 kB here. (PE·PEᵀ, learned
    positions only, is the first 256 positions × 256 at most, whatever the prompt: not a per-token figure.)"""
    for title, f in figs(at).items():
        assert len(json.dumps(f)) < 200_000, title
        for d in f["data"]:
            if d["type"] == "heatmap" and not title.startswith("PE · PEᵀ"):
                z = values(d["z"])
                assert z.size <= CELLS and min(z.shape) <= ROWS, (title, z.shape)


def rows_of(labels) -> list[int]:
    """The prompt positions of axis labels "i: tok"."""
    return [int(str(s).split(":")[0]) for s in labels]


def query_of(at) -> dict:
    """One query, step by step: the figure with five panels."""
    return next(f for f in figs(at).values() if "xaxis5" in f["layout"])


def url(at, key: str) -> str:
    v = at.query_params[key]
    return v[0] if isinstance(v, list) else v


# ---------------------------------------------------------------- Tokens & embeddings


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_tokens_page_shows_a_window_of_the_embedding(tiny, traces, lang, no_whole_maps):
    lazy, full = traces
    T = lazy.n_tokens
    at = run("tokens", tiny, lang)
    clean(at, lang)
    bounded(at)
    assert len(at.dataframe[0].value) == T  # the token table keeps every token
    emb = fig(at, "decoder.embed.tok")["data"][0]
    assert rows_of(emb["y"]) == list(range(ROWS))
    np.testing.assert_array_equal(values(emb["z"]), full["decoder.embed.tok"][0, :ROWS].numpy())
    said = "Tokens 0–23 of" if lang == "en" else "第 0–23 个词元"
    assert any(said in c.value for c in at.caption), [c.value for c in at.caption]


def test_tokens_page_window_control_moves_the_rows(tiny, traces):
    full = traces[1]
    at = run("tokens", tiny)
    at.number_input(key="tok_first").set_value(50).run()  # en only: a second zh run loses the model list
    clean(at)
    assert url(at, "first") == "50"
    emb = fig(at, "decoder.embed.tok")["data"][0]
    assert rows_of(emb["y"]) == list(range(50, 50 + ROWS))
    np.testing.assert_array_equal(values(emb["z"]), full["decoder.embed.tok"][0, 50:50 + ROWS].numpy())
    ang = fig(at, "decoder.rope.angles")["data"][0]
    assert rows_of(ang["y"]) == list(range(50, 50 + ROWS))
    np.testing.assert_allclose(values(ang["z"]), full["decoder.rope.angles"][50:50 + ROWS].numpy(), rtol=1e-6)


def test_tokens_page_opens_the_window_of_the_link(tiny, traces):
    T = traces[0].n_tokens
    at = run("tokens", tiny, first=str(T - 5))  # near the end: the window moves back to stay whole
    clean(at)
    emb = fig(at, "decoder.embed.tok")["data"][0]
    assert rows_of(emb["y"]) == list(range(T - ROWS, T))
    np.testing.assert_array_equal(values(emb["z"]), traces[1]["decoder.embed.tok"][0, T - ROWS:].numpy())


# ---------------------------------------------------------------- Inside a layer


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_layer_page_windows_every_per_token_figure(tiny, traces, lang, no_whole_maps):
    lazy, full = traces
    T = lazy.n_tokens
    L, a = "decoder.layers.1", "decoder.layers.1.self_attn"
    at = run("layer", tiny, lang, layer="1", sub="self_attn", token=str(T - 1), head="3")
    clean(at, lang)
    bounded(at)
    assert at.selectbox(key="ly_token").options[-1].startswith(f"{T - 1}:")  # every token can be chosen
    assert len(at.selectbox(key="ly_token").options) == T
    first = int(url(at, "first"))
    assert first <= T - 1  # the window opens at the chosen token
    # the residual stream's norms: one point per token, every token (a line stays readable)
    resid = next(f for f in figs(at).values() if "yaxis2" in f["layout"] and "xaxis3" not in f["layout"]
                 and f["data"][0]["type"] == "scatter")
    x = [d for d in resid["data"] if d["type"] == "scatter"][0]
    np.testing.assert_allclose(values(x["y"]), np.linalg.norm(full[f"{L}.norm1.in"][0].double().numpy(), axis=-1),
                               rtol=1e-5)
    # RMSNorm statistics, gated FFN and W^O: the window's rows of the trace
    ln = [f for k, f in figs(at).items() if f"{L}.norm1" in k][0]
    rows = rows_of(ln["data"][0]["x"])
    assert rows == list(range(min(first, T - ROWS), min(first, T - ROWS) + ROWS))  # kept inside the prompt
    xin = full[f"{L}.norm1.in"][0, rows].double()
    np.testing.assert_allclose(values(ln["data"][1]["y"]), (xin * xin).mean(-1).numpy(), rtol=1e-5)
    gated = fig(at, f"{L}.ffn")
    g = rows_of(gated["data"][0]["x"])
    n = CELLS // (2 * full[f"{L}.ffn.gate"].shape[-1])  # fewer tokens: each has 2 × d_ff values
    assert g == list(range(min(first, T - n), min(first, T - n) + n)) and T - 1 in g
    np.testing.assert_allclose(values(gated["data"][0]["z"]), full[f"{L}.ffn.gate"][0, g].numpy().T, atol=1e-6)
    wo = fig(at, f"{a}:")
    w = rows_of(wo["data"][0]["y"])
    assert w == rows
    z = full[f"{a}.z"][0][:, w].numpy()  # (H, R, d_k) → (R, H·d_k)
    np.testing.assert_allclose(values(wo["data"][0]["z"]), FL.concat_heads(z), atol=1e-6)
    np.testing.assert_allclose(values(wo["data"][1]["z"]), full[f"{a}.out"][0, w].numpy(), atol=1e-6)
    # one query (the last token) against the last ROWS keys; the other keys' p·v summed
    query = query_of(at)
    keys = rows_of(query["data"][3]["x"])
    assert keys == list(range(T - ROWS, T))
    p = full[f"{a}.weights"][0, 3, T - 1].numpy()
    np.testing.assert_allclose(values(query["data"][3]["y"]), p[T - ROWS:], atol=1e-6)
    assert len(at.dataframe[-1].value) == ROWS
    stack = sum(values(d["y"]) for d in query["data"] if d["type"] == "bar" and d.get("xaxis") == "x5")
    np.testing.assert_allclose(stack, full[f"{a}.z"][0, 3, T - 1].numpy(), atol=1e-5)  # the stack still totals z


def test_layer_page_window_moves_and_follows_the_chosen_token(tiny, traces):
    full = traces[1]
    L = "decoder.layers.0"
    at = run("layer", tiny, layer="0", sub="ffn", token="0", head="0", first="40")  # a link's window
    clean(at)
    gated = fig(at, "gated FFN")
    g = rows_of(gated["data"][1]["x"])
    assert g[0] == 40 and url(at, "first") == "40"
    np.testing.assert_allclose(values(gated["data"][1]["z"]), full[f"{L}.ffn.hidden"][0, g].numpy().T, atol=1e-6)
    at.number_input(key="ly_first").set_value(10).run()
    clean(at)
    assert rows_of(fig(at, "gated FFN")["data"][1]["x"])[0] == 10 and url(at, "first") == "10"
    assert rows_of(query_of(at)["data"][3]["x"]) == [0]  # token 0 sees one key: the only one drawn
    at.selectbox(key="ly_token").set_value(70).run()  # another token: the window moves to it
    clean(at)
    g = rows_of(fig(at, "gated FFN")["data"][1]["x"])
    assert g[0] <= 70 <= g[-1] and url(at, "first") == str(g[0])
    query = query_of(at)  # the last ROWS keys token 70 sees, up to itself; the earlier ones summed in the z panel
    assert rows_of(query["data"][3]["x"]) == list(range(71 - ROWS, 71))
    a = "decoder.layers.0.self_attn"
    np.testing.assert_allclose(values(query["data"][3]["y"]), full[f"{a}.weights"][0, 0, 70, 71 - ROWS:71].numpy(),
                               atol=1e-6)
    stack = sum(values(d["y"]) for d in query["data"] if d["type"] == "bar" and d.get("xaxis") == "x5")
    np.testing.assert_allclose(stack, full[f"{a}.z"][0, 0, 70].numpy(), atol=1e-5)


# ---------------------------------------------------------------- Architecture map


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_architecture_map_of_a_long_prompt(tiny, traces, lang, no_whole_maps):
    T = traces[0].n_tokens
    at = run("architecture", tiny, lang)
    clean(at, lang)
    (arch,) = figs(at).values()
    assert len(json.dumps(arch)) < 200_000
    assert f"(1, {T}, 32)" in json.dumps(arch, ensure_ascii=False)  # the edges carry the prompt's length


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """(label, full capture of TEXT) of a tiny random GPT-2: learned positions, LayerNorm, a plain GELU FFN."""
    from viz.ui import lm_models

    label = tiny_hf_lm(tmp_path_factory.mktemp("tiny-gpt2-w"), "gpt2")
    rm = lm_models.load(label)
    return label, rm.obj.run_with_trace(rm.obj.encode(TEXT), budget_bytes=2**30)[1]


def test_tokens_page_windows_learned_positions(gpt2):
    """GPT-2: the position table and embedding + position show the window too."""
    label, full = gpt2
    T = full["decoder.embed.tok"].shape[1]
    at = run("tokens", label, first="30")
    clean(at)
    bounded(at)
    pe = fig(at, "positional encoding")["data"][0]
    assert [int(y) for y in pe["y"]] == list(range(30, 30 + ROWS))
    np.testing.assert_allclose(values(pe["z"]), full["decoder.embed.pos"][30:30 + ROWS].numpy(), atol=1e-6)
    total = fig(at, "embedding + position")["data"]
    n = CELLS // (3 * 32)  # three heatmaps of d_model values per token
    assert rows_of(total[2]["y"]) == list(range(30, 30 + n)) and n < T
    np.testing.assert_allclose(values(total[2]["z"]), full["decoder.embed.out"][0, 30:30 + n].numpy(), atol=1e-6)


def test_layer_page_windows_a_plain_ffn(gpt2):
    label, full = gpt2
    L = "decoder.layers.2"
    at = run("layer", label, layer="2", sub="ffn", token="60", first="50")
    clean(at)
    bounded(at)
    ffn = fig(at, f"{L}.ffn")["data"]
    n = min(ROWS, CELLS // (full[f"{L}.ffn.hidden"].shape[-1] + 1))  # the units and the zeroed share per token
    assert rows_of(ffn[0]["x"]) == list(range(50, 50 + n))
    np.testing.assert_allclose(values(ffn[0]["z"]), full[f"{L}.ffn.hidden"][0, 50:50 + n].numpy().T, atol=1e-6)
