"""Figures of the Attention phenomena page (viz/pages/phenomena.py) and lessons 11–15: pure builders,
arrays in (what model/analysis/phenomena.py, ioi.py and patching.py return), plotly out.

- `head_map(scores, ...)`: a layer × head map of one per-head number; the heads a detector found (over its
  threshold) are outlined, and every cell's customdata is [layer, head] so a click can open it;
- `repeat_loss_figure(per_token, n)`: the per-token loss on [BOS] + n random tokens repeated twice;
- `ablation_bars(...)`: a metric intact, with the top heads knocked out, and with random heads (control);
- `logit_diff_bars(labels, diffs)`: the IOI logit difference per prompt;
- `patching_map(resid, tokens)`: activation patching, layer × position, share of the answer restored.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.figures.attention import WEIGHTS_SCALE, every_tick, num, show_token
from viz.i18n import t

FOUND = "#d62728"  # outline of a head over the threshold
DIVERGING = "RdBu_r"


def head_map(scores, label: str, found: Sequence[tuple[int, int]] = (), title: str | None = None,
             zmax: float | None = None, diverging: bool = False, note: str | None = None) -> go.Figure:
    """Layer (rows) × head (columns) map of `scores` [L, H]; `found` (layer, head) pairs are outlined.
    diverging=True: a scale centred at 0 (direct logit attribution); else 0..zmax (shares, scores)."""
    z = np.asarray(scores, dtype=np.float64)
    L, H = z.shape
    finite = z[np.isfinite(z)]
    if diverging:
        top = float(np.abs(finite).max()) if finite.size else 1.0
        scale = {"colorscale": DIVERGING, "zmin": -(top or 1.0), "zmax": top or 1.0, "zmid": 0.0}
    else:
        hi = zmax if zmax is not None else (float(finite.max()) if finite.size else 1.0)
        scale = {"colorscale": WEIGHTS_SCALE, "zmin": 0.0, "zmax": hi if hi > 0 else 1.0}
    custom = np.dstack(np.meshgrid(np.arange(L), np.arange(H), indexing="ij"))
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(H)), y=list(range(L)), customdata=custom, xgap=1, ygap=1, **scale,
        colorbar={"title": {"text": label, "side": "right"}, "thickness": 12},
        hovertemplate=t("layer %{y} · head %{x}") + "<br>" + label + ": %{z:.3f}<extra></extra>"))
    # every outline in one layout update: add_shape re-validates all earlier shapes each time (quadratic:
    # 226 sink heads took 25,877 shape validations, 15-30 s of a lesson-12 run on a busy machine)
    fig.update_layout(shapes=[{"type": "rect", "x0": head - 0.5, "x1": head + 0.5, "y0": layer - 0.5,
                               "y1": layer + 0.5, "line": {"color": FOUND, "width": 2.5}} for layer, head in found])
    fig.update_layout(
        title={"text": title or label}, height=max(320, 20 * L + 130), width=max(360, 44 * H + 220),
        margin={"l": 60, "r": 20, "t": 60, "b": 60 if note else 40},
        xaxis={"title": {"text": t("head")}, "dtick": 1}, yaxis={"title": {"text": t("layer")}, "dtick": 1,
                                                               "autorange": "reversed"},
        clickmode="event+select")
    if note:
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0, y=0, yanchor="top", yshift=-36,
                           showarrow=False, font={"size": 11})
    return fig


def repeat_loss_figure(per_token, n: int, title: str | None = None) -> go.Figure:
    """per_token [2n]: the loss on token 1..2n of [BOS] + n random tokens + the same n again; the two copies
    in two colours, each with its mean as a dashed line."""
    y = np.asarray(per_token, dtype=np.float64)
    x = np.arange(1, len(y) + 1)
    fig = go.Figure()
    for part, (lo, hi), color in ((t("first copy"), (0, n), "#1f77b4"), (t("second copy"), (n, 2 * n), "#d62728")):
        seg = y[lo:hi]
        fig.add_trace(go.Scatter(x=x[lo:hi], y=seg, mode="lines+markers", name=part, marker={"size": 4},
                                 line={"color": color},
                                 hovertemplate=t("token {i}", i="%{x}") + ": %{y:.2f}<extra></extra>"))
        if seg.size:
            mean = float(seg.mean())
            fig.add_trace(go.Scatter(x=[x[lo], x[hi - 1]], y=[mean, mean], mode="lines", showlegend=False,
                                     line={"color": color, "dash": "dash"}, hoverinfo="skip"))
            fig.add_annotation(x=x[hi - 1], y=mean, text=t("mean {v}", v=num(mean)), showarrow=False,
                               xanchor="right", yshift=10, font={"color": color})
    fig.add_vline(x=n + 0.5, line={"color": "#888", "dash": "dot"})
    fig.update_layout(title={"text": title or t("Loss per token: random tokens, then the same tokens again")},
                      height=360, margin={"l": 60, "r": 20, "t": 60, "b": 50},
                      xaxis={"title": {"text": t("position")}},
                      yaxis={"title": {"text": t("loss (nats)")}, "rangemode": "tozero"},
                      legend={"orientation": "h", "y": 1.02, "x": 1, "xanchor": "right", "yanchor": "bottom"})
    return fig


def ablation_bars(base: float, ablated: float, controls: Sequence[float], metric: str, ablated_label: str,
                  title: str | None = None) -> go.Figure:
    """Bars: the metric intact, with the chosen heads knocked out, and with each random control set."""
    labels = [t("intact"), ablated_label] + [t("random heads #{i}", i=i + 1) for i in range(len(controls))]
    values = [float(base), float(ablated)] + [float(c) for c in controls]
    colors = ["#7f7f7f", FOUND] + ["#1f77b4"] * len(controls)
    fig = go.Figure(go.Bar(x=labels, y=values, marker_color=colors, text=[num(v) for v in values],
                           textposition="outside", hovertemplate="%{x}: %{y:.3f}<extra></extra>"))
    lo = min(0.0, *values)
    hi = max(0.0, *values)
    pad = 0.15 * (hi - lo or 1.0)
    fig.update_layout(title={"text": title or metric}, height=340, margin={"l": 60, "r": 20, "t": 60, "b": 60},
                      yaxis={"title": {"text": metric}, "range": [lo - (pad if lo < 0 else 0), hi + pad]})
    return fig


def logit_diff_bars(labels: Sequence[str], diffs: Sequence[float], title: str | None = None) -> go.Figure:
    """One bar per IOI prompt: logit(IO) − logit(S) at the last position (> 0: the model prefers IO)."""
    d = [float(v) for v in diffs]
    fig = go.Figure(go.Bar(y=list(labels), x=d, orientation="h", marker_color=["#2ca02c" if v > 0 else FOUND
                                                                                  for v in d],
                           text=[num(v) for v in d], textposition="outside",
                           hovertemplate="%{y}: %{x:.3f}<extra></extra>"))
    fig.add_vline(x=0, line={"color": "#444"})
    hi = max([abs(v) for v in d] or [1.0])
    fig.update_layout(title={"text": title or t("Logit difference IO − S per prompt")},
                      height=80 + 28 * len(d), margin={"l": 10, "r": 30, "t": 60, "b": 50},
                      xaxis={"title": {"text": t("logit(IO) − logit(S)")}, "range": [min(0.0, min(d, default=0)) * 1.25
                                                                                     - 0.1 * hi, hi * 1.25]},
                      yaxis={"autorange": "reversed", "automargin": True})
    return fig


def patching_map(resid, tokens: Sequence[str], title: str | None = None) -> go.Figure:
    """resid [L, T]: share of the clean logit difference restored by copying the clean residual stream into
    the corrupted run at (layer input, position); 0 = corrupted, 1 = clean."""
    z = np.asarray(resid, dtype=np.float64)
    L, T = z.shape
    x = [f"{i}: {show_token(tokens[i])}" if i < len(tokens) else str(i) for i in range(T)]
    top = max(1.0, float(np.nanmax(np.abs(z))) if z.size else 1.0)
    fig = go.Figure(go.Heatmap(
        z=z, x=x, y=list(range(L)), colorscale=DIVERGING, zmin=-top, zmax=top, zmid=0.0, xgap=1, ygap=1,
        colorbar={"title": {"text": t("restored")}, "thickness": 12},
        hovertemplate=t("input of layer %{y} · position %{x}") + "<br>" + t("restored") + ": %{z:.3f}<extra></extra>"))
    fig.update_layout(title={"text": title or t("Activation patching: where the answer is carried")},
                      height=max(360, 18 * L + 160), width=min(1300, max(480, 56 * T + 160)),
                      margin={"l": 60, "r": 20, "t": 60, "b": 100},
                      xaxis={"title": {"text": t("position: clean token")}, **every_tick(x)},
                      yaxis={"title": {"text": t("layer (its input)")}, "autorange": "reversed", "dtick": 2})
    return fig


def comparison_table(rows: Sequence[tuple[str, str, str]], header: Sequence[str], title: str | None = None
                     ) -> go.Figure:
    """A three-column table (piece, then, now) as a figure, so a lesson's live view can be one figure."""
    cols = [list(c) for c in zip(*rows, strict=True)] if rows else [[], [], []]
    fig = go.Figure(go.Table(
        columnwidth=[1, 2, 3],
        header={"values": [f"<b>{h}</b>" for h in header], "align": "left", "fill_color": "#e8eef7"},
        cells={"values": cols, "align": "left", "height": 30}))
    fig.update_layout(title={"text": title or ""}, height=90 + 36 * len(rows), margin={"l": 10, "r": 10, "t": 50,
                                                                                       "b": 10})
    return fig
