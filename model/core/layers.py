"""Building blocks shared by the model families, each recording its own capture points.

- `sinusoidal_encoding`: the paper's fixed positions;  `rotary_angles` / `apply_rotary`: RoPE (Llama);
- `LayerNorm` (the paper, BERT, GPT-2) and `RMSNorm` (Llama): record `<path>.in` / `<path>.out`;
- `FeedForward`: W_2 act(W_1 x) (the paper), or gated W_2 (act(W_g x) * W_1 x) (SwiGLU, Llama).
"""

from __future__ import annotations

import torch
from torch import nn

from model.core.recorder import record

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")


def sinusoidal_encoding(max_len: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).  (max_len, D)"""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv_freq)
    pe[:, 1::2] = torch.cos(pos * inv_freq)
    return pe.float()


def rotary_angles(n: int, d_head: int, base: float, offset: int = 0) -> torch.Tensor:
    """RoPE angles (n, d_head/2): position p rotates dimension pair i by p / base^(2i/d_head).

    Computed in float32 like Hugging Face's Llama (`inv_freq`, then positions x inv_freq), so the
    rotated q/k agree with the reference to float32 rounding."""
    inv_freq = 1.0 / (base ** (torch.arange(0, d_head, 2, dtype=torch.int64).float() / d_head))
    pos = torch.arange(offset, offset + n, dtype=torch.int64).float()
    return pos[:, None] * inv_freq[None, :]


def apply_rotary(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, hs) by angles (T, hs/2). Pairs are (i, i + hs/2) ("rotate half", the
    Hugging Face layout; GGUF's interleaved pairs are un-permuted by the loader)."""
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm (same weights and math) that records its input and output: `<path>.in`, `<path>.out`."""

    name = "norm"  # set to the module path by the model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = record(f"{self.name}.in", x)
        return record(f"{self.name}.out", super().forward(x))

    def capture_points(self, B: int, L: int) -> dict[str, tuple[int, ...]]:
        D = self.normalized_shape[0]
        return {f"{self.name}.in": (B, L, D), f"{self.name}.out": (B, L, D)}


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) * weight: LayerNorm without the mean and the bias (Llama, Qwen2)."""

    name = "norm"

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = record(f"{self.name}.in", x)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)  # as HF: in float32
        return record(f"{self.name}.out", self.weight * h.to(x.dtype))

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
