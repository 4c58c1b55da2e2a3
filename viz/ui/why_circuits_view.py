"""/phenomena's "Why do these heads look there?" (issue 39 §4): the circuits model.analysis.why_circuits finds live
on the chosen real model (induction heads' K-composition, the IOI name movers' query-side sources, what earns a sink
its token 0), each claim's sentence with its numbers and its live causal check, labelled when the claim fails its
test. Glue only: every number is why_circuits' (computed once per model per server in model/analysis/shared.py's
single-flight cache: ~15 s of CPU on SmolLM2, under a spinner, for the first visitor of an opt-in view; not warmed at
the server's start, which would cost every server that CPU beside the needle grid), every word goes through t();
the sentences are the analysis's own, rendered in the user's language (`render(tr, label)`).
"""

from __future__ import annotations

import streamlit as st

from model.analysis import why as WHY
from model.analysis import why_circuits as W
from viz.figures import why as FW
from viz.figures.attention import num
from viz.i18n import current_lang, t
from viz.ui.models import load_ckpt
from viz.ui.render import show_error, show_figure

LLM_PAGE = "viz/pages/llm.py"


@st.cache_resource(max_entries=4, ttl=3600, show_spinner=False)
def _circuits(name: str) -> W.Circuits:
    return W.circuits(load_ckpt(name).obj)  # once per model per process (shared.cached): the warm-up's too


def _words(lang: str):
    """(tr, label): the analysis's templates and words, and its source names, in `lang`."""
    return (lambda s: t(s, lang=lang)), (lambda s: FW.source_label(s, lang))


def _verdict(passes: bool, sentence: str) -> None:
    """The claim's sentence, labelled by its test: a failed claim is shown, never hidden."""
    if passes:
        st.success(t("**Passes its test.** {sentence}", sentence=sentence), icon="✅")
    else:
        st.warning(t("**Fails its test.** {sentence}", sentence=sentence), icon="⚠️")


def _link(name: str, lang: str, layer: int, head: int, q: int, k: int, **input_query) -> None:
    """The head on the Language model page, on the same input, with "Why here?" open on its first explained cell."""
    query = {"checkpoint": name, "view": "heads", "layer": layer, "head": head, "why": f"{q},{k}", "lang": lang,
             **input_query}
    st.page_link(LLM_PAGE, label=t("Open {head} on the Language model page: why query {q} looks at key {k}",
                                   head=W.head_name(layer, head), q=q, k=k),
                 icon=":material/grid_view:", query_params={a: str(b) for a, b in query.items()})


def _claims_table(rows, score_label: str, lang: str) -> None:
    """Per head: its score, the summed lead, the claimed group's term and share, its removal (live norm) against
    its attribution, and the verdict."""
    st.dataframe([{
        t("head", lang=lang): W.head_name(h.layer, h.head),
        score_label: score,
        t("summed lead", lang=lang): h.lead.total,
        t("group's term", lang=lang): h.claim.value,
        t("share of the lead", lang=lang): f"{h.claim.share:.0%}",
        t("attributed", lang=lang): h.claim.removal.attributed if h.claim.removal else float("nan"),
        t("actual (taken out, live norm)", lang=lang): h.claim.removal.actual if h.claim.removal else float("nan"),
        t("weight change", lang=lang): num(h.claim.removal.mean_weight_change) if h.claim.removal else "—",
        t("test", lang=lang): "✓ " + t("passes", lang=lang) if h.claim.passes else "✗ " + t("fails", lang=lang),
    } for h, score in rows], hide_index=True)


def _figure(heads, title: str, key: str, lang: str) -> None:
    show_figure(FW.circuit_groups_figure([W.head_name(h.layer, h.head) for h in heads],
                                         [h.lead.groups for h in heads], [h.lead.total for h in heads],
                                         title, lang), key=key)


def _tolerance() -> dict:
    return {"rel": f"{WHY.CHECK_REL:.0%}", "abs": num(WHY.CHECK_ABS), "ratio": num(W.LEAD_RATIO)}


def show(name: str) -> None:
    lang = current_lang()
    tr, label = _words(lang)
    st.markdown(t("A head's score for one cell is a sum of terms, one per (query source, key source) pair, exact up "
                  "to float rounding (“Why here?” on the Language model page splits one cell). Here the terms of "
                  "each found head are summed over the cells where it does its job, against the key it would "
                  "otherwise pick (the runner-up), and each circuit's published claim is tested on the run: the "
                  "group it names must give the most, and taking that group out of the head's input, with the norm "
                  "recomputed live, must change the lead by what it was attributed. A claim that fails its test is "
                  "shown, labelled."))
    with st.spinner(t("Splitting the found heads' scores into their sources (once per model on this server)…")):
        try:
            c = _circuits(name)
        except ValueError as e:  # a model via transformers has no decomposition: the analysis says why, in one sentence
            lm_name = getattr(load_ckpt(name).obj, "name", None) or "?"
            if str(e) == WHY.NO_DECOMPOSITION.format(name=lm_name):
                st.info(t(WHY.NO_DECOMPOSITION, name=lm_name), icon="🧩")
            else:
                show_error(e)
            return
    tol = _tolerance()

    st.subheader(t("Induction heads: K-composition"))
    ind = c.induction
    st.markdown(t("Input: [BOS] + {n} random tokens + the same {n} again (seed {seed}). An induction head at a token "
                  "of the second copy attends to the token that followed its earlier copy. What in that key makes it "
                  "win over the runner-up? Olsson et al. (2022) propose K-composition: a previous-token head wrote "
                  "the token before into it.", n=ind.n, seed=ind.seed))
    st.caption(t("Test: the previous-token heads (previous-token score ≥ {th}) give the largest summed term of the "
                 "key-side lead of the groups, and taking them all out of the key input (live norm) changes the lead "
                 "by their attribution within {rel} of the larger or {abs} × max(1, |score|). One source leads when "
                 "its term is ≥ {ratio}× the next one's and its own check agrees.", th=num(W.PREV_THRESHOLD), **tol))
    if ind.heads:
        _figure(ind.heads, t("Induction heads: the key-side lead over the runner-up, by group", lang=lang),
                "phen_why_ind", lang)
        _claims_table([(h, h.induction) for h in ind.heads], t("induction score", lang=lang), lang)
        for h in ind.heads:
            _verdict(h.passes, h.render(tr, label))
            _link(name, lang, h.layer, h.head, h.lead.queries[0], h.lead.keys[0], rep=f"{ind.n}:{ind.seed}")
        st.dataframe([{t("head", lang=lang): W.head_name(h.layer, h.head), t("source", lang=lang): label(s.source),
                       t("term", lang=lang): s.value, t("share of the lead", lang=lang): f"{s.share:.0%}",
                       t("previous-token score", lang=lang): "—" if s.previous is None else num(s.previous),
                       t("actual (taken out, live norm)", lang=lang): s.removal.actual,
                       t("agrees", lang=lang): "✓" if s.removal.agrees else "✗ " + t("disagrees", lang=lang)}
                      for h in ind.heads for s in h.top_sources], hide_index=True)
        st.caption(t("Each head's largest key-side sources, each taken out of the key input alone (live norm)."))

    st.subheader(t("Name movers: what their query reads"))
    io = c.ioi
    st.markdown(t("In “When Mary and John went to the store, John gave a drink to”, name movers attend from the last "
                  "token to the indirect object and copy it. What in their query makes IO win over the subject? Wang "
                  "et al. (2022) propose Q-composition with S-inhibition heads, which attend from the last token to "
                  "the repeated subject. Summed over {n} prompts.", n=io.n_prompts))
    st.caption(t("Test: a name mover is one of the top {k} heads by direct logit attribution whose mean weight from "
                 "the last token is larger on IO than on either subject token, and at least {w}; an S-inhibition-like "
                 "head is an earlier head whose mean weight from the last token on the repeated subject is ≥ {s}. "
                 "The claim passes when they give the largest group term of the query-side lead of IO over the "
                 "subject, and taking them out of the query input (live norm) agrees within {rel} or {abs} × max(1, "
                 "|score|).", k=io.k, w=num(io.min_weight), s=num(W.S_INHIBITION_THRESHOLD), **tol))
    if io.movers:
        _figure(io.movers, t("Name movers: the query-side lead of IO over the subject, by group", lang=lang),
                "phen_why_ioi", lang)
        _claims_table([(m, m.dla) for m in io.movers], t("DLA (logits)", lang=lang), lang)
        for m in io.movers:
            _verdict(m.passes, m.render(tr, label))
            _link(name, lang, m.layer, m.head, m.lead.queries[0], m.lead.keys[0], prompt=io.prompts[0])
    else:
        st.info(io.render(tr, label), icon="🔎")

    st.subheader(t("Sinks: what earns token 0"))
    sk = c.sinks
    st.markdown(t("A sink head puts its weight on token 0. What in token 0's key earns it, over the runner-up key? Sun "
                  "et al. (2024) point to a massive activation an early FFN writes there. Input: “{text}”",
                  text=sk.text))
    st.caption(t("Test: a sink head puts more than {th} of its weight on token 0 (rows 1…T−1; from layer 1: layer 0's "
                 "key is the embedding alone). The claim that the FFNs earn token 0's lead passes when their summed "
                 "key-side term is the largest group's, and taking every FFN out of the key input (live norm) agrees "
                 "within {rel} or {abs} × max(1, |score|).", th=f"{W.SINK_THRESHOLD:.0%}", **tol))
    if sk.heads:
        _figure(sk.heads, t("Sink heads: token 0's key-side lead over the runner-up, by group", lang=lang),
                "phen_why_sink", lang)
        _claims_table([(h, h.sink) for h in sk.heads], t("share on token 0", lang=lang), lang)
        for h in sk.heads:
            _verdict(h.claim.passes, h.render(tr, label))
            _link(name, lang, h.layer, h.head, h.lead.queries[0], h.lead.keys[0], prompt=sk.text)
    else:
        st.info(sk.render(tr, label), icon="🔎")
