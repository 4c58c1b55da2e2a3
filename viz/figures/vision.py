"""Figures of /vision (viz/pages/vision.py) and lesson 20: a vision transformer's attention over an image. Pure
builders: arrays in (an image, one row of a trace's attention weights, what model/analysis/vision.py computes),
plotly out; no streamlit, and they never run the model.

The token order is the model's: [CLS], then the register tokens (if any), then the patches row-major, so a
query's row of `encoder.layers.{l}.self_attn.weights` is split by `patch_map` into what it gives the prefix
tokens and a (rows, cols) map over the image. Every drawn number is that row's, unrescaled: the colour scale
runs from 0 to the map's own largest weight (the caption and hover say the weight itself).

- `image_figure`: the image with its patch grid (and a chosen patch outlined);
- `attention_over_image`: one map over the image (attention of [CLS] or of a patch, or the rollout);
- `rollout_beside_raw`: the raw weights and the rollout (Abnar & Zuidema 2020) side by side;
- `heads_over_image`: every head of one layer, small maps;
- `distance_figure`: mean attention distance per head against depth (ViT paper, Figure 7 right);
- `position_similarity_figure`: cosine similarity of each position embedding with every other (Figure 7 centre);
- `deciding_share_figure`: the share of [CLS] attention on the deciding patches per head, against the share of
  the image they cover;
- `prediction_figure`: the class probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.figures.attention import WEIGHTS_SCALE, num
from viz.i18n import t

GRID = "rgba(255,255,255,0.55)"
PICKED = "#d62728"  # the chosen query patch's outline
OVERLAY_OPACITY = 0.55  # the attention map over the image: the image still shows through
HEAD_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf", "#393b79", "#637939")


def to_hwc(image) -> np.ndarray:
    """An image as (H, W, 3) uint8 for go.Image: from (3, H, W) or (H, W, 3), floats in [0, 1] or uint8."""
    a = np.asarray(image.detach().cpu() if hasattr(image, "detach") else image)
    if a.ndim == 4:  # a batch of one
        a = a[0]
    if a.ndim == 3 and a.shape[0] in (1, 3) and a.shape[-1] not in (1, 3):
        a = np.moveaxis(a, 0, -1)
    if a.ndim == 2:
        a = a[..., None]
    if a.shape[-1] == 1:
        a = np.repeat(a, 3, axis=-1)
    if a.dtype != np.uint8:
        a = np.clip(np.rint(a.astype(np.float64) * 255.0), 0, 255).astype(np.uint8)
    return a


def patch_map(row, n_prefix: int, grid: Sequence[int]) -> tuple[np.ndarray, float]:
    """One query's attention row (T,) -> (the (rows, cols) map over the patches, the weight on the prefix tokens:
    [CLS] and registers). The two add up to the row's sum, 1."""
    row = np.asarray(row, dtype=np.float64)
    rows, cols = int(grid[0]), int(grid[1])
    return row[n_prefix:n_prefix + rows * cols].reshape(rows, cols), float(row[:n_prefix].sum())


def _grid_shapes(rows: int, cols: int, p: int, color: str = GRID) -> list[dict]:
    h, w = rows * p, cols * p
    lines = [dict(type="line", x0=c * p - 0.5, x1=c * p - 0.5, y0=-0.5, y1=h - 0.5) for c in range(1, cols)]
    lines += [dict(type="line", x0=-0.5, x1=w - 0.5, y0=r * p - 0.5, y1=r * p - 0.5) for r in range(1, rows)]
    return [dict(s, line=dict(color=color, width=1), layer="above") for s in lines]


def _outline(r: int, c: int, p: int, color: str = PICKED) -> dict:
    return dict(type="rect", x0=c * p - 0.5, x1=(c + 1) * p - 0.5, y0=r * p - 0.5, y1=(r + 1) * p - 0.5,
                line=dict(color=color, width=3), layer="above")


def _panel_layout(n: int, h: int, w: int, titles: Sequence[str], gap: float, title: str, height: int,
                  shapes: Sequence[dict] = (), right: float = 0.0) -> dict:
    """A layout of `n` image panels side by side (axes x, x2, ... with their domains and pixel ranges, each panel's
    title as an annotation), built as one dict: make_subplots and per-axis updates cost ~0.1 s a figure here, and a
    head switch redraws two of these."""
    width = (1.0 - right - gap * (n - 1)) / n
    lay: dict = {"title": {"text": title}, "height": height, "margin": dict(l=10, r=10, t=90 if n > 1 else 60, b=10),
                 "shapes": list(shapes), "annotations": []}
    for i in range(n):
        sfx = "" if i == 0 else str(i + 1)
        x0 = i * (width + gap)
        lay[f"xaxis{sfx}"] = dict(domain=[x0, x0 + width], range=[-0.5, w - 0.5], showticklabels=False,
                                  showgrid=False, zeroline=False, anchor=f"y{sfx}")
        lay[f"yaxis{sfx}"] = dict(range=[h - 0.5, -0.5], showticklabels=False, showgrid=False, zeroline=False,
                                  anchor=f"x{sfx}", scaleanchor=f"x{sfx}")
        if titles[i]:
            lay["annotations"].append(dict(text=titles[i], x=x0 + width / 2, y=1.0, xref="paper", yref="paper",
                                           xanchor="center", yanchor="bottom", showarrow=False))
    return lay


def _on(shapes: Sequence[dict], i: int) -> list[dict]:
    sfx = "" if i == 0 else str(i + 1)
    return [dict(sh, xref=f"x{sfx}", yref=f"y{sfx}") for sh in shapes]


def _centres(n: int, p: int) -> np.ndarray:
    return np.arange(n) * p + (p - 1) / 2.0


def _overlay(z: np.ndarray, p: int, zmax: float, name: str, colorbar: dict | None, show_scale: bool,
             axis: int = 0) -> go.Heatmap:
    rows, cols = z.shape
    sfx = "" if axis == 0 else str(axis + 1)
    return go.Heatmap(z=z, x=_centres(cols, p), y=_centres(rows, p), zmin=0.0, zmax=max(zmax, 1e-12),
                      xaxis=f"x{sfx}", yaxis=f"y{sfx}",
                      colorscale=WEIGHTS_SCALE, opacity=OVERLAY_OPACITY, name=name, showscale=show_scale,
                      colorbar=colorbar, customdata=np.stack(np.meshgrid(np.arange(cols), np.arange(rows)), -1),
                      hovertemplate=t("patch (row {r}, col {c}): {z}", r="%{customdata[1]}", c="%{customdata[0]}",
                                    z="%{z:.4f}") + "<extra></extra>")


def image_figure(image, grid: Sequence[int], patch_size: int, picked: tuple[int, int] | None = None,
                 title: str | None = None, height: int = 360) -> go.Figure:
    """The image as the model reads it (resized to its input), with its patch grid; `picked` outlines a patch."""
    img = to_hwc(image)
    rows, cols = int(grid[0]), int(grid[1])
    shapes = _grid_shapes(rows, cols, patch_size) + ([_outline(*picked, patch_size)] if picked is not None else [])
    title = title or t("The image: {rows} × {cols} patches of {p} × {p} pixels = {n} tokens", rows=rows, cols=cols,
                       p=patch_size, n=rows * cols)
    return go.Figure(go.Image(z=img, hovertemplate="x %{x}, y %{y}<extra></extra>"),
                     _panel_layout(1, img.shape[0], img.shape[1], [""], 0.0, title, height, shapes))


def attention_over_image(image, z, patch_size: int, title: str, picked: tuple[int, int] | None = None,
                         height: int = 380) -> go.Figure:
    """One (rows, cols) map of weights drawn over the image; the heatmap's z is exactly `z`."""
    img = to_hwc(image)
    z = np.asarray(z, dtype=np.float64)
    shapes = _grid_shapes(*z.shape, patch_size) + ([_outline(*picked, patch_size)] if picked is not None else [])
    return go.Figure([go.Image(z=img, hoverinfo="skip"),
                      _overlay(z, patch_size, float(z.max()), title, dict(title=t("weight")), True)],
                     _panel_layout(1, img.shape[0], img.shape[1], [""], 0.0, title, height, shapes))


def rollout_beside_raw(image, raw, rollout, patch_size: int, raw_title: str, rollout_title: str,
                       title: str, picked: tuple[int, int] | None = None, height: int = 400) -> go.Figure:
    """Two maps over the same image: this layer's raw weights (one head or the heads' mean) and the rollout up to
    this layer. Each has its own colour scale (0 to its largest value): rollout spreads its mass wider."""
    img = to_hwc(image)
    raw, rollout = np.asarray(raw, dtype=np.float64), np.asarray(rollout, dtype=np.float64)
    base = _grid_shapes(*raw.shape, patch_size) + ([_outline(*picked, patch_size)] if picked else [])
    data = []
    for i, (z, name) in enumerate(((raw, raw_title), (rollout, rollout_title))):
        sfx = "" if i == 0 else str(i + 1)
        data.append(go.Image(z=img, hoverinfo="skip", xaxis=f"x{sfx}", yaxis=f"y{sfx}"))
        bar = dict(title=t("weight"), x=0.44 if i == 0 else 1.0, len=0.9)
        data.append(_overlay(z, patch_size, float(z.max()), name, bar, True, axis=i))
    return go.Figure(data, _panel_layout(2, img.shape[0], img.shape[1], [raw_title, rollout_title], 0.12, title,
                                         height, _on(base, 0) + _on(base, 1)))


def heads_over_image(image, maps, patch_size: int, title: str, picked: tuple[int, int] | None = None,
                     chosen: int | None = None, height: int = 260, labels: Sequence[str] | None = None) -> go.Figure:
    """Every head's map of one layer, side by side (maps: (H, rows, cols)); one shared scale, 0 to the largest
    weight of any head, so heads compare. `labels`: the panels' titles (default "head h"; lesson 20: layers)."""
    img = to_hwc(image)
    maps = np.asarray(maps, dtype=np.float64)
    H = maps.shape[0]
    top = float(maps.max())
    labels = list(labels) if labels is not None else [t("head {h}", h=h) for h in range(H)]
    shapes, data = [], []
    for h in range(H):
        sfx = "" if h == 0 else str(h + 1)
        data.append(go.Image(z=img, hoverinfo="skip", xaxis=f"x{sfx}", yaxis=f"y{sfx}"))
        data.append(_overlay(maps[h], patch_size, top, labels[h], dict(title=t("weight")), h == H - 1, axis=h))
        if picked is not None:
            shapes += _on([_outline(*picked, patch_size)], h)
    titles = [labels[h] + (" ●" if h == chosen else "") for h in range(H)]
    return go.Figure(data, _panel_layout(H, img.shape[0], img.shape[1], titles, 0.02, title, height, shapes,
                                         right=0.06))


def distance_figure(distance, image_size: int, title: str | None = None, height: int = 380) -> go.Figure:
    """Mean attention distance (pixels) of every head at every layer: x = layer, one point per head (ViT,
    Figure 7 right). distance: (L, H)."""
    d = np.asarray(distance, dtype=np.float64)
    L, H = d.shape
    fig = go.Figure()
    for h in range(H):
        fig.add_trace(go.Scatter(x=np.arange(L), y=d[:, h], mode="markers", name=t("head {h}", h=h),
                                 marker=dict(size=10, color=HEAD_COLORS[h % len(HEAD_COLORS)]),
                                 hovertemplate=t("layer {x}, head {h}: {y} px", x="%{x}", h=h, y="%{y:.2f}")
                                 + "<extra></extra>"))
    fig.update_layout(title=title or t("Mean attention distance of every head (pixels, image {s} × {s})",
                                       s=image_size),
                      height=height, margin=dict(l=60, r=10, t=60, b=50),
                      xaxis=dict(title=t("layer (network depth)"), tickmode="array", tickvals=list(range(L))),
                      yaxis=dict(title=t("mean attention distance (pixels)"), rangemode="tozero"))
    return fig


def similarity_tiles(sim) -> np.ndarray:
    """(P, rows, cols) similarities -> one (rows·(rows+1)−1, cols·(cols+1)−1) array: tile (r, c) is patch
    (r, c)'s similarity with every patch, tiles separated by a row/column of NaN."""
    s = np.asarray(sim, dtype=np.float64)
    P, rows, cols = s.shape
    out = np.full((rows * (rows + 1) - 1, cols * (cols + 1) - 1), np.nan)
    for i in range(P):
        r, c = divmod(i, cols)
        out[r * (rows + 1):r * (rows + 1) + rows, c * (cols + 1):c * (cols + 1) + cols] = s[i]
    return out


def position_similarity_figure(sim, title: str | None = None, height: int = 520) -> go.Figure:
    """The position embeddings' cosine similarity (ViT, Figure 7 centre): tile (r, c) shows how similar patch
    (r, c)'s position embedding is to every other patch's. sim: (P, rows, cols)."""
    z = similarity_tiles(sim)
    fig = go.Figure(go.Heatmap(z=z, zmin=-1.0, zmax=1.0, colorscale="RdBu_r", hoverongaps=False,
                               colorbar=dict(title=t("cosine")),
                               hovertemplate=t("cosine similarity {z}", z="%{z:.3f}") + "<extra></extra>"))
    fig.update_layout(title=title or t("Position embedding similarity: tile (row, col) = that patch against all"),
                      height=height, margin=dict(l=10, r=10, t=60, b=10),
                      xaxis=dict(showticklabels=False, showgrid=False, zeroline=False, constrain="domain"),
                      yaxis=dict(showticklabels=False, showgrid=False, zeroline=False, autorange="reversed",
                                 scaleanchor="x"))
    return fig


def deciding_share_figure(share, covered: float, title: str | None = None, height: int = 380) -> go.Figure:
    """The share of [CLS]'s attention on the patches that decide the answer, per layer and head (share: (L, H)),
    against the share of the image those patches cover (a dashed line: what uniform attention would give)."""
    s = np.asarray(share, dtype=np.float64)
    L, H = s.shape
    fig = go.Figure()
    for h in range(H):
        fig.add_trace(go.Bar(x=[t("layer {l}", l=i) for i in range(L)], y=s[:, h], name=t("head {h}", h=h),
                             marker_color=HEAD_COLORS[h % len(HEAD_COLORS)],
                             hovertemplate="%{x}, " + t("head {h}", h=h) + ": %{y:.1%}<extra></extra>"))
    fig.add_hline(y=covered, line=dict(color="black", dash="dash"),
                  annotation_text=t("share of the image they cover: {v}", v=f"{covered:.1%}"),
                  annotation_position="top right")
    fig.update_layout(barmode="group", title=title or t("[CLS] attention on the deciding patches, per head"),
                      height=height, margin=dict(l=60, r=10, t=60, b=50),
                      yaxis=dict(title=t("share of [CLS] attention"), tickformat=".0%", range=[0, 1]))
    return fig


def prediction_figure(probs, class_names: Sequence[str], truth: int | None = None, height: int = 260) -> go.Figure:
    """The class probabilities (softmax of the logits), the predicted class first; `truth` marks the label."""
    p = np.asarray(probs, dtype=np.float64)
    order = np.argsort(-p)
    names = [str(class_names[i]) + (" ✓" if truth is not None and i == truth else "") for i in order]
    fig = go.Figure(go.Bar(x=p[order], y=names, orientation="h", marker_color="#1f77b4",
                           text=[num(float(v)) for v in p[order]], textposition="auto",
                           hovertemplate="%{y}: %{x:.4f}<extra></extra>"))
    fig.update_layout(title=t("The model's answer: class probabilities"), height=height,
                      margin=dict(l=10, r=10, t=50, b=40), xaxis=dict(title=t("probability"), range=[0, 1]),
                      yaxis=dict(autorange="reversed"))
    return fig


def blank_effect_figure(image, effect, patch_size: int, title: str, height: int = 380) -> go.Figure:
    """The causal effect of blanking each patch (model.analysis.vision.blank_patch_effect: the drop in the answer's
    probability when that patch's pixels are set to the background) over the image, on a scale centred at 0."""
    img = to_hwc(image)
    z = np.asarray(effect, dtype=np.float64)
    rows, cols = z.shape
    top = max(float(np.abs(z).max()), 1e-12)
    heat = go.Heatmap(z=z, x=_centres(cols, patch_size), y=_centres(rows, patch_size), zmin=-top, zmax=top,
                      colorscale="RdBu_r", opacity=OVERLAY_OPACITY, colorbar=dict(title=t("drop in p")),
                      customdata=np.stack(np.meshgrid(np.arange(cols), np.arange(rows)), -1),
                      hovertemplate=t("patch (row {r}, col {c}): {z}", r="%{customdata[1]}", c="%{customdata[0]}",
                                      z="%{z:+.4f}") + "<extra></extra>")
    return go.Figure([go.Image(z=img, hoverinfo="skip"), heat],
                     _panel_layout(1, img.shape[0], img.shape[1], [""], 0.0, title, height,
                                   _grid_shapes(rows, cols, patch_size)))

