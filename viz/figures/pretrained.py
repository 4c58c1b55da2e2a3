"""Pure helpers and figure builders for the Pretrained encoder page (no streamlit here).

- WordPiece merging: `word_groups` + `merge_pieces` turn a token × token attention map into a
  word × word map (sum over a word's key pieces, mean over its query pieces: rows still sum to 1).
- Head finder: `attention_from` reads one query's attention in every layer and head of a trace,
  `rank_heads` orders the heads, `head_finder_figure` draws layer × head.
- `similarity_figure`: a cosine-similarity matrix of sentence embeddings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from viz.figures.attention import _layout, arr, heatmap_trace, show_token
from viz.i18n import t

# ---------------------------------------------------------------- WordPiece merging


def word_groups(word_ids: Sequence[int | None]) -> list[list[int]]:
    """Token positions grouped by word: consecutive tokens sharing a word id form one group;
    tokens without a word ([CLS], [SEP]) stay groups of their own."""
    groups: list[list[int]] = []
    prev = object()
    for pos, w in enumerate(word_ids):
        if w is not None and w == prev:
            groups[-1].append(pos)
        else:
            groups.append([pos])
        prev = w
    return groups


def merge_pieces(weights, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """Attention between words instead of pieces: [..., Lq, Lk] -> [..., G, G].

    Attention *to* a word is the sum over its key pieces (the share of the query's attention it
    gets); attention *from* a word is the mean over its query pieces. Each merged row still sums
    to 1 (a mean of distributions over a partition of the keys).
    """
    w = np.asarray(arr(weights), dtype=np.float64)
    n = w.shape[-1]
    to_word = np.zeros((n, len(groups)))  # sum columns of a group
    from_word = np.zeros((len(groups), w.shape[-2]))  # average rows of a group
    for g, positions in enumerate(groups):
        to_word[positions, g] = 1.0
        from_word[g, positions] = 1.0 / len(positions)
    return (from_word @ w @ to_word).astype(np.float32)


def group_labels(tokens: Sequence[str], groups: Sequence[Sequence[int]], text: str | None = None,
                 offsets: Sequence[Sequence[int]] | None = None) -> list[str]:
    """A word's label: its text span when offsets are known (e.g. "tokenization"), else its pieces
    joined without the "##" marks; special tokens keep their own name."""
    out = []
    for positions in groups:
        first, last = positions[0], positions[-1]
        if text is not None and offsets and offsets[last][1] > offsets[first][0]:
            out.append(text[offsets[first][0]:offsets[last][1]])
        else:
            out.append("".join(t[2:] if i and t.startswith("##") else t
                               for i, t in enumerate(tokens[p] for p in positions)))
    return out


# ---------------------------------------------------------------- head finder


def layer_names(trace: Mapping) -> list[str]:
    """The encoder self-attention modules of a trace, in layer order."""
    names, i = [], 0
    while f"encoder.layers.{i}.self_attn.weights" in trace:
        names.append(f"encoder.layers.{i}.self_attn")
        i += 1
    return names


def attention_from(trace: Mapping, query: Sequence[int],
                   groups: Sequence[Sequence[int]] | None = None) -> np.ndarray:
    """[layers, heads, keys]: how the query position(s) attend, in every head of every layer.

    Several query positions (a merged word) are averaged; with `groups`, keys are summed per
    group (`merge_pieces`' rule). Only the query rows are read, so a 512-token trace stays cheap.
    """
    rows = np.stack([arr(trace[f"{n}.weights"][0][:, list(query), :]).mean(axis=1)
                     for n in layer_names(trace)])  # [L, H, Lk]
    if groups is None:
        return rows
    return np.stack([rows[..., g].sum(axis=-1) for g in groups], axis=-1)


def rank_heads(w1: np.ndarray, w2: np.ndarray) -> list[dict]:
    """Every (layer, head), best first by weight(from→to1) (ties: lower layer, then head)."""
    L, H = w1.shape
    order = sorted(((i, h) for i in range(L) for h in range(H)), key=lambda ih: (-w1[ih], ih))
    return [{"rank": r + 1, "layer": i, "head": h, "to1": float(w1[i, h]), "to2": float(w2[i, h]),
             "difference": float(w1[i, h] - w2[i, h])} for r, (i, h) in enumerate(order)]


def head_finder_figure(w1: np.ndarray, w2: np.ndarray, src: str, to1: str, to2: str,
                       metric: str = "weight", selected: tuple[int, int] | None = None) -> go.Figure:
    """Layer × head map of weight(src→to1), or of weight(src→to1) − weight(src→to2).

    An invisible marker per cell carries customdata [layer, head, w1, w2] (click to select, hover
    shows both exact weights), like the model view's thumbnails.
    """
    w1, w2 = arr(w1), arr(w2)
    L, H = w1.shape
    src, to1, to2 = show_token(src), show_token(to1), show_token(to2)
    if metric == "difference":
        z, kind, what = w1 - w2, "diff", t("weight({a}→{b}) − weight({a}→{c})", a=src, b=to1, c=to2)
    elif metric == "weight":
        z, kind, what = w1, "weights", t("weight({a}→{b})", a=src, b=to1)
    else:
        raise ValueError(f"metric must be 'weight' or 'difference', got {metric!r}")
    head_word, layer_word = t("head"), t("layer")
    heat = heatmap_trace(z, kind, list(range(H)), list(range(L)), what,
                         zrange=1.0 if kind == "diff" else None, hover_x=head_word, hover_y=layer_word)
    heat.update(hoverinfo="skip", hovertemplate=None)  # the markers carry the hover
    ll, hh = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
    # Plain lists, not a typed array: the browser returns a clicked point's customdata as sent.
    custom = [[int(i), int(h), float(a), float(b)] for i, h, a, b in zip(
        ll.ravel(), hh.ravel(), w1.ravel(), w2.ravel(), strict=True)]
    marks = go.Scatter(
        x=hh.ravel().tolist(), y=ll.ravel().tolist(), mode="markers", customdata=custom, showlegend=False,
        marker={"size": 26, "opacity": 0.0, "symbol": "square"},
        hovertemplate=(f"{layer_word} %{{customdata[0]}}, {head_word} %{{customdata[1]}}<br>{src}→{to1} = "
                       f"%{{customdata[2]:.4f}}<br>{src}→{to2} = %{{customdata[3]:.4f}}<br>"
                       + t("click to open this head below") + "<extra></extra>"))
    fig = go.Figure([heat, marks])
    if selected is not None:
        layer, h = selected
        fig.add_shape(type="rect", x0=h - 0.5, x1=h + 0.5, y0=layer - 0.5, y1=layer + 0.5,
                      line={"color": "#ff4b4b", "width": 3})
    fig.update_xaxes(title=head_word, tickmode="linear", dtick=1, range=[-0.5, H - 0.5])
    fig.update_yaxes(title=layer_word, tickmode="linear", dtick=1, autorange="reversed")
    return _layout(fig, t("{what} in every head", what=what), 120 + 40 * L)


# ---------------------------------------------------------------- merged heatmap and similarity


def merged_heatmap(m: np.ndarray, labels: Sequence[str], title: str) -> go.Figure:
    """A word × word attention map (`merge_pieces`), its axes labelled as merged."""
    m = arr(m)
    ticks = [f"{i} {show_token(t)}" for i, t in enumerate(labels)]
    fig = go.Figure(heatmap_trace(m, "weights", ticks, ticks, t("merged weight"),
                                  hover_x=t("key word (pieces summed)"), hover_y=t("query word (pieces averaged)")))
    fig.update_yaxes(autorange="reversed", type="category", scaleanchor="x", constrain="domain",
                     title=t("query word (merged: mean over its pieces)"), showticklabels=len(ticks) <= 80)
    fig.update_xaxes(type="category", tickangle=-60, constrain="domain",
                     title=t("key word (merged: sum over its pieces)"), showticklabels=len(ticks) <= 80)
    return _layout(fig, title, int(min(900, max(380, 140 + 16 * len(ticks)))))


def similarity_figure(sim: np.ndarray, labels: Sequence[str]) -> go.Figure:
    """Cosine similarities of sentence embeddings, sentence × sentence, values printed in cells."""
    sim = arr(sim)
    short = [f"{i + 1}. " + (s if len(s) <= 40 else s[:39] + "…") for i, s in enumerate(labels)]
    heat = heatmap_trace(sim, "scores", short, short, "cosine", zrange=1.0, hover_x=t("sentence"),
                         hover_y=t("sentence"))
    heat.update(texttemplate="%{z:.3f}")
    fig = go.Figure(heat)
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(type="category", tickangle=-30)
    return _layout(fig, t("cosine similarity of sentence embeddings"), 200 + 50 * len(labels))
