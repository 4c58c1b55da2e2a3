"""Information flow (model/analysis/flow.py): rollout, flow, norm-based attention, contribution routes,
the causal effect and the agreement statistics, on hand-made graphs and tiny random models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import small_config

from model import Transformer
from model.analysis import flow
from model.families.lm import DecoderLM, LMConfig

# ---------------------------------------------------------------------- hand-made graphs


def test_rollout_three_tokens_by_hand():
    A1 = np.array([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]])
    # one layer: 0.5 A + 0.5 I
    R1 = flow.rollout([A1])
    assert np.allclose(R1[2], [0.1, 0.15, 0.75])
    # two layers: row 2 of (0.5 A2 + 0.5 I) @ (0.5 A1 + 0.5 I), written out
    A2 = np.array([[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0]])
    At1 = np.array([[1, 0, 0], [0.25, 0.75, 0], [0.1, 0.15, 0.75]])
    row2 = 0.5 * At1[1] + 0.5 * At1[2]  # A~2 row 2 = [0, 0.5, 0.5]
    assert np.allclose(flow.rollout([A1, A2])[2], row2)
    assert np.allclose(flow.rollout([A1, A2]).sum(-1), 1)


def test_max_flow_textbook_graph():
    # CLRS figure 26.1: max flow 23
    cap = {0: {1: 16, 2: 13}, 1: {3: 12}, 2: {1: 4, 4: 14}, 3: {2: 9, 5: 20}, 4: {3: 7, 5: 4}}
    assert flow.max_flow(cap, 0, 5) == pytest.approx(23)


def test_attention_flow_three_tokens_by_hand():
    uniform = np.full((3, 3), 1 / 3)
    A2 = np.array([[1.0, 0, 0], [0.4, 0.6, 0], [0.1, 0.15, 0.75]])
    # token 0 reaches (top, 2) through the three middle nodes: sum_i min(1/3, A2[2, i])
    f = flow.attention_flow([uniform, A2], position=2, residual=0.0)
    assert f[0] == pytest.approx(0.1 + 0.15 + 1 / 3)
    assert np.allclose(f, f[0])  # every token feeds every middle node alike
    # one layer: the flow is the edge itself
    assert np.allclose(flow.attention_flow([A2], position=2, residual=0.0), A2[2])


def test_attention_flow_refuses_past_its_limit():
    A = [np.eye(30)] * 20
    with pytest.raises(flow.FlowTooLarge) as e:
        flow.attention_flow(A, 29, max_nodes=400)
    assert e.value.limit == 400 and e.value.nodes == 30 * 21
    assert "400" in str(e.value) and "tokens" in str(e.value)


# ---------------------------------------------------------------------- llm-transparency-tool's unit cases
# facebookresearch/llm-transparency-tool, llm_transparency_tool/routes/test_contributions.py (Dec 2024):
# the numbers below are theirs; the function is ours (proximity, from Ferrando & Voita 2024).


def test_contributions_mlp_with_zero_residual():
    c = flow.proximity(torch.tensor([[1.0, 1.0], [0.0, 0.0]]), torch.tensor([1.0, 1.0]))
    assert c.tolist() == pytest.approx([1.0, 0.0], abs=1e-4)


def test_contributions_decomposed_attention_l2():
    # resid_pre [2, 1], resid_mid [2, 2], one query, one key, two heads [1, 1] and [-1, 0]
    parts = torch.tensor([[1.0, 1.0], [-1.0, 0.0], [2.0, 1.0]])  # head 0, head 1, the residual
    c = flow.proximity(parts, torch.tensor([2.0, 2.0]), p=2)
    assert c.tolist() == pytest.approx([0.43613, 0.0, 0.56387], abs=1e-4)


def test_contributions_decomposed_mlp_l2():
    neurons = torch.tensor([[0.0, 1.0], [1.0, 0.0], [-21.0, -1.0], [10.0, 10.0]])  # + the residual (pre)
    c = flow.proximity(neurons, torch.tensor([-10.0, 10.0]), p=2)
    assert c.tolist() == pytest.approx([1, 0, 0, 0], abs=1e-4)
    c = flow.proximity(torch.tensor([[1.0, 1.0], [2.0, 2.0], [1.0, 1.0]]), torch.tensor([4.0, 4.0]), p=2)
    assert c.tolist() == pytest.approx([0.25, 0.5, 0.25], abs=1e-4)


def test_threshold_renormalize():
    b, r = flow.threshold_renormalize(0.1, torch.tensor([[0.05, 0.15], [0.05, 0.05]]), torch.tensor([0.8, 0.9]))
    assert b.tolist()[0] == pytest.approx([0.0, 0.157894], abs=1e-4)
    assert b.tolist()[1] == pytest.approx([0.0, 0.0], abs=1e-4)
    assert r.tolist() == pytest.approx([0.842105, 1.0], abs=1e-4)


# ---------------------------------------------------------------------- tiny random models


def tiny_llama(n_layers: int = 2, **kw) -> DecoderLM:
    torch.manual_seed(0)
    cfg = LMConfig(**(dict(vocab_size=50, d_model=32, n_layers=n_layers, n_heads=4, n_kv_heads=2, d_ff=48,
                           max_len=64, positional="rotary", norm="rmsnorm", ffn="gated", activation="silu",
                           qkv_bias=False, out_bias=False, ffn_bias=False) | kw))
    m = DecoderLM(cfg).eval()
    with torch.no_grad():  # GPT-2's init (std 0.02) makes a nearly silent residual; give it some voice
        for p in m.parameters():
            if p.dim() > 1:
                p.mul_(10)
    return m


IDS = torch.tensor([[3, 17, 5, 29, 11, 8, 40]])


def lm_subject(m, ids=IDS, **kw):
    return flow.prepare(m, ids, **kw)


def node_sums(r: flow.Routes):
    for stack, steps in r.steps.items():
        for st in steps:
            total = st.resid.copy()
            if st.ffn is not None:
                total += st.ffn
            if st.heads is not None:
                total += st.heads.sum((1, 2))
            yield stack, st.sub, total


def test_contributions_into_every_node_sum_to_one_on_a_tiny_llama():
    s = lm_subject(tiny_llama())
    r = flow.routes(s)
    for _, sub, total in node_sums(r):
        assert np.allclose(total, 1, atol=1e-5), sub
    imp = r.importance()["decoder"]
    assert imp.sum() == pytest.approx(1, abs=1e-5) and (imp >= 0).all()


def test_chunked_shares_equal_one_block():
    s = lm_subject(tiny_llama())
    tr = flow.capture(s)
    one_row = flow.routes(s, tr, chunk_bytes=1)  # one query row a block
    whole = flow.routes(s, tr, chunk_bytes=2**30)
    assert one_row.peak_chunk_bytes < whole.peak_chunk_bytes
    for a, b in zip(one_row.steps["decoder"], whole.steps["decoder"], strict=True):
        assert np.allclose(a.resid, b.resid, atol=1e-6)
        if a.heads is not None:
            assert np.allclose(a.heads, b.heads, atol=1e-6)


def brute_force_attention_shares(m: DecoderLM, tr, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """From scratch: every term alpha_hij v_{kv(h)j} W^O_h written out, then the L1 proximity."""
    attn = m.decoder.layers[layer].self_attn
    p = f"decoder.layers.{layer}"
    x = (tr["decoder.embed.out"] if layer == 0 else tr[f"decoder.layers.{layer - 1}.out"])[0].double()
    y = tr[f"{p}.norm2.in"][0].double()
    A = tr[f"{p}.self_attn.weights"][0].double()
    v = tr[f"{p}.self_attn.v"][0].double()
    H, T, _ = A.shape
    hs = attn.d_head
    W = attn.w_o.weight.detach().double()
    heads = np.zeros((T, H, T))
    resid = np.zeros(T)
    for i in range(T):
        prox = {}
        for h in range(H):
            g = h // (attn.n_heads // attn.n_kv_heads)
            for j in range(T):
                term = A[h, i, j] * (W[:, h * hs:(h + 1) * hs] @ v[g, j])
                prox[(h, j)] = max(0.0, float(y[i].abs().sum() - (y[i] - term).abs().sum())) if A[h, i, j] > 0 else 0
        pr = max(0.0, float(y[i].abs().sum() - (y[i] - x[i]).abs().sum()))
        total = sum(prox.values()) + pr
        for (h, j), val in prox.items():
            heads[i, h, j] = val / total
        resid[i] = pr / total
    return heads, resid


def test_routes_shares_equal_a_from_scratch_computation_with_gqa():
    m = tiny_llama()
    s = lm_subject(m)
    tr = flow.capture(s)
    r = flow.routes(s, tr)
    for layer in range(2):
        heads, resid = brute_force_attention_shares(m, tr, layer)
        st = r.steps["decoder"][2 * layer]
        assert np.allclose(st.heads, heads, atol=1e-5) and np.allclose(st.resid, resid, atol=1e-5)


def test_one_layer_routes_graph_enumerated_by_hand():
    m = tiny_llama(n_layers=1)
    ids = IDS[:, :3]
    s = lm_subject(m, ids)
    tr = flow.capture(s)
    r = flow.routes(s, tr)
    heads, resid = brute_force_attention_shares(m, tr, 0)
    ffn = r.steps["decoder"][1]
    # the output node (row 2 = after L0 ffn, position 2) <- FFN and residual from row 1; row 1, position 2 <-
    # the residual from row 0 and each (head, key) term: nothing else is reachable in one layer
    want = {(("decoder", 1, 2), "ffn", None), (("decoder", 1, 2), "resid", None), (("decoder", 0, 2), "resid", None)}
    want |= {(("decoder", 0, j), "head", h) for h in range(4) for j in range(3) if heads[2, h, j] > 0}
    got = {(e["src"], e["kind"], e["head"]) for e in r.edges(tau=0.0)}
    if resid[2] == 0:
        want.discard((("decoder", 0, 2), "resid", None))
    assert got == want
    out = {e["kind"]: e["weight"] for e in r.edges(0.0) if e["dst"] == ("decoder", 2, 2)}
    assert out["ffn"] == pytest.approx(float(ffn.ffn[2])) and out["resid"] == pytest.approx(float(ffn.resid[2]))
    # pruning: a tau above every head share leaves the two top edges and the residual path
    assert all(e["weight"] > 0.3 for e in r.edges(0.3))


def test_norm_based_equals_a_from_scratch_head_with_gqa():
    m = tiny_llama()
    tr = flow.capture(lm_subject(m))
    attn = m.decoder.layers[1].self_attn
    A = tr["decoder.layers.1.self_attn.weights"][0]
    v = tr["decoder.layers.1.self_attn.v"][0]
    per_head, per_layer = flow.norm_based(attn, A, v)
    h, hs = 3, attn.d_head  # query head 3 reads K/V head 1 (4 query heads, 2 K/V heads)
    W = attn.w_o.weight.detach()
    W_h = W[:, h * hs:(h + 1) * hs]
    T = A.shape[-1]
    want = torch.tensor([[float(torch.linalg.norm(A[h, i, j] * (W_h @ v[1, j]))) for j in range(T)] for i in range(T)])
    assert torch.allclose(per_head[h], want, atol=1e-5)
    i = T - 1  # per layer: the norm of the sum over heads
    summed = [sum(A[g, i, j] * (W[:, g * hs:(g + 1) * hs] @ v[g // 2, j]) for g in range(4)) for j in range(T)]
    assert torch.allclose(per_layer[i], torch.stack([torch.linalg.norm(x) for x in summed]), atol=1e-5)


def test_routes_on_gpt2_style_blocks_with_biases():
    m = tiny_llama(positional="learned", norm="layernorm", ffn="plain", activation="gelu_tanh", n_kv_heads=None,
                   qkv_bias=True, out_bias=True, ffn_bias=True)
    r = flow.routes(lm_subject(m))
    for _, sub, total in node_sums(r):
        assert np.allclose(total, 1, atol=1e-5), sub


@pytest.mark.parametrize("norm_first", [False, True])
def test_translator_graph_spans_both_stacks(norm_first):
    torch.manual_seed(0)
    m = Transformer(small_config(norm_first=norm_first)).eval()
    src, tgt = torch.tensor([[4, 9, 2, 7, 5]]), torch.tensor([[1, 6, 3, 8]])
    s = flow.Subject(m, "seq2seq", {"src": src, "tgt": tgt},
                     {"src_tokens": list("abcde"), "tgt_tokens": list("wxyz")}, 2, target=5)
    tr = flow.capture(s)
    r = flow.routes(s, tr)
    assert [u.sub.kind for u in r.steps["decoder"][:3]] == ["attn", "cross", "ffn"]
    for _, sub, total in node_sums(r):
        assert np.allclose(total, 1, atol=1e-5), sub
    imp = r.importance()
    assert imp["encoder"].sum() + imp["decoder"].sum() == pytest.approx(1, abs=1e-5)
    assert imp["decoder"][3] == 0  # the future target token is no source
    cross = [e for e in r.edges(0.0) if e["sublayer"] == "cross" and e["kind"] == "head"]
    assert cross and all(e["src"][0] == "encoder" and e["src"][1] == r.n_rows("encoder") - 1 for e in cross)
    roll = flow.rollout_importance(s, tr)
    assert roll["encoder"].sum() + roll["decoder"].sum() == pytest.approx(1)
    effect = flow.causal_effect(s, tr.meta["model"])
    assert effect.shape == (5,) and (effect >= 0).all()


def test_encoder_only_graph_and_cosine_effect():
    torch.manual_seed(0)
    m = Transformer(small_config(n_decoder_layers=0, n_token_types=2, embed_norm=True)).eval()
    s = flow.prepare(m, torch.tensor([[2, 5, 9, 4, 3]]), position=2)
    assert s.kind == "encoder" and s.sources == [0, 1, 2, 3, 4]
    c = flow.compare(s, flow=True)
    assert set(c.methods) == {"raw", "norm", "rollout", "routes", "flow"}
    assert (c.effect >= 0).all() and c.effect.shape == (5,)


# ---------------------------------------------------------------------- the causal effect and agreement


@torch.no_grad()
def test_causal_effect_is_one_hook_per_token():
    m = tiny_llama()
    s = lm_subject(m)
    effect = flow.causal_effect(s, m.describe(), batch=3)  # batched rows equal single runs
    clean = torch.log_softmax(m(IDS)[0, -1].double(), -1)[s.target]
    for j in (0, 4):
        def zero(t, name, j=j):
            t = t.clone()
            t[:, :, j] = 0
            return t
        logp = torch.log_softmax(m.run_with_hooks(IDS, hooks={"decoder.layers.*.self_attn.v": zero})[0, -1].double(),
                                 -1)[s.target]
        assert effect[j] == pytest.approx(abs(float(clean - logp)), abs=1e-5)


def test_contrast_measures_the_logit_difference():
    m = tiny_llama()
    s = lm_subject(m, target=7, contrast=9)
    out = s.forward()
    assert float(s.measure(out)[0]) == pytest.approx(float(out[0, -1, 7] - out[0, -1, 9]), abs=1e-5)


def test_spearman_and_top_k():
    assert flow.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1)
    assert flow.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1)
    assert flow.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833, abs=1e-6)  # ties: mean ranks
    assert math.isnan(flow.spearman([1, 1, 1], [1, 2, 3]))
    assert flow.top_k_overlap([5, 4, 3, 0], [0, 4, 5, 3], k=2) == 0.5


def test_agreement_table_over_a_prompt_set():
    m = tiny_llama()
    prompts = [flow.Prompt(IDS), flow.Prompt(IDS[:, :5], target=3)]
    seen = []
    table = flow.agreement_table(m, prompts, progress=lambda i, n: seen.append((i, n)))
    assert seen == [(1, 2), (2, 2)]
    summ = table.summary()
    assert set(summ) == set(flow.METHODS)
    for method, row in summ.items():
        r = table.rhos(method)
        assert row["mean"] == pytest.approx(np.nanmean(r)) and -1 <= row["mean"] <= 1


def test_bad_position_is_a_sentence():
    with pytest.raises(ValueError, match="outside the text"):
        flow.prepare(tiny_llama(), IDS, position=9)


def test_notebook_flow_view_exports_offline(tmp_path):
    from viz import notebook as nb

    m = tiny_llama()
    s = lm_subject(m)
    fig = nb.flow_view(s, tau=0.0)
    r = flow.routes(s)
    dots = [d for d in fig.data if d.customdata is not None and d.customdata[0][0] == "edge"]
    assert sum(len(d.customdata) for d in dots) == len(r.edges(0.0))
    page = nb.export_html([fig, nb.flow_compare(s)], tmp_path / "routes.html")
    assert (tmp_path / "routes.html").exists() and "Plotly" in page and "src=\"http" not in page


@pytest.mark.parametrize("family", ["llama3", "mistral", "gemma2", "gemma3", "gpt_neox", "qwen2_moe"])
def test_causal_effect_on_the_clean_prefix_equals_the_full_runs(tmp_path, family):
    """reuse_prefix: a batch runs from its first source on, over the clean run's keys and values before it
    (sliding windows, local RoPE, soft caps, MoE routing, learned or rotary positions all see the offset)."""
    from test_families import build
    from test_families import ids as family_ids

    from model import load_model

    build(family).save_pretrained(tmp_path)
    m = load_model(str(tmp_path)).model
    s = flow.prepare(m, family_ids(n=21))
    full = flow.causal_effect(s, m.describe(), batch=4, reuse_prefix=False)
    fast = flow.causal_effect(s, m.describe(), batch=4)
    assert full.shape == fast.shape == (21,) and full.max() > 1e-3
    np.testing.assert_allclose(fast, full, rtol=1e-4, atol=1e-5)
