"""Figure builders for the decoder and training pages: arrays and token lists in, plotly figures out.

Pure functions (no streamlit, no model calls), so tests can compare a figure's data with the
tensors it was built from. Attention heatmaps keep one convention: rows = queries, columns = keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from viz.figures import ALLOWED, BLOCKED, WEIGHTS_SCALE

BLUE, ORANGE, GREY, GREEN = "#4C78A8", "#F58518", "#BAB0AC", "#54A24B"
ATTN_SCALE = WEIGHTS_SCALE  # one colour scale per quantity, app-wide
_BASE = dict(margin=dict(l=10, r=10, t=50, b=10), template="plotly_white")


def show(token: str) -> str:
    """A token as drawn on an axis: whitespace made visible."""
    return {" ": "␣", "\n": "⏎", "\t": "⇥", "": "∅"}.get(token, token)


def labels(tokens: Sequence[str]) -> list[str]:
    """Unique category names "position: token" (repeated tokens must stay separate columns); the hover
    shows them, so no per-cell hover strings are sent (a 64×256 heatmap would carry ~1 MB of them)."""
    return [f"{i}: {show(t)}" for i, t in enumerate(tokens)]


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


def lookahead_mask_figure(tokens: Sequence[str], query: int | None = None) -> go.Figure:
    """The additive look-ahead mask M over the decoder input: 0 on and below the diagonal, −∞ above.

    `tokens` is the decoder input ([BOS] y1 .. yt); `query` (default: the last row) is the new
    token's query row, outlined: it is the only row computed at this step (keys/values are cached).
    """
    n = len(tokens)
    names = labels(tokens)
    blocked = np.triu(np.ones((n, n), dtype=np.int8), 1)
    query = n - 1 if query is None else query
    fig = go.Figure(go.Heatmap(
        z=blocked, x=names, y=names, zmin=0, zmax=1, showscale=False,
        colorscale=[[0, ALLOWED], [1, BLOCKED]], xgap=1, ygap=1,
        text=np.where(blocked == 1, "−∞", "0"), texttemplate="%{text}" if n <= 24 else None,
        hovertemplate="query %{y} → key %{x}<br>M = %{text}<extra></extra>",
    ))
    _outline_row(fig, query, n)
    fig.update_yaxes(title="query (decoder position)", **_token_axis(names, tokens, 32))
    fig.update_yaxes(range=[n - 0.5, -0.5])
    fig.update_xaxes(title="key", side="top", scaleanchor="y", **_token_axis(names, tokens, 24))
    fig.update_layout(title=f"Look-ahead mask M at this step ({n}×{n})", height=_size(n, 24, 240, 660),
                      **(_BASE | dict(margin=dict(l=10, r=10, t=100, b=10))))
    return fig


def attention_rows_figure(weights: np.ndarray, row_labels: Sequence[str], key_tokens: Sequence[str],
                          title: str, query_token: str = "") -> go.Figure:
    """Attention weights of one query (the new token): one row per head (or the head mean) over keys.

    weights: [rows, keys]; each row is a softmax distribution (sums to 1).
    """
    w = np.asarray(weights, dtype=np.float32)
    keys = labels(key_tokens)
    query = show(query_token)
    fig = go.Figure(go.Heatmap(
        z=w, x=keys, y=list(row_labels), zmin=0, zmax=1, colorscale=ATTN_SCALE, xgap=1, ygap=1,
        hovertemplate=f"%{{y}} · query “{query}” → key %{{x}}<br>weight = %{{z:.6f}}<extra></extra>",
        colorbar=dict(title="weight", thickness=12),
    ))
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(title="key", **_token_axis(keys, key_tokens))
    fig.update_layout(title=title, height=_size(len(row_labels), 30, 170, 520), **_BASE)
    return fig


def topk_figure(topk: Sequence[tuple[str, float]], chosen: str, title: str = "") -> go.Figure:
    """Top-k next-token probabilities as horizontal bars (highest on top), the chosen one in orange."""
    tokens = [t for t, _ in topk]
    probs = np.array([p for _, p in topk], dtype=np.float64)
    names = labels(tokens)
    fig = go.Figure(go.Bar(
        x=probs, y=names, orientation="h",
        marker_color=[ORANGE if t == chosen else BLUE for t in tokens],
        customdata=tokens, text=[f"{p:.3f}" for p in probs], textposition="auto",
        hovertemplate="token “%{customdata}”<br>p = %{x:.6f}<extra></extra>",
    ))
    fig.update_yaxes(**_token_axis(names, tokens))
    fig.update_yaxes(range=[len(tokens) - 0.5, -0.5])
    fig.update_xaxes(title="probability", range=[0, 1])
    fig.update_layout(title=title or f"Top-{len(tokens)} next tokens (chosen: “{chosen}”)",
                      height=_size(len(tokens), 26, 150, 480), **_BASE)
    return fig


# ---------------------------------------------------------------- decoder: whole output


def alignment_figure(cross: np.ndarray, tgt_tokens: Sequence[str], src_tokens: Sequence[str],
                     current: int | None = None, title: str = "", row_title: str = "generated token",
                     key_title: str = "source token") -> go.Figure:
    """Source–target alignment: the cross-attention row of each generated token, stacked over steps.

    cross: [steps, src_len]; row t = what the position that produced tgt_tokens[t] attended to.
    """
    c = np.asarray(cross, dtype=np.float32)
    T, S = c.shape
    rows, cols = labels(tgt_tokens), labels(src_tokens)
    fig = go.Figure(go.Heatmap(
        z=c, x=cols, y=rows, zmin=0, zmax=1, colorscale=ATTN_SCALE, xgap=1, ygap=1,
        hovertemplate=f"{row_title} %{{y}} → {key_title} %{{x}}<br>weight = %{{z:.6f}}<extra></extra>",
        colorbar=dict(title="weight", thickness=12),
    ))
    if current is not None and 0 <= current < T:
        _outline_row(fig, current, S)
    fig.update_yaxes(title=row_title, **_token_axis(rows, tgt_tokens))
    fig.update_yaxes(range=[T - 0.5, -0.5])
    fig.update_xaxes(title=key_title, **_token_axis(cols, src_tokens))
    fig.update_layout(title=title or "Source–target alignment (cross-attention rows stacked over steps)",
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
        customdata=[[n.token, n.score, n.norm_score, "finished ([EOS])" if n.finished else "open"]
                    for n in nodes],
        hovertemplate="depth %{x} · “%{customdata[0]}”<br>log p(prefix) = %{customdata[1]:.4f}"
                      "<br>length-penalised = %{customdata[2]:.4f}<br>%{customdata[3]}<extra></extra>",
    ))
    n_rows = max((len(g) for g in groups.values()), default=1)
    fig.update_yaxes(autorange="reversed", title="rank within depth", dtick=1, zeroline=False)
    fig.update_xaxes(title="tokens generated", dtick=1, zeroline=False)
    fig.update_layout(title="Beam tree (orange: returned hypothesis, green: finished with [EOS])",
                      height=_size(n_rows, 40, 220, 600), **_BASE)
    return fig


def agreement_figure(tokens: Sequence[str], free_p: Sequence[float], forced_p: Sequence[float],
                     reference: tuple[Sequence[str], Sequence[float]] | None = None) -> go.Figure:
    """Probability of each output token, step by step (free-running) vs one teacher-forced pass.

    The two must coincide: the decoder with a key/value cache, one token at a time, computes the
    same numbers as one parallel pass under the lower-triangular mask. `reference`, if given, is
    (reference tokens, their teacher-forced probabilities).
    """
    fig = go.Figure()
    x = list(range(len(tokens)))  # numeric positions: the reference's tokens may differ at a position
    fig.add_trace(go.Scatter(x=x, y=list(forced_p), name="teacher-forced (one parallel pass)",
                             mode="lines+markers", line=dict(color=BLUE, width=6), opacity=0.45,
                             customdata=list(tokens),
                             hovertemplate="“%{customdata}”: p = %{y:.6f} (teacher-forced)<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=list(free_p), name="free-running (step by step)", mode="markers",
                             marker=dict(color=ORANGE, size=9, symbol="x"), customdata=list(tokens),
                             hovertemplate="“%{customdata}”: p = %{y:.6f} (step by step)<extra></extra>"))
    if reference is not None:
        rtoks, rp = reference
        fig.add_trace(go.Scatter(x=list(range(len(rtoks))), y=list(rp), name="reference, teacher-forced",
                                 mode="lines+markers", line=dict(color=GREEN, dash="dot"),
                                 customdata=list(rtoks),
                                 hovertemplate="reference “%{customdata}”: p = %{y:.6f}<extra></extra>"))
    fig.update_yaxes(title="p(token | prefix, source)", range=[0, 1.05])
    n = max(len(tokens), len(reference[0]) if reference else 0)
    every = max(1, -(-n // 48))
    ticks = list(range(0, len(tokens), every))
    fig.update_xaxes(title="output token (the reference's tokens are in the hover)", tickmode="array",
                     tickvals=ticks, ticktext=[show(tokens[i]) for i in ticks], range=[-0.5, n - 0.5])
    fig.update_layout(title="Teacher forcing vs free-running: probability of each token",
                      height=340, legend=dict(orientation="h", y=-0.3), **_BASE)
    return fig


# ---------------------------------------------------------------- training


def training_curves_figure(log: dict, warmup: int | None = None, total_steps: int | None = None,
                           title: str = "Training curves") -> go.Figure:
    """Loss, token accuracy and learning rate against step, stacked with a shared x axis.

    log: columns as in `Checkpoint.log`: step, loss, acc, lr (lists), optionally eval_step / eval_acc.
    """
    steps = list(log.get("step", []))
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=["loss (label-smoothed cross-entropy, [PAD] ignored)",
                                        "accuracy", "learning rate (Noam)"])
    series = [("loss", "loss", BLUE), ("acc", "token accuracy (batch)", GREEN),
              ("lr", "learning rate", ORANGE)]
    for row, (key, name, color) in enumerate(series, start=1):
        fig.add_trace(go.Scatter(x=steps, y=list(log.get(key, [])), mode="lines", name=name,
                                 line=dict(color=color), showlegend=row == 2,
                                 hovertemplate=f"step %{{x}}<br>{name} = %{{y:.6g}}<extra></extra>"),
                      row=row, col=1)
    if log.get("eval_step"):
        fig.add_trace(go.Scatter(x=list(log["eval_step"]), y=list(log["eval_acc"]), mode="markers+lines",
                                 name="exact match (validation, greedy)", line=dict(color=GREY, dash="dot"),
                                 hovertemplate="step %{x}<br>exact match = %{y:.4f}<extra></extra>"),
                      row=2, col=1)
    if warmup:
        for row in (1, 2, 3):
            fig.add_vline(x=warmup, line=dict(color=GREY, dash="dash"), row=row, col=1)
        fig.add_annotation(x=warmup, y=1, yref="y3 domain", text="warmup ends", showarrow=False,
                           xanchor="left", yanchor="top")
    if total_steps:
        fig.update_xaxes(range=[0, total_steps])
    fig.update_yaxes(range=[0, 1.02], row=2, col=1)
    fig.update_xaxes(title="step", row=3, col=1)
    fig.update_layout(height=580, title=title, legend=dict(orientation="h", y=-0.12),
                      **(_BASE | dict(margin=dict(l=10, r=10, t=80, b=10))))
    return fig


def film_frame_figure(weights: np.ndarray, tgt_tokens: Sequence[str], src_tokens: Sequence[str],
                      step: int, what: str) -> go.Figure:
    """One frame of the film strip: the probe example's cross-attention [tgt, src] at a training step."""
    return alignment_figure(weights, tgt_tokens, src_tokens,
                            title=f"Probe example at training step {step}: {what}")


def film_strip_figure(frames: Sequence[tuple[int, np.ndarray]], tgt_tokens: Sequence[str],
                      src_tokens: Sequence[str], current: int | None = None) -> go.Figure:
    """A few frames side by side (same colour scale), to see the alignment appear over training."""
    n = len(frames)
    xs, ys = labels(src_tokens), labels(tgt_tokens)
    fig = make_subplots(rows=1, cols=max(n, 1), horizontal_spacing=0.012,
                        subplot_titles=[f"step {s}" for s, _ in frames])
    for i, (step, w) in enumerate(frames, start=1):
        hover = f"step {step}<br>%{{y}} → %{{x}}<br>weight = %{{z:.4f}}<extra></extra>"
        fig.add_trace(go.Heatmap(z=np.asarray(w, dtype=np.float32), x=xs, y=ys, zmin=0, zmax=1,
                                 colorscale=ATTN_SCALE, showscale=False, hovertemplate=hover),
                      row=1, col=i)
        if step == current:
            fig.layout.annotations[i - 1].font = dict(color=ORANGE, size=14)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    fig.update_layout(height=190, title="Film strip (cross-attention of the probe example)", **_BASE)
    return fig


def alignment_sharpness(weights: np.ndarray) -> float:
    """Mean over target rows of the largest attention weight: 1/src_len when uniform, 1 when hard."""
    w = np.asarray(weights, dtype=np.float64)
    return float(w.max(axis=-1).mean()) if w.size else 0.0


def sharpness_figure(steps: Sequence[int], sharpness: Sequence[float], current: int | None = None,
                     warmup: int | None = None, uniform: float | None = None) -> go.Figure:
    """How peaked the probe's cross-attention is over training (mean of each row's max weight)."""
    fig = go.Figure(go.Scatter(x=list(steps), y=list(sharpness), mode="lines+markers",
                               line=dict(color=BLUE), name="sharpness",
                               hovertemplate="step %{x}<br>mean max weight = %{y:.4f}<extra></extra>"))
    if uniform is not None:
        fig.add_hline(y=uniform, line=dict(color=GREY, dash="dot"), annotation_text="uniform")
    if warmup:
        fig.add_vline(x=warmup, line=dict(color=GREY, dash="dash"), annotation_text="warmup ends")
    if current is not None:
        fig.add_vline(x=current, line=dict(color=ORANGE, width=2))
    fig.update_yaxes(title="mean max weight", range=[0, 1.05])
    fig.update_xaxes(title="training step")
    fig.update_layout(title="Alignment sharpness of the probe example over training", height=280, **_BASE)
    return fig
