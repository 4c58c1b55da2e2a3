"""Language model: a real decoder-only LLM (SmolLM2, or one the server was started with) read and run live.

Views: Head overview (a layer × head overview of a per-head statistic; a click opens that head, with the Attention
page's head heatmap and its in-browser head buttons), Generate (token by token, streamed: each step's top-10
and where the new position looked in every layer), Logit lens (layer × position: top token and probability).

URL parameters: prompt (raw text, no chat template), chat=1 (wrapped in the model's chat template), view
(heads | generate | lens), layer, head, stat (the overview's statistic), why=Q,K and why_vs=J (the "Why here?" panel
on one cell of the head heatmap, viz/ui/why_panel.py); with the sidebar's checkpoint= they
reopen the same picture. rep=N:SEED (a link from the Attention phenomena page) runs that page's input
instead of a prompt: [BOS] + N random tokens + the same N again, the same token ids
(phenomena.induction_sequence), so a head's score here is the number that page showed.
"""

import functools

import numpy as np
import streamlit as st

from model.analysis import logit_lens as LL
from model.analysis import long as LG
from model.analysis import phenomena as PH
from viz.figures import attention as F
from viz.figures import llm as FL
from viz.i18n import N_, current_lang, t
from viz.ui import lm_models
from viz.ui.attention_views import _head_clicks, _on_head_click, cached_figure
from viz.ui.long_views import EXACT_UP_TO, long_trace, render_long_attention, show_document, stats_first_query
from viz.ui.models import capabilities, get_trace, load_ckpt
from viz.ui.plotly_clicks import plotly_click_component
from viz.ui.render import show_error, show_figure
from viz.ui.sidebar import require
from viz.ui.state import MAX_URL_TEXT, clamp_state, int_in, note_replaced, seed_from_query, write_query
from viz.ui.text import md_text_lines, text_problems
from viz.ui.why_panel import cell_clicks, render_why

# "Head overview", not "Heads": zh gave that msgid (the Training page's head count) as 头数, "number of heads"
VIEWS = {"heads": N_("Head overview"), "generate": N_("Generate"), "lens": N_("Logit lens")}
REPEATED = {  # "Use a prompt that repeats itself", in the UI's language where the model reads it (else English)
    "en": "The cat sat on the mat. The dog ran in the park. The cat sat on the mat. The dog ran in the park.",
    "zh": "小猫坐在垫子上。小狗在公园里跑。小猫坐在垫子上。小狗在公园里跑。",
}
MAX_NEW = 128
LENS_POSITIONS = 24  # the logit lens reads the last this-many positions (31 rows × 49k logits each)

st.title(t("Language model"))
st.caption(t("A real language model, read by the same instruments as the lab's small Transformer: a decoder-only "
             "stack (no encoder, no cross-attention) whose masked self-attention lets each token look only at "
             "the tokens before it. Type a prompt, find the heads that do something recognizable, watch it write."))
sel = require("lm", via_transformers=True)  # a model via transformers: the views it gives, a sentence for the rest
rm = sel.ckpt
lang = current_lang()


def _model_facts() -> None:
    """What the model is, from its own file (model.loaders.card): Instruct, quantized, the languages it was
    trained on."""
    from model.loaders.card import model_card

    card = model_card(rm.obj)
    if card.quantized:
        st.caption(t("Model: {name}, quantized ({q} {fmt}, dequantized to {dtype} to run here).", name=card.name,
                     q=card.quantization, fmt=card.file_format, dtype=card.compute_dtype))
    else:
        st.caption(t("Model: {name} ({dtype}).", name=card.name, dtype=card.compute_dtype))
    if licence := lm_models.licence_note(card):
        st.caption(licence)
    if "via_transformers" in capabilities(sel.name):  # model/loaders/adapter.py: not one of the lab's families
        st.caption(t("Via transformers: {name} is a {kind} model, a type the lab has no family of its own for, run by "
                     "transformers' own modules. This page shows what they give exactly: the attention weights, the "
                     "residual stream after each layer and the logits.", name=card.name,
                     kind=rm.describe().get("model_type", "?")))
    return card


card = _model_facts()

LANGUAGE_NAMES = {"en": N_("English"), "zh": N_("Chinese"), "ja": N_("Japanese"), "ko": N_("Korean"),
                  "fr": N_("French"), "de": N_("German"), "es": N_("Spanish"), "ru": N_("Russian")}


def _script_language(text: str) -> str | None:
    """A language the prompt's letters show beyond Latin script: "zh" (Han), "ja" (kana), "ko" (Hangul),
    "ru" (Cyrillic), "other"; None for Latin-only text."""
    import unicodedata

    found = None
    for ch in text:
        if not unicodedata.category(ch).startswith("L"):
            continue
        name = unicodedata.name(ch, "")
        if "HIRAGANA" in name or "KATAKANA" in name:
            return "ja"
        if "HANGUL" in name:
            return "ko"
        if name.startswith("CJK"):
            found = "zh"
        elif "CYRILLIC" in name:
            found = found or "ru"
        elif "LATIN" not in name:
            found = found or "other"
    return found


def _language_note(text: str) -> None:
    """Say when the prompt is in a language the model's own metadata says it was not trained on."""
    lang_of_text = _script_language(text)
    if lang_of_text is None or card.speaks(lang_of_text) is not False:
        return  # Latin script, a language it speaks, or a file that does not say
    names = ", ".join(t(LANGUAGE_NAMES[c]) if c in LANGUAGE_NAMES else c for c in card.languages)
    st.warning(t("This model was trained on {langs} (its file says general.languages = {codes}). Text in another "
                 "language reaches it as byte pieces it rarely saw in training (below: {example} and the like), so "
                 "expect its output to make little sense.", langs=names, codes=", ".join(card.languages),
                 example="`\\xe5\\xb7`"),
               icon="🌐")


# ---------------------------------------------------------------- the input: a prompt, or a linked token sequence

REP_N, REP_SEED = (10, 100), (0, 10_000)  # the Attention phenomena page's ranges for n and the seed


def _repeat_from_url() -> tuple[int, int] | None:
    """(n, seed) of `?rep=N:SEED`, a link from the Attention phenomena page's repeated random tokens."""
    raw = st.query_params.get("rep")
    if raw is None:
        return None
    try:
        n, seed = (int(x) for x in raw.split(":"))
    except ValueError:
        n = seed = -1
    if REP_N[0] <= n <= REP_N[1] and REP_SEED[0] <= seed <= REP_SEED[1]:
        return n, seed
    note_replaced("rep", raw, t("the prompt"))
    write_query(rep=None)
    return None


@st.cache_resource(max_entries=4, ttl=3600, show_spinner=False)
def _repeat_trace(name: str, n: int, seed: int):
    """The full trace of [BOS] + n random tokens (seeded) + the same n again: the phenomena page's ids."""
    model = load_ckpt(name)
    return model.trace(PH.induction_sequence(model.obj, n=n, seed=seed))[1]


def _leave_repeat() -> None:
    write_query(rep=None)


repeat = _repeat_from_url()
if repeat is not None:
    n_rep, seed_rep = repeat
    st.info(t("Input: [BOS] + {n} random tokens (seed {seed}) + the same {n} again, the Attention phenomena page's "
              "input, run as the same token ids (not re-typed as text): a head's score here is the number that page "
              "showed.", n=n_rep, seed=seed_rep), icon="🔁")
    st.button(t("Type a prompt instead"), on_click=_leave_repeat)
    with st.spinner(t("Running the model…")):
        trace = _repeat_trace(sel.name, n_rep, seed_rep)
    prompt, chat = None, False
    model_input = trace.meta["tgt_ids"]  # [[ids]]: what generation and the lens run on
    input_key = ("rep", n_rep, seed_rep)
    period = n_rep

# ---------------------------------------------------------------- prompt


SIDEBAR_SEEN = "_al_llm_sidebar_seen"  # the sidebar's prompt as this page last saw it


def _to_sidebar() -> None:
    """A prompt typed here becomes the session's prompt (the sidebar's), before the sidebar is drawn again."""
    text = st.session_state.get("llm_prompt")
    if isinstance(text, str):
        st.session_state["source_text"] = st.session_state[SIDEBAR_SEEN] = text


def _prompt_input():
    """(prompt, chat, trace) from the prompt box; stops the page with a sentence on input it cannot run."""
    seed_from_query("llm_prompt", "prompt", sel.text)
    seed_from_query("llm_chat", "chat", False, cast=lambda v: v == "1")
    # One prompt per session: a prompt typed in the sidebar comes here (below), one typed here goes to the
    # sidebar (_to_sidebar), so the other pages (Attention phenomena, ...) run what was typed last.
    seen = st.session_state.get(SIDEBAR_SEEN)
    if seen is not None and sel.text != seen:
        st.session_state["llm_prompt"] = sel.text
    st.session_state[SIDEBAR_SEEN] = sel.text
    c1, c2 = st.columns([5, 1])
    prompt = c1.text_area(t("Prompt"), key="llm_prompt", height=80, on_change=_to_sidebar,
                          help=t("Raw text: the model continues it. The same prompt as the sidebar's: edit either, "
                                 "every page runs it. Its link carries it (over {n} characters, as a reference to a "
                                 "copy kept on this server).",
                                 n=f"{MAX_URL_TEXT:,}"))
    chat = c2.toggle(t("Chat template"), key="llm_chat", disabled=not getattr(rm.obj, "chat_template", None),
                     help=t("Wrap the prompt in the model's chat template (a user turn, then the assistant's turn "
                            "opened), as a chat app would. Its tokens are shown below."))
    write_query(prompt=prompt, chat="1" if chat else None)  # a long prompt goes as a reference (?prompt_ref=)
    if not prompt.strip():
        show_error(t("The prompt is empty: type one above."))
        st.stop()
    problem = text_problems(prompt)
    if problem:
        show_error(problem)
        st.stop()
    long = long_trace(sel, key="llm", chat=chat, text=prompt)  # too long for a full trace: a lazy one
    if long is not None:
        return prompt, chat, long
    try:
        with st.spinner(t("Running the model…")):
            trace = get_trace(sel.name, prompt, chat=chat)
    except ValueError as e:  # too long for the model, over the capture budget, a broken chat template
        show_error(e, t("Shorten or change the prompt."))
        st.stop()
    return prompt, chat, trace


if repeat is None:
    prompt, chat, trace = _prompt_input()
    model_input, input_key, period = prompt, prompt, None
    _language_note(prompt)
lazy = hasattr(trace, "attention")  # a LazyTrace (viz/ui/long_views.py): heads computed when shown
# (a long prompt's: the entries read here, not a copy of its whole meta, token lists and all: 0.1 s a rerun)
meta = {k: trace.meta_item(k) for k in ("tgt_tokens", "model")} if lazy else trace.meta
tokens = meta.get("tgt_tokens") or []
modules = FL.lm_modules(trace)
n_layers, n_heads = len(modules), meta["model"]["attention"][modules[0]]["n_heads"]


def tokens_line(toks: list[str], start: int = 0) -> str:
    return " ".join(f"`{i}:{tok.replace('`', 'ˋ')}`" for i, tok in enumerate(toks, start))


with st.expander(lm_models.tokens_title(rm.obj, len(tokens)), expanded=chat):
    if chat:
        n_user = len(rm.obj.encode(prompt)[0])
        st.caption(t("The chat template adds {n} tokens around your {m}: the conversation's markers "
                     "(<|im_start|>, <|im_end|>, the roles) are tokens the model reads like any other.",
                     n=len(tokens) - n_user, m=n_user))
        st.code(rm.obj.render_chat(prompt), language=None, wrap_lines=True)
    shown = tokens[:400]
    st.markdown(tokens_line(shown) + (t(" … and {n} more", n=len(tokens) - len(shown)) if len(tokens) > 400 else ""))
    if (bos := lm_models.bos_note(rm.obj, chat)) and repeat is None:
        st.caption(bos)
    if any("\\x" in tok for tok in tokens):  # lm_models.readable spells a lone byte \xNN
        st.caption(lm_models.split_bytes_note(rm.obj))

# ---------------------------------------------------------------- layer, head, view

seed_from_query("llm_layer", "layer", 0, int, int_in(0, n_layers - 1))
seed_from_query("llm_head", "head", 0, int, int_in(0, n_heads - 1))
seed_from_query("llm_view", "view", "heads", valid=lambda v: v in VIEWS)
clamp_state("llm_layer", 0, n_layers - 1)
clamp_state("llm_head", 0, n_heads - 1)


@st.fragment
def views() -> None:
    """The View, Layer and Head controls and the chosen view. A fragment (issue 31 §2, a head switch <= 1 s in the
    browser on a 2,380-token prompt): another head, view or statistic reruns this part only; the sidebar, the prompt
    box, its tokenization and its token list are neither redone nor sent again. The views read layer and head (and
    view) as the page's names, as they did before this was a fragment."""
    global view, layer, head
    c1, c2, c3 = st.columns([3, 1, 1])
    view = c1.segmented_control(t("View"), list(VIEWS), format_func=lambda v: t(VIEWS[v], lang=lang),
                                key="llm_view", required=True)
    if view == "lens":  # the lens reads every layer at once: a Layer/Head select would do nothing there
        layer, head = st.session_state["llm_layer"], st.session_state["llm_head"]
    else:
        layer = c2.selectbox(t("Layer"), range(n_layers), key="llm_layer")
        head = c3.selectbox(t("Head"), range(n_heads), key="llm_head")
    write_query(view=view, layer=layer, head=head)
    {"heads": heads_view, "generate": generate_view, "lens": lens_view}[view]()


# ---------------------------------------------------------------- heads


def _statistics(trace, period=None):
    """Every per-head statistic of this trace, by model.analysis.phenomena's recipes (one pass, shared).
    `period`: the repeated block's length n when the input is the phenomena page's [BOS] + n tokens x 2 (its
    induction score is then Olsson's, as there)."""
    if hasattr(trace, "attention"):  # a long prompt's lazy trace: the same scores, tile by tile (over its last rows
        return LG.head_statistics_tiled(trace, period=period,  # when very long: long_views.stats_first_query)
                                        first_query=0 if period else stats_first_query(LG.n_tokens(trace)))
    return PH.head_statistics(trace, period=period)


# Streamlit's on_select reports box/lasso selections, not a click on a heatmap cell: this listens to plotly's
# own click event on the overview (key `figure`) and reports the cell's customdata [layer, head]. Draws nothing.
_cell_clicks = plotly_click_component("attention_lab.llm_cell_clicks", """\
    const cd = ev && ev.points && ev.points[0] && ev.points[0].customdata;
    if (cd && cd.length === 2) setTriggerValue("cell", [Number(cd[0]), Number(cd[1])]);""")


def _on_overview_click() -> None:
    """A click on a cell of the overview opens that head (before the rerun, so the selects may change)."""
    cell = getattr(st.session_state.get("llm_cell_clicks"), "cell", None)
    if isinstance(cell, list) and len(cell) == 2 and all(isinstance(v, int) for v in cell):
        if 0 <= cell[0] < n_layers and 0 <= cell[1] < n_heads:
            st.session_state["llm_layer"], st.session_state["llm_head"] = cell


def repeated_prompt(lang: str, speaks) -> str:
    """The repeating prompt offered in `lang` (REPEATED), when the model reads that language (`speaks(lang)`, as the
    prompt it opens on: lm_models.RealModel.speaks); else the English one."""
    return REPEATED[lang] if lang in REPEATED and speaks(lang) else REPEATED["en"]


def _use_repeated() -> None:
    st.session_state["llm_prompt"] = repeated_prompt(lang, getattr(rm, "speaks", lambda _: False))


def heads_view() -> None:
    seed_from_query("llm_stat", "stat", "sink", cast=lambda v: FL.STAT_ALIASES.get(v, v),
                           valid=lambda v: v in FL.STATS)
    stat = st.selectbox(t("Per-head statistic"), list(FL.STATS), key="llm_stat",
                        format_func=lambda s: t(FL.STATS[s][0], lang=lang))
    write_query(stat=stat)
    scores = cached_figure(trace, _statistics, period, shared=True)[stat].scores
    if not (scores == scores).any():  # all NaN: nothing to draw
        st.info(t("This prompt repeats no token, so no head can show this score here: the duplicate-token and "
                  "induction scores look at a token's earlier copies."), icon="🔁")
        if st.button(t("Use a prompt that repeats itself"), on_click=_use_repeated):
            st.rerun()  # the whole page: the prompt box and its tokens (outside this fragment) change too
    else:
        fig = FL.head_overview(scores, stat, layer, head)
        show_figure(fig, key="llm_overview", filename=f"{sel.name}-{stat}")
        _cell_clicks(key="llm_cell_clicks", data={"figure": "llm_overview"}, height=0,
                     on_cell_change=_on_overview_click)
        first = stats_first_query(len(tokens)) if lazy and period is None else 0
        if first:
            st.caption(t("A long prompt: every head's statistic here is over its last {n} positions (of {T}), each "
                         "with all the tokens before it; over every position it would take too long.",
                         n=f"{len(tokens) - first:,}", T=f"{len(tokens):,}"))
        best = divmod(int(np.nanargmax(scores)), n_heads)
        st.caption(t("{n_layers} layers × {n_heads} heads on this input; highest: layer {l} head {h} ({v}); layer "
                     "{sl} head {sh}: {sv}. Hover a cell for its number, click it to open that head below.",
                     n_layers=n_layers, n_heads=n_heads, l=best[0], h=best[1], v=F.num(float(scores[best])),
                     sl=layer, sh=head, sv=F.num(float(scores[layer, head]))))
    name = modules[layer]
    if lazy:  # a long prompt: the pooled map with a window of exact cells, and the document view
        render_long_attention(trace, tokens, key="llm", layer=layer, head=head)
        render_why(rm.obj, trace, name, layer, head, tokens, key="llm")
        return
    fig = FL.with_min_cells(F.attention_heatmap(trace, name, head, meta=meta, all_heads=True))
    show_figure(fig, key="llm_head_fig", filename=f"{name}-head{head}", width="content")
    if len(fig.data) > 1:  # the head buttons switch in the browser; the server follows (as on the Attention page)
        _head_clicks(key="llm_head_clicks", data={"figure": "llm_head_fig"}, height=0,
                     on_head_change=functools.partial(_on_head_click, "llm", len(fig.data)))
    # a click on a cell opens "Why here?" on it (and on the head whose curve was clicked)
    cell_clicks("llm", "llm_head_fig", len(tokens), len(tokens), head_key="llm_head", n_curves=len(fig.data))
    render_why(rm.obj, trace, name, layer, head, tokens, key="llm")


# ---------------------------------------------------------------- generate

STEP_KEYS = 1024  # a step's every-layer map draws at most this many keys (L x keys cells: at 8,192 keys 1.5 MB)
GEN_KEY = "_al_llm_generation"  # st.session_state: (inputs, steps) of this session's last generation


def _readable(piece: str) -> str:
    return rm.readable([piece])[0]


def _bars(step) -> list[tuple[str, float]]:
    """What a step's bars show: the distribution the token was drawn from (temperature, top-k, top-p applied),
    the chosen token always among them; greedy: the model's own top 10."""
    return step.drawn_top if step.drawn_top else step.top


def _top_table(step) -> str:
    rows = [f"| {i + 1} | `{_readable(tok).replace('`', 'ˋ').replace('|', '¦')}` | {F.num(p)} |"
            for i, (tok, p) in enumerate(_bars(step))]
    return "\n".join([f"| # | {t('token')} | {t('probability')} |", "|---|---|---|", *rows])


def _shown_text(steps) -> tuple[str, int]:
    """The output so far, never ending in a broken character: the tokens of a character still incomplete
    (byte-level BPE splits a Chinese character over pieces) wait for the next one (model.loaders.utf8)."""
    from model.loaders.utf8 import complete_text

    ids = [s.id for s in steps if s.id not in rm.obj.stop_set(chat)]
    return complete_text(rm.obj.decode, ids)


# where a stop id comes from (model/loaders/lm.py STOP_*, LanguageModel.stop_rule): the texts the caption translates
STOP_SOURCES = (N_("the model file's end-of-sequence token (GGUF tokenizer.ggml.eos_token_id)"),
                N_("the model file's end-of-turn token (GGUF tokenizer.ggml.eot_token_id)"),
                N_("the model file's end-of-message token (GGUF tokenizer.ggml.eom_token_id)"),
                N_("the model's end-of-sequence token (config.json eos_token_id)"),
                N_("the model's generation config (generation_config.json eos_token_id)"),
                N_("the chat template: it closes the assistant's turn with this token"),
                N_("given when the model was made (stop_ids)"))


def _stop_caption() -> str:
    """Which ids end this generation and where each comes from (LanguageModel.stop_rule: the model file's own end
    tokens, and in a chat the token the chat template closes the assistant's turn with)."""
    rule = t("The rule: the model file's own end tokens, and with the chat template on, the token the template "
             "closes the assistant's turn with.")
    rows = rm.obj.stop_rule(chat)
    zh = current_lang() == "zh"
    if not rows:
        return t("No token ends a generation here (the model file names no end token): it runs to the number of "
                 "new tokens.") + ("" if zh else " ") + rule
    ends = ("；" if zh else "; ").join(t("“{tok}” (id {id}: {source})", tok=_readable(tok), id=i, source=t(src))
                                      for i, tok, src in rows)
    return (t("A generation ends when the model writes {ends}, or after the number of new tokens.", ends=ends)
            + ("" if zh else " ") + rule)


def _bars_title(step, i: int, temperature: float, plain: bool = False) -> str:
    if step.drawn_top:
        return t("Step {i}: the top {k} of the distribution it was drawn from (temperature {T}, top-k and top-p "
                 "applied)", i=i, k=len(step.drawn_top), T=F.num(temperature))
    if plain:
        return t("Step {i}: top {k} next tokens", i=i, k=len(step.top))
    return t("Step {i}: the model's top {k} before choosing", i=i, k=len(step.top))


def generate_view() -> None:
    c = st.columns(5)
    seed_from_query("llm_max", "max_new", 24, int, int_in(1, MAX_NEW))
    seed_from_query("llm_temp", "temperature", 0.0, float, lambda v: 0 <= v <= 2)
    seed_from_query("llm_topk", "top_k", 0, int, int_in(0, 1000))
    seed_from_query("llm_topp", "top_p", 1.0, float, lambda v: 0.01 <= v <= 1)
    seed_from_query("llm_seed", "seed", 0, int, int_in(0, 2**31 - 1))
    max_new = c[0].number_input(t("New tokens"), 1, MAX_NEW, key="llm_max")
    temp = c[1].slider(t("Temperature"), 0.0, 2.0, step=0.05, key="llm_temp",
                       help=t("0 = greedy (always the most likely token); higher = more random."))
    top_k = c[2].number_input(t("Top-k"), 0, 1000, key="llm_topk", help=t("Sample only among the k most likely "
                                                                          "tokens; 0 = off."))
    top_p = c[3].slider(t("Top-p"), 0.01, 1.0, step=0.01, key="llm_topp",
                        help=t("Sample only among the most likely tokens whose probabilities add up to p; 1 = off."))
    seed = c[4].number_input(t("Seed"), 0, 2**31 - 1, key="llm_seed", help=t("The same seed gives the same sample."))
    write_query(max_new=max_new, temperature=temp, top_k=top_k, top_p=top_p, seed=seed)
    st.caption(_stop_caption())
    inputs = (sel.name, input_key, chat, int(max_new), float(temp), int(top_k), float(top_p), int(seed))
    text_box, top_box = st.empty(), st.empty()
    if st.button(t("Generate"), type="primary", icon=":material/play_arrow:"):
        steps = []
        try:
            for step in rm.obj.stream(model_input, max_new_tokens=int(max_new), temperature=float(temp),
                                      top_k=int(top_k), top_p=float(top_p), seed=int(seed), chat=chat,
                                      fast=len(tokens) > EXACT_UP_TO):
                steps.append(step)
                text, _ = _shown_text(steps)  # the text, not the pieces (end token left out), whole characters
                text_box.markdown(t("**Output so far** ({n} tokens): ", n=len(steps)) + md_text_lines(text))
                top_box.markdown(_bars_title(step, len(steps), float(temp)) + "\n\n" + _top_table(step))
        except ValueError as e:  # no room left in the context, bad sampling values
            show_error(e)
            return
        st.session_state[GEN_KEY] = (inputs, steps)
        text_box.empty()
        top_box.empty()
    done = st.session_state.get(GEN_KEY)
    if not done or done[0] != inputs:
        st.caption(t("Press Generate: tokens appear one by one, each with the model's top 10 and where it looked."))
        return
    steps = done[1]
    stop = bool(steps) and steps[-1].id in rm.obj.stop_set(chat)
    out, held = _shown_text(steps)
    st.markdown(t("**Output** ({n} tokens, {why}): ", n=len(steps),
                  why=t("stopped at the end token") if stop else t("stopped at the token limit"))
                + md_text_lines(out))  # a generated newline breaks the line, drawn as ↵
    if held:
        st.caption(t("The last {n} token(s) hold part of a character whose other bytes never came (generation "
                     "stopped first): left out above.", n=held))
    clamp_state("llm_step", 0, len(steps) - 1)
    i = st.slider(t("Step"), 0, len(steps) - 1, key="llm_step") if len(steps) > 1 else 0
    step = steps[i]
    so_far = tokens + [_readable(s.token) for s in steps[:i]]
    c1, c2 = st.columns([1, 2])
    with c1:
        bars = _bars(step)
        show_figure(FL.top_tokens_figure([(_readable(a), p) for a, p in bars], _readable(step.token),
                                         title=_bars_title(step, i, float(temp), plain=True)),
                    key="llm_top_fig")
        drawn = step.sampled_prob if step.sampled_prob is not None else step.prob
        if step.drawn_top:
            st.caption(t("Chosen: “{tok}” (probability {p} in the distribution it was drawn from; the model's own, at "
                         "temperature 1: {p1}).", tok=_readable(step.token), p=F.num(drawn), p1=F.num(step.prob)))
        else:
            st.caption(t("Chosen: “{tok}” (probability {p}).", tok=_readable(step.token), p=F.num(drawn)))
    with c2:
        if step.attention is not None:
            first = max(0, step.attention.shape[-1] - STEP_KEYS)  # a long context: its last keys (figure size)
            title = t("Step {i}: where position {pos} looked, every layer · head {head}", i=i, pos=step.position,
                      head=head)
            if first:
                title += t(" (its last {n} keys; the text below shows the rest)", n=f"{STEP_KEYS:,}")
            show_figure(FL.step_attention_figure(step.attention, so_far, head, title=title, first=first),
                        key="llm_step_attn")
            view = LG.focus(step.attention, layer, head, position=step.position)  # the document view of this step
            st.caption(t("Where position {pos} looked (layer {layer}, head {head}): the text shaded by its weights.",
                         pos=step.position, layer=layer, head=head))
            show_document(so_far, view, key="llm_gen")


# ---------------------------------------------------------------- logit lens


def _lens(trace, name: str, model=None):
    """model.analysis.logit_lens over this trace's own ids (chat-wrapped when it was), last positions only."""
    T = len(trace.meta["tgt_ids"][0])
    return LL.logit_lens(model.obj, trace.meta["tgt_ids"], positions=range(max(0, T - LENS_POSITIONS), T))


def lens_sentence(settled, tok: str, p: float) -> str:
    """Where the answer appears and whether it stays, as the lens shows it (logit_lens.settles)."""
    if settled.only_last and settled.first_top == settled.layer:
        return t("At the last position the model's answer is “{tok}” ({p}); it tops the lens only at the last layer "
                 "({l}): every earlier layer reads another token there.", tok=tok, p=F.num(p), l=settled.layer)
    return t("At the last position the model's answer is “{tok}” ({p}); it is the lens's top token from layer {l} "
             "on (of {n}).", tok=tok, p=F.num(p), l=settled.layer, n=settled.n_layers)


def lens_view() -> None:
    st.caption(t("The logit lens reads every layer's residual stream as if it were the last: the final norm "
                 "(its statistics recomputed for that layer's vector) and the unembedding turn it into next-token "
                 "probabilities. Each cell: the top token after that layer, coloured by its probability. It shows "
                 "where in depth the answer appears."))
    if not getattr(rm.obj.model, "exact_unembed", True):  # via transformers, logits not lm_head(final norm(x))
        from viz.ui.sidebar import adapter_note

        st.info(adapter_note(sel.name), icon="🧩")
        return
    T = len(tokens)
    with st.spinner(t("Reading every layer…")):
        lens = cached_figure(trace, _lens, sel.name, shared=True, model=rm)
    positions = list(range(max(0, T - LENS_POSITIONS), T))
    if len(positions) < T:
        st.caption(t("A long prompt: the table shows its last {n} positions (of {T}).", n=len(positions), T=T))
    tops, probs = [rm.readable(row) for row in lens.top_tokens], lens.top_probs
    rows = [t("embed") if r == "embed" else r for r in lens.layers]  # the row of the embeddings, in the UI's words
    show_figure(FL.logit_lens_figure(tops, probs, positions, tokens, rows=rows), key="llm_lens_fig")
    st.markdown(lens_sentence(LL.settles(lens), tops[-1][-1], float(probs[-1, -1])))


views()
