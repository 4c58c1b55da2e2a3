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

Long prompts (more tokens than long_views.CELLS_UP_TO): a per-token figure shows a window of WINDOW_ROWS tokens
around the chosen one (`token_window`); a T × T mask is pooled to blocks (`pooled_open`: the share of open cells
of each block, `block_labels`), and the sliding window's reach is its closed form (`window_reach`), so no page
holds every layer's T × T at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from viz.figures.attention import every_tick, module_title, show_token, token_labels
from viz.i18n import t

MIB = 2**20
WINDOW_ROWS = 64  # long prompts: a per-token figure shows this many tokens (rows) around the chosen one: the
                 # SwiGLU map keeps its 18 px a labelled row (1,232 px), the router map ~10 px in its 700
POOL_BLOCKS = 128  # long prompts: a T × T mask is pooled to at most this many blocks a side


# ---------------------------------------------------------------------- long prompts: windows and blocks


def token_window(T: int, pos: int, n: int | None = None) -> tuple[int, int]:
    """[a, b): the n (default WINDOW_ROWS) positions around `pos`, inside 0..T (pos in the middle where it can be)."""
    n = max(1, min(T, n or WINDOW_ROWS))
    a = max(0, min(pos - n // 2, T - n))
    return a, a + n


def block_labels(edges: Sequence[int]) -> list[str]:
    """A label per block of positions edges[i] .. edges[i+1]-1: "a–b" ("a" for a block of one position)."""
    return [f"{a}" if b - a == 1 else f"{a}–{b - 1}" for a, b in zip(edges[:-1], edges[1:], strict=True)]


def pooled_open(mask: np.ndarray, edges: Sequence[int]) -> np.ndarray:
    """[n, n]: the share of open cells (mask False) of each block (query block a × key block b) of a [T, T]
    mask (True = blocked), blocks from `edges` (model.analysis.long.block_edges)."""
    starts = np.asarray(edges[:-1])
    sizes = np.diff(edges).astype(np.float64)
    by_key = np.add.reduceat(~np.asarray(mask, bool), starts, axis=1, dtype=np.int64)  # (T, n): open keys per block
    return np.add.reduceat(by_key, starts, axis=0) / (sizes[:, None] * sizes[None, :])


def pooled_share(row: np.ndarray, edges: Sequence[int]) -> np.ndarray:
    """[n]: the share of True (or the mean) of a [T] row in each block."""
    return np.add.reduceat(np.asarray(row, np.float64), np.asarray(edges[:-1])) / np.diff(edges)


# ---------------------------------------------------------------------- RoPE vs sinusoidal


def rope_angles(n: int, d_head: int, base: float, offset: int = 0, inv: np.ndarray | None = None) -> np.ndarray:
    """[n, d_head/2]: position p rotates dimension pair i by p / base^(2i/d_head) radians (`inv`: the model's own
    frequencies instead, e.g. scaled for long context: `inv_freq_of`)."""
    if inv is None:
        inv = 1.0 / base ** (np.arange(0, d_head, 2, dtype=np.float64) / d_head)
    return np.arange(offset, offset + n, dtype=np.float64)[:, None] * inv[None, :]


def rotate(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Rotate x [..., d] by angles [..., d/2]: pair (i, i + d/2) turns by angle i (rotate-half layout)."""
    half = x.shape[-1] // 2
    c, s = np.cos(angles), np.sin(angles)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def rope_scores(q: np.ndarray, k: np.ndarray, base: float, starts: Sequence[int], max_delta: int,
                inv: np.ndarray | None = None) -> dict:
    """{start: [max_delta + 1]}: the score rot(q, start + Δ)·rot(k, start)/√d of one unrotated query and key
    as the query moves Δ positions after the key. RoPE: the curves of every start coincide (q·k depends on Δ)."""
    d = q.shape[-1]
    out = {}
    for n0 in starts:
        qa = rotate(q[None, :], rope_angles(max_delta + 1, d, base, n0, inv))
        ka = rotate(k[None, :], rope_angles(1, d, base, n0, inv))
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


def rope_figure(angles: np.ndarray, rope: dict, added: dict | None, pair_label: str = "",
                positions: Sequence[int] | None = None) -> go.Figure:
    """Left: the angles each position turns each dimension pair by (mod 2π); `positions`: the positions of the
    rows (default 0, 1, …; a long prompt's window). Right: one q·k pair's score as the two tokens move apart,
    for two starting positions: rotated (today) and, if given, added (2017)."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.16,
                        subplot_titles=(t("RoPE angle (mod 2π) of each dimension pair"),
                                        t("Score of one q·k pair vs distance {pair}", pair=pair_label)))
    fig.add_trace(go.Heatmap(z=np.mod(angles, 2 * np.pi), y=None if positions is None else list(positions),
                             colorscale="Twilight", zmin=0, zmax=2 * np.pi,
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


def swiglu_figure(gate: np.ndarray, up: np.ndarray, tokens: Sequence[str], units: Sequence[int],
                  labels: Sequence[str] | None = None) -> go.Figure:
    """Heatmaps, tokens × the chosen hidden units: the gate SiLU(W_g x) beside the up projection W_1 x (their
    product is what the FFN's W_2 reads). `labels`: the rows' labels (default "i: token" from 0; a long
    prompt's window passes its own)."""
    labels = token_labels(tokens, gate.shape[0]) if labels is None else list(labels)
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


def residual_norms(layer_outs: Iterable[np.ndarray]) -> np.ndarray:
    """Median over tokens of ‖x‖ of each layer's output [T, D] (the median: a sink token's norm is far larger).
    A generator is read one layer at a time: a long prompt never holds every layer's stream at once."""
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


# ---------------------------------------------------------------------- 2024–2026 mechanisms
# Each reads the model's description (trace.meta["model"]: model/core/describe.py), never a capture name's
# shape of words, and draws tensors the trace holds.


def plain_scale(info: Mapping) -> float:
    """1/√d_head: the 2017 query scale."""
    return 1.0 / float(np.sqrt(info["d_head"]))


def mechanisms(info: Mapping) -> dict:
    """What one attention module does beyond 2017, from its description entry: {"scale": the real query scale,
    "scale_is_plain": whether it is 1/√d_head, "softcap", "window", "qk_norm", "sinks" (gpt-oss's learned sink
    logit per head, or None)}."""
    scale = float(info.get("scale") or plain_scale(info))
    return {"scale": scale, "scale_is_plain": bool(np.isclose(scale, plain_scale(info), rtol=1e-6)),
            "softcap": info.get("softcap"), "window": info.get("window"), "qk_norm": bool(info.get("qk_norm")),
            "sinks": info.get("sinks") or None}


def is_modern(info: Mapping) -> bool:
    """Whether an attention module's score pipeline differs from softmax(QKᵀ/√d_k + M)."""
    m = mechanisms(info)
    return not m["scale_is_plain"] or bool(m["softcap"]) or bool(m["window"]) or m["qk_norm"] or bool(m["sinks"])


def soft_cap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap · tanh(x / cap): near x for |x| ≪ cap, never beyond ±cap."""
    return cap * np.tanh(np.asarray(x, np.float64) / cap)


def _arr(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        x = x.float() if x.dtype.is_floating_point else x
        x = x.numpy()
    return np.asarray(x)


def described_pipeline(trace, name: str, head: int, info: Mapping, rows: tuple[int, int] | None = None,
                       labels: tuple[Sequence[str], Sequence[str]] | None = None) -> go.Figure:
    """The score pipeline as this module computes it: q·kᵀ | × the real scale | soft-cap (when the model caps)
    | + M (its own mask: look-ahead, and the sliding window on a local layer) | softmax. Every panel is a
    capture: `.scores` (= q·kᵀ × scale), `.scores_capped`, `.mask`, `.weights`; the first panel is
    `.scores` / scale (the same numbers as q·kᵀ from `.q` and `.k`)."""
    m = mechanisms(info)
    scaled = _arr(trace[f"{name}.scores"])[0, head].astype(np.float64)  # (Lq, Lk)
    qk = scaled / m["scale"]
    capped = _arr(trace[f"{name}.scores_capped"])[0, head].astype(np.float64) if m["softcap"] else None
    blocked = _arr(trace[f"{name}.mask"])[0, 0].astype(bool) if f"{name}.mask" in trace else np.zeros_like(
        scaled, bool)
    w = _arr(trace[f"{name}.weights"])[0, head].astype(np.float64)
    n_q, n_k = scaled.shape
    y, x = labels if labels is not None else ([str(i) for i in range(n_q)], [str(j) for j in range(n_k)])
    a, b = rows if rows is not None else (0, n_q)
    sl = slice(a, b)
    y = list(y)[sl]
    last = capped if capped is not None else scaled
    panels = [(qk, "q·kᵀ"), (scaled, t("× scale {s}", s=f"{m['scale']:.4g}")
                                      + ("" if m["scale_is_plain"] else "<br>" + t("(not 1/√d_k = {p})",
                                                                                 p=f"{plain_scale(info):.4g}")))]
    if capped is not None:
        panels.append((capped, t("soft-cap: {c}·tanh(s/{c})", c=F_num(m["softcap"]))))
    panels.append((np.where(blocked, np.nan, last), t("+ M (dark = −∞)") if not m["window"]
                   else t("+ M, window {w} (dark = −∞)", w=m["window"])))
    titles = [p[1] for p in panels] + [t("softmax → weights") if not m["sinks"] else
                                       t("softmax with sink s_h = {s} → weights", s=f"{m['sinks'][head]:.4g}")]
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.035)
    r = float(np.nanmax(np.abs(qk))) or 1.0  # one colour range for every score panel: the steps shrink visibly
    for c, (z, _title) in enumerate(panels, start=1):
        bar = dict(orientation="h", x=0.4, xanchor="center", y=-0.32, yanchor="top", len=0.7, thickness=10,
                   title=dict(text=t("scores (one scale)"), side="bottom"))  # under the score panels
        fig.add_trace(go.Heatmap(z=z[sl].astype(np.float32), x=list(x), y=y, colorscale="RdBu_r", zmin=-r, zmax=r,
                                 zmid=0, showscale=c == len(panels), colorbar=bar,
                                 hovertemplate=t("query %{y}<br>key %{x}<br>value %{z:.4g}") + "<extra></extra>"),
                      1, c)
    over = np.where(blocked[sl], 1.0, np.nan).astype(np.float32)
    fig.add_trace(go.Heatmap(z=over, x=list(x), y=y, colorscale=[[0, "#3b3b3b"], [1, "#3b3b3b"]], showscale=False,
                             hovertemplate=t("query %{y}<br>key %{x}<br>M = −∞ (blocked)") + "<extra></extra>"),
                  1, len(panels))
    fig.add_trace(go.Heatmap(z=w[sl].astype(np.float32), x=list(x), y=y, colorscale="Blues", zmin=0, zmax=1,
                             colorbar=dict(x=1.01, len=0.8, thickness=10),
                             hovertemplate=t("query %{y}<br>key %{x}<br>weight %{z:.4f}") + "<extra></extra>"),
                  1, len(titles))
    fig.update_annotations(font_size=11)  # the subplot titles: five panels side by side
    fig.update_yaxes(autorange="reversed", type="category", showticklabels=False)
    fig.update_yaxes(showticklabels=len(y) <= 40, row=1, col=1)
    fig.update_xaxes(type="category", showticklabels=n_k <= 40, tickangle=-60)
    fig.update_layout(title=t("{name} · head {head}: softmax(M + {steps})", name=module_title(name), head=head,
                              steps="c·tanh(q·kᵀ × s / c)" if capped is not None else "q·kᵀ × s"),
                      height=max(420, min(700, 200 + 12 * len(y))), margin=dict(l=90, r=10, t=90, b=150))
    return fig


def F_num(v: float) -> str:
    return f"{float(v):.4g}"


def window_masks(trace, name: str, info: Mapping) -> dict[str, np.ndarray]:
    """The masks behind one decoder-LM attention module, each [Lq, Lk] (True = blocked): the look-ahead mask,
    on a sliding layer the sliding-window mask (`masks.sliding`: look-ahead too, and keys `window` or more
    positions back), and the mask the module used (`.mask`)."""
    used = _arr(trace[f"{name}.mask"])[0, 0].astype(bool)
    n_q, n_k = used.shape
    out = {}
    if "masks.causal" in trace:
        out["look-ahead"] = _arr(trace["masks.causal"]).astype(bool)[:n_q, :n_k]
    if info.get("window") and "masks.sliding" in trace:
        out["sliding"] = _arr(trace["masks.sliding"]).astype(bool)[:n_q, :n_k]
    out["used"] = used
    return out


def window_mask_figure(masks: Mapping[str, np.ndarray], weights: np.ndarray, window: int | None,
                       labels: tuple[Sequence[str], Sequence[str]], rows: tuple[int, int] | None = None) -> go.Figure:
    """The look-ahead mask, the sliding-window mask (when the layer has one) and the mask used, beside the
    weights they produce (one head). Masks: 1 = blocked."""
    names = {"look-ahead": t("look-ahead (masks.causal)"),
             "sliding": t("sliding window, W = {w} (masks.sliding)", w=window), "used": t("mask used (.mask)")}
    y, x = labels
    a, b = rows if rows is not None else (0, weights.shape[0])
    titles = [names[k] for k in masks] + [t("weights")]
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.04)
    for c, m in enumerate(masks.values(), start=1):
        fig.add_trace(go.Heatmap(z=m[a:b].astype(np.float32), x=list(x), y=list(y)[a:b], zmin=0, zmax=1,
                                 colorscale=[[0, "#f4f4f4"], [1, "#3b3b3b"]], showscale=False,
                                 hovertemplate=t("query %{y}<br>key %{x}<br>blocked %{z}") + "<extra></extra>"), 1, c)
    fig.add_trace(go.Heatmap(z=weights[a:b].astype(np.float32), x=list(x), y=list(y)[a:b], colorscale="Blues", zmin=0,
                             zmax=1, hovertemplate=t("query %{y}<br>key %{x}<br>weight %{z:.4f}") + "<extra></extra>"),
                  1, len(titles))
    fig.update_yaxes(autorange="reversed", type="category", showticklabels=False)
    fig.update_xaxes(type="category", showticklabels=weights.shape[1] <= 40, tickangle=-60)
    fig.update_layout(height=max(320, min(560, 110 + 12 * (b - a))), margin=dict(l=10, r=10, t=70, b=50))
    return fig


# ---- sliding windows: what a token far back can still reach


def reach_back(kinds: Sequence[str], windows: Sequence[int | None], distance: int) -> list[int]:
    """After each layer (index 0 = the embeddings), how far back (in positions) information can have come from,
    at most, into one position, capped at `distance`: a sliding layer with window W adds W − 1 (a query sees
    itself and W − 1 keys back), a full layer reaches everything before it."""
    out, r = [0], 0
    for kind, w in zip(kinds, windows, strict=True):
        r = distance if (kind != "sliding" or not w) else min(distance, r + int(w) - 1)
        out.append(r)
    return out


def live_reach(masks: Sequence[np.ndarray], query: int = -1) -> list[np.ndarray]:
    """Which positions can have reached position `query` after each layer, from the live masks [T, T] (True =
    blocked): a query reads the keys its mask lets through, and the residual stream keeps each position's own.
    Returns [T] bool rows: index 0 = the embeddings (only `query` itself), index l = after layers 1..l. Walked
    backwards from `query` (O(l·T²) per row, no T³ product), so a long input stays cheap."""
    T = masks[0].shape[0]
    q = query % T
    open_ = [~m.astype(bool) | np.eye(T, dtype=bool) for m in masks]
    out = []
    for n in range(len(masks) + 1):
        seen = np.zeros(T, bool)
        seen[q] = True
        for a in reversed(open_[:n]):  # the last layer's query reads keys; each key was a query one layer down
            seen = a[seen].any(0) | seen
        out.append(seen)
    return out


def window_reach(kinds: Sequence[str], windows: Sequence[int | None], T: int, query: int = -1) -> list[np.ndarray]:
    """`live_reach` in closed form, for masks that are look-ahead + a sliding window on the sliding layers (what
    every decoder LM here uses): a sliding layer lets query i read keys i − W + 1 … i, so what can have reached
    `query` after l layers is the interval query − reach_back(l) … query. O(L·T): a long prompt needs no mask."""
    q = query % T
    back = reach_back(kinds, windows, q)  # capped at q: a full layer reaches position 0
    pos = np.arange(T)
    return [(pos <= q) & (pos >= q - b) for b in back]


def reach_labels(far: Sequence[int]) -> list[str]:
    """The reach-back line's point labels: a number where the reach changes (and the first point), blank where it
    repeats the point before. Gemma 3's 17 layers at the same 5,000 drew 17 labels run together (issue 38 §5);
    the hover still gives every point."""
    return [f"{int(v):,}" if i == 0 or int(v) != int(far[i - 1]) else "" for i, v in enumerate(far)]


def sliding_figure(mask: np.ndarray, reach: Sequence[np.ndarray], far: Sequence[int], distance: int,
                   labels: Sequence[str], window: int, pooled: bool = False) -> go.Figure:
    """Left: a sliding layer's live mask (this prompt). Middle: after each layer, which positions can have reached
    the last token (live, from the masks: `live_reach` rows). Right: how far back information can come from after
    each layer for a query `distance` positions into a long text (the closed form `reach_back`).

    pooled (a long prompt): `mask` is the share of OPEN cells of each block (`pooled_open`), `reach` the share of
    each block's positions that reach the last token (`pooled_share`), `labels` the blocks' (`block_labels`)."""
    fig = make_subplots(rows=1, cols=3, column_widths=[0.34, 0.33, 0.33], horizontal_spacing=0.09,
                        subplot_titles=(t("sliding-window mask, W = {w}", w=window) if not pooled else
                                        t("sliding-window mask, W = {w},<br>share of open cells per block", w=window),
                                        t("what reaches the last token,<br>layer by layer"),
                                        t("reach back from a token<br>at position {d}", d=f"{distance:,}")))
    if pooled:  # open = light, as in the exact mask where blocked is dark
        fig.add_trace(go.Heatmap(z=np.asarray(mask, np.float32), x=list(labels), y=list(labels), zmin=0, zmax=1,
                                 colorscale=[[0, "#3b3b3b"], [1, "#f4f4f4"]], showscale=False,
                                 hovertemplate=t("queries %{y}<br>keys %{x}<br>open: %{z:.0%}") + "<extra></extra>"),
                      1, 1)
    else:
        fig.add_trace(go.Heatmap(z=mask.astype(np.float32), x=list(labels), y=list(labels), zmin=0, zmax=1,
                                 colorscale=[[0, "#f4f4f4"], [1, "#3b3b3b"]], showscale=False,
                                 hovertemplate=t("query %{y}<br>key %{x}<br>blocked %{z}") + "<extra></extra>"), 1, 1)
    rows = np.stack(reach).astype(np.float32)  # (layers + 1, T), or (layers + 1, blocks) pooled
    fig.add_trace(go.Heatmap(z=rows, x=list(labels), y=[t("embedding")] + [t("layer {l}", l=i)
                                                                          for i in range(len(reach) - 1)],
                             zmin=0, zmax=1, colorscale=[[0, "#f4f4f4"], [1, "#2ca02c"]], showscale=False,
                             hovertemplate="%{y}<br>%{x}<br>" + (t("share that reaches the last token: %{z:.0%}")
                                                                 if pooled else t("reaches the last token: %{z}"))
                             + "<extra></extra>"),
                  1, 2)
    steps = [t("embedding")] + [t("layer {l}", l=i) for i in range(len(far) - 1)]
    fig.add_trace(go.Scatter(x=steps, y=list(far), mode="lines+markers+text", name=t("reach back"),
                             text=reach_labels(far), textposition="top left",
                             line=dict(color="#d62728"), showlegend=False,
                             hovertemplate="%{x}: " + t("%{y:,} positions back") + "<extra></extra>"), 1, 3)
    fig.add_hline(y=distance, line=dict(color="#7f7f7f", dash="dot"), row=1, col=3)
    fig.update_yaxes(autorange="reversed", type="category", showticklabels=len(labels) <= 40, row=1, col=1)
    fig.update_yaxes(autorange="reversed", type="category", row=1, col=2)
    fig.update_xaxes(type="category", showticklabels=False, row=1, col=1)
    fig.update_xaxes(type="category", showticklabels=False, row=1, col=2)
    fig.update_xaxes(type="category", row=1, col=3)
    fig.update_yaxes(title_text=t("positions back"), row=1, col=3)
    fig.update_annotations(font_size=11)  # three subplot titles side by side
    fig.update_layout(height=420, margin=dict(l=90 if pooled else 50, r=20, t=60, b=50))  # pooled: "1984–1999"
    return fig


def horizon_figure(far: np.ndarray, kinds: Sequence[str], window: int, T: int) -> go.Figure:
    """Per layer, the share of the last token's attention on keys `window` or more positions back (model/analysis/
    long.horizon): a bar for the heads' mean and a dot per head; sliding layers (0 by their mask) and full layers
    in two colours."""
    far = np.asarray(far, np.float64)
    layers = [t("layer {l}", l=i) for i in range(len(kinds))]
    colours = {"sliding": "#9e9e9e", "full": "#d62728"}
    names = {"sliding": t("sliding layer (W = {w})", w=window), "full": t("global layer")}
    fig = go.Figure()
    for kind in ("sliding", "full"):
        idx = [i for i, k in enumerate(kinds) if (k == "sliding") == (kind == "sliding")]
        fig.add_trace(go.Bar(x=[layers[i] for i in idx], y=far[idx].mean(1), name=names[kind],
                             marker_color=colours[kind],
                             hovertemplate="%{x}: " + t("mean over the heads %{y:.1%}") + "<extra></extra>"))
        for h in range(far.shape[1]):
            fig.add_trace(go.Scatter(x=[layers[i] for i in idx], y=far[idx, h], mode="markers", showlegend=False,
                                     marker=dict(color="#3b3b3b", size=5),
                                     hovertemplate="%{x} · " + t("head {h}", h=h) + ": %{y:.1%}<extra></extra>"))
    fig.update_layout(title=t("The last of {T} tokens: share of its attention {w} or more tokens back, per layer",
                              T=f"{T:,}", w=window),
                      barmode="overlay", height=380, margin=dict(l=60, r=20, t=60, b=60),
                      legend=dict(orientation="h", y=-0.25), yaxis=dict(range=[0, 1], tickformat=".0%"),
                      xaxis=dict(type="category", categoryorder="array", categoryarray=layers))  # layer order
    return fig


# ---- q/k norm


def vector_norms(x: np.ndarray) -> np.ndarray:
    """‖·‖ over the last axis, float64."""
    return np.linalg.norm(np.asarray(x, np.float64), axis=-1)


def qk_norm_figure(q_in: np.ndarray, q_out: np.ndarray, k_in: np.ndarray, k_out: np.ndarray,
                   labels: Sequence, x_title: str | None = None) -> go.Figure:
    """‖q‖ and ‖k‖ of each token before and after the q/k norm (one head, or the whole projection when the
    model normalizes all heads together): the norm puts every query and key on nearly one length, so the scores
    cannot grow with the residual stream."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(t("‖q‖ per token"),
                                                                                t("‖k‖ per token")))
    for c, (a, b) in enumerate(((q_in, q_out), (k_in, k_out)), start=1):
        fig.add_trace(go.Scatter(x=list(labels), y=vector_norms(a), mode="lines+markers", name=t("before the norm"),
                                 line=dict(color="#7f7f7f"), showlegend=c == 1, legendgroup="in"), 1, c)
        fig.add_trace(go.Scatter(x=list(labels), y=vector_norms(b), mode="lines+markers", name=t("after the norm"),
                                 line=dict(color="#1f77b4"), showlegend=c == 1, legendgroup="out"), 1, c)
    fig.update_xaxes(type="category", tickangle=-60, showticklabels=len(labels) <= 40)
    if x_title:  # a long prompt: positions, not token labels
        fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(height=360, margin=dict(l=50, r=20, t=50, b=50), legend=dict(orientation="h", y=-0.3))
    return fig


# ---- soft-capping


def softcap_figure(before: np.ndarray, after: np.ndarray, cap: float, points: str | None = None) -> go.Figure:
    """One head's live scores: after the cap against before (every unmasked cell), on the curve cap·tanh(s/cap),
    with the identity (no cap) and the bounds ±cap. `points`: the points' legend name (default "this head's
    scores"; a long prompt draws one token's row)."""
    before, after = np.asarray(before, np.float64).ravel(), np.asarray(after, np.float64).ravel()
    lim = max(float(np.abs(before).max(initial=0)), 2.5 * cap)
    xs = np.linspace(-lim, lim, 201)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs, y=xs, mode="lines", name=t("no cap (2017)"),
                             line=dict(color="#bbbbbb", dash="dot")))
    fig.add_trace(go.Scatter(x=xs, y=soft_cap(xs, cap), mode="lines", name=t("{c}·tanh(s/{c})", c=F_num(cap)),
                             line=dict(color="#1f77b4")))
    fig.add_trace(go.Scatter(x=before, y=after, mode="markers", name=points or t("this head's scores"),
                             marker=dict(color="#d62728", size=5, opacity=0.6),
                             hovertemplate=t("before %{x:.4g}<br>after %{y:.4g}") + "<extra></extra>"))
    for s in (-1, 1):
        fig.add_hline(y=s * cap, line=dict(color="#7f7f7f", dash="dash", width=1))
    fig.update_layout(title=t("soft-cap c = {c}: one head's scores before and after", c=F_num(cap)),
                      height=400, margin=dict(l=50, r=20, t=50, b=50), xaxis=dict(title=t("score before the cap")),
                      yaxis=dict(title=t("score after the cap")), legend=dict(orientation="h", y=-0.2))
    return fig


def softcap_summary(pairs: Iterable[tuple[np.ndarray, np.ndarray]]) -> dict:
    """Over (before, after) score arrays of visible cells, one tile at a time: {"max_before": max |s|,
    "max_after": max |c·tanh(s/c)|, "bent": share of cells moved by more than 1%, "cells": how many}. The same
    numbers as on the whole matrix at once: a long prompt never holds a head's T × T."""
    mb = ma = 0.0
    bent = n = 0
    for b, a in pairs:
        b, a = np.asarray(b, np.float64).ravel(), np.asarray(a, np.float64).ravel()
        mb, ma = max(mb, float(np.abs(b).max(initial=0))), max(ma, float(np.abs(a).max(initial=0)))
        bent += int((np.abs(a - b) > 0.01 * np.abs(b)).sum())
        n += b.size
    return {"max_before": mb, "max_after": ma, "bent": bent / max(n, 1), "cells": n}


# ---- RoPE scaling for long context


def scaling_name(kind: str) -> str:
    """A RoPE scaling's name for the page ("linear", "llama3" as Llama 3 calls it, "yarn" as YaRN)."""
    return {"linear": t("linear"), "llama3": "Llama 3", "yarn": "YaRN"}.get(kind, kind)


def rope_inv_freq(dim: int, base: float, scaling: str = "default", factor: float = 1.0,
                  low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                  original_max_len: float | None = None, beta_fast: float = 32.0, beta_slow: float = 1.0,
                  truncate: bool = True) -> np.ndarray:
    """RoPE frequencies (dim/2,) in float64, as transformers' modeling_rope_utils: plain base^(−2i/dim);
    "linear": all / factor; "llama3": wavelengths 2π/θ longer than original_max_len / low_freq_factor divided by
    factor, shorter than original_max_len / high_freq_factor kept, a smooth blend between; "yarn": pairs that
    turn more than beta_fast times over original_max_len kept, fewer than beta_slow times divided by factor, a
    linear ramp over the pair index between."""
    inv = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if scaling == "yarn":
        from model.core.layers import yarn_range  # the same (low, high) as the model: plain Python floats

        low, high = yarn_range(dim, base, int(original_max_len), beta_fast, beta_slow, truncate)
        high = high + 0.001 if low == high else high
        keep = 1 - np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        return inv / factor * (1 - keep) + inv * keep
    if scaling == "linear":
        return inv / factor
    if scaling == "llama3":
        low, high = original_max_len / low_freq_factor, original_max_len / high_freq_factor
        wavelen = 2 * np.pi / inv
        scaled = np.where(wavelen > low, inv / factor, inv)
        smooth = (original_max_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high) & (wavelen <= low)
        return np.where(medium, blended, scaled)
    return inv


def inv_freq_of(rope: Mapping, d_head: int, scaled: bool = True) -> np.ndarray:
    """The frequencies a layer's description says it turns by (rope entry of describe()); scaled=False: the plain
    ones of the same base and rotary dims."""
    dim = int(rope.get("rotary_dim") or d_head)
    if not scaled:
        return rope_inv_freq(dim, float(rope["base"]))
    return rope_inv_freq(dim, float(rope["base"]), rope.get("scaling", "default"), float(rope.get("factor") or 1.0),
                         float(rope.get("low_freq_factor") or 1.0), float(rope.get("high_freq_factor") or 4.0),
                         rope.get("original_max_len"), float(rope.get("beta_fast") or 32.0),
                         float(rope.get("beta_slow") or 1.0), bool(rope.get("truncate", True)))


def rope_scaling_figure(plain: np.ndarray, scaled: np.ndarray, original_max_len: float | None = None) -> go.Figure:
    """Wavelength (positions per full turn, 2π/θ_i) of each dimension pair, plain and as the model scales it
    (log scale), with the trained context length: pairs that turn less than once over it are the ones scaling
    stretches."""
    fig = go.Figure()
    pairs = list(range(len(plain)))
    fig.add_trace(go.Scatter(x=pairs, y=2 * np.pi / plain, mode="lines+markers", name=t("plain RoPE"),
                             line=dict(color="#7f7f7f", dash="dot")))
    fig.add_trace(go.Scatter(x=pairs, y=2 * np.pi / scaled, mode="lines+markers", name=t("this model (scaled)"),
                             line=dict(color="#1f77b4")))
    if original_max_len:
        fig.add_hline(y=float(original_max_len), line=dict(color="#d62728", dash="dash"),
                      annotation_text=t("trained context {n}", n=f"{int(original_max_len):,}"))
    fig.update_layout(title=t("RoPE wavelength of each dimension pair: plain vs scaled"),
                      height=380, margin=dict(l=50, r=20, t=50, b=50), xaxis=dict(title=t("dimension pair i")),
                      yaxis=dict(title=t("wavelength (positions per turn)"), type="log"),
                      legend=dict(orientation="h", y=-0.2))
    return fig


# ---- mixture of experts


def expert_load(topk_ids: np.ndarray, n_experts: int) -> np.ndarray:
    """How many (token, slot) picks each expert got: [E] counts over the tokens' top-k choices."""
    return np.bincount(np.asarray(topk_ids).ravel().astype(np.int64), minlength=n_experts)


def moe_figure(probs: np.ndarray, topk_ids: np.ndarray, loads: np.ndarray, labels: Sequence[str],
               layer: int) -> go.Figure:
    """Left: the router's probabilities, tokens × experts, of one layer; a ring marks each token's top-k (the
    experts that run on it). Right: load per expert (top-k picks) in every layer."""
    T, E = probs.shape
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.22,
                        subplot_titles=(t("layer {l}: router probabilities (○ = chosen)", l=layer),
                                        t("load per expert, every layer")))
    ex = [str(e) for e in range(E)]
    fig.add_trace(go.Heatmap(z=probs.astype(np.float32), x=ex, y=list(labels), colorscale="Purples", zmin=0,
                             zmax=float(max(probs.max(initial=0), 1e-6)), colorbar=dict(x=0.45, len=0.85, thickness=10),
                             hovertemplate=t("token %{y}<br>expert %{x}<br>p = %{z:.4f}") + "<extra></extra>"), 1, 1)
    ids = np.asarray(topk_ids)  # (T, k)
    ti, te = np.repeat(np.arange(T), ids.shape[1]), ids.ravel()
    fig.add_trace(go.Scatter(x=[ex[e] for e in te], y=[labels[i] for i in ti], mode="markers", showlegend=False,
                             marker=dict(symbol="circle-open", size=11, color="#ff7f0e", line=dict(width=2)),
                             hoverinfo="skip"), 1, 1)
    fig.add_trace(go.Heatmap(z=np.asarray(loads, np.float32), x=ex, y=[t("layer {l}", l=i) for i in range(len(loads))],
                             colorscale="Oranges", colorbar=dict(x=1.0, len=0.85, thickness=10),
                             hovertemplate="%{y}<br>" + t("expert %{x}: %{z} picks") + "<extra></extra>"), 1, 2)
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(type="category", title_text=t("expert"))
    fig.update_layout(height=max(340, min(700, 100 + 16 * T)), margin=dict(l=90, r=20, t=50, b=50))
    return fig


def router_choice_figure(probs: np.ndarray, topk_ids: np.ndarray, topk_w: np.ndarray, token: str) -> go.Figure:
    """One token's router: every expert's probability, the chosen ones coloured and labelled with the weight
    their output is scaled by."""
    E = len(probs)
    chosen = {int(e): float(w) for e, w in zip(topk_ids, topk_w, strict=True)}
    fig = go.Figure(go.Bar(x=[str(e) for e in range(E)], y=probs.astype(np.float32),
                           marker_color=["#ff7f0e" if e in chosen else "#c7c7c7" for e in range(E)],
                           text=[t("w = {w}", w=f"{chosen[e]:.3f}") if e in chosen else "" for e in range(E)],
                           textposition="outside", cliponaxis=False,
                           hovertemplate=t("expert %{x}<br>p = %{y:.4f}") + "<extra></extra>"))
    fig.update_layout(title=t("the router's choice for “{tok}”", tok=show_token(token)), height=320,
                      margin=dict(l=50, r=20, t=50, b=40), xaxis=dict(title=t("expert"), type="category"),
                      yaxis=dict(title=t("router probability"), rangemode="tozero"))
    return fig


# ---------------------------------------------------------------------- attention sinks (gpt-oss)


def sink_figure(sinks: Sequence[float], sink: np.ndarray, head: int, labels: Sequence[str]) -> go.Figure:
    """Learned attention sinks. Left: one layer's sink logit s_h per head (the chosen head orange). Right: on this
    prompt, what each query of the chosen head gave the sink (softmax over [q·k, s_h]: the weight on no token),
    and what its weights over the tokens sum to, 1 − that.
    sinks: (H,) the layer's learned logits; sink: (T,) the chosen head's `<attn>.sink` row."""
    H = len(sinks)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.35, 0.65], horizontal_spacing=0.12,
                        subplot_titles=(t("learned sink logit s_h per head"),
                                        t("head {h}: each query's weight on the sink", h=head)))
    fig.add_trace(go.Bar(x=[str(h) for h in range(H)], y=np.asarray(sinks, dtype=np.float64),
                         marker_color=["#ff7f0e" if h == head else "#9467bd" for h in range(H)], showlegend=False,
                         hovertemplate=t("head %{x}<br>s_h = %{y:.4f}") + "<extra></extra>"), row=1, col=1)
    sink = np.asarray(sink, dtype=np.float64)
    x = list(labels)
    fig.add_trace(go.Scatter(x=x, y=sink, mode="lines+markers", name=t("sink"), line=dict(color="#9467bd"),
                             hovertemplate="%{x}<br>" + t("sink %{y:.4f}") + "<extra></extra>"), row=1, col=2)
    fig.add_trace(go.Scatter(x=x, y=1 - sink, mode="lines", name=t("the tokens (1 − sink)"),
                             line=dict(color="#1f77b4", dash="dot"),
                             hovertemplate="%{x}<br>" + t("tokens %{y:.4f}") + "<extra></extra>"), row=1, col=2)
    fig.update_xaxes(title_text=t("head"), type="category", row=1, col=1)
    fig.update_yaxes(title_text="s_h", row=1, col=1)
    fig.update_xaxes(title_text=t("query token"), type="category", row=1, col=2, **every_tick(x))
    fig.update_yaxes(title_text=t("share of the row's softmax"), range=[0, 1.02], row=1, col=2)
    fig.update_layout(height=380, margin=dict(l=50, r=20, t=60, b=60), legend=dict(orientation="h", y=-0.3))
    return fig
