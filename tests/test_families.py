"""The 2024-2026 decoder families, each loaded from a tiny random model that transformers saved, agree with
transformers 5.x (eager attention, float32): logits and every head's attention weights within 1e-5
(relative to the largest value), greedy tokens equal. One switch per mechanism in model/families/lm.py:
llama3 RoPE scaling, sliding windows, q/k norm, Gemma's scaled embedding and (1 + w) norms, soft-capping,
sandwich and post norms, query_pre_attn_scalar, two RoPE bases, fused qkv / gate_up, parallel residual,
partial rotary, mixtures of experts. Also: the new capture points and hooks, the description, bfloat16,
devices, and the directories a user may bring wrong."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from model import load_model  # noqa: E402
from model.loaders import clear_cache  # noqa: E402
from model.loaders.hf import LM_TYPES, ModelLoadError, load_hf_dir  # noqa: E402

V, T, W = 160, 24, 8  # vocabulary, prompt length, sliding window (the prompt is 3 windows long)
COMMON = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
FAMILIES = {
    "llama3": ("llama", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                             rope_theta=50.0)),  # a small base: the scaled band falls inside d_head
    "mistral": ("mistral", dict(sliding_window=W, head_dim=16)),
    "qwen3": ("qwen3", dict(head_dim=16)),
    "gemma": ("gemma", dict(head_dim=16)),
    "gemma2": ("gemma2", dict(head_dim=16, sliding_window=W, query_pre_attn_scalar=24,
                              attn_logit_softcapping=3.0, final_logit_softcapping=2.0)),  # small caps: they bite
    "gemma3": ("gemma3_text", dict(head_dim=16, sliding_window=W, query_pre_attn_scalar=24,
                                   layer_types=["sliding_attention", "full_attention"],
                                   rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                       "rope_theta": 1e6},
                                                    "sliding_attention": {"rope_type": "default",
                                                                          "rope_theta": 1e4}})),
    "phi3": ("phi3", dict()),
    "olmo2": ("olmo2", dict()),
    "gpt_neox": ("gpt_neox", dict(rotary_pct=0.5, num_key_value_heads=4)),
    "qwen2_moe": ("qwen2_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                    shared_expert_intermediate_size=48)),
    "olmoe": ("olmoe", dict(num_experts=4, num_experts_per_tok=2)),
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2)),
}


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random (norms near their identity: 1 for a weight, 0 for Gemma's offset; a norm
    or a bias mapped to the wrong place would otherwise go unnoticed)."""
    g = torch.Generator().manual_seed(seed)
    gemma = "gemma" in type(model).__name__.lower()
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if ("norm" in name and not gemma) and name.endswith("weight") else 0.0
            p.copy_(base + 0.2 * torch.randn(p.shape, generator=g))


def build(family: str, dtype=torch.float32):
    model_type, extra = FAMILIES[family]
    cfg = transformers.AutoConfig.for_model(model_type, **(COMMON | extra))
    cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    _randomize(model, seed=sum(map(ord, family)))
    return model.to(dtype).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> (transformers model, its save_pretrained directory), built once."""
    cache = {}

    def get(family):
        if family not in cache:
            ref = build(family)
            d = tmp_path_factory.mktemp(family)
            ref.save_pretrained(d)
            cache[family] = ref, d
        return cache[family]

    return get


def ids(seed=0, n=T):
    return torch.randint(3, V, (1, n), generator=torch.Generator().manual_seed(seed))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("family", list(FAMILIES))
@torch.no_grad()
def test_logits_weights_and_greedy_tokens_match_transformers(family, saved):
    ref, d = saved(family)
    lm = load_hf_dir(d)
    x = ids()
    out = ref(x, output_attentions=True)
    logits, trace = lm.run_with_trace(x, names=["*.weights", "logits"])
    assert rel(logits, out.logits) <= 1e-5, family
    assert len(out.attentions) == lm.model.cfg.n_layers
    for i, w in enumerate(out.attentions):  # [1, H, T, T] per layer, every query head
        assert rel(trace[f"decoder.layers.{i}.self_attn.weights"], w) <= 1e-5, (family, i)
    want = ref.generate(x, max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)[0, T:].tolist()
    assert lm.generate(x, max_new_tokens=4, record=False).ids == want


