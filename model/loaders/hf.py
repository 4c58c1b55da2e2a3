"""Hugging Face models in our instrumented families: a config.json + safetensors directory.

    lm = load_hf_dir("path/to/model")        # llama, qwen2, gpt2 -> LanguageModel (DecoderLM inside)
                                             # bert -> the encoder wrapper of model.loaders.minilm
    model = lm_from_hf(config_dict, tensors) # HF config + HF-named tensors -> DecoderLM (GGUF uses it too)

Weights are read with safetensors only: pickles (pytorch_model.bin) can run code when loaded, so a
directory that has only those is refused with the command that converts it. Sizes in config.json
are checked before anything is allocated, and every checkpoint tensor must map onto a parameter of
the same shape (nothing missing, nothing left over).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from model.families.lm import DecoderLM, LMConfig
from model.loaders.hf_common import (  # shared with adapter.py (no circle)
    ENCODER_TYPES,
    IGNORED_SUFFIXES,
    LM_TYPES,
    ModelLoadError,
    available_bytes,
)

SUPPORTED = LM_TYPES + ENCODER_TYPES
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few kB
LIMITS = {"vocab_size": 1 << 20, "d_model": 1 << 16, "n_layers": 1024, "n_heads": 1024, "d_ff": 1 << 18,
          "max_len": 1 << 21}
CONVERT = ('python -c "from transformers import AutoModel; '
           "AutoModel.from_pretrained('{d}').save_pretrained('{d}', safe_serialization=True)\"")


# ---------------------------------------------------------------- config


def _int(hf: Mapping, key: str, default=None) -> int:
    v = hf.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ModelLoadError(f"config.json: {key} must be a positive integer, got {v!r}")
    return v


def _ids(v) -> list[int]:
    vals = v if isinstance(v, list) else [v]
    return [x for x in vals if isinstance(x, int) and not isinstance(x, bool) and x >= 0]


def _unsupported(kind) -> str:
    return (f"model type {kind!r} is not supported; this lab opens these decoder-only types: "
            f"{', '.join(LM_TYPES)} (and the encoders {', '.join(ENCODER_TYPES)})")


def _rope(hf: Mapping, params, where: str = "") -> dict:
    """A rope_parameters dict (transformers 5; 4.x wrote rope_theta + rope_scaling) -> LMConfig fields."""
    legacy = hf.get("rope_scaling")
    if not isinstance(params, dict) or (legacy is not None and not isinstance(legacy, dict)):
        raise ModelLoadError("config.json: rope_parameters / rope_scaling must be JSON objects")
    p = {**(legacy or {}), **params}
    kind = p.get("rope_type") or p.get("type") or "default"
    if kind not in ("default", "linear", "llama3", "yarn"):
        raise ModelLoadError(f"config.json: RoPE scaling {kind!r}{where} is not supported; supported: default, "
                             "linear, llama3, yarn")
    theta = p.get("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", 10000.0)))
    if not isinstance(theta, int | float) or isinstance(theta, bool) or not 0 < theta < 1e12:
        raise ModelLoadError(f"config.json: rope_theta must be a positive number, got {theta!r}")
    out = {"rope_base": float(theta), "rope_scaling": kind}
    try:
        if kind not in ("default", "yarn"):
            out["rope_factor"] = float(p["factor"])
        if kind == "llama3":
            out |= {"rope_low_freq_factor": float(p["low_freq_factor"]),
                    "rope_high_freq_factor": float(p["high_freq_factor"]),
                    "rope_original_max_len": int(p.get("original_max_position_embeddings")
                                                 or hf.get("max_position_embeddings"))}
        if kind == "yarn":
            out |= _yarn(hf, p)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise ModelLoadError(f"config.json: RoPE scaling {kind!r} lacks its factors ({p!r})") from None
    prf = p.get("partial_rotary_factor", hf.get("partial_rotary_factor", hf.get("rotary_pct", 1.0)))
    if not isinstance(prf, int | float) or not 0 < prf <= 1:
        raise ModelLoadError(f"config.json: partial_rotary_factor must be in (0, 1], got {prf!r}")
    out["partial"] = float(prf)
    return out


def _yarn(hf: Mapping, p: Mapping) -> dict:
    """YaRN's LMConfig fields, as transformers 5.24's _compute_yarn_parameters reads them: the factor (or the
    context ratio), the ramp's betas and truncation, and the attention factor m on cos/sin (given, or from the
    factor and mscale / mscale_all_dim: 0.1·mscale·ln(factor) + 1)."""
    original = int(p.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings")
                   or hf.get("max_position_embeddings"))  # transformers' standardize_rope_params, same order
    factor = p.get("factor")
    factor = float(factor) if factor is not None else hf["max_position_embeddings"] / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m = p.get("attention_factor")
    if m is None:
        ms, ms_all = p.get("mscale"), p.get("mscale_all_dim")
        m = mscale(factor, ms) / mscale(factor, ms_all) if ms and ms_all else mscale(factor)
    if not factor > 0 or not float(m) > 0 or original <= 0:
        raise ValueError("non-positive YaRN factor")
    return {"rope_factor": factor, "rope_original_max_len": original, "rope_attention_factor": float(m),
            "rope_beta_fast": float(p.get("beta_fast") or 32), "rope_beta_slow": float(p.get("beta_slow") or 1),
            "rope_truncate": bool(p.get("truncate", True))}


def _layer_types(kind: str, hf: Mapping, n_layers: int, window: int | None) -> tuple[str, ...] | None:
    """Which layers attend through a sliding window, as transformers 5.24 decides for each family."""
    if window is None:
        return None
    types = hf.get("layer_types")
    if types is not None:
        names = {"full_attention": "full", "sliding_attention": "sliding"}
        if not isinstance(types, list) or len(types) != n_layers or any(t not in names for t in types):
            raise ModelLoadError(f"config.json: layer_types must list 'full_attention' or 'sliding_attention' for "
                                 f"each of the {n_layers} layers, got {types!r}")
        return tuple(names[t] for t in types)
    if kind == "gemma2":  # 4.x configs: every other layer, the first sliding
        return tuple("sliding" if (i + 1) % 2 else "full" for i in range(n_layers))
    if kind == "gemma3_text":
        k = _int(hf, "sliding_window_pattern", hf.get("_sliding_window_pattern", 6))
        return tuple("sliding" if (i + 1) % k else "full" for i in range(n_layers))
    if kind in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        if not hf.get("use_sliding_window"):
            return None
        first = hf.get("max_window_layers", 0)
        return tuple("sliding" if i >= first else "full" for i in range(n_layers))
    return ("sliding",) * n_layers  # mistral, phi3, mixtral, starcoder2: every layer


def config_from_hf(hf: Mapping, dtype=None) -> LMConfig:
    """A Hugging Face config dict of a decoder-only type (LM_TYPES) -> LMConfig. Absurd sizes are refused
    here, before any memory is spent: each size has a ceiling, and the whole model must fit in RAM in
    `dtype` (default float32)."""
    kind = hf.get("model_type")
    if kind not in LM_TYPES:
        raise ModelLoadError(_unsupported(kind))
    if kind == "gpt2":
        act = hf.get("activation_function", "gelu_new")
        D = _int(hf, "n_embd")
        if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("scale_attn_weights", True) is not True:
            raise ModelLoadError("config.json: GPT-2 attention scaling other than 1/sqrt(d_head) is not supported")
        sizes = dict(vocab_size=_int(hf, "vocab_size"), d_model=D, n_layers=_int(hf, "n_layer"),
                     n_heads=_int(hf, "n_head"), d_ff=_int(hf, "n_inner", None) if hf.get("n_inner") else 4 * D,
                     max_len=_int(hf, "n_positions"))
        switches = dict(positional="learned", norm="layernorm", norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
                        ffn="plain", qkv_bias=True, out_bias=True, ffn_bias=True,
                        tie_embeddings=bool(hf.get("tie_word_embeddings", True)))
    else:
        sizes, switches, act = _rotary_family(kind, hf)
    if act not in ACTIVATIONS:
        raise ModelLoadError(f"config.json: activation {act!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    for key, v in sizes.items():
        if v > LIMITS[key]:
            raise ModelLoadError(f"config.json: {key} = {v:,} is absurd for this lab (limit {LIMITS[key]:,}); "
                                 "the file is corrupt or forged")
    V = sizes["vocab_size"]
    tokens = {f"{k}_id": (_ids(hf.get(f"{k}_token_id")) or [None])[0] for k in ("bos", "eos", "pad")}
    tokens = {k: v if v is None or v < V else None for k, v in tokens.items()}
    try:
        cfg = LMConfig(**sizes, activation=ACTIVATIONS[act], **switches, **tokens)
    except ValueError as e:
        raise ModelLoadError(f"config.json: {e}") from None
    check_fits(cfg, resolve_dtype(dtype))
    return cfg


def _rotary_family(kind: str, hf: Mapping) -> tuple[dict, dict, str]:
    """Sizes, switches and activation of the RoPE families (everything but GPT-2), from transformers
    5.24's modeling files: which norms, where the scale and caps apply, which layers slide."""
    gemma = kind in ("gemma", "gemma2", "gemma3_text")
    act = hf.get("hidden_activation") if kind in ("gemma2", "gemma3_text") else None
    act = act or hf.get("hidden_act", "gelu" if kind == "gpt_neox" else "silu")
    heads = _int(hf, "num_attention_heads")
    n_layers = _int(hf, "num_hidden_layers")
    sizes = dict(vocab_size=_int(hf, "vocab_size"), d_model=_int(hf, "hidden_size"), n_layers=n_layers,
                 n_heads=heads, d_ff=_int(hf, "intermediate_size"),
                 max_len=_int(hf, "max_position_embeddings", 2048))
    d_head = _int(hf, "head_dim") if hf.get("head_dim") else None
    params = hf.get("rope_parameters") or {}
    local = None
    if isinstance(params, dict) and "full_attention" in params:  # Gemma 3: one RoPE per layer type
        local = _rope(hf, params.get("sliding_attention") or {}, " (sliding layers)")
        if local["rope_scaling"] != "default":
            raise ModelLoadError("config.json: RoPE scaling on the sliding layers is not supported")
        params = params["full_attention"]
    rope = _rope(hf, params)
    hs = d_head or sizes["d_model"] // heads
    partial = rope.pop("partial")
    rotary_dim = int(hs * partial) if partial < 1 else None
    window = hf.get("sliding_window") if kind in ("mistral", "phi3", "mixtral", "qwen2", "qwen3", "qwen2_moe",
                                                  "gemma2", "gemma3_text", "starcoder2", "qwen3_moe",
                                                  "gpt_oss") else None
    if kind == "smollm3":  # its layer_types name the sliding layers, used only with use_sliding_window
        window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 0):
        raise ModelLoadError(f"config.json: sliding_window must be a positive integer or null, got {window!r}")
    layer_types = _layer_types(kind, hf, n_layers, window or None)
    if layer_types is not None and "sliding" not in layer_types:
        layer_types = None
    window = window if layer_types is not None else None
    bias = bool(hf.get("attention_bias", kind in ("gpt_neox", "gpt_oss")))
    qkv_bias, out_bias = {"qwen2": (True, False), "qwen2_moe": (bool(hf.get("qkv_bias", True)), False)}.get(
        kind, (bias, bias))
    tie_default = gemma or kind in ("starcoder2", "cohere", "smollm3")
    switches = dict(n_kv_heads=heads if kind == "gpt_neox" else _int(hf, "num_key_value_heads", heads),
                    d_head=d_head, positional="rotary", **rope, rotary_dim=rotary_dim,
                    norm="rmsnorm_gemma" if gemma else "rmsnorm_olmo" if kind == "olmo2" else "rmsnorm",
                    norm_eps=float(hf.get("rms_norm_eps", 1e-6)), ffn="gated", qkv_bias=qkv_bias,
                    out_bias=out_bias, ffn_bias=bool(hf.get("mlp_bias", False)),
                    tie_embeddings=bool(hf.get("tie_word_embeddings", tie_default)),
                    sliding_window=window, layer_types=layer_types, embed_scale=gemma)
    if local is not None and layer_types is not None:
        switches["rope_local_base"] = local["rope_base"]
    if kind in ("gemma2", "gemma3_text"):
        scalar = hf.get("query_pre_attn_scalar", hs)
        if not isinstance(scalar, int | float) or isinstance(scalar, bool) or scalar <= 0:
            raise ModelLoadError(f"config.json: query_pre_attn_scalar must be a positive number, got {scalar!r}")
        # Gemma 3 keeps attn_logit_softcapping in its config but its attention never applies it (transformers'
        # Gemma3Attention passes no softcap; the real checkpoints set it null): we match transformers and ignore
        # it for gemma3_text. Gemma 2 applies it. The final soft-cap is applied by both.
        cap = hf.get("attn_logit_softcapping") if kind == "gemma2" else None
        switches |= dict(query_scale=float(scalar) ** -0.5, attn_softcap=cap,
                         final_softcap=hf.get("final_logit_softcapping"), norm_position="sandwich")
    if kind in ("qwen3", "gemma3_text"):
        switches["qk_norm"] = "head"
    if kind in ("olmo2", "olmoe"):
        switches["qk_norm"] = "full"
    if kind == "olmo2":
        switches |= dict(norm_position="post", rope_float32=True)
    if kind == "olmoe" and hf.get("clip_qkv") is not None:
        raise ModelLoadError("config.json: OLMoE's clip_qkv is not supported")
    if kind == "gpt_neox":
        switches |= dict(norm="layernorm", norm_eps=float(hf.get("layer_norm_eps", 1e-5)), ffn="plain",
                         ffn_bias=True, parallel_residual=bool(hf.get("use_parallel_residual", True)))
    switches |= _more_families(kind, hf, n_layers)
    if kind in ("qwen2_moe", "olmoe", "mixtral", "qwen3_moe", "gpt_oss"):
        n_exp = _int(hf, "num_local_experts" if kind in ("mixtral", "gpt_oss")
                     or (kind == "qwen3_moe" and "num_local_experts" in hf)
                     else "num_experts")  # Qwen3-MoE: transformers 5 saves num_local_experts, the Hub's num_experts
        switches |= dict(n_experts=n_exp, moe_top_k=_int(hf, "num_experts_per_tok"),
                         moe_norm_topk=True if kind == "mixtral" else bool(hf.get("norm_topk_prob", False)))
        if kind in ("qwen2_moe", "qwen3_moe"):
            step, dense = hf.get("decoder_sparse_step", 1), hf.get("mlp_only_layers") or []
            if not isinstance(step, int) or step < 1 or not isinstance(dense, list):
                raise ModelLoadError("config.json: decoder_sparse_step / mlp_only_layers are malformed")
            moe_layers = tuple(i for i in range(n_layers) if i not in dense and (i + 1) % step == 0)
            shared = hf.get("shared_expert_intermediate_size") or 0
            switches |= dict(moe_d_ff=_int(hf, "moe_intermediate_size"), moe_shared_d_ff=int(shared),
                             moe_shared_gate=bool(shared),
                             moe_layers=None if len(moe_layers) == n_layers else moe_layers)
        else:
            switches["moe_d_ff"] = sizes["d_ff"]
    return sizes, switches, act


def _more_families(kind: str, hf: Mapping, n_layers: int) -> dict:
    """The switches of issue 32's families, from transformers 5.24's modeling files (modeling_<kind>.py)."""
    def positive(key: str) -> float:
        v = hf.get(key, 1.0)
        if not isinstance(v, int | float) or isinstance(v, bool) or not v > 0:
            raise ModelLoadError(f"config.json: {key} must be a positive number, got {v!r}")
        return float(v)

    if kind == "phi":  # parallel block, one LayerNorm; dense + biases everywhere, the unembedding's too
        if hf.get("qk_layernorm"):
            raise ModelLoadError("config.json: Phi's qk_layernorm (a LayerNorm on q and k) is not supported")
        return dict(norm="layernorm", norm_eps=float(hf.get("layer_norm_eps", 1e-5)), ffn="plain", qkv_bias=True,
                    out_bias=True, ffn_bias=True, parallel_residual=True, shared_norm=True, generator_bias=True)
    if kind == "starcoder2":  # LayerNorm with a bias, biases (use_bias), a plain GELU MLP
        bias = bool(hf.get("use_bias", True))
        return dict(norm="layernorm", norm_eps=float(hf.get("norm_epsilon", 1e-5)), ffn="plain", qkv_bias=bias,
                    out_bias=bias, ffn_bias=bias)
    if kind == "qwen3_moe":
        return dict(qk_norm="head")
    if kind == "cohere":  # parallel block, one LayerNorm without a bias, logits × logit_scale, interleaved RoPE pairs
        if hf.get("use_qk_norm"):
            raise ModelLoadError("config.json: Cohere's use_qk_norm (a LayerNorm per head on q and k) is not supported")
        scale = hf.get("logit_scale")
        return dict(norm="layernorm", norm_bias=False, norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
                    parallel_residual=True, shared_norm=True, rope_interleaved=True,
                    logit_scale=None if scale is None else positive("logit_scale"))
    if kind == "granite":  # four constants: embedding ×, query scale, sublayer output ×, logits ÷
        return dict(embed_multiplier=positive("embedding_multiplier"), query_scale=positive("attention_multiplier"),
                    residual_multiplier=positive("residual_multiplier"), logits_scaling=positive("logits_scaling"))
    if kind == "glm4":  # a norm after each sublayer too (sandwich), partial rotary on interleaved pairs, fused gate_up
        return dict(norm_position="sandwich", rope_interleaved=True, qkv_bias=bool(hf.get("attention_bias", True)),
                    out_bias=False)
    if kind == "smollm3":  # no_rope_layers: 1 = the layer uses RoPE, 0 = it does not (NoPE)
        flags = hf.get("no_rope_layers")
        if flags is None:
            k = _int(hf, "no_rope_layer_interval", 4)
            flags = [int((i + 1) % k != 0) for i in range(n_layers)]
        if not isinstance(flags, list) or len(flags) != n_layers or any(f not in (0, 1) for f in flags):
            raise ModelLoadError(f"config.json: no_rope_layers must give 0 or 1 for each of the {n_layers} layers, "
                                 f"got {flags!r}")
        nope = tuple(i for i, f in enumerate(flags) if not f)
        return dict(nope_layers=nope or None)
    if kind == "gpt_oss":  # sinks; every layer a mixture: top-k logits then softmax, biases, clamped SwiGLU;
        # RMSNorm × weight in float32, then cast (GptOssRMSNorm: "main diff with Llama"), as OLMo 2's
        return dict(norm="rmsnorm_olmo", attn_sinks=True, moe_router="topk_softmax", moe_bias=True,
                    swiglu_limit=positive("swiglu_limit") if "swiglu_limit" in hf else 7.0,
                    swiglu_alpha=positive("swiglu_alpha") if "swiglu_alpha" in hf else 1.702)
    return {}


def _deinterleave(t: torch.Tensor, heads: int, hs: int, r: int) -> torch.Tensor:
    """q/k rows whose RoPE turns interleaved pairs (2i, 2i+1) (Cohere, GLM-4) -> the rotate-half order the lab's
    RoPE turns, pairs (i, i + r/2), per head; dims beyond r (partial rotary) stay. The same permutation of q and k
    leaves every score q·k, so every weight, unchanged; `.q`/`.k` hold the dims in this order."""
    perm = torch.cat([torch.arange(0, r, 2), torch.arange(1, r, 2), torch.arange(r, hs)])
    return t.reshape(heads, hs, *t.shape[1:])[:, perm].reshape(t.shape)


def check_fits(cfg: LMConfig, dtype: torch.dtype = torch.float32) -> None:
    """Refuse, before anything is allocated, a model whose weights in `dtype` exceed the memory available."""
    n = cfg.num_parameters()
    size = torch.empty(0, dtype=dtype).element_size()
    need = size * n
    have = available_bytes()
    if need > have:
        name = str(dtype).removeprefix("torch.")
        raise ModelLoadError(f"this config describes a model of {n:,} parameters ({need / 2**30:.1f} GiB in "
                             f"{name}); this machine has {have / 2**30:.1f} GiB available. Refused before loading.")


# ---------------------------------------------------------------- tensor names


# Tensors split at load (HF stores them fused): our pseudo-names end in one of these.
SPLITS = (".w_qkv", ".w_qkv_heads", ".gate_up", ".experts_gate_up", ".experts_down", ".oss_gate_up", ".oss_down")


def key_map(kind: str, cfg: LMConfig) -> dict[str, str]:
    """Hugging Face tensor name (prefix 'model.' / 'transformer.' / 'gpt_neox.' removed) -> our parameter
    name. A fused tensor maps to a pseudo-name ending in one of SPLITS, split apart by `_split`."""
    m: dict[str, str] = {}
    if kind == "gpt2":
        m |= {"wte.weight": "decoder.embed.tok.weight", "wpe.weight": "decoder.embed.pos.weight",
              "ln_f.weight": "decoder.norm.weight", "ln_f.bias": "decoder.norm.bias"}
        parts = {"ln_1": "norm1", "ln_2": "norm2", "attn.c_attn": "self_attn.w_qkv", "attn.c_proj": "self_attn.w_o",
                 "mlp.c_fc": "ffn.linear1", "mlp.c_proj": "ffn.linear2"}  # c_attn: q, k, v side by side
        prefix = "h"
    elif kind == "gpt_neox":
        m |= {"embed_in.weight": "decoder.embed.tok.weight", "final_layer_norm.weight": "decoder.norm.weight",
              "final_layer_norm.bias": "decoder.norm.bias", "embed_out.weight": "generator.weight"}
        parts = {"input_layernorm": "norm1", "post_attention_layernorm": "norm2",
                 "attention.query_key_value": "self_attn.w_qkv_heads",  # per head: [q_h, k_h, v_h]
                 "attention.dense": "self_attn.w_o", "mlp.dense_h_to_4h": "ffn.linear1",
                 "mlp.dense_4h_to_h": "ffn.linear2"}
        prefix = "layers"
    else:
        m |= {"embed_tokens.weight": "decoder.embed.tok.weight", "norm.weight": "decoder.norm.weight",
              "norm.bias": "decoder.norm.bias", "final_layernorm.weight": "decoder.norm.weight",  # StarCoder2; Phi
              "final_layernorm.bias": "decoder.norm.bias", "lm_head.bias": "generator.bias"}
        after_attn = "norm2" if cfg.norm_position == "pre" or kind == "glm4" else "norm_post_attn"
        parts = {"input_layernorm": "norm1", "post_attention_layernorm": after_attn,
                 "pre_feedforward_layernorm": "norm2", "post_feedforward_layernorm": "norm_post_ffn",
                 "self_attn.q_proj": "self_attn.w_q", "self_attn.k_proj": "self_attn.w_k",
                 "self_attn.v_proj": "self_attn.w_v", "self_attn.o_proj": "self_attn.w_o",
                 "self_attn.qkv_proj": "self_attn.w_qkv",  # Phi-3: [q | k | v]
                 "self_attn.q_norm": "self_attn.q_norm", "self_attn.k_norm": "self_attn.k_norm",
                 "mlp.gate_proj": "ffn.gate", "mlp.up_proj": "ffn.linear1", "mlp.down_proj": "ffn.linear2",
                 "mlp.gate_up_proj": "ffn.gate_up",  # Phi-3: [gate | up]
                 "self_attn.dense": "self_attn.w_o", "mlp.fc1": "ffn.linear1", "mlp.fc2": "ffn.linear2",  # Phi
                 "mlp.c_fc": "ffn.linear1", "mlp.c_proj": "ffn.linear2",  # StarCoder2
                 "post_self_attn_layernorm": "norm_post_attn", "post_mlp_layernorm": "norm_post_ffn"}  # GLM-4
        if cfg.n_experts:
            for moe in ("mlp", "block_sparse_moe"):  # Mixtral's older name
                parts |= {f"{moe}.gate": "ffn.router", f"{moe}.shared_expert_gate": "ffn.shared_gate",
                          f"{moe}.experts.gate_up_proj": "ffn.experts_gate_up",  # transformers 5's fused (E, 2F, D)
                          f"{moe}.experts.down_proj": "ffn.experts_down"}  # (E, D, F)
                for role, ours in (("gate_proj", "gate"), ("up_proj", "linear1"), ("down_proj", "linear2")):
                    parts[f"{moe}.shared_expert.{role}"] = f"ffn.shared_expert.{ours}"
                for e in range(cfg.n_experts):
                    for theirs, ours in (("gate_proj", "gate"), ("up_proj", "linear1"), ("down_proj", "linear2"),
                                         ("w1", "gate"), ("w3", "linear1"), ("w2", "linear2")):
                        parts[f"{moe}.experts.{e}.{theirs}"] = f"ffn.experts.{e}.{ours}"
        if kind == "gpt_oss":  # sinks; a router with a bias; experts as 3-D parameters (E, D, 2F) interleaved
            parts |= {"self_attn.sinks": "self_attn.sinks", "mlp.router": "ffn.router",
                      "mlp.experts.gate_up_proj": "ffn.oss_gate_up", "mlp.experts.gate_up_proj_bias": "ffn.oss_gate_up",
                      "mlp.experts.down_proj": "ffn.oss_down", "mlp.experts.down_proj_bias": "ffn.oss_down"}
        prefix = "layers"
    for i in range(cfg.n_layers):
        for theirs, ours in parts.items():
            for p in ("weight", "bias"):
                m[f"{prefix}.{i}.{theirs}.{p}"] = f"decoder.layers.{i}.{ours}.{p}"
            if theirs.endswith(("experts.gate_up_proj", "experts.down_proj")):  # bare parameters
                m[f"{prefix}.{i}.{theirs}"] = f"decoder.layers.{i}.{ours}.weight"
            if theirs.endswith(("_proj_bias", ".sinks")):  # gpt-oss's bare parameters
                m[f"{prefix}.{i}.{theirs}"] = f"decoder.layers.{i}.{ours}" + (".bias" if "bias" in theirs else "")
    m.setdefault("lm_head.weight", "generator.weight")
    return m


def _strip(name: str) -> str:
    for prefix in ("model.", "transformer.", "gpt_neox."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _split(ours: str, t: torch.Tensor, cfg: LMConfig) -> list[tuple[str, torch.Tensor]]:
    """A fused Hugging Face tensor -> our parameters (row slices are views: no copy)."""
    base, p = ours.rsplit(".", 1)
    base, fused = base.rsplit(".", 1)
    H, Hkv, hs = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    if fused == "w_qkv":  # GPT-2's c_attn, Phi-3's qkv_proj: rows [q (H hs) | k (Hkv hs) | v (Hkv hs)]
        parts = t.split([H * hs, Hkv * hs, Hkv * hs], dim=0)
        return [(f"{base}.w_{x}.{p}", c) for x, c in zip("qkv", parts, strict=True)]
    if fused == "w_qkv_heads":  # GPT-NeoX: rows per head [q_h | k_h | v_h], h = 0 .. H-1
        per_head = t.reshape(H, 3, hs, *t.shape[1:])
        return [(f"{base}.w_{x}.{p}", per_head[:, j].reshape(H * hs, *t.shape[1:])) for j, x in enumerate("qkv")]
    if fused == "gate_up":  # Phi-3's gate_up_proj: rows [gate | up]
        gate, up = t.chunk(2, dim=0)
        return [(f"{base}.gate.{p}", gate), (f"{base}.linear1.{p}", up)]
    if fused == "experts_gate_up":  # (E, 2F, D): expert e's [gate | up]
        return [(f"{base}.experts.{e}.{n}.weight", c) for e in range(t.shape[0])
                for n, c in zip(("gate", "linear1"), t[e].chunk(2, dim=0), strict=True)]
    if fused == "experts_down":  # (E, D, F)
        return [(f"{base}.experts.{e}.linear2.weight", t[e]) for e in range(t.shape[0])]
    if fused == "oss_gate_up":  # gpt-oss: x @ W[e] + b[e], W (E, D, 2F) and b (E, 2F); columns gate, up interleaved
        w = t if p == "bias" else t.transpose(1, 2)  # (E, 2F, D): nn.Linear's (out, in)
        return [(f"{base}.experts.{e}.{n}.{p}", w[e, j::2]) for e in range(t.shape[0])
                for j, n in enumerate(("gate", "linear1"))]
    if fused == "oss_down":  # (E, F, D) and (E, D)
        w = t if p == "bias" else t.transpose(1, 2)
        return [(f"{base}.experts.{e}.linear2.{p}", w[e]) for e in range(t.shape[0])]
    raise AssertionError(ours)


def resolve_dtype(dtype) -> torch.dtype:
    """"float32" | "bfloat16" | "float16" (or the torch dtype) -> torch dtype; None = float32."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.removeprefix("torch.")]
    raise ModelLoadError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def lm_from_hf(config: Mapping, tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
               dtype=None) -> DecoderLM:
    """A Hugging Face config (dict) of a type in LM_TYPES and its tensors under HF names (a mapping, or
    (name, tensor) pairs streamed one at a time) -> DecoderLM in eval mode, in `dtype` (default float32).

    The module tree is built on the meta device and the tensors are assigned into it, so the weights
    are held once: a tensor already in `dtype` (a memory-mapped safetensors slice) becomes the
    parameter itself. Every parameter must be filled with a tensor of its shape; unknown tensors are
    an error naming them."""
    dtype = resolve_dtype(dtype)
    cfg = config_from_hf(config, dtype)
    kind = config["model_type"]
    names = key_map(kind, cfg)
    with torch.device("meta"):
        model = DecoderLM(cfg)
    wanted = {n: tuple(p.shape) for n, p in model.named_parameters()}  # tied: generator.weight is absent
    state: dict[str, torch.Tensor] = {}
    unknown: list[str] = []
    pairs = tensors.items() if isinstance(tensors, Mapping) else tensors
    for theirs, t in pairs:
        ours = names.get(_strip(theirs), names.get(theirs))
        if ours is None:
            if not theirs.endswith(IGNORED_SUFFIXES):
                unknown.append(theirs)
            continue
        if ours == "generator.weight" and cfg.tie_embeddings:
            continue  # tied: the token table is the output projection
        t = t.to(dtype)
        if kind == "gpt2" and t.dim() == 2 and ".c_" in theirs:
            t = t.t()  # GPT-2's Conv1D (c_attn, c_proj, c_fc) stores (in, out); nn.Linear wants (out, in)
        parts = _split(ours, t, cfg) if ours.rsplit(".", 1)[0].endswith(SPLITS) else [(ours, t)]
        for name, part in parts:
            if cfg.rope_interleaved and (".self_attn.w_q." in name or ".self_attn.w_k." in name):
                heads = cfg.n_heads if ".w_q." in name else cfg.kv_heads
                part = _deinterleave(part, heads, cfg.head_dim, cfg.rotary_dim or cfg.head_dim)
            state[name] = part.contiguous()
    if unknown:
        raise ModelLoadError(f"the checkpoint has tensors this {kind} loader does not map: {unknown[:6]}"
                             f"{' ...' if len(unknown) > 6 else ''}")
    missing = sorted(set(wanted) - set(state))
    if missing:
        raise ModelLoadError(f"the checkpoint lacks {len(missing)} tensors, e.g. {missing[:4]} (our names)")
    extra = sorted(set(state) - set(wanted))
    if extra:
        raise ModelLoadError(f"the checkpoint has tensors the config does not describe (biases?): {extra[:4]}")
    bad = [(n, tuple(t.shape), wanted[n]) for n, t in state.items() if tuple(t.shape) != wanted[n]]
    if bad:
        n, got, want = bad[0]
        raise ModelLoadError(f"tensor for {n} has shape {got}, the config implies {want} "
                             f"({len(bad)} tensors disagree): config.json and the weights do not match")
    model.load_state_dict(state, strict=False, assign=True)  # strict by the checks above (tied key absent)
    model.tie()
    return model.eval()


# ---------------------------------------------------------------- directories


def read_config(d: Path) -> dict:
    path = d / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{d} has no config.json: a Hugging Face model directory holds config.json "
                             "and *.safetensors (and tokenizer.json)")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ModelLoadError(f"{path} is {path.stat().st_size:,} bytes; a config.json is a few kB")
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from None
    if not isinstance(hf, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    if hf.get("model_type") not in SUPPORTED:
        arch = hf.get("model_type") or hf.get("architectures")
        if not isinstance(hf.get("model_type"), str):
            raise ModelLoadError(f"{d.name}: {_unsupported(arch)}")
        from model.loaders.adapter import refusal  # another causal LM: transformers' own modules (adapter.py)

        why = refusal(hf)
        if why:
            raise ModelLoadError(f"{d.name}: {why}")
    return hf


INDEX = "model.safetensors.index.json"


def _indexed_shards(d: Path) -> list[Path] | None:
    """The shards a model.safetensors.index.json names (None without one), each a plain file name
    inside the directory and present; else a sentence saying which."""
    index = d / INDEX
    if not index.is_file():
        return None
    weight_map = _json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"{index.name} has no weight_map (tensor name -> shard file)")
    names = sorted(set(weight_map.values()))
    root = d.resolve()
    for name in names:
        if (not isinstance(name, str) or Path(name).name != name or name in (".", "..")
                or (d / name).resolve().parent != root):
            raise ModelLoadError(f"{index.name} names a shard outside the model directory ({name!r}); "
                                 "shards must be files in the directory itself. Refused.")
    missing = [n for n in names if not (d / n).is_file()]
    if missing:
        raise ModelLoadError(f"{d.name}: {len(missing)} of the {len(names)} weight shards listed in {index.name} "
                             f"are missing: {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}. "
                             "Download the whole model directory.")
    return [d / n for n in names]


def safetensors_files(d: Path) -> list[Path]:
    """The directory's weight files, checked from their headers; pickles only -> refused. With a shard
    index, exactly the shards it names (all present, all inside the directory)."""
    from model.core.trace import TraceFileError, check_safetensors_header

    files = _indexed_shards(d)
    if files is None:
        files = sorted(d.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in d.glob("*.bin")) + sorted(p.name for p in d.glob("*.pt*"))
        if pickles:
            raise ModelLoadError(
                f"{d} has only pickled weights ({', '.join(pickles[:3])}); this lab reads safetensors only "
                f"(pickles can run code when loaded). Convert once with:\n  {CONVERT.format(d=d)}")
        raise ModelLoadError(f"{d} has no *.safetensors weights")
    for f in files:
        try:
            check_safetensors_header(f, f.name, 1 << 16, what="model")
        except TraceFileError as e:
            raise ModelLoadError(str(e)) from None
    return files


def _read_tensors(files: list[Path]) -> Iterable[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError, safe_open

    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                    yield k, st.get_tensor(k)
        except SafetensorError as e:
            raise ModelLoadError(f"cannot read {f.name}: {e}") from None


def _json(path: Path) -> dict:
    try:
        if path.is_file() and path.stat().st_size <= 16 << 20:
            v = json.loads(path.read_text(encoding="utf-8"))
            return v if isinstance(v, dict) else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        pass
    return {}


def chat_template_of(d: Path) -> str | None:
    jinja = d / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    t = _json(d / "tokenizer_config.json").get("chat_template")
    if isinstance(t, list):  # [{"name": "default", "template": ...}, ...]
        t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == "default"), None)
    return t if isinstance(t, str) else None


def resolve_device(device) -> torch.device:
    """"cpu" | "cuda" | "mps" (None = cpu), refused with a sentence where this machine has no such device."""
    name = "cpu" if device is None else str(device)
    kind = name.split(":")[0]
    if kind not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"device must be 'cpu', 'cuda' or 'mps', got {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for, but this machine has no CUDA GPU that torch can use "
                             "(torch.cuda.is_available() is False); use device='cpu'")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError("device 'mps' was asked for, but this machine has no Apple GPU that torch can use; "
                             "use device='cpu'")
    return torch.device(name)


def check_runs(model: DecoderLM, dtype: torch.dtype, device: torch.device) -> None:
    """One token through the model, so a dtype the device cannot compute (float16 on a CPU whose torch
    lacks an op) is refused at load with a sentence, not at the first prompt with a traceback."""
    try:
        with torch.no_grad():
            model(torch.zeros(1, 1, dtype=torch.long, device=device))
    except (RuntimeError, NotImplementedError) as e:
        name = str(dtype).removeprefix("torch.")
        if "not implemented for" in str(e) or "Half" in str(e) or "BFloat16" in str(e):
            raise ModelLoadError(f"{name} does not run on this {device.type} with this torch: an operation the "
                                 f"model needs lacks it ({str(e).splitlines()[0][:120]}). Load it with "
                                 f"dtype='bfloat16' or 'float32' instead.") from None
        raise


def load_hf_dir(path: str | os.PathLike, dtype=None, device=None):
    """A Hugging Face directory -> LanguageModel (a type in LM_TYPES) or, for BERT, the existing
    encoder wrapper (model.loaders.minilm.PretrainedEncoder). Errors are ModelLoadError with a reason.
    dtype: "float32" (default) | "bfloat16" | "float16"; device: "cpu" (default) | "cuda" | "mps"."""
    from model.loaders.lm import LanguageModel

    d = Path(path)
    if not d.is_dir():
        raise ModelLoadError(f"{d} is not a directory")
    torch_dtype, torch_device = resolve_dtype(dtype), resolve_device(device)
    hf = read_config(d)
    files = safetensors_files(d)
    if hf["model_type"] in ENCODER_TYPES:
        if torch_dtype != torch.float32 or torch_device.type != "cpu":
            raise ModelLoadError("BERT encoders load in float32 on the CPU only")
        return _load_bert(d, hf, files)
    if hf["model_type"] not in LM_TYPES:  # no family of ours: transformers' own modules (model/loaders/adapter.py)
        from model.loaders.adapter import load_adapter_dir

        stop = _stop_sources(d, hf)
        return load_adapter_dir(d, hf, files, torch_dtype, torch_device, tokenizer=_tokenizer(d), name=d.name,
                                chat_template=chat_template_of(d), source=d, special_tokens=_special_tokens(d),
                                stop_ids=list(stop), stop_sources=stop)
    cfg = config_from_hf(hf, torch_dtype)  # sizes checked before any tensor is read
    model = lm_from_hf(hf, _read_tensors(files), torch_dtype)
    if torch_device.type != "cpu":
        model = model.to(torch_device)
    if torch_dtype != torch.float32:
        check_runs(model, torch_dtype, torch_device)
    tokenizer = _tokenizer(d)
    stop = {i: src for i, src in _stop_sources(d, hf).items() if i < cfg.vocab_size}
    return LanguageModel(model, tokenizer, name=d.name, chat_template=chat_template_of(d),
                         stop_ids=list(stop), stop_sources=stop, source=d, special_tokens=_special_tokens(d))


def _stop_sources(d: Path, hf: dict) -> dict[int, str]:
    """The directory's own end tokens, id -> where it is stated (LanguageModel.stop_rule): config.json's
    eos_token_id, then generation_config.json's (an int or a list: Llama 3 Instruct ends at three)."""
    from model.loaders.lm import STOP_CONFIG, STOP_GENERATION_CONFIG

    stop: dict[int, str] = {}
    for i in _ids(hf.get("eos_token_id")):
        stop.setdefault(i, STOP_CONFIG)
    for i in _ids(_json(d / "generation_config.json").get("eos_token_id")):
        stop.setdefault(i, STOP_GENERATION_CONFIG)
    return stop


def _tokenizer(d: Path):
    """d/tokenizer.json as a tokenizers.Tokenizer, None without one."""
    if not (d / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(d / "tokenizer.json"))
    except Exception as e:  # tokenizers raises its own Exception type
        raise ModelLoadError(f"cannot read {d / 'tokenizer.json'}: {e}") from None


def _special_tokens(d: Path) -> dict[str, str]:
    """bos_token / eos_token strings for chat templates, from tokenizer_config.json."""
    tc = _json(d / "tokenizer_config.json")
    out = {}
    for k in ("bos_token", "eos_token", "pad_token", "unk_token"):
        v = tc.get(k)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            out[k] = v
    return out


def _load_bert(d: Path, hf: dict, files: list[Path]):
    """A BERT, RoBERTa or DistilBERT directory -> the encoder wrapper (model.loaders.minilm.PretrainedEncoder).
    The tokenizer is tokenizer.json, else vocab.txt (WordPiece) or vocab.json + merges.txt (RoBERTa's BPE);
    with none of them the encoder opens on token ids and says so (PretrainedEncoder.tokenizer_note)."""
    from model.families.transformer import Transformer
    from model.loaders import minilm

    try:
        cfg = minilm.config_from_bert(hf)
    except (RuntimeError, KeyError, ValueError, TypeError) as e:
        raise ModelLoadError(f"{d.name}: {e}") from None
    D, F, L = cfg.d_model, cfg.d_ff, cfg.n_encoder_layers
    n = (cfg.src_vocab_size + cfg.max_len + cfg.n_token_types) * D + L * (4 * D * D + 2 * D * F + F + 9 * D)
    if cfg.src_vocab_size > LIMITS["vocab_size"] or D > LIMITS["d_model"] or L > LIMITS["n_layers"] \
            or 4 * n > available_bytes():
        raise ModelLoadError(f"{d.name}: config.json describes a model of {n:,} parameters ({4 * n / 2**30:.1f} GiB "
                             "in float32), more than this lab loads or this machine holds. Refused before loading.")
    try:
        tokenizer = minilm.encoder_tokenizer(d, hf)
    except RuntimeError as e:
        raise ModelLoadError(f"{d.name}: {e}") from None
    if tokenizer is not None and tokenizer.get_vocab_size(with_added_tokens=True) > cfg.src_vocab_size:
        raise ModelLoadError(f"{d.name}: the tokenizer has {tokenizer.get_vocab_size(with_added_tokens=True):,} "
                             f"tokens, the model's embedding {cfg.src_vocab_size:,} rows: they do not belong together")
    model = Transformer(cfg)
    try:
        ignored = minilm.load_encoder_weights(model, files, hf["model_type"], minilm.position_offset(hf))
    except RuntimeError as e:
        raise ModelLoadError(f"{d.name}: {e}") from None
    return minilm.PretrainedEncoder(model, tokenizer, hf, name=d.name, source=d, ignored_tensors=ignored)
