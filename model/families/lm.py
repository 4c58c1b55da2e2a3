"""Decoder-only language models (GPT-2, Llama, Qwen2, SmolLM2...), instrumented like the 2017 Transformer.

A decoder-only LM is the paper's decoder stack without cross-attention, so its module tree and
capture names follow the decoder's (every view that reads `decoder.*` works):

    decoder.embed.{tok, pos}            token table (+ learned positions, GPT-2)
    decoder.layers[i].norm1             LayerNorm or RMSNorm, before attention (pre-LN)
    decoder.layers[i].self_attn         masked self-attention: w_q, w_k, w_v, w_o (+ RoPE, grouped K/V)
    decoder.layers[i].norm2             before the FFN
    decoder.layers[i].ffn               linear1 (up), gate (SwiGLU only), linear2 (down); none if ffn="none"
    decoder.norm                        final norm
    generator                           output projection, tied to decoder.embed.tok when configured

One config (`LMConfig`, in the style of nanoGPT / TransformerLens's HookedTransformerConfig) holds
every switch: positions learned or rotary, n_kv_heads (grouped-query attention), norm, plain or gated
FFN, activation, biases, tied embeddings. The 2024-2026 families are the same code with one named
switch per mechanism (all off by default):

    rope_scaling (+ rope_factor...)  long-context RoPE: "linear", "llama3" (Llama 3.1+)
    rotary_dim                       partial rotary: only the first dims of each head turn (GPT-NeoX)
    sliding_window, layer_types      local attention on "sliding" layers (Mistral, Gemma 2/3, Phi-3)
    rope_local_base                  the sliding layers' own RoPE base (Gemma 3)
    query_scale                      scores = q·kᵀ × query_scale (Gemma 2/3), not 1/√d_k
    attn_softcap, final_softcap      cap · tanh(x / cap) on the scores / the logits (Gemma 2)
    qk_norm                          RMSNorm of q and k, per head (Qwen3, Gemma 3) or whole (OLMo 2)
    embed_scale                      token embedding × √d_model (Gemma)
    norm ("rmsnorm_gemma", ...)      (1 + w) RMSNorm (Gemma), w applied in float32 (OLMo 2)
    norm_position                    "pre"; "sandwich": also a norm after each sublayer (Gemma 2/3);
                                     "post": only after each sublayer (OLMo 2)
    parallel_residual                x + Attn(Norm1(x)) + FFN(Norm2(x)) (GPT-NeoX / Pythia)
    n_experts, moe_top_k, ...        mixture-of-experts FFN with a router (Mixtral, Qwen2-MoE, OLMoE)
    shared_norm                      parallel block, one norm: x + Attn(N(x)) + FFN(N(x)) (Phi, Cohere)
    norm_bias, generator_bias        LayerNorm without a bias (Cohere); a bias on the unembedding (Phi)
    logit_scale, logits_scaling      logits × logit_scale (Cohere), logits ÷ logits_scaling (Granite)
    embed_multiplier                 token embedding × a constant (Granite)
    residual_multiplier              x + m·Attn(.), x + m·FFN(.) (Granite; modules scale_attn, scale_ffn)
    rope_interleaved                 the checkpoint rotates pairs (2i, 2i+1) (Cohere, GLM-4; reordered at load)
    nope_layers                      layers without RoPE (SmolLM3)
    attn_sinks                       a learned sink logit per head in every softmax (gpt-oss; `<attn>.sink`)
    rope_scaling="yarn" (+ rope_beta_fast, rope_beta_slow, rope_truncate, rope_attention_factor)   YaRN (gpt-oss)
    moe_router, moe_bias, swiglu_limit, swiglu_alpha   top-k then softmax, biased router and experts, clamped
                                     SwiGLU (gpt-oss)

Extra modules and their capture names: `<layer>.norm_post_attn`, `<layer>.norm_post_ffn` (in/out);
`<attn>.q_norm`, `<attn>.k_norm` (in/out); `<attn>.scores_capped`; `<attn>.sink`; `decoder.rope.angles_local` (the
sliding layers' angles when their base differs); `masks.sliding`; `logits_uncapped`; the MoE points
of model/core/layers.py's MoEFeedForward. describe() says which layer uses which (model/core/describe.py).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from model.core import recorder
from model.core.attention import MultiHeadAttention, causal_mask, softcap
from model.core.config import DictConfig
from model.core.describe import SIDES, attention_entry
from model.core.layers import (
    ACTIVATIONS,
    MOE_ROUTERS,
    ROPE_SCALINGS,
    FeedForward,
    LayerNorm,
    MoEFeedForward,
    RMSNorm,
    rope_inv_freq,
    rotary_angles,
)
from model.core.recorder import CaptureError, Hook, record
from model.core.trace import Trace, run_lazy

POSITIONALS = ("learned", "rotary")
NORMS = ("layernorm", "rmsnorm", "rmsnorm_gemma", "rmsnorm_olmo")
NORM_POSITIONS = ("pre", "sandwich", "post")
LAYER_TYPES = ("full", "sliding")
FFNS = ("plain", "gated", "none")


@dataclass(frozen=True)
class LMConfig(DictConfig):
    vocab_size: int
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    n_kv_heads: int | None = None  # None = n_heads; fewer = grouped-query attention
    d_ff: int = 3072
    max_len: int = 1024  # longest sequence (learned: the position table's rows)
    positional: str = "learned"  # or "rotary"
    rope_base: float = 10000.0
    norm: str = "layernorm"  # or "rmsnorm"
    norm_eps: float = 1e-5
    ffn: str = "plain"  # or "gated" (SwiGLU: down(act(gate(x)) * up(x))), or "none" (attention-only: no FFN, no norm2)
    activation: str = "gelu_tanh"  # "gelu" (erf), "gelu_tanh" (GPT-2), "silu" (Llama), "relu"
    qkv_bias: bool = True
    out_bias: bool = True
    ffn_bias: bool = True
    tie_embeddings: bool = True  # generator.weight is decoder.embed.tok.weight
    d_head: int | None = None  # None = d_model // n_heads (filled in at init)
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None
    # ---- 2024-2026 mechanisms (see the module docstring); the defaults change nothing
    rope_scaling: str = "default"  # "linear" | "llama3"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0  # llama3 only
    rope_high_freq_factor: float = 4.0  # llama3 only
    rope_original_max_len: int | None = None  # llama3 only: the pre-training context
    rotary_dim: int | None = None  # None = all of d_head
    rope_local_base: float | None = None  # sliding layers' base; None = rope_base (and the same scaling)
    sliding_window: int | None = None  # a query sees itself and the window - 1 positions before it
    layer_types: tuple[str, ...] | None = None  # "full" | "sliding" per layer; None = all sliding iff a window
    query_scale: float | None = None  # None = 1/sqrt(d_head)
    attn_softcap: float | None = None
    final_softcap: float | None = None
    qk_norm: str | None = None  # None | "head" | "full"
    embed_scale: bool = False
    norm_position: str = "pre"
    parallel_residual: bool = False
    n_experts: int = 0  # 0 = dense FFN everywhere
    moe_top_k: int = 0
    moe_d_ff: int = 0  # each expert's hidden size
    moe_norm_topk: bool = False  # renormalize the top-k weights to sum 1 (Mixtral)
    moe_shared_d_ff: int = 0  # shared expert's hidden size (Qwen2-MoE); 0 = none
    moe_shared_gate: bool = False  # sigmoid gate on the shared expert (Qwen2-MoE)
    moe_layers: tuple[int, ...] | None = None  # layers with the MoE FFN; None = all (others: dense d_ff)
    rope_float32: bool = False  # rotate bfloat16 q/k with float32 cos/sin (OLMo 2; same numbers in float32)
    # ---- issue 32: more families (Phi, StarCoder2, Cohere, Granite, GLM-4, SmolLM3); the defaults change nothing
    shared_norm: bool = False  # parallel block whose attention and FFN both read norm1 (Phi, Cohere): no norm2
    norm_bias: bool = True  # False: LayerNorm without a bias (Cohere)
    generator_bias: bool = False  # the output projection has a bias (Phi's lm_head)
    logit_scale: float | None = None  # logits × logit_scale (Cohere)
    logits_scaling: float | None = None  # logits ÷ logits_scaling (Granite)
    embed_multiplier: float | None = None  # token embedding × embed_multiplier (Granite)
    residual_multiplier: float | None = None  # each sublayer's output × this before it joins the stream (Granite)
    rope_interleaved: bool = False  # the checkpoint turns pairs (2i, 2i+1) (Cohere, GLM-4): the loader reorders
    #                                 each head's q/k rows to (i, i + r/2), the same rotation, same scores
    nope_layers: tuple[int, ...] | None = None  # layers whose attention has no RoPE at all (SmolLM3)
    # ---- issue 32: gpt-oss; the defaults change nothing
    attn_sinks: bool = False  # a learned logit per head joins each softmax row and takes weight from the keys
    rope_beta_fast: float = 32.0  # yarn only: pairs turning more than this over the trained context keep their speed
    rope_beta_slow: float = 1.0  # yarn only: pairs turning less than this are slowed by rope_factor
    rope_truncate: bool = True  # yarn only: the ramp's ends rounded to whole pairs (gpt-oss: False)
    rope_attention_factor: float | None = None  # yarn: cos and sin × this (q and k × it); None = 1
    moe_router: str = "softmax_topk"  # "topk_softmax": the top-k logits, then a softmax over them (gpt-oss)
    moe_bias: bool = False  # the router and every expert projection have a bias (gpt-oss)
    swiglu_limit: float | None = None  # the experts' clamped SwiGLU (gpt-oss): gate <= limit, |up| <= limit
    swiglu_alpha: float = 1.702  # ... and glu = gate · sigmoid(alpha · gate), (up + 1) · glu

    def __post_init__(self) -> None:
        for f in ("layer_types", "moe_layers", "nope_layers"):  # JSON gives lists; a frozen config must stay hashable
            if isinstance(getattr(self, f), list):
                object.__setattr__(self, f, tuple(getattr(self, f)))
        for f in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{f} must be a positive integer, got {v!r}")
        for f in ("n_kv_heads", "d_head", "bos_id", "eos_id", "pad_id"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"{f} must be a non-negative integer or None, got {v!r}")
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}), "
                                 "or give d_head")
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)  # always an int after init
        elif self.d_head == 0:
            raise ValueError("d_head must be a positive integer")
        if self.kv_heads <= 0 or self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        for f, allowed in (("positional", POSITIONALS), ("norm", NORMS), ("ffn", FFNS),
                           ("activation", ACTIVATIONS)):
            if getattr(self, f) not in allowed:
                raise ValueError(f"{f} must be one of {allowed}, got {getattr(self, f)!r}")
        if self.positional == "rotary" and self.head_dim % 2:
            raise ValueError(f"rotary positions rotate pairs of dimensions: d_head ({self.head_dim}) must be even")
        if not self.rope_base > 0 or not self.norm_eps > 0:
            raise ValueError(f"rope_base and norm_eps must be > 0, got {self.rope_base!r}, {self.norm_eps!r}")
        for f in ("bos_id", "eos_id", "pad_id"):
            v = getattr(self, f)
            if v is not None and v >= self.vocab_size:
                raise ValueError(f"{f} ({v}) must be below vocab_size ({self.vocab_size})")
        self._check_mechanisms()

    def _check_mechanisms(self) -> None:
        if self.rope_scaling not in ROPE_SCALINGS:
            raise ValueError(f"rope_scaling must be one of {ROPE_SCALINGS}, got {self.rope_scaling!r}")
        if not self.rope_factor > 0:
            raise ValueError(f"rope_factor must be > 0, got {self.rope_factor!r}")
        if self.rope_scaling == "llama3" and (self.rope_original_max_len is None
                                              or not self.rope_high_freq_factor > self.rope_low_freq_factor > 0):
            raise ValueError("llama3 RoPE scaling needs rope_original_max_len and "
                             "rope_high_freq_factor > rope_low_freq_factor > 0")
        if self.rope_scaling == "yarn" and (self.rope_original_max_len is None
                                            or not self.rope_beta_fast > 0 or not self.rope_beta_slow > 0):
            raise ValueError("yarn RoPE scaling needs rope_original_max_len and rope_beta_fast, rope_beta_slow > 0")
        if self.rotary_dim is not None and (self.rotary_dim <= 0 or self.rotary_dim % 2
                                            or self.rotary_dim > self.head_dim):
            raise ValueError(f"rotary_dim must be even and in (0, d_head={self.head_dim}], got {self.rotary_dim!r}")
        for f in ("sliding_window", "rope_original_max_len", "n_experts", "moe_top_k", "moe_d_ff",
                  "moe_shared_d_ff"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"{f} must be a non-negative integer, got {v!r}")
        if self.sliding_window == 0:
            raise ValueError("sliding_window must be a positive integer or None")
        for f in ("rope_local_base", "query_scale", "attn_softcap", "final_softcap"):
            v = getattr(self, f)
            if v is not None and not (isinstance(v, int | float) and not isinstance(v, bool) and v > 0):
                raise ValueError(f"{f} must be a positive number or None, got {v!r}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.n_layers or any(t not in LAYER_TYPES for t in self.layer_types):
                raise ValueError(f"layer_types must give one of {LAYER_TYPES} for each of the {self.n_layers} "
                                 f"layers, got {self.layer_types!r}")
            if "sliding" in self.layer_types and self.sliding_window is None:
                raise ValueError("layer_types has sliding layers but sliding_window is not set")
        if self.qk_norm not in (None, "head", "full"):
            raise ValueError(f"qk_norm must be None, 'head' or 'full', got {self.qk_norm!r}")
        if self.norm_position not in NORM_POSITIONS:
            raise ValueError(f"norm_position must be one of {NORM_POSITIONS}, got {self.norm_position!r}")
        if self.parallel_residual and self.norm_position != "pre":
            raise ValueError("parallel_residual needs norm_position='pre' (GPT-NeoX)")
        if self.n_experts:
            if not 0 < self.moe_top_k <= self.n_experts or self.moe_d_ff <= 0:
                raise ValueError(f"a mixture of experts needs 0 < moe_top_k <= n_experts ({self.n_experts}) "
                                 f"and moe_d_ff > 0, got moe_top_k={self.moe_top_k}, moe_d_ff={self.moe_d_ff}")
            if self.ffn != "gated":
                raise ValueError("the experts are gated FFNs: a mixture of experts needs ffn='gated'")
            if self.moe_layers is not None and any(not 0 <= i < self.n_layers for i in self.moe_layers):
                raise ValueError(f"moe_layers must be layer indices below {self.n_layers}, got {self.moe_layers!r}")
        self._check_more_mechanisms()

    def _check_more_mechanisms(self) -> None:
        """The issue-32 switches (Phi, Cohere, Granite, SmolLM3...)."""
        if self.shared_norm and not self.parallel_residual:
            raise ValueError("shared_norm (attention and FFN read one norm) needs parallel_residual=True (Phi, Cohere)")
        for f in ("logit_scale", "logits_scaling", "embed_multiplier", "residual_multiplier"):
            v = getattr(self, f)
            if v is not None and not (isinstance(v, int | float) and not isinstance(v, bool) and v > 0):
                raise ValueError(f"{f} must be a positive number or None, got {v!r}")
        if self.residual_multiplier is not None and self.norm_position != "pre":
            raise ValueError("residual_multiplier is for pre-norm blocks (Granite), not with norms after the sublayers")
        if self.rope_interleaved and self.qk_norm is not None:
            raise ValueError("rope_interleaved with qk_norm: the loader reorders q/k rows, not a norm's weights")
        if self.nope_layers is not None:
            if self.positional != "rotary" or any(not 0 <= i < self.n_layers for i in self.nope_layers):
                raise ValueError(f"nope_layers must be layer indices below {self.n_layers} of a rotary model, "
                                 f"got {self.nope_layers!r}")
        if self.moe_router not in MOE_ROUTERS:
            raise ValueError(f"moe_router must be one of {MOE_ROUTERS}, got {self.moe_router!r}")
        for f in ("rope_attention_factor", "swiglu_limit", "swiglu_alpha"):
            v = getattr(self, f)
            if v is not None and not (isinstance(v, int | float) and not isinstance(v, bool) and v > 0):
                raise ValueError(f"{f} must be a positive number or None, got {v!r}")
        if self.attn_sinks and self.attn_softcap is not None:
            raise ValueError("attn_sinks with attn_softcap: no family caps the scores of a softmax with sinks")

    def layer_type(self, i: int) -> str:
        """"full" or "sliding" (its attention sees only the last sliding_window positions)."""
        if self.layer_types is not None:
            return self.layer_types[i]
        return "sliding" if self.sliding_window is not None else "full"

    def uses_rope(self, i: int) -> bool:
        """Whether layer i rotates q and k (False for learned positions, and for SmolLM3's no-RoPE layers)."""
        return self.positional == "rotary" and i not in (self.nope_layers or ())

    def is_moe(self, i: int) -> bool:
        return self.n_experts > 0 and (self.moe_layers is None or i in self.moe_layers)

    def rope_of(self, i: int) -> dict:
        """Layer i's RoPE: base, scaling and its factors, rotary dims, and the angles' capture name."""
        local = self.layer_type(i) == "sliding" and self.rope_local_base is not None
        rope = {"base": self.rope_local_base if local else self.rope_base,
                "scaling": "default" if local else self.rope_scaling,
                "rotary_dim": self.rotary_dim or self.head_dim,
                "angles": "decoder.rope.angles_local" if local else "decoder.rope.angles"}
        if rope["scaling"] != "default":
            rope["factor"] = self.rope_factor
        if rope["scaling"] == "llama3":
            rope |= {"low_freq_factor": self.rope_low_freq_factor, "high_freq_factor": self.rope_high_freq_factor,
                     "original_max_len": self.rope_original_max_len}
        if rope["scaling"] == "yarn":
            rope |= {"beta_fast": self.rope_beta_fast, "beta_slow": self.rope_beta_slow,
                     "truncate": self.rope_truncate, "original_max_len": self.rope_original_max_len,
                     "attention_factor": self.rope_attention_factor or 1.0}
        return rope

    def inv_freq(self, local: bool = False) -> torch.Tensor:
        """The RoPE frequencies of the global layers (or, local=True, of the sliding layers)."""
        dim = self.rotary_dim or self.head_dim
        if local and self.rope_local_base is not None:
            return rope_inv_freq(dim, self.rope_local_base)
        return rope_inv_freq(dim, self.rope_base, self.rope_scaling, self.rope_factor, self.rope_low_freq_factor,
                             self.rope_high_freq_factor, self.rope_original_max_len, self.rope_beta_fast,
                             self.rope_beta_slow, self.rope_truncate)

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:  # = d_head (the name Hugging Face configs use)
        return self.d_head

    def num_parameters(self) -> int:
        """Parameter count implied by the sizes (checked before anything is allocated)."""
        D, F, V, hs = self.d_model, self.d_ff, self.vocab_size, self.head_dim
        H, Hkv = self.n_heads, self.kv_heads
        attn = D * hs * (2 * H + 2 * Hkv) + (hs * (H + 2 * Hkv) if self.qkv_bias else 0) + (D if self.out_bias else 0)
        attn += {None: 0, "head": 2 * hs, "full": (H + Hkv) * hs}[self.qk_norm] + (H if self.attn_sinks else 0)
        ffn = (3 if self.ffn == "gated" else 2) * D * F + ((2 if self.ffn == "gated" else 1) * F + D
                                                          if self.ffn_bias else 0)
        if self.ffn == "none":  # attention-only: no FFN and no norm before/after it
            ffn = 0
        moe = (self.n_experts * (3 * D * self.moe_d_ff + D) + 3 * D * self.moe_shared_d_ff
               + (self.n_experts * (2 * self.moe_d_ff + D + 1) if self.moe_bias else 0)
               + (D if self.moe_shared_gate and self.moe_shared_d_ff else 0))
        norm = D * (2 if self.norm == "layernorm" and self.norm_bias else 1)
        n_norms = {"pre": 2, "sandwich": 4, "post": 2}[self.norm_position] // (2 if self.ffn == "none" else 1)
        n_norms = 1 if self.shared_norm else n_norms
        total = sum(attn + (moe if self.is_moe(i) else ffn) + n_norms * norm for i in range(self.n_layers))
        embed = V * D + (self.max_len * D if self.positional == "learned" else 0)
        return total + embed + norm + (0 if self.tie_embeddings else V * D) + (V if self.generator_bias else 0)



def _rms_style(cfg: LMConfig) -> str:
    return {"rmsnorm_gemma": "gemma", "rmsnorm_olmo": "olmo"}.get(cfg.norm, "llama")


def _norm(cfg: LMConfig) -> nn.Module:
    if cfg.norm == "layernorm":
        return LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.norm_bias)
    return RMSNorm(cfg.d_model, cfg.norm_eps, _rms_style(cfg))


class LMEmbeddings(nn.Module):
    """Token embedding (not scaled by √d_model, unlike the paper) + learned positions (GPT-2);
    rotary models add no position here (RoPE rotates q and k inside attention)."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model) if cfg.positional == "learned" else None
        self.scale = cfg.d_model ** 0.5 if cfg.embed_scale else None
        self.multiplier = cfg.embed_multiplier  # Granite: × embedding_multiplier (a Python float, as Hugging Face)

    def forward(self, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        x = self.tok(ids)  # (B, T, D)
        if self.scale is not None:  # Gemma: × √d_model, rounded to the weights' dtype as Hugging Face
            x = x * torch.tensor(self.scale, dtype=x.dtype, device=x.device)
        if self.multiplier is not None:
            x = x * self.multiplier
        x = record("decoder.embed.tok", x)
        if self.pos is not None:
            x = x + record("decoder.embed.pos", self.pos.weight[offset:offset + ids.shape[1]])  # (T, D)
        return record("decoder.embed.out", x)

    def capture_points(self, B: int, T: int) -> dict[str, tuple[int, ...]]:
        D = self.tok.embedding_dim
        pos = {} if self.pos is None else {"decoder.embed.pos": (T, D)}
        return {"decoder.embed.tok": (B, T, D)} | pos | {"decoder.embed.out": (B, T, D)}


class Multiplier(nn.Module):
    """x × a constant: Granite's residual_multiplier on a sublayer's output before it joins the residual stream.
    Records `<path>.out` (what the stream gets); model/core/residual.py freezes it as a norm of scale 1."""

    name = "scale"  # set to the module path by the model

    def __init__(self, d_model: int, value: float):
        super().__init__()
        self.d_model, self.multiplier = d_model, float(value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return record(f"{self.name}.out", x * self.multiplier)

    def capture_points(self, B: int, L: int) -> dict[str, tuple[int, ...]]:
        return {f"{self.name}.out": (B, L, self.d_model)}


class LMBlock(nn.Module):
    """A decoder layer without cross-attention. Pre-LN (GPT-2, Llama): x + Attn(Norm1(x)), then
    + FFN(Norm2(x)). The switches of LMConfig give the other arrangements:
    - norm_position="sandwich" (Gemma 2/3): x + NormPostAttn(Attn(Norm1(x))), then + NormPostFFN(FFN(Norm2(x)));
    - norm_position="post" (OLMo 2): x + NormPostAttn(Attn(x)), then + NormPostFFN(FFN(x)) (no norm before);
    - parallel_residual (GPT-NeoX): x + Attn(Norm1(x)) + FFN(Norm2(x)), both read the same x;
      with shared_norm (Phi, Cohere): Attn(Norm1(x)) + FFN(Norm1(x)) + x, one norm, no norm2;
    - residual_multiplier m (Granite): x + m·Attn(Norm1(x)), then + m·FFN(Norm2(x)) (modules scale_attn, scale_ffn);
    - a layer in nope_layers (SmolLM3) attends without RoPE."""

    def __init__(self, cfg: LMConfig, i: int = 0):
        super().__init__()
        pre, post = cfg.norm_position != "post", cfg.norm_position != "pre"
        self.norm1 = _norm(cfg) if pre else None
        self.self_attn = MultiHeadAttention(
            cfg.d_model, cfg.n_heads, 0.0, n_kv_heads=cfg.kv_heads, d_head=cfg.head_dim, qkv_bias=cfg.qkv_bias,
            out_bias=cfg.out_bias, scale=cfg.query_scale, softcap=cfg.attn_softcap, qk_norm=cfg.qk_norm,
            norm_eps=cfg.norm_eps, norm_style=_rms_style(cfg), rope_float32=cfg.rope_float32, sinks=cfg.attn_sinks,
            rope_scale=cfg.rope_attention_factor if cfg.uses_rope(i) and cfg.rope_of(i)["scaling"] == "yarn" else None)
        self.norm_post_attn = _norm(cfg) if post else None
        self.norm2 = _norm(cfg) if pre and cfg.ffn != "none" and not cfg.shared_norm else None
        if cfg.ffn == "none":  # attention-only (Elhage et al. 2021): the block is x + Attn(Norm1(x))
            self.ffn = None
        elif cfg.is_moe(i):
            self.ffn = MoEFeedForward(cfg.d_model, cfg.n_experts, cfg.moe_top_k, cfg.moe_d_ff, cfg.activation,
                                      cfg.moe_norm_topk, cfg.moe_shared_d_ff, cfg.moe_shared_gate, cfg.moe_router,
                                      cfg.moe_bias, cfg.swiglu_limit, cfg.swiglu_alpha)
        else:
            self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, 0.0, cfg.ffn_bias, gated=cfg.ffn == "gated")
        self.norm_post_ffn = _norm(cfg) if post and cfg.ffn != "none" else None
        m = cfg.residual_multiplier
        self.scale_attn = Multiplier(cfg.d_model, m) if m is not None else None
        self.scale_ffn = Multiplier(cfg.d_model, m) if m is not None and cfg.ffn != "none" else None
        self.rotary = cfg.uses_rope(i)
        self.parallel = cfg.parallel_residual
        self.d_model = cfg.d_model
        self.name = "decoder.layers.?"

    @staticmethod
    def _maybe(norm: nn.Module | None, x: torch.Tensor) -> torch.Tensor:
        return x if norm is None else norm(x)

    def forward(self, x, mask, angles=None, cache: dict | None = None) -> torch.Tensor:
        h = self._maybe(self.norm1, x)
        a = self._maybe(self.norm_post_attn, self.self_attn(h, h, mask, cache, angles=angles if self.rotary else None))
        a = self._maybe(self.scale_attn, a)
        if self.ffn is None:  # attention-only
            x = x + a
        elif self.parallel and self.norm2 is None:  # Phi, Cohere: both sublayers read the one norm's output
            x = a + self.ffn(h) + x  # Phi's order of the sum
        elif self.parallel:  # GPT-NeoX: the FFN reads the layer's input, not x + attention
            x = self.ffn(self.norm2(x)) + a + x  # Hugging Face's order of the sum
        else:
            x = x + a
            f = self._maybe(self.norm_post_ffn, self.ffn(self._maybe(self.norm2, x)))
            x = x + self._maybe(self.scale_ffn, f)
        return record(f"{self.name}.out", x)

    def capture_points(self, B: int, T: int) -> dict[str, tuple[int, ...]]:
        def pts(norm):
            return {} if norm is None else norm.capture_points(B, T)

        return (pts(self.norm1) | self.self_attn.capture_points(B, T, T, self.rotary) | pts(self.norm_post_attn)
                | pts(self.scale_attn) | pts(self.norm2) | ({} if self.ffn is None else self.ffn.capture_points(B, T))
                | pts(self.norm_post_ffn) | pts(self.scale_ffn)
                | {f"{self.name}.out": (B, T, self.d_model)})


class LMDecoder(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.embed = LMEmbeddings(cfg)
        self.layers = nn.ModuleList(LMBlock(cfg, i) for i in range(cfg.n_layers))
        self.norm = _norm(cfg)


class DecoderLM(nn.Module):
    """A decoder-only language model; same API shape as `Transformer` (forward, run_with_trace,
    run_with_hooks, hooks, resolve_hooks, capture_names, new_cache, describe, num_parameters)."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.decoder = LMDecoder(cfg)
        self.generator = nn.Linear(cfg.d_model, cfg.vocab_size, bias=cfg.generator_bias)
        if not self.decoder.embed.tok.weight.is_meta:
            self._init_weights()
        self.tie()
        self._sliding = any(cfg.layer_type(i) == "sliding" for i in range(cfg.n_layers))
        # RoPE frequencies are recomputed each forward (tiny; a model built on the meta device has none):
        # plain RoPE keeps rotary_angles' own formula, as before the switches existed
        self._plain_rope = cfg.rope_scaling == "default" and cfg.rotary_dim in (None, cfg.head_dim)
        self._local_rope = cfg.positional == "rotary" and cfg.rope_local_base is not None and self._sliding
        for path, module in self.named_modules():  # capture names = module path + role
            if isinstance(module, MultiHeadAttention | FeedForward | MoEFeedForward | LMBlock | LayerNorm | RMSNorm
                          | Multiplier):
                module.name = path

    def _init_weights(self) -> None:  # GPT-2's init; real models overwrite it
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def tie(self) -> None:
        """Share the token table and the output projection (again after load_state_dict(assign=True))."""
        if self.cfg.tie_embeddings:
            self.generator.weight = self.decoder.embed.tok.weight

    # ------------------------------------------------------------------ forward

    def forward(self, ids: torch.Tensor, cache: list[dict] | None = None, offset: int = 0,
                last_only: bool = False) -> torch.Tensor:
        """(B, T) ids -> logits (B, T, V). With `cache` (new_cache()), `ids` are the new tokens at
        absolute positions offset..offset+T-1; their keys and values are appended to the cache.
        last_only: logits of the last position only, (B, 1, V) (generation: a long prompt's other rows
        would cost T × d_model × vocab for nothing)."""
        self._check_ids(ids, offset)
        c = self.cfg
        device = self.decoder.embed.tok.weight.device
        ids = ids.to(device)
        masks, angles = self._masks_and_angles(*ids.shape, offset, device)
        x = self.decoder.embed(ids, offset)
        for i, layer in enumerate(self.decoder.layers):
            kind = c.layer_type(i)
            x = layer(x, masks[kind], angles[kind], None if cache is None else cache[i])
        x = record("decoder.out", self.decoder.norm(x))
        return record("logits", self._unembed_normed(x[:, -1:] if last_only else x))

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        """A residual stream (B, T, D) -> logits (B, T, V), as the model's last steps compute them: the final
        norm, the unembedding and the final soft-cap (the logit lens reads every layer through this)."""
        return self._unembed_normed(self.decoder.norm(x))

    def _unembed_normed(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.generator(x)
        if self.cfg.logit_scale is not None:  # Cohere: logits × logit_scale
            logits = logits * self.cfg.logit_scale
        if self.cfg.logits_scaling is not None:  # Granite: logits ÷ logits_scaling
            logits = logits / self.cfg.logits_scaling
        if self.cfg.final_softcap is not None:  # Gemma 2: logits bounded to (-cap, cap)
            logits = softcap(record("logits_uncapped", logits), self.cfg.final_softcap)
        return logits

    def _masks_and_angles(self, B: int, T: int, offset: int, device) -> tuple[dict, dict]:
        """What every layer reads besides x, by layer kind ("full" | "sliding"): the look-ahead mask
        (B, 1, T, offset + T) and the RoPE angles (None without RoPE)."""
        c = self.cfg
        future = record("masks.causal", causal_mask(T, offset=offset, device=device))  # (T, offset + T)
        masks = {"full": future[None, None].expand(B, 1, T, offset + T)}
        if self._sliding:  # a local layer's query also cannot see keys sliding_window or more positions back
            local = record("masks.sliding", causal_mask(T, offset=offset, device=device, window=c.sliding_window))
            masks["sliding"] = local[None, None].expand(B, 1, T, offset + T)
        angles = {"full": None, "sliding": None}
        if c.positional == "rotary":
            angles["full"] = angles["sliding"] = record(
                "decoder.rope.angles", rotary_angles(T, c.head_dim, c.rope_base, offset,
                                                     None if self._plain_rope else c.inv_freq(), device))
            if self._local_rope:  # Gemma 3: the sliding layers turn with their own base
                angles["sliding"] = record("decoder.rope.angles_local", rotary_angles(
                    T, c.head_dim, c.rope_base, offset, c.inv_freq(local=True), device))
        return masks, angles

    @torch.no_grad()
    def run_layer(self, i: int, x: torch.Tensor, names: set[str], fast: bool = False) -> dict[str, torch.Tensor]:
        """Layer i run again on its input x (B, T, D) (layer i-1's output, or decoder.embed.out), recording
        `names` (its capture names): a lazy trace's way to give any tensor of a layer on demand from one
        stored O(T·d) tensor per layer. The same code as forward, so with the same `fast` switch it is what
        the whole forward recorded, bit for bit."""
        B, T = x.shape[:2]
        masks, angles = self._masks_and_angles(B, T, 0, x.device)
        kind = self.cfg.layer_type(i)
        n_bytes = recorder.estimate_bytes(self.capture_names(B, T), sorted(names), x.element_size())
        with recorder.fast_attention(fast), recorder.capturing(set(names), n_bytes + 64 * len(names)) as rec:
            self.decoder.layers[i](x, masks[kind], angles[kind])
        return dict(rec.tensors)

    def new_cache(self) -> list[dict]:
        return [{} for _ in range(self.cfg.n_layers)]

    def _check_ids(self, ids: torch.Tensor, offset: int) -> None:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            got = f"{tuple(ids.shape)} {ids.dtype}" if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise ValueError(f"ids must be an integer tensor of shape (batch, length), got {got}")
        if ids.shape[1] == 0:
            raise ValueError("the token sequence is empty")
        if offset + ids.shape[1] > self.cfg.max_len:
            raise recorder.ContextLengthError(
                f"sequence of {offset + ids.shape[1]} tokens is longer than this model's limit "
                f"max_len={self.cfg.max_len}", n_tokens=offset + ids.shape[1], context_length=self.cfg.max_len)
        if int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size:
            raise ValueError(f"ids must be in [0, {self.cfg.vocab_size}); got ids in [{int(ids.min())}, "
                             f"{int(ids.max())}] (does the tokenizer match the model?)")

    # ------------------------------------------------------------------ capture

    def capture_names(self, B: int = 1, T: int = 1) -> dict[str, tuple[int, ...]]:
        """Every capture (and hook) point of a forward pass on (B, T) ids, in computation order, with
        its shape: walked from the module tree, each module listing its own."""
        c = self.cfg
        pts = {"masks.causal": (T, T)} | ({"masks.sliding": (T, T)} if self._sliding else {})
        pts |= self.decoder.embed.capture_points(B, T)
        if c.positional == "rotary":
            pts["decoder.rope.angles"] = (T, (c.rotary_dim or c.head_dim) // 2)
            if self._local_rope:
                pts["decoder.rope.angles_local"] = (T, (c.rotary_dim or c.head_dim) // 2)
        for layer in self.decoder.layers:
            pts |= layer.capture_points(B, T)
        pts |= self.decoder.norm.capture_points(B, T) | {"decoder.out": (B, T, c.d_model)}
        if c.final_softcap is not None:
            pts["logits_uncapped"] = (B, T, c.vocab_size)
        return pts | {"logits": (B, T, c.vocab_size)}

    def resolve_hooks(self, hooks: Mapping[str, Hook | list[Hook]] | None) -> dict[str, list[Hook]]:
        """{glob: fn} -> {capture name: [fn]}; a glob that matches no point is an error listing them."""
        return recorder.resolve_hooks(list(self.capture_names()), hooks)

    def hooks(self, hooks: Mapping[str, Hook | list[Hook]] | None) -> recorder.hooking:
        """`with lm.hooks({"decoder.layers.3.self_attn.z": fn}):` every forward pass inside it runs under them."""
        return recorder.hooking(self.resolve_hooks(hooks))

    def run_with_hooks(self, ids: torch.Tensor, hooks=None, cache: list[dict] | None = None,
                       offset: int = 0) -> torch.Tensor:
        with self.hooks(hooks):
            return self(ids, cache, offset)

    def run_with_trace(
        self,
        ids: torch.Tensor,
        names: str | Sequence[str] | None = None,
        hooks: Mapping[str, Hook | list[Hook]] | None = None,
        budget_bytes: int | None = recorder.DEFAULT_BUDGET_BYTES,
        meta: dict | None = None,
        lazy: bool = False,
        fast: bool = False,
        last_only: bool = False,
        layers: bool = False,
    ) -> tuple[torch.Tensor, Trace]:
        """Forward pass recording the named tensors (None = all; fnmatch globs); same math as forward,
        so the logits are bit-identical. A capture over `budget_bytes` is refused before running, with
        what would fit (CaptureBudgetError: needed_bytes, budget, max_tokens).

        lazy=True (long inputs): a LazyTrace (model/core/trace.py) that stores q, k, v per layer (+ the
        O(T·d) names in `names`) and computes scores/mask/weights/z when asked; fast=True runs it
        under recorder.fast_attention() (fused attention; logits equal forward's to float rounding);
        last_only=True (lazy only) returns the last position's logits [B, 1, V] (8,192 x a 49k vocabulary
        is 1.6 GB of logits); layers=True (lazy only) keeps each layer's output too and gives every other
        tensor of a layer by running that layer again (LazyTrace, run_layer)."""
        if lazy:
            return run_lazy(self, ids, names, hooks, budget_bytes, meta, fast, last_only, layers)
        self._check_ids(ids, 0)
        B, T = ids.shape
        shapes = self.capture_names(B, T)
        wanted = recorder.select_names(list(shapes), names)
        itemsize = next(self.parameters()).element_size()
        n_bytes = recorder.estimate_bytes(shapes, wanted, itemsize)
        if budget_bytes is not None and n_bytes > budget_bytes:
            raise self._over_budget(names, shapes, wanted, n_bytes, budget_bytes, B, T, itemsize)
        with self.hooks(hooks), recorder.capturing(set(wanted), n_bytes + 64 * len(wanted)) as rec:
            out = self(ids)
        info = {
            "config": self.cfg.to_dict(),
            "model": self.describe(),
            "tgt_ids": ids.tolist(),
            "mask_convention": "True = blocked (attention not allowed)",
            "training": self.training,
            "dtype": str(out.dtype).removeprefix("torch."),  # the model's: captured tensors keep it
            "device": out.device.type,  # where it ran (captured tensors are on the CPU)
        }
        if hooks:
            info["hooks"] = {p: getattr(fn, "__name__", repr(fn)) if callable(fn) else repr(fn)
                             for p, fn in hooks.items()}
        info.update(meta or {})
        return out, Trace({n: rec.tensors[n] for n in wanted if n in rec.tensors}, info)

    def _over_budget(self, names, shapes, wanted, n_bytes, budget, B, T, itemsize) -> CaptureError:
        """The refusal message: how long an input these names fit, and how many of them fit at this length."""
        def size(t: int) -> int:
            s = self.capture_names(B, t)
            return recorder.estimate_bytes(s, recorder.select_names(list(s), names), itemsize)

        lo, hi = 0, T  # largest length that fits (sizes grow with T)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if size(mid) <= budget else (lo, mid - 1)
        fits, used = 0, 0
        for n in wanted:
            used += recorder.estimate_bytes(shapes, [n], itemsize)
            if used > budget:
                break
            fits += 1
        shown = names if isinstance(names, str) or names is None else list(names)
        one = f"decoder.layers.{self.cfg.n_layers // 2}.self_attn.weights"
        return recorder.CaptureBudgetError(
            f"capturing {shown!r} at {T} tokens needs about {n_bytes / 2**20:.1f} MiB, over the budget of "
            f"{budget / 2**20:.1f} MiB. What fits: the same names up to {lo} tokens; or, at {T} tokens, "
            f"{fits} of these {len(wanted)} tensors, e.g. one layer's attention: names={one!r} "
            f"({recorder.estimate_bytes(shapes, [one], itemsize) / 2**20:.1f} MiB); or lazy=True. Or raise "
            f"budget_bytes.", needed_bytes=n_bytes, budget=budget, n_tokens=T, max_tokens=lo,
            context_length=self.cfg.max_len)

    # ------------------------------------------------------------------ description

    def describe(self) -> dict:
        """The model's own description (see model/core/describe.py), recorded in trace.meta["model"].
        Each attention entry carries its layer's score->weights math (scale, softcap, window, rope,
        qk_norm), so a page or a lazy trace can recompute the weights from q and k alone."""
        c = self.cfg
        attention = {}
        for i in range(c.n_layers):
            sliding = c.layer_type(i) == "sliding"
            attention[f"decoder.layers.{i}.self_attn"] = attention_entry(
                "decoder_self", "decoder", i, c.n_heads, c.head_dim, c.kv_heads,
                scale=c.query_scale if c.query_scale is not None else c.head_dim ** -0.5,
                softcap=c.attn_softcap, window=c.sliding_window if sliding else None,
                rope=c.rope_of(i) if c.uses_rope(i) else None, qk_norm=c.qk_norm is not None,
                qk_norm_over=c.qk_norm, layer_type=c.layer_type(i))
            if c.attn_sinks:  # gpt-oss: the learned logits (live numbers): q, k and this entry give the weights
                sinks = self.decoder.layers[i].self_attn.sinks
                attention[f"decoder.layers.{i}.self_attn"]["sinks"] = (
                    None if sinks.is_meta else [float(v) for v in sinks.detach().float().cpu()])
        blocks = {"positional": c.positional, "norm": c.norm, "norm_first": c.norm_position != "post",
                  "ffn": c.ffn, "activation": c.activation, "tied_embeddings": c.tie_embeddings, "d_model": c.d_model,
                  "d_ff": c.d_ff, "vocab_size": c.vocab_size, "norm_position": c.norm_position,
                  "post_norms": c.norm_position != "pre", "parallel_residual": c.parallel_residual,
                  "embed_scale": c.d_model ** 0.5 if c.embed_scale else None, "final_softcap": c.final_softcap,
                  "sliding_window": c.sliding_window, "moe": None}
        if c.positional == "rotary":
            blocks["rope_base"] = c.rope_base
        # issue 32's mechanisms, said only where the model has them (the 13 earlier families' descriptions unchanged)
        more = {"shared_norm": c.shared_norm or None, "norm_bias": None if c.norm_bias else False,
                "generator_bias": c.generator_bias or None, "logit_scale": c.logit_scale,
                "logits_scaling": c.logits_scaling, "embed_multiplier": c.embed_multiplier,
                "residual_multiplier": c.residual_multiplier, "rope_interleaved": c.rope_interleaved or None,
                "nope_layers": list(c.nope_layers) if c.nope_layers else None, "attn_sinks": c.attn_sinks or None}
        blocks |= {k: v for k, v in more.items() if v is not None}
        if c.n_experts:
            blocks["moe"] = {"n_experts": c.n_experts, "top_k": c.moe_top_k, "d_ff": c.moe_d_ff,
                             "norm_topk": c.moe_norm_topk, "shared": c.moe_shared_d_ff > 0,
                             "shared_d_ff": c.moe_shared_d_ff, "shared_gate": c.moe_shared_gate,
                             "layers": [i for i in range(c.n_layers) if c.is_moe(i)]}
            if c.moe_router != "softmax_topk" or c.moe_bias or c.swiglu_limit is not None:  # gpt-oss's experts
                blocks["moe"] |= {"router": c.moe_router, "bias": c.moe_bias, "swiglu_limit": c.swiglu_limit,
                                  "swiglu_alpha": c.swiglu_alpha}
        return {"family": "decoder_lm", "stacks": {"decoder": {"layers": c.n_layers, "tokens": SIDES["decoder"]}},
                "attention": attention, "blocks": blocks}

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


@functools.lru_cache(maxsize=8)
def _skeleton(cfg: LMConfig) -> DecoderLM:
    with torch.device("meta"):
        return DecoderLM(cfg)


def lm_capture_shapes(cfg: LMConfig, B: int, T: int) -> dict[str, tuple[int, ...]]:
    """Every capture name of one forward pass on (B, T) ids, with its shape (from the module tree)."""
    return _skeleton(cfg).capture_names(B, T)

