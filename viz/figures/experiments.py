"""Figures of the Experiments page: what changed when a piece of the Transformer was broken.

Pure builders (results of `model.analysis` in, plotly figures out; no streamlit, no model runs).
Colour scales follow viz.figures.attention: weights on [0, 1], differences diverging around 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from viz.figures import attention as F
from viz.i18n import N_, t

KIND_LABELS = {"encoder_self": N_("Encoder self-attention"),  # model/core/describe.py kinds
               "decoder_self": N_("Decoder self-attention"),
               "cross": N_("Cross-attention")}
METHOD_LABELS = {"raw": N_("Raw attention (last layer, mean of heads)"),
                 "rollout": N_("Attention rollout"),
                 "grad_x_input": N_("Gradient × input"),
                 "blank_out": N_("Blank-out (Δ log-prob)")}
METRIC_LABELS = {"log-prob of the reference output": N_("log-prob of the reference output"),
                 "exact match": N_("exact match"), "cosine preference": N_("cosine preference")}
SUMMARY_LABELS = {"entropy": N_("Entropy (nats)"), "distance": N_("Mean attention distance (positions)"),
                  "special": N_("Share on special tokens")}


def _size(n: int, base: int = 320, per: int = 14, cap: int = 900) -> int:
    return int(min(cap, max(base, 120 + per * n)))


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(title={"text": title, "x": 0.0}, height=height, margin={"l": 10, "r": 10, "t": 70, "b": 10})
    return fig


# ---------------------------------------------------------------- before / after


def token_diff(before, after) -> go.Figure:
    """Two rows of output tokens (before, after), coloured by each token's log-prob; a token of
    `after` that differs from `before` at its position is marked with a box ▣ in its label."""
    rows = []
    for dec in (before, after):
        toks = list(dec.tokens) + (["[EOS]"] if dec.finished else [])
        rows.append((toks, list(dec.logprobs)[:len(toks)]))
    n = max(len(rows[0][0]), len(rows[1][0]), 1)
    z = np.full((2, n), np.nan, np.float32)
    text = [[""] * n for _ in range(2)]
    for r, (toks, lps) in enumerate(rows):
        z[r, :len(lps)] = lps
        for i, tok in enumerate(toks):
            changed = r == 1 and (i >= len(rows[0][0]) or rows[0][0][i] != tok)
            text[r][i] = ("▣ " if changed else "") + F.show_token(tok)
    ylab = [t("before"), t("after")]
    fig = go.Figure(go.Heatmap(
        z=z, x=[str(i) for i in range(n)], y=ylab, text=text, texttemplate="%{text}",
        colorscale="RdYlGn", zmin=min(-5.0, float(np.nanmin(z)) if np.isfinite(z).any() else -5.0), zmax=0.0,
        colorbar={"title": {"text": "log p"}},
        hovertemplate="%{y}, " + t("position") + " %{x}: %{text}<br>log p = %{z:.4f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title=t("output position"))
    return _layout(fig, t("Output tokens and their log-probabilities (▣ = changed)"), 230)


def attention_diff(before: Mapping, after: Mapping, module: str, meta: Mapping) -> go.Figure:
    """One panel per head: weights after − before of `module` (both traces on the same tokens)."""
    w0, w1 = F.arr(before[f"{module}.weights"][0]), F.arr(after[f"{module}.weights"][0])  # (H, Lq, Lk)
    H, Lq, Lk = w0.shape
    y, x = F.axis_labels(meta, module, Lq, Lk)
    d = w1 - w0
    r = F.symmetric_range(d)
    fig = make_subplots(1, H, subplot_titles=[t("head {h}", h=h) for h in range(H)], horizontal_spacing=0.02)
    for h in range(H):
        fig.add_trace(F.heatmap_trace(d[h], "diff", x, y, value_name=t("after − before"), zrange=r,
                                      showscale=h == H - 1), 1, h + 1)
        fig.update_yaxes(autorange="reversed", showticklabels=h == 0, row=1, col=h + 1)
    return _layout(fig, t("{module}: attention after − before (max |Δ| = {m:.3g})", module=module,
                          m=float(np.abs(d).max())), _size(Lq, base=300, per=16, cap=700))


def alignment_pair(before: Mapping, after: Mapping, module: str) -> go.Figure:
    """Cross-attention (mean of heads) of `module` before and after, each on its own output."""
    fig = make_subplots(1, 2, subplot_titles=[t("before"), t("after")], horizontal_spacing=0.12)
    n = 0
    for c, tr in enumerate((before, after), start=1):
        w = F.arr(tr[f"{module}.weights"][0]).mean(0)  # (T, S)
        y, x = F.axis_labels(tr.meta, module, *w.shape)
        n = max(n, w.shape[0])
        fig.add_trace(F.heatmap_trace(w, "weights", x, y, value_name=t("weight"), showscale=c == 2), 1, c)
        fig.update_yaxes(autorange="reversed", row=1, col=c)
    return _layout(fig, t("Cross-attention alignment, {module}, mean of heads", module=module),
                   _size(n, base=320, per=18, cap=800))


# ---------------------------------------------------------------- heads


def _layer_head_maps(maps: Mapping[str, np.ndarray], value_name: str | Sequence[str], title: str,
                     diverging: bool = True, height: int = 330) -> go.Figure:
    """One layer × head heatmap per entry of `maps` (panel title -> (layers, H) array), side by side;
    diverging maps share one range centred at 0, the others are sequential (Viridis)."""
    names = [value_name] * len(maps) if isinstance(value_name, str) else list(value_name)
    fig = make_subplots(1, len(maps), subplot_titles=list(maps), horizontal_spacing=0.07)
    r = F.symmetric_range(*maps.values()) if diverging else None
    for c, (z, name) in enumerate(zip(maps.values(), names, strict=True), start=1):
        z = np.asarray(z, np.float32)
        x, y = [str(h) for h in range(z.shape[1])], [str(i) for i in range(z.shape[0])]
        last = c == len(maps)
        if diverging:
            hm = F.heatmap_trace(z, "diff", x, y, value_name=name, zrange=r, showscale=last,
                                 hover_x=t("head"), hover_y=t("layer"))
        else:
            hover = f"{t('layer')} %{{y}}, {t('head')} %{{x}}<br>{name} = %{{z:.4g}}<extra></extra>"
            hm = go.Heatmap(z=z, x=x, y=y, colorscale="Viridis", showscale=last, hovertemplate=hover)
        fig.add_trace(hm, 1, c)
        fig.update_xaxes(title=t("head"), type="category", row=1, col=c)
        fig.update_yaxes(title=t("layer") if c == 1 else None, type="category", autorange="reversed", row=1, col=c)
    return _layout(fig, title, height)


def _by_kind_title(maps: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {t(KIND_LABELS.get(k, k)): v for k, v in maps.items()}


def importance_maps(hi) -> go.Figure:
    """Layer × head maps of a HeadImportance, one per attention kind (Δ score when the head is removed)."""
    metric = t(METRIC_LABELS.get(hi.metric, hi.metric))
    return _layer_head_maps(_by_kind_title(hi.by_kind()), t("Δ {metric}", metric=metric),
                      t("Head importance: Δ {metric} when the head is knocked out (intact: {base:.4g})",
                        metric=metric, base=hi.base))


def summary_maps(summary: Mapping, quantity: str) -> go.Figure:
    """Layer × head maps of one per-head summary quantity (entropy, distance or special)."""
    maps: dict[str, list] = {}
    for kind, row in zip(summary["kinds"], summary[quantity], strict=True):
        maps.setdefault(kind, []).append(row)
    maps = {k: np.stack(v) for k, v in maps.items() if not np.isnan(np.stack(v)).all()}
    label = t(SUMMARY_LABELS[quantity])
    return _layer_head_maps(_by_kind_title(maps), label, label, diverging=False)


# ---------------------------------------------------------------- attribution


def attribution_bars(attr) -> go.Figure:
    """Source-token importance four ways, side by side; titles carry Spearman's ρ with blank-out."""
    methods = list(attr.scores)
    titles = []
    for m in methods:
        rho = attr.spearman.get(m)
        titles.append(t(METHOD_LABELS[m]) + ("" if rho is None else f"<br>ρ = {rho:.2f}"))
    fig = make_subplots(1, len(methods), subplot_titles=titles, horizontal_spacing=0.05, shared_yaxes=True)
    y = F.token_labels(attr.src_tokens, len(attr.scores[methods[0]]))
    for c, m in enumerate(methods, start=1):
        v = np.asarray(attr.scores[m], np.float32)
        fig.add_trace(go.Bar(x=v, y=y, orientation="h", name=t(METHOD_LABELS[m]), showlegend=False,
                             hovertemplate="%{y}: %{x:.4g}<extra></extra>"), 1, c)
    fig.update_yaxes(autorange="reversed")
    fig.update_annotations(font_size=12)
    return _layout(fig, t("Which source token drove output {i} ({tok})?", i=attr.position, tok=attr.token),
                   _size(len(y), base=320, per=20, cap=900))


# ---------------------------------------------------------------- two inputs


def flip_maps(hf, labels: Sequence[str]) -> go.Figure:
    """Layer × head maps: preference w[to1] − w[to2] in A, in B, and the flip A − B."""
    names = [t("preference in A"), t("preference in B"), t("flip (A − B)")]
    q, k1, k2 = labels
    return _layer_head_maps(dict(zip(names, (hf.pref_a, hf.pref_b, hf.flip), strict=True)), names,
                            t("Preference of “{q}” for “{a}” over “{b}” (w[{a}] − w[{b}]) per head",
                              q=q, a=k1, b=k2), height=360)


def row_diff(hf) -> go.Figure:
    """Every head's attention row of the query token: sentence A − sentence B (aligned tokens)."""
    d = hf.diff  # (layers, H, L)
    L, H, n = d.shape
    y = [t("L{i} H{h}", i=i, h=h) for i in range(L) for h in range(H)]
    x = [f"{a}/{b}" if a != b else a for a, b in zip(hf.tokens_a, hf.tokens_b, strict=True)]
    fig = go.Figure(F.heatmap_trace(d.reshape(L * H, n), "diff", F.token_labels(x, n), y,
                                    value_name=t("A − B"), hover_x=t("key"), hover_y=t("head")))
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, t("Attention row of the query in A − in B, every head"), _size(L * H, per=12, cap=1100))
