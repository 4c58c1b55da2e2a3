"""Figures for long inputs (issue 24): pure builders, model.analysis.long's results in, plotly or HTML out.

- `overview_figure(ov, tokens)`: a head's pooled map (keys summed, queries averaged: each row sums to 1),
  axes labelled by the positions and first/last tokens of each block; the block edges ride in the heatmap's
  meta (q_edges, k_edges), so a click on cell (a, b) can find the window it covers;
- `window_figure(cells, q0, k0, tokens)`: the exact weights of a window, token labels once it is small;
- `document_html(tokens, view, before=, after=)`: the prompt as text, each token shaded by the weight the
  chosen position puts on it (the document view), the chosen token outlined and in view on render (a long
  prompt in parts: the text before the position and each top source's context);
- `top_sources(tokens, view)`: the top sources as table rows, each with its context;
- `needle_grid_figure(prob, correct, lengths, depths)`: a needle in a haystack, p(answer) by depth × length.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.figures.attention import WEIGHTS_SCALE, every_tick, num, show_token, token_labels
from viz.i18n import t

TOKEN_LABELS_UP_TO = 64  # a window this small (a side) names its positions' tokens on the axes


def _block_labels(edges: Sequence[int], tokens: Sequence[str] | None) -> list[str]:
    """One label per block: "a–e first…last" (positions a..e and their first and last tokens)."""
    toks = list(tokens or [])
    out = []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        e = b - 1
        label = f"{a}–{e}" if e > a else f"{a}"
        if a < len(toks):
            label += " " + show_token(toks[a]) + (f"…{show_token(toks[e])}" if a < e < len(toks) else "")
        out.append(label)
    return out


def overview_figure(ov, tokens: Sequence[str] | None = None, title: str | None = None,
                    height: int = 620) -> go.Figure:
    """The pooled head map of `model.analysis.long.pooled_overview` (an Overview)."""
    qe, ke = list(ov.q_edges), list(ov.k_edges)
    y, x = _block_labels(qe, tokens), _block_labels(ke, tokens)
    nq, nk = ov.cells.shape
    # z in float32, sent as typed binary (what the page computed, to the last digit the hover shows: .4f). The
    # window a cell covers is not sent per cell (4 integers a cell were 175 of the figure's 278 kB on every head
    # switch, issue 31 §2): cell (a, b) covers queries q_edges[a]..q_edges[a+1]-1 and keys k_edges[b]..k_edges[b+1]-1,
    # the edges in the heatmap's meta, and its hover names them (the block labels).
    fig = go.Figure(go.Heatmap(
        z=np.asarray(ov.cells, dtype=np.float32), x=x, y=y, meta={"q_edges": qe, "k_edges": ke},
        colorscale=WEIGHTS_SCALE, zmin=0,
        zmax=max(float(np.nanmax(ov.cells)), 1e-9) if ov.cells.size else 1.0,
        colorbar={"title": {"text": t("share of the row"), "side": "right"}, "thickness": 12},
        hovertemplate=(t("queries %{y}") + "<br>" + t("keys %{x}") + "<br>"
                       + t("mean summed weight: %{z:.4f}") + "<extra></extra>")))
    fig.update_layout(
        title=title or t("Layer {layer}, head {head}: the whole input, pooled ({n} × {n} blocks)",
                         layer=ov.layer, head=ov.head, n=nq),
        height=height, margin={"l": 10, "r": 10, "t": 60, "b": 10},
        xaxis={"title": t("key (attended to)"), "showticklabels": nk <= 64, "type": "category"},
        yaxis={"title": t("query (attending)"), "autorange": "reversed", "showticklabels": nq <= 64,
               "type": "category"})
    return fig


def window_figure(cells: np.ndarray, q0: int, k0: int, tokens: Sequence[str] | None = None,
                  title: str | None = None, height: int = 560) -> go.Figure:
    """The exact weights of queries q0.. and keys k0.. (cells [nq, nk]); token labels when small."""
    nq, nk = cells.shape
    labels = token_labels(tokens, max(q0 + nq, k0 + nk))
    small = max(nq, nk) <= TOKEN_LABELS_UP_TO
    y = labels[q0:q0 + nq] if small else [str(i) for i in range(q0, q0 + nq)]
    x = labels[k0:k0 + nk] if small else [str(i) for i in range(k0, k0 + nk)]
    fig = go.Figure(go.Heatmap(
        z=cells, x=x, y=y, colorscale=WEIGHTS_SCALE, zmin=0, zmax=1,
        colorbar={"title": {"text": t("weight"), "side": "right"}, "thickness": 12},
        hovertemplate=t("query %{y}") + "<br>" + t("key %{x}") + "<br>" + t("weight: %{z:.4f}") + "<extra></extra>"))
    fig.update_layout(
        title=title or t("Exact weights: queries {q0}–{q1}, keys {k0}–{k1}", q0=q0, q1=q0 + nq - 1, k0=k0,
                         k1=k0 + nk - 1),
        height=height, margin={"l": 10, "r": 10, "t": 60, "b": 10},
        xaxis={"title": t("key (attended to)"), "type": "category", **every_tick(x)},
        yaxis={"title": t("query (attending)"), "autorange": "reversed", "type": "category", **every_tick(y)})
    return fig


SHADE_CSS = ".attention-document span{border-radius:2px;background:rgba(255,127,14,var(--a,0))}"


def _shade(w: float, top: float) -> str:
    """The opacity of weight w's background (0 .. top: transparent to a strong orange, SHADE_CSS), by the square
    root so a small share stays visible beside a sink that takes most of the row: "--a:.123", the one style a
    token's span carries (the document view repeats it for every token: 1,000 tokens a redraw, issue 31 §2)."""
    a = 0.0 if top <= 0 else min(1.0, (max(w, 0.0) / top) ** 0.5)
    return f"--a:{a:.3f}".replace(":0.", ":.")


def _segments(n: int, position: int, sources: Sequence[int], before: int | None, after: int | None,
              context: int) -> list[tuple[int, int]]:
    """The spans [a, b) of the text shown: up to `before` tokens before the position (None: from the start)
    and `after` after it (None: to the end), and `context` tokens either side of each source, merged."""
    a = 0 if before is None else max(0, position - before)
    b = n if after is None else min(n, position + after + 1)
    spans = sorted([(a, b)] + [(max(0, s - context), min(n, s + context + 1)) for s in sources if s < n])
    out: list[list[int]] = []
    for s0, s1 in spans:
        if out and s0 <= out[-1][1]:
            out[-1][1] = max(out[-1][1], s1)
        else:
            out.append([s0, s1])
    return [(s0, s1) for s0, s1 in out]


def _piece_html(tok: str) -> str:
    """A readable piece as document text: ␣ a real space (the text reads as text), ↵ a line break."""
    return html.escape(tok.replace("␣", " ")).replace("\n", "⏎<br>").replace("↵", "↵<br>")


def document_html(tokens: Sequence[str], view, max_chars: int | None = None, before: int | None = None,
                  after: int | None = None, context: int = 8) -> str:
    """The prompt as text with each token's background shaded by view.weights (the document view of
    model.analysis.long); the chosen position is outlined; hovering a token shows its weight. `tokens`
    are the readable pieces. Tokens after the chosen position (which it cannot see) are drawn grey.

    A long prompt is shown in parts (before/after/context, see _segments): the `before` tokens up to the
    position, `after` tokens past it and `context` tokens around each top source; a line "⋯ n tokens ⋯"
    stands for each skipped stretch. The box opens scrolled to its END (flex column-reverse, no script:
    st.html runs none), and the position is within `after` tokens of the end, so it is in view on render."""
    w = np.asarray(view.weights, dtype=float)
    top = float(w.max()) if w.size else 1.0
    n = len(tokens)
    segments = _segments(n, view.position, [i for i, _ in view.top], before, after, context)
    gap = ('<div class="attention-gap" style="color:#888;font-style:italic;text-align:center;margin:0.3rem 0">'
           '{}</div>')
    tip_of = t("position {i}: weight {w}")  # translated once, filled per token (1,000 tokens a redraw)
    parts, last = [], 0
    for s0, s1 in segments:
        if s0 > last:
            parts.append(gap.format(html.escape(t("⋯ {n} tokens not shown ⋯", n=f"{s0 - last:,}"))))
        parts.append("<div>")
        for i in range(s0, s1):
            text = _piece_html(tokens[i])
            if i < w.size:
                style = _shade(float(w[i]), top)
                if i == view.position:
                    style += ";outline:2px solid #1f77b4"
                tip = html.escape(tip_of.format(i=i, w=num(w[i])), quote=True)
                anchor = ' id="attention-position"' if i == view.position else ""
                parts.append(f'<span{anchor} title="{tip}" style="{style}">{text}</span>')
            else:
                parts.append(f'<span style="color:#999">{text}</span>')
        parts.append("</div>")
        last = s1
    if last < n:
        parts.append(gap.format(html.escape(t("⋯ {n} more tokens after position {pos} (it cannot see them) ⋯",
                                              n=f"{n - last:,}", pos=view.position))))
    body = "".join(parts)
    # column-reverse: a scroll box starts at its end, where the chosen position is; the one child keeps the order
    return (f'<style>{SHADE_CSS}</style>'
            '<div class="attention-document" style="display:flex;flex-direction:column-reverse;max-height:28rem;'
            'overflow-y:auto;padding:0.5rem;border:1px solid #ddd;border-radius:4px">'
            '<div style="white-space:pre-wrap;overflow-wrap:anywhere;line-height:1.7;font-size:0.95rem">'
            f'{body}</div></div>')


def _plain(tok: str) -> str:
    return tok.replace("␣", " ").replace("↵", "⏎").replace("\n", "⏎")


def source_context(tokens: Sequence[str], i: int, width: int = 6) -> str:
    """A few tokens either side of position i as plain text, the token itself in brackets: "…is ⟦ 71432⟧. Rem…"."""
    toks = list(tokens)
    a, b = max(0, i - width), min(len(toks), i + width + 1)
    left, right = "".join(_plain(x) for x in toks[a:i]), "".join(_plain(x) for x in toks[i + 1:b])
    mid = _plain(toks[i]) if i < len(toks) else ""
    return ("…" if a > 0 else "") + left + "⟦" + mid + "⟧" + right + ("…" if b < len(toks) else "")


def top_sources(tokens: Sequence[str], view, width: int = 6) -> list[dict]:
    """The top sources of a document view as table rows: position, token, weight, and the source in its
    context (`width` tokens either side), so a reader sees what each source is."""
    toks = list(tokens)
    return [{t("position"): i, t("token"): show_token(toks[i]) if i < len(toks) else str(i), t("weight"): num(w),
             t("context"): source_context(toks, i, width)}
            for i, w in view.top]


def needle_grid_figure(prob: np.ndarray, correct: np.ndarray, lengths: Sequence[int], depths: Sequence[float],
                       title: str | None = None) -> go.Figure:
    """A needle in a haystack (model.analysis.long.needle_grid): p(answer) by the needle's depth (rows) ×
    the prompt's length (columns), each cell marked ✓ when the greedy continuation is the whole answer."""
    p = np.asarray(prob, dtype=float)  # (n_depths, n_lengths)
    ok = np.asarray(correct, dtype=bool)
    x = [f"{n:,}" for n in lengths]
    y = [f"{d:.0%}" for d in depths]
    text = [[f"{num(p[i, j])} {'✓' if ok[i, j] else '✗'}" for j in range(p.shape[1])] for i in range(p.shape[0])]
    fig = go.Figure(go.Heatmap(
        z=p, x=x, y=y, zmin=0, zmax=1, colorscale=WEIGHTS_SCALE, text=text, texttemplate="%{text}",
        colorbar={"title": {"text": t("p(answer)"), "side": "right"}, "thickness": 12},
        hovertemplate=t("length %{x} tokens") + "<br>" + t("needle at depth %{y}") + "<br>"
        + t("p(answer): %{z:.3f}") + "<extra></extra>"))
    fig.update_layout(
        title=title or t("p(answer) by the needle's depth × the prompt's length · ✓ answered right"),
        height=120 + 70 * len(depths), margin={"l": 10, "r": 10, "t": 60, "b": 10},
        xaxis={"title": t("prompt length (tokens)"), "type": "category"},
        yaxis={"title": t("needle depth"), "autorange": "reversed", "type": "category"})
    return fig
