"""Figures of the "Why this token?" page (viz/pages/flow.py), lesson 16 and the notebook's flow_view: pure
builders, what model/analysis/flow.py returns in, plotly out.

- `routes_figure(routes, edges, tokens)`: the information-flow graph, tokens (x) × residual updates (y, the
  output at the top), edge width = contribution; every edge has a clickable dot at its middle (customdata
  ["edge", i]) and every node is a dot (customdata ["node", stack, row, position]);
- `methods_figure(comparison)`: each method's source-token importance beside the causal effect, each with
  its Spearman rho in its title;
- `agreement_figure(summaries)`: mean rho ± std of each method over prompt sets;
- `lead_sentence(lead, mean_s)`: what the agreement table supports, in words (no figure: shared by the page
  and its tests);
- `alignment_figure(alignment, tokens)`: the translator's cross-attention rows vs the routes through the encoder;
- `sink_head_figure(weights, norms, tokens)`: lesson 16, one head's weights beside its norm-based shares.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from viz.figures.attention import num
from viz.i18n import t

KIND_COLORS = {"head": "#1f77b4", "resid": "#b0b0b0", "ffn": "#ff7f0e"}
METHOD_COLORS = {"raw": "#9467bd", "norm": "#2ca02c", "rollout": "#8c564b", "routes": "#1f77b4",
                 "flow": "#e377c2", "effect": "#d62728"}
WIDTH_BINS = (0.02, 0.05, 0.1, 0.2, 0.4, 1.01)  # contribution bins -> line widths 1..6
GAP = 1.5  # columns between the encoder's and the decoder's tokens


def rho_text(r: float) -> str:
    """A Spearman rho as every place prints it (figure, table, sentence): formatted once, the same string."""
    return num(r, 2)


def method_names() -> dict[str, str]:
    return {"raw": t("raw weights (last layer)"), "norm": t("norm-based (last layer)"),
            "rollout": t("attention rollout"), "routes": t("information-flow routes"),
            "flow": t("attention flow"), "effect": t("causal effect")}


def _x(routes, stack: str, pos: int) -> float:
    """Column of a token: the encoder's tokens first, then (after a gap) the decoder's."""
    if stack == "decoder" and "encoder" in routes.steps:
        return len(routes.tokens["src_tokens"]) + GAP + pos
    return float(pos)


def _y(routes, stack: str, row: int) -> float:
    """Height of a node row: the decoder's rows above the encoder's top (its cross edges come from there)."""
    if stack == "decoder" and "encoder" in routes.steps:
        return routes.n_rows("encoder") - 1 + row * 1.0
    return float(row)


def row_label(routes, stack: str, row: int) -> str:
    """A node row's name: "embedding", or the layer and the update before it ("L3 attention")."""
    if row == 0:
        lab = t("embedding")
    else:
        sub = routes.steps[stack][row - 1].sub
        kinds = {"attn": t("attention"), "cross": t("cross-attention"), "ffn": t("FFN"),
                 "parallel": t("attention + FFN")}  # a parallel block (GPT-NeoX): one update with both
        lab = t("L{l} {k}", l=sub.layer, k=kinds[sub.kind])
    if "encoder" in routes.steps and "decoder" in routes.steps:
        return f"{ {'encoder': t('encoder'), 'decoder': t('decoder')}[stack]} {lab}"
    return lab


ROUTES_MARGIN = {"l": 110, "r": 20, "t": 96, "b": 90}
DOT_GAP_PX = 6  # the least distance between two edges' dots (at the figure's usual size): each can be hovered
DOT_STEPS = (0.5, 0.4, 0.6, 0.3, 0.7, 0.45, 0.55, 0.35, 0.65, 0.25, 0.75, 0.2, 0.8, 0.15, 0.85)  # along the line


def dot_positions(routes, edges: Sequence[dict], width_px: float = 1000.0, row_px: float = 14.0):
    """(xs, ys): where each edge's dot sits. At the middle of its line unless that spot is taken (several heads
    of one layer joining the same two tokens share one line; two crossing lines share a middle): then the
    nearest free spot along its own line, strongest edges first, so every edge has a dot of its own to hover
    and click. Distances are judged in approximate pixels (width_px over the token columns, row_px a row)."""
    cols = max(1.0, max((_x(routes, s_, len(routes.tokens[routes.desc["stacks"][s_]["tokens"]]) - 1)
                         for s_ in routes.steps), default=0.0) + 1)
    sx, sy = width_px / cols, row_px
    taken: dict[tuple[int, int], list[tuple[float, float]]] = {}

    def clearance(px: float, py: float) -> float:
        cx, cy = int(px // DOT_GAP_PX), int(py // DOT_GAP_PX)
        near = [q for a in (-1, 0, 1) for b in (-1, 0, 1) for q in taken.get((cx + a, cy + b), ())]
        return min((math.hypot(px - qx, py - qy) for qx, qy in near), default=math.inf)

    xs, ys = [0.0] * len(edges), [0.0] * len(edges)
    for i in sorted(range(len(edges)), key=lambda k: -edges[k]["weight"]):
        (s0, r0, p0), (s1, r1, p1) = edges[i]["src"], edges[i]["dst"]
        x0, x1, y0, y1 = _x(routes, s0, p0), _x(routes, s1, p1), _y(routes, s0, r0), _y(routes, s1, r1)
        best, best_c = 0.5, -1.0
        for f in DOT_STEPS:
            c = clearance((x0 + f * (x1 - x0)) * sx, (y0 + f * (y1 - y0)) * sy)
            if c >= DOT_GAP_PX:
                best = f
                break
            if c > best_c:
                best, best_c = f, c
        xs[i], ys[i] = x0 + best * (x1 - x0), y0 + best * (y1 - y0)
        px, py = xs[i] * sx, ys[i] * sy
        taken.setdefault((int(px // DOT_GAP_PX), int(py // DOT_GAP_PX)), []).append((px, py))
    return xs, ys


def routes_figure(routes, edges: Sequence[dict], tokens: Mapping[str, Sequence[str]], title: str | None = None,
                  height: int | None = None) -> go.Figure:
    """The pruned routes graph. tokens: display strings per side ("src_tokens", "tgt_tokens")."""
    fig = go.Figure()
    names = {"head": t("attention head"), "resid": t("residual"), "ffn": t("FFN")}
    side = {s: routes.desc["stacks"][s]["tokens"] for s in routes.steps}
    # lines, one trace per (kind, width bin): a plotly line has one width
    for kind in ("resid", "ffn", "head"):
        lo, named = 0.0, False  # the legend names each kind once, on its first drawn trace, whatever its width bin
        for b, hi in enumerate(WIDTH_BINS):
            xs, ys = [], []
            for e in edges:
                if e["kind"] == kind and lo < e["weight"] <= hi:
                    (s0, r0, p0), (s1, r1, p1) = e["src"], e["dst"]
                    xs += [_x(routes, s0, p0), _x(routes, s1, p1), None]
                    ys += [_y(routes, s0, r0), _y(routes, s1, r1), None]
            lo = hi
            if xs:  # (issue 38 §5: named only in bin 2, SmolLM2's 270 residual edges, all wider, had no entry)
                fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=not named,
                                         legendgroup=kind, name=names[kind],
                                         line={"color": KIND_COLORS[kind], "width": 1 + b}, opacity=0.75))
                named = True
    # a dot on every edge (dot_positions: each its own spot): hover says what it is, a click opens it
    rows = sorted({(s, r) for s in routes.steps for r in range(routes.n_rows(s))}, key=lambda sr: _y(routes, *sr))
    height = height or max(420, 14 * len(rows) + 160)
    span = max(1.0, max(_y(routes, *sr) for sr in rows) - min(_y(routes, *sr) for sr in rows))
    mx, my = dot_positions(routes, edges, row_px=(height - ROUTES_MARGIN["t"] - ROUTES_MARGIN["b"]) / span)
    text, custom, colors = [], [], []
    for i, e in enumerate(edges):
        (s0, r0, p0), (s1, r1, p1) = e["src"], e["dst"]
        src_tok, dst_tok = tokens[side[s0]][p0], tokens[side[s1]][p1]
        if e["kind"] == "head":
            what = t("layer {l} · head {h}", l=e["layer"], h=e["head"])
        else:
            what = t("layer {l} · {k}", l=e["layer"], k=names[e["kind"]])
        text.append(t("{what}: “{a}” → “{b}”, contribution {c}", what=what, a=src_tok, b=dst_tok, c=num(e["weight"])))
        custom.append(["edge", i])
        colors.append(KIND_COLORS[e["kind"]])
    if mx:
        fig.add_trace(go.Scatter(x=mx, y=my, mode="markers", marker={"size": 7, "color": colors, "opacity": 0.6},
                                 text=text, customdata=custom, hovertemplate="%{text}<extra></extra>",
                                 name=t("edges (click to open)"), showlegend=False))
    # nodes
    nodes = {e["src"] for e in edges} | {e["dst"] for e in edges}
    if not nodes:
        nodes = {(routes.out_stack, routes.n_rows(routes.out_stack) - 1, routes.position)}
    nodes = sorted(nodes)
    top = (routes.out_stack, routes.n_rows(routes.out_stack) - 1, routes.position)
    fig.add_trace(go.Scatter(
        x=[_x(routes, s, p) for s, r, p in nodes], y=[_y(routes, s, r) for s, r, p in nodes], mode="markers",
        marker={"size": [13 if n == top else 9 for n in nodes], "color": ["#d62728" if n == top else "#333333"
                                                                        for n in nodes], "symbol": "square"},
        text=[t("{row} · “{tok}” (position {p})", row=row_label(routes, s, r), tok=tokens[side[s]][p], p=p)
              for s, r, p in nodes],
        customdata=[["node", s, r, p] for s, r, p in nodes], hovertemplate="%{text}<extra></extra>",
        name=t("nodes (click: what the block wrote)"), showlegend=False))
    # axes: token labels below, row labels left
    ticks_x, labels_x = [], []
    for s in routes.steps:
        for p, tok in enumerate(tokens[side[s]]):
            ticks_x.append(_x(routes, s, p))
            labels_x.append(tok)
    every = max(1, len(rows) // 40)
    fig.update_layout(
        # the title at the top of the figure, the legend under it (above the plot): never on each other
        title={"text": title or t("Information-flow routes"), "y": 1, "yref": "container", "yanchor": "top",
               "pad": {"t": 12}},
        height=height, margin=ROUTES_MARGIN,
        xaxis={"tickmode": "array", "tickvals": ticks_x, "ticktext": labels_x, "tickangle": -60, "showgrid": False,
               "zeroline": False},
        yaxis={"tickmode": "array", "tickvals": [_y(routes, s, r) for s, r in rows[::every]],
               "ticktext": [row_label(routes, s, r) for s, r in rows[::every]], "showgrid": False, "zeroline": False},
        legend={"orientation": "h", "y": 1.02, "x": 0, "yanchor": "bottom"},
        clickmode="event+select", plot_bgcolor="white")
    return fig


def methods_figure(comparison, methods: Sequence[str] | None = None, title: str | None = None,
                   tokens: Sequence[str] | None = None) -> go.Figure:
    """One bar panel per method (importance over the source tokens) and one for the causal effect; each
    method's panel title carries its Spearman rho with the effect (rho_text: the string the page prints).
    tokens: the source tokens as the page shows them (the app's readable pieces); default the raw ones."""
    names = method_names()
    methods = [m for m in (methods or comparison.methods) if m in comparison.methods]
    titles = [t("{m}<br>ρ = {r}", m=names[m], r=rho_text(comparison.rho[m])) for m in methods] + [names["effect"]]
    fig = make_subplots(rows=1, cols=len(methods) + 1, shared_yaxes=True, subplot_titles=titles,
                        horizontal_spacing=0.02)
    toks = [f"{i}: {tok}" for i, tok in enumerate(tokens if tokens is not None else comparison.tokens)]
    for c, m in enumerate([*methods, "effect"], start=1):
        v = comparison.effect if m == "effect" else comparison.methods[m]
        v = np.asarray(v, dtype=np.float64)
        share = v / v.sum() if v.sum() > 0 else v
        fig.add_trace(go.Bar(x=share, y=toks, orientation="h", marker_color=METHOD_COLORS[m], name=names[m],
                             showlegend=False, hovertemplate="%{y}: %{x:.3f}<extra>" + names[m] + "</extra>"),
                      row=1, col=c)
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(showticklabels=False)
    fig.update_annotations(font={"size": 15})  # each method's name and rho, two lines: readable at 1080p
    n = len(methods)
    fig.update_layout(title={"text": title or t("Which tokens did it come from? {n} answers and the causal one", n=n)},
                      height=max(300, 22 * len(toks) + 160), margin={"l": 120, "r": 10, "t": 110, "b": 20},
                      bargap=0.15)
    return fig


LABEL_GAP = 0.04  # rho units between a whisker's cap and its bar's label (the axis spans about 2.3)


def label_end(mean: float, std: float) -> float:
    """Where a bar's value label sits: past the end of its error bar (mean ± std, on the bar's side of 0), so the
    label never lies on the bar's whisker (issue 38 §5)."""
    mean, std = float(mean), float(std) if math.isfinite(float(std)) else 0.0
    return mean - std - LABEL_GAP if mean < 0 else mean + std + LABEL_GAP


def agreement_figure(summaries: Mapping[str, Mapping[str, Mapping[str, float]]], title: str | None = None) -> go.Figure:
    """Mean Spearman rho (± std over prompts) of each method, one bar group per prompt set. Each bar's rho is
    written past the end of its error bar (a text trace in the same offset group), not on the whisker."""
    names = method_names()
    fig = go.Figure()
    for g, (label, summ) in enumerate(summaries.items()):
        ms = list(summ)
        x = [names[m] for m in ms]
        fig.add_trace(go.Bar(x=x, y=[summ[m]["mean"] for m in ms], name=label, offsetgroup=str(g),
                             error_y={"type": "data", "array": [summ[m]["std"] for m in ms]},
                             customdata=[[rho_text(summ[m]["mean"]), num(summ[m]["std"], 2)] for m in ms],
                             hovertemplate="%{x}: ρ = %{customdata[0]} ± %{customdata[1]}<extra>" + label
                             + "</extra>"))
        ends = [label_end(summ[m]["mean"], summ[m]["std"]) for m in ms]
        fig.add_trace(go.Scatter(x=x, y=ends, mode="text", text=[rho_text(summ[m]["mean"]) for m in ms],
                                 textposition=["bottom center" if summ[m]["mean"] < 0 else "top center" for m in ms],
                                 offsetgroup=str(g), showlegend=False, hoverinfo="skip", cliponaxis=False,
                                 legendgroup=label))
    lows = [label_end(v["mean"], v["std"]) for s in summaries.values() for v in s.values()]
    lo = min(-1.0, min(lows, default=-1.0) - 0.15)  # room for a label below the lowest whisker
    hi = max(1.0, max(lows, default=1.0) + 0.15)
    fig.update_layout(title={"text": title or t("Agreement with the causal effect (Spearman ρ, mean ± std)")},
                      yaxis={"title": {"text": "ρ"}, "range": [lo, hi]}, barmode="group", scattermode="group",
                      height=380, margin={"l": 60, "r": 20, "t": 60, "b": 60})
    return fig


def alignment_figure(alignment: Mapping[str, np.ndarray], tokens: Sequence[str], target: str,
                     title: str | None = None) -> go.Figure:
    """The translator: each decoder layer's cross-attention row (head mean) for one target word, beside the
    routes' share of each source token through the encoder (normalised over the source)."""
    fig = go.Figure()
    x = [f"{i}: {tok}" for i, tok in enumerate(tokens)]
    for label, v in alignment.items():
        v = np.asarray(v, dtype=np.float64)
        v = v / v.sum() if v.sum() > 0 else v
        name = t("routes through the encoder") if label == "routes" else t("cross-attention, {layer}",
                                                                           layer=t("layer {l}", l=label.split()[-1]))
        fig.add_trace(go.Bar(x=x, y=v, name=name, marker_color=METHOD_COLORS["routes"] if label == "routes" else None))
    fig.update_layout(title={"text": title or t("Where “{w}” came from in the source", w=target)}, barmode="group",
                      yaxis={"title": {"text": t("share")}}, height=360, margin={"l": 60, "r": 20, "t": 60, "b": 80})
    return fig


def sink_head_figure(weights: Sequence[float], norms: Sequence[float], tokens: Sequence[str],
                     title: str | None = None) -> go.Figure:
    """Lesson 16: one head's attention row and its norm-based shares ||alpha v W^O|| (normalised), per key."""
    w = np.asarray(weights, dtype=np.float64)
    n = np.asarray(norms, dtype=np.float64)
    n = n / n.sum() if n.sum() > 0 else n
    x = [f"{i}: {tok}" for i, tok in enumerate(tokens)]
    fig = go.Figure([go.Bar(x=x, y=w, name=t("attention weight"), marker_color=METHOD_COLORS["raw"]),
                     go.Bar(x=x, y=n, name=t("norm-based share"), marker_color=METHOD_COLORS["norm"])])
    fig.update_layout(title={"text": title or t("What the weights say vs what the head moves")}, barmode="group",
                      yaxis={"title": {"text": t("share")}, "range": [0, 1]}, height=360,
                      margin={"l": 60, "r": 20, "t": 60, "b": 90})
    return fig


def lead_sentence(lead, mean_s: Mapping[str, str]) -> str:
    """What an agreement table supports (lead: model.analysis.claims.Lead; mean_s: each method's mean rho as the
    table prints it): a lead only when the claims test passes on the set, else that no method clearly leads."""
    names = method_names()
    w = lead.weakest
    if lead.top is None or w is None:
        return t("No method has a ρ on this set (the causal effect was the same for every token of every prompt).")
    k = len(lead.rivals)
    if lead.clear:
        return t("Over this set, **{m}** leads (mean ρ = {r}): it is ahead of each of the other {k} methods on most "
                 "prompts, at the weakest {w} of {n} against {m2} (two-sided sign test p = {p}, under {thr}).",
                 m=names[lead.top], r=mean_s[lead.top], k=k, w=w.wins, n=w.wins + w.losses, m2=names[w.method],
                 p=num(w.p, 2), thr=num(lead.threshold, 2))
    return t("Over this set, no method clearly leads. **{m}** has the highest mean ρ ({r}), but against {m2} ({r2}) "
             "it is ahead on {w} of {n} prompts (two-sided sign test p = {p}; a lead needs p under {thr} against "
             "each of the other {k} methods). The paired difference's 95% interval is {lo} to {hi}.",
             m=names[lead.top], r=mean_s[lead.top], m2=names[w.method], r2=mean_s[w.method], w=w.wins,
             n=w.wins + w.losses, p=num(w.p, 2), thr=num(lead.threshold, 2), k=k, **interval_text(w.low, w.high))


def interval_text(low: float, high: float, digits: int = 2) -> dict[str, str]:
    """{"lo", "hi"}: an interval's two ends written alike: the same decimals (enough for `digits` significant
    digits of the smaller end) and a true minus sign, "−0.020 to 0.047", not "-0.02 to 0.047" (issue 38 §5)."""
    ends = [float(low), float(high)]
    if not all(math.isfinite(v) for v in ends):
        return {"lo": num(low, digits), "hi": num(high, digits)}
    small = min((abs(v) for v in ends if v != 0), default=1.0)
    decimals = min(max(0, digits - 1 - math.floor(math.log10(small))), digits + 1)  # rho differences: 0.001 at most
    lo, hi = (f"{v:.{decimals}f}".lstrip("-" if float(f"{v:.{decimals}f}") == 0 else "").replace("-", "−")
              for v in ends)  # a value that rounds to zero is written without a sign
    return {"lo": lo, "hi": hi}
