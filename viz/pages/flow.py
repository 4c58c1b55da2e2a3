"""Why this token? Attention weights, norm-based attention, rollout and information-flow routes side by side
on one prediction, each judged against the causal effect of removing a token (issue 25 §2).

Works on every model the sidebar offers: a language model (the next token, or any position), MiniLM (a
chosen token's final vector) and the toy translators (one target word; their cross-attention alignment
beside the routes through the encoder). Every number comes from model/analysis/flow.py; this page draws it.
State in the URL: ?pos= (position), ?tau= (pruning threshold), ?set= (prompt set of the agreement table).
"""

from __future__ import annotations

import math
import time

import streamlit as st

from model.analysis import flow as FL
from viz.figures import flow as FF
from viz.figures.attention import num
from viz.i18n import N_, current_lang, option_labels, t
from viz.ui import lm_models
from viz.ui.models import load_ckpt, session_models
from viz.ui.progress import ProgressBar, estimate_text
from viz.ui.render import show_error, show_figure
from viz.ui.sidebar import require_own_family, selection
from viz.ui.state import MAX_URL_TEXT, clamp_state, int_in, seed_from_query, write_query
from viz.ui.text import text_problems

LLM_PAGE = "viz/pages/llm.py"
ATTENTION_PAGE = "viz/pages/attention.py"
WHY_KEYS = ("_why", "_why_q", "_why_k", "_why_vs")  # the "Why here?" panel's (viz/ui/why_panel.py), seeded from `why=`
HEAD_KEYS = {LLM_PAGE: ("llm_view", "llm_layer", "llm_head", "llm_prompt",  # the target page's remembered widgets:
                        *(f"llm{k}" for k in WHY_KEYS)),  # dropped so the URL wins
             ATTENTION_PAGE: ("attn_kind", "attn_layer", "attn_head", "attn_view", *(f"attn{k}" for k in WHY_KEYS))}
KIND_IDS = {"encoder_self": "enc", "decoder_self": "dec", "cross": "cross"}  # the Attention page's ?attn_kind=
TAUS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.08, 0.1, 0.15, 0.2, 0.3)
MAX_EDGES_DRAWN = 1500  # a lower tau on a long prompt: the page asks for a higher one
MAX_LINKS = 8
LINK_COLUMNS = 2  # the strongest edges' links side by side: four columns cut their labels at 1600 px (issue 38 §5)
METRICS = {"encoder": N_("cosine distance of the chosen token's final vector"),
           "contrast": N_("logit difference (target − contrast)"),
           "logprob": N_("log-probability of the target token")}
SETS = {"ioi": N_("12 IOI prompts (logit difference IO − S)"),
        "induction": N_("10 induction sequences (log-prob of the copied token)"),
        "animal": N_("“The animal didn't cross the street because it was too tired”")}

st.title(t("Why this token?"))
st.caption(t("Attention weights are the picture every tool draws, but a head can look hard at a token whose value "
             "vector is nearly zero, and the residual stream carries a token past every layer. Here one prediction "
             "is explained by up to five methods — the last layer's weights, norm-based attention, attention "
             "rollout, attention flow (short texts only) and information-flow routes — and each is checked against "
             "the causal answer: what happens to the prediction when a token's value vectors are zeroed in every "
             "layer."))
sel = require_own_family(selection())  # norm-based flow reads v, z and the norms: not given via transformers
if sel is None:
    st.stop()
lang = current_lang()
text = sel.text
problem = text_problems(text)
if problem:
    show_error(problem)
    st.stop()


def _model(name: str):
    """The object the analyses read: a LanguageModel / PretrainedEncoder, or a toy Checkpoint."""
    ck = load_ckpt(name)
    return ck.obj if isinstance(ck, lm_models.RealModel) else ck


def _kind(obj) -> str:
    if hasattr(obj, "translate"):
        return "seq2seq"
    return "lm" if obj.model.describe()["family"] == "decoder_lm" else "encoder"


FLOW_MAX_TOKENS = 128  # a language model's prompt up to this long: the causal check runs T forwards of T tokens


def _subject(name: str, text: str, target: str | None, position: int | None):
    obj = _model(name)
    if _kind(obj) == "seq2seq":
        return FL.prepare(obj, text, position=position, output=target)
    return FL.prepare(obj, text, position=position)


def _analysis(name: str, text: str, target: str | None, position: int | None):
    """(subject, trace, routes, comparison): one forward pass for the routes, one batch per token for the effect."""
    s = _subject(name, text, target, position)
    trace = FL.capture(s)
    routes = FL.routes(s, trace)
    cmp = FL.compare(s, flow=True, trace=trace, routes_=routes)
    return s, trace, routes, cmp


@st.cache_resource(max_entries=8, ttl=3600, show_spinner=False)
def _shared_analysis(name: str, text: str, target: str | None, position: int | None):
    return _analysis(name, text, target, position)


def analysis(name: str, text: str, target: str | None, position: int | None):
    if name in session_models():  # a model trained in this session: never in a process-wide cache
        return _analysis(name, text, target, position)
    return _shared_analysis(name, text, target, position)


PACE_FRESH_S = 600  # a table's measured pace counts as "this server at this moment" for 10 minutes


@st.cache_resource(show_spinner=False)
def _pace() -> dict:
    """model -> (seconds per prompt of its last agreement table on this server, when it was measured)."""
    return {}


def table_estimate(name: str, n: int) -> float | None:
    """n prompts at the pace this server measured on its last table for this model, if recent; else None (the
    bar then says the time is not measured yet, and tells the run's own pace as it goes)."""
    got = _pace().get(name)
    if got is None or time.time() - got[1] > PACE_FRESH_S:
        return None
    return got[0] * n


@st.cache_resource(ttl=3600, show_spinner=False)
def _tables() -> dict:
    """(model, prompt set) -> the agreement summary, shared (read-only) by every session."""
    return {}


def table(name: str, which: str):
    """(summary, lead) of the agreement table on a prompt set: the mean and spread of each method's rho, and
    whether one method clearly leads (model.analysis.claims: a paired sign test over the prompts)."""
    store = _tables()
    if (name, which) not in store:
        lm = _model(name)
        prompts = {"ioi": lambda: FL.ioi_set(lm, 12), "induction": lambda: FL.induction_set(lm, 10),
                   "animal": lambda: [FL.Prompt(FL.ANIMAL)]}[which]()
        bar = ProgressBar(t("Running the prompts"), table_estimate(name, len(prompts)))
        t0 = time.perf_counter()
        res = FL.agreement_table(lm, prompts, progress=bar)
        bar.close()
        _pace()[name] = ((time.perf_counter() - t0) / len(prompts), time.time())
        if len(store) >= 8:
            store.pop(next(iter(store)))
        store[(name, which)] = (res.summary(), res.lead())
    return store[(name, which)]


def readable(tokens, obj) -> list[str]:
    if isinstance(load_ckpt(sel.name), lm_models.RealModel) and _kind(obj) == "lm":
        return [lm_models.readable(x, lm_models._byte_level(obj)) for x in tokens]
    return list(tokens)


# ---------------------------------------------------------------- choose the prediction

try:
    obj = _model(sel.name)
    kind = _kind(obj)
    if kind == "lm" and isinstance(load_ckpt(sel.name), lm_models.RealModel):  # too long: said before the forward
        from viz.ui.long_limits import check_length, costly_cut

        text = costly_cut(obj, text, FLOW_MAX_TOKENS,
                          t("The causal check zeroes each token's values in turn: one forward pass per token."))
        check_length(obj, text, FL.CAPTURE)
    with st.spinner(t("Running the model…")):
        base = _subject(sel.name, text, sel.target, None)
except ValueError as e:
    show_error(e, t("Shorten or change the text in the sidebar."))
    st.stop()
out_toks = readable(base.tokens[base.out_side], obj)
n_pos = len(out_toks)
what = {"lm": t("The position whose next token is explained"),
        "seq2seq": t("The target word explained (the decoder position that writes it)"),
        "encoder": t("The token whose final vector is explained")}[kind]
seed_from_query("flow_pos", "pos", base.position, int, int_in(0, n_pos - 1))
clamp_state("flow_pos", 0, n_pos - 1, "pos")  # said only when the URL carried this value (a link's pos)
if kind == "seq2seq":
    nxt = [*base.tokens["tgt_tokens"][1:], "[EOS]"]
    labels = [f"{i}: {nxt[i]}" for i in range(n_pos)]
else:
    labels = [f"{i}: {tok}" for i, tok in enumerate(out_toks)]
position = st.selectbox(what, range(n_pos), key="flow_pos", format_func=option_labels(range(n_pos), labels.__getitem__))
write_query(pos=position)
try:
    with st.spinner(t("Tracing where the prediction came from…")):
        s, trace, routes, cmp = analysis(sel.name, text, sel.target, int(position))
except ValueError as e:
    show_error(e, t("Shorten or change the text in the sidebar."))
    st.stop()
tokens = {side: readable(toks, obj) for side, toks in s.tokens.items()}
target = lm_models.readable(s.target_token, lm_models._byte_level(obj)) if kind == "lm" else s.target_token
metric_id = "encoder" if kind == "encoder" else ("contrast" if s.contrast is not None else "logprob")
if kind == "lm":
    st.markdown(t("Explaining the prediction **“{tok}”** after “{prev}” (position {p}); measured: {metric}.",
                  tok=target, prev=tokens["tgt_tokens"][s.position], p=s.position, metric=t(METRICS[metric_id])))
elif kind == "seq2seq":
    st.markdown(t("Explaining the target word **“{tok}”** (decoder position {p}); measured: {metric}.",
                  tok=target, p=s.position, metric=t(METRICS[metric_id])))
else:
    st.markdown(t("Explaining the final vector of **“{tok}”** (position {p}); measured: {metric}.",
                  tok=tokens["src_tokens"][s.position], p=s.position, metric=t(METRICS[metric_id])))

# ---------------------------------------------------------------- the routes graph

st.subheader(t("Information-flow routes"))
st.caption(t("Ferrando & Voita (2024): every residual sum gives each of its terms — the residual, each attention "
             "head's share from each token, the FFN — a contribution max(0, ‖y‖₁ − ‖y − term‖₁), normalised so the "
             "contributions into a node sum to 1. Edges under τ are pruned; what remains reachable from the "
             "prediction (red) is drawn. Click an attention edge (a blue dot) to open that head, a node to see "
             "what its block wrote."))
_blocks = s.module.describe().get("blocks", {})
if _blocks.get("parallel_residual"):  # the wiring the terms come from (model/core/residual.py), said once
    st.caption(t("In this model attention and the FFN read the same input and join the stream in one sum, so each "
                 "layer is one row of nodes whose terms are the residual, every head's share from each token and "
                 "the FFN."))
elif _blocks.get("norm_position") in ("sandwich", "post"):
    st.caption(t("In this model a norm follows each sublayer before its output joins the stream: each term is taken "
                 "as it enters the stream, through that norm with its scale frozen at its value on this run (the "
                 "terms then add up to the update exactly)."))
seed_from_query("flow_tau", "tau", 0.04, float, lambda v: v in TAUS)
tau = st.select_slider(t("Threshold τ"), TAUS, key="flow_tau")
write_query(tau=tau)
edges = routes.edges(tau)
total = routes.n_edges()
if len(edges) > MAX_EDGES_DRAWN:
    st.info(t("At τ = {tau} the graph keeps {n} edges, too many to draw; raise τ.", tau=tau, n=f"{len(edges):,}"))
    edges = []
heads = sum(e["kind"] == "head" for e in edges)
st.caption(t("{n} of {total} edges have a contribution above τ = {tau} and are reachable from the prediction "
             "({h} through attention heads).", n=f"{len(edges):,}", total=f"{total:,}", tau=tau, h=heads))


def head_query(e: dict) -> tuple[str, dict]:
    """The page and URL that open the head of an attention edge, with "Why here?" open on the edge's cell: its query
    is the edge's destination position, its key the source position (`why=Q,K`)."""
    info = s.module.describe()["attention"][e["module"]]
    why = f"{e['dst'][2]},{e['src'][2]}"
    if kind == "lm":
        q = {"checkpoint": sel.name, "view": "heads", "layer": info["layer"], "head": e["head"], "lang": lang,
             "why": why}
        if len(text) <= MAX_URL_TEXT:
            q["prompt"] = text
        return LLM_PAGE, q
    q = {"checkpoint": sel.name, "attn_kind": KIND_IDS[info["kind"]], "layer": info["layer"], "head": e["head"],
         "lang": lang, "why": why}
    if len(text) <= MAX_URL_TEXT:
        q["text"] = text
    if sel.target:
        q["target"] = sel.target
    return ATTENTION_PAGE, q


event = show_figure(FF.routes_figure(routes, edges, tokens, title=t("Routes to “{tok}”", tok=target)),
                    key="flow_routes", filename=f"{sel.name}-routes", on_select="rerun", selection_mode="points")
points = (event or {}).get("selection", {}).get("points", []) if event else []
picked = next((p["customdata"] for p in points if p.get("customdata")), None)
if picked and picked[0] == "edge" and 0 <= int(picked[1]) < len(edges):
    e = edges[int(picked[1])]
    if e["kind"] == "head":
        page, q = head_query(e)
        for key in HEAD_KEYS[page]:
            st.session_state.pop(key, None)
        st.switch_page(page, query_params={k: str(v) for k, v in q.items()})
    st.info(t("Layer {l}: the {k} carries {c} of the node above it.", l=e["layer"],
              k=t("residual") if e["kind"] == "resid" else t("FFN"), c=num(e["weight"])))
elif picked and picked[0] == "node":
    stack, row, pos = picked[1], int(picked[2]), int(picked[3])
    wrote = FL.block_tokens(s, trace, stack, row, pos)
    label = FF.row_label(routes, stack, row)
    if wrote is None:
        st.info(t("{row}: this node has no vocabulary to read its update in (an embedding, an encoder, or a model "
                  "without an unembedding).", row=label))
    else:
        up, down = wrote
        piece = lm_models.model_readable(obj) if kind == "lm" else str
        shown = [", ".join(f"“{piece(a)}” ({num(v, 2)})" for a, v in side_) for side_ in (up, down)]
        st.markdown(t("**{row}, position {p}** — its update, read through the unembedding, promotes {up} and "
                      "suppresses {down}.", row=label, p=pos, up=shown[0], down=shown[1]))

strongest = sorted((e for e in edges if e["kind"] == "head"), key=lambda e: -e["weight"])[:MAX_LINKS]
if strongest:
    st.caption(t("The strongest attention edges (open one):"))
    cols = st.columns(LINK_COLUMNS)
    side = {st_: routes.desc["stacks"][st_]["tokens"] for st_ in routes.steps}
    for i, e in enumerate(strongest):
        page, q = head_query(e)
        (s0, _, p0), (s1, _, p1) = e["src"], e["dst"]
        label = t("layer {l} · head {h}: “{a}” → “{b}” ({c})", l=e["layer"], h=e["head"], a=tokens[side[s0]][p0],
                  b=tokens[side[s1]][p1], c=num(e["weight"], 2))
        cols[i % LINK_COLUMNS].page_link(page, label=label, icon=":material/grid_view:",
                                         query_params={k: str(v) for k, v in q.items()})

# ---------------------------------------------------------------- four methods vs the causal effect

shown = [m for m in (*FL.METHODS, "flow") if m in cmp.methods]
rho_s = {m: FF.rho_text(cmp.rho[m]) for m in cmp.methods}  # each rho formatted once: figure, table, sentence
st.subheader(t("{n} answers, one causal check", n=len(shown)))
st.caption(t("Each method's importance of every source token, beside the causal effect: the change of the measured "
             "output when that token's value vectors are zeroed in every attention layer that reads it. ρ is "
             "Spearman's rank correlation with the effect (1 = the same order)."))
show_figure(FF.methods_figure(cmp, shown, tokens=[tokens[s.source_side][i] for i in s.sources]),
            key="flow_methods", filename=f"{sel.name}-methods")
names = FF.method_names()
best, r1, second, r2 = cmp.best()
if best:  # one prompt: which rho is highest, said as a fact about this prompt, never as a lead over methods
    if second is None or r2 is None or math.isnan(r2):
        st.markdown(t("On this prompt **{m}** has the highest ρ with the causal effect ({r}).", m=names[best],
                      r=rho_s[best]))
    else:
        tail = "" if "raw" in (best, second) or "raw" not in rho_s else t(
            "; the last layer's raw weights reach {raw}", raw=rho_s["raw"])
        st.markdown(t("On this prompt **{m}** has the highest ρ with the causal effect ({r}), then {m2} ({r2}){tail}. "
                      "One prompt is an anecdote: the prompt set below says whether an order holds.",
                      m=names[best], r=rho_s[best], m2=names[second], r2=rho_s[second], tail=tail))
else:
    st.markdown(t("The causal effect is the same for every token here, so no ranking can agree with it."))
rows = [{t("method"): names[m], "ρ": rho_s[m], t("top-{k} overlap", k=cmp.k): num(cmp.top_k[m], 2)}
        for m in cmp.methods]
st.dataframe(rows, hide_index=True)
if "flow" in cmp.notes:
    st.caption(t("Attention flow is left out here: {why}",
                 why=t("the translator has two stacks") if kind == "seq2seq" else t(
                     "it needs one max-flow per token, and this text is longer than the limit of {n} nodes "
                     "(tokens × layers).", n=FL.FLOW_MAX_NODES)))

# ---------------------------------------------------------------- the translator: alignment vs routes

if kind == "seq2seq":
    st.subheader(t("Cross-attention alignment vs routes"))
    st.caption(t("The cross-attention row of “{w}” in each decoder layer (mean over heads) is what an alignment "
                 "picture draws; the routes follow every path back to the source tokens' embeddings, through the "
                 "encoder's own mixing.", w=target))
    al = FL.cross_alignment(s, trace)
    show_figure(FF.alignment_figure(al, tokens["src_tokens"], target), key="flow_alignment",
                filename=f"{sel.name}-alignment")
    last = [k for k in al if k != "routes"][-1]
    st.markdown(t("Against the causal effect: the last layer's cross-attention ρ = {a}, the routes ρ = {b}.",
                  a=num(FL.spearman(al[last], cmp.effect), 2), b=num(FL.spearman(al["routes"], cmp.effect), 2)))

# ---------------------------------------------------------------- over a prompt set

if kind == "lm":
    st.subheader(t("Over a set of prompts"))
    st.caption(t("One prompt is an anecdote. The same comparison over a prompt set gives each method's mean ρ and "
                 "its spread (the table bench/flow.py prints). A method is said to lead only when it is ahead of "
                 "every other method prompt by prompt under a two-sided sign test (p below 0.05 divided by the "
                 "number of comparisons)."))
    seed_from_query("flow_set", "set", "ioi", valid=lambda v: v in SETS)
    which = st.segmented_control(t("Prompt set"), list(SETS), key="flow_set", required=True,
                                 format_func=option_labels(list(SETS), lambda v: t(SETS[v]))) or "ioi"
    write_query(set=which)
    set_metric = {"ioi": "contrast", "induction": "logprob", "animal": "logprob"}[which]
    if set_metric != metric_id:
        st.caption(t("This set measures the {set}, the prompt above the {here}: an IOI prompt is defined by its two "
                     "names, so the set scores the right name against the wrong one; a prompt typed above has no "
                     "second name to contrast, so it scores the log-probability of the predicted token. The ρ "
                     "values of the two are not the same quantity.", set=t(METRICS[set_metric]),
                     here=t(METRICS[metric_id])))
    n_set = {"ioi": 12, "induction": 10, "animal": 1}[which]
    on = st.toggle(t("Run the agreement table"), key="flow_table_on")
    if not on and (sel.name, which) not in _tables():  # the label stays fixed (a toggle's label is its identity)
        st.caption(t("{n} prompts, one causal check each: {estimate}.", n=n_set,
                     estimate=estimate_text(table_estimate(sel.name, n_set))))
    if on:
        try:
            summ, lead = table(sel.name, which)
        except ValueError as e:
            show_error(e)
            st.stop()
        show_figure(FF.agreement_figure({t(SETS[which]): summ}), key="flow_agreement",
                    filename=f"{sel.name}-agreement")
        mean_s = {m: FF.rho_text(v["mean"]) for m, v in summ.items()}  # formatted once: figure, table, sentence
        st.dataframe([{t("method"): names[m], t("mean ρ"): mean_s[m], t("std"): num(v["std"], 2),
                       t("top-3 overlap"): num(v["top_k"], 2), t("prompts"): v["n"]} for m, v in summ.items()],
                     hide_index=True)
        st.markdown(FF.lead_sentence(lead, mean_s))
