"""The Streamlit explorer, headless (streamlit.testing AppTest): every page runs, draws the
captured tensors, turns bad input into a message, and stays under 20 MB at 256 tokens."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_clean, open_page, shown, title_names
from streamlit.testing.v1 import AppTest

from model import Trace
from model.toy.checkpoint import Checkpoint, list_checkpoints, load_checkpoint
from viz.ui import text_store
from viz.ui.models import EXTRA_ENV, checkpoint_names
from viz.ui.sidebar import PREFERRED, default_checkpoint
from viz.ui.state import MAX_URL_TEXT
from viz.ui.text import MAX_SHOWN, unk_note

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PAGES = ["viz/pages/tokens.py", "viz/pages/attention.py", "viz/pages/schedule.py", "viz/pages/snapshots.py"]
TIMEOUT = 180
MAX_PAGE_BYTES = 20 * 2**20


# ---------------------------------------------------------------- fixtures and helpers


def _random_clone(ckpt: Checkpoint, path: Path, max_len: int) -> str:
    """Same tokenizers and sizes as `ckpt`, random weights, a longer max_len (for the 256-token budget)."""
    from model import Transformer, TransformerConfig

    torch.manual_seed(0)
    cfg = TransformerConfig.from_dict({**ckpt.cfg.to_dict(), "max_len": max_len})
    clone = Checkpoint(Transformer(cfg), ckpt.src_tokenizer, ckpt.tgt_tokenizer,
                       meta={"name": "long", "example": ckpt.example}, log=ckpt.log, name="long")
    return str(clone.save(path))


class Default:
    """The checkpoint the app opens on: `name` as the sidebar shows it, and the loaded checkpoint."""

    def __init__(self, name: str):
        self.name, self.ckpt = name, load_checkpoint(name)

    def __getattr__(self, attr):
        return getattr(self.ckpt, attr)


@pytest.fixture(scope="module")
def shipped() -> Default:
    # Shipped checkpoints, plus any listed in $ATTENTION_LAB_CHECKPOINTS (as the app offers them).
    names = checkpoint_names()
    if not names:
        pytest.skip("no checkpoints installed (model/checkpoints) or listed in $ATTENTION_LAB_CHECKPOINTS")
    return Default(default_checkpoint(names))


def run_app(page: str | None = None, *, text: str | None = None, target: str | None = None,
            checkpoint: str | None = None, query: dict | None = None) -> AppTest:
    state = {"checkpoint": checkpoint, "source_text": text, "target_text": target}
    return open_page(page, query=query, state=state, timeout=TIMEOUT)


def figures(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def figure(at: AppTest, title_start: str) -> dict:
    found = [f for f in figures(at) if title_names(f["layout"].get("title", {}).get("text", ""), title_start)]
    titles = [f["layout"].get("title", {}).get("text") for f in figures(at)]
    assert found, f"no figure titled {title_start!r}: {titles}"
    return found[0]


def show_view(at: AppTest, view: str, key: str = "attn") -> AppTest:
    """Switch the attention explorer to `view` (heads, model, pipeline, masks, qkvz, sqrt) and rerun."""
    at.button_group(key=f"{key}_view").set_value(view).run()
    assert_clean(at)
    return at


def z_of(trace_json: dict) -> np.ndarray:
    """A heatmap's z from plotly JSON: base64 typed array ({dtype, bdata, shape}) or nested lists."""
    z = trace_json["z"]
    if isinstance(z, dict):
        a = np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"]))
        return a.reshape([int(s) for s in str(z["shape"]).split(",")])
    return np.asarray(z, dtype=np.float64)


def page_bytes(node) -> int:
    """Sum of the protobuf sizes of every element on the page (what is sent to the browser)."""
    total = len(node.proto.SerializeToString()) if getattr(node, "proto", None) is not None else 0
    return total + sum(page_bytes(c) for c in getattr(node, "children", {}).values())


# ---------------------------------------------------------------- default view and every page


def test_default_opens_on_a_shipped_model_with_its_example(shipped):
    at = run_app()
    assert_clean(at)
    assert at.sidebar.selectbox(key="checkpoint").value == shipped.name
    if list_checkpoints():  # a shipped model whose attention is worth looking at
        assert shipped.name in PREFERRED[:2] or shipped.name == list_checkpoints()[0]
    assert at.sidebar.text_area(key="source_text").value == shipped.example != ""
    assert at.query_params["checkpoint"] == shipped.name  # the view is in the URL, ready to share
    assert at.get("plotly_chart"), "the default page draws figures"


@pytest.mark.parametrize("page", PAGES)
def test_every_page_runs(shipped, page):
    at = run_app(page)
    assert_clean(at)
    assert at.get("plotly_chart") or page.endswith("snapshots.py")
    assert any("caption" == e.type for e in at.main), "every page explains what it shows"


# ---------------------------------------------------------------- the figures are the captured tensors


def test_attention_heatmap_is_the_captured_weights(shipped):
    at = run_app("viz/pages/attention.py")
    assert_clean(at)
    trace = shipped.trace(shipped.example)[1]
    name = "decoder.layers.0.cross_attn"  # the default view: cross-attention, where alignment shows
    head_fig = figure(at, f"{name} · head 0")
    np.testing.assert_array_equal(z_of(shown(head_fig)), trace[f"{name}.weights"][0, 0].numpy())
    hover = shown(head_fig)["hovertemplate"]
    assert "%{z:.4g}" in hover and "%{y}" in hover  # exact value and the token names
    assert shown(head_fig)["y"][0] == f"0: {trace.meta['tgt_tokens'][0]} → {trace.meta['next_tokens'][0]}"
    assert shown(head_fig)["x"][0].endswith(trace.meta["src_tokens"][0].replace(" ", "␣"))
    # Every head rides along (head buttons switch in the browser): each trace is that head's weights.
    assert len(head_fig["data"]) == shipped.cfg.n_heads
    for h, tr in enumerate(head_fig["data"]):
        np.testing.assert_array_equal(z_of(tr), trace[f"{name}.weights"][0, h].numpy())
        assert tr["visible"] is (h == 0)
    menu = head_fig["layout"]["updatemenus"][0]
    assert menu["active"] == 0 and [b["label"] for b in menu["buttons"]] == [str(h) for h in range(
        shipped.cfg.n_heads)]
    assert [b["args"][0]["visible"].index(True) for b in menu["buttons"]] == list(range(shipped.cfg.n_heads))
    assert all(f"· head {h} ·" in b["args"][1]["title.text"] for h, b in enumerate(menu["buttons"]))

    # Encoder self-attention, another layer and head: the figure follows the widgets.
    at.radio(key="attn_kind").set_value("enc")
    at.run()
    name = f"encoder.layers.{shipped.cfg.n_encoder_layers - 1}.self_attn"
    at.selectbox(key="attn_head").set_value(shipped.cfg.n_heads - 1)
    at.selectbox(key="attn_layer").set_value(shipped.cfg.n_encoder_layers - 1)
    at.run()
    assert_clean(at)
    H = shipped.cfg.n_heads - 1
    head_fig = figure(at, f"{name} · head {H}")
    np.testing.assert_array_equal(z_of(shown(head_fig)), trace[f"{name}.weights"][0, H].numpy())

    # Back to cross-attention in the last layer.
    at.radio(key="attn_kind").set_value("cross")
    at.selectbox(key="attn_layer").set_value(shipped.cfg.n_decoder_layers - 1)
    at.run()
    assert_clean(at)
    L, H = shipped.cfg.n_decoder_layers - 1, shipped.cfg.n_heads - 1
    name = f"decoder.layers.{L}.cross_attn"
    head_fig = figure(at, f"{name} · head {H}")
    np.testing.assert_array_equal(z_of(shown(head_fig)), trace[f"{name}.weights"][0, H].numpy())
    assert at.query_params["layer"] == str(L) and at.query_params["head"] == str(H)

    pipeline = figure(show_view(at, "pipeline"), f"{name} · head {H}: softmax")
    zs = [z_of(t) for t in pipeline["data"] if t["type"] == "heatmap"]
    np.testing.assert_array_equal(zs[1], trace[f"{name}.scores"][0, H].numpy())
    np.testing.assert_array_equal(zs[-1], trace[f"{name}.weights"][0, H].numpy())


def test_query_string_opens_a_shared_view(shipped):
    L, H = shipped.cfg.n_decoder_layers - 1, 1
    at = run_app("viz/pages/attention.py", query={"checkpoint": shipped.name, "text": shipped.example,
                                                   "attn_kind": "dec", "layer": str(L), "head": str(H)})
    assert_clean(at)
    assert (at.radio(key="attn_kind").value, at.selectbox(key="attn_layer").value,
            at.selectbox(key="attn_head").value) == ("dec", L, H)
    trace = shipped.trace(shipped.example)[1]
    fig = figure(at, f"decoder.layers.{L}.self_attn · head {H}")
    want = trace[f"decoder.layers.{L}.self_attn.weights"][0, H].numpy()
    np.testing.assert_array_equal(z_of(shown(fig)), want)


def test_query_string_with_junk_falls_back(shipped):
    at = run_app("viz/pages/attention.py", query={"checkpoint": "no-such-model", "layer": "99", "head": "x"})
    assert_clean(at)
    assert at.sidebar.selectbox(key="checkpoint").value == shipped.name
    assert at.selectbox(key="attn_layer").value == 0 and at.selectbox(key="attn_head").value == 0


def test_tokens_page_draws_the_embeddings(shipped):
    at = run_app("viz/pages/tokens.py")
    assert_clean(at)
    trace = shipped.trace(shipped.example)[1]
    emb = figure(at, "encoder.embed.tok")
    np.testing.assert_array_equal(z_of(emb["data"][0]), trace["encoder.embed.tok"][0].numpy())
    total = figure(at, "embedding + position")
    np.testing.assert_array_equal(z_of(total["data"][2]), trace["encoder.embed.out"][0].numpy())
    table = at.dataframe[0].value
    assert list(table["id"]) == trace.meta["src_ids"][0]


def test_schedule_page_draws_noam_and_the_training_log(shipped):
    at = run_app("viz/pages/schedule.py")
    assert_clean(at)
    fig = figure(at, "Noam schedule")
    names = [t.get("name", "") for t in fig["data"]]
    assert {"d=512, warmup=4000", "d=512, warmup=8000", "d=256, warmup=4000"} <= set(names)
    peak = next(t for t in fig["data"] if t.get("name") == "peak")
    assert peak["x"] == [4000]
    if shipped.log.get("lr"):
        assert any("while training" in n for n in names)


# ---------------------------------------------------------------- bad input: a message, never a traceback


@pytest.mark.parametrize("text", ["", "   \n\t ", "3 nov\x07ember", "x" * 10_000],
                         ids=["empty", "whitespace", "control-char", "over-long"])
def test_bad_input_gives_a_message(shipped, text):
    at = run_app("viz/pages/attention.py", text=text)
    assert not at.exception, [e.value for e in at.exception]
    assert at.error, "a clear error message"
    msg = at.error[0].value.lower()
    assert any(w in msg for w in ("empty", "whitespace", "control character", "limit", "max_len"))
    if len(text) > 1000:
        limit = shipped.cfg.max_len - shipped.src_eos  # the [EOS] the source ends with takes one position
        assert f"limit is {limit} tokens" in at.error[0].value  # names the limit


def test_emoji_becomes_unk_with_a_warning(shipped):
    at = run_app("viz/pages/tokens.py", text=shipped.example + " 🙂")
    assert not at.exception
    assert any("[UNK]" in w.value for w in at.warning)


@pytest.mark.parametrize("page", PAGES[:2] + PAGES[3:])
def test_empty_input_on_every_trace_page(shipped, page):
    at = run_app(page, text="")
    assert not at.exception and at.error


# ---------------------------------------------------------------- snapshots


def test_snapshot_upload_roundtrip_and_compare(shipped):
    at = run_app("viz/pages/snapshots.py")
    assert_clean(at)
    same = shipped.trace(shipped.example)[1]
    at.file_uploader(key="snap_upload").upload("same.safetensors", same.to_bytes())
    at.run()
    assert_clean(at)
    assert any("match" in s.value for s in at.success)

    other = shipped.trace(shipped.example, target=shipped.trace(shipped.example)[1].meta["target"])[1]
    tensors = dict(other)
    name = "encoder.layers.0.self_attn.weights"
    tensors[name] = tensors[name].clone()
    tensors[name][0, 1, 0, 0] += 0.25
    edited = Trace(tensors, other.meta).to_bytes()
    at.file_uploader(key="snap_upload").clear().upload("edited.safetensors", edited)
    at.run()
    assert_clean(at)
    rows = at.dataframe[0].value
    assert rows["name"].iloc[0] == name and "head=1" in rows["where (worst cell)"].iloc[0]
    diff = figure(at, name)
    np.testing.assert_allclose(z_of(diff["data"][2])[0, 0], -0.25, atol=1e-6)  # current − file


@pytest.mark.parametrize("payload", [b"not a trace at all", b"\x08\x00\x00\x00\x00\x00\x00\x00{}", b""],
                         ids=["garbage", "truncated-header", "empty"])
def test_corrupt_upload_gives_a_message(shipped, payload):
    at = run_app("viz/pages/snapshots.py")
    at.file_uploader(key="snap_upload").upload("bad.safetensors", payload)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.error and "not" in at.error[0].value


def test_foreign_safetensors_upload_is_refused(shipped, tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2, 2)}, str(tmp_path / "weights.safetensors"))
    at = run_app("viz/pages/snapshots.py")
    data = (tmp_path / "weights.safetensors").read_bytes()
    at.file_uploader(key="snap_upload").upload("weights.safetensors", data)
    at.run()
    assert not at.exception
    assert at.error and "not an Attention Lab trace" in at.error[0].value


# ---------------------------------------------------------------- limits and isolation


@pytest.fixture(scope="module")
def long_checkpoint(shipped, tmp_path_factory) -> tuple[str, str, str]:
    """(checkpoint, 256-token source, 256-token target); a random clone if the shipped max_len < 257."""
    n = 256
    name = shipped.name
    if shipped.cfg.max_len < n + 1:
        name = _random_clone(shipped.ckpt, tmp_path_factory.mktemp("long") / "long", n + 8)
    def chars(tok):  # single-character vocabulary entries (ids 0-6 are the specials)
        return [t for t in tok.tokens(range(7, tok.vocab_size)) if len(t) == 1 and not t.isspace()]

    src_chars, tgt_chars = chars(shipped.src_tokenizer), chars(shipped.tgt_tokenizer)
    src = "".join(src_chars[i % len(src_chars)] for i in range(n))
    tgt = "".join(tgt_chars[i % len(tgt_chars)] for i in range(n - 1))
    return name, src, tgt


@pytest.mark.parametrize("page", PAGES[:2] + PAGES[3:])
def test_page_bytes_under_20_mb_at_256_tokens(long_checkpoint, monkeypatch, page):
    name, src, tgt = long_checkpoint
    if "/" in name:
        monkeypatch.setenv(EXTRA_ENV, name)
    ckpt = load_checkpoint(name)
    if ckpt.src_tokenizer.kind != "char":
        pytest.skip("the 256-token input is built from single-character tokens")
    assert len(ckpt.encode_source(src)[0]) == 256
    at = run_app(page, text=src, target=tgt, checkpoint=name)
    assert_clean(at)
    n = page_bytes(at._tree)
    assert n < MAX_PAGE_BYTES, f"{page} sends {n / 2**20:.1f} MB"
    if page.endswith("attention.py"):
        model_view = figure(show_view(at, "model"), "model view")
        assert "max over" in model_view["layout"]["title"]["text"]  # downsampled thumbnails


def _max_pool(w: np.ndarray, b: int) -> np.ndarray:
    starts = np.arange(0, w.shape[0], b), np.arange(0, w.shape[1], b)
    return np.maximum.reduceat(np.maximum.reduceat(w, starts[0], axis=0), starts[1], axis=1)


def test_attention_page_at_256_tokens_pools_and_windows(long_checkpoint, monkeypatch):
    """Every attention kind at 256 tokens: under budget, the head heatmap at full resolution, the
    all-heads grid max-pooled 2× (= a max-pool of the captured weights), the score pipeline and
    masks showing 64 query rows at a time (exact values), chosen with a selector."""
    name, src, tgt = long_checkpoint
    if "/" in name:
        monkeypatch.setenv(EXTRA_ENV, name)
    ckpt = load_checkpoint(name)
    if ckpt.src_tokenizer.kind != "char":
        pytest.skip("the 256-token input is built from single-character tokens")
    trace = ckpt.trace(src, target=tgt)[1]
    at = run_app("viz/pages/attention.py", text=src, target=tgt, checkpoint=name)
    assert_clean(at)
    for kind, mod in zip(["enc", "dec", "cross"], ["encoder.layers.0.self_attn", "decoder.layers.0.self_attn",
                                                 "decoder.layers.0.cross_attn"], strict=True):
        at.radio(key="attn_kind").set_value(kind).run()
        show_view(at, "heads")
        n = page_bytes(at._tree)
        assert n < MAX_PAGE_BYTES, f"{mod}: the page sends {n / 2**20:.1f} MB"
        w = trace[f"{mod}.weights"][0].numpy()
        n_q = w.shape[1]
        head = figure(at, f"{mod} · head 0 · softmax weights")
        np.testing.assert_array_equal(z_of(head["data"][0]), w[0])  # full resolution
        assert len(head["data"]) == 1 and "updatemenus" not in head["layout"]  # too big to carry every head
        grid = figure(at, f"{mod} · all")
        assert "downsampled 2×: each cell is the max of 2×2" in grid["layout"]["title"]["text"]
        for h, t in enumerate(grid["data"]):
            np.testing.assert_array_equal(z_of(t), _max_pool(w[h], 2))
        assert "max of 2×2" in grid["data"][0]["hovertemplate"]
        pipe = figure(show_view(at, "pipeline"), f"{mod} · head 0: softmax")
        assert f"query rows 0–63 of {n_q}" in pipe["layout"]["title"]["text"]
        np.testing.assert_array_equal(z_of(pipe["data"][-1]), w[0, :64])
        masks = figure(show_view(at, "masks"), f"{mod}: mask")
        np.testing.assert_array_equal(z_of(masks["data"][-1]), w[0, :64])
    # Another window of query rows: the pipeline follows the selector.
    show_view(at, "pipeline").selectbox(key="attn_pipe_rows").set_value(2).run()
    assert_clean(at)
    pipe = figure(at, "decoder.layers.0.cross_attn · head 0: softmax")
    assert "query rows 128–191" in pipe["layout"]["title"]["text"]
    zs = [z_of(t) for t in pipe["data"] if t["type"] == "heatmap"]
    np.testing.assert_array_equal(zs[1], trace["decoder.layers.0.cross_attn.scores"][0, 0, 128:192].numpy())
    np.testing.assert_array_equal(zs[-1], trace["decoder.layers.0.cross_attn.weights"][0, 0, 128:192].numpy())


def test_sessions_do_not_share_state(shipped):
    a = run_app("viz/pages/attention.py")
    b = run_app("viz/pages/attention.py", text=shipped.example[: max(1, len(shipped.example) // 2)])
    b.selectbox(key="attn_head").set_value(1).run()
    a.run()
    assert a.sidebar.text_area(key="source_text").value == shipped.example
    assert a.selectbox(key="attn_head").value == 0
    assert len(shown(figure(a, "decoder.layers.0.cross_attn · head 0"))["x"]) == \
        len(shipped.encode_source(shipped.example)[0])


# ---------------------------------------------------------------- reuse on an encoder-only trace


def _encoder_only_page():
    import torch

    from model import Transformer, TransformerConfig
    from viz.ui.attention_views import render_attention

    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=30, n_decoder_layers=0, d_model=32, n_heads=4, n_encoder_layers=3,
                            d_ff=64, dropout=0.0, max_len=64, scale_embedding=False, embed_norm=True)
    src = torch.tensor([[2, 11, 12, 13, 11, 3, 0]])
    toks = ["[CLS]", "the", "animal", "was", "the", "[SEP]", "[PAD]"]
    trace = Transformer(cfg).eval().run_with_trace(src, meta={"src_tokens": toks})[1]
    render_attention(trace, key="pre")


def test_attention_views_work_on_an_encoder_only_trace():
    import torch

    from model import Transformer, TransformerConfig

    at = AppTest.from_function(_encoder_only_page, default_timeout=TIMEOUT)
    at.run()
    assert_clean(at)
    assert at.radio(key="pre_kind").options == ["Encoder self-attention"]  # labels; the value is "enc"
    at.selectbox(key="pre_layer").set_value(2)
    at.selectbox(key="pre_head").set_value(3)
    at.run()
    assert_clean(at)
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=30, n_decoder_layers=0, d_model=32, n_heads=4, n_encoder_layers=3,
                            d_ff=64, dropout=0.0, max_len=64, scale_embedding=False, embed_norm=True)
    trace = Transformer(cfg).eval().run_with_trace(torch.tensor([[2, 11, 12, 13, 11, 3, 0]]))[1]
    fig = figure(at, "encoder.layers.2.self_attn · head 3")
    want = trace["encoder.layers.2.self_attn.weights"][0, 3].numpy()
    np.testing.assert_array_equal(z_of(shown(fig)), want)
    assert shown(fig)["y"][2] == "2: animal"
    masks = figure(show_view(at, "masks", key="pre"), "encoder.layers.2.self_attn: mask")
    pad = z_of(masks["data"][0])
    assert pad[:, -1].all() and not pad[:, :-1].any()  # the [PAD] key column is blocked, for every query
    show_view(at, "model", key="pre")
    assert len([f for f in figures(at) if f["layout"]["title"]["text"].startswith("model view")]) == 1


def test_figures_export_as_png_or_svg(shipped):
    at = run_app("viz/pages/attention.py")
    configs = [json.loads(c.proto.config) for c in at.get("plotly_chart")]
    assert all(c["toImageButtonOptions"]["format"] == "png" for c in configs)
    at.sidebar.radio(key="export_format").set_value("svg").run()
    assert_clean(at)
    configs = [json.loads(c.proto.config) for c in at.get("plotly_chart")]
    assert all(c["toImageButtonOptions"]["format"] == "svg" for c in configs)
    assert configs[0]["toImageButtonOptions"]["filename"] == "decoder.layers.0.cross_attn-head0"


# ---------------------------------------------------------------- issue 13: the app keeps its word


def _view(at: AppTest) -> tuple:
    return (at.radio(key="attn_kind").value, at.selectbox(key="attn_layer").value,
            at.selectbox(key="attn_head").value, at.button_group(key="attn_view").value)


def _told_to_browser(at: AppTest) -> None:
    """Every control of the view tells the browser its value (set_value): a control drawn again after a
    run without it (an input error, another page) is a new element there, which would otherwise show
    its default while the chart and the URL show the kept value."""
    for w in (at.radio(key="attn_kind"), at.selectbox(key="attn_layer"), at.selectbox(key="attn_head"),
              at.button_group(key="attn_view")):
        assert w.proto.set_value, f"{w.key}: the browser would show the default, not {w.value!r}"


def _choose_view(at: AppTest, kind="dec", layer=1, head=3, view="pipeline") -> AppTest:
    at.radio(key="attn_kind").set_value(kind).run()
    at.selectbox(key="attn_layer").set_value(layer)
    at.selectbox(key="attn_head").set_value(head).run()
    return show_view(at, view)


def test_controls_and_chart_agree_after_an_input_error(shipped):
    """#1: decoder self-attention, layer 1, head 3; clear the text (an error); type a new one."""
    at = _choose_view(run_app("viz/pages/attention.py"))
    at.sidebar.text_area(key="source_text").set_value("").run()
    assert at.error and not at.exception
    at.sidebar.text_area(key="source_text").set_value(shipped.example).run()
    assert_clean(at)
    assert _view(at) == ("dec", 1, 3, "pipeline")
    _told_to_browser(at)
    figure(at, "decoder.layers.1.self_attn · head 3 · softmax weights")
    figure(at, "decoder.layers.1.self_attn · head 3: softmax")  # the pipeline view, same module and head


def test_attention_tokens_attention_keeps_the_view(shipped):
    """#4: leaving the page and coming back reopens the same kind, layer, head and view."""
    at = _choose_view(run_app("viz/pages/attention.py"), "enc", 1, 2, "qkvz")
    at.switch_page("viz/pages/tokens.py").run()
    assert_clean(at)
    at.switch_page("viz/pages/attention.py").run()
    assert_clean(at)
    assert _view(at) == ("enc", 1, 2, "qkvz")
    _told_to_browser(at)
    figure(at, "encoder.layers.1.self_attn · head 2: per-head projections")


def test_the_url_carries_the_whole_view(shipped):
    """#4: a link (the URL after some clicks) reopens the same view in a fresh session, tab included."""
    at = _choose_view(run_app("viz/pages/attention.py"), "cross", 1, 2, "masks")
    link = {k: at.query_params[k] for k in at.query_params}
    assert {"checkpoint", "text", "attn_kind", "layer", "head", "view"} <= set(link)
    fresh = run_app("viz/pages/attention.py", query=link)
    assert_clean(fresh)
    assert _view(fresh) == ("cross", 1, 2, "masks")
    assert fresh.sidebar.text_area(key="source_text").value == shipped.example


def test_a_long_text_goes_in_the_link_as_a_reference_to_this_servers_copy(shipped):
    """A text over MAX_URL_TEXT is not in the URL (a reload would send it in the request line): the link names a
    copy kept on the server (?text_ref=), and a fresh session on that link reads the same text back."""
    text = (shipped.example + " ") * (MAX_URL_TEXT // len(shipped.example) + 1)
    at = run_app("viz/pages/tokens.py", text=text)
    assert not at.exception  # (the toy model says the text is over its 255 tokens: nothing is cut)
    link = {k: at.query_params[k] for k in at.query_params}
    assert "text" not in link and link["text_ref"] in ([text_store.ref_of(text)], text_store.ref_of(text))
    assert any("reference to a copy kept on this server" in c.value for c in at.sidebar.caption)
    fresh = run_app("viz/pages/tokens.py", query=link)
    assert not fresh.exception
    assert fresh.sidebar.text_area(key="source_text").value == text
    # back to a short text: the reference leaves the link, the text comes back into it
    fresh.sidebar.text_area(key="source_text").set_value(shipped.example).run()
    assert "text_ref" not in fresh.query_params and not any("reference" in c.value for c in fresh.sidebar.caption)
    short = run_app("viz/pages/tokens.py")
    assert not any("reference" in c.value for c in short.sidebar.caption)


@pytest.mark.parametrize("ref", ["0123456789abcdef", "../../etc/passwd", "x" * 5000])
def test_a_link_to_a_long_text_this_server_does_not_keep_says_so(shipped, ref):
    """Another server's link, a trimmed text, or a forged reference: one sentence, the model's example, no file read
    outside the store."""
    at = run_app(query={"checkpoint": shipped.name, "text_ref": ref})  # the default page: said on the first run
    assert_clean(at)
    assert at.sidebar.text_area(key="source_text").value == shipped.example
    (said,) = [w.value for w in at.warning if "does not keep" in w.value]
    assert "`text_ref=" in said and shipped.example[:20] in said and len(said) < 400


def test_unk_warning_shows_the_original_characters():
    """#7: 量子力学很难 on zh-en names the characters the vocabulary lacks, not '[UNK]@0'."""
    ckpt = load_checkpoint("zh-en")
    text = "量子力学很难"
    unknown = [p for p in ckpt.src_tokenizer.pieces(text) if p.is_unk]
    assert unknown, "the example needs characters outside the zh-en vocabulary"
    at = run_app("viz/pages/attention.py", checkpoint="zh-en", text=text)
    assert not at.exception
    (warning,) = [w.value for w in at.warning if "[UNK]" in w.value]
    assert "[UNK]@" not in warning
    assert all(f"'{text[p.span[0]:p.span[1]]}'" in warning for p in unknown)


def test_unk_warning_shortens_a_huge_token():
    """#8: a 5,000-character unknown word is quoted by its start and its length, not in full."""
    piece = type("P", (), {"is_unk": True, "span": (0, 5000), "token": "[UNK]"})()
    note = unk_note([piece], "x" * 5000)
    assert "(5000 characters)" in note and "x" * (MAX_SHOWN + 1) not in note


def test_attention_page_shows_the_model_output(shipped):
    """#10: the translation, one line under the controls."""
    at = run_app("viz/pages/attention.py")
    out = shipped.translate(shipped.example).text
    assert any(m.value == f"**Model output (greedy):** {out}" for m in at.markdown)


def test_chinese_ui_opens_on_the_chinese_model():
    at = run_app(query={"lang": "zh"})
    assert_clean(at)
    assert at.sidebar.selectbox(key="checkpoint").value == "zh-en"
    assert at.sidebar.text_area(key="source_text").value == "我爱机器学习"
    linked = run_app(query={"lang": "zh", "checkpoint": "dates"})  # a link keeps its model in any language
    assert linked.sidebar.selectbox(key="checkpoint").value == "dates"


def test_a_model_trained_in_the_session_is_offered_and_traced(shipped, tmp_path):
    """#9: a checkpoint in st.session_state["session_models"] is in the selector on every page, and
    its trace is its own (not a shipped model's, not another session's)."""
    mine = Checkpoint.load(_random_clone(shipped.ckpt, tmp_path / "mine", shipped.cfg.max_len))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state["session_models"] = {"my run": mine}
    at.run()
    box = at.sidebar.selectbox(key="checkpoint")
    assert box.options[-1] == "my run"
    at.session_state["checkpoint"] = "my run"  # as choosing it does (AppTest can't pick a formatted option)
    at.run()
    at.switch_page("viz/pages/attention.py").run()
    assert_clean(at)
    want = mine.trace(shipped.example)[1]["decoder.layers.0.cross_attn.weights"][0, 0].numpy()
    np.testing.assert_array_equal(z_of(shown(figure(at, "decoder.layers.0.cross_attn · head 0"))), want)
    at.switch_page("viz/pages/tokens.py").run()
    assert_clean(at)
    assert at.sidebar.selectbox(key="checkpoint").value == "my run"
    other = run_app()  # another session: no such model
    assert "my run" not in other.sidebar.selectbox(key="checkpoint").options


def test_score_pipeline_has_one_colour_scale_for_the_score_panels(shipped):
    """#8: the QKᵀ panels have a colour bar (one, shared), the weights their own."""
    at = show_view(run_app("viz/pages/attention.py"), "pipeline")
    pipe = figure(at, "decoder.layers.0.cross_attn · head 0: softmax")
    shown = [tr for tr in pipe["data"] if tr["type"] == "heatmap" and tr.get("showscale", True)]
    assert len(shown) == 2
    scores = [tr for tr in shown if tr["colorscale"] != pipe["data"][-1]["colorscale"]]
    assert scores and scores[0]["colorbar"]["orientation"] == "h"


def test_exported_figure_names_model_and_sentence_and_fits_the_heatmap(shipped):
    """#8: the head heatmap's figure is sized to the heatmap (no wide margins) and its title says
    which model and sentence it shows."""
    at = run_app("viz/pages/attention.py")
    head = figure(at, "decoder.layers.0.cross_attn · head 0")
    assert f"model {shipped.name}" in head["layout"]["title"]["text"] and shipped.example in \
        head["layout"]["title"]["text"]
    w, h = head["layout"]["width"], head["layout"]["height"]
    assert w < 2 * h  # not a 2080×760 strip


@pytest.mark.parametrize("page", ["viz/pages/attention.py", "viz/pages/tokens.py", "viz/pages/schedule.py"])
def test_chinese_pages_are_in_chinese(page):
    """Every caption, title and figure title of these pages is translated (URL values stay the same)."""
    import re

    cjk = re.compile(r"[\u4e00-\u9fff]")
    at = run_app(page, query={"lang": "zh"})
    assert_clean(at)
    texts = [e.value for e in (*at.title, *at.caption, *at.markdown, *at.subheader)]
    english = [x for x in texts if not cjk.search(x)]
    assert not english, english
    titles = [f["layout"]["title"]["text"].split("<br>")[0] for f in figures(at)]
    assert all(cjk.search(x) and not re.search(r"\b(head|heads|weights|layer|model)\b", x) for x in titles), titles
    if page.endswith("attention.py"):
        assert at.query_params["attn_kind"] == "cross" and at.query_params["view"] == "heads"  # stable ids


@pytest.mark.parametrize("page", ["viz/pages/attention.py", "viz/pages/tokens.py"])
def test_an_output_that_loops_says_so_on_every_page(page):
    """The zh-en model answers 我爱学习 with 'i love study study study': the trace stops at the loop,
    and the page says why the output has no [EOS] (the same words as the decoder page)."""
    at = run_app(page, checkpoint="zh-en", text="我爱学习")
    assert not at.exception
    notes = [w.value for w in at.warning if "did not stop" in w.value]
    assert len(notes) == 1 and "“study” repeated 3 times" in notes[0], [w.value for w in at.warning]
    ok = run_app(page, checkpoint="zh-en", text="我爱机器学习")
    assert not [w.value for w in ok.warning if "did not stop" in w.value]
