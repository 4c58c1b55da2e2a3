"""A batch with padding: the padding masks with their [PAD] columns, the decoder's combined mask, and the
per-token loss where [PAD] contributes 0. Pure builders over a batch Trace (model.padding.batch_trace)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from viz.figures import attention as F
from viz.i18n import N_, t

PAD = "[PAD]"


def _cells(rows: Sequence[Sequence[str]], n: int) -> list[list[str]]:
    return [[F.show_token(r[j]) if j < len(r) else "" for j in range(n)] for r in rows]


def padding_masks_figure(trace) -> go.Figure:
    """masks.src_pad (sentences × source positions) and masks.tgt_pad (× target positions); each cell shows
    its token, dark = [PAD] (True = padding)."""
    src, tgt = F.arr(trace["masks.src_pad"]), F.arr(trace["masks.tgt_pad"])
    meta = trace.meta
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.06, column_widths=[src.shape[1], tgt.shape[1]],
                        subplot_titles=[t("source padding mask (masks.src_pad)"),
                                        t("target padding mask (masks.tgt_pad)")])
    rows = [t("sentence {i}", i=i) for i in range(src.shape[0])]
    for c, (m, toks) in enumerate(((src, meta["src_tokens"]), (tgt, meta["tgt_tokens"])), start=1):
        fig.add_trace(go.Heatmap(z=m, x=list(range(m.shape[1])), y=rows, text=_cells(toks, m.shape[1]),
                                 texttemplate="%{text}", colorscale=F.MASK_SCALE, zmin=0, zmax=1,
                                 showscale=False, xgap=1, ygap=1,
                                 hovertemplate="%{y}, " + t("position") + " %{x}: %{text}<br>"
                                 + t("padding") + " = %{z}<extra></extra>"), 1, c)
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_yaxes(showticklabels=False, row=1, col=2)
    fig.update_xaxes(title=t("position"), dtick=1)
    return F._layout(fig, t("padding masks: dark = [PAD] (True), light = a real token"),
                     120 + 46 * src.shape[0])


def combined_mask_parts(trace, b: int, layer: int = 0) -> dict[str, np.ndarray]:
    """The decoder self-attention mask of sentence b, and its two parts (1 = blocked), each [T, T]."""
    combined = F.arr(trace[f"decoder.layers.{layer}.self_attn.mask"])[b, 0]
    T = combined.shape[0]
    key_pad = F.arr(trace["masks.tgt_pad"])[b]
    return {N_("look-ahead (masks.causal)"): F.arr(trace["masks.causal"]),
            N_("target key padding (masks.tgt_pad)"): np.broadcast_to(key_pad[None, :], (T, T)).astype(np.float32),
            N_("combined = look-ahead OR padding"): combined}


def combined_mask_figure(trace, b: int) -> go.Figure:
    """Look-ahead | key padding | their OR (the mask decoder self-attention used), for sentence b."""
    parts = combined_mask_parts(trace, b)
    toks = trace.meta["tgt_tokens"][b]
    labels = F.token_labels(toks, len(toks))
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.05, subplot_titles=[t(k) for k in parts])
    for c, (name, m) in enumerate(parts.items(), start=1):
        fig.add_trace(F.heatmap_trace(m, "mask", labels, labels, t(name), showscale=c == 3), 1, c)
    fig.update_yaxes(autorange="reversed", type="category", showticklabels=False)
    fig.update_yaxes(showticklabels=True, row=1, col=1, title=t("query (target)"))
    fig.update_xaxes(type="category", tickangle=-60, title=t("key (target)"))
    return F._layout(fig, t("sentence {b}: the decoder's self-attention mask (dark = blocked)", b=b),
                     F._size(len(toks), 320, 18, 560))


def loss_figure(per_token: np.ndarray, real: np.ndarray, labels: Sequence[Sequence[str]]) -> go.Figure:
    """Per-token cross-entropy, sentences × label positions; [PAD] labels contribute exactly 0 (grey)."""
    loss, real = F.arr(per_token), np.asarray(real, bool)
    text = [[f"{F.show_token(labels[i][j])}<br>{loss[i, j]:.3g}" for j in range(loss.shape[1])]
            for i in range(loss.shape[0])]
    rows = [t("sentence {i}", i=i) for i in range(loss.shape[0])]
    fig = go.Figure(go.Heatmap(z=np.where(real, loss, np.nan).astype(np.float32), x=list(range(loss.shape[1])),
                               y=rows, text=text, texttemplate="%{text}", colorscale="Reds", zmin=0,
                               xgap=1, ygap=1, colorbar={"title": t("loss")},
                               hovertemplate="%{y}, " + t("position") + " %{x}<br>%{text}<extra></extra>"))
    fig.add_trace(go.Heatmap(z=np.where(real, np.nan, 0.0).astype(np.float32), x=list(range(loss.shape[1])), y=rows,
                             colorscale=[[0, "#d9dce1"], [1, "#d9dce1"]], showscale=False, xgap=1, ygap=1,
                             text=text, texttemplate="%{text}",
                             hovertemplate="%{y}, " + t("position") + " %{x}: [PAD] → 0<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(title=t("label position (what the decoder should predict)"), dtick=1)
    return F._layout(fig, t("per-token loss: grey [PAD] cells contribute 0"), 140 + 52 * loss.shape[0])
