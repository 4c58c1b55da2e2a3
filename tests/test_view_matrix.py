"""Every view on every wiring (issue 38 §2): the analysis matrix (tests/test_analysis_matrix.py) proved the numbers,
this proves what is drawn. On a tiny random model of each family the analysis matrix opens (test_residual.FAMS:
grouped K/V heads 2:1, sliding windows, soft-caps, experts, learned sinks (gpt-oss), partial rotary, parallel and
sandwich blocks, an attention-only model) plus the wirings it lacks (grouped K/V heads 3:1, multi-query on the lab's
own Llama and on Falcon through the transformers adapter, and the 2017 encoder-decoder):

- every figure builder that reads a trace and every notebook view draws with no exception: on every family above
  for each module's last query head (the head a K/V-axis index would overrun first), with the architecture figure
  of layer 0, where the families' own branches are (shared norm, multipliers, logit scale, interleaved RoPE, RoPE
  scalings, experts); for EVERY query head of every attention module, and the architecture figure and /layer's
  residual views of every layer, on one representative of each distinct wiring (REPS says what each stands for);
- Q · K · V · z draws the tensors its titles name: Q and z of query head h, K and V of K/V head h // (H / H_kv)
  (H and H_kv checked against the captured shapes, not only the description), and says which K/V head that is
  and which query heads share it; the step-by-step query (/layer) and the Q/K map read that same K/V head;
- the texts that describe heads say what the model has: every head its own W^Q, W^K, W^V (2017), or H query heads
  sharing H_kv K/V heads, multi-query said so;
- a head out of range is a sentence, not an IndexError;
- the Attention page on SmolLM2 (9 query heads, 3 K/V heads) draws Q · K · V · z on heads 0, 3 and 8 (slow: it
  loads the real model).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import test_families
import test_residual
import torch
from test_residual import FAMS, V

from model.core.describe import described
from viz import notebook as nb
from viz.figures import arch as FA
from viz.figures import attention as F
from viz.figures import layer as FL
from viz.figures import modern as FM
from viz.figures import qk as FQ

transformers = pytest.importorskip("transformers")

T = 12  # > the sliding window (8): the window blocks keys on the last rows
COMMON = test_families.COMMON
MORE_WIRINGS = {  # the wirings the analysis matrix lacks (its families share K/V heads 2:1 or not at all)
    "gqa_3to1": ("llama", dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2)),  # SmolLM2's 9:3
    "mqa": ("llama", dict(num_key_value_heads=1, head_dim=32)),  # as Gemma 3 270M: h·d_k = 128 ≠ d_model = 64
}
FALCON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)  # multi-query (1 K/V head)
CASES = FAMS + list(MORE_WIRINGS) + ["falcon_mqa", "transformer_2017", "vit"]
# one family per wiring in the fast run (the rest of CASES: marked slow, as is every view on every head)
WIRINGS = {"gqa_3to1": "grouped K/V 3:1", "mqa": "multi-query", "falcon_mqa": "multi-query via transformers",
           "llama": "grouped K/V 2:1, pre-norm", "gpt2": "learned positions, LayerNorm, one K/V head per head",
           "mistral": "sliding window", "gemma2": "soft-caps, sandwich norms, own query scale",
           "gemma3": "sliding and full layers, q/k norm", "qwen3_moe": "experts, q/k norm", "gpt_oss": "learned sinks",
           "phi": "partial rotary, parallel block", "olmo2": "post-norm", "smollm3": "layers without RoPE",
           "attention_only": "no FFN", "transformer_2017": "encoder-decoder, post-LN, cross-attention",
           "vit": "vision: [CLS], registers and patches, pre-LN encoder"}
ONE_PER_WIRING = [c if c in WIRINGS else pytest.param(c, marks=pytest.mark.slow) for c in CASES]
# Every head of every module (and Q · K · V · z, and /layer's residual views on every layer): one case per distinct
# wiring, slow. The other families share one of these wirings as far as these views go (checked on their
# descriptions): llama3, qwen2, phi3 are llama's (RoPE frequencies and fused weights are not what these views
# index); qwen3 and olmoe add q/k norm (per head: qwen3_moe, gemma3; over the whole vector: olmo2); qwen2_moe, olmoe
# and mixtral add experts (qwen3_moe, with a dense layer between expert layers); starcoder2 slides (mistral);
# cohere is phi's parallel block with one shared norm; glm4 is gemma2's sandwich; gemma is llama's pre-norm with
# Gemma's norm and embedding scale. Their own branches are in test_every_view_draws (every family, each module's
# last head, the architecture figure).
REPS = {**WIRINGS, "gpt_neox": "parallel block with two norms, partial rotary, every head its own K/V",
        "granite": "attention and residual multipliers (the score scale, each sublayer's output × m)"}
assert set(REPS) <= set(CASES)

models = test_residual.models  # the analysis matrix's fixture: its tiny model of each family, built once


@pytest.fixture(scope="module")
def traces(models, tmp_path_factory):
    """case -> a full trace (every capture) of a T-token input, with token strings in its meta, built once."""
    from model.loaders.hf import load_hf_dir

    cache = {}

    def get(case):
        if case in cache:
            return cache[case]
        x = test_residual.ids(T)
        if case == "vit":  # issue 40: patches are the tokens (meta src_tokens: "[CLS]", "reg0", "p(r,c)")
            from model.families.vit import VisionTransformer, ViTConfig

            torch.manual_seed(0)
            m = VisionTransformer(ViTConfig(d_model=32, n_heads=2, n_layers=2, d_ff=64, n_registers=1)).eval()
            with torch.no_grad():
                _, tr = m.run_with_trace(torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
        elif case == "transformer_2017":
            from model import Transformer, TransformerConfig

            torch.manual_seed(0)
            m = Transformer(TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=4,
                                              n_encoder_layers=2, n_decoder_layers=2, d_ff=32, dropout=0.0,
                                              max_len=32)).eval()
            src, tgt = torch.randint(3, 20, (1, 7)), torch.randint(3, 20, (1, 5))
            with torch.no_grad():
                _, tr = m.run_with_trace(src, tgt)
            tr = tr.with_meta({**tr.meta, "src_tokens": [f"s{i}" for i in src[0].tolist()],
                               "tgt_tokens": [f"t{i}" for i in tgt[0].tolist()]})
        else:
            if case in MORE_WIRINGS:
                d = tmp_path_factory.mktemp(case)
                test_families.build(case, families=MORE_WIRINGS).save_pretrained(d)
                m = load_hf_dir(d).model
            elif case == "falcon_mqa":  # a model type the lab has no family for: transformers' own modules
                d = tmp_path_factory.mktemp(case)
                torch.manual_seed(0)
                cfg = transformers.AutoConfig.for_model("falcon", vocab_size=V, **FALCON)
                transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").save_pretrained(d)
                m = load_hf_dir(d).model
            else:
                m = models(case)
            with torch.no_grad():
                _, tr = m.run_with_trace(x)
            tr = tr.with_meta({**tr.meta, "tgt_tokens": [f"w{i}" for i in x[0].tolist()]})
        cache[case] = tr
        get.models[case] = m
        return tr

    get.models = {}  # case -> the model its trace came from
    return get


def attention(tr) -> dict[str, dict]:
    return described(tr.meta)["attention"]


def by_kind(tr) -> dict[str, list[str]]:
    """kind -> its modules in layer order (what nb.module(trace, layer, kind) picks)."""
    out: dict[str, list[str]] = {}
    for name, info in attention(tr).items():
        out.setdefault(info["kind"], []).append(name)
    return out


def wiring(case: str) -> tuple[int, int]:
    """(H, H_kv) of the case's first attention module, from the captured shapes (q: H heads, k: H_kv)."""
    return {"gqa_3to1": (6, 2), "mqa": (4, 1), "falcon_mqa": (4, 1)}.get(case, (0, 0))


# ---------------------------------------------------------------- every view, every head


def draw_every_view(tr, heads: str) -> int:
    """Every figure builder that reads the trace and every notebook view, on every attention module: for every
    query head (heads="all") or, kept quick, its last one ("last": the head a K/V-axis index would overrun first),
    with the views of a whole module on each kind's first layer only. Returns how many (module, head) pairs drew."""
    meta = tr.meta
    drawn = 0
    for kind, mods in by_kind(tr).items():
        nb.model_view(tr, kind)
        for layer, name in enumerate(mods):
            info = {"module": name, **attention(tr)[name]}
            H = tr[f"{name}.weights"].shape[1]
            assert F.kv_group(tr, name) == (H, tr[f"{name}.k"].shape[1])  # the description agrees with the shapes
            if heads == "all" or layer == 0:
                nb.heads(tr, layer, kind)
                F.scaling_figure(tr, name)
                FL.wo_figure(FL.head_outputs(tr, name), tr[f"{name}.out"][0], FL.side_tokens(tr, name), name)
            n_q, n_k = tr[f"{name}.weights"].shape[2:]
            labels = F.axis_labels(meta, name, n_q, n_k)
            modern = FM.is_modern(info)
            for h in range(H) if heads == "all" else [H - 1]:
                nb.head(tr, layer, h, kind, scores=True)
                nb.pipeline(tr, layer, h, kind)  # the model's own pipeline where it is not the paper's ...
                if modern:  # ... and the other builder too
                    F.score_pipeline(tr, name, h, rows=(0, min(4, n_q)))
                else:
                    FM.described_pipeline(tr, name, h, info, labels=labels)
                nb.masks(tr, layer, h, kind)  # the sliding-window masks on a sliding layer, else mask_figure
                if info.get("window"):
                    F.mask_figure(tr, name, h)
                # (Q · K · V · z: test_qkvz_... draws it for every head of every module on each of REPS and checks
                # its panels; every_head runs on REPS too, so drawing it here again would prove nothing more)
                steps = FL.query_steps(tr, name, h, n_q - 1)
                FL.query_figure(FL.query_window(steps, slice(n_k // 2, n_k)), labels[0][-1], labels[1])
                drawn += 1
    if meta["model"]["family"] == "decoder_lm":  # (a model via transformers: /architecture says what it lacks)
        desc = meta["model"]
        for layer in range(desc["stacks"]["decoder"]["layers"] if heads == "all" else 1):
            FA.lm_architecture_figure(desc, 1, T, layer)
    elif meta["model"]["family"] == "transformer":
        FA.architecture_figure(meta["config"], 1, 7, 5)
    return drawn


@pytest.mark.parametrize("case", ONE_PER_WIRING)
def test_every_view_draws(case, traces):
    tr = traces(case)
    assert draw_every_view(tr, "last") == len(attention(tr))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(REPS))
def test_every_view_draws_every_head(case, traces):
    tr = traces(case)
    assert draw_every_view(tr, "all") == sum(a["n_heads"] for a in attention(tr).values())


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in REPS if c != "falcon_mqa"])  # the adapter gives no norms: /layer says so
def test_residual_views_draw_every_layer(case, traces):
    """/layer's residual stream and wiring around every sublayer (an attention-only model: its one sublayer)."""
    tr = traces(case)
    if case == "attention_only":
        assert FL.sublayers(tr, "decoder.layers.0") == [("self_attn", "norm1")]
    for stack in described(tr.meta)["stacks"]:
        for layer in FL.layers_of(tr, stack):
            for sub, _ in FL.sublayers(tr, layer):
                steps = FL.residual_steps(tr, layer, sub)
                tokens = FL.side_tokens(tr, f"{layer}.out")
                FL.residual_figure(steps, tokens, len(tokens) - 1)
                kind = FL.wiring_kind(tr)
                if kind in ("pre", "post-ln"):
                    FL.wiring_figure(steps, kind == "pre", 0, sub, norm=FL.norm_kind(tr))
                else:
                    FL.model_wiring_figure(steps, kind, 0, sub, norm=FL.norm_kind(tr))


# ---------------------------------------------------------------- the K/V head a view names is the one it draws


def panel(fig, title_start: str):
    """The heatmap under the subplot whose title starts with `title_start` (its z, float32 as drawn)."""
    titles = [a.text for a in fig.layout.annotations]
    i = next(i for i, text in enumerate(titles) if text.startswith(title_start))
    return np.asarray(fig.data[i].z)


@pytest.mark.parametrize("case", [c if c in WIRINGS else pytest.param(c, marks=pytest.mark.slow) for c in REPS])
def test_qkvz_draws_the_k_and_v_of_the_kv_head_it_names(case, traces):
    tr = traces(case)
    for kind, mods in by_kind(tr).items():
        for layer, name in enumerate(mods):
            q, k, v, z = (F.arr(tr[f"{name}.{r}"])[0] for r in ("q", "k", "v", "z"))
            H, H_kv = q.shape[0], k.shape[0]  # from the shapes, not from the description the figure reads
            if wiring(case)[0]:
                assert (H, H_kv) == wiring(case)
            for h in range(H):
                g = h // (H // H_kv)
                fig = nb.qkvz(tr, layer, h, kind)
                assert np.array_equal(panel(fig, "Q (queries)"), q[h])
                assert np.array_equal(panel(fig, "z = "), z[h])
                assert np.array_equal(panel(fig, "K (keys)"), k[g])
                assert np.array_equal(panel(fig, "V (values)"), v[g])
                title = fig.layout.title.text.split("<br>")[0]
                titles = [a.text for a in fig.layout.annotations]
                if H_kv == H:  # every head its own K and V: nothing to say
                    assert "K/V head" not in title and "K/V head" not in "".join(titles)
                    continue
                readers = [r for r in range(H) if r // (H // H_kv) == g]
                said = (f"K/V head 0, shared by all {H} query heads" if H_kv == 1 else
                        f"K/V head {g}, shared by query heads {readers[0]}–{readers[-1]}")
                assert title.endswith("K, V: " + said), title
                assert f"K (keys) · K/V head {g}" in titles and f"V (values) · K/V head {g}" in titles
                hover = [d.hovertemplate for d in fig.data]
                assert sum(f"<br>k[K/V head {g}] = " in s for s in hover) == 1, hover


@pytest.mark.parametrize("case", ["gqa_3to1", "mqa", "llama3", "falcon_mqa"])
def test_one_query_step_by_step_reads_the_same_kv_head(case, traces):
    """/layer's soft lookup: q·k_i is q of head h against the keys of K/V head h // group, p_i v_i its values, and
    the panels' titles name that K/V head where it is shared."""
    tr = traces(case)
    name = next(iter(attention(tr)))
    q, k, v = (F.arr(tr[f"{name}.{r}"])[0].astype(np.float64) for r in ("q", "k", "v"))
    H, H_kv = q.shape[0], k.shape[0]
    assert H_kv < H
    for h in range(H):
        g = h // (H // H_kv)
        s = FL.query_steps(tr, name, h, T - 1)
        assert int(s["kv_head"]) == g
        assert np.allclose(s["qk"], k[g] @ q[h, T - 1], rtol=0, atol=1e-12)
        assert np.allclose(s["pv"], s["weights"][:, None] * v[g], rtol=1e-6, atol=1e-7)
        fig = FL.query_figure(s, "q", [str(i) for i in range(T)])
        titles = [a.text for a in fig.layout.annotations]
        assert titles[0].endswith(F.kv_label(H, H_kv, h)) and titles[4].endswith(F.kv_label(H, H_kv, h))


@pytest.mark.parametrize("case", ["gqa_3to1", "mqa", "mistral", "falcon_mqa"])
def test_the_qk_map_reads_the_kv_head_of_each_query_head(case, traces):
    tr = traces(case)
    desc = described(tr.meta)
    arrays = {f"{m}.{r}": F.arr(tr[f"{m}.{r}"])[0] for m in desc["attention"] for r in ("q", "k", "weights")}
    batch = FQ.QKBatch(desc, ["x"], [{"tgt_tokens": tr.meta["tgt_tokens"]}], [arrays])
    for name in desc["attention"]:
        H, H_kv = F.kv_group(tr, name)
        for h in range(H):
            m = FQ.qk_map(batch, name, h)
            assert m.kv_head == h // (H // H_kv)
            FQ.qk_figure(m, batch.labels)


@pytest.mark.parametrize("case", ["gqa_3to1", "mqa"])
@torch.no_grad()
def test_a_lazy_trace_draws_the_same_kv_heads(case, traces):
    """A long prompt's trace stores q, k, v and computes weights when asked: the head outputs /layer draws from it
    (weights · v of K/V head h // group) are the captured z, and Q · K · V · z draws the same K and V."""
    full = traces(case)
    _, lazy = traces.models[case].run_with_trace(test_residual.ids(T), lazy=True)
    for name in attention(full):
        H, H_kv = F.kv_group(lazy, name)
        assert (H, H_kv) == (full[f"{name}.q"].shape[1], full[f"{name}.k"].shape[1])
        z = F.arr(full[f"{name}.z"])[0]
        assert np.allclose(FL.head_outputs(lazy, name), z, rtol=0, atol=1e-6 * max(1.0, float(np.abs(z).max())))
        k = F.arr(full[f"{name}.k"])[0]
        for h in range(H):
            assert np.array_equal(panel(F.qkvz_figure(lazy, name, h), "K (keys)"), k[h // (H // H_kv)])


# ---------------------------------------------------------------- texts that describe heads


def test_the_texts_say_what_each_model_has(traces):
    from viz.ui.attention_views import heads_text, qkvz_text

    toy = traces("transformer_2017")
    name = next(iter(attention(toy)))
    assert heads_text(toy, name).startswith("Multi-head attention: h heads, each with its own W^Q, W^K, W^V")
    assert "K/V head" not in qkvz_text(toy, name, 1)

    gqa = traces("gqa_3to1")
    name = next(iter(attention(gqa)))
    text = heads_text(gqa, name)
    assert text.startswith("Grouped-query attention: 6 query heads share 2 K/V heads. Each query head has its own "
                           "W^Q (d_model × d_k); every 3 share one W^K and one W^V"), text
    assert "each with its own W^Q, W^K, W^V" not in text
    assert text.endswith("Here d_model = h × d_k = 6 × 16 = 96.")
    assert "query head 4 reads K/V head 1, shared by query heads 3–5" in qkvz_text(gqa, name, 4)

    for case in ("mqa", "falcon_mqa"):  # the lab's own Llama and Falcon through transformers
        tr = traces(case)
        name = next(iter(attention(tr)))
        text = heads_text(tr, name)
        assert text.startswith("Multi-query attention: 4 query heads share one K/V head."), (case, text)
        assert "each with its own W^Q, W^K, W^V" not in text
        assert "all 4 query heads read them" in qkvz_text(tr, name, 2)
    text = heads_text(traces("mqa"), "decoder.layers.0.self_attn")
    assert text.endswith("Here h × d_k = 4 × 32 = 128, which W^O maps back to d_model = 64.")  # not d_model = h × d_k

    # grouped 2:1 with h·d_k = d_model: the sizes sentence is the 2017 one
    tr = traces("llama")
    name = next(iter(attention(tr)))
    text = heads_text(tr, name)
    assert "4 query heads share 2 K/V heads" in text and "every 2 share one W^K and one W^V" in text
    assert text.endswith("Here d_model = h × d_k = 4 × 16 = 64.")


def test_the_texts_in_chinese():
    from viz.i18n import t

    assert t("K/V head {g}, shared by query heads {a}–{b}", lang="zh", g=1, a=3, b=5) == "K/V 头 1，由查询头 3–5 共享"
    text = t("Grouped-query attention: {h} query heads share {kv} K/V heads. Each query head has its own W^Q "
             "(d_model × d_k); every {r} share one W^K and one W^V, so query head h reads K/V head ⌊h / {r}⌋.",
             lang="zh", h=9, kv=3, r=3)
    assert text.startswith("分组查询注意力：9 个查询头共享 3 个 K/V 头")


# ---------------------------------------------------------------- a wrong head is a sentence


def test_a_head_out_of_range_is_a_sentence(traces):
    tr = traces("gqa_3to1")
    said = r"head 6 is out of range: decoder\.layers\.0\.self_attn has query heads 0\.\.5"
    for view in (nb.qkvz, nb.pipeline, nb.masks, nb.head):
        with pytest.raises(ValueError, match=said):
            view(tr, 0, 6)


# ---------------------------------------------------------------- the Attention page on SmolLM2


@pytest.mark.slow
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_attention_page_on_smollm2_draws_qkvz_on_heads_0_3_8(lang):
    """Issue 38: heads 3-8 raised IndexError (index 3 out of bounds for K/V axis of size 3), heads 1 and 2 drew K/V
    heads 1 and 2 instead of 0. Now each draws K/V head h // 3, said in the figure and the caption."""
    from conftest import APP, plotly_array
    from streamlit.testing.v1 import AppTest
    from test_i18n import english_in_zh

    from viz.ui import lm_models

    text = "When Mary and John went to the store, John gave a drink to"
    _, trace = lm_models.load("smollm2").obj.run_with_trace(text, names=["*.17.self_attn.k", "*.17.self_attn.v"])
    name = "decoder.layers.17.self_attn"
    for head in (0, 3, 8):
        at = AppTest.from_file(APP, default_timeout=600)
        at.query_params.update({"checkpoint": "smollm2", "lang": lang, "text": text, "layer": "17",
                                "head": str(head), "view": "qkvz"})
        at.switch_page("viz/pages/attention.py")
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert not at.error, [e.value for e in at.error]
        specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
        qkvz = [s for s in specs if "d_k = 64" in s["layout"]["title"]["text"]]
        assert len(qkvz) == 1, [s["layout"]["title"]["text"] for s in specs]
        g = head // 3
        said = {"en": f"K/V head {g}, shared by query heads {3 * g}–{3 * g + 2}",
                "zh": f"K/V 头 {g}，由查询头 {3 * g}–{3 * g + 2} 共享"}[lang]
        assert said in qkvz[0]["layout"]["title"]["text"]
        captions = " ".join(c.value for c in at.caption)
        assert said in captions, captions
        for role in ("k", "v"):  # the panel the hover names is that K/V head's tensor, as captured
            (drawn,) = [d for d in qkvz[0]["data"] if f"<br>{role}[K/V head {g}] = " in d["hovertemplate"]]
            assert np.array_equal(plotly_array(drawn["z"]), trace[f"{name}.{role}"][0, g].float().numpy()), head
        if lang == "zh":  # (shapes such as "(B, L, h, d_k)" read as English words to the detector: notation)
            shapes = re.compile(r"^caption: '(?:[A-Za-z], )+[A-Za-z]' in ")
            assert not [e for e in english_in_zh(at) if not shapes.match(e)], english_in_zh(at)
    # "All heads" says what SmolLM2 has: 9 query heads sharing 3 K/V heads, not "each with its own W^K, W^V"
    at = AppTest.from_file(APP, default_timeout=600)
    at.query_params.update({"checkpoint": "smollm2", "lang": lang, "text": text, "layer": "17", "view": "heads"})
    at.switch_page("viz/pages/attention.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    captions = " ".join(c.value for c in at.caption)
    said = {"en": "Grouped-query attention: 9 query heads share 3 K/V heads. Each query head has its own W^Q",
            "zh": "分组查询注意力：9 个查询头共享 3 个 K/V 头。每个查询头有自己的 W^Q"}[lang]
    assert said in captions and "each with its own W^Q, W^K, W^V" not in captions, captions
    if lang == "zh":
        assert not english_in_zh(at), english_in_zh(at)
