"""Inside a layer, the padded batch, the architecture map and the tokenizer strips: every drawn number
equals the captured tensor (or its closed form), checked against independent torch computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from conftest import small_config
from tolerance import f32_tol

from model import Transformer
from model.toy.padding import token_losses
from model.toy.tokenizer import Tokenizer
from viz.figures import arch as FA
from viz.figures import layer as FL
from viz.figures import padding as FP
from viz.figures import tokenizers as FT


def tokens(ids: list[int], prefix: str) -> list[str]:
    return [f"{prefix}{i}" if i else "[PAD]" for i in ids]


def traced(pre_ln: bool, batch):
    torch.manual_seed(0)
    model = Transformer(small_config(norm_first=pre_ln)).eval()
    src, tgt = batch
    with torch.no_grad():
        logits, trace = model.run_with_trace(src, tgt, meta={"src_tokens": [tokens(r, "s") for r in src.tolist()],
                                                             "tgt_tokens": [tokens(r, "t") for r in tgt.tolist()]})
    return model, logits, trace


@pytest.fixture(scope="module", params=[False, True], ids=["post-LN", "pre-LN"])
def run(request):
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(1, 23, (2, 9), generator=g), torch.randint(1, 19, (2, 6), generator=g)
    src[1, 6:], tgt[1, 4:] = 0, 0  # the second row is padded on both sides
    return traced(request.param, (src, tgt))


def cap(trace, name, b=0) -> np.ndarray:
    return trace[name][b].numpy()


LAYERS = [(layer, sub) for layer in ("encoder.layers.0", "encoder.layers.1")
          for sub in ("self_attn", "ffn")] + [("decoder.layers.1", s) for s in ("self_attn", "cross_attn", "ffn")]


# ---------------------------------------------------------------- residual stream


@pytest.mark.parametrize(("layer", "sub"), LAYERS)
def test_residual_steps_recompose_exactly(run, layer, sub):
    model, _, trace = run
    steps = FL.residual_steps(trace, layer, sub)
    assert [s.name for s in steps] == [n for _, n in FL.residual_names(layer, sub, FL.is_pre_ln(trace))]
    for s in steps:
        np.testing.assert_array_equal(s.value, cap(trace, s.name))
    x, a, b, c = (s.value for s in steps)
    norm = model.get_submodule(steps[1 if FL.is_pre_ln(trace) else 3].name.removesuffix(".out"))
    if FL.is_pre_ln(trace):  # x, LN(x), sublayer(LN(x)), x + sublayer
        np.testing.assert_array_equal(x + b, c)
        torch.testing.assert_close(torch.from_numpy(a), norm(torch.from_numpy(x)))
    else:  # x, sublayer(x), x + sublayer(x), LN(sum)
        np.testing.assert_array_equal(x + a, b)
        torch.testing.assert_close(torch.from_numpy(c), norm(torch.from_numpy(b)))


def test_residual_figure_draws_the_captured_vectors(run):
    _, _, trace = run
    steps = FL.residual_steps(trace, "decoder.layers.0", "cross_attn")
    fig = FL.residual_figure(steps, FL.side_tokens(trace, "decoder.layers.0"), token=3)
    lines = [d for d in fig.data if d.type == "scatter"]
    assert len(lines) == 4
    for line, s in zip(lines, steps, strict=True):
        want = torch.linalg.vector_norm(torch.from_numpy(s.value), dim=-1)  # a float32 sum of D squares
        np.testing.assert_allclose(line.y, want, rtol=0, atol=f32_tol(want, n=s.value.shape[-1]))
    strip = next(d for d in fig.data if d.type == "heatmap")
    np.testing.assert_array_equal(np.asarray(strip.z), np.stack([s.value[3] for s in steps]))


def test_layernorm_figure_shows_torch_mean_and_variance(run):
    _, _, trace = run
    x_in, x_out = cap(trace, "encoder.layers.1.norm2.in"), cap(trace, "encoder.layers.1.norm2.out")
    fig = FL.layernorm_figure(x_in, x_out, None, "encoder.layers.1.norm2")
    bars = [d for d in fig.data if d.type == "bar"]
    expected = [t.mean(-1) if i % 2 == 0 else t.var(-1, unbiased=False)
                for t in (torch.from_numpy(x_in), torch.from_numpy(x_out)) for i in range(2)]
    for bar, want in zip(bars, expected, strict=True):
        np.testing.assert_allclose(bar.y, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bars[3].y, 1.0, atol=0.01)  # γ = 1, β = 0 at init: the output has variance ≈ 1


@pytest.mark.parametrize("sub", ["self_attn", "cross_attn", "ffn"])
def test_wiring_figure_carries_the_live_numbers(run, sub):
    _, _, trace = run
    pre = FL.is_pre_ln(trace)
    steps = FL.residual_steps(trace, "decoder.layers.1", sub)
    fig = FL.wiring_figure(steps, pre, token=2, sublayer=sub)
    nodes = next(d for d in fig.data if d.type == "scatter")
    for got, s in zip(nodes.customdata, steps, strict=True):
        v = torch.from_numpy(s.value[2]).double()
        np.testing.assert_allclose(got, [float(v.norm()), float(v.mean()), float(v.var(unbiased=False))], rtol=1e-9)
    ln_in = steps[0 if pre else 2].value[2].astype(np.float64)
    text = " ".join(a.text for a in fig.layout.annotations)
    assert f"μ = {ln_in.mean():.4g}" in text and f"σ² = {ln_in.var():.4g}" in text
    assert ("pre-LN" if pre else "post-LN") in fig.layout.title.text


# ---------------------------------------------------------------- FFN and W^O


def test_ffn_figure_is_the_hidden_layer_and_its_zero_share(run):
    model, _, trace = run
    hidden = cap(trace, "encoder.layers.0.ffn.hidden")
    ffn_in = cap(trace, "encoder.layers.0.norm1.out" if not FL.is_pre_ln(trace) else "encoder.layers.0.norm2.out")
    ffn = model.encoder.layers[0].ffn  # independent: the same position-wise weights on every token
    torch.testing.assert_close(torch.from_numpy(hidden), torch.relu(ffn.linear1(torch.from_numpy(ffn_in))))
    fig = FL.ffn_figure(hidden, None, "encoder.layers.0.ffn")
    np.testing.assert_array_equal(np.asarray(fig.data[0].z), hidden.T)
    np.testing.assert_allclose(fig.data[1].y, (hidden == 0).mean(-1), rtol=1e-6)
    assert 0 < fig.data[1].y.mean() < 1


@pytest.mark.parametrize("name", ["encoder.layers.0.self_attn", "decoder.layers.1.cross_attn"])
def test_wo_figure_concatenates_what_w_o_projects(run, name):
    model, _, trace = run
    z, out = trace[f"{name}.z"][0], trace[f"{name}.out"][0]
    fig = FL.wo_figure(z, out, None, name)
    cat = np.asarray(fig.data[0].z)
    np.testing.assert_array_equal(cat, FL.concat_heads(z.numpy()))
    w_o = model.get_submodule(name).w_o  # Concat(heads) · W^O + b is the captured output
    torch.testing.assert_close(w_o(torch.from_numpy(cat)), out)
    np.testing.assert_array_equal(np.asarray(fig.data[1].z), out.numpy())


# ---------------------------------------------------------------- one query


@pytest.mark.parametrize(("name", "b", "query"), [("decoder.layers.0.self_attn", 1, 2),
                                                   ("encoder.layers.1.self_attn", 1, 7),
                                                   ("decoder.layers.1.cross_attn", 1, 0)])
def test_query_figure_follows_the_soft_lookup(run, name, b, query):
    _, _, trace = run
    head = 1
    q, k, v = (trace[f"{name}.{r}"][b, head].double() for r in ("q", "k", "v"))
    qs = FL.query_steps(trace, name, head, query, b=b)
    fig = FL.query_figure(qs, "q", None)
    bars = [d for d in fig.data if d.type == "bar"]
    qk = k @ q[query]
    np.testing.assert_allclose(bars[0].y, qk, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bars[1].y, qk / math.sqrt(q.shape[-1]), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(bars[1].y, trace[f"{name}.scores"][b, head, query].numpy())
    blocked = trace[f"{name}.mask"][b, 0, query].numpy()
    assert blocked.any(), "the test should see a blocked key"
    assert np.isnan(bars[2].y[blocked]).all() and all(bars[2].text[i] == "−∞" for i in np.flatnonzero(blocked))
    np.testing.assert_array_equal(bars[3].y, trace[f"{name}.weights"][b, head, query].numpy())
    contributions = np.stack([d.y for d in bars[4:]])  # one bar trace per visible key: p_i v_i
    z = trace[f"{name}.z"][b, head, query].numpy()
    np.testing.assert_allclose(contributions.sum(0), z, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(fig.data[-1].y, z)


# ---------------------------------------------------------------- post-LN vs pre-LN


def test_prenorm_figure_draws_every_run():
    runs = [{"label": f"{w}, warmup {u}", "wiring": w, "warmup": u, "step": [1, 2, 3], "loss": [3.0, 2.0 + u, 1.0],
             "diverged": u == 1 and w == "post-LN"} for u in (1, 50) for w in ("post-LN", "pre-LN")]
    fig = FL.prenorm_figure({"warmups": [1, 50], "runs": runs})
    lines = [d for d in fig.data if d.mode == "lines"]
    assert [list(d.y) for d in lines] == [r["loss"] for r in runs]
    assert [d.xaxis for d in lines] == ["x", "x", "x2", "x2"]
    assert sum(d.mode == "markers" for d in fig.data) == 1  # the one diverged run


# ---------------------------------------------------------------- padded batch


def test_padding_figures_show_the_captured_masks(run):
    _, logits, trace = run
    fig = FP.padding_masks_figure(trace)
    np.testing.assert_array_equal(np.asarray(fig.data[0].z), trace["masks.src_pad"].numpy())
    np.testing.assert_array_equal(np.asarray(fig.data[1].z), trace["masks.tgt_pad"].numpy())
    assert fig.data[0].text[1][-1] == "[PAD]"
    combined = FP.combined_mask_figure(trace, 1)
    causal = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)
    pad = (trace["masks.tgt_pad"][1])[None, :].expand(6, 6)
    for d, want in zip(combined.data, (causal, pad, causal | pad), strict=True):
        np.testing.assert_array_equal(np.asarray(d.z), want.float().numpy())
    np.testing.assert_array_equal(np.asarray(combined.data[2].z),
                                  trace["decoder.layers.0.self_attn.mask"][1, 0].float().numpy())


def test_loss_ignores_pad_and_seed_001_average_is_wrong(run):
    _, logits, _ = run
    label = torch.tensor([[3, 4, 5, 6, 7, 8], [3, 4, 5, 0, 0, 0]])
    losses = token_losses(logits, label, pad_id=0)
    assert (losses.per_token[1, 3:] == 0).all() and (losses.per_token[losses.real] > 0).all()
    right = TF.cross_entropy(logits.reshape(-1, logits.shape[-1]), label.reshape(-1), ignore_index=0)
    assert losses.right_mean == pytest.approx(float(right), rel=1e-6)
    assert losses.wrong_mean == pytest.approx(float(losses.per_token.sum() / 12), rel=1e-6)  # 9 real of 12
    assert losses.wrong_mean < losses.right_mean
    fig = FP.loss_figure(losses.per_token.numpy(), losses.real.numpy(), [["a"] * 6] * 2)
    shown = np.asarray(fig.data[0].z, dtype=np.float64)
    np.testing.assert_allclose(shown[losses.real.numpy()], losses.per_token[losses.real].numpy(), rtol=1e-6)
    assert np.isnan(shown[~losses.real.numpy()]).all()
    grey = np.asarray(fig.data[1].z, dtype=np.float64)
    assert (grey[~losses.real.numpy()] == 0).all()


# ---------------------------------------------------------------- architecture map


def test_architecture_shapes_come_from_the_config_and_match_the_trace(run):
    _, _, trace = run
    cfg = trace.meta["config"]
    B, S = trace["masks.src_pad"].shape
    T = trace["masks.tgt_pad"].shape[1]
    fig = FA.architecture_figure(cfg, B, S, T)
    text = " ".join(a.text for a in fig.layout.annotations) + " ".join(fig.data[0].text)
    q, hidden = trace["encoder.layers.0.self_attn.q"].shape, trace["decoder.layers.0.ffn.hidden"].shape
    assert f"(B, H, S, d_k) = {tuple(q)}" in text
    assert f"hidden (B, T, d_ff) = {tuple(hidden)}" in text
    assert f"(B, T, V) = {tuple(trace['logits'].shape)}" in text
    assert f"(B, S, D) = {tuple(trace['encoder.out'].shape)}" in text
    assert [c[0] for c in fig.data[0].customdata] == [b.id for b in FA.BLOCKS]


def test_block_params_open_the_right_view():
    assert FA.block_params("cross", 1, 3) == {"attn_kind": "cross", "layer": "1", "head": "3"}
    # Inside a layer's W^O and one-query views show the chosen head too (the map passes it since issue 17).
    assert FA.block_params("dec_norm2", 1, 0) == {"stack": "decoder", "layer": "1", "sub": "cross_attn", "head": "0"}
    assert FA.block_params("masks", 0, 0) == {}


# ---------------------------------------------------------------- tokenizers


def test_the_three_cuts():
    assert FT.word_cut("I like eating ice cream.") == ["I", "like", "eating", "ice", "cream", "."]
    assert FT.char_cut("我爱 机器") == ["我", "爱", "机", "器"]
    assert FT.word_cut("我爱机器学习") == ["我爱机器学习"]  # no spaces: word splitting cannot cut Chinese


def test_wordpiece_cuts_eating_into_eat_ing_and_the_strips_draw_the_tokens():
    corpus = ["we eat rice", "they eat noodles", "he is drinking milk", "she is reading", "i am singing",
              "you drink tea", "they are eating"] * 3
    tok = Tokenizer.train_wordpiece(corpus, 60)
    pieces = [p.token for p in tok.pieces("eating")]
    assert pieces == ["eat", "##ing"]
    cuts = {"word": FT.word_cut("eating"), "char": FT.char_cut("eating"), "wordpiece": pieces}
    fig = FT.strips_figure(cuts, {"wordpiece": tok.vocab_size})
    assert [list(d.text) for d in fig.data] == [["eating"], list("eating"), ["eat", "##ing"]]
    assert f"{tok.vocab_size}" in fig.data[2].name
