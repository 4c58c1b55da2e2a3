"""What changed since 2017 (/since2017): each section's drawn numbers against the trace and the closed form, then
the page in AppTest (SmolLM2 beside a toy model, from each kind of sidebar model; en and zh).

Figure tests run on a tiny random Llama-style DecoderLM (RoPE, GQA, RMSNorm with a random gain, SwiGLU) and the
shipped toy model: the RoPE angles and scores equal the trace's, the added-PE scores equal the toy trace's layer-0
scores, RMSNorm equals the trace's norm output, gate · up equals the trace's FFN hidden units, and the KV-cache
bytes follow from the config.
"""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
import torch
from conftest import APP, tiny_hf_lm
from streamlit.testing.v1 import AppTest
from test_i18n import english_in_zh

from model.families.lm import DecoderLM, LMConfig
from model.toy.checkpoint import load_checkpoint
from viz.figures import modern as FM

PAGE = "viz/pages/since2017.py"
LM_TIMEOUT = 900


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=50, d_model=48, n_layers=2, n_heads=6, n_kv_heads=2, d_ff=64, max_len=128,
                   positional="rotary", rope_base=500.0, norm="rmsnorm", norm_eps=1e-6, ffn="gated", activation="silu",
                   qkv_bias=False, out_bias=False, ffn_bias=False)
    m = DecoderLM(cfg).eval()
    with torch.no_grad():
        for layer in m.decoder.layers:
            layer.norm1.weight.uniform_(0.5, 1.5)
    ids = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, trace = m.run_with_trace(ids)
    return m, trace


def test_rope_angles_and_rotation_equal_the_trace(tiny):
    m, trace = tiny
    T, d = trace["decoder.rope.angles"].shape[0], m.cfg.d_head
    angles = FM.rope_angles(T, d, m.cfg.rope_base)
    np.testing.assert_allclose(angles, trace["decoder.rope.angles"].double().numpy(), rtol=1e-6, atol=1e-6)
    a = "decoder.layers.1.self_attn"
    q_unrot, q = trace[f"{a}.q_unrot"][0].double().numpy(), trace[f"{a}.q"][0].double().numpy()
    np.testing.assert_allclose(FM.rotate(q_unrot, angles), q, atol=1e-5)


def test_rope_score_vs_distance_is_the_traces_score_and_only_the_distance_counts(tiny):
    m, trace = tiny
    a = "decoder.layers.1.self_attn"
    head, qp, kp = 4, 9, 2
    kv = head // (m.cfg.n_heads // m.cfg.kv_heads)
    q = trace[f"{a}.q_unrot"][0, head, qp].double().numpy()
    k = trace[f"{a}.k_unrot"][0, kv, kp].double().numpy()
    curves = FM.rope_scores(q, k, m.cfg.rope_base, [kp, kp + 50], 40)
    assert curves[kp][qp - kp] == pytest.approx(float(trace[f"{a}.scores"][0, head, qp, kp]), abs=1e-5)
    np.testing.assert_allclose(curves[kp], curves[kp + 50], atol=1e-9)  # relative: the start does not matter
    fig = FM.rope_figure(FM.rope_angles(12, m.cfg.d_head, m.cfg.rope_base), curves, None)
    lines = [tr for tr in fig.data if tr.type == "scatter"]
    np.testing.assert_allclose(lines[0].y, curves[kp])
    np.testing.assert_allclose(fig.data[0].z, np.mod(FM.rope_angles(12, m.cfg.d_head, m.cfg.rope_base), 2 * np.pi))


def test_added_pe_scores_equal_the_toy_models_layer0_scores_and_depend_on_the_start():
    ckpt = load_checkpoint("dates")
    assert ckpt.cfg.positional == "sinusoidal" and not ckpt.cfg.norm_first
    _, tr = ckpt.trace(ckpt.example)
    from model.core.layers import sinusoidal_encoding

    att = ckpt.model.encoder.layers[0].self_attn
    w = {n: getattr(att, n) for n in ("w_q", "w_k")}
    tok = tr["encoder.embed.tok"][0].double().numpy()
    pe = sinusoidal_encoding(ckpt.cfg.max_len, ckpt.cfg.d_model).double().numpy()
    head, kp, qp = 2, 1, 4
    curves = FM.added_scores(tok[qp], tok[kp], pe, w["w_q"].weight.detach().double().numpy(),
                             w["w_q"].bias.detach().double().numpy(), w["w_k"].weight.detach().double().numpy(),
                             w["w_k"].bias.detach().double().numpy(), head, ckpt.cfg.n_heads, [kp, kp + 10], 20)
    assert curves[kp][qp - kp] == pytest.approx(float(tr["encoder.layers.0.self_attn.scores"][0, head, qp, kp]),
                                                abs=1e-4)
    assert np.abs(curves[kp] - curves[kp + 10]).max() > 1e-2  # added positions: the start matters


def test_kv_cache_bytes_follow_from_the_config():
    L, H, Hkv, d, b = 30, 9, 3, 64, 4
    assert FM.kv_cache_bytes(L, Hkv, d, 8192, b) == 2 * L * Hkv * d * 8192 * b
    fig = FM.gqa_figure(L, H, Hkv, d, b, 8192)
    lines = [tr for tr in fig.data if tr.type == "scatter" and tr.mode == "lines" and tr.x is not None
             and len(tr.x) > 2]
    full, shared = lines
    assert full.x[-1] == shared.x[-1] == 8192
    assert full.y[-1] == pytest.approx(2 * L * H * d * 8192 * b / 2**20)
    assert shared.y[-1] == pytest.approx(2 * L * Hkv * d * 8192 * b / 2**20)
    # Query head h is joined to K/V head h // (H / H_kv).
    joins = [tr for tr in fig.data if tr.mode == "lines" and len(tr.x) == 2]
    assert [round((tr.y[1] + 0.5) * Hkv / H - 0.5) for tr in joins] == [h // (H // Hkv) for h in range(H)]


def test_rmsnorm_drawn_is_the_traces_and_the_closed_form(tiny):
    m, trace = tiny
    x = trace["decoder.layers.0.norm1.in"][0, 5].double().numpy()
    out = trace["decoder.layers.0.norm1.out"][0, 5].double().numpy()
    g = m.decoder.layers[0].norm1.weight.detach().double().numpy()
    np.testing.assert_allclose(FM.rms_norm(x, g, m.cfg.norm_eps), out, atol=1e-5)
    ln = FM.layer_norm(x, g, None, m.cfg.norm_eps)
    ref = torch.nn.functional.layer_norm(torch.tensor(x), (len(x),), torch.tensor(g), None, m.cfg.norm_eps)
    np.testing.assert_allclose(ln, ref.numpy(), atol=1e-10)
    fig = FM.norm_figure(x, out, ln, "a")
    np.testing.assert_allclose(fig.data[1].y, out)
    np.testing.assert_allclose(fig.data[2].y, ln)


def test_swiglu_gate_times_up_is_the_traces_hidden(tiny):
    m, trace = tiny
    gate = trace["decoder.layers.1.ffn.gate"][0].double().numpy()
    with torch.no_grad():
        up = m.decoder.layers[1].ffn.linear1(trace["decoder.layers.1.norm2.out"][0]).double().numpy()
    np.testing.assert_allclose(gate * up, trace["decoder.layers.1.ffn.hidden"][0].double().numpy(), atol=1e-5)
    units = [3, 7, 20]
    fig = FM.swiglu_figure(gate, up, [str(i) for i in range(gate.shape[0])], units)
    np.testing.assert_allclose(fig.data[0].z, gate[:, units])
    np.testing.assert_allclose(fig.data[1].z, up[:, units])


def test_residual_norms_are_the_median_token_norms(tiny):
    _, trace = tiny
    outs = [trace[f"decoder.layers.{i}.out"][0].double().numpy() for i in range(2)]
    np.testing.assert_allclose(FM.residual_norms(outs), [np.median(np.linalg.norm(o, axis=1)) for o in outs])


# ---------------------------------------------------------------- the page (AppTest; SmolLM2: slow, never skipped)


def open_page(query: dict, timeout: float = LM_TIMEOUT) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=timeout)
    at.query_params.update({k: str(v) for k, v in query.items()})
    at.switch_page(PAGE)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def decode(a) -> np.ndarray:
    if isinstance(a, dict):
        x = np.frombuffer(base64.b64decode(a["bdata"]), dtype=np.dtype(a["dtype"]))
        return x.reshape([int(s) for s in str(a.get("shape", x.size)).split(",")])
    return np.asarray(a, dtype=np.float64)


@pytest.mark.slow
@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("checkpoint", ["dates", "smollm2", "minilm"])
def test_page_draws_every_section_with_the_models_numbers(checkpoint, lang):
    from model import load_model

    at = open_page({"checkpoint": checkpoint, "lang": lang, "layer": 3, "head": 4})
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(figs) == 5  # RoPE, GQA, norms, SwiGLU, pre-LN
    cfg = load_model("smollm2").model.cfg
    text = " ".join(md.value for md in at.markdown)
    full = FM.kv_cache_bytes(cfg.n_layers, cfg.n_heads, cfg.d_head, 8192, 4) / 2**20
    shared = FM.kv_cache_bytes(cfg.n_layers, cfg.kv_heads, cfg.d_head, 8192, 4) / 2**20
    assert f"{shared:,.0f} MiB" in text and f"{full:,.0f} MiB" in text
    gqa = figs[1]
    lines = [d for d in gqa["data"] if d.get("mode") == "lines" and len(decode(d["x"])) > 2]
    assert decode(lines[1]["y"])[-1] == pytest.approx(shared)
    diff = re.search(r"(?:at most|最多只变化) ([0-9.e+-]+)", text)
    assert diff and float(diff.group(1)) < 1e-3  # RoPE: the two starts' curves coincide (float rounding)
    if lang == "zh":
        assert at.title[0].value == "2017 年以来的变化"
        assert not english_in_zh(at)
    assert at.session_state["s17_layer"] == 3 and at.session_state["s17_head"] == 4


@pytest.mark.slow
def test_page_link_reopens_layer_head_and_token_and_refuses_bad_values():
    at = open_page({"checkpoint": "smollm2", "layer": 7, "head": 2, "pos": 3})
    assert (at.session_state["s17_layer"], at.session_state["s17_head"], at.session_state["s17_pos"]) == (7, 2, 3)
    assert any("Layer 7, head 2" in md.value for md in at.markdown)
    bad = open_page({"checkpoint": "smollm2", "layer": 99, "head": -1, "pos": "x"})
    notes = " ".join(w.value for w in bad.warning)
    assert "layer=99" in notes and "head=-1" in notes and "pos=x" in notes


# ---------------------------------------------------------------- a model without the new blocks


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> str:
    return tiny_hf_lm(tmp_path_factory.mktemp("tiny-gpt2"), "gpt2")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_gpt2_style_model_says_in_one_sentence_what_it_kept_from_2017(gpt2, lang):
    at = open_page({"checkpoint": gpt2, "lang": lang}, timeout=300)
    infos = [i.value for i in at.info]
    text = " ".join(md.value for md in at.markdown)
    if lang == "en":
        assert any("does not rotate: its positions are learned" in i for i in infos)
        assert any("uses LayerNorm, as in 2017" in i for i in infos)
        assert any("plain feed-forward network, as in 2017" in i for i in infos)
        assert "gives every query head its own K/V head (4 of each)" in text
    else:
        assert not english_in_zh(at)
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(figs) == 2  # GQA (its cache, no sharing) and pre-LN: the other sections have nothing to draw
