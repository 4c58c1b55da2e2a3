"""Long inputs on a language model (issue 24 §3): the views a page shows when a prompt is too long to keep
every attention map. The trace is lazy (model/core/trace.py: q, k, v per layer, and each layer's output up to the
other pages' lazy limit; a head's weights computed when shown), so memory grows like the prompt, not its square; it
is the one trace every page of this prompt reads (viz/ui/models.long_lm_trace).

    from viz.ui.long_views import long_trace, render_long_attention
    trace = long_trace(sel, key="attn")          # None: a full trace fits, the page's usual views run
    render_long_attention(trace, trace.meta_item("tgt_tokens"), key="attn")

Each part is a Streamlit fragment: a zoom window or a document position reruns that part only (issue 31 §2).

- a head's whole map, pooled (keys summed, queries averaged: each row still sums to 1), beside a zoom
  window of exact cells (its corner and size in the URL: `win=q0,k0,size`; token labels once small);
- the document view: the prompt as text, each token shaded by how much the chosen position attends to
  it (one head, the layer's mean, or the model's mean), with the top 10 sources and their contexts. A
  long prompt shows the DOC_BEFORE tokens before the position and each top source's context, in a box
  that opens at its end, where the position is (`show_document`; no script: st.html runs none).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import streamlit as st

from model.analysis import long as LG
from model.core import recorder
from viz.figures import long as FLONG
from viz.i18n import N_, t
from viz.ui import models
from viz.ui.lm_models import EXACT_UP_TO  # noqa: F401 - re-exported (viz/pages/llm.py)
from viz.ui.long_limits import keep_button
from viz.ui.render import show_error, show_figure
from viz.ui.state import clamp_state, int_in, seed_from_query, write_query

FULL_BUDGET = recorder.DEFAULT_BUDGET_BYTES  # the full trace the other views use, at most this
# The long prompt's lazy trace lives with the other traces (viz/ui/models.py): one per prompt for every page.
LONG_BUDGET = models.LONG_BUDGET
LONG_TRACES, LONG_TRACES_BYTES = models.LONG_TRACES, models.LONG_TRACES_BYTES
_LONG_TRACES, _make_long_trace = models._LONG_TRACES, models._make_long_trace


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _long_trace(name: str, text: str, chat: bool, keep: int | None, n_tokens: int | None = None):
    """The lazy trace of `text` (its last `keep` tokens), shared by every session and page (read-only)."""
    return models.long_lm_trace(name, text, chat, keep, n_tokens)


_keep_button = keep_button  # the button lives in long_limits (render -> long_limits, never back here)


def long_trace(sel, key: str = "attn", chat: bool = False, text: str | None = None):
    """The lazy trace of the selection's text when it is too long for a full trace on this server, else
    None (the page's usual views run). A text longer than the model reads, or than even a lazy trace may
    hold here, is said in the UI's words with the length that works and a button keeping the text's end;
    the page then stops. `?keep=N` (set by that button) keeps the last N tokens. text: the prompt (default
    the sidebar's)."""
    rm = sel.ckpt
    lm = rm.obj
    text = sel.text if text is None else text
    raw_keep = st.query_params.get("keep")
    keep = int(raw_keep) if raw_keep is not None and str(raw_keep).isdigit() and int(raw_keep) > 0 else None
    try:
        n = lm.encode(text, chat=chat).shape[1]
    except recorder.ContextLengthError as e:
        if keep is None or keep > e.context_length:
            show_error(t("This text is {n} tokens long, and {model} reads at most {limit} tokens at once (its "
                         "context length).", n=f"{e.n_tokens:,}", model=rm.title, limit=f"{e.context_length:,}"))
            _keep_button(min(e.context_length, lm.max_tokens_within(LONG_BUDGET, lazy=True)), key)
            st.stop()
        n = e.n_tokens
    except ValueError as e:
        show_error(e)
        st.stop()
    T = min(n, keep) if keep else n
    if keep is not None and keep < n:
        st.info(t("Showing the last {k} of the text's {n} tokens.", k=f"{T:,}", n=f"{n:,}"), icon="✂️")
    full = lm.trace_bytes(T)
    if full <= FULL_BUDGET:
        return None
    if lm.trace_bytes(T, lazy=True) > LONG_BUDGET:  # (the longest length that fits: a search, only when said)
        fit = lm.max_tokens_within(LONG_BUDGET, lazy=True)
        show_error(t("This text is {n} tokens long; this server shows at most {fit} tokens of it (the model's "
                     "queries, keys and values of every layer must fit in {budget}).", n=f"{T:,}",
                     fit=f"{fit:,}", budget=_mib(LONG_BUDGET)))
        _keep_button(fit, key)
        st.stop()
    with st.spinner(t("Running the model on {n} tokens…", n=f"{T:,}")):
        # The one lazy trace of this prompt every page reads (models.long_lm_trace): q, k, v and, up to the
        # other pages' lazy limit, each layer's output (SmolLM2 at 2,380 tokens: 445 MiB; q, k, v alone at 8,192
        # tokens: 0.92 GiB). Inside a layer then runs one layer again from it, not a forward of its own.
        trace = _long_trace(sel.name, text, chat, T if keep else None, T)
    if (trace.meta_item("lazy") or {}).get("layers"):
        kept = t("{n} tokens: every attention map would take {full}. The app keeps the model's queries, keys and "
                 "values and each layer's output ({held}) and computes a head's map when you open it; very long maps "
                 "are shown pooled, with a window of exact cells.", n=f"{T:,}", full=_mib(full),
                 held=_mib(trace.nbytes()))
    else:
        kept = t("{n} tokens: every attention map would take {full}. The page keeps the model's queries, keys and "
                 "values ({held}) and computes a head's map when you open it; very long maps are shown pooled, "
                 "with a window of exact cells.", n=f"{T:,}", full=_mib(full), held=_mib(trace.nbytes()))
    st.info(kept, icon="📏")
    return trace

CELLS_UP_TO = 512  # a page draws a T × T map cell by cell up to this many tokens (262k cells); beyond, pooled
                  # (LG.pooled_overview) with a window of exact cells, or one row (LG.document_view)
OVERVIEW_BLOCKS = 128  # the pooled map's side (cells); a block holds T / 128 positions
ZOOM_SIZES = (16, 32, 64, 128, 256)
DOC_BEFORE = 1000  # the document view shows this many tokens before the position (and each top source's context);
                  # the whole text on request (SmolLM2 at 8,192 tokens: ~1 MB of HTML a redraw)
DOC_AFTER = 24  # ... and this many after it (grey: it cannot see them), so the position sits near the box's end
STATS_CELLS = 2800 * 2800 // 2  # per-head statistics read at most about this many cells a head: every row up to
                               # 2,800 tokens (the other pages' lazy limit); a longer prompt's over its last rows,
                               # each over all its keys (cost ~ rows x T)
STATS_MIN_ROWS = 256
VIEWS_KEPT = 64  # pooled maps (128 x 128 float64: 131 kB) and document views (T floats) kept for all sessions
SCOPES = {"head": N_("this head"), "layer": N_("this layer's mean over heads"), "model": N_("the model's mean")}


_VIEWS: OrderedDict = OrderedDict()  # (id(trace), build, args) -> (weakref to the trace, result)
_VIEWS_LOCK = threading.Lock()


def shared_view(trace, build, *args):
    """`build(trace, *args)` (a pooled map, a document view: pure functions of the trace), kept for every session
    in a bounded LRU of its own (not the figure cache: a class's clicks through heads and positions must not push
    /llm's per-head statistics out of it). An entry refers to its trace weakly and serves that very object only."""
    return models.per_trace(_VIEWS, _VIEWS_LOCK, VIEWS_KEPT, (id(trace), build.__name__, args), trace,
                            lambda: build(trace, *args))


def stats_first_query(T: int) -> int:
    """The first query row the per-head statistics score at T tokens (0: every row): the cost of a row is its
    keys, so a long prompt scores its last STATS_CELLS / T rows (at 8,192 tokens: the last 478)."""
    if T * T <= 2 * STATS_CELLS:
        return 0
    return max(0, T - max(STATS_MIN_ROWS, STATS_CELLS // T))


def _win(raw: str | None, T: int) -> tuple[int, int, int] | None:
    try:
        q0, k0, size = (int(x) for x in str(raw).split(","))
    except (TypeError, ValueError):
        return None
    if size in ZOOM_SIZES and 0 <= q0 < T and 0 <= k0 < T:
        return q0, k0, size
    return None


def follow_end(key: str, T: int) -> None:
    """The text changed length (a question appended to the prompt): a document position that sat on the old last
    token moves to the new last one, and a zoom window that held the old last row moves by as many tokens, so the
    view follows the end of the text as a fresh page would (issue 31 §3). A position or window the reader moved
    elsewhere stays where it was. The page's widgets keep their values by key; this sets them before they are drawn."""
    seen = f"{key}_long_T"
    old, st.session_state[seen] = st.session_state.get(seen), T
    if old is None or old == T:
        return
    pos = f"{key}_long_pos"
    if st.session_state.get(pos) == old - 1:
        st.session_state[pos] = T - 1
        write_query(pos=T - 1)
    q0k, k0k = f"{key}_long_q0", f"{key}_long_k0"
    size = st.session_state.get(f"{key}_long_size", 32)
    q0, k0 = st.session_state.get(q0k), st.session_state.get(k0k)
    if isinstance(q0, int) and isinstance(k0, int) and q0 <= old - 1 < q0 + size:
        shift = T - old
        st.session_state[q0k] = min(max(0, q0 + shift), T - 1)
        st.session_state[k0k] = min(max(0, k0 + shift), T - 1)
        write_query(win=f"{st.session_state[q0k]},{st.session_state[k0k]},{size}")


def render_long_attention(trace, tokens: list[str], key: str = "attn", layer: int | None = None,
                          head: int | None = None) -> None:
    """Layer/head choice (unless the page chose them), the pooled overview with its zoom window, and the
    document view of `trace` (a LazyTrace of a decoder LM); `tokens` are the readable pieces.

    Each part is a fragment (issue 31 §2, a change warm <= 1 s in the browser): a zoom window or a document
    position reruns its own part only, a head switch (on this page's selects) these views only; the sidebar, the
    prompt's tokenization and the rest of the page are neither redone nor sent again."""
    follow_end(key, LG.n_tokens(trace))
    if layer is None or head is None:
        _head_choice(trace, tokens, key)
    else:
        _whole_input(trace, tokens, key, layer, head)
        _document(trace, tokens, key, layer, head)


@st.fragment
def _head_choice(trace, tokens: list[str], key: str) -> None:
    """The layer and head selects (the Attention page), then the two views of that head."""
    n_layers, n_heads = len(trace.modules()), trace.n_heads(0)
    seed_from_query(f"{key}_long_layer", "layer", 0, int, int_in(0, n_layers - 1))
    seed_from_query(f"{key}_long_head", "head", 0, int, int_in(0, n_heads - 1))
    clamp_state(f"{key}_long_layer", 0, n_layers - 1)
    clamp_state(f"{key}_long_head", 0, n_heads - 1)
    c1, c2 = st.columns(2)
    layer = c1.selectbox(t("Layer"), range(n_layers), key=f"{key}_long_layer")
    head = c2.selectbox(t("Head"), range(n_heads), key=f"{key}_long_head")
    write_query(layer=layer, head=head)
    _whole_input(trace, tokens, key, layer, head)
    _document(trace, tokens, key, layer, head)


@st.fragment
def _whole_input(trace, tokens: list[str], key: str, layer: int, head: int) -> None:
    """The whole map, pooled, and a window of exact cells."""
    T = LG.n_tokens(trace)
    st.subheader(t("The whole input"))
    st.caption(t("Each cell is a block of about {b} queries × {b} keys: the weights a query puts on the block's "
                 "keys are summed, then averaged over the block's queries, so every row still sums to 1. Pick a "
                 "window below to see its exact cells.", b=max(1, round(T / OVERVIEW_BLOCKS))))
    # once per trace and head for every session (a zoom or another session's switch back costs nothing)
    ov = shared_view(trace, LG.pooled_overview, layer, head, OVERVIEW_BLOCKS)
    win = _win(st.query_params.get("win"), T) or (max(0, T - 32), max(0, T - 32), 32)
    c1, c2, c3 = st.columns(3)
    size = c3.select_slider(t("Window size"), ZOOM_SIZES, value=win[2], key=f"{key}_long_size")
    q0 = c1.number_input(t("First query"), 0, T - 1, value=min(win[0], T - 1), key=f"{key}_long_q0")
    k0 = c2.number_input(t("First key"), 0, T - 1, value=min(win[1], T - 1), key=f"{key}_long_k0")
    write_query(win=f"{q0},{k0},{size}")
    fig = FLONG.overview_figure(ov, tokens)
    fig.add_shape(type="rect", xref="x domain", yref="y domain", x0=k0 / T, x1=min(T, k0 + size) / T,
                  y0=1 - min(T, q0 + size) / T, y1=1 - q0 / T, line={"color": "#1f77b4", "width": 2})
    show_figure(fig, key=f"{key}_long_overview")
    cells = LG.zoom(trace, layer, head, q0, q0 + size, k0, k0 + size)
    show_figure(FLONG.window_figure(cells, q0, k0, tokens), key=f"{key}_long_window")
    if k0 > q0 + size - 1:
        st.caption(t("Keys after a query are blocked (it cannot see the future): this window is all zeros."))


@st.fragment
def _document(trace, tokens: list[str], key: str, layer: int, head: int) -> None:
    """The document view: where one position looks, the text shaded by its weights, and its top sources."""
    T = LG.n_tokens(trace)
    st.subheader(t("The document view"))
    seed_from_query(f"{key}_long_pos", "pos", T - 1, int, int_in(0, T - 1))
    seed_from_query(f"{key}_long_scope", "scope", "head", valid=lambda v: v in SCOPES)
    c1, c2 = st.columns([1, 2])
    pos = c1.number_input(t("Position"), 0, T - 1, key=f"{key}_long_pos",
                          help=t("The query position: its weights over every earlier token shade the text. The "
                                 "last position is the one whose output predicts the next token."))
    scope = c2.segmented_control(t("Weights of"), list(SCOPES), format_func=lambda v: t(SCOPES[v]),
                                 key=f"{key}_long_scope", required=True)
    write_query(pos=pos, scope=scope)
    view = shared_view(trace, LG.document_view, pos, None if scope == "model" else layer,
                       head if scope == "head" else None)
    show_document(tokens, view, key)
    st.caption(t("Top {n} source tokens of position {pos} (each with a few tokens around it):", n=len(view.top),
                 pos=pos))
    st.dataframe(FLONG.top_sources(tokens, view), hide_index=True, width="stretch")


def show_document(tokens: list[str], view, key: str) -> None:
    """The document view's text (FLONG.document_html), the chosen position in view: up to DOC_BEFORE tokens
    before it (all of them when the reader asks), DOC_AFTER after, and each top source's context."""
    whole = False
    if view.position > DOC_BEFORE:
        whole = st.toggle(t("Show all the text before the position"), key=f"{key}_long_whole",
                          help=t("The box shows the {n} tokens before the position and a few tokens around each "
                                 "top source; ⋯ marks what is skipped.", n=f"{DOC_BEFORE:,}"))
    st.html(FLONG.document_html(tokens, view, before=None if whole else DOC_BEFORE, after=DOC_AFTER))
