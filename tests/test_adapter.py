"""Any other causal LM through transformers' own modules (issue 32 §2-3, model/loaders/adapter.py).

Tiny random models of types the lab has no family for (OLMo, Falcon, OPT, BLOOM), built by transformers'
AutoConfig.for_model + save_pretrained (no download), once per module:
- the adapter's attention weights and logits equal transformers' own output_attentions and logits (bit for bit),
  its residual after each layer is transformers' hidden state, its unembedding gives the logits, greedy tokens
  equal transformers' generate; describe() says family decoder_lm_adapter, what it gives and what it lacks;
- a state-space model (Mamba), a hybrid and an encoder-decoder are refused in one sentence naming the mechanism;
- every page opens on one adapter model in en and zh (AppTest) with no exception and no error element, and the
  pages that need the lab's own family say so in one sentence.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import APP, tiny_bpe_tokenizer
from streamlit.testing.v1 import AppTest
from test_i18n import english_in_zh

from model.loaders.hf import LM_TYPES, ModelLoadError, load_hf_dir
from viz.ui import lm_models

transformers = pytest.importorskip("transformers")

TYPES = ("olmo", "falcon", "opt", "bloom")  # none of them a family of the lab's
COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=256, bos_token_id=0, eos_token_id=0, pad_token_id=0)
PROMPT = "When Mary and John went to the store, John gave a drink to"


def save(d, model_type: str):
    tok = tiny_bpe_tokenizer(d)
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(model_type, vocab_size=tok.get_vocab_size(), **COMMON)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ref.save_pretrained(d, safe_serialization=True)
    return ref


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """model type -> (directory, transformers' own model), each built once."""
    out = {}
    for kind in TYPES:
        d = tmp_path_factory.mktemp(kind)
        out[kind] = (d, save(d, kind))
    return out


@pytest.mark.parametrize("kind", TYPES)
def test_the_adapter_equals_transformers(made, kind):
    assert kind not in LM_TYPES
    d, ref = made[kind]
    lm = load_hf_dir(d)
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
    assert any("q, k and v" in x for x in desc["lacks"]) and any("hooks" in x for x in desc["lacks"])
    assert "via transformers" in repr(lm)
    # greedy generation equals transformers' generate, and each step's attention row is its output_attentions
    gen = lm.generate(ids, max_new_tokens=4)
    want = ref.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert gen.ids == want[0, ids.shape[1]:].tolist()
    assert gen.steps[0].attention.shape == (L, 4, ids.shape[1])
    torch.testing.assert_close(gen.steps[0].attention[:, :, :], torch.stack([a[0, :, -1] for a in out.attentions]),
                               rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="via transformers"):
        lm.run_with_trace(ids, hooks={"logits": lambda x, name: x})


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


def run_page(label: str, page: str, lang: str = "en", **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"checkpoint": label, "lang": lang, **{k: str(v) for k, v in query.items()}})
    at.switch_page(f"viz/pages/{page}.py")
    at.run()
    assert not at.exception, (page, lang, [e.value for e in at.exception])
    assert not at.error, (page, lang, [e.value for e in at.error])
    return at


def infos(at) -> str:
    return "\n".join(str(e.value) for kind in ("info", "markdown", "caption") for e in at.get(kind))


# Pages that need the lab's own family (q/k/v, z, norms, FFN internals, hooks, a toy task) say so in one sentence;
# Attention (head heatmap, all heads, model view) and Language model (heads overview, generation, logit lens) draw.
SAYS = ("architecture", "tokens", "layer", "padding", "decoder", "phenomena", "qk", "experiments", "snapshots", "flow")
DRAWS = ("attention", "llm")
SAID = {"en": "runs via transformers, not one of the lab's own families",
        "zh": "通过 transformers 运行，不是本实验室自己的模型族"}


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_page_opens_on_an_adapter_model(served, lang):
    for page in PAGES:
        at = run_page(served, page, lang)
        if page in SAYS:
            assert SAID[lang] in infos(at), page
            assert not at.get("plotly_chart"), page
        if page in DRAWS:
            assert at.get("plotly_chart") and SAID[lang] not in infos(at), page
        if lang == "zh" and page in ("architecture", "attention", "llm", "qk"):
            assert not english_in_zh(at), (page, english_in_zh(at))
    assert {"en": "(via transformers, started with the server)", "zh": "（经 transformers 运行，随服务器启动）"}[lang] \
        in infos(run_page(served, "qk", lang))


@pytest.mark.parametrize("view, draws", [("heads", True), ("model", True), ("pipeline", False), ("masks", False),
                                         ("qkvz", False), ("sqrt", False)])
def test_attention_views_draw_weights_or_say_what_is_missing(served, view, draws):
    at = run_page(served, "attention", view=view)
    assert (SAID["en"] in infos(at)) is not draws


def test_language_model_page_draws_the_lens_and_says_via_transformers(served, made):
    from model.analysis import logit_lens as LL

    at = run_page(served, "llm", view="lens")
    assert at.get("plotly_chart") and "Via transformers: falcon" in infos(at) and "a falcon model" in infos(at)
    lm = lm_models.load(served).obj
    ids = lm.encode(PROMPT)
    lens = LL.logit_lens(lm, ids)
    logits, _ = lm.run_with_trace(ids, names="logits")
    assert (lens.top_ids[-1] == logits[0].argmax(-1).numpy()).all()  # the lens's last row is the model's own answer
    for view in ("heads", "generate"):
        assert "Via transformers" in infos(run_page(served, "llm", "en", view=view))


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
    at = run_page(served, "llm", view="generate")
    next(b for b in at.button if b.label == "Generate").click().run()
    assert not at.exception and not at.error
    want = lm_models.load(served).obj.generate(PROMPT, max_new_tokens=int(at.number_input(key="llm_max").value))
    assert at.get("plotly_chart") and want.tokens and lm_models.readable(want.tokens[0]) in infos(at) + "".join(
        str(e.value) for e in at.get("code"))
