"""Figure builders for the decoder and training pages: arrays and token lists in, plotly figures out.

Pure functions (no streamlit, no model calls), so tests can compare a figure's data with the
tensors it was built from. Attention heatmaps keep one convention: rows = queries, columns = keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from viz.figures.attention import ALLOWED, BLOCKED, WEIGHTS_SCALE, step_labels
from viz.i18n import t

__all__ = ["step_labels"]  # re-exported: the decoder-row labels every page uses ("0: [BOS] → i")

BLUE, ORANGE, GREY, GREEN = "#4C78A8", "#F58518", "#BAB0AC", "#54A24B"
ATTN_SCALE = WEIGHTS_SCALE  # one colour scale per quantity, app-wide
_BASE = dict(margin=dict(l=10, r=10, t=50, b=10))  # no template: Streamlit's theme styles every chart


def show(token: str) -> str:
    """A token as drawn on an axis: whitespace made visible."""
    return {" ": "␣", "\n": "⏎", "\t": "⇥", "": "∅"}.get(token, token)


def labels(tokens: Sequence[str], first: int = 0) -> list[str]:
    """Unique category names "position: token" (repeated tokens must stay separate columns); the hover
    shows them, so no per-cell hover strings are sent (a 64×256 heatmap would carry ~1 MB of them).
    first: the position of tokens[0] (a window of a longer input keeps its positions)."""
    return [f"{first + i}: {show(t)}" for i, t in enumerate(tokens)]


def _token_axis(names: Sequence[str], tokens: Sequence[str], max_ticks: int = 48) -> dict:
    """Category axis over `names`, its ticks showing just the tokens (every k-th one when long)."""
    n = len(names)
    every = max(1, -(-n // max_ticks))
    return dict(type="category", tickmode="array", tickvals=list(names[::every]),
                ticktext=[show(t) for t in tokens[::every]], showgrid=False, zeroline=False,
                range=[-0.5, n - 0.5])


def _size(n_rows: int, per_row: int = 28, base: int = 140, cap: int = 900) -> int:
    return int(min(cap, base + per_row * n_rows))


def _outline_row(fig: go.Figure, row: int, n_cols: int) -> None:
    fig.add_shape(type="rect", x0=-0.5, x1=n_cols - 0.5, y0=row - 0.5, y1=row + 0.5,
                  line=dict(color=ORANGE, width=3))


# ---------------------------------------------------------------- decoder: one step


def lookahead_mask_figure(tokens: Sequence[str], predicted: Sequence[str] | None = None,
                          query: int | None = None) -> go.Figure:
    """The additive look-ahead mask M over the decoder input: 0 on and below the diagonal, −∞ above.

    `tokens` is the decoder input ([BOS] y1 .. yt), `predicted` what each position predicted (rows
    are labelled "input → predicted"); `query` (default: the last row) is the new token's query row,
    outlined: it is the only row computed at this step (keys/values are cached).
    """
    n = len(tokens)
    keys = labels(tokens)
    names = step_labels(tokens, predicted) if predicted is not None else keys  # unique: they start with "i: "
    blocked = np.triu(np.ones((n, n), dtype=np.int8), 1)
    query = n - 1 if query is None else query
    fig = go.Figure(go.Heatmap(
        z=blocked, x=keys, y=names, zmin=0, zmax=1, showscale=False,
        colorscale=[[0, ALLOWED], [1, BLOCKED]], xgap=1, ygap=1,
        text=np.where(blocked == 1, "−∞", "0"), texttemplate="%{text}" if n <= 24 else None,
        hovertemplate=t("query %{y} → key %{x}<br>M = %{text}") + "<extra></extra>",
    ))
    _outline_row(fig, query, n)
    fig.update_yaxes(title=t("query (decoder position: input → predicted)"), **_token_axis(names, names, 32))
    fig.update_yaxes(range=[n - 0.5, -0.5])
    fig.update_xaxes(title=t("key (decoder input)"), side="top", scaleanchor="y", **_token_axis(keys, tokens, 24))
    # The title sits at the very top: the key axis (and its title) takes the space just above the grid.
    fig.update_layout(title={"text": t("Look-ahead mask M at this step ({n}×{n})", n=n), "y": 1.0, "yref": "container",
                             "yanchor": "top", "pad": {"t": 10}}, height=_size(n, 24, 240, 660),
                      **(_BASE | dict(margin=dict(l=10, r=10, t=100, b=10))))
    return fig


def attention_rows_figure(weights: np.ndarray, row_labels: Sequence[str], key_tokens: Sequence[str],
                          title: str, query_token: str = "", first: int = 0) -> go.Figure:
    """Attention weights of one query (the new token): one row per head (or the head mean) over keys.

    weights: [rows, keys]; each row is a softmax distribution (sums to 1), or its last keys from position
    `first` on (a long input: the columns keep their positions).
    """
    w = np.asarray(weights, dtype=np.float32)
    keys = labels(key_tokens, first)
    query = show(query_token)
    fig = go.Figure(go.Heatmap(
        z=w, x=keys, y=list(row_labels), zmin=0, zmax=1, colorscale=ATTN_SCALE, xgap=1, ygap=1,
        hovertemplate=t("%{{y}} · query “{query}” → key %{{x}}<br>weight = %{{z:.4f}}", query=query)
        + "<extra></extra>",
        colorbar=dict(title=t("weight"), thickness=12),
    ))
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(title=t("key"), **_token_axis(keys, key_tokens))
    fig.update_layout(title=title, height=_size(len(row_labels), 30, 170, 520), **_BASE)
    return fig


def next_token_ids(model_p: np.ndarray, chosen: int, k: int = 5) -> list[int]:
    """The k most likely ids under the model, best first, plus the chosen id at the end when a sample
    picked it from outside them (the chosen token must always be drawn)."""
    p = np.asarray(model_p, dtype=np.float64)
    top = [int(i) for i in np.argsort(-p, kind="stable")[:k]]
    return top if chosen in top else [*top, int(chosen)]


def next_token_figure(tokens: Sequence[str], model_p: Sequence[float], chosen: int,
                      sample_p: Sequence[float] | None = None, title: str = "") -> go.Figure:
    """Next-token probabilities as horizontal bars (best on top), the chosen token (index `chosen`)
    outlined in orange and marked ▶.

    `model_p` is the model's own softmax over the raw logits; `sample_p`, when sampling, is the
    distribution the token was drawn from (softmax(logits / T) after top-k / top-p): one bar each,
    so no number stands without saying where it comes from.
    """
    names = [f"{i}: {'▶ ' if i == chosen else ''}{show(tok)}" for i, tok in enumerate(tokens)]
    series = [(t("model: softmax(logits)"), model_p, BLUE)]
    if sample_p is not None:
        series.append((t("sampled from: after temperature, top-k, top-p"), sample_p, ORANGE))
    fig = go.Figure()
    for name, probs, color in series:
        probs = np.asarray(probs, dtype=np.float64)
        fig.add_trace(go.Bar(
            x=probs, y=names, orientation="h", name=name, marker_color=color,
            marker_line=dict(color=[ORANGE if i == chosen else "rgba(0,0,0,0)" for i in range(len(tokens))],
                             width=3),
            customdata=list(tokens), text=[f"{p:.4f}" for p in probs], textposition="auto",
            hovertemplate=t("token “%{customdata}”<br>p = %{x:.4f}") + f" ({name})<extra></extra>"))
    fig.update_yaxes(type="category", tickmode="array", tickvals=names,
                     ticktext=[("▶ " if i == chosen else "") + show(tok) for i, tok in enumerate(tokens)],
                     range=[len(tokens) - 0.5, -0.5])
    fig.update_xaxes(title=t("probability"), range=[0, 1])
    fig.update_layout(title=title or t("Next tokens (chosen: “{token}”)", token=show(tokens[chosen])),
                      barmode="group", height=_size(len(tokens) * len(series), 22, 170, 520),
                      legend=dict(orientation="h", y=-0.25), **_BASE)
    return fig


# ---------------------------------------------------------------- decoder: whole output


def alignment_figure(cross: np.ndarray, row_names: Sequence[str], src_tokens: Sequence[str],
                     current: int | None = None, title: str = "", row_title: str = "",
                     key_title: str = "") -> go.Figure:
    """Source–target alignment: the cross-attention row of each generated token, stacked over steps.

    cross: [steps, src_len]; row t = what decoder position t attended to, named row_names[t]: unique
    names, drawn as they are (decoder rows: `step_labels(inputs, predicted)`, "0: [BOS] → i").
    """
    row_title = row_title or t("decoder position (input → predicted)")
    key_title = key_title or t("source token")
    c = np.asarray(cross, dtype=np.float32)
    T, S = c.shape
    rows, cols = list(row_names), labels(src_tokens)
    fig = go.Figure(go.Heatmap(
        z=c, x=cols, y=rows, zmin=0, zmax=1, colorscale=ATTN_SCALE, xgap=1, ygap=1,
        hovertemplate=f"{row_title} %{{y}} · {key_title} %{{x}}<br>" + t("weight = %{z:.4f}") + "<extra></extra>",
        colorbar=dict(title=t("weight"), thickness=12),
    ))
    if current is not None and 0 <= current < T:
        _outline_row(fig, current, S)
    fig.update_yaxes(title=row_title, **_token_axis(rows, rows))
    fig.update_yaxes(range=[T - 0.5, -0.5])
    fig.update_xaxes(title=key_title, **_token_axis(cols, src_tokens))
    fig.update_layout(title=title or t("Source–target alignment (cross-attention rows stacked over steps)"),
                      height=_size(T, 24, 200, 800), **_BASE)
    return fig


def beam_tree_figure(nodes: Sequence, max_nodes: int = 400) -> go.Figure:
    """Beam search as a tree: x = depth (tokens generated), one marker per hypothesis, an edge to its parent.

    nodes: `model.decode.BeamNode`s (id, parent, depth, token, score, finished, best); the returned
    hypothesis (best=True) is drawn orange, hypotheses finished with [EOS] green.
    """
    nodes = list(nodes)[:max_nodes]
    by_id = {n.id: n for n in nodes}
    ypos: dict[int, int] = {}
    groups: dict[int, list] = {}
    for n in nodes:
        groups.setdefault(n.depth, []).append(n)
    for group in groups.values():  # best cumulative score on top within each depth
        for rank, n in enumerate(sorted(group, key=lambda n: -n.score)):
            ypos[n.id] = rank
    fig = go.Figure()
    for on_path in (False, True):
        ex, ey = [], []
        for n in nodes:
            p = by_id.get(n.parent) if n.parent is not None else None
            if p is None or (n.best and p.best) != on_path:
                continue
            ex += [p.depth, n.depth, None]
            ey += [ypos[p.id], ypos[n.id], None]
        fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", hoverinfo="skip", showlegend=False,
                                 line=dict(color=ORANGE if on_path else GREY, width=3 if on_path else 1)))
    colors = [ORANGE if n.best else (GREEN if n.finished else BLUE) for n in nodes]
    fig.add_trace(go.Scatter(
        x=[n.depth for n in nodes], y=[ypos[n.id] for n in nodes], mode="markers+text",
        text=[n.token for n in nodes], textposition="top center", showlegend=False,
        marker=dict(size=11, color=colors, line=dict(width=1, color="white")),
        customdata=[[n.token, n.score, n.norm_score, t("finished ([EOS])") if n.finished else t("open")]
                    for n in nodes],
        hovertemplate=t("depth %{x} · “%{customdata[0]}”<br>log p(prefix) = %{customdata[1]:.4f}"
                        "<br>length-penalised = %{customdata[2]:.4f}<br>%{customdata[3]}") + "<extra></extra>",
    ))
    n_rows = max((len(g) for g in groups.values()), default=1)
    fig.update_yaxes(autorange="reversed", title=t("rank within depth"), dtick=1, zeroline=False)
    fig.update_xaxes(title=t("tokens generated"), dtick=1, zeroline=False)
    fig.update_layout(title=t("Beam tree (orange: returned hypothesis, green: finished with [EOS])"),
                      height=_size(n_rows, 40, 220, 600), **_BASE)
    return fig


def agreement_figure(rows: Sequence[str], free_p: Sequence[float], forced_p: Sequence[float],
                     reference: tuple[Sequence[str], Sequence[float]] | None = None) -> go.Figure:
    """The model's probability of each output token, step by step (free-running) vs one teacher-forced pass.

    The two must coincide: the decoder with a key/value cache, one token at a time, computes the
    same numbers as one parallel pass under the lower-triangular mask. `rows` labels the decoder
    positions ("input → predicted"); `reference`, if given, is (reference tokens, their
    teacher-forced probabilities).
    """
    fig = go.Figure()
    x = list(range(len(rows)))  # numeric positions: the reference's tokens may differ at a position
    forced, free = t("teacher-forced (one parallel pass)"), t("free-running (step by step)")
    fig.add_trace(go.Scatter(x=x, y=list(forced_p), name=forced, mode="lines+markers",
                             line=dict(color=BLUE, width=6), opacity=0.45, customdata=list(rows),
                             hovertemplate=f"%{{customdata}}: p = %{{y:.4f}} ({forced})<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=list(free_p), name=free, mode="markers",
                             marker=dict(color=ORANGE, size=9, symbol="x"), customdata=list(rows),
                             hovertemplate=f"%{{customdata}}: p = %{{y:.4f}} ({free})<extra></extra>"))
    if reference is not None:
        rtoks, rp = reference
        name = t("reference, teacher-forced")
        fig.add_trace(go.Scatter(x=list(range(len(rtoks))), y=list(rp), name=name,
                                 mode="lines+markers", line=dict(color=GREEN, dash="dot"),
                                 customdata=list(rtoks),
                                 hovertemplate=f"“%{{customdata}}”: p = %{{y:.4f}} ({name})<extra></extra>"))
    fig.update_yaxes(title=t("model p(token | prefix, source)"), range=[0, 1.05])
    n = max(len(rows), len(reference[0]) if reference else 0)
    every = max(1, -(-n // 48))
    ticks = list(range(0, len(rows), every))
    fig.update_xaxes(title=t("decoder position: input → predicted (the reference's tokens are in the hover)"),
                     tickmode="array", tickvals=ticks, ticktext=[rows[i] for i in ticks], range=[-0.5, n - 0.5])
    fig.update_layout(title=t("Teacher forcing vs free-running: the model's probability of each token"),
                      height=360, legend=dict(orientation="h", y=-0.45), **_BASE)
    return fig


# ---------------------------------------------------------------- training


def training_curves_figure(log: dict, warmup: int | None = None, total_steps: int | None = None,
                           title: str = "") -> go.Figure:
    """Loss, token accuracy and learning rate against step, stacked with a shared x axis.

    log: columns as in `Checkpoint.log`: step, loss, acc, lr (lists), optionally eval_step / eval_acc.
    Each panel is named by its y-axis title (a title above a panel would sit on a line that starts at
    the panel's top); "warmup ends" sits at the foot of the lr panel, away from the peak it marks.
    """
    steps = list(log.get("step", []))
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06)
    series = [("loss", t("loss (label-smoothed cross-entropy, [PAD] ignored)"), t("loss"), BLUE),
              ("acc", t("token accuracy (batch)"), t("accuracy"), GREEN),
              ("lr", t("learning rate (Noam)"), t("learning rate"), ORANGE)]
    for row, (key, name, axis, color) in enumerate(series, start=1):
        fig.add_trace(go.Scatter(x=steps, y=list(log.get(key, [])), mode="lines", name=name,
                                 line=dict(color=color),
                                 hovertemplate=t("step %{x}") + f"<br>{name} = %{{y:.6g}}<extra></extra>"),
                      row=row, col=1)
        fig.update_yaxes(title=axis, row=row, col=1)
    if log.get("eval_step"):
        name = t("exact match (validation, greedy)")
        fig.add_trace(go.Scatter(x=list(log["eval_step"]), y=list(log["eval_acc"]), mode="markers+lines",
                                 name=name, line=dict(color=GREY, dash="dot"),
                                 hovertemplate=t("step %{x}") + f"<br>{name} = %{{y:.4f}}<extra></extra>"),
                      row=2, col=1)
    if warmup:
        for row in (1, 2, 3):
            fig.add_vline(x=warmup, line=dict(color=GREY, dash="dash"), row=row, col=1)
        fig.add_annotation(x=warmup, y=0, yref="y3 domain", text=t("warmup ends"), showarrow=False,
                           xanchor="left", yanchor="bottom", xshift=4, font=dict(color="#666"))
    if total_steps:
        fig.update_xaxes(range=[0, total_steps])
    fig.update_yaxes(range=[0, 1.02], row=2, col=1)
    fig.update_xaxes(title=t("step"), row=3, col=1)
    fig.update_layout(height=620, title=title or t("Training curves"), legend=dict(orientation="h", y=-0.14),
                      **(_BASE | dict(margin=dict(l=10, r=10, t=60, b=10))))
    return fig


def film_strip_figure(frames: Sequence[tuple[int, np.ndarray]], row_names: Sequence[str],
                      src_tokens: Sequence[str], current: int | None = None, what: str = "") -> go.Figure:
    """A few frames side by side (same colour scale), to see the alignment appear over training.
    row_names: unique names of the rows, as for `alignment_figure`; `what`: which attention map."""
    n = len(frames)
    xs, ys = labels(src_tokens), list(row_names)
    fig = make_subplots(rows=1, cols=max(n, 1), horizontal_spacing=0.012,
                        subplot_titles=[t("step {step}", step=s) for s, _ in frames])
    for i, (step, w) in enumerate(frames, start=1):
        hover = t("step {step}", step=step) + "<br>%{y} · %{x}<br>" + t("weight = %{z:.4f}") + "<extra></extra>"
        fig.add_trace(go.Heatmap(z=np.asarray(w, dtype=np.float32), x=xs, y=ys, zmin=0, zmax=1,
                                 colorscale=ATTN_SCALE, showscale=False, hovertemplate=hover),
                      row=1, col=i)
        if step == current:
            fig.layout.annotations[i - 1].font = dict(color=ORANGE, size=14)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    fig.update_layout(height=210, title=t("Film strip of the probe example: {what}", what=what or t("cross-attention")),
                      **(_BASE | dict(margin=dict(l=10, r=10, t=75, b=10))))  # room for the step titles
    return fig


def alignment_sharpness(weights: np.ndarray) -> float:
    """Mean over target rows of the largest attention weight: 1/src_len when uniform, 1 when hard."""
    w = np.asarray(weights, dtype=np.float64)
    return float(w.max(axis=-1).mean()) if w.size else 0.0


def sharpness_figure(steps: Sequence[int], sharpness: Sequence[float], current: int | None = None,
                     warmup: int | None = None, uniform: float | None = None) -> go.Figure:
    """How peaked the probe's cross-attention is over training (mean of each row's max weight)."""
    what = t("mean max weight")
    fig = go.Figure(go.Scatter(x=list(steps), y=list(sharpness), mode="lines+markers",
                               line=dict(color=BLUE), name=t("sharpness"),
                               hovertemplate=t("step %{x}") + f"<br>{what} = %{{y:.4f}}<extra></extra>"))
    if uniform is not None:
        fig.add_hline(y=uniform, line=dict(color=GREY, dash="dot"), annotation_text=t("uniform"))
    if warmup:
        fig.add_vline(x=warmup, line=dict(color=GREY, dash="dash"), annotation_text=t("warmup ends"),
                      annotation_position="bottom right")
    if current is not None:
        fig.add_vline(x=current, line=dict(color=ORANGE, width=2))
    fig.update_yaxes(title=what, range=[0, 1.05])
    fig.update_xaxes(title=t("training step"))
    fig.update_layout(title=t("Alignment sharpness of the probe example over training"), height=280, **_BASE)
    return fig
