"""A live class's answers on the projector (issue 41): one bar per option, counted by the room store. Pure."""

from __future__ import annotations

import plotly.graph_objects as go

from viz.i18n import t

RIGHT, OTHER, PLAIN = "#2e7d32", "#b0bec5", "#1f77b4"


def results_figure(options: list[str], counts: list[int], right: int | None = None, revealed: bool = False,
                   size: int = 22) -> go.Figure:
    """Horizontal bars, first option on top, each labelled with its count and share; after the reveal the right
    option is green and the others grey. Text at `size` px: read from the back of a room."""
    total = sum(counts)
    labels = [f"{i + 1}. {o}" for i, o in enumerate(options)]
    judged = revealed and right is not None
    colors = [(RIGHT if i == right else OTHER) if judged else PLAIN for i in range(len(options))]
    texts = [f"{c} ({c / total:.0%})" if total else "0" for c in counts]
    fig = go.Figure(go.Bar(x=counts, y=labels, orientation="h", marker_color=colors, text=texts,
                           textposition="outside", cliponaxis=False, hovertemplate="%{y}: %{x}<extra></extra>"))
    fig.update_layout(
        title=t("{n} answers", n=total), font={"size": size}, height=120 + 70 * len(options),
        margin={"l": 20, "r": 80, "t": 70, "b": 30}, showlegend=False,
        xaxis={"rangemode": "tozero", "dtick": max(1, (max(counts, default=1) + 4) // 5), "title": t("answers")},
        yaxis={"autorange": "reversed", "automargin": True})
    return fig
