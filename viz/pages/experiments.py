"""Experiments: break one piece of the running Transformer and see, side by side, what changes.
On a decoder-only language model (SmolLM2) the page offers what applies to it (head and shared K/V head
ablation, scaling, no √d_k, RoPE off, no causal mask) and measures the next token and the prompt's loss.

Four views (one runs at a time, `?exp_view=`): before/after under chosen interventions (kept in the
URL as `?exp=spec;spec`, see model.interventions), head importance with a per-head summary, the
attribution panel, and two inputs compared on the pretrained MiniLM encoder.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import streamlit as st

from model import analysis as an
from model import interventions as iv
from model.analysis import cheating, compare, heads, runs
from model.analysis import lessons_llm as LL
from model.analysis import phenomena as PH
from model.loaders import minilm
from viz.figures import experiments as FX
from viz.i18n import N_, current_lang, t
from viz.ui.attention_views import KIND_IDS
from viz.ui.models import capabilities, get_trace, is_real_model, load_ckpt
from viz.ui.render import show_error, show_figure
from viz.ui.sidebar import require, require_trace, selection
from viz.ui.state import MAX_URL_TEXT, clamp_state, long_text_note, note_replaced, seed_from_query, write_query
from viz.ui.text import text_problems

VIEWS = {"before_after": N_("Before / after"), "heads": N_("Head importance"),
         "attribution": N_("Attribution"), "compare": N_("Two inputs (MiniLM)")}
SIDES = dict(zip(iv.SIDES, (N_("both"), N_("encoder"), N_("decoder")), strict=True))
MODE_LABELS = {"zero": N_("zero"), "mean": N_("mean over positions"), "uniform": N_("uniform attention")}
PAIR_A = "The animal didn't cross the street because it was too tired"
PAIR_B = "The animal didn't cross the street because it was too wide"
N_HELD_OUT = 100
# The page opens on the first of these whose output differs from the intact model's on the sidebar's text
# (measured: no PE in the encoder breaks dates and reverse, but zh-en still says "i love machine learning";
# a shuffled source breaks all three shipped models).
DEFAULT_SPECS = ("no_positional:side=encoder", "shuffle_source:seed=0", "seed_qk_swap_concat")
FACTOR_RANGE = (-2.0, 4.0)  # the Factor slider
SEED_RANGE = (0, 10_000)  # the Shuffle seed box
CMP_PARAMS = {"exp_cmp_a": ("cmp_a", PAIR_A), "exp_cmp_b": ("cmp_b", PAIR_B), "exp_cmp_q": ("cmp_q", "it"),
              "exp_cmp_k1": ("cmp_k1", "animal"), "exp_cmp_k2": ("cmp_k2", "street")}  # widget -> (?param, default)


# ---------------------------------------------------------------- cached computations (read-only results)


@st.cache_resource(max_entries=16, show_spinner=False)
def _before_after(name: str, text: str, specs: tuple[str, ...]):
    ckpt = load_ckpt(name)
    return an.before_after(ckpt, text, iv.build(list(specs), ckpt.cfg))


@st.cache_resource(max_entries=16, show_spinner=False)
def _importance(name: str, text: str, target: str | None, mode: str):
    return heads.importance_for(load_ckpt(name), get_trace(name, text, target), mode)


@st.cache_resource(max_entries=8, show_spinner=False)
def _em_importance(name: str, n: int):
    ckpt = load_ckpt(name)
    return heads.exact_match_importance(ckpt, runs.held_out(ckpt, n))


@st.cache_resource(max_entries=32, show_spinner=False)
def _attribution(name: str, text: str, target: str | None, position: int):
    return an.attribution_for(load_ckpt(name), get_trace(name, text, target), position)


@st.cache_resource(max_entries=16, show_spinner=False)
def _loss(name: str, specs: tuple[str, ...]):
    ckpt = load_ckpt(name)
    return runs.teacher_forced_loss(ckpt, runs.held_out(ckpt, N_HELD_OUT), iv.build(list(specs), ckpt.cfg))


@st.cache_resource(max_entries=4, show_spinner=False)
def _cheating(name: str, steps: int):
    return cheating.train_without_mask(load_ckpt(name), steps)


@st.cache_resource(show_spinner=False)
def _encoder():
    return minilm.load_minilm()


@st.cache_resource(max_entries=16, show_spinner=False)
def _compare(a: str, b: str, q: str, k1: str, k2: str):
    return compare.compare_inputs(_encoder(), a, b, q, k1, k2)


@st.cache_resource(max_entries=16, show_spinner=False)
def _preference(text: str, q: str, k1: str, k2: str):
    return compare.preference_importance(_encoder(), text, q, k1, k2)


# ---------------------------------------------------------------- choosing interventions


def _default_spec(sel) -> str:
    """The first of DEFAULT_SPECS that visibly changes this model's output on this text."""
    for spec in DEFAULT_SPECS:
        try:
            ba = _before_after(sel.name, sel.text, (spec,))
        except ValueError:
            continue
        if ba.after.text != ba.before.text:
            return spec
    return DEFAULT_SPECS[0]


def _fit_to_widgets(ident: str, kwargs: dict, modules: list[str], n_heads: int, n_src: int) -> dict:
    """A link's arguments as the widgets can show them: an unknown module or a number outside its
    widget's range is replaced, and the page says so (once); a number that is no number (nan) is
    refused like any other bad spec (SpecError)."""
    out = dict(kwargs)
    if "module" in out and out["module"] not in modules:
        note_replaced(f"{ident}:module", out["module"], modules[-1])
        out["module"] = modules[-1]
    ranges = {"head": (0, n_heads - 1), "factor": FACTOR_RANGE, "position": (0, n_src - 1), "seed": SEED_RANGE}
    for k, (lo, hi) in ranges.items():
        v = out.get(k)
        if v is None:
            continue
        if isinstance(v, float) and math.isnan(v):
            raise iv.SpecError(t("{arg} must be a number, got {value}", arg=f"{ident}:{k}", value=v))
        if not lo <= v <= hi:
            out[k] = type(v)(min(max(v, lo), hi))
            note_replaced(f"{ident}:{k}", v, out[k], lo, hi)
    return out


def _seed_from_url(sel, modules: list[str], n_heads: int, n_src: int) -> None:
    """First render: the interventions and their arguments from `?exp=` (a bad spec says why, a value
    out of its widget's range is replaced with a note)."""
    if "exp_iv" in st.session_state:
        return
    chosen = []
    for spec in filter(None, (st.query_params.get("exp") or _default_spec(sel)).split(";")):
        try:
            ident, kwargs = iv.parse(spec)
            if kwargs:  # values the widgets could not show (a mode or side that does not exist) fail here
                iv.REGISTRY[ident].make(**kwargs)
                kwargs = _fit_to_widgets(ident, kwargs, modules, n_heads, n_src)
        except iv.SpecError as e:
            show_error(t("This link's intervention could not be read: {e}", e=e))
            continue
        chosen.append(ident)
        for k, v in kwargs.items():
            st.session_state[f"exp_{ident}_{k}"] = v
    st.session_state["exp_iv"] = list(dict.fromkeys(chosen))


def _args(ident: str, modules: list[str], n_heads: int, src_tokens: list[str]) -> dict:
    """The argument widgets of one intervention; values are stable ids (the URL works in any language)."""
    key = f"exp_{ident}_{{}}".format
    if ident in ("ablate_head", "scale_head"):
        if st.session_state.get(key("module")) not in modules:
            st.session_state[key("module")] = modules[-1]
        clamp_state(key("head"), 0, n_heads - 1)
        c1, c2, c3 = st.columns([3, 1, 2])
        out = {"module": c1.selectbox(t("Attention module"), modules, key=key("module")),
               "head": c2.selectbox(t("Head"), range(n_heads), key=key("head"))}
        if ident == "ablate_head":
            st.session_state.setdefault(key("mode"), "zero")
            out["mode"] = c3.segmented_control(t("Ablation"), iv.MODES, key=key("mode"), required=True,
                                               format_func=lambda m: t(MODE_LABELS[m])) or "zero"
        else:
            st.session_state.setdefault(key("factor"), 2.0)
            out["factor"] = c3.slider(t("Factor"), -2.0, 4.0, key=key("factor"), step=0.5)
        return out
    if ident == "block_source_token":
        clamp_state(key("position"), 0, len(src_tokens) - 1)
        labels = [f"{i}: {tok}" for i, tok in enumerate(src_tokens)]
        return {"position": st.selectbox(t("Source token to hide"), range(len(src_tokens)), key=key("position"),
                                         format_func=labels.__getitem__)}
    if ident == "shuffle_source":
        st.session_state.setdefault(key("seed"), 0)
        return {"seed": int(st.number_input(t("Shuffle seed"), 0, 10_000, key=key("seed")))}
    if ident == "no_positional":
        st.session_state.setdefault(key("side"), "*")
        return {"side": st.segmented_control(t("Where"), list(SIDES), key=key("side"), required=True,
                                             format_func=lambda s: t(SIDES[s])) or "*"}
    return {}


def choose_specs(sel, ckpt, trace) -> list[str]:
    modules = heads.attention_modules(ckpt.model)
    _seed_from_url(sel, modules, ckpt.cfg.n_heads, len(trace.meta["src_tokens"]))
    ids = st.multiselect(t("Interventions"), list(iv.REGISTRY), key="exp_iv",
                         format_func=lambda i: t(iv.REGISTRY[i].label),
                         placeholder=t("Choose one or more interventions"))
    specs = []
    for ident in ids:
        with st.container(border=True):
            st.markdown(f"**{t(iv.REGISTRY[ident].label)}**")
            st.caption(t(_DOCS[ident]))
            specs.append(iv.spec_of(ident, **_args(ident, modules, ckpt.cfg.n_heads, trace.meta["src_tokens"])))
    write_query(exp=";".join(specs) or None)
    return specs


_DOCS = {
    "ablate_head": N_("Knock out one head: zero its output, replace it by its mean over positions, or make it "
                      "attend uniformly to every visible key."),
    "scale_head": N_("Multiply one head's output z by a factor (0 = removed, 1 = unchanged)."),
    "block_source_token": N_("Hide one source token as a key everywhere, as if it were [PAD]: nothing can read it."),
    "no_scaling": N_("Use QKᵀ instead of QKᵀ/√d_k: the scores spread √d_k times wider and softmax saturates."),
    "no_positional": N_("Add no positional encoding: the model sees a bag of tokens and cannot tell their order."),
    "shuffle_source": N_("Give each source token the position of another one: the encoder reads a shuffled "
                         "sentence."),
    "no_lookahead_mask": N_("Remove the look-ahead mask: every target position may read the later ones."),
    "no_padding_mask": N_("Stop masking [PAD] keys. A single sentence has no padding, so look at the held-out "
                          "exact match below: it runs in padded batches."),
    "seed_qk_swap_concat": N_("The multi-head attention of seed 001, bugs included."),
    "inverted_mask": N_("Masks read with the opposite convention."),
    "pe_base_1000": N_("Positional encoding with base 1000, as written in seed 004."),
}


# ---------------------------------------------------------------- view: before / after


def _decoded(col, title: str, dec) -> None:
    col.markdown(f"**{title}**")
    col.code(dec.text or "∅", language=None)
    if not dec.finished:
        col.caption(t("Stopped at the length limit without [EOS]."))


def before_after_view(sel, ckpt, trace) -> None:
    st.caption(t("Choose interventions; the model decodes the sidebar's source text with and without them "
                 "(greedy, every step a full pass under the hooks)."))
    specs = choose_specs(sel, ckpt, trace)
    if not specs:
        st.info(t("Choose an intervention above to see what changes."))
        return
    try:
        ba = _before_after(sel.name, sel.text, tuple(specs))
    except ValueError as e:
        show_error(e)
        return
    for ident in dict.fromkeys(s.partition(":")[0] for s in specs):
        bug = iv.REGISTRY[ident].bug
        if bug:
            st.info(f"**{t(iv.REGISTRY[ident].label)}.** {t(bug[0])} {t(bug[1])}", icon="🐞")
    c1, c2 = st.columns(2)
    _decoded(c1, t("Before"), ba.before)
    _decoded(c2, t("After"), ba.after)
    show_figure(FX.token_diff(ba.before, ba.after), key="exp_tokens", filename="experiment-tokens")
    modules = heads.attention_modules(ckpt.model)
    st.subheader(t("What the attention does differently"))
    st.caption(t("Both runs read the same tokens here (the output from before), so each cell can be "
                 "subtracted: green = more attention after the intervention, pink = less."))
    module = st.selectbox(t("Attention module"), modules, index=len(modules) - 1, key="exp_diff_module")
    show_figure(FX.attention_diff(ba.trace_before, ba.trace_same, module, ba.trace_before.meta),
                       key="exp_diff", filename=f"experiment-diff-{module}")
    cross = [m for m in modules if m.endswith("cross_attn")]
    if cross:
        st.caption(t("The alignment each run produced for its own output: which source tokens each output "
                     "token looked at."))
        show_figure(FX.alignment_pair(ba.trace_before, ba.trace_after, cross[-1]), key="exp_align",
                           filename="experiment-alignment")
    damage(sel, ckpt, specs, ba)


def damage(sel, ckpt, specs: list[str], ba) -> None:
    st.subheader(t("The damage on the task"))
    try:
        pairs = runs.held_out(ckpt, N_HELD_OUT)
    except ValueError as e:
        st.info(str(e))
        return
    before, after = _loss(sel.name, ()), _loss(sel.name, tuple(specs))
    c1, c2 = st.columns(2)
    c1.metric(t("Teacher-forced loss, {n} held-out pairs", n=N_HELD_OUT), f"{after['loss']:.3f}",
              f"{after['loss'] - before['loss']:+.3f}", delta_color="inverse")
    c2.metric(t("Teacher-forced token accuracy"), f"{after['token_accuracy']:.1%}",
              f"{after['token_accuracy'] - before['token_accuracy']:+.1%}")
    store = st.session_state.setdefault("exp_em", {})
    if st.button(t("Measure exact match on {n} held-out samples", n=N_HELD_OUT), key="exp_em_button"):
        bar = st.progress(0.0, text=t("Decoding…"))
        for label, spec in ((("before", ())), ("after", tuple(specs))):
            if (sel.name, spec) not in store:
                hooks = iv.build(list(spec), ckpt.cfg)
                store[(sel.name, spec)] = runs.exact_match(
                    ckpt, pairs, hooks, progress=lambda d, n, lab=label: bar.progress(
                        (d / n) / 2 + (0.5 if lab == "after" else 0.0), text=t("Decoding ({which})…", which=t(lab))))
        bar.empty()
    em0, em1 = store.get((sel.name, ())), store.get((sel.name, tuple(specs)))
    if em0 is not None and em1 is not None:
        st.metric(t("Exact match (greedy), before → after"), f"{em0:.0%} → {em1:.0%}", f"{em1 - em0:+.0%}")
    if "no_lookahead_mask" in " ".join(specs):
        lookahead_note(specs, ba)
        cheating_panel(sel)
    with st.expander(t("Seed 001's loss over [PAD]")):
        st.markdown(f"{t(iv.SEED_LOSS_BUG[0])} {t(iv.SEED_LOSS_BUG[1])}")
        st.caption(t("On these {n} held-out pairs (padded to one batch): right loss {a:.4f}, seed 001's loss "
                     "{b:.4f}, real tokens {s:.1%} of the positions.", n=N_HELD_OUT, a=after["loss"],
                     b=after["seed_loss"], s=after["real_share"]))
        if after["real_share"] >= 1.0:  # e.g. dates: every target has the same length
            st.info(t("These targets need no padding (they all have the same length), so the batch has no [PAD] "
                      "and both losses are the same. Seed 001's bug shows on a model whose targets differ in "
                      "length, such as reverse or zh-en."))


def lookahead_note(specs: list[str], ba) -> None:
    """Why removing the look-ahead mask costs the teacher-forced loss much more than greedy decoding."""
    st.markdown(t("**Why the loss rises while greedy decoding barely changes.** Teacher forcing feeds the whole "
                  "reference target at once: without the mask, position t also reads the later target tokens, "
                  "token t+1 (the one it must predict) included. The model never saw them in training, so its "
                  "attention spreads over inputs it never learned to weigh, and the loss rises. Greedy decoding "
                  "feeds only the tokens produced so far, and the next token is read at the newest position, which "
                  "has no later token to see: for that row the mask blocked nothing. Only the earlier positions "
                  "change (each may now read the tokens produced after it), and the newest position feels that "
                  "only through the layers above."))
    if specs != ["no_lookahead_mask"]:
        return
    if ba.after.tokens == ba.before.tokens:
        shift = max((abs(a - b) for a, b in zip(ba.before.logprobs, ba.after.logprobs, strict=False)), default=0.0)
        st.caption(t("On the sidebar's text the output is the same, and the log-probability of each chosen token "
                     "moved by at most {d:.4f}.", d=shift))
    else:
        st.caption(t("On the sidebar's text the output changed: the earlier positions' new states were enough to "
                     "change a greedy choice."))


def cheating_panel(sel) -> None:
    st.markdown(t("**Why the mask exists.** Removing it from a model trained *with* it only confuses that "
                  "model (above). Train *without* it and the model learns to cheat: position t reads token "
                  "t+1 of its input, exactly what it must predict."))
    steps = 60
    if st.button(t("Fine-tune a copy for {n} steps without the mask (about a minute)", n=steps),
                 key="exp_cheat_button"):
        with st.spinner(t("Training a copy of the model…")):
            st.session_state["exp_cheat"] = (sel.name, _cheating(sel.name, steps))
    got = st.session_state.get("exp_cheat")
    if got and got[0] == sel.name:
        c = got[1]
        c1, c2 = st.columns(2)
        c1.metric(t("Teacher-forced loss (no mask)"), f"{c.teacher_forced['loss']:.3f}")
        c2.metric(t("Exact match, free-running (no mask)"), f"{c.exact_match:.0%}")
        st.caption(t("Teacher forcing lets it copy the next token, so its teacher-forced loss is almost perfect. "
                     "Decoding on its own, there is no next token to copy: the free-running exact match shows "
                     "what is left (a fine-tuned copy keeps part of what it learned with the mask)."))


# ---------------------------------------------------------------- view: heads


def _attention_query(sel, module: str, head: int) -> dict:
    """The Attention page's URL query showing `module`'s `head` (a page link: the Attention page is the
    app's root page, so a hand-made "/attention" address would not exist)."""
    kind, layer = heads.kind_of(module, sel.ckpt.model.describe())
    q = {"checkpoint": sel.name, "attn_kind": KIND_IDS[kind], "layer": layer, "head": head, "lang": current_lang()}
    if len(sel.text) <= MAX_URL_TEXT:
        q["text"] = sel.text
    if sel.target and len(sel.target) <= MAX_URL_TEXT:
        q["target"] = sel.target
    return q


def heads_view(sel, ckpt, trace) -> None:
    st.caption(t("Each head of every attention module is knocked out in turn, all in one batched forward pass "
                 "(one ablation per batch row); the map shows how much the log-prob of the output changes."))
    st.session_state.setdefault("exp_imp_mode", "zero")
    mode = st.segmented_control(t("Ablation"), iv.MODES, key="exp_imp_mode", required=True,
                                format_func=lambda m: t(MODE_LABELS[m])) or "zero"
    hi = _importance(sel.name, sel.text, sel.target, mode)
    show_figure(FX.importance_maps(hi), key="exp_importance", filename="head-importance")
    st.markdown(t("**Top heads** (open one in the Attention page):"))
    for module, head, delta in hi.top(5):
        st.page_link("viz/pages/attention.py", label=f"{module}, {t('head {h}', h=head)}: Δ = {delta:+.4f}",
                     icon=":material/grid_view:", query_params=_attention_query(sel, module, head))
    if st.button(t("Also: change in exact match per head (20 held-out samples)"), key="exp_em_heads"):
        st.session_state["exp_em_heads_for"] = sel.name
    if st.session_state.get("exp_em_heads_for") == sel.name:
        try:
            with st.spinner(t("Decoding every ablation…")):
                em = _em_importance(sel.name, 20)
            show_figure(FX.importance_maps(em), key="exp_em_importance", filename="head-importance-em")
        except ValueError as e:
            st.info(str(e))
    st.subheader(t("What each head does"))
    st.session_state.setdefault("exp_summary_q", "entropy")  # the button of the map drawn is highlighted
    q = st.segmented_control(t("Quantity"), list(FX.SUMMARY_LABELS), key="exp_summary_q", required=True,
                             format_func=lambda k: t(FX.SUMMARY_LABELS[k])) or "entropy"
    st.caption(t("Entropy: 0 = all weight on one key, log n = spread evenly. Distance: how far (in positions) "
                 "a query looks on average (self-attention only). Special tokens: [BOS], [EOS], [CLS], [SEP], "
                 "where heads often park attention they do not need."))
    show_figure(FX.summary_maps(an.head_summary(trace), q), key="exp_summary", filename=f"head-{q}")


# ---------------------------------------------------------------- view: attribution


def attribution_view(sel, ckpt, trace) -> None:
    st.caption(t("Is attention an explanation? For one output token, four measures of how much each source "
                 "token mattered, each with its Spearman rank correlation ρ against blank-out (hide the token, "
                 "measure the drop in log-prob). The literature finds rollout closer to blank-out than raw "
                 "attention in deep layers; see what these models do."))
    outs = trace.meta.get("next_tokens") or []
    clamp_state("exp_attr_pos", 0, max(len(outs) - 1, 0))
    pos = st.selectbox(t("Output token"), range(len(outs)), key="exp_attr_pos",
                       format_func=lambda i: f"{i}: {outs[i]}")
    attr = _attribution(sel.name, sel.text, sel.target, pos)
    show_figure(FX.attribution_bars(attr), key="exp_attr", filename="attribution")
    st.dataframe([{t("method"): t(FX.METHOD_LABELS[m]), "ρ": round(r, 3)} for m, r in attr.spearman.items()],
                 hide_index=True)
    st.markdown(t("**Layer by layer.** Spearman ρ with blank-out of the raw cross-attention of each decoder layer "
                  "and of the rollout up to that layer, for this token and averaged over every output token."))
    st.dataframe([{t("decoder layer"): r["layer"], t("raw, this token"): round(r["raw"], 3),
                   t("rollout, this token"): round(r["rollout"], 3), t("raw, mean"): round(r["raw_mean"], 3),
                   t("rollout, mean"): round(r["rollout_mean"], 3)} for r in attr.by_layer], hide_index=True)


# ---------------------------------------------------------------- view: two inputs (MiniLM)


def compare_view() -> None:
    st.caption(t("Two sentences side by side on the pretrained encoder all-MiniLM-L6-v2: how does every head's "
                 "attention from one query token change when one word changes?"))
    if not minilm.is_available():
        st.info(t("The pretrained encoder is not installed: {hint}", hint=minilm.INSTALL_HINT))
        return
    for key, (param, default) in CMP_PARAMS.items():
        seed_from_query(key, param, default)
    c1, c2 = st.columns(2)
    a = c1.text_input(t("Sentence A"), key="exp_cmp_a")
    b = c2.text_input(t("Sentence B"), key="exp_cmp_b")
    c1, c2, c3 = st.columns(3)
    q = c1.text_input(t("Query token"), key="exp_cmp_q")
    k1 = c2.text_input(t("Key token 1"), key="exp_cmp_k1")
    k2 = c3.text_input(t("Key token 2"), key="exp_cmp_k2")
    # Kept in the link like the sidebar's text, under the same length rule.
    values = {param: st.session_state[key] for key, (param, _) in CMP_PARAMS.items()}
    write_query(**values)
    if note := long_text_note(*values.values()):
        st.caption(note)
    try:
        with st.spinner(t("Running MiniLM…")):
            hf = _compare(a, b, q, k1, k2)
    except (ValueError, RuntimeError) as e:
        show_error(e)
        return
    show_figure(FX.flip_maps(hf, (q, k1, k2)), key="exp_flip", filename="head-flip")
    st.markdown(t("**Head finder**: heads ranked by how much their preference flips between the sentences. "
                  "A head that follows the meaning flips; one that keeps high weight on “{k}” in both does "
                  "not.", k=k1))
    st.dataframe([{t("layer"): r["layer"], t("head"): r["head"], t("w[{k}] in A", k=k1): round(r["to1_a"], 3),
                   t("w[{k}] in B", k=k1): round(r["to1_b"], 3), t("flip"): round(r["flip"], 3)}
                  for r in hf.ranking()[:10]], hide_index=True)
    steady = max(hf.ranking(), key=lambda r: min(r["to1_a"], r["to1_b"]))
    st.caption(t("Steadiest head on “{k}”: layer {l}, head {h} ({a:.2f} in A, {b:.2f} in B).", k=k1,
                 l=steady["layer"], h=steady["head"], a=steady["to1_a"], b=steady["to1_b"]))
    if hf.aligned:
        show_figure(FX.row_diff(hf), key="exp_rowdiff", filename="row-diff")
    else:
        st.info(t("The sentences have different numbers of tokens, so their rows cannot be subtracted "
                  "position by position; the preference maps above still compare them."))
    if st.button(t("Ablate each of the {n} heads (sentence A)", n=int(np.prod(hf.pref_a.shape))),
                 key="exp_cmp_imp"):
        st.session_state["exp_cmp_imp_on"] = True
    if st.session_state.get("exp_cmp_imp_on"):
        try:
            hi = _preference(a, q, k1, k2)
        except ValueError as e:
            show_error(e)
            return
        st.caption(t("Preference = cos(h_{q}, h_{a}) − cos(h_{q}, h_{b}) on the final hidden states; the map "
                     "shows its change when each head is zeroed.", q=q, a=k1, b=k2))
        show_figure(FX.importance_maps(hi), key="exp_cmp_importance", filename="minilm-head-importance")


# ---------------------------------------------------------------- a decoder-only language model

LM_LABELS = {"ablate_kv_head": N_("Ablate a shared K/V head"), "no_positional": N_("No positions (RoPE off)")}
LM_DOCS = {
    "ablate_kv_head": N_("Knock out one key/value head: with grouped-query attention it is shared, so every query "
                         "head that reads it goes silent at once."),
    "no_positional": N_("Rotate q and k by angle 0 (or add no learned positions): attention no longer knows where "
                        "the tokens are."),
    "no_lookahead_mask": N_("Remove the causal mask: every position may read the later ones. The last position has "
                            "nothing later, so its next token changes only through the earlier positions."),
}
LM_DEFAULT = "no_positional"
N_("log-prob of the model's next token")  # LL.NEXT_TOKEN_METRIC, the LM head importance's metric (translated)
SEQ2SEQ_ONLY = N_("Not offered for a decoder-only model: blocking or shuffling a source token, the padding mask and "
                  "the seeds' bugs all act on an encoder–decoder model's source sentence.")


def _lm(name: str):
    return load_ckpt(name).obj


@st.cache_resource(max_entries=16, show_spinner=False)
def _lm_before_after(name: str, text: str, specs: tuple[str, ...]):
    lm = _lm(name)
    return LL.lm_before_after(lm, text, LL.lm_hooks(list(specs), lm))


@st.cache_resource(max_entries=8, show_spinner=False)
def _lm_importance(name: str, text: str, mode: str):
    return LL.lm_head_importance(_lm(name), text, mode)


def _lm_label(ident: str) -> str:
    return t(LM_LABELS.get(ident) or iv.REGISTRY[ident].label)


def _lm_seed_from_url(modules: list[str], n_heads: int, n_kv: int) -> None:
    """First render: the LM interventions from `?exp=`; a spec that does not apply says so."""
    if "exp_lm_iv" in st.session_state:
        return
    chosen = []
    for spec in filter(None, (st.query_params.get("exp") or LM_DEFAULT).split(";")):
        ident, _, args = spec.strip().partition(":")
        if ident not in LL.LM_INTERVENTIONS:
            show_error(t("This link's intervention “{spec}” does not apply to a decoder-only model.",
                                spec=spec[:60]))
            continue
        try:
            kwargs = dict(part.split("=", 1) for part in filter(None, args.split(",")))
            if ident in iv.REGISTRY:
                _, kwargs = iv.parse(spec)
            kwargs = _fit_to_widgets(ident, kwargs, modules, n_heads, 1)
            if ident == "ablate_kv_head":
                kwargs["kv_head"] = min(max(int(kwargs.get("kv_head", 0)), 0), n_kv - 1)
                if kwargs.get("mode") not in ("zero", "mean"):
                    kwargs["mode"] = "zero"
        except (iv.SpecError, ValueError) as e:
            show_error(t("This link's intervention could not be read: {e}", e=e))
            continue
        chosen.append(ident)
        for k, v in kwargs.items():
            st.session_state[f"exp_{ident}_{k}"] = v
    st.session_state["exp_lm_iv"] = list(dict.fromkeys(chosen))


def _lm_args(ident: str, modules: list[str], n_heads: int, n_kv: int) -> dict:
    if ident in ("ablate_head", "scale_head"):
        return _args(ident, modules, n_heads, [])
    if ident != "ablate_kv_head":
        return {}
    key = f"exp_{ident}_{{}}".format
    if st.session_state.get(key("module")) not in modules:
        st.session_state[key("module")] = modules[-1]
    clamp_state(key("kv_head"), 0, n_kv - 1)
    st.session_state.setdefault(key("mode"), "zero")
    c1, c2, c3 = st.columns([3, 1, 2])
    out = {"module": c1.selectbox(t("Attention module"), modules, key=key("module")),
           "kv_head": c2.selectbox(t("K/V head"), range(n_kv), key=key("kv_head")),
           "mode": c3.segmented_control(t("Ablation"), ["zero", "mean"], key=key("mode"), required=True,
                                        format_func=lambda m: t(MODE_LABELS[m])) or "zero"}
    heads_ = iv.shared_query_heads(n_heads, n_kv, int(out["kv_head"]))
    st.caption(t("K/V head {g} is read by query heads {heads}: knocking it out silences all {r} of them at once.",
                 g=out["kv_head"], heads=", ".join(map(str, heads_)), r=len(heads_)))
    return out


def _piece(lm, i: int) -> str:
    from viz.ui import lm_models

    return lm_models.readable(lm.tokens([int(i)])[0], lm_models._byte_level(lm))


def _top_md(lm, top) -> str:
    rows = [f"| {k + 1} | `{_piece(lm, i).replace('`', 'ˋ').replace('|', '¦')}` | {p:.3f} |"
            for k, (i, p) in enumerate(top)]
    return "\n".join([f"| # | {t('token')} | {t('probability')} |", "|---|---|---|", *rows])


def lm_before_after_view(sel, lm) -> None:
    st.caption(t("Choose interventions; the language model reads the sidebar's prompt with and without them. "
                 "Measured: the next token at the last position, the logit difference between the intact model's "
                 "top two tokens, and the mean next-token loss over the prompt."))
    modules = PH.attention_names(lm)
    cfg = lm.model.cfg
    _lm_seed_from_url(modules, cfg.n_heads, cfg.n_kv_heads)
    ids = st.multiselect(t("Interventions"), list(LL.LM_INTERVENTIONS), key="exp_lm_iv", format_func=_lm_label,
                         placeholder=t("Choose one or more interventions"))
    st.caption(t(SEQ2SEQ_ONLY))
    specs = []
    for ident in ids:
        with st.container(border=True):
            st.markdown(f"**{_lm_label(ident)}**")
            st.caption(t(LM_DOCS.get(ident) or _DOCS[ident]))
            specs.append(iv.spec_of(ident, **_lm_args(ident, modules, cfg.n_heads, cfg.n_kv_heads)))
    write_query(exp=";".join(specs) or None)
    if not specs:
        st.info(t("Choose an intervention above to see what changes."))
        return
    try:
        with st.spinner(t("Running the model…")):
            ba = _lm_before_after(sel.name, sel.text, tuple(specs))
    except ValueError as e:
        show_error(e)
        return
    c1, c2 = st.columns(2)
    for col, title, top in ((c1, t("Before"), ba.top_before), (c2, t("After"), ba.top_after)):
        col.markdown(f"**{title}**")
        col.markdown(_top_md(lm, top))
    a, b = ba.top_before[0][0], ba.top_after[0][0]
    c1, c2, c3 = st.columns(3)
    c1.metric(t("Next token"), f"“{_piece(lm, b)}”", t("was “{tok}”", tok=_piece(lm, a)) if a != b else t("unchanged"),
              delta_color="off", delta_arrow="off")
    c2.metric(t("Logit difference (intact top two)"), f"{ba.logit_diff_after:.3f}",
              f"{ba.logit_diff_after - ba.logit_diff_before:+.3f}")
    c3.metric(t("Mean loss on the prompt"), f"{ba.loss_after:.3f}", f"{ba.loss_after - ba.loss_before:+.3f}",
              delta_color="inverse")
    st.caption(t("KL(intact ‖ after) of the next-token distribution: {kl} nats.", kl=f"{ba.kl:.4f}"))


def lm_top_heads(sel, hi) -> None:
    """The heads whose removal changes the next token's log-prob most, each a link to the Language model page."""
    st.markdown(t("**Top heads** (open one on the Language model page):"))
    for module, head, delta in hi.top(5):
        layer = hi.description["attention"][module]["layer"]
        q = {"checkpoint": sel.name, "view": "heads", "layer": layer, "head": head, "lang": current_lang()}
        if len(sel.text) <= MAX_URL_TEXT:
            q["prompt"] = sel.text
        st.page_link("viz/pages/llm.py", label=f"{module}, {t('head {h}', h=head)}: Δ = {delta:+.4f}",
                     icon=":material/chat:", query_params={k: str(v) for k, v in q.items()})


def lm_heads_view(sel, lm, trace) -> None:
    st.caption(t("Each query head of every layer is knocked out in turn, batched (one ablation per batch row); the "
                 "map shows how much the log-prob of the model's next token at the last position changes."))
    st.session_state.setdefault("exp_imp_mode", "zero")
    mode = st.segmented_control(t("Ablation"), iv.MODES, key="exp_imp_mode", required=True,
                                format_func=lambda m: t(MODE_LABELS[m])) or "zero"
    n = len(trace.meta["model"]["attention"]) * lm.model.cfg.n_heads
    # One batch row per head over the whole prompt: seconds to minutes on a CPU, so it runs when asked.
    if st.toggle(t("Knock out each of the {n} heads", n=n), key="exp_lm_imp_on"):
        from viz.ui.long_limits import costly_cut

        text = costly_cut(lm, sel.text, LM_IMPORTANCE_MAX_TOKENS,
                          t("Head importance removes each head in turn: one forward pass per head."))
        with st.spinner(t("Knocking out every head…")):
            hi = _lm_importance(sel.name, text, mode)
        show_figure(FX.importance_maps(hi), key="exp_importance", filename="head-importance")
        lm_top_heads(dataclasses.replace(sel, text=text), hi)
    st.subheader(t("What each head does"))
    st.session_state.setdefault("exp_summary_q", "entropy")
    q = st.segmented_control(t("Quantity"), list(FX.SUMMARY_LABELS), key="exp_summary_q", required=True,
                             format_func=lambda k: t(FX.SUMMARY_LABELS[k])) or "entropy"
    show_figure(FX.summary_maps(an.head_summary(trace), q), key="exp_summary", filename=f"head-{q}")


LM_IMPORTANCE_MAX_TOKENS = 64  # an LM's head importance runs on at most this many tokens (SmolLM2: 270 heads)


def lm_view(view: str, sel) -> None:
    lm = sel.ckpt.obj
    if view == "attribution":
        st.info(t("Attribution here ranks the source tokens of an encoder–decoder model; a decoder-only model has no "
                  "source sentence. Its per-head direct logit attribution is on the Attention phenomena page."),
                icon="🧩")
        st.page_link("viz/pages/phenomena.py", label=t("Direct logit attribution (IOI)"), icon=":material/insights:",
                     query_params={"checkpoint": sel.name, "phen": "ioi", "lang": current_lang()})
        return
    if view == "heads":
        _, trace = require_trace(sel)  # a long prompt: a lazy trace (the head summary reads it tile by tile)
        lm_heads_view(sel, lm, trace)
    else:
        problem = text_problems(sel.text)
        if problem:
            show_error(problem)
            return
        lm_before_after_view(sel, lm)


def _is_lm(sel) -> bool:
    try:
        return is_real_model(sel) and "lm" in capabilities(sel.name)
    except ValueError:
        return False


# ---------------------------------------------------------------- page


st.title(t("Experiments"))
st.caption(t("Every attention tool only watches. Here you change the running Transformer, one piece at a time, "
             "and see what changes: breaking a piece is the fastest way to see why it is there."))
seed_from_query("exp_view", "exp_view", "before_after", valid=lambda v: v in VIEWS)
view = st.segmented_control(t("View"), list(VIEWS), key="exp_view", format_func=lambda v: t(VIEWS[v]),
                            required=True)
view = view or "before_after"
write_query(exp_view=view)
if view == "compare":
    compare_view()
elif _is_lm(selection()):  # a decoder-only LLM: its own interventions and measures
    lm_view(view, selection())
else:
    require("toy")  # interventions and held-out runs of a toy task
    sel, trace = require_trace()
    ckpt = load_ckpt(sel.name)
    {"before_after": before_after_view, "heads": heads_view, "attribution": attribution_view}[view](sel, ckpt, trace)
