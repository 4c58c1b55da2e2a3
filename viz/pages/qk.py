"""The Q/K map (AttentionViz for every model): one head's queries and keys over a batch of inputs, in one picture.

URL parameters (with the sidebar's checkpoint=): qk_kind (enc | dec | cross), layer, head, color (kind | position |
token), batch (sentences | repeat: a language model's repeated random tokens | prompt: the sidebar's text), query
(input.position of the clicked query). A link reopens the same picture.

A language model's prompt over qk_batch.FULL_UP_TO tokens keeps q and k only (issue 24 §3): the drawn head's
weights come from the trace, a query is picked by its position too, the picture draws every s-th position's
points (qk.MAX_POINTS per cloud) and clarity is measured on qk.CLARITY_QUERIES queries spread over the prompt.
"""

import time

import numpy as np
import streamlit as st

from viz.figures import attention as F
from viz.figures import qk as FQ
from viz.i18n import N_, option_labels, t
from viz.ui import lm_models
from viz.ui import qk_batch as QB
from viz.ui.attention_views import KIND_IDS, KINDS
from viz.ui.models import get_trace, load_ckpt, session_models
from viz.ui.render import show_error, show_figure
from viz.ui.sidebar import require_own_family, selection
from viz.ui.state import clamp_state, int_in, note_replaced, seed_from_query, write_query
from viz.ui.text import md_escape, text_problems

BATCHES = {"sentences": N_("40 sentences"), "repeat": N_("Random tokens, repeated (4 × [BOS] + 50 × 2)"),
           "prompt": N_("the sidebar's text")}
LM_FAMILIES = ("decoder_lm", "decoder_lm_adapter")  # a model via transformers: where its q and k are exact
KIND_OF = {v: k for k, v in KIND_IDS.items()}  # URL id -> describe() kind
SHARED_BATCHES = 3  # a real LM's batch (30 layers of q, k, weights over 40 sentences): ~60 MB


@st.cache_resource(show_spinner=False, max_entries=SHARED_BATCHES, ttl=3600)
def _shared_batch(name: str, batch: str, text: str | None = None, target: str | None = None) -> FQ.QKBatch:
    return _build(load_ckpt(name), batch, text, target, name)


def _build(ckpt, batch: str, text: str | None = None, target: str | None = None, name: str | None = None
           ) -> FQ.QKBatch:
    """`text` (and a toy model's `target`): the sidebar's input, for batch "prompt"."""
    if isinstance(ckpt, lm_models.RealModel):
        if ckpt.family in LM_FAMILIES:
            readable = lm_models.model_readable(ckpt.obj)
            if batch == "prompt" and name is not None and ckpt.family == "decoder_lm" and QB.is_long(ckpt.obj, text):
                # the sidebar's trace, shared with the other pages: q and k kept, a head's weights when drawn
                return QB.trace_batch(ckpt.obj, get_trace(name, text), text, readable)
            return QB.lm_batch(ckpt.obj, batch, readable=readable, text=text)
        return QB.encoder_batch(ckpt.obj, [text] if batch == "prompt" else None)
    return QB.toy_batch(ckpt, pairs=[(text, target)] if batch == "prompt" else None)


def get_batch(name: str, batch: str, text: str | None = None, target: str | None = None) -> FQ.QKBatch:
    """The batch of model `name`: shared by every session for shipped and server models; a model trained in
    this session keeps its own (keyed by the model object: a retrained model gets a new batch)."""
    if batch != "prompt":
        text = target = None
    own = session_models().get(name)
    if own is None:
        return _shared_batch(name, batch, text, target)
    key = ("_al_qk_batch", id(own), batch, text, target)
    if st.session_state.get("_al_qk_batch_key") != key:
        st.session_state["_al_qk_batch"] = _build(own, batch, text, target)
        st.session_state["_al_qk_batch_key"] = key
    return st.session_state["_al_qk_batch"]


@st.cache_resource(show_spinner=False, max_entries=8, ttl=3600)
def _clarity(name: str, batch: str, kind: str, _b: FQ.QKBatch, ident: int):
    return FQ.clarity_table(_b, kind)


@st.cache_resource(show_spinner=False, max_entries=8, ttl=3600)
def _structure(name: str, batch: str, _b: FQ.QKBatch, ident: int):
    """A decoder LM's best previous-token head (sentences) or induction head (repeat), its score, and how often
    its map puts a query nearest the pattern's key (with chance)."""
    mods = _b.modules("decoder_self")
    if batch == "repeat":
        scores, what = QB.induction_scores(_b, mods), "induction"
        n = _b.period
        target, first = (lambda p: p - (n - 1)), n + 1
    else:
        scores, what = QB.previous_token_scores(_b, mods), "prev"
        target, first = (lambda p: p - 1), 1
    li, h = divmod(int(np.argmax(scores)), scores.shape[1])
    share, chance, count = FQ.qk_map(_b, mods[li], h).pattern_share(target, first)
    return what, li, h, float(scores[li, h]), share, chance, count


st.title(t("Q/K map"))
st.caption(t("One head's queries and keys, from a whole batch of inputs, in one picture (after AttentionViz, Yeh et "
             "al. 2023). A query attends most to the keys with the largest q·k, so the picture first makes nearness "
             "track attention: it shifts all keys by one vector (that adds the same constant to each of a query's "
             "scores) and scales q by a and k by 1/a (q·k unchanged), so every softmax row stays the same. Then a "
             "joint PCA draws both clouds in 2-D."))
sel = selection()
if sel is None:
    st.stop()
ckpt = sel.ckpt
via_transformers = isinstance(ckpt, lm_models.RealModel) and ckpt.family == "decoder_lm_adapter"
if via_transformers and not QB.draws_q_k(ckpt.obj):
    require_own_family(sel)  # one sentence: what this model gives (e.g. ALiBi's q and k) and what it lacks
is_lm = isinstance(ckpt, lm_models.RealModel) and ckpt.family in LM_FAMILIES
batches = list(BATCHES) if is_lm else ["sentences", "prompt"]

seed_from_query("qk_batch", "batch", "sentences", valid=lambda v: v in batches)
if st.session_state.get("qk_batch") not in batches:
    st.session_state["qk_batch"] = "sentences"
TOY_SENTENCES = N_("40 held-out pairs")  # a toy model's sentence batch is its task's held-out pairs


def batch_label(b: str) -> str:
    return BATCHES[b] if is_lm or b != "sentences" else TOY_SENTENCES


batch_id = st.segmented_control(t("Inputs"), batches, key="qk_batch", required=True,
                                format_func=option_labels(batches, lambda b: t(batch_label(b))))
write_query(batch=batch_id if is_lm or batch_id != "sentences" else None)
if batch_id == "prompt":
    problem = text_problems(sel.text) or (text_problems(sel.target) if sel.target else None)
    try:
        too_long = problem is None and via_transformers and QB.is_long(ckpt.obj, sel.text)
    except ValueError as e:  # over the model's context: said with the longest length and a keep-the-end button
        show_error(e)
        st.stop()
    if too_long:
        problem = t("This text is too long for the Q/K map of a model that runs via transformers: the map keeps "
                    "every head's weights, at most {n} tokens on this server, and such a model has no lazy trace to "
                    "read a longer one from. Shorten the text, or pick one of the lab's own models.",
                    n=QB.max_full_tokens(ckpt.obj))
    if problem:
        show_error(problem)
        st.stop()
# the cache key of what the maps below were built from (the prompt's text too: another text, another batch)
batch_key = batch_id if batch_id != "prompt" else "\x1f".join(("prompt", sel.text, sel.target or ""))
try:
    with st.spinner(t("Running the model on the whole batch (once per model)…")):
        batch = get_batch(sel.name, batch_id, sel.text, sel.target or None)
except ValueError as e:  # a toy model without a known task, a broken model, text it cannot take
    show_error(e)
    st.stop()
if batch_id == "prompt":
    what = t("the sidebar's text, “{text}”", text=md_escape(sel.text[:200]))
elif not isinstance(ckpt, lm_models.RealModel):
    what = t("{n} held-out pairs of its task, teacher-forced (source → reference target)", n=len(batch.labels))
elif batch_id == "repeat":
    what = t("{n} sequences of [BOS] + {k} random tokens, then the same {k} again", n=len(batch.labels),
             k=batch.period)
else:
    what = t("{n} short English sentences", n=len(batch.labels))
st.caption(t("Inputs: {what}.", what=what))

# ---------------------------------------------------------------- kind, layer, head, colour

kinds = [KIND_IDS[k] for k in batch.kinds()]
seed_from_query("qk_kind", "qk_kind", "dec" if "dec" in kinds else kinds[0], valid=lambda v: v in kinds)
if st.session_state.get("qk_kind") not in kinds:
    st.session_state["qk_kind"] = kinds[0]
c0, c1, c2, c3 = st.columns([3, 1, 1, 2])
kind = c0.radio(t("Attention"), kinds, key="qk_kind", horizontal=True,
                format_func=option_labels(kinds, lambda k: t(KINDS[k][0])),
                disabled=len(kinds) == 1)
modules = batch.modules(KIND_OF[kind])
n_heads = batch.desc["attention"][modules[0]]["n_heads"]
seed_from_query("qk_layer", "layer", 0, int, int_in(0, len(modules) - 1))
seed_from_query("qk_head", "head", 0, int, int_in(0, n_heads - 1))
seed_from_query("qk_color", "color", "kind", valid=lambda v: v in FQ.COLORS)
clamp_state("qk_layer", 0, len(modules) - 1)
clamp_state("qk_head", 0, n_heads - 1)
layer = c1.selectbox(t("Layer"), range(len(modules)), key="qk_layer")
head = c2.selectbox(t("Head"), range(n_heads), key="qk_head")
color = c3.segmented_control(t("Colour by"), list(FQ.COLORS), key="qk_color", required=True,
                             format_func=option_labels(list(FQ.COLORS), lambda c: t(FQ.COLORS[c])))
module = modules[layer]
t0 = time.perf_counter()  # the map and its figure (the batch is cached per model)
m = FQ.qk_map(batch, module, head)
long_prompt = batch.weights_of is not None  # one long prompt: q and k kept, this head's weights computed


def _parse_query(v: str) -> tuple[int, int]:
    s, _, p = str(v).partition(".")
    return int(s), int(p)


def _valid_query(v) -> bool:
    s, p = v
    return 0 <= s < len(m.weights) and 0 <= p < m.weights[s].shape[0]


if "qk_query" not in st.session_state:  # the link's picked query, once per session (like seed_from_query)
    raw = st.query_params.get("query")
    try:
        st.session_state["qk_query"] = _parse_query(raw) if raw is not None else None
    except ValueError:
        st.session_state["qk_query"] = None
    if raw is not None and (st.session_state["qk_query"] is None or not _valid_query(st.session_state["qk_query"])):
        st.session_state["qk_query"] = None
        note_replaced("query", raw, t("no picked query"))
picked = st.session_state.get("qk_query")
if picked is not None and not _valid_query(picked):  # another head/kind/model: its queries differ
    picked = st.session_state["qk_query"] = None
if long_prompt:  # too many points to find one by eye: pick a query by its position (default: the last)
    n_q = m.weights[0].shape[0]
    if picked is None:
        picked = st.session_state["qk_query"] = (0, n_q - 1)
    st.session_state["qk_query_pos"] = picked[1]  # before the widget: a click on a query moves it too

    def _on_pos() -> None:
        st.session_state["qk_query"] = (0, int(st.session_state["qk_query_pos"]))

    st.number_input(t("Query position"), 0, n_q - 1, key="qk_query_pos", on_change=_on_pos,
                    help=t("The query whose top {k} keys are ringed; the last position is the one whose output "
                           "predicts the next token.", k=FQ.TOP_K))
write_query(qk_kind=kind, layer=layer, head=head, color=color,
                   query=f"{picked[0]}.{picked[1]}" if picked else None)


def _on_click() -> None:
    """A clicked query becomes the picked one (a click on a key keeps the current pick)."""
    state = st.session_state.get("qk_fig") or {}
    for p in (state.get("selection") or {}).get("points") or []:
        cd = p.get("customdata") if isinstance(p, dict) else None
        if cd:
            i = int(cd[0])
            if 0 <= i < len(m.kind) and m.kind[i] == "query":
                st.session_state["qk_query"] = (int(m.sentence[i]), int(m.position[i]))
                return


selected = m.index("query", *picked) if picked else None
info = batch.desc["attention"][module]
title = t("{module} · head {head} · {q} queries, {k} keys", module=F.module_title(module, {"model": batch.desc}),
          head=head, q=m.n_query, k=len(m.kind) - m.n_query)
if info.get("n_kv_heads", n_heads) != n_heads:
    title += t(" (K/V head {kv})", kv=m.kv_head)
fig = FQ.qk_figure(m, batch.labels, color, selected, title=title, max_points=FQ.MAX_POINTS if long_prompt else None)
elapsed = time.perf_counter() - t0
show_figure(fig, key="qk_fig", filename=f"{sel.name}-{module}-head{head}-qk", on_select=_on_click,
                   selection_mode="points")
if long_prompt:
    runs = FQ.query_runs(m.n_query)
    n_runs = sum(r.stop - r.start for r in runs)
    stride = FQ.point_stride(m, FQ.MAX_POINTS)
    if stride > 1:
        st.caption(t("{n} tokens: the picture draws the query and key of one position in {s} ({d} of {all} "
                     "points); the projection, the top keys and clarity use them all.", n=f"{m.n_query:,}", s=stride,
                     d=f"{int((m.position % stride == 0).sum()):,}", all=f"{len(m.kind):,}"))
    if n_runs < m.n_query:
        st.caption(t("Clarity on a long prompt is measured on {q} queries: {r} runs of {k} consecutive positions "
                     "spread over the text.", q=n_runs, r=len(runs), k=runs[0].stop - runs[0].start))
    clarity, chance = m.clarity_rows(runs)
else:
    clarity, chance = m.clarity()
st.caption(t("Circles are queries, diamonds keys; hover for the token and its input. Click a query: its top {k} "
             "keys by the head's real weights are ringed. Clarity of this head: {c} of each query's top {k} keys "
             "are among its {k} nearest keys in the picture (chance: {ch}). Scale a = {a}; the axes hold {ex} of "
             "the variance.", k=FQ.TOP_K, c=F.num(clarity, 2), ch=F.num(chance, 2), a=F.num(m.scale, 3),
             ex=f"{float(m.explained.sum()):.0%}"))
if selected is None:
    st.info(t("Click a query (a circle) to see which keys it attends to most."), icon="👆")
else:
    s, p = picked
    q_tok = m.token[selected]
    rows = [{t("key"): F.show_token(m.token[i]), t("position"): int(m.position[i]), t("weight"): F.num(w)}
            for i, w in m.top_keys(selected)]
    st.markdown(t("Query “{tok}” (position {p}) of input {s}: “{text}”", tok=F.show_token(q_tok), p=p, s=s,
                  text=md_escape(batch.labels[s][:200])))
    st.dataframe(rows, hide_index=True)

# ---------------------------------------------------------------- which heads look clear

st.subheader(t("Which heads look clear"))
with st.spinner(t("Projecting every head…")):
    rows, ch = _clarity(sel.name, batch_key, KIND_OF[kind], batch, id(batch))


c1, c2 = st.columns([2, 1])
with c1:
    # A heatmap click is not reported by on_select (see viz/pages/llm.py): the heads open from the links.
    show_figure(FQ.clarity_figure(rows, len(modules), n_heads, ch, layer, head), key="qk_clarity_fig")
with c2:
    st.caption(t("Clarity: the share of each query's top {k} keys (by the real weights) that are also its {k} "
                 "nearest keys in the head's map (hover a cell for its number). The clearest, one click away:",
                 k=FQ.TOP_K))
    for _, li, h, c in rows[:8]:
        st.page_link("viz/pages/qk.py", label=t("layer {l} · head {h}: {c}", l=li, h=h, c=F.num(c, 2)),
                     query_params={"checkpoint": sel.name, "qk_kind": kind, "layer": li, "head": h, "color": color,
                                   **({"batch": batch_id} if is_lm or batch_id != "sentences" else {})})

if is_lm and batch_id != "prompt":
    what, li, h, score, share, chance_p, count = _structure(sel.name, batch_key, batch, id(batch))
    if what == "prev":
        head_txt = t("The strongest previous-token head on these sentences is layer {l} head {h} (score {s}: its "
                     "mean weight on the token just before).", l=li, h=h, s=F.num(score, 2))
        rel = t("the previous token's key")
    else:
        head_txt = t("The strongest induction head on the repeated random tokens is layer {l} head {h} (score {s}: "
                     "its mean weight, in the second copy, on the token after the earlier copy).", l=li, h=h,
                     s=F.num(score, 2))
        rel = t("the key of the token after the earlier copy")
    if share == share and share >= 0.5 and share >= 3 * chance_p:
        verdict = t("Its map shows the structure: for {share} of its {n} queries the nearest key in the picture is "
                    "{rel} (chance: {chance}).", share=f"{share:.0%}", n=count, rel=rel, chance=f"{chance_p:.0%}")
    else:
        verdict = t("Its map does not show the structure in 2-D: only for {share} of its {n} queries is the nearest "
                    "key {rel} (chance: {chance}).", share=f"{share:.0%}" if share == share else "–", n=count,
                    rel=rel, chance=f"{chance_p:.0%}" if chance_p == chance_p else "–")
    st.markdown(head_txt + " " + verdict)
    st.page_link("viz/pages/qk.py", label=t("Open layer {l} head {h}", l=li, h=h), icon=":material/scatter_plot:",
                 query_params={"checkpoint": sel.name, "qk_kind": "dec", "layer": li, "head": h, "color": "position",
                               "batch": batch_id})
st.caption(t("This picture took {ms} ms of server time to build.", ms=f"{elapsed * 1000:.0f}"))
