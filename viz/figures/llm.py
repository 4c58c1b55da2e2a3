"""Figures of the Language model page (viz/pages/llm.py): pure builders, arrays or a Trace in, plotly out.

- `head_overview(scores, ...)`: a layer × head grid of one per-head statistic ([L, H], computed by
  model.analysis.phenomena.head_statistics: the published recipes live there, not here); hover gives the
  number, customdata the (layer, head) a click opens;
- `top_tokens_figure(top)`: a step's top-10 next tokens with probabilities;
- `step_attention_figure(attn, ...)`: where the new position looked, in every layer, for one head;
- `logit_lens_figure(top_tokens, probs, ...)`: layer × position, the lens's top token and its probability.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from viz.figures.attention import WEIGHTS_SCALE, arr, every_tick, num, show_token, token_labels
from viz.i18n import N_, t

# id (= phenomena.head_statistics's key, the URL value) -> (label, what one cell means, colour scale upper
# bound: None = the data's max)
STATS = {
    "sink": (N_("Share on the first token (sink)"),
             N_("mean over queries 1…T−1 of the weight on token 0"), 1.0),
    "previous_token": (N_("Previous-token score"),
                       N_("mean over queries 1…T−1 of the weight on the token just before"), 1.0),
    "duplicate_token": (N_("Duplicate-token score"),
                        N_("mean, over queries whose token occurred earlier, of the weight on those earlier copies"),
                        1.0),
    "induction": (N_("Induction score"),
                  N_("mean, over queries whose token occurred earlier, of the weight on the token that followed "
                     "each earlier copy"), 1.0),
    "entropy": (N_("Entropy (nats)"), N_("mean over queries of −Σ w·log w: 0 = one key, log n = spread evenly"),
                None),
    "distance": (N_("Mean attention distance"), N_("mean over queries of Σ w·(i − j), in tokens"), None),
}
STAT_ALIASES = {"prev": "previous_token", "dup": "duplicate_token"}  # the short ids older links carry


def lm_modules(trace: Mapping) -> list[str]:
    """The decoder's self-attention modules in layer order (from the model's description in meta)."""
    desc = (trace.meta_item("model") if hasattr(trace, "meta_item") else (getattr(trace, "meta", None) or {}).get(
        "model")) or {}
    mods = [m for m, a in desc.get("attention", {}).items() if a.get("kind") == "decoder_self"]
    return sorted((m for m in mods if f"{m}.weights" in trace), key=lambda m: desc["attention"][m]["layer"])


def head_overview(scores: np.ndarray, stat: str, layer: int | None = None, head: int | None = None,
                  title: str | None = None) -> go.Figure:
    """Layer (rows) × head (columns) heatmap of `scores`; hover gives the number; each cell's customdata is
    [layer, head] so a click can open it; the chosen (layer, head) is outlined."""
    label, what, top = STATS[stat]
    L, H = scores.shape
    z = np.where(np.isfinite(scores), scores, np.nan)
    custom = np.dstack(np.meshgrid(np.arange(L), np.arange(H), indexing="ij"))
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(H)), y=list(range(L)), customdata=custom, colorscale=WEIGHTS_SCALE, zmin=0,
        zmax=top if top is not None else (float(np.nanmax(z)) if np.isfinite(z).any() else 1.0),
        colorbar={"title": {"text": t(label), "side": "right"}, "thickness": 12},
        hovertemplate=t("layer %{y} · head %{x}") + "<br>" + t(label) + ": %{z:.3f}<extra></extra>",
        xgap=1, ygap=1))
    fig.update_layout(
        title={"text": title or t("{what} per head · click a cell to open that head", what=t(label))},
        height=max(320, 22 * L + 120), width=max(360, 44 * H + 200), margin={"l": 60, "r": 20, "t": 60, "b": 50},
        xaxis={"title": {"text": t("head")}, "dtick": 1, "side": "bottom"},
        yaxis={"title": {"text": t("layer")}, "dtick": 1, "autorange": "reversed"},
        clickmode="event+select")
    if layer is not None and head is not None and 0 <= layer < L and 0 <= head < H:
        fig.add_shape(type="rect", x0=head - 0.5, x1=head + 0.5, y0=layer - 0.5, y1=layer + 0.5,
                      line={"color": "#d62728", "width": 3})
    fig.add_annotation(text=t(what), xref="paper", yref="paper", x=0, y=-0.02, yanchor="top", showarrow=False,
                       yshift=-24, font={"size": 11})
    return fig


def top_tokens_figure(top: Sequence[tuple[str, float]], chosen: str | None = None,
                      title: str | None = None) -> go.Figure:
    """Horizontal bars: the top next tokens (readable) and their probabilities, most likely on top; the
    chosen token in another colour."""
    toks = [show_token(tok) for tok, _ in top]
    probs = [float(p) for _, p in top]
    labels = [f"{i + 1}. {tok}" for i, tok in enumerate(toks)]
    colors = ["#d62728" if chosen is not None and tok == chosen else "#1f77b4" for tok, _ in top]
    fig = go.Figure(go.Bar(x=probs, y=labels, orientation="h", marker_color=colors,
                           text=[num(p) for p in probs], textposition="outside",
                           hovertemplate="%{y}: %{x:.4f}<extra></extra>"))
    fig.update_layout(title={"text": title or t("Top {n} next tokens", n=len(top))}, height=60 + 26 * len(top),
                      width=460, margin={"l": 10, "r": 40, "t": 50, "b": 40},
                      xaxis={"title": {"text": t("probability")}, "range": [0, 1.15]},
                      yaxis={"autorange": "reversed", "automargin": True})
    return fig


def step_attention_figure(attn, tokens: Sequence[str], head: int, title: str | None = None,
                          first: int = 0) -> go.Figure:
    """attn [L, H, T]: one generated position's attention in every layer; rows = layers, columns = the keys
    (prompt and tokens so far), for head `head`. first: the first key drawn (a long context draws its last
    keys only; the labels keep their positions)."""
    a = arr(attn)[:, head]  # [L, T]
    x = token_labels(tokens, a.shape[1])[first:]
    a = a[:, first:]
    L, T = a.shape
    fig = go.Figure(go.Heatmap(z=a, x=x, y=list(range(L)), colorscale=WEIGHTS_SCALE, zmin=0, zmax=1,
                               hovertemplate=t("layer %{y} · key %{x}") + "<br>" + t("weight") +
                               ": %{z:.3f}<extra></extra>", colorbar={"thickness": 12}))
    fig.update_layout(title={"text": title or t("Where the new token looked · head {head}", head=head)},
                      height=max(300, 16 * L + 160), width=min(1300, max(420, 18 * T + 160)),
                      margin={"l": 60, "r": 20, "t": 60, "b": 80},
                      xaxis={"title": {"text": t("key (earlier token)")}, **every_tick(x)},
                      yaxis={"title": {"text": t("layer")}, "autorange": "reversed", "dtick": 1})
    return fig


def logit_lens_figure(top_tokens: Sequence[Sequence[str]], probs, positions: Sequence[int],
                      inputs: Sequence[str], title: str | None = None,
                      rows: Sequence[str] | None = None) -> go.Figure:
    """Layer (rows) × position (columns): the colour is the lens's top-token probability, the cell text that
    token. `positions` are the prompt positions shown (columns); `inputs` the prompt's tokens (readable);
    `rows` the row labels (model.analysis.logit_lens's "embed", "0", …; default 0 … L−1)."""
    p = arr(probs)
    L, P = p.shape
    y = list(rows) if rows is not None else list(range(L))
    x = [f"{i}: {show_token(inputs[i])}" if i < len(inputs) else str(i) for i in positions]
    text = [[show_token(tok) for tok in row] for row in top_tokens]
    fig = go.Figure(go.Heatmap(
        z=p, x=x, y=y, text=text, texttemplate="%{text}", textfont={"size": 10},
        colorscale="Blues", zmin=0, zmax=1, colorbar={"title": {"text": t("probability")}, "thickness": 12},
        hovertemplate=t("layer %{y} · position %{x}") + "<br>" + t("top token") + ": %{text}<br>"
        + t("probability") + ": %{z:.3f}<extra></extra>"))
    fig.update_layout(title={"text": title or t("Logit lens: each layer's residual stream read as the output")},
                      height=max(360, 22 * L + 160), width=min(1400, max(480, 70 * P + 140)),
                      margin={"l": 60, "r": 20, "t": 60, "b": 90},
                      xaxis={"title": {"text": t("position: input token")}, "side": "bottom", **every_tick(x)},
                      yaxis={"title": {"text": t("layer (output of)")}, "autorange": "reversed", "dtick": 1,
                             "type": "category"})  # "embed" beside "0" … : not a numeric axis
    return fig


MIN_CELL = 22  # px: a head heatmap's least cell side on the Language model page (12 px labels, apart)
MAX_CELL = 40  # px: a short prompt's cells grow up to this, so its heatmap fills a readable square
MIN_PLOT = 480  # px: the plot side a short prompt's cells grow towards (issue 38 §5: 14 tokens drew ~140 px)
MAX_HEATMAP_HEIGHT = 1000
MAX_HEATMAP_WIDTH = 1400
TICK_FONT = 12  # px: Streamlit's chart theme draws tick labels at this size
COLORBAR_PX = 110  # the colour bar and its labels, right of the plot
AXIS_TITLE_PX = 30  # an axis title beside its tick labels


def heatmap_margins(x: Sequence[str], y: Sequence[str], top: int) -> dict:
    """Margins that hold a head heatmap's tick labels, measured from the labels (y upright on the left, x turned
    −60° below): the plot then keeps the cells the figure was sized for, instead of plotly's automatic margins
    eating into a square plot (constrain="domain" shrinks both sides to the smaller one)."""
    from math import cos, radians, sin

    from viz.figures.attention import text_width

    wide_x = max((text_width(str(v), TICK_FONT) for v in x), default=TICK_FONT)
    wide_y = max((text_width(str(v), TICK_FONT) for v in y), default=TICK_FONT)
    below = wide_x * sin(radians(60)) + TICK_FONT * cos(radians(60)) + 8 + AXIS_TITLE_PX
    return {"l": int(wide_y + 8 + AXIS_TITLE_PX), "b": int(below), "t": int(top), "r": COLORBAR_PX}


def head_cell(rows: int, cols: int, margin: dict, max_height: int = MAX_HEATMAP_HEIGHT,
              max_width: int = MAX_HEATMAP_WIDTH) -> float:
    """The cell side (px) of a rows × cols head heatmap: at least MIN_CELL (a rotated 12 px label needs ~14 px
    across, so labels never overlap), up to MAX_CELL so that a short prompt fills about MIN_PLOT px, and no more
    than the figure's height and width limits leave."""
    cell = min(MAX_CELL, max(MIN_CELL, MIN_PLOT / max(rows, cols, 1)))
    room_h = (max_height - margin["t"] - margin["b"]) / max(rows, 1)
    room_w = (max_width - margin["l"] - margin["r"]) / max(cols, 1)
    return max(1.0, min(cell, room_h, room_w))  # a very long prompt: the limits win (its labels are thinned)


def with_min_cells(fig: go.Figure, cell: int | None = None, max_height: int = MAX_HEATMAP_HEIGHT) -> go.Figure:
    """A head heatmap (viz.figures.attention.attention_heatmap) sized to its tokens: square cells of `head_cell`
    px (or `cell`), margins measured from its tick labels (`heatmap_margins`), and a figure exactly that large, so
    the plot is the figure, not a small square in a large frame (issue 26 §2: 110 px of plot; issue 38 §5: ~140 px
    at 1920 px, rotated labels overlapping). In place."""
    tr = fig.data[0]
    if tr.z is None or not len(tr.z):
        return fig
    rows, cols = len(tr.z), len(tr.z[0])
    x = [str(v) for v in (tr.x if tr.x is not None else range(cols))]
    y = [str(v) for v in (tr.y if tr.y is not None else range(rows))]
    top = fig.layout.margin.t if fig.layout.margin and fig.layout.margin.t is not None else 60
    margin = heatmap_margins(x, y, top)
    side = float(cell) if cell else head_cell(rows, cols, margin, max_height)
    width = margin["l"] + side * cols + margin["r"]
    n_buttons = max((len(m.buttons) for m in fig.layout.updatemenus or ()), default=0)
    if n_buttons:  # the head buttons start at the plot's left edge (after the y labels), 44 px in
        width = max(width, margin["l"] + 44 + 30 * n_buttons + 20)
    fig.update_layout(height=int(round(margin["t"] + side * rows + margin["b"])), width=int(round(width)),
                      margin=margin)
    return fig
