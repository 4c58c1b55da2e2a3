"""Masks and multi-head attention, written out step by step so every tensor can be recorded.

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V,    M = -∞ where blocked, 0 elsewhere
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O

Mask convention (everywhere in this project): True = attention is blocked.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model.core.recorder import hook, keep, record


def padding_mask(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, L) bool, True where the token is padding. A new tensor: `ids` is never modified."""
    return ids == pad_id


def causal_mask(n_query: int, n_key: int | None = None, offset: int = 0, device=None) -> torch.Tensor:
    """(Lq, Lk) bool, True above the diagonal: query i (at absolute position offset + i) cannot see later keys.

    With a key/value cache, the new queries start at `offset` and the keys at 0.
    """
    n_key = n_query + offset if n_key is None else n_key
    ones = torch.ones(n_query, n_key, dtype=torch.bool, device=device)
    return torch.triu(ones, diagonal=offset + 1)


def attention_mask(key_pad: torch.Tensor, n_query: int, causal: torch.Tensor | None = None) -> torch.Tensor:
    """(B, 1, Lq, Lk): padding blocks keys only (a padded query still attends to real tokens);
    the decoder's self-attention adds the look-ahead mask: blocked = future OR key is padding."""
    B, Lk = key_pad.shape
    mask = key_pad[:, None, None, :].expand(B, 1, n_query, Lk)
    if causal is not None:
        mask = mask | causal[None, None]
    return mask


class MultiHeadAttention(nn.Module):
    """W^Q, W^K, W^V, W^O are nn.Linear(d_model, d_model): all heads side by side (E = N x H)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.name = "attn"  # set to the module path (e.g. "encoder.layers.0.self_attn") by the model

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.d_head).transpose(1, 2)  # (B, L, D) -> (B, H, L, hs)

    def forward(
        self,
        x_q: torch.Tensor,  # (B, Lq, D): the queries' source (the decoder for cross-attention)
        x_kv: torch.Tensor,  # (B, Lk, D): the keys' and values' source (the encoder output for cross-attention)
        mask: torch.Tensor | None,  # (B, 1, Lq, Lk) bool, True = blocked
        cache: dict | None = None,  # key/value cache for step-by-step decoding
        static_kv: bool = False,  # cross-attention: K and V depend on the encoder only, compute them once
    ) -> torch.Tensor:
        n = self.name
        q = record(f"{n}.q", self.split_heads(self.w_q(x_q)))  # (B, H, Lq, hs)
        if cache is not None and static_kv and "k" in cache:
            k, v = cache["k"], cache["v"]  # cross-attention: hooked once, when first computed
        else:
            # Hooks see the keys/values computed in this call (with a cache: only the new positions),
            # so a position-wise hook acts once per position, as in a full teacher-forced pass.
            k = hook(f"{n}.k", self.split_heads(self.w_k(x_kv)))  # (B, H, Lk, hs)
            v = hook(f"{n}.v", self.split_heads(self.w_v(x_kv)))
            if cache is not None and not static_kv and "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
        if cache is not None:
            cache["k"], cache["v"] = k, v
        keep(f"{n}.k", k)
        keep(f"{n}.v", v)

        # Var(q·k) = d_k for unit-variance entries: dividing by √d_k keeps softmax out of saturation.
        scores = record(f"{n}.scores", q @ k.transpose(-2, -1) / math.sqrt(self.d_head))  # (B, H, Lq, Lk)
        if mask is not None:
            mask = record(f"{n}.mask", mask)
            # + M with M = -inf where blocked: exp(-inf) = 0, so blocked cells get exactly 0.
            # The additive M is (B, 1, Lq, Lk), H times smaller than the scores: cheaper than masked_fill.
            bias = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device).masked_fill_(mask, float("-inf"))
            weights = F.softmax(scores + bias, dim=-1)
            if bool(mask.all(dim=-1).any()):  # a row with no visible key: softmax gives NaN; make it 0
                weights = weights.masked_fill(mask, 0.0)
        else:
            weights = F.softmax(scores, dim=-1)
        weights = record(f"{n}.weights", weights)

        z = record(f"{n}.z", self.dropout(weights) @ v)  # (B, H, Lq, hs)
        B, H, Lq, hs = z.shape
        return record(f"{n}.out", self.w_o(z.transpose(1, 2).reshape(B, Lq, H * hs)))  # concat heads, then W^O

    def capture_points(self, B: int, Lq: int, Lk: int) -> dict[str, tuple[int, ...]]:
        """Names and shapes `forward` records, in order (module path + role)."""
        n, H, hs = self.name, self.n_heads, self.d_head
        return {f"{n}.q": (B, H, Lq, hs), f"{n}.k": (B, H, Lk, hs), f"{n}.v": (B, H, Lk, hs),
                f"{n}.scores": (B, H, Lq, Lk), f"{n}.mask": (B, 1, Lq, Lk), f"{n}.weights": (B, H, Lq, Lk),
                f"{n}.z": (B, H, Lq, hs), f"{n}.out": (B, Lq, H * hs)}
