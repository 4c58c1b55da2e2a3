"""GGUF files of every family the lab opens, written here the way llama.cpp's convert_hf_to_gguf.py writes
them (gguf-py's tensor names, llama's q/k row permutation, gemma's +1 on norm weights, gpt-neox's regrouped
qkv, qwen2moe's stacked experts, Llama 3's rope_freqs), from tiny random transformers models.

Two checks per family:
- the GGUF side alone: `hf_config` and `hf_tensors` give back the HF config values and the HF tensors the file
  was written from;
- the whole load: `load_model("x.gguf")` logits equal transformers loading the same GGUF
  (`from_pretrained(dir, gguf_file=...)`, eager, fp32) within 1e-5 relative; where transformers' GGUF loader
  lacks the family (gemma, olmo2, gpt-neox) or the mechanism (Llama 3's rope_freqs), the reference is the HF
  model the file was written from.
"""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from safetensors.torch import load_file
from test_gguf import tiny_tokenizer_kv, write_gguf

from model.loaders import gguf as G
from model.loaders import load_model

VOCAB = 300
COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
              pad_token_id=0)
# family -> (transformers model_type, GGUF architecture, extra config, transformers can load its GGUF)
FAMILIES = {
    "llama3": ("llama", "llama", dict(rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}), False),
    "llama": ("llama", "llama", {}, True),
    "llama-linear": ("llama", "llama", dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                             "factor": 4.0}), False),
    "mistral": ("mistral", "llama", dict(sliding_window=None), True),
    "qwen2": ("qwen2", "qwen2", {}, True),
    # head_dim 128: transformers' GGUF loader ignores attention.key_length for qwen3 and assumes 128
    "qwen3": ("qwen3", "qwen3", dict(head_dim=128, num_attention_heads=2, num_key_value_heads=1), True),
    "gemma": ("gemma", "gemma", dict(head_dim=16), False),
    # head_dim 256: GGUF keeps no query_pre_attn_scalar; transformers' GGUF loader assumes 256, llama.cpp head_dim
    "gemma2": ("gemma2", "gemma2", dict(head_dim=256, num_attention_heads=2, num_key_value_heads=1,
                                        query_pre_attn_scalar=256, sliding_window=4), True),
    "gemma3": ("gemma3_text", "gemma3", dict(head_dim=256, num_attention_heads=2, num_key_value_heads=1,
                                             query_pre_attn_scalar=256, sliding_window=4, num_hidden_layers=6), True),
    "phi3": ("phi3", "phi3", {}, True),
    "olmo2": ("olmo2", "olmo2", {}, False),
    "gpt_neox": ("gpt_neox", "gptneox", dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                             "partial_rotary_factor": 0.5}), False),
    # transformers' GGUF loader ignores expert_feed_forward_length and expert_shared_feed_forward_length and
    # assumes Qwen1.5-MoE-A2.7B's 1408 and 5632
    # a Mixtral GGUF says "llama" and holds experts; transformers' GGUF loader reads it as a dense Llama
    "mixtral": ("mixtral", "llama", dict(num_local_experts=4, num_experts_per_tok=2), False),
    "olmoe": ("olmoe", "olmoe", dict(num_experts=4, num_experts_per_tok=2), False),
    "qwen2_moe": ("qwen2_moe", "qwen2moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=1408,
                                               shared_expert_intermediate_size=5632), True),
}


def tiny_hf(family: str, directory) -> tuple[dict, dict[str, torch.Tensor]]:
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, _, extra, _ = FAMILIES[family]
    kw = COMMON | extra
    if model_type == "gpt_neox":
        kw.pop("num_key_value_heads")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **kw))
    with torch.no_grad():  # norms start at 1 (or 0 for gemma): make them random, so a wrong offset shows
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.3 + (0.0 if "gemma" in model_type else 1.0))
    model.save_pretrained(directory)
    return json.loads((directory / "config.json").read_text()), load_file(directory / "model.safetensors")


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (rows of q/k, weights and biases)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(rope: dict, head_dim: int, old_context_len: float) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors for rope_type llama3."""
    import math

    freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    lo, hi, factor = rope["low_freq_factor"], rope["high_freq_factor"], rope["factor"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_context_len / hi:
            out.append(1)
        elif wavelen > old_context_len / lo:
            out.append(factor)
        else:
            smooth = (old_context_len / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


def convert(family: str, hf: dict, sd: dict[str, torch.Tensor], path, qtype=QT.F32, name: str = "tiny", **extra):
    """Write `sd` as llama.cpp's converter would for this family; 2-D weights in `qtype`."""
    _, arch, _, _ = FAMILIES[family]
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    n_layers = hf["num_hidden_layers"]
    names = gguf.get_tensor_name_map(arch_id, n_layers)
    n_head, n_kv = hf["num_attention_heads"], hf.get("num_key_value_heads", hf["num_attention_heads"])
    d = hf["hidden_size"]
    head_dim = hf.get("head_dim") or d // n_head
    tensors: dict[str, tuple[np.ndarray, QT]] = {}
    experts: dict[str, list] = {}
    for hf_name, t in sd.items():
        w = t.float().numpy()
        if hf_name == "lm_head.weight" and hf.get("tie_word_embeddings"):
            continue
        if ".experts." in hf_name:  # stacked per layer and kind, as Qwen2MoeModel / LlamaModel.modify_tensors do
            _, _, i, _, _, j, kind, _ = hf_name.split(".")
            kind = {"w1": "gate", "w2": "down", "w3": "up"}.get(kind, kind.removesuffix("_proj"))
            experts.setdefault(f"blk.{i}.ffn_{kind}_exps.weight", {})[int(j)] = w
            continue
        base, suffix = hf_name.rsplit(".", 1)
        target = names.get_name(base) + "." + suffix
        if arch == "llama" and ".q_proj." in hf_name:
            w = permute(w, n_head)
        elif arch == "llama" and ".k_proj." in hf_name:
            w = permute(w, n_kv)
        if arch.startswith("gemma") and hf_name.endswith("norm.weight"):
            w = w + 1
        if arch == "gptneox" and "query_key_value" in hf_name:  # per head (q, k, v) -> all q, all k, all v
            w = w.reshape(n_head, 3, head_dim, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape)
        if target.endswith("ffn_gate_inp_shexp.weight"):
            w = w.reshape(-1)
        tensors[target] = (w, QT.F32)
    for target, per in experts.items():
        tensors[target] = (np.stack([per[j] for j in sorted(per)]), QT.F32)
    rope = hf.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)
    if rope.get("rope_type") == "llama3":
        tensors["rope_freqs.weight"] = (llama3_rope_factors(rope, head_dim, rope["original_max_position_embeddings"]),
                                        QT.F32)
    if qtype != QT.F32:
        tensors = {k: (gguf.quants.quantize(w, qtype), qtype) if w.ndim >= 2 and w.shape[-1] % 32 == 0 else (w, q)
                   for k, (w, q) in tensors.items()}
    p = f"{arch}."
    kv = {"general.name": name, p + "block_count": n_layers, p + "embedding_length": d,
          p + "context_length": hf["max_position_embeddings"], p + "feed_forward_length": hf["intermediate_size"],
          p + "attention.head_count": n_head, p + "rope.freq_base": float(rope.get("rope_theta", 10000.0)),
          "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
          "tokenizer.ggml.padding_token_id": 0} | tiny_tokenizer_kv(VOCAB)
    if arch != "gptneox":
        kv |= {p + "attention.head_count_kv": n_kv, p + "attention.layer_norm_rms_epsilon": hf["rms_norm_eps"]}
    if hf.get("head_dim"):
        kv |= {p + "attention.key_length": head_dim, p + "attention.value_length": head_dim}
    if rope.get("rope_type") == "linear":  # LlamaModel / Gemma3Model.set_gguf_parameters
        kv |= {p + "rope.scaling.type": "linear", p + "rope.scaling.factor": float(rope["factor"])}
    if arch in ("llama", "phi3", "gptneox"):
        kv[p + "rope.dimension_count"] = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    if arch == "gptneox":
        kv |= {p + "attention.layer_norm_epsilon": hf["layer_norm_eps"],
               p + "use_parallel_residual": hf["use_parallel_residual"]}
    if arch in ("gemma2", "gemma3"):
        kv[p + "attention.sliding_window"] = hf["sliding_window"]
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if hf.get(key) is not None:
                kv[p + key] = float(hf[key])
    if "num_experts_per_tok" in hf:
        kv |= {p + "expert_count": hf.get("num_experts") or hf["num_local_experts"],
               p + "expert_used_count": hf["num_experts_per_tok"]}
    if arch == "qwen2moe":
        kv |= {p + "expert_feed_forward_length": hf["moe_intermediate_size"],
               p + "expert_shared_feed_forward_length": hf["shared_expert_intermediate_size"]}
    if arch == "phi3":
        kv[p + "rope.scaling.original_context_length"] = hf["original_max_position_embeddings"]
    return write_gguf(path, tensors, kv | extra, arch=arch)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """family -> (HF dir, HF config, HF tensors, GGUF path), built once per family."""
    cache: dict[str, tuple] = {}

    def get(family: str):
        if family not in cache:
            d = tmp_path_factory.mktemp(family)
            hf, sd = tiny_hf(family, d)
            cache[family] = (d, hf, sd, convert(family, hf, sd, d / f"{family}.gguf", name=f"tiny-{family}"))
        return cache[family]

    return get


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(a - b) <= 1e-6 * max(1.0, abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return all(_same(a[k], b.get(k)) for k in a)
    return a == b


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gguf_side_gives_back_the_hf_config_and_tensors(made, family):
    _, hf, sd, path = made(family)
    g = G.read_gguf(path)
    config = G.hf_config(g)
    assert config["model_type"] == ("llama" if family == "mistral" else hf["model_type"])
    skip = {"architectures", "model_type", "dtype", "max_window_layers", "sliding_window"}
    if hf.get("head_dim", 0) is None:  # Mixtral's config leaves it to hidden_size / heads
        skip.add("head_dim")
        assert config["head_dim"] == hf["hidden_size"] // hf["num_attention_heads"]
    differ = {k: (v, hf[k]) for k, v in config.items() if k in hf and k not in skip and not _same(v, hf[k])}
    assert not differ, differ
    if "sliding_window" in config:
        assert config["sliding_window"] == hf["sliding_window"]
    got = dict(G.hf_tensors(g, config))
    want = {k: v for k, v in sd.items() if not (k == "lm_head.weight" and hf.get("tie_word_embeddings"))}
    assert set(got) == set(want)
    for name, t in want.items():
        # exact, except gemma's norms: the converter stored w + 1 in float32, and w + 1 - 1 rounds
        atol = 1e-6 if family.startswith("gemma") and name.endswith("norm.weight") else 0
        torch.testing.assert_close(got[name], t.float(), rtol=0, atol=atol, msg=name)


def reference_logits(family: str, d, path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    *_, transformers_reads_it = FAMILIES[family]
    if transformers_reads_it:
        ref = AutoModelForCausalLM.from_pretrained(d, gguf_file=path.name, attn_implementation="eager",
                                                   dtype=torch.float32)
    else:  # the HF model the file was written from
        ref = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        return ref.eval()(ids).logits


@pytest.mark.parametrize("family", list(FAMILIES))
def test_load_model_equals_transformers(made, family, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_LAB_CACHE", str(tmp_path / "cache"))
    d, hf, _, path = made(family)
    ids = torch.tensor([[1, 5, 17, 42, 99, 123, 7, 250, 3, 64]])
    lm = load_model(path)
    with torch.no_grad():
        ours = lm.model(ids)
    want = reference_logits(family, d, path, ids)
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("family, qtype", [("llama", QT.Q5_0), ("qwen3", QT.Q8_0), ("gemma2", QT.Q5_1)])
def test_quantized_files_load_like_transformers(made, family, qtype, tmp_path, monkeypatch):
    """Quantized weights (llama's permutation applied to quantized rows) dequantize as gguf.quants does."""
    monkeypatch.setenv("ATTENTION_LAB_CACHE", str(tmp_path / "cache"))
    d, hf, sd, _ = made(family)
    path = convert(family, hf, sd, d / f"{family}-{qtype.name}.gguf", qtype=qtype, name=f"tiny-{family}")
    assert G.read_gguf(path).tensors["blk.0.attn_q.weight"].ggml_type == qtype
    ids = torch.tensor([[1, 5, 17, 42, 99, 123, 7, 250, 3, 64]])
    with torch.no_grad():
        ours = load_model(path).model(ids)
    want = reference_logits(family, d, path, ids)
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_an_unsupported_architecture_lists_the_supported_ones(tmp_path):
    path = write_gguf(tmp_path / "x.gguf", {"w": (np.zeros(32, np.float32), QT.F32)}, arch="rwkv7")
    with pytest.raises(G.GGUFError) as e:
        load_model(path)
    assert str(e.value) == ("x.gguf: architecture 'rwkv7' is not supported; supported: llama, qwen2, qwen3, gemma, "
                            "gemma2, gemma3, phi3, olmo2, gptneox, qwen2moe, olmoe.")


@pytest.mark.parametrize("template, sentence", [
    ("{{ raise_exception('Only user and assistant roles are supported!') }}",
     "tiny-chat's chat template failed: Only user and assistant roles are supported!"),
    ("{{ messages[0]['content'] / 0 }}", "tiny-chat's chat template failed: unsupported operand type(s) for /: "
                                         "'str' and 'int'"),
    ("{% for m in messages %}{{ m.content }}", "tiny-chat's chat template failed: Unexpected end of template."),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "tiny-chat's chat template failed: it calls itself "
                                                        "without end"),
    ("{{ 'x' * 10 ** 12 }}", "tiny-chat's chat template failed: the template repeats a value 1,000,000,000,000 times"),
    ("{% for i in range(99999) %}{% for j in range(99999) %}{{ messages }}{% endfor %}{% endfor %}",
     "tiny-chat's chat template produces more than 1,048,576 characters; it was stopped there"),
], ids=["raise_exception", "python-error", "syntax", "recursion", "huge-value", "huge-output"])
def test_a_chat_template_that_raises_gives_one_sentence_and_bounded_memory(made, template, sentence, tmp_path,
                                                                          monkeypatch):
    import resource

    monkeypatch.setenv("ATTENTION_LAB_CACHE", str(tmp_path / "cache"))
    d, hf, sd, _ = made("llama")
    path = convert("llama", hf, sd, tmp_path / "tiny-chat.gguf", **{"tokenizer.chat_template": template})
    lm = load_model(path)
    assert lm.chat_template == template
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ValueError) as e:
        lm.encode("the heat", chat=True)
    assert str(e.value).startswith(sentence) and "Traceback" not in str(e.value)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024  # KiB
    assert lm.encode("the heat").shape == (1, 6)  # the model still opens and runs without the template


def test_a_file_without_its_vocabulary_opens_on_token_ids(made, tmp_path, monkeypatch):
    """convert_hf_to_gguf.py --no-vocab style: no tokenizer.ggml.* keys. The model runs on ids and says why text
    cannot be typed; the dequantized cache keeps 'no tokenizer'."""
    monkeypatch.setenv("ATTENTION_LAB_CACHE", str(tmp_path / "cache"))
    d, hf, sd, _ = made("qwen2")
    path = convert("qwen2", hf, sd, tmp_path / "novocab.gguf")
    g = G.read_gguf(path)
    kv = {k: v for k, v in g.metadata.items() if not k.startswith(("tokenizer.", "general.architecture"))}
    tensors = {n: (g.dequantize(n).numpy(), QT.F32) for n in g.tensors}
    del g
    write_gguf(path, tensors, kv, arch="qwen2")
    for from_cache in (False, True):
        assert G.read_model(path).from_cache == from_cache
    lm = G.load_gguf(path)
    assert lm.tokenizer is None
    with pytest.raises(ValueError, match="novocab has no tokenizer .*pass token ids instead of text"):
        lm.encode("the heat")
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 5, 17, 42, 99]])
    logits, trace = lm.run_with_trace(ids, names="*.weights")
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").eval()(ids).logits
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    assert trace["decoder.layers.0.self_attn.weights"].shape == (1, 4, 5, 5)


def test_an_unsupported_quantization_type_is_refused_by_name(made, tmp_path):
    d, hf, sd, _ = made("llama")
    path = convert("llama", hf, sd, tmp_path / "iq.gguf")
    g = G.read_gguf(path)
    tensors = {n: (g.dequantize(n).numpy(), QT.F32) for n in g.tensors}
    tensors["blk.0.ffn_down.weight"] = (np.zeros((64, 66), np.uint8), QT.IQ2_XXS)  # 256 values
    kv = {k: v for k, v in g.metadata.items() if k != "general.architecture"}
    del g
    write_gguf(path, tensors, kv)
    with pytest.raises(G.GGUFError) as e:
        load_model(path)
    assert str(e.value) == ("iq.gguf: quantization type IQ2_XXS (tensor 'blk.0.ffn_down.weight') is not supported; "
                            "supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.")
