"""The 2024–2026 families on the pages (issue 23 §3): every page opens on a tiny random Gemma 3 and a tiny
random Qwen2-MoE model (AppTest, en and zh) with no exception, and the pages that teach a mechanism draw it from
the model's description with the live tensors:

- Attention: the score pipeline with Gemma's own query scale, the soft-cap before/after and the sliding window in
  M; the mask view with the window beside the look-ahead mask;
- Architecture map: sandwich norms, q/k norm, the layer's window; the MoE router and experts;
- What changed since 2017: sliding windows (the live reach and a token 5,000 back), q/k norm, soft-capping, RoPE
  scaling, MoE routing, gpt-oss's learned attention sinks; a one-sentence note where the model lacks the mechanism;
- Inside a layer: the sandwich, post-norm (OLMo 2) and parallel-residual (GPT-NeoX) wirings recompose each layer
  exactly; MoE routing in the FFN tab.

Models: transformers' AutoConfig.for_model + save_pretrained (2 layers, hidden 64), built once per module, served
as `--model PATH` models.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import figures, model_page, plotly_array, tiny_bpe_tokenizer
from test_i18n import english_in_zh

from viz.figures import arch as FA
from viz.figures import layer as FL
from viz.figures import modern as FM
from viz.ui import lm_models

transformers = pytest.importorskip("transformers")

PAGES = ["lessons", "architecture", "tokens", "tokenizers", "attention", "layer", "padding", "decoder", "pretrained",
         "llm", "phenomena", "qk", "since2017", "experiments", "schedule", "training", "snapshots", "flow"]
# The analyses' views beyond each page's default (issue 30 §2): each on every wiring, with no exception or error
VIEWS = [("phenomena", {"phen": p}) for p in ("sinks", "patterns", "induction", "ioi", "needle")] + [
    ("llm", {"view": "lens"}), ("flow", {"set": "induction"}), ("flow", {"set": "ioi"})]
W = 4  # Gemma 3's sliding window here: the example prompt (~26 tokens) is several windows long
COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, bos_token_id=0, eos_token_id=0, pad_token_id=0)
FAMILIES = {
    "gemma3": ("gemma3_text", dict(head_dim=16, sliding_window=W, query_pre_attn_scalar=24, attn_logit_softcapping=3.0,
                                   layer_types=["sliding_attention", "full_attention"],
                                   rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                       "rope_theta": 1e6},
                                                    "sliding_attention": {"rope_type": "default",
                                                                          "rope_theta": 1e4}})),
    # Gemma 3's attention ignores attn_logit_softcapping (transformers' does, and so does the lab: issue 30 §6);
    # Gemma 2 applies it, so the soft-cap's views are checked on a tiny Gemma 2
    "gemma2": ("gemma2", dict(head_dim=16, sliding_window=W, query_pre_attn_scalar=24, attn_logit_softcapping=3.0)),
    "qwen2moe": ("qwen2_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                   shared_expert_intermediate_size=48)),
    "olmo2": ("olmo2", dict()),
    "neox": ("gpt_neox", dict(rotary_pct=0.5, num_key_value_heads=4)),
    # issue 32's own families: one shared norm (Phi, Cohere), multipliers (Granite), NoPE layers (SmolLM3), GLM-4
    "phi": ("phi", dict(partial_rotary_factor=0.5, num_key_value_heads=4)),
    "cohere": ("cohere", dict(logit_scale=0.5)),
    "granite": ("granite", dict(embedding_multiplier=6.0, attention_multiplier=0.1, residual_multiplier=0.3,
                                logits_scaling=4.0)),
    "glm4": ("glm4", dict(head_dim=16)),
    "smollm3": ("smollm3", dict(num_hidden_layers=3, no_rope_layers=[1, 0, 1])),
    # gpt-oss: learned attention sinks, YaRN (trained context 128 = 256 / 2), experts; layer 0 slides (W = 4)
    "gpt_oss": ("gpt_oss", dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=W,
                                rope_parameters={"rope_type": "yarn", "factor": 2.0, "truncate": False,
                                                 "original_max_position_embeddings": 128, "rope_theta": 150000.0})),
}


def save_family(d, family: str) -> str:
    """A tiny random model of `family` saved by transformers in `d` with a byte-level BPE tokenizer, registered as a
    server model; returns its label."""
    tok = tiny_bpe_tokenizer(d)
    torch.manual_seed(0)
    model_type, extra = FAMILIES[family]
    cfg = transformers.AutoConfig.for_model(model_type, vocab_size=tok.get_vocab_size(), **(COMMON | extra))
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    (label,) = lm_models.add_server_models([str(d)])
    return label


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """family -> its server label, each built once (lazily: the AppTest sweep needs two of the four)."""
    cache: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in cache:
            cache[family] = save_family(tmp_path_factory.mktemp(family), family)
        return cache[family]

    return get


def trace_of(label: str):
    return lm_models.load(label).trace(lm_models.EXAMPLES["decoder_lm"])[1]


def titles(fig: dict) -> str:
    """A figure's title and subplot titles, as one string."""
    layout = fig["layout"]
    title = layout.get("title", {})
    title = title.get("text", "") if isinstance(title, dict) else str(title)
    return " | ".join([title] + [a.get("text", "") for a in layout.get("annotations", [])])


def figure_with(at, text: str) -> dict:
    found = [f for f in figures(at) if text in titles(f)]
    assert found, f"no figure titled with {text!r}: {[titles(f)[:80] for f in figures(at)]}"
    return found[0]


def texts(at) -> str:
    return "\n".join(str(e.value) for kind in ("markdown", "caption", "info", "header") for e in at.get(kind))


# ---------------------------------------------------------------- every page, both languages, both families


@pytest.mark.parametrize("family", ["gemma3", "qwen2moe"])
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_page_opens(served, family, lang):
    label = served(family)
    for page in PAGES:
        at = model_page(label, page, lang)
        if lang == "zh" and page in ("since2017", "architecture", "layer", "attention"):
            assert not english_in_zh(at), (page, english_in_zh(at))


@pytest.mark.parametrize("family", ["olmo2", "neox"])
def test_every_page_opens_on_post_norm_and_parallel_blocks(served, family):
    """OLMo 2 (norms after the sublayers only) and GPT-NeoX (parallel residual): /flow was a KeyError traceback
    on OLMo 2 and drew wrong routes on both (issue 30)."""
    label = served(family)
    for page in PAGES:
        model_page(label, page, "en")
    said = {"olmo2": ("a norm follows each sublayer", "每个子层的输出在加入残差流之前先经过一个归一化"),
            "neox": ("join the stream in one sum", "在同一次求和中加入残差流")}[family]
    assert said[0] in texts(model_page(label, "flow", "en"))  # the page says which wiring the terms come from
    assert said[1] in texts(model_page(label, "flow", "zh"))


@pytest.mark.parametrize("family", ["phi", "cohere", "granite", "glm4", "smollm3"])
def test_every_page_opens_on_the_newer_families(served, family):
    """Issue 32's families on every page; the views that crashed on them: Inside a layer's FFN on a shared norm
    (Phi, Cohere asked for norm3), /since2017 on a layer without RoPE (SmolLM3) and its FFN on a shared norm."""
    label = served(family)
    for page in PAGES:
        model_page(label, page, "en")
    for layer in range(2):
        model_page(label, "layer", "en", layer=layer, sub="ffn")
        model_page(label, "since2017", "en", layer=layer)
    if family == "smollm3":
        assert "(NoPE)" in texts(model_page(label, "since2017", "en", layer=1))
        assert "（NoPE）" in texts(model_page(label, "since2017", "zh", layer=1))


@pytest.mark.parametrize("family", ["gemma3", "qwen2moe", "olmo2", "neox"])
def test_every_analysis_view_opens(served, family):
    label = served(family)
    for page, query in VIEWS:
        at = model_page(label, page, "en", **query)
        if page == "flow":  # the routes graph and the methods are drawn, not refused
            assert figures(at), (family, query)


def test_flow_on_a_sandwich_model_draws_routes_through_heads(served):
    """Gemma 3 (a norm after each sublayer): the page drew "0 through attention heads" when it took the heads'
    terms before that norm; with the decomposition the heads carry their real share."""
    at = model_page(served("gemma3"), "flow", "en", tau=0.01)
    caption = next(str(c.value) for c in at.caption if "through attention heads" in str(c.value))
    import re

    n_heads = int(re.search(r"\((\d[\d,]*) through attention heads\)", caption).group(1).replace(",", ""))
    assert n_heads > 0, caption


# ---------------------------------------------------------------- Attention: pipeline and masks


def test_attention_pipeline_uses_gemmas_scale_softcap_and_window(served):
    label = served("gemma3")
    trace = trace_of(label)
    info = trace.meta["model"]["attention"]["decoder.layers.0.self_attn"]
    assert info["window"] == W and info["softcap"] is None and info["qk_norm"]  # Gemma 3: its config's cap unused
    assert info["scale"] == pytest.approx(24 ** -0.5)
    at = model_page(label, "attention", view="pipeline", layer=0, head=1)
    assert "scales by 0.2041, not 1/√d_k" in texts(at) and "sliding window" in texts(at)
    fig = figure_with(at, "× scale 0.2041")
    assert "(not 1/√d_k = 0.25)" in titles(fig) and f"window {W}" in titles(fig)
    heat = [d for d in fig["data"] if d["type"] == "heatmap"]
    name = "decoder.layers.0.self_attn"
    scores = trace[f"{name}.scores"][0, 1].double().numpy()
    np.testing.assert_allclose(plotly_array(heat[0]["z"]), scores / info["scale"], rtol=1e-5, atol=1e-5)  # q·kᵀ
    np.testing.assert_allclose(plotly_array(heat[1]["z"]), scores, rtol=1e-5, atol=1e-6)  # × the real scale
    masked = plotly_array(heat[2]["z"])
    T = scores.shape[0]
    i, j = np.indices((T, T))
    assert np.isnan(masked[(j > i) | (i - j >= W)]).all() and not np.isnan(masked[(j <= i) & (i - j < W)]).any()
    np.testing.assert_allclose(plotly_array(heat[-1]["z"]), trace[f"{name}.weights"][0, 1].numpy(), atol=1e-6)
    assert figure_with(at, "‖q‖ per token")  # the q/k norm step

    at = model_page(label, "attention", view="masks", layer=0)
    fig = figure_with(at, f"sliding window, W = {W} (masks.sliding)")
    masks = [plotly_array(d["z"]) for d in fig["data"][:3]]
    np.testing.assert_array_equal(masks[1], trace["masks.sliding"].numpy().astype(np.float32))
    np.testing.assert_array_equal(masks[2], trace[f"{name}.mask"][0, 0].numpy().astype(np.float32))
    at = model_page(label, "attention", view="masks", layer=1)  # the global layer: the 2017 mask view
    assert not [f for f in figures(at) if "masks.sliding" in titles(f)]
    # the soft-cap step, on Gemma 2 (which applies it)
    label = served("gemma2")
    trace = trace_of(label)
    assert trace.meta["model"]["attention"][f"{name}"]["softcap"] == 3.0
    at = model_page(label, "attention", view="pipeline", layer=0, head=1)
    heat = [d for d in figure_with(at, "× scale 0.2041")["data"] if d["type"] == "heatmap"]
    scores = trace[f"{name}.scores"][0, 1].double().numpy()
    capped = plotly_array(heat[2]["z"])
    np.testing.assert_allclose(capped, 3.0 * np.tanh(scores / 3.0), atol=1e-5)  # the soft-cap
    np.testing.assert_allclose(capped, trace[f"{name}.scores_capped"][0, 1].numpy(), atol=1e-6)


# ---------------------------------------------------------------- Architecture map


def test_architecture_map_is_drawn_from_the_description(served):
    at = model_page(served("gemma3"), "architecture", layer=0)
    fig = figure_with(at, "sandwich norms")
    labels = titles(fig).replace("<br>", " ")
    for part in ("q/k RMSNorm", "RMSNorm after attention", "RMSNorm after the FFN", f"sliding window W = {W}",
                 "query scale 0.2041", "sliding (W = 4) × 1, full × 1", "Token embedding × √d"):
        assert part in labels, part
    assert "soft-cap" not in labels  # Gemma 3 does not cap its scores; Gemma 2 does:
    assert "soft-cap ±3" in titles(figure_with(model_page(served("gemma2"), "architecture", layer=0), "sandwich norms"))
    ids = [c[0] for c in next(d for d in fig["data"] if d.get("customdata"))["customdata"]]
    assert {"lm_qknorm", "lm_post1", "lm_post2"} <= set(ids) <= set(FA.LM_BY_ID)
    at = model_page(served("qwen2moe"), "architecture")
    labels = titles(figure_with(at, "experts: top 2 of 4")).replace("<br>", " ")
    assert "Router → top 2" in labels and "Mixture of experts: top 2 of 4" in labels and "shared expert" in labels


def test_architecture_shapes_of_the_new_families_are_the_traces(served):
    for family in ("gemma3", "qwen2moe", "olmo2", "neox"):
        trace = trace_of(served(family))
        T = trace["decoder.embed.out"].shape[1]
        for layer in (0, 1):
            for name, shape in FA.lm_shapes(trace.meta["model"], 1, T, layer).items():
                assert tuple(trace[name].shape) == shape, (family, name)


# ---------------------------------------------------------------- What changed since 2017


def test_since2017_draws_gemmas_mechanisms(served):
    label = served("gemma3")
    trace = trace_of(label)
    at = model_page(label, "since2017", layer=0, head=0)
    body = texts(at)
    for header in ("6. Sliding windows", "7. q/k norm", "8. Soft-capping", "9. RoPE scaling", "10. Mixture of experts"):
        assert header in body
    # Sliding windows: the live mask, what reaches the last token, and a token 5,000 back (one global layer).
    fig = figure_with(at, f"sliding-window mask, W = {W}")
    np.testing.assert_array_equal(plotly_array(fig["data"][0]["z"]), trace["masks.sliding"].numpy())
    reach = plotly_array(fig["data"][1]["z"])  # (layers + 1, T): the sliding layer reaches W back, the full one all
    T = reach.shape[1]
    assert reach[1].sum() == W and reach[2].all()
    assert list(fig["data"][2]["y"]) == [0, W - 1, 5000]
    assert "5,000 positions back reaches the present in one step" in body
    # q/k norm: the lengths before and after.
    fig = figure_with(at, "‖q‖ per token")
    q_in = trace["decoder.layers.0.self_attn.q_norm.in"][0, 0].double().numpy()
    np.testing.assert_allclose(plotly_array(fig["data"][0]["y"]), np.linalg.norm(q_in, axis=-1), rtol=1e-5)
    # Soft-capping: the live scores on the curve 3·tanh(s/3), on Gemma 2 (Gemma 3 does not cap its scores).
    fig = figure_with(model_page(served("gemma2"), "since2017", layer=0, head=0), "soft-cap c = 3")
    pts = fig["data"][2]
    np.testing.assert_allclose(plotly_array(pts["y"]), 3 * np.tanh(plotly_array(pts["x"]) / 3), atol=1e-5)
    # RoPE scaling: the global layer's linear ×4, and its live angles are position × the scaled frequencies.
    fig = figure_with(at, "plain vs scaled")
    plain, scaled = (plotly_array(d["y"]) for d in fig["data"][:2])
    np.testing.assert_allclose(scaled / plain, 4.0, rtol=1e-9)
    assert "Layer 1: linear scaling, factor 4" in body
    angles = trace["decoder.rope.angles"].double().numpy()
    inv = FM.inv_freq_of(trace.meta["model"]["attention"]["decoder.layers.1.self_attn"]["rope"], 16)
    np.testing.assert_allclose(angles, np.arange(T)[:, None] * inv[None], rtol=1e-5, atol=1e-5)
    assert "has one dense feed-forward network per layer" in body  # no experts: one sentence


def test_since2017_draws_moe_routing(served):
    label = served("qwen2moe")
    trace = trace_of(label)
    at = model_page(label, "since2017", layer=1, pos=3)
    body = texts(at)
    for no in ("uses no sliding window", "does not normalise q and k", "does not cap its scores", "uses plain RoPE"):
        assert no in body
    fig = figure_with(at, "router probabilities")
    R = "decoder.layers.1.ffn.router"
    np.testing.assert_allclose(plotly_array(fig["data"][0]["z"]), trace[f"{R}.probs"][0].numpy(), atol=1e-6)
    loads = plotly_array(fig["data"][2]["z"])  # (layers, experts): every token's top-2 picks
    T = trace[f"{R}.probs"].shape[1]
    assert loads.shape == (2, 4) and (loads.sum(1) == 2 * T).all()
    np.testing.assert_array_equal(loads[1], np.bincount(trace[f"{R}.topk_ids"][0].flatten().numpy(), minlength=4))
    choice = figure_with(at, "the router's choice")
    np.testing.assert_allclose(plotly_array(choice["data"][0]["y"]), trace[f"{R}.probs"][0, 3].numpy(), atol=1e-6)
    chosen = [int(e) for e in trace[f"{R}.topk_ids"][0, 3]]
    assert f"goes to experts {chosen[0]}, {chosen[1]}" in body


def test_since2017_and_the_map_draw_gpt_oss_sinks(served):
    """gpt-oss's learned attention sinks with live numbers: /since2017's section 11 draws the layer's sink logit per
    head (the model's parameters) and the head's weight on the sink per query (the trace's `.sink`, whose
    complement is the row sum of `.weights`), in en and zh (no English left); the map's attention box gives the
    layer's range of sink logits, its RoPE box YaRN's factor; the models without sinks say so in one sentence."""
    label = served("gpt_oss")
    trace = trace_of(label)
    model = lm_models.load(label).obj.model
    at = model_page(label, "since2017", layer=1, head=2, pos=5)
    body = texts(at)
    fig = figure_with(at, "learned sink logit s_h per head")
    sinks = model.decoder.layers[1].self_attn.sinks.detach().double().numpy()
    np.testing.assert_allclose(plotly_array(fig["data"][0]["y"]), sinks, rtol=1e-6)
    row = trace["decoder.layers.1.self_attn.sink"][0, 2].double().numpy()
    np.testing.assert_allclose(plotly_array(fig["data"][1]["y"]), row, rtol=1e-6)
    w = trace["decoder.layers.1.self_attn.weights"][0, 2].double().numpy()
    np.testing.assert_allclose(w.sum(-1) + row, 1.0, atol=1e-6)
    assert "11. Attention sinks" in body and f"head 2's is {sinks[2]:.4g}" in body
    assert f"sum to {1 - row[5]:.4g}" in body or f"sum to {w[5].sum():.4g}" in body
    assert "YaRN also multiplies cos and sin by m = 1.069" in body
    zh = model_page(label, "since2017", "zh", layer=1, head=2)
    assert "11. 注意力汇聚点" in texts(zh) and not english_in_zh(zh), english_in_zh(zh)
    labels = titles(figure_with(model_page(label, "architecture", layer=1), "sink s_h")).replace("<br>", " ")
    assert f"learned sinks s_h from {sinks.min():.2f} to {sinks.max():.2f}" in labels and "YaRN scaling ×2" in labels
    assert "has no learned sinks" in texts(model_page(served("qwen2moe"), "since2017"))
    # Inside a layer's one-query steps: p_i are the trace's weights, the sink takes the rest of the row
    steps = FL.query_steps(trace, "decoder.layers.1.self_attn", 2, 5)
    assert float(steps["sink"]) == pytest.approx(float(row[5]), abs=1e-7)
    assert steps["weights"].sum() + float(steps["sink"]) == pytest.approx(1.0, abs=1e-6)
    fig = FL.query_figure(steps, "q", [str(i) for i in range(len(steps["weights"]))])
    assert f"softmax with the sink s_h = {sinks[2]:.4g} → p_i (sums to 1 − {float(row[5]):.4g})" in titles(
        fig.to_plotly_json())


def test_reach_back_through_sliding_layers():
    # Mistral 7B: 32 sliding layers of W = 4096, so a token can travel 32 × 4095 = 131,040 positions.
    assert FM.reach_back(["sliding"] * 32, [4096] * 32, 200_000)[-1] == 32 * 4095
    assert FM.reach_back(["sliding"] * 2, [4] * 2, 5000) == [0, 3, 6]  # 5,000 back: out of reach
    assert FM.reach_back(["sliding", "full"], [4, None], 5000) == [0, 3, 5000]  # a global layer reaches it
    # The live rows walked backwards equal the forward product of the masks.
    rng = np.random.default_rng(0)
    masks = [np.triu(np.ones((9, 9), bool), 1) | (rng.random((9, 9)) < 0.4) for _ in range(3)]
    rows = FM.live_reach(masks, query=7)
    r = np.eye(9, dtype=bool)
    for n, m in enumerate(masks, start=1):
        r = ((~m | np.eye(9, dtype=bool)).astype(int) @ r.astype(int)) > 0
        np.testing.assert_array_equal(rows[n], r[7])


# ---------------------------------------------------------------- Inside a layer


@pytest.mark.parametrize("family, kind", [("gemma3", "sandwich"), ("olmo2", "post_norm"), ("neox", "parallel")])
def test_layer_wiring_recomposes_the_layer(served, family, kind):
    trace = trace_of(served(family))
    assert FL.wiring_kind(trace) == kind
    for layer in ("decoder.layers.0", "decoder.layers.1"):
        for sub in ("self_attn", "ffn"):
            s = FL.residual_steps(trace, layer, sub)
            added = {"sandwich": 3, "post_norm": 2}.get(kind)
            total = s[0].value + (s[added].value if added else s[2].value + s[3].value)
            np.testing.assert_allclose(total, s[-1].value, atol=1e-5)
            fig = FL.model_wiring_figure(s, kind, 2, sub, FL.norm_kind(trace))
            marks = next(d for d in fig.data if d.customdata is not None)
            np.testing.assert_allclose([c[0] for c in marks.customdata],
                                       [np.linalg.norm(x.value[2]) for x in s], rtol=1e-5)


def test_layer_page_shows_the_models_wiring_and_its_experts(served):
    at = model_page(served("neox"), "layer", layer=1, sub="ffn")
    assert figure_with(at, "parallel residual: x + Attn(Norm₁(x)) + FFN(Norm₂(x))")
    assert "side by side from the same input" in texts(at)
    at = model_page(served("qwen2moe"), "layer", layer=0, sub="ffn", token=2)
    assert figure_with(at, "router probabilities") and figure_with(at, "the router's choice")
    assert "A mixture of experts takes the FFN's place" in texts(at)
