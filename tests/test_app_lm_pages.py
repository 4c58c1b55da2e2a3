"""Architecture map, Tokens & embeddings, Inside a layer and Snapshots with language models (issue 19 §1), headless
(AppTest): a tiny random Llama (GQA, RoPE, RMSNorm, SwiGLU) and a tiny random GPT-2 (learned positions, LayerNorm,
GELU), saved with transformers into a temp directory and offered as `--model PATH` server models, and SmolLM2 in
en and zh (slow, never skipped). Every number checked is the trace's or the model's own."""

from __future__ import annotations

import re
import urllib.parse

import numpy as np
import pytest
from conftest import APP, plotly_array, tiny_hf_lm
from conftest import figure_titled as fig
from conftest import figures_by_title as figs
from streamlit.testing.v1 import AppTest

from model import Trace
from viz.figures import attention as F
from viz.ui import lm_models

pytestmark = pytest.mark.slow
TIMEOUT = 600
IOI = "When Mary and John went to the store, John gave a drink to"
PAGES = {"architecture": "viz/pages/architecture.py", "tokens": "viz/pages/tokens.py", "layer": "viz/pages/layer.py",
         "snapshots": "viz/pages/snapshots.py"}


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def tiny(request, tmp_path_factory) -> str:
    """A tiny random HF model directory registered as a server model; returns its label."""
    return tiny_hf_lm(tmp_path_factory.mktemp(f"tiny-{request.param}"), request.param)


values = plotly_array


def clean(at) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def page(name: str, model: str, lang: str = "en", **query):
    """The page opened from a link, in one run (as test_app_llm does: a second run would make AppTest format the
    zh model list's labels outside the session, in English, and fail to find them)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"checkpoint": model, "lang": lang, **query})
    at.switch_page(PAGES[name])
    return at.run()


def shape_text(shape) -> str:
    return "(" + ", ".join(str(int(n)) for n in shape) + ")"


def trace_of(label: str, text: str = IOI):
    return lm_models.load(label).trace(text)[1]


# ---------------------------------------------------------------- Architecture map


def test_architecture_draws_the_lm_with_the_traces_shapes(tiny):
    at = page("architecture", tiny, layer="2", head="3", text=IOI)
    clean(at)
    trace = trace_of(tiny)
    spec = fig(at, "the live model")
    texts = " | ".join(a.get("text", "") for a in spec["layout"]["annotations"]).replace("<br>", " ")
    a = "decoder.layers.2.self_attn"
    for name in (f"{a}.q", f"{a}.k", "decoder.embed.out", "decoder.layers.2.ffn.hidden", "logits"):
        assert shape_text(trace[name].shape) in texts, (name, texts)
    rotary = "decoder.rope.angles" in trace
    assert ("GQA: 4 query heads, 2 K/V heads" in texts) == rotary  # the Llama shares K/V heads; GPT-2 does not
    assert ("RMSNorm" in texts) == rotary and ("SwiGLU" in texts) == rotary and ("RoPE" in texts) == rotary
    if rotary:
        assert shape_text(trace["decoder.rope.angles"].shape) in texts
    else:
        assert shape_text(trace["decoder.embed.pos"].shape) in texts and "learned position" in texts
    assert "cross" not in texts.lower()
    links = at.get("page_link")
    by_label = {link.proto.label: dict(urllib.parse.parse_qsl(link.proto.query_string)) for link in links}
    assert by_label["Layer 2: Masked self-attention, GQA: 4 query heads, 2 K/V heads" if rotary else
                    "Layer 2: Masked multi-head self-attention (4 heads)"] == {
        "attn_kind": "dec", "layer": "2", "head": "3"}
    norm = "RMSNorm" if rotary else "LayerNorm"
    assert by_label[f"Layer 2: {norm} before the FFN"] == {"stack": "decoder", "layer": "2", "sub": "ffn", "head": "3"}
    assert len(by_label) == len(links)  # every link names its block on its own


@pytest.mark.parametrize("block, title, state", [
    ("lm_attn", "Attention", {"attn_kind": "dec", "attn_layer": 2, "attn_head": 3}),
    ("lm_ffn", "Inside a layer", {"ly_stack": "decoder", "ly_layer": 2, "ly_sub": "ffn", "ly_head": 3}),
    ("lm_embed", "Tokens & embeddings", {}),
])
def test_a_click_on_an_lm_block_opens_its_view(tiny, block, title, state):
    at = page("architecture", tiny, layer="2", head="3", text=IOI)
    at.session_state["arch_map"] = {"selection": {"points": [{"customdata": [block]}]}}
    at.run()
    clean(at)
    assert at.title[0].value == title
    assert {k: at.session_state[k] for k in state} == state
    assert at.get("plotly_chart")


# ---------------------------------------------------------------- Tokens & embeddings


def test_tokens_shows_pieces_ids_and_the_unscaled_embedding(tiny):
    text = "Hello world\nThe cat"
    at = page("tokens", tiny, text=text)
    clean(at)
    lm = lm_models.load(tiny)
    ids = lm.obj.encode(text)[0].tolist()
    pieces = lm.obj.tokens(ids)
    table = at.dataframe[0].value
    assert table["id"].tolist() == ids
    assert table["piece"].tolist() == pieces
    assert table["token"].tolist() == [lm_models.readable(p) for p in pieces]
    assert "↵" in "".join(table["token"]) and "␣" in "".join(table["token"])  # Ċ and Ġ made readable
    trace = lm.trace(text)[1]
    emb = fig(at, "decoder.embed.tok")
    assert "no ×√d" in emb["layout"]["title"]["text"]
    np.testing.assert_array_equal(values(emb["data"][0]["z"]), trace["decoder.embed.tok"][0].numpy())
    if "decoder.rope.angles" in trace:  # RoPE: no position vector; the angles, and a link to where they act
        assert any("rotations (RoPE)" in i.value for i in at.info)
        np.testing.assert_allclose(values(fig(at, "decoder.rope.angles")["data"][0]["z"]),
                                   trace["decoder.rope.angles"].numpy(), rtol=1e-6)
        link = next(p for p in at.get("page_link") if "since 2017" in p.proto.label or "Attention" in p.proto.label)
        assert link.proto.page in ("since2017", "")
        assert not [k for k in figs(at) if "positional encoding" in k]
    else:  # learned positions (GPT-2): drawn as the toy page draws them
        np.testing.assert_array_equal(values(fig(at, "positional encoding")["data"][0]["z"]),
                                      trace["decoder.embed.pos"].numpy())
        total = fig(at, "embedding + position")
        np.testing.assert_array_equal(values(total["data"][2]["z"]), trace["decoder.embed.out"][0].numpy())


# ---------------------------------------------------------------- Inside a layer


def test_layer_page_shows_the_lm_residual_stream(tiny):
    at = page("layer", tiny, layer="1", sub="ffn", token="5", head="3", text=IOI)
    clean(at)
    assert at.radio(key="ly_sub").options == ["self-attention", "feed-forward network"]  # no cross-attention
    trace = trace_of(tiny)
    rotary = "decoder.rope.angles" in trace
    norm = "RMSNorm" if rotary else "LayerNorm"
    resid = fig(at, "residual stream")
    lines = [d for d in resid["data"] if d["type"] == "scatter"]
    names = ["decoder.layers.1.norm2.in", "decoder.layers.1.norm2.out", "decoder.layers.1.ffn.out",
             "decoder.layers.1.out"]  # pre-LN: x → norm → FFN → x + FFN
    assert [d["name"].split("  ")[0] for d in lines] == ["x", f"{norm}(x)", f"sublayer({norm}(x))",
                                                        f"x + sublayer({norm}(x))"]
    for line, name in zip(lines, names, strict=True):
        np.testing.assert_allclose(values(line["y"]), np.linalg.norm(trace[name][0].double().numpy(), axis=-1),
                                   rtol=1e-5)
    stats = fig(at, f"decoder.layers.1.norm2: {norm}(x)")
    x = trace["decoder.layers.1.norm2.in"][0].double()
    second = (x * x).mean(-1) if rotary else x.var(-1, unbiased=False)
    np.testing.assert_allclose(values(stats["data"][1]["y"]), second.numpy(), rtol=1e-5)
    if rotary:
        assert "no μ subtracted" in stats["layout"]["title"]["text"]
        gated = fig(at, "gated FFN")
        np.testing.assert_array_equal(values(gated["data"][0]["z"]), trace["decoder.layers.1.ffn.gate"][0].numpy().T)
        np.testing.assert_array_equal(values(gated["data"][1]["z"]),
                                      trace["decoder.layers.1.ffn.hidden"][0].numpy().T)
        assert any("query head 3 reads the keys and values of K/V head 1" in c.value for c in at.caption)
    # one query, step by step: q·k with the key head query head 3 reads
    g = 1 if rotary else 3
    a = "decoder.layers.1.self_attn"
    q, k = trace[f"{a}.q"][0, 3, 5].double(), trace[f"{a}.k"][0, g].double()
    table = at.dataframe[-1].value
    assert table["q·k"].tolist() == [F.num(v) for v in (k @ q).numpy()]  # the page's number format
    assert table["+ M"].tolist()[6:] == ["−∞"] * (len(table) - 6)  # later keys are masked (causal)
    assert ("q·k without RoPE" in table.columns) == rotary


# ---------------------------------------------------------------- Snapshots


def test_snapshots_capture_lm_weights_and_compare(tiny):
    at = page("snapshots", tiny, text=IOI)
    clean(at)
    n_layers = lm_models.load(tiny).describe()["stacks"]["decoder"]["layers"]
    assert at.radio(key="snap_capture").value == "*.weights"
    assert any(f"**{n_layers} tensors" in m.value for m in at.markdown)
    assert any("full trace is big" in c.value for c in at.caption)
    lm = lm_models.load(tiny)
    _, mine = lm.obj.run_with_trace(IOI, names="*.weights")
    at.file_uploader(key="snap_upload").upload("mine.safetensors", Trace(dict(mine), mine.meta).to_bytes()).run()
    clean(at)
    assert any("The traces match" in s.value for s in at.success)
    # a changed head: found, located, drawn
    changed = dict(mine)
    changed["decoder.layers.1.self_attn.weights"] = changed["decoder.layers.1.self_attn.weights"].clone()
    changed["decoder.layers.1.self_attn.weights"][0, 2, 4, 1] += 0.5
    at.file_uploader(key="snap_upload").clear().upload("changed.safetensors",
                                                        Trace(changed, mine.meta).to_bytes()).run()
    clean(at)
    table = at.dataframe[0].value
    assert table["name"].tolist() == ["decoder.layers.1.self_attn.weights"]
    assert "head=2" in table["where (worst cell)"][0] and "query=4" in table["where (worst cell)"][0]
    # everything: the full trace, every capture point
    at.radio(key="snap_capture").set_value("all").run()
    assert not at.exception
    full = lm_models.load(tiny).trace(IOI)[1]
    assert any(f"**{len(full)} tensors" in m.value for m in at.markdown)


# ---------------------------------------------------------------- SmolLM2, en and zh


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("name", list(PAGES))
def test_smollm2_pages(name, lang):
    at = page(name, "smollm2", lang, layer="17", head="3")
    clean(at)
    assert at.get("plotly_chart") or name == "snapshots"
    assert not [i.value for i in at.info if "has no" in i.value or "not trained in this lab" in i.value]
    if lang == "zh":
        from test_i18n import english_in_zh

        assert any("\u4e00" <= ch <= "\u9fff" for ch in at.title[0].value)
        found = english_in_zh(at)
        assert not found, found
        return
    trace = lm_models.load("smollm2").trace(IOI)[1]
    if name == "architecture":
        spec = fig(at, "the live model")
        texts = " ".join(a.get("text", "") for a in spec["layout"]["annotations"]).replace("<br>", " ")
        assert "GQA: 9 query heads, 3 K/V heads" in texts and "SwiGLU" in texts and "d_ff = 1536" in texts
        for n in ("decoder.layers.17.self_attn.q", "decoder.layers.17.self_attn.k", "logits", "decoder.rope.angles"):
            assert shape_text(trace[n].shape) in texts, n
    elif name == "tokens":
        table = at.dataframe[0].value
        assert table["id"].tolist() == trace.meta["tgt_ids"][0]
        assert "␣Mary" in table["token"].tolist() and "ĠMary" in table["piece"].tolist()
    elif name == "layer":
        assert at.radio(key="ly_sub").options == ["self-attention", "feed-forward network"]
        assert any("9 query heads share 3 K/V heads, so query head 3 reads the keys and values of K/V head 1"
                   in c.value for c in at.caption)
    else:
        assert any("**30 tensors" in m.value for m in at.markdown)  # *.weights: one per layer


def test_smollm2_snapshot_of_1024_tokens_says_what_fits():
    """30 layers × 9 heads × T² floats: at 1,024 tokens the weights alone are 1.1 GiB, over the 512 MiB budget.
    The page then captures a lazy trace by default (q, k, v); asked for the weights, it says what fits."""
    lm = lm_models.load("smollm2").obj
    text = " ".join(["cat"] * 1023)
    T = lm.encode(text).shape[1]
    assert T >= 1000
    at = page("snapshots", "smollm2", text=text)
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.radio[0].value == "lazy" and at.get("download_button")
    at = page("snapshots", "smollm2", text=text, capture="*.weights")
    assert not at.exception
    fit = max(n for n in range(1, T) if 30 * 9 * n * n * 4 <= 512 * 2**20)  # the weights are the only captures
    msg = " ".join(e.value for e in at.error)
    assert re.search(rf"Up to {fit:,} tokens fit", msg), msg
    assert f"these {T:,} tokens" in msg or f"these {T} tokens" in msg
