"""Building blocks shared by the model families, each recording its own capture points.

- `sinusoidal_encoding`: the paper's fixed positions;  `rotary_angles` / `apply_rotary`: RoPE (Llama);
- `LayerNorm` (the paper, BERT, GPT-2) and `RMSNorm` (Llama): record `<path>.in` / `<path>.out`;
- `FeedForward`: W_2 act(W_1 x) (the paper), or gated W_2 (act(W_g x) * W_1 x) (SwiGLU, Llama).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from model.core.recorder import record, wanted

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
MOE_ROUTERS = ("softmax_topk", "topk_softmax")  # softmax over all experts then top k; top k logits then softmax


def sinusoidal_encoding(max_len: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).  (max_len, D)"""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv_freq)
    pe[:, 1::2] = torch.cos(pos * inv_freq)
    return pe.float()


ROPE_SCALINGS = ("default", "linear", "llama3", "yarn")


def yarn_range(dim: int, base: float, original_max_len: int, beta_fast: float = 32.0, beta_slow: float = 1.0,
               truncate: bool = True) -> tuple[float, float]:
    """YaRN's ramp (low, high) over the dim/2 pairs: pair i makes original_max_len / (2π base^(2i/dim)) turns over
    the trained context; pairs below `low` (more than beta_fast turns) keep their speed, pairs above `high` (fewer
    than beta_slow turns) are divided by the factor (transformers' find_correction_range, same float64 math)."""
    def dim_of(turns: float) -> float:
        return (dim * math.log(original_max_len / (turns * 2 * math.pi))) / (2 * math.log(base))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def rope_inv_freq(dim: int, base: float, scaling: str = "default", factor: float = 1.0,
                  low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                  original_max_len: int | None = None, beta_fast: float = 32.0, beta_slow: float = 1.0,
                  truncate: bool = True) -> torch.Tensor:
    """RoPE frequencies (dim/2,): pair i turns by base^(-2i/dim) per position, in float32 as Hugging Face.

    Scaling for long context (transformers' modeling_rope_utils, same formulas):
    - "linear": every frequency / factor (positions squeezed factor times: Gemma 3's global layers);
    - "llama3" (Llama 3.1+): wavelengths longer than original_max_len / low_freq_factor are divided by
      factor, shorter than original_max_len / high_freq_factor kept, in between a smooth blend;
    - "yarn" (gpt-oss, Qwen long context): a linear ramp over the pair index between yarn_range's (low, high)
      mixes the plain frequency (extrapolation, fast pairs) with frequency / factor (interpolation, slow pairs).
      YaRN's attention factor (cos and sin × m) is applied by apply_rotary, not here."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if scaling == "yarn":  # _compute_yarn_parameters: pos_freqs = base^(2i/dim) in float32
        pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
        low, high = yarn_range(dim, base, original_max_len, beta_fast, beta_slow, truncate)
        if low == high:
            high += 0.001  # as transformers: no division by 0
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        keep = 1 - ramp  # 1: the plain frequency (extrapolation), 0: divided by the factor (interpolation)
        return (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep
    if scaling == "linear":
        return inv_freq / factor
    if scaling == "llama3":
        low_wavelen = original_max_len / low_freq_factor
        high_wavelen = original_max_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (original_max_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    if scaling != "default":
        raise ValueError(f"RoPE scaling must be one of {ROPE_SCALINGS}, got {scaling!r}")
    return inv_freq


def rotary_angles(n: int, d_head: int, base: float, offset: int = 0, inv_freq: torch.Tensor | None = None,
                  device=None) -> torch.Tensor:
    """RoPE angles (n, d_head/2): position p rotates dimension pair i by p / base^(2i/d_head).

    Computed in float32 like Hugging Face's Llama (`inv_freq`, then positions x inv_freq), so the
    rotated q/k agree with the reference to float32 rounding. `inv_freq` (from rope_inv_freq):
    scaled or partial-rotary frequencies instead of the plain ones."""
    if inv_freq is None:
        inv_freq = 1.0 / (base ** (torch.arange(0, d_head, 2, dtype=torch.int64).float() / d_head))
    pos = torch.arange(offset, offset + n, dtype=torch.int64).float()
    angles = pos[:, None] * inv_freq[None, :]
    return angles if device is None else angles.to(device)


def apply_rotary(x: torch.Tensor, angles: torch.Tensor, in_float32: bool = False,
                 scale: float | None = None) -> torch.Tensor:
    """Rotate (B, H, T, hs) by angles (T, r/2). Pairs are (i, i + r/2) ("rotate half", the
    Hugging Face layout; GGUF's interleaved pairs are un-permuted by the loader). Partial rotary
    (GPT-NeoX, r < hs): only the first r dimensions turn, the rest pass through unchanged.
    in_float32 (OLMo 2): a bfloat16 x is rotated with float32 cos/sin, then cast back.
    scale (YaRN's attention factor m, gpt-oss): cos and sin × m in float32 before the cast, as transformers, so
    q and k both grow by m and every score by m²."""
    r = 2 * angles.shape[-1]
    if r < x.shape[-1]:
        return torch.cat((apply_rotary(x[..., :r], angles, in_float32, scale), x[..., r:]), dim=-1)
    cos, sin = _cos_sin(angles, scale)
    if in_float32 and x.dtype in (torch.bfloat16, torch.float16):
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return (x * cos + rotated * sin).to(x.dtype)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def tensor_version(t: torch.Tensor) -> int:
    """t's in-place change counter (an inference-mode tensor has none: -1), for memos kept on a tensor."""
    return -1 if t.is_inference() else t._version


def _cos_sin(angles: torch.Tensor, scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of [angles, angles] (T, r), × scale if given. Computed once per angles tensor and kept on it:
    a forward hands the same angles to every layer, which rotates q and k (Hugging Face also computes them once
    per forward), so 2 x n_layers calls share one cos/sin; same numbers as computing them each time."""
    key = (scale, tensor_version(angles))  # an in-place change of the angles invalidates the memo
    memo = getattr(angles, "_lab_cos_sin", None)
    if memo is not None and memo[0] == key:
        return memo[1], memo[2]
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = (emb.cos() * scale, emb.sin() * scale) if scale is not None else (emb.cos(), emb.sin())
    angles._lab_cos_sin = (key, cos, sin)
    return cos, sin


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm (same weights and math) that records its input and output: `<path>.in`, `<path>.out`."""

    name = "norm"  # set to the module path by the model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = record(f"{self.name}.in", x)
        return record(f"{self.name}.out", super().forward(x))

    def capture_points(self, B: int, L: int) -> dict[str, tuple[int, ...]]:
        D = self.normalized_shape[0]
        return {f"{self.name}.in": (B, L, D), f"{self.name}.out": (B, L, D)}


RMS_STYLES = ("llama", "gemma", "olmo")


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) * weight: LayerNorm without the mean and the bias (Llama, Qwen2).

    Normalized in float32 (as Hugging Face); the styles differ only in where the weight applies,
    which matters in bfloat16 (in float32 all three are the same numbers for the same weight):
    - "llama": cast back to the input dtype, then × weight;
    - "gemma": × (1 + weight) in float32, then cast (the stored weight is an offset from 1);
    - "olmo": × weight in float32, then cast."""

    name = "norm"

    def __init__(self, d_model: int, eps: float = 1e-6, style: str = "llama"):
        super().__init__()
        if style not in RMS_STYLES:
            raise ValueError(f"RMSNorm style must be one of {RMS_STYLES}, got {style!r}")
        self.weight = nn.Parameter(torch.ones(d_model) if style != "gemma" else torch.zeros(d_model))
        self.eps = eps
        self.style = style

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = record(f"{self.name}.in", x)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)  # as HF: in float32
        if self.style == "gemma":
            h = (h * (1.0 + self.weight.float())).to(x.dtype)
        elif self.style == "olmo":
            h = (self.weight * h).to(x.dtype)
        else:
            h = self.weight * h.to(x.dtype)
        return record(f"{self.name}.out", h)

    def capture_points(self, B: int, L: int) -> dict[str, tuple[int, ...]]:
        D = self.weight.shape[0]
        return {f"{self.name}.in": (B, L, D), f"{self.name}.out": (B, L, D)}


def activation(kind: str) -> nn.Module:
    if kind == "relu":
        return nn.ReLU()
    if kind == "gelu":
        return nn.GELU()  # exact (erf)
    if kind == "gelu_tanh":
        return nn.GELU(approximate="tanh")  # GPT-2's "gelu_new"
    if kind == "silu":
        return nn.SiLU()
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {kind!r}")


class FeedForward(nn.Module):
    """FFN(x) = W_2 act(W_1 x + b_1) + b_2, applied to each position: d_model -> d_ff -> d_model.

    gated=True (SwiGLU): FFN(x) = W_2 (act(W_g x) * W_1 x); `ffn.gate` records act(W_g x) and
    `ffn.hidden` the product, the input of W_2 in both forms."""

    def __init__(self, d_model: int, d_ff: int, activation_kind: str = "relu", dropout: float = 0.0,
                 bias: bool = True, gated: bool = False):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.gate = nn.Linear(d_model, d_ff, bias=bias) if gated else None
        self.act = activation(activation_kind)
        self.dropout = nn.Dropout(dropout)
        self.name = "ffn"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is None:
            h = record(f"{self.name}.hidden", self.act(self.linear1(x)))  # (B, L, d_ff)
        else:
            g = record(f"{self.name}.gate", self.act(self.gate(x)))
            h = record(f"{self.name}.hidden", g * self.linear1(x))
        return record(f"{self.name}.out", self.linear2(self.dropout(h)))  # (B, L, D)

    def capture_points(self, B: int, L: int) -> dict[str, tuple[int, ...]]:
        d_ff = self.linear1.out_features
        gate = {} if self.gate is None else {f"{self.name}.gate": (B, L, d_ff)}
        return gate | {f"{self.name}.hidden": (B, L, d_ff), f"{self.name}.out": (B, L, self.linear2.out_features)}


class Expert(nn.Module):
    """One expert of a mixture: a gated FFN, linear2(act(gate(x)) * linear1(x)), run only on the
    positions routed to it. It records nothing itself: `MoEFeedForward` records its output.

    swiglu_limit (gpt-oss): the clamped SwiGLU of transformers' GptOssExperts, with biases on every projection:
        g = min(gate(x), limit),  u = clamp(linear1(x), -limit, limit)
        out = linear2((u + 1) · g · sigmoid(alpha · g))"""

    def __init__(self, d_model: int, d_ff: int, activation_kind: str = "silu", bias: bool = False,
                 swiglu_limit: float | None = None, swiglu_alpha: float = 1.702):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)  # up
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)  # down
        self.act = activation(activation_kind)
        self.limit, self.alpha = swiglu_limit, swiglu_alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (n, D) -> (n, D)
        if self.limit is None:
            return self.linear2(self.act(self.gate(x)) * self.linear1(x))
        # x @ W + b, the bias added after the product as transformers does (nn.Linear's fused bias rounds once less
        # in bfloat16)
        gate = _matmul_bias(x, self.gate).clamp(min=None, max=self.limit)  # from above only: very negative shuts
        up = _matmul_bias(x, self.linear1).clamp(min=-self.limit, max=self.limit)
        glu = gate * torch.sigmoid(gate * self.alpha)
        return _matmul_bias((up + 1) * glu, self.linear2)


def _matmul_bias(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    y = x @ linear.weight.T
    return y if linear.bias is None else y + linear.bias


class MoEFeedForward(nn.Module):
    """Mixture of experts in place of the FFN (Mixtral, Qwen2-MoE, OLMoE), per position x:

        p = softmax(router(x))                   over the n_experts, in float32 (as Hugging Face)
        the top_k experts by p, weights w = their p (renormalized to sum 1 when norm_topk: Mixtral)
        out = Σ_j w_j · expert_{e_j}(x)  (+ sigmoid(shared_gate(x)) · shared_expert(x): Qwen2-MoE)

    router="topk_softmax" (gpt-oss): the top_k experts by router(x) (a router with a bias), and w = the softmax of
    those k logits alone, in the model's dtype (transformers' GptOssTopKRouter); `router.probs` then holds w at the
    chosen experts and 0 elsewhere (the only probabilities the model forms). expert_bias / swiglu_limit: every
    expert projection has a bias and the SwiGLU is clamped (Expert).

    Capture points (<ffn> = decoder.layers.{i}.ffn), each also a hook point:
      <ffn>.router.logits        (B, T, E)   router output
      <ffn>.router.probs         (B, T, E)   softmax (float32 for a bfloat16/float16 model)
      <ffn>.router.topk_ids      (B, T, k)   int64, the chosen experts, most probable first
      <ffn>.router.topk_weights  (B, T, k)   their weights (the model's dtype)
      <ffn>.experts.{e}.out      (B, T, D)   expert e's output before its weight, at the positions routed
                                             to it, 0 elsewhere; formed only when recorded or hooked (a
                                             hook that zeroes it removes expert e from those positions)
      <ffn>.shared_expert.{gate, hidden, out}, <ffn>.shared_gate (B, T, 1)   (shared expert, if any)
      <ffn>.out                  (B, T, D)
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int, d_ff: int, activation_kind: str = "silu",
                 norm_topk: bool = False, shared_d_ff: int = 0, shared_gate: bool = False,
                 router: str = "softmax_topk", bias: bool = False, swiglu_limit: float | None = None,
                 swiglu_alpha: float = 1.702):
        super().__init__()
        if router not in MOE_ROUTERS:
            raise ValueError(f"router must be one of {MOE_ROUTERS}, got {router!r}")
        self.router = nn.Linear(d_model, n_experts, bias=bias)
        self.experts = nn.ModuleList(Expert(d_model, d_ff, activation_kind, bias, swiglu_limit, swiglu_alpha)
                                     for _ in range(n_experts))
        self.router_kind = router
        self.shared_expert = (FeedForward(d_model, shared_d_ff, activation_kind, 0.0, bias=False, gated=True)
                              if shared_d_ff else None)
        self.shared_gate = nn.Linear(d_model, 1, bias=False) if shared_d_ff and shared_gate else None
        self.top_k, self.norm_topk, self.d_model = top_k, norm_topk, d_model
        self.name = "ffn"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.name
        B, T, D = x.shape
        logits = record(f"{n}.router.logits", self.router(x))  # (B, T, E)
        if self.router_kind == "topk_softmax":  # gpt-oss: the k largest logits, then a softmax over those k only
            top_logits, top_ids = logits.topk(self.top_k, dim=-1)  # (B, T, k)
            top_w = torch.softmax(top_logits, dim=-1, dtype=top_logits.dtype)
            probs = record(f"{n}.router.probs", torch.zeros_like(logits).scatter_(-1, top_ids, top_w))
            top_w = probs.gather(-1, top_ids)  # the same numbers, or a hook's (as a hook on probs acts below)
        else:
            low = logits.dtype in (torch.bfloat16, torch.float16)  # as HF: the router's softmax in float32
            probs = record(f"{n}.router.probs", torch.softmax(logits, dim=-1, dtype=torch.float32 if low else None))
            top_w, top_ids = probs.topk(self.top_k, dim=-1)  # (B, T, k)
        if self.norm_topk:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        top_ids = record(f"{n}.router.topk_ids", top_ids)
        top_w = record(f"{n}.router.topk_weights", top_w.to(x.dtype))
        flat, ids, w = x.reshape(B * T, D), top_ids.reshape(B * T, -1), top_w.reshape(B * T, -1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            tok, slot = (ids == e).nonzero(as_tuple=True)  # the positions routed to e, and which of their k picks
            name = f"{n}.experts.{e}.out"
            if not wanted(name):
                if tok.numel():
                    out.index_add_(0, tok, expert(flat[tok]) * w[tok, slot, None])
                continue
            dense = flat.new_zeros(B * T, D).index_copy_(0, tok, expert(flat[tok]))
            y = record(name, dense.view(B, T, D)).reshape(B * T, D)[tok]
            out.index_add_(0, tok, y * w[tok, slot, None])
        out = out.view(B, T, D)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_gate is not None:
                shared = record(f"{n}.shared_gate", torch.sigmoid(self.shared_gate(x))) * shared
            out = out + shared
        return record(f"{n}.out", out)

    def capture_points(self, B: int, L: int) -> dict[str, tuple[int, ...]]:
        n, E, k, D = self.name, len(self.experts), self.top_k, self.d_model
        pts = {f"{n}.router.logits": (B, L, E), f"{n}.router.probs": (B, L, E),
               f"{n}.router.topk_ids": (B, L, k), f"{n}.router.topk_weights": (B, L, k)}
        pts |= {f"{n}.experts.{e}.out": (B, L, D) for e in range(E)}
        if self.shared_expert is not None:
            pts |= self.shared_expert.capture_points(B, L)
            if self.shared_gate is not None:
                pts[f"{n}.shared_gate"] = (B, L, 1)
        return pts | {f"{n}.out": (B, L, D)}
