"""Any other causal LM through transformers' own modules (issue 32 §2-3, model/loaders/adapter.py).

Tiny random models of types the lab has no family for (OLMo, Falcon with and without grouped K/V heads, OPT,
BLOOM, Persimmon, GPTBigCode, MPT, GPT-J, CodeGen, XGLM, BioGPT), built by transformers' AutoConfig.for_model +
save_pretrained (no download), each once per module when a test first asks for it:
- the adapter's attention weights and logits equal transformers' own output_attentions and logits (bit for bit),
  its residual after each layer is transformers' hidden state, its unembedding gives the logits, greedy tokens
  equal transformers' generate; describe() says family decoder_lm_adapter, what it gives and what it lacks;
- each head's q, k, v (split from transformers' own q/k/v linear layers the way each model type does) and z:
  z = weights·v, softmax(scores + mask) = weights with the scores q·kᵀ·scale after the model's own rotary, and for
  ALiBi (BLOOM) softmax(q·kᵀ/√d + transformers' own ALiBi bias + mask) = weights;
- hooks: zeroing a head's z equals zeroing W^O's columns for it, patching a layer's output with another run's
  gives that run's logits, a hook inside transformers' attention is refused in one sentence, generation runs
  under hooks;
- a state-space model (Mamba), a hybrid and an encoder-decoder are refused in one sentence naming the mechanism,
  a truncated weights file with the existing clear error;
- every page opens on one adapter model in en and zh (AppTest) with no exception and no error element, and the
  pages that need the lab's own family say so in one sentence;
- the Q/K map draws a model whose q and k are what its softmax compares (Falcon, OPT: its batch holds transformers'
  own weights), and says why not for ALiBi (BLOOM) and for a prompt longer than the map keeps.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import APP, model_page, tiny_bpe_tokenizer
from streamlit.testing.v1 import AppTest
from test_i18n import english_in_zh
from tolerance import f32_tol

from model.loaders.hf import LM_TYPES, ModelLoadError, load_hf_dir
from viz.ui import lm_models

transformers = pytest.importorskip("transformers")

# case -> (model type, config overrides, how q and k are given: "rotated" after the model's own rotary with the
# scores, "raw" with the scores (no rotary), "alibi" without the scores); none of them a family of the lab's
CASES = {"olmo": ("olmo", {}, "rotated"), "falcon": ("falcon", {}, "rotated"),
         "falcon-gqa": ("falcon", dict(new_decoder_architecture=True, num_kv_heads=2), "rotated"),
         "opt": ("opt", {}, "raw"), "bloom": ("bloom", {}, "alibi"), "persimmon": ("persimmon", {}, "rotated"),
         "gpt_bigcode": ("gpt_bigcode", {}, "raw"), "mpt": ("mpt", {}, "alibi"),
         "gptj": ("gptj", dict(rotary_dim=8), "rotated"), "codegen": ("codegen", dict(rotary_dim=8), "rotated"),
         "xglm": ("xglm", {}, "raw"), "biogpt": ("biogpt", {}, "raw")}
TYPES = tuple(CASES)
COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=256, bos_token_id=0, eos_token_id=0, pad_token_id=0)
PROMPT = "When Mary and John went to the store, John gave a drink to"


def save(d, case: str):
    kind, extra, _ = CASES[case]
    tok = tiny_bpe_tokenizer(d)
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(kind, vocab_size=tok.get_vocab_size(), **COMMON, **extra)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ref.save_pretrained(d, safe_serialization=True)
    return ref


class _Made(dict):
    """case -> (directory, transformers' own model), each built when first asked for (once per module)."""

    def __init__(self, factory):
        super().__init__()
        self.factory = factory

    def __missing__(self, case):
        d = self.factory.mktemp(case)
        self[case] = (d, save(d, case))
        return self[case]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return _Made(tmp_path_factory)


@pytest.fixture(scope="module")
def opened(made):
    """case -> the adapter's LanguageModel on it, each loaded once."""
    cache = {}

    def get(case):
        if case not in cache:
            cache[case] = load_hf_dir(made[case][0])
        return cache[case]

    return get


@pytest.mark.parametrize("kind", TYPES)
def test_the_adapter_equals_transformers(made, opened, kind):
    assert CASES[kind][0] not in LM_TYPES
    d, ref = made[kind]
    lm = opened(kind)
    ids = lm.encode(PROMPT)
    logits, trace = lm.run_with_trace(ids)
    with torch.no_grad():
        out = ref(ids, output_attentions=True, output_hidden_states=True)
    L = ref.config.num_hidden_layers
    assert torch.equal(logits, out.logits) and torch.equal(trace["logits"], out.logits)
    for i in range(L):
        w = trace[f"decoder.layers.{i}.self_attn.weights"]
        assert w.shape == (1, 4, ids.shape[1], ids.shape[1])
        assert torch.equal(w, out.attentions[i])  # bit for bit transformers' output_attentions
        if i < L - 1:
            assert torch.equal(trace[f"decoder.layers.{i}.out"], out.hidden_states[i + 1])
    assert torch.equal(trace["decoder.embed.out"], out.hidden_states[0])
    # the final norm + lm_head give the logits exactly: the logit lens reads layers through them
    assert torch.equal(lm.model.unembed(trace[f"decoder.layers.{L - 1}.out"]), out.logits)
    # capture names: the trace holds exactly them, with their shapes
    shapes = lm.model.capture_names(1, ids.shape[1])
    assert list(trace) == list(shapes) and all(tuple(trace[n].shape) == s for n, s in shapes.items())
    desc = trace.meta["model"]
    assert desc["family"] == "decoder_lm_adapter" and desc["via"] == "transformers"
    assert desc["stacks"]["decoder"]["layers"] == L and len(desc["attention"]) == L
    assert desc["attention"]["decoder.layers.0.self_attn"]["n_heads"] == 4
    assert not any(x.startswith("q, k and v") for x in desc["lacks"])  # every one of these types gives them
    assert any("hooks on q, k, v" in x for x in desc["lacks"]) and "decoder.layers.1.self_attn.z" in desc["blocks"][
        "hooks"]
    assert "via transformers" in repr(lm)
    # greedy generation equals transformers' generate, and each step's attention row is its output_attentions
    gen = lm.generate(ids, max_new_tokens=4)
    want = ref.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    want = want[0, ids.shape[1]:].tolist()  # transformers runs on past the end token; the lab stops at it
    assert gen.ids == want[:len(gen.ids)] and (len(gen.ids) == 4 or gen.ids[-1] in lm.stop_ids)
    assert gen.steps[0].attention.shape == (L, 4, ids.shape[1])
    torch.testing.assert_close(gen.steps[0].attention[:, :, :], torch.stack([a[0, :, -1] for a in out.attentions]),
                               rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="via transformers cannot change .*inside transformers' attention"):
        lm.run_with_trace(ids, hooks={"*.weights": lambda x, name: x})


@pytest.mark.parametrize("kind", TYPES)
def test_each_heads_q_k_v_and_z_reproduce_transformers_weights(made, opened, kind):
    """q, k, v, z of every head, split from transformers' own linear layers, give transformers' own weights:
    z = weights·v, softmax(scores + mask) = weights (scores = q·kᵀ·scale after the model's own rotary); with ALiBi
    (BLOOM), softmax(q·kᵀ/√d + transformers' own ALiBi bias + mask) = weights, and the scores are not claimed."""
    lm, how = opened(kind), CASES[kind][2]
    ids = lm.encode(PROMPT)
    _, tr = lm.run_with_trace(ids)
    T, kv = ids.shape[1], 2 if kind == "falcon-gqa" else {"falcon": 1, "gpt_bigcode": 1}.get(kind, 4)
    desc = tr.meta["model"]
    assert lm.model.heads["qk"] == how and (lm.model.heads["scores"] is (how != "alibi"))
    for i in range(2):
        n = f"decoder.layers.{i}.self_attn"
        w, q, k, v, z = (tr[f"{n}.{r}"] for r in ("weights", "q", "k", "v", "z"))
        assert q.shape == (1, 4, T, 16) and k.shape == v.shape == (1, kv, T, 16) and z.shape == (1, 4, T, 16)
        assert desc["attention"][n]["n_kv_heads"] == kv
        vv = v.repeat_interleave(4 // kv, dim=1)  # query head h reads K/V head h // (H / H_kv)
        torch.testing.assert_close(z, w @ vv, rtol=0, atol=f32_tol(vv, n=T))
        if how == "alibi":
            assert f"{n}.scores" not in tr.names() and any("ALiBi" in x for x in desc["lacks"])
            if kind == "bloom":  # transformers' own ALiBi tensor: (B*H, 1, T), added to q·kᵀ/√d
                from transformers.models.bloom.modeling_bloom import build_alibi_tensor

                bias = build_alibi_tensor(torch.ones(1, T), 4, torch.float32).view(1, 4, 1, T)
                scores = q @ k.transpose(-1, -2) / 4.0 + bias
                causal = torch.ones(T, T, dtype=torch.bool).triu(1)
                got = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
                torch.testing.assert_close(got, w, rtol=0, atol=f32_tol(scores, n=16))
            continue
        scores, mask = tr[f"{n}.scores"], tr[f"{n}.mask"]
        assert torch.equal(mask[0, 0], torch.ones(T, T, dtype=torch.bool).triu(1))
        got = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        torch.testing.assert_close(got, w, rtol=0, atol=f32_tol(scores, n=16))
        torch.testing.assert_close(scores, q @ k.repeat_interleave(4 // kv, dim=1).transpose(-1, -2)
                                   * lm.model.heads["scale"][i], rtol=0, atol=f32_tol(scores, n=16))
        if how == "rotated":  # the unrotated ones too; position 0 is not rotated (angle 0)
            qu = tr[f"{n}.q_unrot"]
            assert qu.shape == q.shape and not torch.allclose(qu, q)
            torch.testing.assert_close(qu[:, :, 0], q[:, :, 0], rtol=0, atol=f32_tol(q))


@pytest.mark.parametrize("kind", ["opt", "falcon-gqa"])
def test_hooks_zero_a_head_and_patch_the_residual_exactly(made, opened, kind):
    """The lab's interventions through transformers' modules: zeroing head 2's z of layer 1 (a pre-hook on W^O's
    input) equals transformers with W^O's input columns of that head zeroed; patching layer 0's output with another
    prompt's (a forward hook on the layer) gives that prompt's logits; a hook on q is refused in one sentence;
    greedy generation runs under the hook."""
    import copy

    from model import interventions as iv

    _, ref = made[kind]
    lm = opened(kind)
    ids = lm.encode(PROMPT)
    T = ids.shape[1]
    ablated = lm.run_with_hooks(ids, hooks=iv.ablate_head("decoder.layers.1.self_attn", 2))
    cut = copy.deepcopy(ref)
    wo = lm.model.taps[1].out  # the adapter's W^O of layer 1: find the same module in the copy
    name = next(n for n, m in lm.model.hf.named_modules() if m is wo)
    with torch.no_grad():
        cut.get_submodule(name).weight[:, 2 * 16:3 * 16] = 0
        want = cut(ids).logits
        plain = ref(ids).logits
    torch.testing.assert_close(ablated, want, rtol=0, atol=f32_tol(want, n=64))
    assert (ablated - plain).abs().max() > 100 * f32_tol(want, n=64)  # the hook did something
    _, tr = lm.run_with_trace(ids, hooks=iv.ablate_head("decoder.layers.1.self_attn", 2))
    assert torch.equal(tr["decoder.layers.1.self_attn.z"][:, 2], torch.zeros(1, T, 16))  # the trace records it
    other = lm.encode("When Tom and Anna went to the park, Anna gave a ball to")[:, :T]
    clean, ctr = lm.run_with_trace(other, names="decoder.layers.0.out")
    src = ctr["decoder.layers.0.out"]
    patched = lm.run_with_hooks(ids, hooks={"decoder.layers.0.out": lambda t, n: src.clone()})
    torch.testing.assert_close(patched, clean, rtol=0, atol=f32_tol(clean, n=64))
    one = lm.run_with_hooks(ids, hooks={"decoder.layers.0.out": lambda t, n: torch.cat([t[:, :-1], src[:, -1:]], 1)})
    assert torch.equal(one[:, :-1], lm.model(ids)[:, :-1])  # causal: a patch at the last position changes only it
    assert lm.model.hook_names()[:2] == ["decoder.embed.tok", "decoder.embed.out"]  # layer 0's input: a pre-hook
    other_embed = lm.run_with_trace(other, names="decoder.embed.out")[1]["decoder.embed.out"]
    torch.testing.assert_close(lm.run_with_hooks(ids, hooks={"decoder.embed.out": lambda t, n: other_embed.clone()}),
                               clean, rtol=0, atol=f32_tol(clean, n=64))
    with pytest.raises(ValueError, match="cannot change 'decoder.layers.0.self_attn.q'"):
        lm.run_with_hooks(ids, hooks={"decoder.layers.0.self_attn.q": lambda t, n: t})
    gen = lm.generate(ids, max_new_tokens=2, hooks=iv.ablate_head("decoder.layers.1.self_attn", 2))
    assert gen.ids[0] == int(ablated[0, -1].argmax())


@pytest.mark.parametrize("hf, words", [
    ({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}, "state-space (Mamba) layers, not attention"),
    ({"model_type": "jamba", "architectures": ["JambaForCausalLM"]}, "hybrid of state-space (Mamba) and attention"),
    ({"model_type": "rwkv", "architectures": ["RwkvForCausalLM"]}, "RWKV recurrences"),
    ({"model_type": "t5", "is_encoder_decoder": True}, "encoder-decoder"),
    ({"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"]}, "linear-attention"),
])
def test_other_mechanisms_are_refused_in_one_sentence(tmp_path, hf, words):
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ModelLoadError) as e:
        load_hf_dir(tmp_path)
    msg = str(e.value)
    assert f"{hf['model_type']!r} is not supported" in msg and words in msg and "\n" not in msg
    assert all(t in msg for t in LM_TYPES)


def test_a_type_transformers_has_no_causal_lm_for_is_refused(tmp_path, made):
    d, _ = made["olmo"]
    for f in d.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"model_type": "no_such_type"}))
    with pytest.raises(ModelLoadError, match="'no_such_type' is not supported: transformers .* has no causal"):
        load_hf_dir(tmp_path)


def test_a_truncated_weights_file_gets_the_clear_error(tmp_path, made):
    d, _ = made["mpt"]
    for f in d.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (st,) = tmp_path.glob("*.safetensors")
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
    with pytest.raises(ModelLoadError) as e:
        load_hf_dir(tmp_path)
    assert "truncated" in str(e.value) or "corrupt" in str(e.value), str(e.value)


def test_pickles_only_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "falcon", "architectures": ["FalconForCausalLM"]}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(ModelLoadError, match="safetensors only"):
        load_hf_dir(tmp_path)


# ---------------------------------------------------------------- the app

PAGES = ["lessons", "architecture", "tokens", "tokenizers", "attention", "layer", "padding", "decoder", "pretrained",
         "llm", "phenomena", "qk", "since2017", "experiments", "schedule", "training", "snapshots", "flow", "learn"]


@pytest.fixture(scope="module")
def served(made):
    (label,) = lm_models.add_server_models([str(made["falcon"][0])])
    return label


def infos(at) -> str:
    return "\n".join(str(e.value) for kind in ("info", "markdown", "caption") for e in at.get(kind))


# Pages that need the lab's own family (q/k/v, z, norms, FFN internals, hooks, a toy task) say so in one sentence;
# Attention (head heatmap, all heads, model view), Language model (heads overview, generation, logit lens) and the
# Q/K map (where the probe found q and k exact) draw.
SAYS = ("architecture", "tokens", "layer", "padding", "decoder", "phenomena", "experiments", "snapshots", "flow")
DRAWS = ("attention", "llm", "qk")  # the Q/K map: where q and k are exact (Falcon: after its own rotary)
SAID = {"en": "runs via transformers, not one of the lab's own families",
        "zh": "通过 transformers 运行，不是本实验室自己的模型族"}


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_page_opens_on_an_adapter_model(served, lang):
    for page in PAGES:
        at = model_page(served, page, lang)
        if page in SAYS:
            assert SAID[lang] in infos(at), page
            assert not at.get("plotly_chart"), page
        if page in DRAWS:
            assert at.get("plotly_chart") and SAID[lang] not in infos(at), page
        if lang == "zh" and page in ("architecture", "attention", "llm", "qk"):
            assert not english_in_zh(at), (page, english_in_zh(at))
    said = infos(model_page(served, "layer", lang))
    words = {"en": ("(via transformers, started with the server)", "each head's v and output z, q, k and the scores",
                    "but not the norms inside a layer"),
             "zh": ("（经 transformers 运行，随服务器启动）", "每个头的 v 和输出 z、q、k 和分数",
                    "但不给出层内的各个归一化")}
    # the label, and what this model gives (Falcon: q and k after its rotary, the scores, z) and lacks
    assert all(w in said for w in words[lang]), said


@pytest.mark.parametrize("view, draws", [("heads", True), ("model", True), ("pipeline", False), ("masks", False),
                                         ("qkvz", False), ("sqrt", False)])
def test_attention_views_draw_weights_or_say_what_is_missing(served, view, draws):
    at = model_page(served, "attention", view=view)
    assert (SAID["en"] in infos(at)) is not draws


def test_language_model_page_draws_the_lens_and_says_via_transformers(served, made):
    from model.analysis import logit_lens as LL

    at = model_page(served, "llm", view="lens")
    assert at.get("plotly_chart") and "Via transformers: falcon" in infos(at) and "a falcon model" in infos(at)
    lm = lm_models.load(served).obj
    ids = lm.encode(PROMPT)
    lens = LL.logit_lens(lm, ids)
    logits, _ = lm.run_with_trace(ids, names="logits")
    assert (lens.top_ids[-1] == logits[0].argmax(-1).numpy()).all()  # the lens's last row is the model's own answer
    for view in ("heads", "generate"):
        assert "Via transformers" in infos(model_page(served, "llm", "en", view=view))


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_why_here_on_an_adapter_model_says_it_has_no_decomposition(served, lang):
    """/llm's heads view with `?why=Q,K` on a model opened through transformers: the panel opens on the cell and says
    model.analysis.why's one sentence (no residual decomposition, so no split of the score), draws no split, and
    nothing raises (model_page fails on an exception or an error element)."""
    from model.analysis import why as W
    from viz.i18n import t

    lm = lm_models.load(served).obj
    with pytest.raises(ValueError) as err:  # the analysis's own sentence, with the name the panel gives
        W.explain_score(lm, lm.encode(PROMPT), 1, 0, 5, 2)
    assert str(err.value) == W.NO_DECOMPOSITION.format(name=lm.name)
    at = model_page(served, "llm", lang, view="heads", layer=1, head=0, why="5,2", prompt=PROMPT)
    assert at.toggle(key="llm_why").value is True
    assert at.number_input(key="llm_why_q").value == 5 and at.number_input(key="llm_why_k").value == 2
    said = [i.value for i in at.info if t(W.NO_DECOMPOSITION, lang=lang, name=lm.name) == i.value]
    assert len(said) == 1, [i.value for i in at.info]
    assert not at.get("dataframe")  # no causal check table: nothing was split
    if lang == "zh":
        assert not english_in_zh(at), english_in_zh(at)


def test_the_labs_own_families_never_import_transformers(tmp_path):
    """Loading a Llama (a family of the lab's) in a fresh interpreter, with the adapter module imported, leaves
    transformers unimported: it is a runtime dependency of the adapter's path only (pip extra .[any-model])."""
    import subprocess
    import sys

    tok = tiny_bpe_tokenizer(tmp_path)
    cfg = transformers.AutoConfig.for_model("llama", vocab_size=tok.get_vocab_size(), **COMMON)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path, safe_serialization=True)
    code = ("import sys\nimport model.loaders.adapter\nfrom model import load_model\n"
            f"lm = load_model({str(tmp_path)!r})\nlm.run_with_trace('Hello world')\n"
            "print(type(lm.model).__name__, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["DecoderLM", "False"]


def test_bfloat16_equals_transformers_in_bfloat16(made):
    d, _ = made["opt"]
    lm = load_hf_dir(d, dtype="bfloat16")
    ref = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, attn_implementation="eager")
    ids = lm.encode(PROMPT)
    logits, trace = lm.run_with_trace(ids)
    with torch.no_grad():
        out = ref.eval()(ids, output_attentions=True)
    assert logits.dtype == torch.bfloat16 and torch.equal(logits, out.logits)
    assert all(torch.equal(trace[f"decoder.layers.{i}.self_attn.weights"], a) for i, a in enumerate(out.attentions))


def test_weights_missing_from_the_checkpoint_are_refused_not_made_up(tmp_path, made):
    """transformers fills a tensor the checkpoint lacks with random numbers; the adapter refuses instead."""
    from safetensors.torch import load_file, save_file

    d, _ = made["bloom"]
    for f in d.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (st,) = tmp_path.glob("*.safetensors")
    tensors = load_file(st)
    gone = next(k for k in tensors if "dense_4h_to_h.weight" in k)
    save_file({k: v for k, v in tensors.items() if k != gone}, st, metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="lacks 1 tensors the config describes.*do not match"):
        load_hf_dir(tmp_path)


def test_a_config_that_describes_fewer_layers_than_the_weights_is_refused(tmp_path, made):
    d, _ = made["olmo"]
    for f in d.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"num_hidden_layers": 1}))
    with pytest.raises(ModelLoadError, match="tensors the config does not describe.*do not match"):
        load_hf_dir(tmp_path)


def test_generation_on_the_language_model_page(served):
    at = model_page(served, "llm", view="generate")
    next(b for b in at.button if b.label == "Generate").click().run()
    assert not at.exception and not at.error
    want = lm_models.load(served).obj.generate(PROMPT, max_new_tokens=int(at.number_input(key="llm_max").value))
    assert at.get("plotly_chart") and want.tokens and lm_models.readable(want.tokens[0]) in infos(at) + "".join(
        str(e.value) for e in at.get("code"))


def test_what_the_probe_cannot_check_is_not_given(made, monkeypatch):
    """A fused q/k/v layout the lab does not know (MPT's, removed here) gives no q, k, v or z, and no hook on z; a
    rotary the lab cannot reproduce (OLMo's, made wrong here) gives q_unrot and k_unrot only, no scores; each says
    so in describe()["lacks"]."""
    from model.loaders import adapter_heads as AH

    monkeypatch.delitem(AH.SPLITS, "mpt")
    lm = load_hf_dir(made["mpt"][0])
    names, desc = lm.model.capture_names(), lm.model.describe()
    assert not [n for n in names if n.endswith((".q", ".k", ".v", ".z", ".scores"))]
    assert any(x.startswith("q, k and v (transformers' mpt attention has no q, k, v layers") for x in desc["lacks"])
    with pytest.raises(ValueError, match="matches no name"):
        lm.run_with_hooks(PROMPT, hooks={"decoder.layers.0.self_attn.z": lambda t, n: t})
    monkeypatch.setattr(AH, "rotate", lambda attn, q, k, rot: (q, k))  # "no rotary": not what OLMo does
    lm = load_hf_dir(made["olmo"][0])
    _, tr = lm.run_with_trace(PROMPT, names="decoder.layers.0.self_attn.*")
    assert [n.rsplit(".", 1)[1] for n in tr.names()] == ["q_unrot", "k_unrot", "v", "weights", "z", "out"]
    assert any(x.startswith("q and k after its rotary embedding, and the scores") for x in lm.model.describe()["lacks"])


def test_hooks_of_one_thread_never_reach_another(opened):
    """Streamlit serves sessions from threads sharing one model: the adapter's module hooks read the lab's
    ContextVars, so a head ablation in one thread leaves another thread's logits alone."""
    from concurrent.futures import ThreadPoolExecutor

    from model import interventions as iv

    lm = opened("opt")
    ids = lm.encode(PROMPT)
    plain = lm.model(ids)
    hooks = iv.ablate_head("decoder.layers.*.self_attn", 0)
    ablated = lm.run_with_hooks(ids, hooks=hooks)
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda k: lm.run_with_hooks(ids, hooks=hooks if k % 2 else None), range(16)))
    assert all(torch.equal(o, ablated if k % 2 else plain) for k, o in enumerate(outs))


@pytest.mark.parametrize("kind", ["falcon", "opt"])
def test_the_qk_maps_batch_is_transformers_own_attention(made, opened, kind):
    """The Q/K map of a model via transformers: the batch of 40 sentences, right-padded in one pass, holds for each
    sentence transformers' own weights on that sentence alone, and its q·k·scale, under the causal mask, give them
    back (the picture's premise: nearness in q·k is attention). Falcon rotates q and k, OPT does not."""
    import numpy as np

    from viz.ui import qk_batch as QB

    lm, ref = opened(kind), made[kind][1]
    assert QB.draws_q_k(lm)
    b = QB.lm_batch(lm, "sentences")
    mods = b.modules("decoder_self")
    for i in (0, 17, len(b.labels) - 1):
        ids = lm.encode(b.labels[i])
        with torch.no_grad():
            want = ref(ids, output_attentions=True).attentions
        T = ids.shape[1]
        causal = np.triu(np.ones((T, T), dtype=bool), 1)
        for layer, mod in enumerate(mods):
            a = b.arrays[i]
            w, q, k = a[f"{mod}.weights"], a[f"{mod}.q"], a[f"{mod}.k"]
            assert w.shape == (4, T, T)
            np.testing.assert_allclose(w, want[layer][0].numpy(), rtol=0, atol=f32_tol(1, n=T))
            scores = q @ np.repeat(k, 4 // k.shape[0], axis=0).transpose(0, 2, 1) * lm.model.heads["scale"][layer]
            e = np.exp(np.where(causal, -np.inf, scores - scores.max(-1, keepdims=True)))
            np.testing.assert_allclose(e / e.sum(-1, keepdims=True), w, rtol=0, atol=f32_tol(scores, n=16))


def test_the_qk_map_says_why_alibi_is_not_drawn_and_a_long_text_is_refused(made, monkeypatch):
    """BLOOM adds ALiBi's bias to q·k, so its q/k picture would not be its attention: one sentence, no figure. A
    text over what the map keeps (no lazy trace via transformers) is said in the UI's words, en and zh."""
    from viz.ui import qk_batch as QB

    (bloom,) = lm_models.add_server_models([str(made["bloom"][0])])
    at = model_page(bloom, "qk")
    said = infos(at)
    assert SAID["en"] in said and "the scores (its ALiBi bias is added inside transformers)" in said
    assert not at.get("plotly_chart")
    (falcon,) = lm_models.add_server_models([str(made["falcon"][0])])
    monkeypatch.setattr(QB, "FULL_UP_TO", 8)
    for lang, words in (("en", "too long for the Q/K map"), ("zh", "Q/K 图来说太长了")):
        at = AppTest.from_file(APP, default_timeout=300)
        at.query_params.update({"checkpoint": falcon, "lang": lang, "batch": "prompt", "text": PROMPT})
        at.switch_page("viz/pages/qk.py")
        at.run()
        assert not at.exception and not at.get("plotly_chart")
        assert any(words in str(e.value) and "8" in str(e.value) for e in at.error), [e.value for e in at.error]
