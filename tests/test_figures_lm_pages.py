"""Architecture map, Inside a layer and Tokens on decoder-only LMs (issue 19 §1): the numbers the figures draw
equal the trace's, on tiny seeded DecoderLMs of both kinds (Llama-like: RoPE, GQA, RMSNorm, SwiGLU; GPT-2-like:
learned positions, LayerNorm, plain GELU FFN), against independent torch computations."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from model.families.lm import DecoderLM, LMConfig
from viz.figures import arch as FA
from viz.figures import layer as FL

LLAMA = dict(positional="rotary", norm="rmsnorm", ffn="gated", activation="silu", n_kv_heads=2, qkv_bias=False,
             out_bias=False, ffn_bias=False)
GPT2 = dict(positional="learned", norm="layernorm", ffn="plain", activation="gelu_tanh")


def values(v) -> np.ndarray:
    if isinstance(v, dict):
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return a.reshape([int(s) for s in str(v["shape"]).split(",")]) if "shape" in v else a
    return np.asarray(v)


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def lm(request):
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=61, d_model=32, n_layers=3, n_heads=4, d_ff=48, max_len=64,
                   **(LLAMA if request.param == "llama" else GPT2))
    model = DecoderLM(cfg).eval()
    ids = torch.randint(0, 61, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, trace = model.run_with_trace(ids, meta={"tgt_tokens": [f"t{i}" for i in ids[0].tolist()]})
    return request.param, model, trace


def test_sublayers_come_from_the_description(lm):
    _, _, trace = lm
    assert FL.sublayers(trace, "decoder.layers.1") == [("self_attn", "norm1"), ("ffn", "norm2")]
    assert FL.is_pre_ln(trace)  # the LM config has no norm_first; its description says pre-LN


@pytest.mark.parametrize("sub", ["self_attn", "ffn"])
def test_residual_steps_are_the_lm_pre_ln_stream(lm, sub):
    kind, model, trace = lm
    steps = FL.residual_steps(trace, "decoder.layers.1", sub)
    ln = "RMSNorm" if kind == "llama" else "LayerNorm"
    assert [s.label for s in steps] == ["x", f"{ln}(x)", f"sublayer({ln}(x))", f"x + sublayer({ln}(x))"]
    layer = model.decoder.layers[1]
    norm = layer.norm1 if sub == "self_attn" else layer.norm2
    x = torch.from_numpy(steps[0].value)
    with torch.no_grad():
        np.testing.assert_allclose(norm(x[None])[0].numpy(), steps[1].value, atol=1e-6)
    np.testing.assert_allclose(steps[0].value + steps[2].value, steps[3].value, atol=1e-5)
    want_in = trace["decoder.layers.0.out"][0] if sub == "self_attn" else trace["decoder.layers.1.norm2.in"][0]
    np.testing.assert_array_equal(steps[0].value, want_in.numpy())


def test_norm_figure_draws_what_the_norm_divides_by(lm):
    kind, _, trace = lm
    x_in, x_out = trace["decoder.layers.2.norm2.in"][0].numpy(), trace["decoder.layers.2.norm2.out"][0].numpy()
    fig = FL.layernorm_figure(x_in, x_out, [f"t{i}" for i in range(9)], "decoder.layers.2.norm2",
                              kind=FL.norm_kind(trace)).to_plotly_json()
    bars = fig["data"]  # input μ, input stat, output μ, output stat
    xd = torch.from_numpy(x_in).double()
    np.testing.assert_allclose(values(bars[0]["y"]), xd.mean(-1).numpy(), rtol=1e-5, atol=1e-6)
    second = (xd * xd).mean(-1) if kind == "llama" else xd.var(-1, unbiased=False)
    np.testing.assert_allclose(values(bars[1]["y"]), second.numpy(), rtol=1e-5)
    title = fig["layout"]["title"]["text"]
    assert ("no μ subtracted" in title) == (kind == "llama")
    if kind == "llama":  # RMSNorm leaves the mean in: the output's μ is not 0 (LayerNorm's would be)
        assert np.abs(values(bars[2]["y"])).max() > 1e-3


def test_query_steps_read_the_shared_kv_head(lm):
    kind, _, trace = lm
    name = "decoder.layers.1.self_attn"
    for head in range(4):
        qs = FL.query_steps(trace, name, head, 6)
        g = head // 2 if kind == "llama" else head
        assert int(qs["kv_head"]) == g
        q = trace[f"{name}.q"][0, head, 6].double()
        k = trace[f"{name}.k"][0, g].double()
        np.testing.assert_allclose(qs["qk"], (k @ q).numpy(), rtol=1e-6)
        np.testing.assert_allclose(qs["qk"] / np.sqrt(8), qs["scaled"], rtol=1e-4, atol=1e-5)
        v = trace[f"{name}.v"][0, g].double()
        np.testing.assert_allclose(qs["pv"].sum(0), (torch.from_numpy(qs["weights"]).double() @ v).numpy(),
                                   atol=1e-5)
        np.testing.assert_allclose(qs["z"], qs["pv"].sum(0), atol=1e-5)
        assert qs["blocked"].tolist() == [i > 6 for i in range(9)]  # causal: later keys blocked
        if kind == "llama":  # the unrotated dot product, and RoPE does change it
            qu, ku = trace[f"{name}.q_unrot"][0, head, 6].double(), trace[f"{name}.k_unrot"][0, g].double()
            np.testing.assert_allclose(qs["qk_unrot"], (ku @ qu).numpy(), rtol=1e-6)
            assert not np.allclose(qs["qk_unrot"][:6], qs["qk"][:6])
        else:
            assert "qk_unrot" not in qs


def test_gated_ffn_figure_draws_gate_and_hidden(lm):
    kind, model, trace = lm
    ffn, x = model.decoder.layers[0].ffn, trace["decoder.layers.0.norm2.out"][0]
    if kind != "llama":  # a plain FFN: no gate; its hidden units are GELU(W_1 x + b_1), drawn by ffn_figure
        assert "decoder.layers.0.ffn.gate" not in trace
        with torch.no_grad():
            want = torch.nn.functional.gelu(ffn.linear1(x), approximate="tanh")
        np.testing.assert_allclose(trace["decoder.layers.0.ffn.hidden"][0].numpy(), want.numpy(), atol=1e-5)
        fig = FL.ffn_figure(want.numpy(), [f"t{i}" for i in range(9)], "decoder.layers.0.ffn")
        np.testing.assert_array_equal(values(fig.data[0].z), want.numpy().T)
        return
    gate, hidden = trace["decoder.layers.0.ffn.gate"][0].numpy(), trace["decoder.layers.0.ffn.hidden"][0].numpy()
    fig = FL.gated_ffn_figure(gate, hidden, [f"t{i}" for i in range(9)], "decoder.layers.0.ffn", "SiLU")
    g, h = (values(d.z) for d in fig.data)
    np.testing.assert_array_equal(g, gate.T)
    np.testing.assert_array_equal(h, hidden.T)
    with torch.no_grad():  # independently: SiLU(W_gate x) and its product with W_up x
        np.testing.assert_allclose(gate, torch.nn.functional.silu(x @ ffn.gate.weight.T).numpy(), atol=1e-5)
        np.testing.assert_allclose(hidden, (gate * (x @ ffn.linear1.weight.T).numpy()), atol=1e-5)


def test_architecture_shapes_are_the_traces(lm):
    kind, _, trace = lm
    desc = trace.meta["model"]
    for layer in range(3):
        shapes = FA.lm_shapes(desc, 1, 9, layer)
        assert shapes, "no shapes"
        for name, shape in shapes.items():
            assert tuple(trace[name].shape) == shape, name
    fig = FA.lm_architecture_figure(desc, 1, 9, layer=2).to_plotly_json()
    texts = [a.get("text", "") for a in fig["layout"]["annotations"]]
    q, k = trace["decoder.layers.2.self_attn.q"].shape, trace["decoder.layers.2.self_attn.k"].shape
    edge = next(x for x in texts if x.startswith("Q "))
    assert f"({', '.join(map(str, q))})" in edge and f"({', '.join(map(str, k))})" in edge
    assert any(f"({', '.join(map(str, trace['logits'].shape))})" in x for x in texts)
    labels = " | ".join(texts).replace("<br>", " ")
    if kind == "llama":
        assert "GQA: 4 query heads, 2 K/V heads" in labels and "RoPE" in labels and "SwiGLU" in labels
        assert "RMSNorm" in labels and f"({9}, {4})" in labels  # the rotation angles: (T, d_head/2)
        assert "learned position" not in labels
    else:
        assert "Masked multi-head self-attention (4 heads)" in labels and "GELU" in labels
        assert "LayerNorm" in labels and "learned position" in labels and "RoPE" not in labels
    marks = next(d for d in fig["data"] if d.get("customdata"))
    ids = [c[0] for c in marks["customdata"]]
    assert set(ids) <= set(FA.LM_BY_ID) and "lm_attn" in ids and "lm_ffn" in ids
    assert FA.block_params("lm_attn", 2, 3) == {"attn_kind": "dec", "layer": "2", "head": "3"}
    assert FA.block_params("lm_ffn", 2, 3) == {"stack": "decoder", "layer": "2", "sub": "ffn", "head": "3"}
