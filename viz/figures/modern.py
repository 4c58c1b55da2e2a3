"""Figures of "What changed since 2017" (viz/pages/since2017.py): the 2017 Transformer's blocks beside a
modern LM's, with live tensors. Pure: arrays in, plotly out; the closed forms the figures draw are here too,
so the tests can hold each drawn number against the trace and the formula.

- RoPE: `rope_angles` (position p turns pair i by p·base^(−2i/d)), `rotate` (Hugging Face's rotate-half
  pairs (i, i + d/2)), `rope_scores` (one q·k pair's score as the two tokens move apart), `added_scores` (the
  same with the 2017 sinusoidal PE added to the embeddings), `rope_figure`;
- GQA: `kv_cache_bytes`, `gqa_figure`;
- RMSNorm vs LayerNorm: `rms_norm`, `layer_norm`, `norm_figure`;
- SwiGLU: `swiglu_figure` (the gate SiLU(W_g x) beside the up projection W_1 x);
- Pre-LN: `residual_norms`, `preln_figure`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from viz.figures.attention import every_tick, show_token, token_labels
from viz.i18n import t

MIB = 2**20


# ---------------------------------------------------------------------- RoPE vs sinusoidal


def rope_angles(n: int, d_head: int, base: float, offset: int = 0) -> np.ndarray:
    """[n, d_head/2]: position p rotates dimension pair i by p / base^(2i/d_head) radians."""
    inv = 1.0 / base ** (np.arange(0, d_head, 2, dtype=np.float64) / d_head)
    return np.arange(offset, offset + n, dtype=np.float64)[:, None] * inv[None, :]


def rotate(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Rotate x [..., d] by angles [..., d/2]: pair (i, i + d/2) turns by angle i (rotate-half layout)."""
    half = x.shape[-1] // 2
    c, s = np.cos(angles), np.sin(angles)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def rope_scores(q: np.ndarray, k: np.ndarray, base: float, starts: Sequence[int], max_delta: int) -> dict:
    """{start: [max_delta + 1]}: the score rot(q, start + Δ)·rot(k, start)/√d of one unrotated query and key
    as the query moves Δ positions after the key. RoPE: the curves of every start coincide (q·k depends on Δ)."""
    d = q.shape[-1]
    out = {}
    for n0 in starts:
        qa = rotate(q[None, :], rope_angles(max_delta + 1, d, base, n0))
        ka = rotate(k[None, :], rope_angles(1, d, base, n0))
        out[n0] = (qa @ ka[0]) / np.sqrt(d)
    return out


def added_scores(e_q: np.ndarray, e_k: np.ndarray, pe: np.ndarray, w_q: np.ndarray, b_q: np.ndarray | None,
                 w_k: np.ndarray, b_k: np.ndarray | None, head: int, n_heads: int, starts: Sequence[int],
                 max_delta: int) -> dict:
    """The 2017 way, for one head of a layer-0 attention that reads embedding + PE: {start: [max_delta + 1]} of
    (W_q (e_q + PE[start + Δ]) + b_q)_h · (W_k (e_k + PE[start]) + b_k)_h / √d_head. The curves differ by
    start: added positions mix content and absolute position."""
    d_head = w_q.shape[0] // n_heads
    sl = slice(head * d_head, (head + 1) * d_head)
    bq = np.zeros(w_q.shape[0]) if b_q is None else b_q
    bk = np.zeros(w_k.shape[0]) if b_k is None else b_k
    out = {}
    for n0 in starts:
        qs = ((e_q[None, :] + pe[n0:n0 + max_delta + 1]) @ w_q.T + bq)[:, sl]
        k = ((e_k + pe[n0]) @ w_k.T + bk)[sl]
        out[n0] = qs @ k / np.sqrt(d_head)
    return out


def rope_figure(angles: np.ndarray, rope: dict, added: dict | None, pair_label: str = "") -> go.Figure:
    """Left: the angles each position turns each dimension pair by (mod 2π). Right: one q·k pair's score as the
    two tokens move apart, for two starting positions: rotated (today) and, if given, added (2017)."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.16,
                        subplot_titles=(t("RoPE angle (mod 2π) of each dimension pair"),
                                        t("Score of one q·k pair vs distance {pair}", pair=pair_label)))
    fig.add_trace(go.Heatmap(z=np.mod(angles, 2 * np.pi), colorscale="Twilight", zmin=0, zmax=2 * np.pi,
                             colorbar=dict(title=t("radians"), x=0.39, len=0.9, thickness=12),
                             hovertemplate=t("position %{y} · pair %{x}<br>angle %{z:.3f} rad") + "<extra></extra>"),
                  1, 1)
    dash = ["solid", "dot", "dash"]
    for i, (n0, y) in enumerate(rope.items()):
        fig.add_trace(go.Scatter(y=y, mode="lines", name=t("rotated (today), key at {p}", p=n0),
                                 line=dict(color="#1f77b4", dash=dash[i % 3], width=2.5 - i)), 1, 2)
    for i, (n0, y) in enumerate((added or {}).items()):
        fig.add_trace(go.Scatter(y=y, mode="lines", name=t("added (2017), key at {p}", p=n0),
                                 line=dict(color="#ff7f0e", dash=dash[i % 3], width=2.5 - i)), 1, 2)
    fig.update_xaxes(title_text=t("dimension pair i"), row=1, col=1)
    fig.update_yaxes(title_text=t("position"), autorange="reversed", row=1, col=1)
    fig.update_xaxes(title_text=t("distance Δ (query after key)"), row=1, col=2)
    fig.update_yaxes(title_text=t("score q·k/√d"), row=1, col=2)
    fig.update_layout(height=430, margin=dict(l=50, r=20, t=50, b=50), legend=dict(orientation="h", y=-0.2))
    return fig


# ---------------------------------------------------------------------- GQA


def kv_cache_bytes(n_layers: int, n_kv_heads: int, d_head: int, tokens: int, bytes_per: int) -> int:
    """K and V of every layer for `tokens` positions: 2 · layers · K/V heads · d_head · tokens · bytes."""
    return 2 * n_layers * n_kv_heads * d_head * tokens * bytes_per


def gqa_figure(n_layers: int, n_heads: int, n_kv_heads: int, d_head: int, bytes_per: int,
               max_tokens: int = 8192) -> go.Figure:
    """Left: which K/V head each query head reads (h // (H / H_kv)). Right: KV-cache MiB vs context length with
    one K/V head per query head (as in 2017) and with the model's shared ones."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.35, 0.65], horizontal_spacing=0.12,
                        subplot_titles=(t("{h} query heads → {kv} K/V heads", h=n_heads, kv=n_kv_heads),
                                        t("KV cache ({b} bytes a number)", b=bytes_per)))
    group = n_heads // n_kv_heads
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    for h in range(n_heads):
        kv = h // group
        ky = (kv + 0.5) * n_heads / n_kv_heads - 0.5
        fig.add_trace(go.Scatter(x=[0, 1], y=[h, ky], mode="lines", line=dict(color=palette[kv % 8], width=2),
                                 hoverinfo="skip", showlegend=False), 1, 1)
    fig.add_trace(go.Scatter(x=[0] * n_heads, y=list(range(n_heads)), mode="markers+text",
                             text=[f"Q{h}" for h in range(n_heads)], textposition="middle left", showlegend=False,
                             marker=dict(size=12, color=[palette[(h // group) % 8] for h in range(n_heads)])), 1, 1)
    ky = [(kv + 0.5) * n_heads / n_kv_heads - 0.5 for kv in range(n_kv_heads)]
    fig.add_trace(go.Scatter(x=[1] * n_kv_heads, y=ky, mode="markers+text",
                             text=[f"K/V{kv}" for kv in range(n_kv_heads)], textposition="middle right",
                             showlegend=False, marker=dict(size=18, symbol="square",
                                                           color=[palette[kv % 8] for kv in range(n_kv_heads)])), 1, 1)
    tokens = np.unique(np.linspace(0, max_tokens, 65).astype(int))
    for heads, name, color in ((n_heads, t("one K/V head per query head ({h})", h=n_heads), "#7f7f7f"),
                               (n_kv_heads, t("shared K/V heads ({h}), this model", h=n_kv_heads), "#1f77b4")):
        fig.add_trace(go.Scatter(x=tokens, y=[kv_cache_bytes(n_layers, heads, d_head, int(n), bytes_per) / MIB
                                              for n in tokens], mode="lines", name=name,
                                 line=dict(color=color, width=2.5)), 1, 2)
    fig.update_xaxes(visible=False, range=[-0.6, 1.6], row=1, col=1)
    fig.update_yaxes(visible=False, autorange="reversed", row=1, col=1)
    fig.update_xaxes(title_text=t("tokens in the context"), row=1, col=2)
    fig.update_yaxes(title_text=t("MiB"), row=1, col=2)
    fig.update_layout(height=380, margin=dict(l=30, r=20, t=50, b=50), legend=dict(orientation="h", y=-0.25))
    return fig


# ---------------------------------------------------------------------- RMSNorm vs LayerNorm


def rms_norm(x: np.ndarray, g: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) · g."""
    x = x.astype(np.float64)
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * g


def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray | None, eps: float) -> np.ndarray:
    """(x − mean) / sqrt(var + eps) · g + b."""
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    out = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * g
    return out if b is None else out + b


def norm_figure(x: np.ndarray, rms_out: np.ndarray, ln_out: np.ndarray, token: str = "") -> go.Figure:
    """One residual vector (top) and what each norm makes of it (bottom), dimension by dimension."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=(t("residual vector x of “{tok}”", tok=show_token(token)),
                                        t("RMSNorm(x) (the model's) vs LayerNorm(x) (same gain, no bias)")))
    d = np.arange(len(x))
    fig.add_trace(go.Scatter(x=d, y=x, mode="lines", name="x", line=dict(color="#7f7f7f", width=1)), 1, 1)
    fig.add_trace(go.Scatter(x=d, y=rms_out, mode="lines", name=t("RMSNorm (today)"),
                             line=dict(color="#1f77b4", width=1.5)), 2, 1)
    fig.add_trace(go.Scatter(x=d, y=ln_out, mode="lines", name=t("LayerNorm (2017)"),
                             line=dict(color="#ff7f0e", width=1, dash="dot")), 2, 1)
    fig.update_xaxes(title_text=t("dimension"), row=2, col=1)
    fig.update_layout(height=460, margin=dict(l=50, r=20, t=50, b=50), legend=dict(orientation="h", y=-0.15))
    return fig


# ---------------------------------------------------------------------- SwiGLU


def swiglu_figure(gate: np.ndarray, up: np.ndarray, tokens: Sequence[str], units: Sequence[int]) -> go.Figure:
    """Heatmaps, tokens × the chosen hidden units: the gate SiLU(W_g x) beside the up projection W_1 x (their
    product is what the FFN's W_2 reads)."""
    labels = token_labels(tokens, gate.shape[0])
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=(t("gate SiLU(W_g x)"), t("up projection W_1 x")))
    ux = [str(u) for u in units]
    g, u = gate[:, units], up[:, units]
    for col, z in enumerate((g, u), start=1):
        lim = float(np.abs(z).max()) or 1.0
        fig.add_trace(go.Heatmap(z=z, x=ux, y=labels, colorscale="RdBu", zmid=0, zmin=-lim, zmax=lim,
                                 colorbar=dict(x=0.46 if col == 1 else 1.0, len=0.9),
                                 hovertemplate=t("token %{y} · unit %{x}<br>%{z:.3f}") + "<extra></extra>"), 1, col)
    fig.update_yaxes(autorange="reversed", **every_tick(labels))
    fig.update_xaxes(title_text=t("hidden unit"), type="category")  # unit ids are names, not a scale
    fig.update_layout(height=max(320, 80 + 18 * len(labels)), margin=dict(l=90, r=20, t=50, b=50))
    return fig


# ---------------------------------------------------------------------- Pre-LN


def residual_norms(layer_outs: Sequence[np.ndarray]) -> np.ndarray:
    """Median over tokens of ‖x‖ of each layer's output [T, D] (the median: a sink token's norm is far larger)."""
    return np.array([float(np.median(np.linalg.norm(x.astype(np.float64), axis=-1))) for x in layer_outs])


def preln_figure(lm_norms: np.ndarray, toy_norms: np.ndarray, lm_name: str, toy_name: str) -> go.Figure:
    fig = go.Figure()
    fig.add_trace(go.Scatter(y=lm_norms, x=list(range(len(lm_norms))), mode="lines+markers",
                             name=t("{m}: pre-LN (today)", m=lm_name), line=dict(color="#1f77b4")))
    fig.add_trace(go.Scatter(y=toy_norms, x=list(range(len(toy_norms))), mode="lines+markers",
                             name=t("{m}: post-LN (2017)", m=toy_name), line=dict(color="#ff7f0e")))
    fig.update_layout(title=t("Median ‖x‖ of the residual stream after each layer"), height=360,
                      margin=dict(l=50, r=20, t=50, b=50), xaxis=dict(title=t("layer")),
                      yaxis=dict(title="‖x‖", type="log"), legend=dict(orientation="h", y=-0.2))
    return fig
