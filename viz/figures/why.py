"""Figures of "Why here?" (issue 39 §3): pure builders, a model.analysis.why explanation in, plotly out.

- `binned(expl, n)`: the top sources of each side (by |side total|), the rest summed into one "other" row and
  column, so the binned matrix still sums to the explanation's Σ terms (= its recorded `total`);
- `pairs_heatmap(expl)`: that matrix, query source × key source, signed, diverging colours centred at 0;
- `top_pairs_figure(expl)`: the largest (query source, key source) terms, signed bars;
- `check_figure(check)`: the causal check, attributed vs actual change of the score per source, disagreements
  marked;
- `circuit_groups_figure(...)`: /phenomena's circuits (model.analysis.why_circuits): each head's summed lead by group;
- `runner_up(weights, key)`: the key the head would otherwise pick (the row's highest weight other than `key`);
- `why_sentence(expl, ...)`: one sentence computed from the explanation's numbers, with the test it states.
No streamlit here; every drawn number is a term of the explanation (or of the check).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from viz.figures.attention import SCORES_SCALE, num, show_token
from viz.i18n import N_, t

OTHER = N_("other")
LEAD_RATIO = 2.0  # a source "clearly leads" when its share is at least this many times the next one's


def binned(expl, n: int = 8, lang: str | None = None) -> tuple[list[str], list[str], np.ndarray]:
    """(query labels, key labels, matrix): the `n` query and `n` key sources with the largest |side total|, in
    the explanation's order, and the rest summed into an "other" row / column (only when there is a rest). The
    matrix's sum is Σ terms exactly (float64 sums of the same numbers)."""
    m = np.asarray(expl.matrix, dtype=np.float64)

    def keep(totals: np.ndarray) -> np.ndarray:
        order = np.argsort(-np.abs(totals), kind="stable")[:n]
        return np.sort(order)

    qi, ki = keep(m.sum(1)), keep(m.sum(0))
    q_rest = np.setdiff1d(np.arange(m.shape[0]), qi)
    k_rest = np.setdiff1d(np.arange(m.shape[1]), ki)
    rows = [m[qi]] + ([m[q_rest].sum(0, keepdims=True)] if len(q_rest) else [])
    r = np.concatenate(rows, 0)
    cols = [r[:, ki]] + ([r[:, k_rest].sum(1, keepdims=True)] if len(k_rest) else [])
    out = np.concatenate(cols, 1)
    other = t(OTHER, lang=lang)
    qlab = [source_label(expl.query_sources[a], lang) for a in qi] + ([f"{other} ({len(q_rest)})"] if len(q_rest)
                                                                      else [])
    klab = [source_label(expl.key_sources[b], lang) for b in ki] + ([f"{other} ({len(k_rest)})"] if len(k_rest)
                                                                    else [])
    return qlab, klab, out


def _cell(tokens: Sequence[str] | None, p: int) -> str:
    return f"{p} “{show_token(tokens[p])}”" if tokens is not None and 0 <= p < len(tokens) else str(p)


def pairs_heatmap(expl, tokens: Sequence[str] | None = None, n: int = 8, title: str | None = None,
                  lang: str | None = None, key_tokens: Sequence[str] | None = None) -> go.Figure:
    """Query source (rows) × key source (columns): each cell the term scale·q_s·k_t (× the frozen soft-cap),
    the top `n` sources of each side and the rest binned as "other"; Σ cells = the explanation's total.
    `tokens` label the query positions, `key_tokens` the key positions (cross-attention: the source's; None: the
    same tokens)."""
    kt = tokens if key_tokens is None else key_tokens
    qlab, klab, z = binned(expl, n, lang)
    r = float(np.abs(z).max()) if z.size and np.abs(z).max() > 0 else 1.0
    text = [[num(v) for v in row] for row in z]
    what = (t("score difference", lang=lang) if expl.against is not None else t("score", lang=lang))
    fig = go.Figure(go.Heatmap(
        z=z, x=klab, y=qlab, text=text, texttemplate="%{text}", colorscale=SCORES_SCALE, zmid=0, zmin=-r, zmax=r,
        colorbar={"title": {"text": t("term", lang=lang), "side": "right"}, "thickness": 12},
        hovertemplate=t("query source %{y} × key source %{x}: %{text}", lang=lang) + "<extra></extra>"))
    if title is None:
        title = t("Query {q} → key {k}: the {what} {v} split by source (Σ cells = {s})", lang=lang,
                  q=_cell(tokens, expl.query), k=_cell(kt, expl.key), what=what, v=num(expl.total),
                  s=num(float(z.sum())))
        if expl.against is not None:
            title = t("Query {q}: key {k} over key {a}, the {what} {v} split by source (Σ cells = {s})", lang=lang,
                      q=_cell(tokens, expl.query), k=_cell(kt, expl.key), a=_cell(kt, expl.against),
                      what=what, v=num(expl.total), s=num(float(z.sum())))
    fig.update_layout(title={"text": title, "x": 0.0}, height=120 + 34 * len(qlab),
                      margin={"l": 10, "r": 10, "t": 60, "b": 10})
    fig.update_yaxes(title=t("query source", lang=lang), autorange="reversed", type="category")
    fig.update_xaxes(title=t("key source", lang=lang), type="category", tickangle=-40)
    return fig


def top_pairs_figure(expl, k: int = 10, lang: str | None = None) -> go.Figure:
    """The `k` largest terms by magnitude, signed (bars right: they raise the score; left: they lower it)."""
    pairs = expl.top_pairs(k)
    labels = [f"{source_label(q, lang)} × {source_label(kk, lang)}" for q, kk, _ in pairs]
    vals = [v for _, _, v in pairs]
    fig = go.Figure(go.Bar(
        x=vals, y=labels, orientation="h", text=[num(v) for v in vals], textposition="auto",
        marker={"color": ["#b2182b" if v > 0 else "#2166ac" for v in vals]},
        hovertemplate="%{y}: %{text}<extra></extra>"))
    fig.update_layout(title={"text": t("The {k} largest (query source × key source) terms, signed", lang=lang,
                                       k=len(pairs)), "x": 0.0},
                      height=120 + 26 * len(pairs), margin={"l": 10, "r": 10, "t": 50, "b": 10})
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(title=t("term", lang=lang), zeroline=True)
    return fig


def check_rows(check, lang: str | None = None) -> list[dict]:
    """The causal check as table rows (the app's dataframe): side, source, attributed, actual, the weight's change,
    whether they agree."""
    side = {"query": t("query", lang=lang), "key": t("key", lang=lang)}
    return [{t("side", lang=lang): side[r.side], t("source", lang=lang): source_label(r.source, lang),
             t("attributed", lang=lang): r.attributed, t("actual (taken out, live norm)", lang=lang): r.actual,
             t("weight change", lang=lang): num(r.weight_change),  # often ~1e-9: as every table prints it
             t("agrees", lang=lang): "✓" if r.agrees else "✗ " + t("disagrees", lang=lang)} for r in check.rows]


def check_figure(check, lang: str | None = None) -> go.Figure:
    """Attributed vs actual change of the score for each checked source (grouped bars); a source whose two
    numbers disagree beyond the check's tolerance is marked ✗ in its label."""
    labels = [f"{'✗ ' if not r.agrees else ''}{t(r.side, lang=lang)}: {source_label(r.source, lang)}"
              for r in check.rows]
    fig = go.Figure([
        go.Bar(name=t("attributed", lang=lang), x=labels, y=[r.attributed for r in check.rows],
               marker={"color": "#888888"}, text=[num(r.attributed) for r in check.rows]),
        go.Bar(name=t("actual (taken out, live norm)", lang=lang), x=labels, y=[r.actual for r in check.rows],
               marker={"color": ["#1b7837" if r.agrees else "#d6604d" for r in check.rows]},
               text=[num(r.actual) for r in check.rows]),
    ])
    fig.update_layout(barmode="group", height=340, margin={"l": 10, "r": 10, "t": 50, "b": 10},
                      title={"text": t("Causal check: each source taken out of this head's input alone", lang=lang),
                             "x": 0.0}, legend={"orientation": "h", "y": -0.3})
    fig.update_yaxes(title=t("change of the score", lang=lang), zeroline=True)
    return fig


# the groups of model.analysis.why_circuits (GROUPS, and IOI's S-inhibition-like heads), coloured the same everywhere
_GROUP_COLOURS = {"previous-token heads": "#1b7837", "S-inhibition-like heads": "#1b7837", "other heads": "#762a83",
                  "FFNs": "#d6604d", "embeddings": "#4393c3", "biases": "#999999"}


def circuit_groups_figure(heads: Sequence[str], groups: Sequence[dict], totals: Sequence[float], title: str,
                          lang: str | None = None) -> go.Figure:
    """Each found head's summed lead split by group (why_circuits.Lead.groups): one bar per group and head, signed;
    a diamond marks the lead itself (Σ a head's bars). Group names are translated; the numbers are the Lead's."""
    names = [g for g in _GROUP_COLOURS if any(g in gr for gr in groups)]
    fig = go.Figure([go.Bar(name=t(g, lang=lang), x=list(heads), y=[gr.get(g, 0.0) for gr in groups],
                            marker={"color": _GROUP_COLOURS[g]}, text=[num(gr.get(g, 0.0)) for gr in groups],
                            textposition="outside", hovertemplate="%{x}: %{text}<extra>" + t(g, lang=lang) + "</extra>")
                     for g in names])
    fig.add_trace(go.Scatter(name=t("summed lead", lang=lang), x=list(heads), y=list(totals), mode="markers",
                             marker={"symbol": "diamond", "size": 12, "color": "black"},
                             text=[num(v) for v in totals], hovertemplate="%{x}: %{text}<extra></extra>"))
    fig.update_layout(barmode="group", height=340, title={"text": title, "x": 0.0},
                      margin={"l": 10, "r": 10, "t": 50, "b": 10}, legend={"orientation": "h", "y": -0.2})
    fig.update_yaxes(title=t("term (summed over the positions)", lang=lang), zeroline=True)
    fig.update_xaxes(type="category")
    return fig


def runner_up(weights: Sequence[float], key: int) -> int | None:
    """The key the head would otherwise pick: the highest weight in the row other than `key` (ties: the earliest);
    None when no other key has weight (a row of one visible key)."""
    w = np.asarray(weights, dtype=np.float64).copy()
    if not 0 <= key < len(w):
        return None
    w[key] = -np.inf
    best = int(np.argmax(w))
    return best if np.isfinite(w[best]) and w[best] > 0 else None


def leaders(expl) -> dict:
    """Which sources carry the score (the lead, with `against`), by the stated test. For each side, every source's
    side total signed toward the total's sign (positive = it helps); the side whose best source helps most is
    read. One source "clearly leads" when it is ≥ LEAD_RATIO × the next (clipped at 0); else the top two lead
    together when the second is ≥ LEAD_RATIO × the third; else none leads. Returns side, names, share of |total| (None
    when none leads), and the top three (name, value) of that side."""
    sign = 1.0 if expl.total >= 0 else -1.0
    best = None
    for side, totals in (("key", expl.key_side), ("query", expl.query_side)):
        ranked = sorted(totals.items(), key=lambda kv: -sign * kv[1])
        if best is None or sign * ranked[0][1] > sign * best[1][0][1]:
            best = (side, ranked)
    side, ranked = best
    c = [max(0.0, sign * v) for _, v in ranked[:3]] + [0.0, 0.0, 0.0]
    names: list[str] = []
    if c[0] > 0 and c[0] >= LEAD_RATIO * c[1]:
        names = [ranked[0][0]]
    elif c[1] > 0 and c[1] >= LEAD_RATIO * c[2]:
        names = [ranked[0][0], ranked[1][0]]
    share = (sum(c[: len(names)]) / abs(expl.total)) if names and expl.total != 0 else None
    return {"side": side, "names": names, "share": share, "top": ranked[:3], "sign": sign}


# the residual decomposition's words in a source's name (model/core/residual.py, model.analysis.why), as the UI says
# them; the rest of a name (L3 H4, L0 ffn, W_Q) is notation and stays
_STACK_WORDS = {"decoder": N_("decoder"), "encoder": N_("encoder")}
_PART_WORDS = {"embed": N_("embed"), "positions": N_("positional encoding"), "token type": N_("token type")}
_BIAS = N_("bias")


def source_label(name: str, lang: str | None = None) -> str:
    """A source's name as drawn: its stack ("decoder "/"encoder ") and the embeddings' parts in the UI's
    language."""
    stack, _, rest = name.partition(" ")
    if stack in _STACK_WORDS and rest:
        return f"{t(_STACK_WORDS[stack], lang=lang)} {source_label(rest, lang)}"
    if name.endswith(" bias"):  # a bias or a norm's offset, its own source: "L0 attn bias", "L1 norm1 bias"
        return f"{source_label(name[:-5], lang)} {t(_BIAS, lang=lang)}"
    return t(_PART_WORDS[name], lang=lang) if name in _PART_WORDS else name


def _src(name: str, lang: str | None) -> str:
    return t("the token embedding", lang=lang) if name == "embed" else source_label(name, lang)


def why_sentence(expl, head_label: str, tokens: Sequence[str] | None = None, lang: str | None = None,
                 key_tokens: Sequence[str] | None = None) -> str:
    """One sentence from the explanation's numbers: what the head attends from and to, which sources (and on
    which side) make most of the score, or of its lead over the contrast key; or, by `leaders`' test, that no
    source clearly leads. `key_tokens`: the key positions' tokens when they are not `tokens` (cross-attention)."""
    L = leaders(expl)
    kt = tokens if key_tokens is None else key_tokens
    q, k = _cell(tokens, expl.query), _cell(kt, expl.key)
    where = t("at the key position", lang=lang) if L["side"] == "key" else t("at the query position", lang=lang)
    joiner = t(" and ", lang=lang)
    if not L["names"]:
        (a, va), (b, vb) = L["top"][0], L["top"][1] if len(L["top"]) > 1 else ("—", 0.0)
        return t("{head}, query {q} → key {k}: no source clearly leads. The top source {where}, {a} ({va}), is less "
                 "than {r}× the next, {b} ({vb}), and the next less than {r}× the third (the test).",
                 lang=lang, head=head_label, q=q, k=k, where=where, a=_src(a, lang), va=num(va), b=_src(b, lang),
                 vb=num(vb), r=num(LEAD_RATIO))
    who = joiner.join(_src(s, lang) for s in L["names"])
    pct = f"{100 * L['share']:.0f}%"
    if expl.against is None:
        out = t("{head}, query {q} → key {k}: score {s}, weight {w}. Most of the score comes from what {who} wrote "
                "{where}: {pct} of it.", lang=lang, head=head_label, q=q, k=k, s=num(expl.total), w=num(expl.weight),
                who=who, where=where, pct=pct)
    elif expl.total >= 0:
        out = t("{head} attends from {q} to {k} rather than {a} mostly because of what {who} wrote {where}: {pct} "
                "of the score's lead ({lead}) over {a}.", lang=lang, head=head_label, q=q, k=k,
                a=_cell(kt, expl.against), who=who, where=where, pct=pct, lead=num(expl.total))
    else:
        out = t("{head} prefers {a} to {k} (for query {q}) mostly because of what {who} wrote {where}: {pct} of the "
                "score's gap ({lead}).", lang=lang, head=head_label, q=q, k=k, a=_cell(kt, expl.against),
                who=who, where=where, pct=pct, lead=num(expl.total))
    if L["share"] > 1.0:
        out += " " + t("(More than all of it: other sources pull the other way.)", lang=lang)
    return out
