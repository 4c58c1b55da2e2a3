"""Issue 31 §3, figures: Inside a layer's per-token norm chart at 2,404 tokens keeps its axis labels clear of the
bottom chart's title."""

from __future__ import annotations

import numpy as np

from viz.figures import layer as FL


def test_norm_chart_at_2404_tokens_thins_and_clears_its_labels():
    T, D = 2404, 16
    rng = np.random.default_rng(0)
    steps = [FL.Step(lab, f"decoder.layers.0.{lab}", rng.standard_normal((T, D)).astype(np.float32))
             for lab in ("x", "RMSNorm(x)", "sublayer(RMSNorm(x))", "x + sublayer(RMSNorm(x))")]
    tokens = ["How"] + [f"␣word{i}" for i in range(1, T)]
    fig = FL.residual_figure(steps, tokens, 0)
    ax = fig.layout.xaxis
    assert ax.tickvals is not None and len(ax.tickvals) <= FL.NORM_TICKS + 1
    assert all(len(x) <= FL.NORM_TICK_CHARS for x in ax.ticktext)
    assert "0: How" in ax.tickvals  # the chosen token is labelled
    # the gap between the top chart and the bottom one holds the tilted labels and the bottom chart's title
    plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    gap_px = (fig.layout.yaxis.domain[0] - fig.layout.yaxis2.domain[1]) * plot_px
    label_px = 7 * max(len(x) for x in ax.ticktext) * 0.87
    assert gap_px >= label_px + 40, (gap_px, label_px)
