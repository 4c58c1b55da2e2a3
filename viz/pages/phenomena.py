"""Attention phenomena: what an LLM's heads do, each found live by its published recipe (issue 19 §3).

Six views (`?phen=`): attention sinks, previous- and duplicate-token heads, induction heads, IOI ("who
gave the drink?"), a needle in a haystack (issue 24 §4) and why these heads look there (issue 39 §4: their scores
split into sources, viz/ui/why_circuits_view.py). Each says what the phenomenon is in 2–3
sentences, states its number and the threshold used, outlines the heads it found and links each one to the
Language model page at that layer and head, and has a "try it". The numbers come from model/analysis
(phenomena.py, ioi.py, patching.py, lessons_llm.py, long.py); this page only draws them. Heavy results are
cached per (model, input), bounded.

A sidebar prompt too long to capture every attention map (issue 24 §3; SmolLM2 past ~700 tokens) gets its per-head
scores tile by tile from its lazy trace (long.head_statistics_tiled: head_statistics's numbers, never 30 x H x T x T
at once); blocking token 0 runs the model twice on it when asked (phenomena.sink_effect_long), and the L x H runs
of "every head alone" are offered only up to the length whose maps fit.
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from model.analysis import long as LG
from model.analysis import phenomena as PH
from model.analysis import shared as AN
from model.core import recorder
from model.core.trace import LazyTrace
from viz.figures import attention as F
from viz.figures import long as FLONG
from viz.figures import phenomena as FPH
from viz.i18n import N_, current_lang, option_labels, t
from viz.ui import why_circuits_view
from viz.ui.models import get_trace, load_ckpt
from viz.ui.progress import ProgressBar, estimate_text
from viz.ui.render import show_error, show_figure
from viz.ui.sidebar import require
from viz.ui.state import MAX_URL_TEXT, clamp_state, int_in, seed_from_query, write_query
from viz.ui.text import text_problems

VIEWS = {"sinks": N_("Attention sinks"), "patterns": N_("Previous- and duplicate-token heads"),
         "induction": N_("Induction heads"), "ioi": N_("Who gave the drink? (IOI)"),
         "needle": N_("A needle in a haystack"), "why": N_("Why do these heads look there?")}
LLM_PAGE = "viz/pages/llm.py"
MAX_LINKS = 8  # found heads linked per detector (the map outlines them all)
SOURCES = {"random": N_("[BOS] + 50 random tokens, repeated"), "prompt": N_("the sidebar's prompt")}
MODES = {"zero": N_("zero"), "mean": N_("mean over positions")}
PROMPT_STATS = ("sink", "previous_token", "duplicate_token")  # the per-head scores shown on the sidebar's prompt

st.title(t("Attention phenomena"))
st.caption(t("What the heads of a real language model do, found live by the recipes of the papers that "
             "named them. Each result gives its number and the threshold it used, outlines the heads it found, "
             "and links every one of them to the Language model page."))
sel = require("lm")
rm = sel.ckpt
lm = rm.obj
# the ablations knock out k heads and as many random others as the control: k is at most half the heads
MAX_K = max(1, min(10, lm.model.cfg.n_layers * lm.model.cfg.n_heads // 2))
lang = current_lang()


# ---------------------------------------------------------------- cached computations (read-only results)


def _lm(name: str):
    return load_ckpt(name).obj


@st.cache_resource(max_entries=8, ttl=3600, show_spinner=False)
def _sinks(name: str, text: str):
    return AN.sink_effect(_lm(name), text)  # shared with lesson 12 (model/analysis/shared.py)


def _sinks_per_head(name: str, text: str, _progress=None):  # cached by AN (not st.cache_*: its bar draws)
    return AN.sinks_per_head(_lm(name), text, progress=_progress)


@st.cache_resource(max_entries=16, ttl=3600, show_spinner=False)
def _block(name: str, text: str, heads: tuple | None):
    return AN.block_sink(_lm(name), text, heads)


@st.cache_resource(max_entries=8, ttl=3600, show_spinner=False)
def _prompt_stats(name: str, text: str):
    trace = get_trace(name, text)
    if isinstance(trace, LazyTrace):  # a long prompt: every head's map, tile by tile (never 30 x H x T x T at once)
        # the same numbers as head_statistics (model/analysis/long.py), only those this page shows: 2.5x faster
        return LG.head_statistics_tiled(trace, stats=PROMPT_STATS)
    return PH.head_statistics(trace)


@st.cache_resource(max_entries=4, ttl=3600, show_spinner=False)
def _sinks_long(name: str, text: str):
    m = _lm(name)
    share = _prompt_stats(name, text)["sink"]
    return AN.cached("sink_effect_long", m, (text,), lambda: PH.sink_effect_long(m, text, share))


@st.cache_resource(max_entries=8, ttl=3600, show_spinner=False)
def _induction(name: str, n: int, seed: int):
    return AN.induction(_lm(name), n, seed)  # shared with lesson 13


@st.cache_resource(max_entries=8, ttl=3600, show_spinner=False)
def _induction_ablation(name: str, n: int, seed: int, k: int, mode: str):
    return AN.induction_ablation(_lm(name), n, seed, k, mode)


@st.cache_resource(max_entries=2, ttl=3600, show_spinner=False)
def _ioi(name: str):
    return AN.ioi(_lm(name))  # shared with lesson 14


@st.cache_resource(max_entries=8, ttl=3600, show_spinner=False)
def _ioi_ablation(name: str, k: int, mode: str):
    return AN.ioi_ablation(_lm(name), k, mode, n_controls=2)


@st.cache_resource(max_entries=8, ttl=3600, show_spinner=False)
def _patching(name: str, i: int, _progress=None):
    return AN.patching(_lm(name), i, progress=_progress)


# ---------------------------------------------------------------- shared pieces


def piece(i: int) -> str:
    """A token id as readable text (␣ for a space)."""
    from viz.ui import lm_models

    return lm_models.readable(lm.tokens([int(i)])[0], lm_models._byte_level(lm))


def head_list(heads, limit: int = MAX_LINKS, tl=None) -> str:
    """"L16 H0 (0.906)", with TransformerLens's number on the same input beside ours when `tl` ([L, H]) is given."""
    if tl is None:
        shown = ", ".join(t("L{l} H{h} ({v})", l=layer, h=head, v=F.num(v)) for layer, head, v in heads[:limit])
    else:
        shown = ", ".join(t("L{l} H{h} ({v}; TransformerLens {tl})", l=layer, h=head, v=F.num(v),
                            tl=F.num(float(tl[layer, head]))) for layer, head, v in heads[:limit])
    return shown + (t(" and {n} more", n=len(heads) - limit) if len(heads) > limit else "")


def head_links(heads, prompt: str | None, stat: str | None = None, repeat: tuple[int, int] | None = None) -> None:
    """Each head one click away: the Language model page at that layer and head, on the input that found it:
    a prompt as text, or the repeated random tokens as what regenerates the same ids (`rep=n:seed`: the
    Language model page calls phenomena.induction_sequence with them), never their text re-tokenized."""
    if not heads:
        return
    cols = st.columns(4)
    for i, (layer, head, v) in enumerate(heads[:MAX_LINKS]):
        query = {"checkpoint": sel.name, "view": "heads", "layer": layer, "head": head, "lang": lang}
        if stat:
            query["stat"] = stat
        if repeat is not None:
            query["rep"] = f"{repeat[0]}:{repeat[1]}"
        elif len(prompt) <= MAX_URL_TEXT:
            query["prompt"] = prompt
        cols[i % 4].page_link(LLM_PAGE, label=t("layer {l} · head {h}: {v}", l=layer, h=head, v=F.num(v)),
                              icon=":material/grid_view:", query_params={k: str(x) for k, x in query.items()})


def found_pairs(heads) -> list[tuple[int, int]]:
    return [(layer, head) for layer, head, _ in heads]


def recipe(scores, what: str) -> None:
    st.caption(t("Recipe: {recipe}. Threshold: {th}.", recipe=t(what), th=F.num(scores.threshold)))


def try_it(text: str) -> None:
    st.info(t("**Try it:** {task}", task=text), icon="🧪")


def guarded(fn, *args):
    """Run an analysis; a bad input (too short, no names in the vocabulary...) is a message, not a traceback."""
    try:
        return fn(*args)
    except ValueError as e:
        show_error(e)
        return None


def maps_fit(text: str) -> bool:
    """Whether every attention map of `text` fits this server's capture budget (what sink_effect captures);
    a longer prompt's sink shares come from the tiled statistics of its lazy trace instead."""
    return lm.trace_bytes(PH.as_ids(lm, text).shape[1], names="*.self_attn.weights") <= recorder.DEFAULT_BUDGET_BYTES


def maps_fit_up_to() -> int:
    return lm.max_tokens_within(recorder.DEFAULT_BUDGET_BYTES, names="*.self_attn.weights")


def prompt_or_stop() -> str:
    text = sel.text
    problem = text_problems(text)
    if problem:
        show_error(problem)
        st.stop()
    return text


# ---------------------------------------------------------------- attention sinks

SINK_RECIPE = N_("mean attention on token 0 over query rows 1…T−1 (row 0 can see only token 0)")
PREV_RECIPE = N_("our score: a head's attention on the cell just before the query, over the rows that have one (1 "
                 "= a perfect head on any input). TransformerLens's head detector (detect_head, “mul”) divides the "
                 "same attention by all T rows; its number is beside ours")
DUP_RECIPE = N_("our score: a head's attention on earlier copies of the query's token, over the rows that have one "
                "(1 = a perfect head on any input). TransformerLens's head detector (detect_head, “mul”) divides the "
                "same attention by all T rows; its number is beside ours")
IND_RECIPE = N_("mean attention from each position i of the second copy to i − (n − 1), the token that followed "
                "i's first occurrence (Olsson et al. 2022). TransformerLens's head detector (detect_head, “mul”) "
                "divides the attention on such cells by all T rows; its number is beside ours")


def sinks_view() -> None:
    text = prompt_or_stop()
    st.markdown(t("Many heads put most of their attention on the very first token, whatever it is. Softmax must "
                  "give every row weights that sum to 1, so a head with nothing to read parks its attention on a "
                  "token every query can see, and token 0 is the only one. Xiao et al. found these *attention "
                  "sinks* and showed that a streaming model must keep token 0 in its cache (“Efficient Streaming "
                  "Language Models with Attention Sinks”, 2023)."))
    fits = guarded(maps_fit, text)
    if fits is None:
        return
    n_tok = int(PH.as_ids(lm, text).shape[1])
    if fits:
        with st.spinner(t("Running the model…")):
            eff = guarded(_sinks, sel.name, text)
        if eff is None:
            return
        share, mean_share = eff.share, eff.mean_share
    else:  # a long prompt: the shares from its lazy trace, tile by tile; the blocked runs only when asked
        eff = None
        with st.spinner(t("Running the model on {n} tokens…", n=f"{n_tok:,}")):
            stats = guarded(_prompt_stats, sel.name, text)
        if stats is None:
            return
        share = stats["sink"]
        mean_share = float(np.mean(share.scores))  # sink_effect's mean_share
    recipe(share, SINK_RECIPE)
    st.markdown(t("On this prompt **{p} of all attention** (every head, every query row 1…T−1) lands on token 0 "
                  "(“{tok}”); **{k} of {n} heads** put at least {th} there.", p=f"{mean_share:.0%}",
                  tok=piece(PH.as_ids(lm, text)[0, 0]), k=len(share.heads), n=share.scores.size,
                  th=F.num(share.threshold)))
    show_figure(FPH.head_map(share.scores, t("share on token 0"), found_pairs(share.heads), zmax=1.0,
                                    title=t("Share of each head's attention on token 0 · outlined: ≥ {th}",
                                            th=F.num(share.threshold))), key="phen_sink_map")
    st.markdown(t("**The strongest sinks** (open one on the Language model page):"))
    head_links(share.top(MAX_LINKS), text, "sink")

    st.subheader(t("Block token 0"))
    st.caption(t("Hide token 0's key from every query that can see another token (softmax then gives it exactly "
                 "0), in one head or in every head, and compare the next token at the last position."))
    L, H = share.scores.shape
    seed_from_query("phen_sink_where", "sink_where", "all", valid=lambda v: v in ("all", "one"))
    where = st.segmented_control(t("Where"), ["all", "one"], key="phen_sink_where", required=True,
                                 format_func=option_labels(["all", "one"], lambda v: {
                                     "all": t("every head"), "one": t("one head")}[v])) or "all"
    write_query(sink_where=where)
    heads = None
    if where == "one":
        best = share.top(1)[0]
        seed_from_query("phen_sink_layer", "sink_layer", best[0], int, int_in(0, L - 1))
        seed_from_query("phen_sink_head", "sink_head", best[1], int, int_in(0, H - 1))
        clamp_state("phen_sink_layer", 0, L - 1)
        clamp_state("phen_sink_head", 0, H - 1)
        c1, c2 = st.columns(2)
        layer = c1.selectbox(t("Layer"), range(L), key="phen_sink_layer")
        head = c2.selectbox(t("Head"), range(H), key="phen_sink_head")
        write_query(sink_layer=layer, sink_head=head)
        heads = ((int(layer), int(head)),)
    else:
        write_query(sink_layer=None, sink_head=None)
    if eff is None and not st.toggle(t("Run the model with token 0 blocked (two runs on {n} tokens)", n=f"{n_tok:,}"),
                                     key="phen_sink_long_block"):
        try_it(t("type another prompt in the sidebar, even one that starts with a different word: the sink stays on "
                 "token 0, whatever token it is."))
        return
    if eff is None and heads is None:
        with st.spinner(t("Running the model on {n} tokens…", n=f"{n_tok:,}")):
            eff = guarded(_sinks_long, sel.name, text)
        if eff is None:
            return
    # every head: the block_sink inside sink_effect, the very number lesson 12 shows (one function, one input)
    b = eff.block if heads is None else guarded(_block, sel.name, text, heads)
    if b is None:
        return
    c1, c2, c3 = st.columns(3)
    c1.metric(t("Next token, intact"), f"“{piece(b.top_before)}”", t("p = {p}", p=F.num(b.p_before)),
              delta_color="off", delta_arrow="off")
    c2.metric(t("Next token, token 0 blocked"), f"“{piece(b.top_after)}”", t("p = {p}", p=F.num(b.p_after)),
              delta_color="off", delta_arrow="off")
    c3.metric(t("Logit of “{tok}”, intact → token 0 blocked", tok=piece(b.top_before)),
              f"{F.num(b.answer_logit_before)} → {F.num(b.answer_logit_after)}",
              F.num(b.answer_logit_after - b.answer_logit_before))
    if heads is None:
        st.markdown(t("Blocked everywhere, the answer {verdict}; the next-token distribution at the last position "
                      "(the token after the prompt) moves by KL = {kl} nats, and the mean next-token loss on the "
                      "prompt goes from {a} to {b}.",
                      verdict=t("changes") if b.changed else t("stays the same"), kl=F.num(b.kl),
                      a=F.num(eff.loss_before), b=F.num(eff.loss_after)))
    else:
        st.markdown(t("Blocked in layer {l} head {h} alone, the answer {verdict}; the next-token distribution at "
                      "the last position (the token after the prompt) moves by KL = {kl} nats.",
                      l=heads[0][0], h=heads[0][1],
                      verdict=t("changes") if b.changed else t("stays the same"), kl=F.num(b.kl)))
    if not fits:  # L x H runs of the whole prompt
        st.caption(t("Measuring every head alone takes {n} runs of the model: it is offered for prompts of up to "
                     "{k} tokens.", n=L * H, k=f"{maps_fit_up_to():,}"))
    elif st.toggle(t("Measure every head alone ({n} runs)", n=L * H), key="phen_sink_all",
                   help=t("Token 0 blocked in one head at a time, batched: {estimate} on this server.",
                          estimate=estimate_text(AN.estimate_seconds(L * H * n_tok, lm)))):
        bar = None if AN.is_cached("sinks_per_head", lm, text) else ProgressBar(
            t("Blocking token 0 in each head in turn"), AN.estimate_seconds(L * H * n_tok, lm))
        kl = _sinks_per_head(sel.name, text, bar)
        if bar is not None:
            bar.close()
        show_figure(FPH.head_map(kl, t("KL (nats)"), title=t(
            "Output change (KL at the last position) when token 0 is blocked in that head alone")),
            key="phen_sink_kl")
    try_it(t("type another prompt in the sidebar, even one that starts with a different word: the sink stays on "
             "token 0, whatever token it is."))


# ---------------------------------------------------------------- previous- and duplicate-token heads


def patterns_view() -> None:
    st.markdown(t("Some heads always look one token back (previous-token heads); others look at earlier copies of "
                  "the current token (duplicate-token heads). A head's pattern score is the share of its "
                  "attention on the pattern's cells, over the query rows that have such a cell: 1 = all of it."))
    seed_from_query("phen_pat_src", "pat_src", "random", valid=lambda v: v in SOURCES)
    src = st.segmented_control(t("Input"), list(SOURCES), key="phen_pat_src", required=True,
                               format_func=option_labels(list(SOURCES), lambda s: t(SOURCES[s]))) or "random"
    write_query(pat_src=src)
    repeat = None
    if src == "random":
        res = guarded(_induction, sel.name, 50, 0)
        if res is None:
            return
        stats, prompt, repeat = res.scores, None, (50, 0)
    else:
        text = prompt_or_stop()
        with st.spinner(t("Running the model…")):
            stats = guarded(_prompt_stats, sel.name, text)
        if stats is None:
            return
        prompt = text
    for key, heading, label, what, stat in (
            ("previous_token", N_("Previous-token heads"), N_("previous-token score"), PREV_RECIPE, "prev"),
            ("duplicate_token", N_("Duplicate-token heads"), N_("duplicate-token score"), DUP_RECIPE, "dup")):
        s = stats[key]
        st.subheader(t(heading))
        recipe(s, what)
        if not (s.scores == s.scores).any():
            st.info(t("This input repeats no token, so no head can show a duplicate-token score: choose the "
                      "repeated random tokens above."), icon="🔁")
            continue
        st.markdown(t("**{k} heads** score at least {th}: {heads}.", k=len(s.heads), th=F.num(s.threshold),
                      heads=head_list(s.heads, tl=s.tl_scores) if s.heads else t("none")))
        show_figure(FPH.head_map(s.scores, t(label), found_pairs(s.heads), zmax=1.0,
                                        title=t("{what} per head · outlined: ≥ {th}", what=t(label),
                                                th=F.num(s.threshold))), key=f"phen_{key}_map")
        head_links(s.heads or s.top(3), prompt, stat, repeat)
    try_it(t("switch the input to the sidebar's prompt and type a sentence that repeats a word: the duplicate-"
             "token heads light up on the second copy."))


# ---------------------------------------------------------------- induction heads


def induction_view() -> None:
    st.markdown(t("An induction head completes patterns: having seen “A B” before, at the next “A” it looks at "
                  "what followed A last time (B) and copies it. On random tokens repeated twice, nothing but "
                  "copying can predict the second copy, so its loss falls only if the model has such heads "
                  "(Olsson et al., “In-context Learning and Induction Heads”, 2022)."))
    c1, c2, c3, c4 = st.columns(4)
    seed_from_query("phen_ind_n", "ind_n", 50, int, int_in(10, 100))
    seed_from_query("phen_ind_seed", "ind_seed", 0, int, int_in(0, 10_000))
    seed_from_query("phen_ind_k", "ind_k", min(5, MAX_K), int, int_in(1, MAX_K))
    clamp_state("phen_ind_k", 1, MAX_K)  # a smaller model than the last one
    seed_from_query("phen_ind_mode", "ind_mode", "zero", valid=lambda v: v in MODES)
    n = int(c1.slider(t("Random tokens n"), 10, 100, key="phen_ind_n"))
    seed = int(c2.number_input(t("Seed"), 0, 10_000, key="phen_ind_seed"))
    k = int(c3.slider(t("Heads to ablate"), 1, MAX_K, key="phen_ind_k"))
    mode = c4.segmented_control(t("Ablation"), list(MODES), key="phen_ind_mode", required=True,
                                format_func=option_labels(list(MODES), lambda m: t(MODES[m]))) or "zero"
    write_query(ind_n=n, ind_seed=seed, ind_k=k, ind_mode=mode)
    with st.spinner(t("Running the model…")):
        res = guarded(_induction, sel.name, n, seed)
    if res is None:
        return
    loss, s = res.loss, res.scores["induction"]
    st.markdown(t("Input: [BOS] + {n} random tokens + the same {n} again. Mean loss on the first copy **{a}** "
                  "nats, on the second **{b}**: the model copies.", n=n, a=F.num(loss.first), b=F.num(loss.second)))
    show_figure(FPH.repeat_loss_figure(loss.per_token, n), key="phen_ind_loss")
    recipe(s, IND_RECIPE)
    st.markdown(t("**{k} heads** score at least {th}: {heads}.", k=len(s.heads), th=F.num(s.threshold),
                  heads=head_list(s.heads, tl=s.tl_scores) if s.heads else t("none")))
    show_figure(FPH.head_map(s.scores, t("induction score"), found_pairs(s.heads), zmax=1.0,
                                    title=t("Induction score per head · outlined: ≥ {th}", th=F.num(s.threshold))),
                       key="phen_ind_map")
    head_links(s.heads or s.top(3), None, "induction", (n, seed))
    st.subheader(t("Knock them out"))
    with st.spinner(t("Running the ablations…")):
        ab = guarded(_induction_ablation, sel.name, n, seed, k, mode)
    if ab is None:
        return
    top = ", ".join(t("L{l} H{h}", l=layer, h=head) for layer, head in ab.heads)
    st.markdown(t("With the top {k} induction heads ({heads}) knocked out ({mode}), the second copy's loss goes "
                  "from {a} to **{b}**; knocking out {k} random other heads instead gives {c}.", k=k, heads=top,
                  mode=t(MODES[mode]), a=F.num(ab.base), b=F.num(ab.ablated),
                  c=" / ".join(F.num(c) for c in ab.control)))
    show_figure(FPH.ablation_bars(ab.base, ab.ablated, ab.control, t("second copy's loss (nats)"),
                                         t("top {k} induction heads", k=k)), key="phen_ind_ablation")
    try_it(t("change the seed (other random tokens) or n: the same heads stay on top. Ablate just 1 head, then 3: "
             "how many does it take?"))


# ---------------------------------------------------------------- IOI


def ioi_view() -> None:
    st.markdown(t("“When Mary and John went to the store, John gave a drink to” → “Mary”. The answer is the name "
                  "that is not repeated (the indirect object, IO), not the subject S. The logit difference "
                  "logit(IO) − logit(S) measures the preference; Wang et al. traced the heads that produce it "
                  "(“Interpretability in the Wild”, 2022)."))
    with st.spinner(t("Running the {n} prompts…", n=12)):
        res = guarded(_ioi, sel.name)
    if res is None:
        return
    st.markdown(t("Mean logit difference over {n} prompts: **{ld}**; IO beats S in {acc} of them.",
                  n=len(res.prompts), ld=F.num(res.mean_logit_diff), acc=f"{res.accuracy():.0%}"))
    labels = [f"{i}. {p.text} → {p.io}" for i, p in enumerate(res.prompts)]
    show_figure(FPH.logit_diff_bars(labels, res.logit_diffs), key="phen_ioi_ld")
    st.subheader(t("Direct logit attribution"))
    st.caption(t("Each head's output at the last position, through every norm on its way to the output (each frozen "
                 "at its value on the run: the norm after the attention in Gemma and OLMo 2, the final norm, the final "
                 "soft-cap) and the unembedding, onto u(IO) − u(S): how much that head alone writes the answer. With "
                 "them frozen, the heads, the FFNs and the embeddings add up to the logit difference exactly. Mean "
                 "over the prompts; outlined: the top {k}.", k=5))
    top5 = res.top_heads[:5]
    show_figure(FPH.head_map(res.dla, t("DLA (logits)"), found_pairs(top5), diverging=True,
                                    title=t("Direct logit attribution to IO − S per head")), key="phen_ioi_dla")
    head_links(top5, res.prompts[0].text)
    st.subheader(t("Knock them out"))
    c1, c2 = st.columns(2)
    seed_from_query("phen_ioi_k", "ioi_k", min(5, MAX_K), int, int_in(1, MAX_K))
    clamp_state("phen_ioi_k", 1, MAX_K)  # a smaller model than the last one
    seed_from_query("phen_ioi_mode", "ioi_mode", "mean", valid=lambda v: v in MODES)
    k = int(c1.slider(t("Heads to ablate"), 1, MAX_K, key="phen_ioi_k"))
    mode = c2.segmented_control(t("Ablation"), list(MODES), key="phen_ioi_mode", required=True,
                                format_func=option_labels(list(MODES), lambda m: t(MODES[m]))) or "mean"
    write_query(ioi_k=k, ioi_mode=mode)
    if st.toggle(t("Run the ablation ({n} passes)", n=12 * 3), key="phen_ioi_ablate"):
        with st.spinner(t("Running the ablations…")):
            ab = guarded(_ioi_ablation, sel.name, k, mode)
        if ab is not None:
            st.markdown(t("With the top {k} heads by DLA knocked out ({mode}), the mean logit difference goes from "
                          "{a} to **{b}**; {k} random other heads: {c}.", k=k, mode=t(MODES[mode]),
                          a=F.num(ab.base), b=F.num(ab.ablated), c=" / ".join(F.num(c) for c in ab.control)))
            show_figure(FPH.ablation_bars(ab.base, ab.ablated, ab.control, t("mean logit difference"),
                                                 t("top {k} heads by DLA", k=k)), key="phen_ioi_ablation")
    st.subheader(t("Activation patching"))
    st.caption(t("Run the prompt with the names swapped at their second mention (the answer flips), and copy one "
                 "piece of the clean run into it: the residual stream entering one layer at one position. The map "
                 "shows the share of the clean logit difference each copy restores: where, layer by layer, the "
                 "answer is carried."))
    n = len(res.prompts)
    seed_from_query("phen_ioi_prompt", "ioi_prompt", 0, int, int_in(0, n - 1))
    clamp_state("phen_ioi_prompt", 0, n - 1)
    i = st.selectbox(t("Prompt"), range(n), key="phen_ioi_prompt",
                     format_func=option_labels(range(n), labels.__getitem__))
    write_query(ioi_prompt=i)
    p = res.prompts[i]
    st.caption(t("Corrupted: {text}", text=p.corrupted))
    estimate = AN.estimate_seconds(AN.patching_token_rows(lm, len(pt_positions(p))), lm)
    if not st.toggle(t("Compute the patching map ({n} patched runs, {estimate})",
                       n=len(pt_positions(p)) * len(res.dla), estimate=estimate_text(estimate)),
                     key="phen_ioi_patch_on"):
        return
    bar = None if AN.is_cached("patching", lm, int(i)) else ProgressBar(
        t("Patching every layer and position"), estimate)
    pt = guarded(_patching, sel.name, int(i), bar)
    if bar is not None:
        bar.close()
    if pt is None:
        return
    show_figure(FPH.patching_map(pt.resid, [_readable(x) for x in pt.clean_tokens or []]),
                       key="phen_ioi_patch")
    st.caption(t("Clean logit difference {a}, corrupted {b}.", a=F.num(pt.clean), b=F.num(pt.corrupted)))
    try_it(t("pick another prompt: the answer moves from the second name's position (early layers) to the last "
             "token (late layers), wherever the names stand."))


def pt_positions(p) -> list[int]:
    return list(range(PH.as_ids(lm, p.text).shape[1]))


def _readable(piece_: str) -> str:
    from viz.ui import lm_models

    return lm_models.readable(piece_, lm_models._byte_level(lm))


# ---------------------------------------------------------------- a needle in a haystack (issue 24 §4)

NEEDLE_DEPTHS, NEEDLE_KEY = AN.NEEDLE_DEPTHS, AN.NEEDLE_KEY  # model/analysis/shared.py: the warm-up's too
ABLATE_KEY, ABLATE_DEPTHS = AN.NEEDLE_ABLATE_KEY, AN.NEEDLE_ABLATE_DEPTHS
RETRIEVAL_RECIPE = N_("for each answer token the model predicts right, a head scores a hit when its most-attended "
                      "key lies inside the needle and is that very token; its score is hits ÷ answer tokens copied, "
                      "over every prompt of the grid (Wu et al., “Retrieval Head Mechanistically Explains "
                      "Long-Context Factuality”, 2024)")


def needle_lengths() -> tuple[int, ...]:
    """The grid's lengths that fit the model's context (with room for the answer's tokens)."""
    return AN.needle_lengths(lm)


def _needle_grid(name: str, lengths: tuple, depths: tuple, _progress=None):  # cached by AN (a bar can draw)
    return AN.needle_grid(_lm(name), lengths, depths, NEEDLE_KEY, progress=_progress)  # once per server


@st.cache_resource(max_entries=8, ttl=3600, show_spinner=False)
def _needle_ablation(name: str, lengths: tuple, depths: tuple, k: int):
    return AN.needle_ablation(_lm(name), lengths, depths, int(k))


def needle_view() -> None:
    st.markdown(t("A fact, a pass key, is hidden at a chosen depth in filler text of a chosen length, then asked "
                  "for at the end (the pass-key test of Mohtashami & Jaggi, 2023). To answer, the model must find "
                  "the needle among every earlier token and copy it: a test of what long context is for."))
    lengths, depths = needle_lengths(), NEEDLE_DEPTHS
    # computed at the server's start (viz/ui/warmup.py); else a bar with this server's measured pace
    bar = None if AN.is_cached("needle_grid", lm, lengths, depths, NEEDLE_KEY) else ProgressBar(
        t("Running the {n} prompts", n=len(lengths) * len(depths)), AN.needle_estimate(lm, lengths, depths))
    grid = guarded(_needle_grid, sel.name, lengths, depths, bar)
    if bar is not None:
        bar.close()
    if grid is None:
        return
    n_ok, n_all = int(grid.correct.sum()), grid.correct.size
    st.markdown(t("Pass key {key}: answered right (greedy, every digit) in **{k} of {n}** prompts; p(answer), "
                  "teacher-forced over the answer's tokens, from {lo} to {hi}.", key=NEEDLE_KEY, k=n_ok, n=n_all,
                  lo=F.num(float(grid.prob.min())), hi=F.num(float(grid.prob.max()))))
    show_figure(FLONG.needle_grid_figure(grid.prob, grid.correct, grid.lengths, grid.depths), key="phen_needle_grid")
    i, j = divmod(int(grid.prob.argmin()), len(grid.lengths))
    fails = [t("depth {d} at {n} tokens", d=f"{grid.depths[a]:.0%}", n=f"{grid.lengths[b]:,}")
             for a, b in zip(*(~grid.correct).nonzero(), strict=True)]
    st.markdown(t("**Where it fails:** {cells}.", cells=", ".join(fails)) if fails else
                t("**Where it fails:** nowhere in this grid; its weakest cell is the needle at depth {d} in {n} "
                  "tokens (p {p}).", d=f"{grid.depths[i]:.0%}", n=f"{grid.lengths[j]:,}",
                  p=F.num(float(grid.prob[i, j]))))
    if sel.name == "smollm2":  # the README's measurements are SmolLM2's: cited beside its own grid only
        st.caption(t("An easy haystack: the filler repeats a few short sentences, so the needle is the only new text, "
                     "and these prompts are short. The README reports SmolLM2 in this filler right up to 8,187 tokens "
                     "(bench/needle.py), but in a haystack of real text (the README's own prose) right in 1 of 3 "
                     "prompts at 2,048 tokens and 0 of 3 at 8,187: varied text is where a 135M model fails."))
    else:
        st.caption(t("An easy haystack: the filler repeats a few short sentences, so the needle is the only new text, "
                     "and these prompts are short. A haystack of varied text is harder."))

    st.subheader(t("Retrieval heads"))
    r = grid.retrieval
    recipe(r, RETRIEVAL_RECIPE)
    if not (r.scores == r.scores).any():  # no answer token predicted right: nothing was copied to score
        st.info(t("The model predicted no answer token right, so no head can be seen copying it and none is "
                  "scored; nothing to knock out."), icon="🪡")
        return
    st.markdown(t("**{k} heads** score at least {th}: {heads}.", k=len(r.heads), th=F.num(r.threshold),
                  heads=head_list(r.heads) if r.heads else t("none")))
    show_figure(FPH.head_map(r.scores, t("retrieval score"), found_pairs(r.heads), zmax=1.0,
                             title=t("Retrieval score per head · outlined: ≥ {th}", th=F.num(r.threshold))),
                key="phen_needle_map")
    trial = grid.trials[0]
    head_links(r.heads or r.top(3), lm.tokenizer.decode(trial.prompt.ids[0].tolist()))

    st.subheader(t("Knock them out"))
    seed_from_query("phen_needle_k", "needle_k", min(5, MAX_K), int, int_in(1, MAX_K))
    clamp_state("phen_needle_k", 1, MAX_K)  # a smaller model than the last one
    c1, c2 = st.columns([2, 1], vertical_alignment="bottom")
    k = int(c1.slider(t("Heads to ablate"), 1, MAX_K, key="phen_needle_k"))
    # On request, as /vision's "Knock out this head": its forwards outnumber the grid's, and a cold first view that
    # waited for them took 41 s (issue 43: <= 30 s). The warm-up still computes the default k: instant when warm.
    seed_from_query("phen_needle_run", "needle_run", False, lambda v: v == "1", lambda v: isinstance(v, bool))
    sets, n = 2 + AN.NEEDLE_ABLATE_CONTROLS, max(lengths)  # intact, the top k, and k random heads (each control)
    run = c2.toggle(t("Knock out the top heads"), key="phen_needle_run",
                    help=t("Each of the {m} new prompts ({n} tokens) runs {s} times: intact, with the top {k} "
                           "retrieval heads zeroed, and with {k} random other heads zeroed ({c} draws).",
                           m=len(ABLATE_DEPTHS), n=f"{n:,}", s=sets, k=k, c=AN.NEEDLE_ABLATE_CONTROLS))
    write_query(needle_k=k, needle_run=1 if run else None)
    if not run:
        st.caption(t("Turn on “Knock out the top heads” to zero the top {k} retrieval heads on {m} new prompts: {r} "
                     "forward passes of {n} tokens.", k=k, m=len(ABLATE_DEPTHS), r=sets * len(ABLATE_DEPTHS),
                     n=f"{n:,}"))
        return
    with st.spinner(t("Running the ablations…")):
        ab = guarded(_needle_ablation, sel.name, lengths, depths, k)
    if ab is None:
        return
    top = ", ".join(t("L{l} H{h}", l=layer, h=head) for layer, head in ab.heads)
    m = len(ABLATE_DEPTHS)
    st.markdown(t("On {m} new prompts ({n} tokens, pass key {key}, depths {depths}), zeroing the top {k} "
                  "retrieval heads ({heads}) takes p(answer) from {a} to **{b}** (answered right: {ac} → {bc} of "
                  "{m}); zeroing {k} random other heads instead: {c} ({cc} of {m}).", m=m,
                  n=f"{max(lengths):,}", key=ABLATE_KEY, depths=" / ".join(f"{d:.0%}" for d in ABLATE_DEPTHS),
                  k=k, heads=top, a=F.num(ab.base), b=F.num(ab.ablated), ac=round(ab.base_correct * m),
                  bc=round(ab.ablated_correct * m), c=" / ".join(F.num(c) for c in ab.control),
                  cc=" / ".join(str(round(c * m)) for c in ab.control_correct)))
    show_figure(FPH.ablation_bars(ab.base, ab.ablated, ab.control, t("mean p(answer)"),
                                  t("top {k} retrieval heads", k=k)), key="phen_needle_ablation")
    try_it(t("ablate just 1 retrieval head, then 3: how many does the copy need? Open the top one on the Language "
             "model page with a long prompt: its document view shows where it looks."))


# ---------------------------------------------------------------- page

seed_from_query("phen_view", "phen", "sinks", valid=lambda v: v in VIEWS)
view = st.segmented_control(t("Phenomenon"), list(VIEWS), key="phen_view", required=True,
                            format_func=option_labels(list(VIEWS), lambda v: t(VIEWS[v]))) or "sinks"
write_query(phen=view)
{"sinks": sinks_view, "patterns": patterns_view, "induction": induction_view, "ioi": ioi_view,
 "needle": needle_view, "why": lambda: why_circuits_view.show(sel.name)}[view]()  # issue 39 §4
