"""The "Why here?" panel (issue 39 §3): one cell of a head's attention heatmap, its score split into (query source,
key source) terms (model.analysis.why.explain_score), the contrast with another key, the causal check and one
computed sentence. Glue only: the numbers come from model.analysis.why, the figures from viz.figures.why.

The cell lives in the URL: `?why=Q,K` (query, key) and `?why_vs=J` (the contrast key; absent = the runner-up, the
row's highest weight other than K). A click on a cell of the head heatmap opens it (`cell_clicks`, plotly's own
click event: Streamlit's on_select reports box/lasso selections of a heatmap, not a click on one cell); the number
inputs open it without a click (and in AppTest).
"""

from __future__ import annotations

import streamlit as st

from model.analysis import why as W
from viz.figures import why as FW
from viz.figures.attention import num
from viz.i18n import current_lang, t
from viz.ui.figure_cache import cached_figure
from viz.ui.plotly_clicks import plotly_click_component
from viz.ui.render import show_figure
from viz.ui.state import clamp_state, note_replaced, write_query

N_SOURCES = 8  # sources per side drawn in the heatmap; the rest binned as "other"
CHECK_TOP = 3  # sources per side taken out in the causal check

_cell_clicks = plotly_click_component("attention_lab.why_cell_clicks", """\
    const p = ev && ev.points && ev.points[0];
    if (!p || !Array.isArray(p.pointNumber) || p.pointNumber.length !== 2) return;
    setTriggerValue("cell", [Number(p.pointNumber[0]), Number(p.pointNumber[1]), Number(p.curveNumber)]);""")


def _on_cell_click(key: str, n_q: int, n_k: int, head_key: str | None, n_curves: int) -> None:
    """A click on a heatmap cell [row, col, curve]: open the panel on it (and on the clicked head, when the figure
    carries every head as one curve each), before the rerun so the widgets may change."""
    cell = getattr(st.session_state.get(f"{key}_why_clicks"), "cell", None)
    if not (isinstance(cell, list) and len(cell) == 3 and all(isinstance(v, int) for v in cell)):
        return
    q, k, curve = cell
    if 0 <= q < n_q and 0 <= k < n_k:
        st.session_state[f"{key}_why"] = True
        st.session_state[f"{key}_why_q"], st.session_state[f"{key}_why_k"] = q, k
        st.session_state[f"{key}_why_vs"] = -1
        if head_key and n_curves > 1 and 0 <= curve < n_curves:
            st.session_state[head_key] = curve


def cell_clicks(key: str, figure_key: str, n_q: int, n_k: int, head_key: str | None = None,
                n_curves: int = 1) -> None:
    """Listen to clicks on the cells of the heatmap drawn with `figure_key` (draws nothing)."""
    import functools

    _cell_clicks(key=f"{key}_why_clicks", data={"figure": figure_key}, height=0,
                 on_cell_change=functools.partial(_on_cell_click, key, n_q, n_k, head_key, n_curves))


def _parse(raw: str, n_q: int, n_k: int) -> tuple[int, int] | None:
    try:
        q, k = (int(v) for v in raw.split(","))
    except ValueError:
        return None
    return (q, k) if 0 <= q < n_q and 0 <= k < n_k else None


def _seed(key: str, n_q: int, n_k: int) -> None:
    """The panel's widgets from the URL (`why=Q,K`, `why_vs=J`) the first time this session draws them."""
    if f"{key}_why" in st.session_state:
        return
    raw = st.query_params.get("why")
    cell = _parse(raw, n_q, n_k) if raw is not None else None
    if raw is not None and cell is None:
        note_replaced("why", raw, t("no cell"))
    st.session_state[f"{key}_why"] = cell is not None
    st.session_state[f"{key}_why_q"], st.session_state[f"{key}_why_k"] = cell or (n_q - 1, 0)
    vs = st.query_params.get("why_vs")
    try:
        vs = int(vs) if vs is not None else -1
    except ValueError:
        vs = -1
    st.session_state[f"{key}_why_vs"] = vs if 0 <= vs < n_k else -1


def _ids(trace, lazy: bool):
    """The ids the trace ran on, as explain_score takes them: (src, tgt) for an encoder-decoder, else [1, T]."""
    if lazy:
        return trace.meta_item("tgt_ids")
    meta = trace.meta
    if (meta.get("model") or {}).get("family") == "transformer":  # the 2017 encoder-decoder (the translator)
        return tuple(meta["src_ids"][0]), tuple(meta["tgt_ids"][0])
    return meta.get("tgt_ids") or meta["src_ids"]


WHY_TRACE_BUDGET = 2**30  # the long prompt's explanation trace, at most this (SmolLM2 at 2,048 tokens: ~405 MiB)


@st.cache_resource(max_entries=1, show_spinner=False)
def _why_trace(model_id: int, ids: tuple[int, ...], _m):
    """One lazy trace per long prompt holding the O(T·d) names every explanation reads (W.lazy_names): the
    page's own lazy trace keeps q, k, v and the layers' outputs, not the FFN outputs and norm inputs. The first
    cell pays one forward (cold); every other cell, head and layer on this prompt reads it (warm). One entry: a
    new prompt replaces it, so the memory held is one prompt's."""
    import torch

    _, tr = _m.run_with_trace(torch.tensor([ids]), names=W.lazy_names(_m), lazy=True, fast=True,
                               budget_bytes=WHY_TRACE_BUDGET)
    return tr


def _long_trace(lm, ids):
    """The cached explanation trace for a long prompt, or None (the analysis then runs a forward up to the layer,
    per cell) when it would not fit WHY_TRACE_BUDGET or the model has no byte estimate."""
    m = getattr(lm, "model", lm)
    T = len(ids)
    if not (hasattr(lm, "trace_bytes") and hasattr(m, "describe")) or "lacks" in m.describe():
        return None
    if lm.trace_bytes(T, lazy=True, names=W.lazy_names(m)) > WHY_TRACE_BUDGET:
        return None
    return _why_trace(id(m), tuple(int(i) for i in ids), m)


def _explain(trace, layer, head, q, k, against, lm=None, lazy=False):
    # a page's full trace holds every capture explain_score reads; a long prompt's lazy trace does not: the panel
    # keeps one explanation trace per prompt (_long_trace), or the analysis runs a forward up to the layer
    ids = _ids(trace, lazy)
    if lazy:
        flat = ids[0] if isinstance(ids[0], list | tuple) else ids
        trace = _long_trace(lm, flat)
    return W.explain_score(lm, ids, layer, head, q, k, against=against, trace=trace)


def _row(trace, module: str, head: int, q: int, lazy: bool):
    if lazy:
        return trace.attention(module, head, rows=q)[0].double().numpy()
    return trace[f"{module}.weights"][0, head, q].double().numpy()


def check_summary(check, lang: str | None = None) -> str:
    """The check's verdict in the UI's language (model.analysis.why.Check.summary's content)."""
    bad = check.disagreements
    tol = t("within {rel} of the larger effect, or {abs} × max(1, |score|)", lang=lang, rel=f"{W.CHECK_REL:.0%}",
            abs=f"{W.CHECK_ABS:g}")
    if not bad:
        return t("All {n} checked sources agree with their attribution ({tol}).", lang=lang, n=len(check.rows),
                 tol=tol)
    zh = (lang or current_lang()) == "zh"  # full-width brackets and list commas in Chinese text
    lp, colon, rp = ("（", "：", "）") if zh else (" (", ": ", ")")
    names = ("、" if zh else ", ").join(
        f"{FW.source_label(r.source, lang)}{lp}{t(r.side, lang=lang)}{colon}{num(r.attributed)} → {num(r.actual)}{rp}"
        for r in bad)
    return t("{m} of {n} checked sources disagree with their attribution beyond the tolerance ({tol}): {names}. The "
             "norm's scale moves when a source is taken out, which the frozen-norm attribution does not see: for "
             "these, read the actual change.", lang=lang, m=len(bad), n=len(check.rows), tol=tol, names=names)


def render_why(lm, trace, module: str, layer: int, head: int, tokens: list[str], key: str = "llm",
               key_tokens: list[str] | None = None, label: str | None = None) -> None:
    """The panel for head `head` of `module` (layer `layer`) on the page's trace (full, or a long prompt's lazy
    one). `lm`: the model (model.load_model's, or a toy checkpoint), whose residual decomposition the analysis
    reads. `tokens` are the query positions', `key_tokens` the key positions' (cross-attention; None: the same);
    `label` names the head in the sentence (default L{layer}H{head})."""
    lang = current_lang()
    lazy = hasattr(trace, "attention")
    kt = tokens if key_tokens is None else key_tokens
    n_q, T = len(tokens), len(kt)
    _seed(key, n_q, T)
    clamp_state(f"{key}_why_q", 0, n_q - 1)  # another input may be shorter than the cell a link (or this session)
    clamp_state(f"{key}_why_k", 0, T - 1)  # chose
    if not -1 <= st.session_state.get(f"{key}_why_vs", -1) < T:
        st.session_state[f"{key}_why_vs"] = -1
    on = st.toggle(t("Why here? Explain one cell of this head"), key=f"{key}_why",
                   help=t("Split the cell's pre-softmax score exactly into what built its query and its key: every "
                          "earlier head, MLP and the embeddings, each norm frozen at its scale on this run. Click a "
                          "cell of the heatmap above, or choose it here."))
    if not on:
        write_query(why=None, why_vs=None)
        return
    c1, c2, c3 = st.columns(3)
    q = c1.number_input(t("Query position"), 0, n_q - 1, key=f"{key}_why_q")
    k = c2.number_input(t("Key position"), 0, T - 1, key=f"{key}_why_k")
    row = _row(trace, module, head, int(q), lazy)
    auto = FW.runner_up(row, int(k))
    vs = c3.selectbox(t("Rather than key"), [-1, *range(T)], key=f"{key}_why_vs",
                      format_func=lambda j: (t("the runner-up ({j})", lang=lang, j=auto if auto is not None else "—")
                                             if j == -1 else f"{j}: {kt[j]}"),
                      help=t("Why this key and not another: the runner-up is the key with the row's highest weight "
                             "other than this one (the key the head would otherwise pick)."))
    write_query(why=f"{int(q)},{int(k)}", why_vs=None if vs == -1 else int(vs))
    against = auto if vs == -1 else int(vs)
    if against == int(k):
        against = None
    try:
        with st.spinner(t("Splitting the score…")):
            e = cached_figure(trace, _explain, module, head, int(q), int(k), None, shared=True, lm=lm, lazy=lazy)
            ev = (None if against is None else
                  cached_figure(trace, _explain, module, head, int(q), int(k), against, shared=True, lm=lm, lazy=lazy))
    except ValueError as err:  # a model via transformers has no decomposition: the analysis says why, in one sentence
        name = getattr(lm, "name", None) or "?"
        msg = str(err)
        st.info(t(W.NO_DECOMPOSITION, lang=lang, name=name) if msg == W.NO_DECOMPOSITION.format(name=name) else msg,
                icon="🧩")
        return
    label = label or f"L{layer}H{head}"
    st.markdown("**" + t("Why here?") + "** " + FW.why_sentence(e, label, tokens, lang, key_tokens=kt))
    if e.blocked:
        st.caption(t("The mask blocks this key for this query (it lies in the future, or outside a sliding window): "
                     "its score is finite and explained here, but its attention weight is 0."))
    sums = (t("Σ of the {n} terms = {s}; the recorded score = {v} (|difference| {d}, within the float32 bound "
              "{b}).", n=f"{e.matrix.size:,}", s=num(e.explained, 7), v=num(e.total, 7), d=num(e.error),
              b=num(e.tolerance())) if e.error <= e.tolerance() else
            t("Σ of the {n} terms = {s}; the recorded score = {v}: |difference| {d} is beyond the float32 bound {b}, "
              "so this split is not exact here.", n=f"{e.matrix.size:,}", s=num(e.explained, 7), v=num(e.total, 7),
              d=num(e.error), b=num(e.tolerance())))
    (st.caption if e.error <= e.tolerance() else st.warning)(sums)
    show_figure(FW.pairs_heatmap(e, tokens, N_SOURCES, lang=lang, key_tokens=kt), key=f"{key}_why_pairs")
    show_figure(FW.top_pairs_figure(e, lang=lang), key=f"{key}_why_top")
    st.markdown("**" + t("Why here and not there") + "**")
    if ev is None:
        st.caption(t("No other key in this row has weight to compare with."))
    else:
        st.markdown(FW.why_sentence(ev, label, tokens, lang, key_tokens=kt))
        show_figure(FW.pairs_heatmap(ev, tokens, N_SOURCES, lang=lang, key_tokens=kt), key=f"{key}_why_vs_pairs")
    st.markdown("**" + t("Causal check") + "**")
    chk = W.check_explanation(ev if ev is not None else e, top=CHECK_TOP)
    st.caption((t("Checked: the contrast above (key {k} over key {a}).", k=int(k), a=against) if ev is not None
                else t("Checked: the score of key {k}.", k=int(k))) + " " +
               t("Each of the top {n} sources of each side is taken out of this head's query (or key) input alone; "
                 "the layer's input norm is recomputed (not frozen), then the projection, the q/k-norm and the "
                 "rotation, and the cell is scored again. Beside the attributed value: the actual change of the "
                 "score and of the attention weight.", n=CHECK_TOP))
    st.dataframe(FW.check_rows(chk, lang), hide_index=True, key=f"{key}_why_check_table")
    show_figure(FW.check_figure(chk, lang=lang), key=f"{key}_why_check")
    (st.success if not chk.disagreements else st.warning)(check_summary(chk, lang))
