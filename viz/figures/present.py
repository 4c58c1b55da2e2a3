"""A figure readable on a projector (issue 26 §2): big text, a minimum row height, fewer labels when crowded,
and cell texts only where they fit. Pure: a figure in, the same figure out (changed in place).

At 1920×1080 a 30-layer heatmap squeezed into a fixed 440 px had 10 px rows under 18 px labels (they overlapped)
and the logit lens's tokens printed over each other. Here a heatmap gets `min_row` px per row up to
`max_height` (then every k-th label, so labels stay `size` × 1.2 apart), and a cell shows its text only when
the text fits the cell at `size` px (the hover still has every cell's text).
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from viz.figures.attention import scale_fonts

CHAR_EM = 0.62  # a character's width in em, about (Latin; a CJK character is ~1 em: counted twice)
MARGIN_Y = 170  # px above and below a heatmap's cells: title, axis titles, tick labels


def text_width(text: str, size: float) -> float:
    """About how many px `text` takes at font `size` (CJK counted as two Latin characters)."""
    return sum(2 if ord(ch) > 0x2E80 else 1 for ch in str(text)) * CHAR_EM * size


def projector(fig: go.Figure, size: int = 18, min_row: int | None = None, max_height: int = 880,
              min_height: int = 440, width: int | None = None) -> go.Figure:
    """`fig` for a projector, in place: fonts at `size` px, heatmap rows at least `min_row` px (default size + 8)
    within `max_height`, every k-th row label when rows are still too thin, cell texts only where they fit.
    `width`: the px the figure is shown at (a page stretching it to its container), else its own width."""
    scale_fonts(fig, size)
    min_row = min_row or size + 8
    heat = [tr for tr in fig.data if isinstance(tr, go.Heatmap) and tr.z is not None]
    if not heat:
        fig.update_layout(height=min_height)
        return fig
    rows = max(len(tr.z) for tr in heat)
    cols = max(len(tr.z[0]) if len(tr.z) else 0 for tr in heat)
    height = int(min(max_height, max(min_height, rows * min_row + MARGIN_Y)))
    row_px = (height - MARGIN_Y) / max(rows, 1)
    fig.update_layout(height=height)
    step = max(1, math.ceil(size * 1.2 / row_px))  # a label every `step` rows keeps them apart
    if step > 1:
        fig.update_yaxes(tickmode="linear", tick0=0, dtick=step)
    width = width or fig.layout.width or 1200
    col_px = (width - 220) / max(cols, 1)  # less the row labels, the colour bar
    for tr in heat:
        if tr.text is None or not tr.texttemplate:
            continue
        full = [list(r) for r in tr.text]
        fits = row_px >= size * 1.15
        shown = [[s if fits and text_width(s, size) <= col_px - 4 else "" for s in r] for r in full]
        if tr.customdata is None and tr.hovertemplate and "%{text}" in tr.hovertemplate:
            tr.customdata = full  # the hover keeps every token
            tr.hovertemplate = tr.hovertemplate.replace("%{text}", "%{customdata}")
        tr.text = shown
    return fig
