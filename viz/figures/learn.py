"""Figures of the Watch attention learn page (viz/pages/learn.py): pure builders, arrays in (what
model/toy/learn.py measures on each checkpoint), plotly out.

- `curves_figure`: the training loss per step and the in-context loss at each checkpoint, both models, with
  the phase change marked;
- `head_steps_figure`: one per-head score over the checkpoints (heads × steps);
- `attention_step_figure`: one head's attention map on the repeated probe at one step;
- `kcomp_figure`: K-composition of the layer-0 previous-token head into the layer-1 induction head over steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from viz.figures.attention import WEIGHTS_SCALE, num
from viz.i18n import t

PHASE = "#d62728"
COLORS = {"attn2": "#1f77b4", "attn1": "#ff7f0e", "yours": "#2ca02c"}


def smooth(y: Sequence[float], k: int = 20) -> np.ndarray:
    """Running mean over the last k values (the training loss of one batch is noisy)."""
    y = np.asarray(y, dtype=np.float64)
    if y.size == 0:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    idx = np.arange(1, y.size + 1)
    lo = np.maximum(idx - k, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def _phase_line(fig: go.Figure, step: int | None, **kw) -> None:
    if step:
        fig.add_vline(x=step, line={"color": PHASE, "dash": "dash"}, **kw)


def curves_figure(series: dict[str, dict], phase_step: int | None, title: str | None = None,
                  total_steps: int | None = None) -> go.Figure:
    """series: name -> {"label", "loss" (per step 1..N), "steps" (checkpoints), "icl" (per checkpoint)}.
    Left: training loss (running mean of 20 steps); right: in-context loss (second copy − first copy)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(t("Training loss"), t("In-context loss (late − early)")),
                        horizontal_spacing=0.1)
    for name, s in series.items():
        color = COLORS.get(name, "#7f7f7f")
        loss = smooth(s.get("loss", []))
        if loss.size:
            fig.add_trace(go.Scatter(x=np.arange(1, loss.size + 1), y=loss, mode="lines", name=s["label"],
                                     legendgroup=name, line={"color": color},
                                     hovertemplate=t("step %{x}") + ": %{y:.3f}<extra></extra>"), row=1, col=1)
        steps = [max(int(x), 1) for x in s.get("steps", [])]  # step 0 drawn at 1 on the log axis
        if len(s.get("icl", [])):
            fig.add_trace(go.Scatter(x=steps, y=list(s["icl"]), mode="lines+markers", name=s["label"],
                                     legendgroup=name, showlegend=not loss.size, line={"color": color},
                                     marker={"size": 4},
                                     hovertemplate=t("step %{x}") + ": %{y:.3f}<extra></extra>"), row=1, col=2)
    for col in (1, 2):
        _phase_line(fig, phase_step, row=1, col=col)
    if phase_step:
        fig.add_annotation(x=np.log10(phase_step), y=1, xref="x2", yref="y2 domain", text=t("phase change"),
                           showarrow=False, yanchor="bottom", font={"color": PHASE})
    rng = [0, np.log10(total_steps)] if total_steps else None
    fig.update_xaxes(type="log", title={"text": t("training step")}, range=rng)
    fig.update_yaxes(title={"text": t("loss (nats)")}, row=1, col=1)
    fig.update_yaxes(title={"text": t("nats")}, row=1, col=2)
    fig.update_layout(title={"text": title or t("Loss over training")}, height=380,
                      margin={"l": 60, "r": 20, "t": 80, "b": 50}, legend={"orientation": "h", "y": -0.2})
    return fig


def head_steps_figure(steps: Sequence[int], scores, label: str, phase_step: int | None = None,
                      title: str | None = None) -> go.Figure:
    """scores [checkpoints, L, H] -> a heatmap with one row per head ("layer.head") and one column per
    checkpoint (evenly spaced: the checkpoints are log-spaced), the phase change's column outlined."""
    z = np.asarray(scores, dtype=np.float64)
    C, L, H = z.shape
    rows = [f"{layer}.{h}" for layer in range(L) for h in range(H)]
    zz = z.reshape(C, L * H).T
    cols = [str(s) for s in steps]
    fig = go.Figure(go.Heatmap(z=zz, x=cols, y=rows, colorscale=WEIGHTS_SCALE, zmin=0.0, zmax=1.0, xgap=1, ygap=1,
                               colorbar={"title": {"text": label, "side": "right"}, "thickness": 12},
                               hovertemplate=t("head %{y} · step %{x}") + "<br>" + label
                               + ": %{z:.3f}<extra></extra>"))
    if phase_step is not None and str(phase_step) in cols:
        i = cols.index(str(phase_step))
        fig.add_shape(type="rect", x0=i - 0.5, x1=i + 0.5, y0=-0.5, y1=len(rows) - 0.5,
                      line={"color": PHASE, "width": 2})
    fig.update_layout(title={"text": title or label}, height=max(220, 22 * len(rows) + 130),
                      margin={"l": 60, "r": 20, "t": 60, "b": 60},
                      xaxis={"title": {"text": t("training step (checkpoints, log-spaced)")}, "type": "category",
                             "nticks": 12},
                      yaxis={"title": {"text": t("head (layer.head)")}, "autorange": "reversed", "type": "category"})
    return fig


def attention_step_figure(weights, tokens: Sequence[str], n: int, title: str) -> go.Figure:
    """One head's attention [T, T] on [BOS] + n tokens + the same n again; the induction stripe (i -> i-(n-1))
    is where a formed induction head puts its weight."""
    w = np.asarray(weights, dtype=np.float64)
    T = w.shape[0]
    labels = [f"{i}·{tok}" for i, tok in enumerate(tokens)]
    fig = go.Figure(go.Heatmap(z=w, x=labels, y=labels, colorscale=WEIGHTS_SCALE, zmin=0.0, zmax=1.0,
                               colorbar={"title": {"text": t("weight")}, "thickness": 12},
                               hovertemplate=t("query %{y} → key %{x}") + ": %{z:.3f}<extra></extra>"))
    xs = [labels[i - (n - 1)] for i in range(n + 1, T)]
    fig.add_trace(go.Scatter(x=xs, y=labels[n + 1:T], mode="markers", name=t("induction stripe"),
                             marker={"symbol": "square-open", "color": PHASE, "size": 7}, hoverinfo="skip"))
    fig.update_layout(title={"text": title}, height=520, width=560, margin={"l": 70, "r": 20, "t": 60, "b": 70},
                      xaxis={"title": {"text": t("key")}, "showticklabels": False},
                      yaxis={"title": {"text": t("query")}, "autorange": "reversed", "showticklabels": False},
                      legend={"orientation": "h", "y": -0.08})
    return fig


def kcomp_figure(steps: Sequence[int], pair, others, pair_label: str, phase_step: int | None = None,
                 title: str | None = None) -> go.Figure:
    """K-composition over the checkpoints: the chosen (layer-0 head, layer-1 head) pair, and the mean of the
    other pairs as a baseline."""
    x = [max(int(s), 1) for s in steps]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=list(pair), mode="lines+markers", name=pair_label, marker={"size": 4},
                             line={"color": COLORS["attn2"]},
                             hovertemplate=t("step %{x}") + ": %{y:.3f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=list(others), mode="lines", name=t("mean of the other pairs"),
                             line={"color": "#999", "dash": "dot"},
                             hovertemplate=t("step %{x}") + ": %{y:.3f}<extra></extra>"))
    _phase_line(fig, phase_step)
    fig.update_layout(title={"text": title or t("K-composition")}, height=340,
                      margin={"l": 60, "r": 20, "t": 60, "b": 50}, xaxis={"type": "log", "title": {
                          "text": t("training step")}}, yaxis={"title": {"text": t("K-composition score")}},
                      legend={"orientation": "h", "y": -0.25})
    return fig


def fmt(v: float) -> str:
    return num(v, 2)


def sentence(sm) -> str:
    """The run's numbers in one sentence (a model.toy.learn.Summary): /learn says it, lesson 17 answers with it."""
    if sm.step is None:
        return t("The in-context loss never fell: no phase change in this run.")
    return t("At step {step} the in-context loss fell from {a} to {b} and head {layer}.{head}'s induction score "
             "rose from {c} to {d}; the 1-layer model never passed {e}.", step=sm.step, a=fmt(sm.icl_before),
             b=fmt(sm.icl_after), layer=sm.layer, head=sm.head, c=fmt(sm.induction_before),
             d=fmt(sm.induction_after), e=fmt(sm.control_max if sm.control_max is not None else float("nan")))
