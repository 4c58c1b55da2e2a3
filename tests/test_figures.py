"""Figure builders draw exactly the captured tensors (or closed-form functions of them)."""

import math

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from conftest import small_config

from model import Transformer, noam_lr, sinusoidal_encoding
from viz.figures import attention as F

SRC = ["a", "b", "a", "c", "d", "[PAD]", "[PAD]"]
TGT = ["[BOS]", "x", "y", "x", "z"]
NEXT = ["x", "y", "x", "z", "[EOS]"]  # what each decoder position predicts


@pytest.fixture(scope="module")
def trace():
    torch.manual_seed(0)
    model = Transformer(small_config()).eval()
    src = torch.tensor([[3, 4, 3, 5, 6, 0, 0]])  # two [PAD] keys at the end
    tgt = torch.tensor([[5, 7, 8, 7, 9]])
    return model.run_with_trace(src, tgt, meta={"src_tokens": SRC, "tgt_tokens": TGT,
                                                             "next_tokens": NEXT})[1]


def heatmaps(fig: go.Figure) -> list[go.Heatmap]:
    return [t for t in fig.data if t.type == "heatmap"]


def np_(t) -> np.ndarray:
    return t.detach().float().numpy() if hasattr(t, "detach") else np.asarray(t)


@pytest.mark.parametrize("name", ["encoder.layers.1.self_attn", "decoder.layers.0.self_attn",
                                  "decoder.layers.1.cross_attn"])
def test_head_heatmap_is_the_captured_weights(trace, name):
    fig = F.attention_heatmap(trace, name, head=2)
    (h,) = heatmaps(fig)
    np.testing.assert_array_equal(h.z, np_(trace[f"{name}.weights"][0, 2]))
    assert (h.zmin, h.zmax) == (0.0, 1.0)
    assert h.colorscale == go.Heatmap(colorscale=F.WEIGHTS_SCALE).colorscale
    q_tok, k_tok = F.attention_tokens(trace.meta, name)
    rows = F.step_labels(TGT, NEXT) if name.startswith("decoder.") else F.token_labels(q_tok, h.z.shape[0])
    assert list(h.y) == rows
    assert list(h.x) == F.token_labels(k_tok, h.z.shape[1])
    assert "%{z:.4g}" in h.hovertemplate and "%{x}" in h.hovertemplate


def test_cross_attention_axes_are_target_by_source(trace):
    q, k = F.attention_tokens(trace.meta, "decoder.layers.0.cross_attn")
    assert (q, k) == (TGT, SRC)


def test_token_labels_are_unique_for_repeated_tokens():
    labels = F.token_labels(["a", " ", "a", "\n"], 5)
    assert len(set(labels)) == 5 and labels[1] == "1: ␣" and labels[3] == "3: ⏎" and labels[4] == "4"


def test_position_and_token_labels_do_not_run_together():
    assert F.token_labels([str(i % 10) for i in range(11)], 11)[10] == "10: 0"  # not "100"


def test_step_labels_show_input_and_predicted_token():
    assert F.step_labels(["[BOS]", "i", "love"], ["i", "love", "[EOS]"]) == [
        "0: [BOS] → i", "1: i → love", "2: love → [EOS]"]
    assert F.step_labels(["[BOS]", "a"], ["a"]) == ["0: [BOS] → a", "1: a"]  # nothing predicted yet


@pytest.mark.parametrize("build", [
    lambda tr, n: F.attention_heatmap(tr, n, 0), lambda tr, n: F.heads_grid(tr, n),
    lambda tr, n: F.score_pipeline(tr, n, 0), lambda tr, n: F.mask_figure(tr, n, 0),
    lambda tr, n: F.qkvz_figure(tr, n, 0)])
def test_every_decoder_query_axis_uses_step_labels(trace, build):
    fig = build(trace, "decoder.layers.1.cross_attn")
    assert all(list(h.y) == F.step_labels(TGT, NEXT) for h in heatmaps(fig)
               if len(h.y) == len(TGT) and h.y[0].startswith("0: [BOS]")), "a decoder row is labelled by input only"
    assert any(list(h.y) == F.step_labels(TGT, NEXT) for h in heatmaps(fig))


def test_heads_grid_has_every_head(trace):
    name = "encoder.layers.0.self_attn"
    hs = heatmaps(F.heads_grid(trace, name))
    w = np_(trace[f"{name}.weights"][0])
    assert len(hs) == w.shape[0]
    for h, trace_h in enumerate(hs):
        np.testing.assert_array_equal(trace_h.z, w[h])


def test_model_view_thumbnails_and_click_targets(trace):
    names = [f"decoder.layers.{i}.cross_attn" for i in range(2)]
    fig = F.model_view(trace, names)
    hs = heatmaps(fig)
    assert len(hs) == 2 * 4
    for i, n in enumerate(names):
        for h in range(4):
            np.testing.assert_array_equal(hs[i * 4 + h].z, np_(trace[f"{n}.weights"][0, h]))
    marks = [list(t.customdata[0]) for t in fig.data if t.type == "scatter"]
    assert marks == [[i, h] for i in range(2) for h in range(4)]


def test_block_max_downsamples_long_maps():
    z = np.random.default_rng(0).random((130, 70), dtype=np.float32)
    pooled, b = F.block_max(z, 64)
    assert b == 3 and pooled.shape == (44, 24)
    assert pooled[0, 0] == z[:3, :3].max() and pooled[5, 7] == z[15:18, 21:24].max()
    assert pooled[-1, -1] == z[129:, 69:].max()  # a partial block pools what exists
    assert F.block_max(z[:64, :64], 64)[1] == 1


def test_score_pipeline_panels(trace):
    name = "decoder.layers.1.self_attn"
    hs = heatmaps(F.score_pipeline(trace, name, head=1))
    d_k = trace[f"{name}.q"].shape[-1]
    scores = np_(trace[f"{name}.scores"][0, 1])
    blocked = np_(trace[f"{name}.mask"][0, 0]).astype(bool)
    np.testing.assert_allclose(hs[0].z, scores * math.sqrt(d_k), rtol=1e-6)  # QKᵀ
    np.testing.assert_array_equal(hs[1].z, scores)  # ÷ √d_k
    np.testing.assert_array_equal(np.isnan(hs[2].z), blocked)  # + M: −∞ drawn as blocked
    np.testing.assert_array_equal(hs[2].z[~blocked], scores[~blocked])
    np.testing.assert_array_equal(~np.isnan(hs[3].z), blocked)  # the dark overlay marks exactly M
    np.testing.assert_array_equal(hs[4].z, np_(trace[f"{name}.weights"][0, 1]))
    assert hs[0].zmin == hs[1].zmin == -hs[0].zmax and hs[0].zmid == 0  # one diverging range


def test_q_k_v_z_of_one_head(trace):
    name = "decoder.layers.0.cross_attn"
    hs = heatmaps(F.qkvz_figure(trace, name, head=3))
    for h, role in zip(hs, "qzkv", strict=True):  # a 2 × 2 grid: query side (Q, z) over key side (K, V)
        np.testing.assert_array_equal(h.z, np_(trace[f"{name}.{role}"][0, 3]))


def test_masks_decoder_self_attention(trace):
    name = "decoder.layers.0.self_attn"
    m = F.mask_components(trace, name)
    pad, causal, combined = m.values()
    np.testing.assert_array_equal(causal, np_(trace["masks.causal"]))
    np.testing.assert_array_equal(combined, np_(trace[f"{name}.mask"][0, 0]))
    np.testing.assert_array_equal(np.maximum(pad, causal), combined)  # combined = look-ahead OR padding
    fig = F.mask_figure(trace, name, head=0)
    hs = heatmaps(fig)
    assert len(hs) == 4 and all(h.zmin == 0 and h.zmax == 1 for h in hs)
    np.testing.assert_array_equal(hs[-1].z, np_(trace[f"{name}.weights"][0, 0]))


def test_masks_padding_blocks_keys_only(trace):
    m = F.mask_components(trace, "encoder.layers.0.self_attn")
    pad = next(v for k, v in m.items() if k.startswith("padding"))
    assert pad[:, 5:].all() and not pad[:, :5].any()  # [PAD] columns, every row (queries too)
    cross = F.mask_components(trace, "decoder.layers.0.cross_attn")
    np.testing.assert_array_equal(next(iter(cross.values())), np.broadcast_to(pad[:1], (5, 7)))


def test_scaling_lesson_matches_the_captured_softmax(trace):
    name = "encoder.layers.0.self_attn"
    s = F.scaling_stats(trace, name)
    w = np_(trace[f"{name}.weights"][0]).astype(np.float64)
    np.testing.assert_allclose(s["entropy_scaled"], F.row_entropy(w).ravel(), atol=1e-5)
    assert s["entropy_raw"].mean() < s["entropy_scaled"].mean()  # unscaled softmax is more peaked
    np.testing.assert_allclose(s["var_qk"] / s["d_k"], np.var(s["scaled"]), rtol=1e-6)
    fig = F.scaling_figure(trace, name)
    counts = [t.y.sum() for t in fig.data]
    n_allowed = int((~np_(trace[f"{name}.mask"][0, 0]).astype(bool)).sum()) * w.shape[0]
    assert counts[:2] == [n_allowed, n_allowed] and counts[2:] == [w.shape[0] * w.shape[1]] * 2


def test_variance_demo_shows_var_d_k():
    fig = F.variance_demo(64, n=20000)
    assert "≈ d_k = 64" in fig.data[0].name
    var = float(fig.data[0].name.split("Var = ")[1].split(" ")[0])
    assert 55 < var < 73


def test_embeddings_and_position(trace):
    tok, pos, out = trace["encoder.embed.tok"][0], trace["encoder.embed.pos"], trace["encoder.embed.out"][0]
    (h,) = heatmaps(F.vectors_heatmap(tok, SRC, "t"))
    np.testing.assert_array_equal(h.z, np_(tok))
    hs = heatmaps(F.embedding_sum_figure(tok, pos, out, SRC))
    for h, t in zip(hs, (tok, pos, out), strict=True):
        np.testing.assert_array_equal(h.z, np_(t))
    np.testing.assert_allclose(hs[0].z + hs[1].z, hs[2].z, atol=1e-6)  # eval: no dropout, x = emb + PE


def test_positional_encoding_figures():
    pe = sinusoidal_encoding(50, 16)
    sim = heatmaps(F.pe_similarity(pe))[0].z
    np.testing.assert_allclose(sim, (pe @ pe.T).numpy(), rtol=1e-5, atol=1e-5)
    # Relative-position structure: each diagonal is constant (depends only on the offset).
    np.testing.assert_allclose(np.diagonal(sim, 3), np.diagonal(sim, 3)[0], atol=1e-4)
    curves = F.pe_curves(pe, [0, 1, 15, 99])
    assert [c.name.split(" (")[0] for c in curves.data] == ["dim 0", "dim 1", "dim 15"]
    np.testing.assert_array_equal(curves.data[1].y, pe[:, 1].numpy())


def test_noam_figure():
    steps = np.array([1, 10, 4000, 4001, 20000])
    np.testing.assert_allclose(F.noam_curve(steps, 512, 4000, 2.0),
                               [noam_lr(int(s), 512, 4000, 2.0) for s in steps], rtol=1e-12)
    log = {"step": [1, 2, 3], "lr": [0.1, 0.2, 0.3], "loss": [1, 1, 1], "acc": [0, 0, 0]}
    fig = F.noam_figure(256, 1000, 1.0, log=log)
    names = [t.name for t in fig.data]
    assert names[:3] == ["d=512, warmup=4000", "d=512, warmup=8000", "d=256, warmup=4000"]
    peak = next(t for t in fig.data if t.name == "peak")
    assert peak.x[0] == 1000 and peak.y[0] == pytest.approx(noam_lr(1000, 256, 1000))
    chosen = next(t for t in fig.data if t.name.startswith("chosen"))
    assert float(chosen.y.max()) == pytest.approx(noam_lr(1000, 256, 1000), rel=1e-6)
    np.testing.assert_array_equal(fig.data[-1].y, np.float32(log["lr"]))


def test_diff_figure(trace):
    a = trace["decoder.layers.0.cross_attn.weights"]
    b = a.clone()
    b[0, 2, 1, 3] += 0.5
    hs = heatmaps(F.diff_figure(a, b, "x", head=2))
    np.testing.assert_array_equal(hs[0].z, np_(a[0, 2]))
    d = hs[2].z
    assert d[1, 3] == pytest.approx(0.5) and np.count_nonzero(d) == 1


def test_heatmaps_are_sent_as_compact_float32(trace):
    fig = F.heads_grid(trace, "encoder.layers.0.self_attn")
    spec = fig.to_plotly_json()  # base64 typed arrays, not per-cell JSON numbers
    assert all(t["z"]["dtype"] == "f4" and "bdata" in t["z"] for t in spec["data"])


# ---------------------------------------------------------------- long inputs: pooled grid, query windows


LONG = 301  # > F.MAX_GRID: the grid pools in 3×3 blocks (the last block is partial)


@pytest.fixture(scope="module")
def long_trace():
    torch.manual_seed(0)
    model = Transformer(small_config(n_decoder_layers=0, max_len=LONG + 7)).eval()
    src = torch.randint(1, 23, (1, LONG), generator=torch.Generator().manual_seed(2))
    src[0, -3:] = 0  # [PAD] keys at the end: a mask to window
    toks = [f"t{int(i)}" for i in src[0]]
    return model.run_with_trace(src, meta={"src_tokens": toks})[1]


def max_pool(w: np.ndarray, b: int) -> np.ndarray:
    """Max over b×b blocks (the last block may be partial), independent of F.block_max."""
    starts = np.arange(0, w.shape[0], b), np.arange(0, w.shape[1], b)
    return np.maximum.reduceat(np.maximum.reduceat(w, starts[0], axis=0), starts[1], axis=1)


def test_heads_grid_of_a_long_input_is_the_max_pool_of_the_weights(long_trace):
    name = "encoder.layers.1.self_attn"
    w = np_(long_trace[f"{name}.weights"][0])
    fig = F.heads_grid(long_trace, name)
    b = math.ceil(LONG / F.MAX_GRID)
    assert b == 3 and "downsampled 3×: each cell is the max of 3×3" in fig.layout.title.text
    hs = heatmaps(fig)
    assert len(hs) == w.shape[0]
    for h, trace_h in enumerate(hs):
        assert trace_h.z.shape == (101, 101)
        np.testing.assert_array_equal(trace_h.z, max_pool(w[h], b))
    toks = long_trace.meta["src_tokens"]
    assert hs[0].x[0] == f"0–2 {toks[0]}…{toks[2]}" and hs[0].y[1] == f"3–5 {toks[3]}…{toks[5]}"
    assert hs[0].x[-1] == f"300 {toks[300]}"  # the partial last block covers one position
    assert len(set(hs[0].x)) == 101  # unique categories
    assert "max of 3×3" in hs[0].hovertemplate and "%{z:.4g}" in hs[0].hovertemplate
    assert sum(len(t.z.tobytes()) for t in hs) < 2**20  # 4 heads × 101² float32


def test_a_sharp_weight_survives_pooling():
    z = np.zeros((200, 200), np.float32)
    z[77, 150] = 0.9
    pooled, b = F.block_max(z, F.MAX_GRID)
    assert b == 2 and pooled[38, 75] == np.float32(0.9) and np.count_nonzero(pooled) == 1


def test_model_view_pooled_cells_name_the_positions_they_cover(long_trace):
    names = [f"encoder.layers.{i}.self_attn" for i in range(2)]
    fig = F.model_view(long_trace, names)
    b = math.ceil(LONG / F.MAX_THUMB)
    hs = heatmaps(fig)
    np.testing.assert_array_equal(hs[5].z, max_pool(np_(long_trace[f"{names[1]}.weights"][0, 1]), b))
    assert hs[0].x[:2] == (f"0–{b - 1}", f"{b}–{2 * b - 1}") and hs[0].y[-1] == "300"
    assert f"max of {b}×{b}" in hs[0].hovertemplate
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "category"
    marks = [t for t in fig.data if t.type == "scatter"]
    assert all(m.x[0] in hs[0].x and m.y[0] in hs[0].y for m in marks)  # click targets sit on a cell


def test_query_windows_cover_every_row():
    assert F.query_windows(301, 64) == [(0, 64), (64, 128), (128, 192), (192, 256), (256, 301)]
    assert F.query_windows(5, 64) == [(0, 5)]


def test_score_pipeline_and_masks_in_a_query_window(long_trace):
    name = "encoder.layers.0.self_attn"
    scores = np_(long_trace[f"{name}.scores"][0, 2])
    d_k = long_trace[f"{name}.q"].shape[-1]
    fig = F.score_pipeline(long_trace, name, head=2, rows=(64, 128))
    assert fig.layout.title.text.split("<br>")[0].endswith("· query rows 64–127 of 301")  # above the capture's name
    hs = heatmaps(fig)
    np.testing.assert_allclose(hs[0].z, scores[64:128] * math.sqrt(d_k), rtol=1e-6)
    np.testing.assert_array_equal(hs[1].z, scores[64:128])  # every key, exact values
    np.testing.assert_array_equal(hs[4].z, np_(long_trace[f"{name}.weights"][0, 2])[64:128])
    assert list(hs[1].y) == F.token_labels(long_trace.meta["src_tokens"], LONG)[64:128]
    assert len(hs[1].x) == LONG
    full = heatmaps(F.score_pipeline(long_trace, name, head=2))
    assert hs[0].zmax == full[0].zmax  # one colour range for every window
    masks = F.mask_figure(long_trace, name, head=2, rows=(256, 301))
    mh = heatmaps(masks)
    assert "query rows 256–300 of 301" in masks.layout.title.text
    assert mh[0].z.shape == (45, LONG) and mh[0].z[:, -3:].all() and not mh[0].z[:, :-3].any()
    np.testing.assert_array_equal(mh[-1].z, np_(long_trace[f"{name}.weights"][0, 2])[256:])
    with pytest.raises(ValueError):
        F.score_pipeline(long_trace, name, head=0, rows=(400, 464))


def test_single_head_heatmap_stays_at_full_resolution(long_trace):
    name = "encoder.layers.1.self_attn"
    (h,) = heatmaps(F.attention_heatmap(long_trace, name, head=3))
    np.testing.assert_array_equal(h.z, np_(long_trace[f"{name}.weights"][0, 3]))
    assert h.z.shape == (LONG, LONG)
