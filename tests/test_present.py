"""Presentation mode on a 1080p projector (issue 26 §2), the figure side (fast, no app): viz.figures.present
gives a 30-layer heatmap at least 26 px a row (was 440 px for the whole figure: ~9 px rows under 18 px labels),
thins the row labels only when rows are still too thin, and shows a logit-lens cell's token only where it fits."""

from __future__ import annotations

import numpy as np

from viz.figures import llm as FL
from viz.figures import phenomena as FPH
from viz.figures import present as FPR


def test_a_30_layer_head_map_gets_readable_rows():
    fig = FPR.projector(FPH.head_map(np.random.default_rng(0).random((30, 9)), "share"), 18)
    rows_px = (fig.layout.height - FPR.MARGIN_Y) / 30
    assert rows_px >= 18 * 1.2 and fig.layout.height <= 880  # a label per row, each 18 px, none overlapping
    assert fig.layout.yaxis.dtick in (1, None) and fig.layout.yaxis.tickfont.size == 18
    small = FPR.projector(FPH.head_map(np.ones((60, 9)), "share"), 18)  # too many rows for 880 px: thin labels
    row = (small.layout.height - FPR.MARGIN_Y) / 60
    assert small.layout.height == 880 and small.layout.yaxis.dtick * row >= 18 * 1.2


def test_the_lens_shows_a_token_only_where_it_fits():
    tops = [["␣Paris", "␣the", "␣a-very-long-token-indeed"]] * 30
    fig = FL.logit_lens_figure(tops, np.full((30, 3), 0.5), [0, 1, 2], ["The", "capital", "is"])
    FPR.projector(fig, 18)
    text = fig.data[0].text
    width = (fig.layout.width - 220) / 3
    assert all(s == "" or FPR.text_width(s, 18) <= width for r in text for s in r)
    assert text[0][0] == "␣Paris" and text[0][2] == ""  # the long token is left to the hover
    assert fig.data[0].customdata[0][2] == "␣a-very-long-token-indeed" and "%{customdata}" in fig.data[0].hovertemplate


def test_the_llm_head_heatmap_gets_a_minimum_cell():
    """/llm's head heatmap on the default 14-token prompt: rows of at least 22 px (was ~8 px, 110 px of plot)."""
    import plotly.graph_objects as go

    labels = [f"{i}: ␣tok{i} → ␣next{i}" for i in range(14)]
    fig = go.Figure(go.Heatmap(z=np.ones((14, 14)), x=[f"{i}: ␣tok{i}" for i in range(14)], y=labels))
    fig.update_layout(height=380, width=600)
    FL.with_min_cells(fig)
    below = 6 * max(len(f"{i}: ␣tok{i}") for i in range(14)) + 40
    assert (fig.layout.height - 70 - below) / 14 >= FL.MIN_CELL
    long = go.Figure(go.Heatmap(z=np.ones((300, 300))))  # a long prompt: capped, not 6600 px tall
    long.update_layout(height=900)
    assert FL.with_min_cells(long).layout.height <= FL.MAX_HEATMAP_HEIGHT
