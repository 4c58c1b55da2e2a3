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


STEP_TICKS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)


def step_x(steps) -> np.ndarray:
    """Where a training step is drawn on the step axes: at step + 1 on a log axis, so step 0 (the untrained
    model) has a place of its own left of step 1 (issue 38 §5: step 0 was drawn at 1, on top of step 1, and its
    hover said "step 1"). The axis is labelled with the steps themselves (`step_axis`), the hover too."""
    return np.asarray(steps, dtype=np.float64) + 1.0


def step_axis(total_steps: int | None = None) -> dict:
    """A log axis of step + 1 (`step_x`) whose tick labels are the steps: "0" sits at step 0, "100" at step 100."""
    top = total_steps if total_steps else STEP_TICKS[-1]
    ticks = [s for s in STEP_TICKS if s <= top]
    axis = {"type": "log", "tickmode": "array", "tickvals": [s + 1 for s in ticks],
            "ticktext": [f"{s:,}" for s in ticks],
            "title": {"text": t("training step (log scale, step 0 at the left)")}}
    if total_steps:
        axis["range"] = [0, float(np.log10(total_steps + 1))]
    return axis


def _phase_line(fig: go.Figure, step: int | None, **kw) -> None:
    if step:
        fig.add_vline(x=float(step_x(step)), line={"color": PHASE, "dash": "dash"}, **kw)


def curves_figure(series: dict[str, dict], phase_step: int | None, title: str | None = None,
                  total_steps: int | None = None, phase_label: str | None = None,
                  marks: Sequence[tuple[int, str, str]] = (), overlay: bool = False) -> go.Figure:
    """series: name -> {"label", "loss" (per step 1..N), "steps" (checkpoints), "icl" (per checkpoint)}.
    Left: training loss (running mean of 20 steps); right: in-context loss (second copy − first copy).
    phase_step: the phase change, a dashed red line in both panels, labelled `phase_label` (default "phase change
    (step N)") inside the right panel; marks: more (step, label, colour) lines, each labelled (the shipped run's
    phase change beside yours). The step axes are log(step + 1) (`step_axis`): step 0 drawn, never at step 1.
    With `overlay` (a run against the shipped one), series after the first are drawn thinner on top of a wide,
    light first one, so two runs that coincide (your run with the shipped setup) still show both."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(t("Training loss"), t("In-context loss (late − early)")),
                        horizontal_spacing=0.1)
    hover = t("step %{customdata:,}") + ": %{y:.3f}<extra>%{fullData.name}</extra>"
    under = overlay and len(series) > 1
    for k, (name, s) in enumerate(series.items()):
        color = COLORS.get(name, "#7f7f7f")
        line = {"color": color, "width": 6} if under and k == 0 else {"color": color, "width": 2}
        opacity = 0.45 if under and k == 0 else 1.0
        loss = smooth(s.get("loss", []))
        if loss.size:
            steps = np.arange(1, loss.size + 1)  # loss[i] is step i + 1's
            fig.add_trace(go.Scatter(x=step_x(steps), y=loss, customdata=steps, mode="lines", name=s["label"],
                                     legendgroup=name, line=line, opacity=opacity, hovertemplate=hover), row=1, col=1)
        steps = [int(x) for x in s.get("steps", [])]
        if len(s.get("icl", [])):
            fig.add_trace(go.Scatter(x=step_x(steps), y=list(s["icl"]), customdata=steps, mode="lines+markers",
                                     name=s["label"], legendgroup=name, showlegend=not loss.size, line=line,
                                     opacity=opacity, marker={"size": 7 if under and k == 0 else 4},
                                     hovertemplate=hover), row=1, col=2)
    lines = [(phase_step, phase_label or t("phase change (step {n})", n=phase_step), PHASE)] if phase_step else []
    lines += [(st_, label, colour) for st_, label, colour in marks if st_]
    for i, (st_, label, colour) in enumerate(lines):
        for col in (1, 2):
            fig.add_vline(x=float(step_x(st_)), line={"color": colour, "dash": "dash" if i == 0 else "dot"},
                          row=1, col=col)
        # inside the plot, under its top edge (above it the label ran into the panel's title), one row per line,
        # written towards the middle of the panel so it is never cut at the panel's edge
        right = total_steps and np.log10(st_ + 1) > 0.5 * np.log10(total_steps + 1)
        fig.add_annotation(x=float(np.log10(step_x(st_))), y=1, yshift=-4 - 18 * i, xref="x2", yref="y2 domain",
                           text=label, showarrow=False, xanchor="right" if right else "left", yanchor="top",
                           font={"color": colour}, bgcolor="rgba(255,255,255,0.8)")
    fig.update_xaxes(**step_axis(total_steps))
    fig.update_yaxes(title={"text": t("loss (nats)")}, row=1, col=1)
    fig.update_yaxes(title={"text": t("nats")}, row=1, col=2)
    fig.update_layout(title={"text": title or t("Loss over training")}, height=400,  # the legend under the axis title
                      margin={"l": 60, "r": 20, "t": 80, "b": 80}, legend={"orientation": "h", "y": -0.3})
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
    steps = [int(s) for s in steps]
    x = step_x(steps)  # step 0 at a place of its own (step_axis)
    hover = t("step %{customdata:,}") + ": %{y:.3f}<extra></extra>"
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=list(pair), customdata=steps, mode="lines+markers", name=pair_label,
                             marker={"size": 4}, line={"color": COLORS["attn2"]}, hovertemplate=hover))
    fig.add_trace(go.Scatter(x=x, y=list(others), customdata=steps, mode="lines", name=t("mean of the other pairs"),
                             line={"color": "#999", "dash": "dot"}, hovertemplate=hover))
    _phase_line(fig, phase_step)
    fig.update_layout(title={"text": title or t("K-composition")}, height=340,
                      margin={"l": 60, "r": 20, "t": 60, "b": 50}, xaxis=step_axis(max(steps, default=0) or None),
                      yaxis={"title": {"text": t("K-composition score")}}, legend={"orientation": "h", "y": -0.25})
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
