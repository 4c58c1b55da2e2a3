"""Language model: a real decoder-only LLM (SmolLM2, or one the server was started with) read and run live.

Views: Heads (a layer × head overview of a per-head statistic; a click opens that head, with the Attention
page's head heatmap and its in-browser head buttons), Generate (token by token, streamed: each step's top-10
and where the new position looked in every layer), Logit lens (layer × position: top token and probability).

URL parameters: prompt (raw text, no chat template), chat=1 (wrapped in the model's chat template), view
(heads | generate | lens), layer, head, stat (the overview's statistic); with the sidebar's checkpoint= they
reopen the same picture.
"""

import functools

import numpy as np
import streamlit as st

from model.analysis import logit_lens as LL
from model.analysis import phenomena as PH
from viz.figures import attention as F
from viz.figures import llm as FL
from viz.i18n import N_, current_lang, t
from viz.ui import lm_models
from viz.ui.attention_views import _head_clicks, _on_head_click, cached_figure
from viz.ui.models import get_trace
from viz.ui.render import show_error, show_figure
from viz.ui.sidebar import require
from viz.ui.state import MAX_URL_TEXT, clamp_state, int_in, seed_from_query, write_query
from viz.ui.text import md_escape, text_problems

VIEWS = {"heads": N_("Heads"), "generate": N_("Generate"), "lens": N_("Logit lens")}
REPEATED = ("The cat sat on the mat. The dog ran in the park. The cat sat on the mat. The dog ran in the park.")
MAX_NEW = 128
LENS_POSITIONS = 24  # the logit lens reads the last this-many positions (31 rows × 49k logits each)

st.title(t("Language model"))
st.caption(t("A real language model, read by the same instruments as the lab's small Transformer: a decoder-only "
             "stack (no encoder, no cross-attention) whose masked self-attention lets each token look only at "
             "the tokens before it. Type a prompt, find the heads that do something recognizable, watch it write."))
sel = require("lm")
rm = sel.ckpt
lang = current_lang()

# ---------------------------------------------------------------- prompt

seed_from_query("llm_prompt", "prompt", sel.text)
seed_from_query("llm_chat", "chat", False, cast=lambda v: v == "1")
c1, c2 = st.columns([5, 1])
prompt = c1.text_area(t("Prompt"), key="llm_prompt", height=80,
                      help=t("Raw text: the model continues it. Its link carries it (up to {n} characters).",
                             n=f"{MAX_URL_TEXT:,}"))
chat = c2.toggle(t("Chat template"), key="llm_chat", disabled=not getattr(rm.obj, "chat_template", None),
                 help=t("Wrap the prompt in the model's chat template (a user turn, then the assistant's turn "
                        "opened), as a chat app would. Its tokens are shown below."))
write_query(prompt=prompt if len(prompt) <= MAX_URL_TEXT else None, chat="1" if chat else None)
if not prompt.strip():
    show_error(t("The prompt is empty: type one above."))
    st.stop()
problem = text_problems(prompt)
if problem:
    show_error(problem)
    st.stop()
try:
    with st.spinner(t("Running the model…")):
        trace = get_trace(sel.name, prompt, chat=chat)
except ValueError as e:  # too long for the model, over the capture budget, a broken chat template
    show_error(e, t("Shorten or change the prompt."))
    st.stop()
meta = trace.meta
tokens = meta.get("tgt_tokens") or []
modules = FL.lm_modules(trace)
n_layers, n_heads = len(modules), trace[f"{modules[0]}.weights"].shape[1]


def tokens_line(toks: list[str], start: int = 0) -> str:
    return " ".join(f"`{i}:{tok.replace('`', 'ˋ')}`" for i, tok in enumerate(toks, start))


with st.expander(t("{n} tokens (byte-level BPE pieces; ␣ is a space, ↵ a newline)", n=len(tokens)),
                 expanded=chat):
    if chat:
        n_user = len(rm.obj.encode(prompt)[0])
        st.caption(t("The chat template adds {n} tokens around your {m}: the conversation's markers "
                     "(<|im_start|>, <|im_end|>, the roles) are tokens the model reads like any other.",
                     n=len(tokens) - n_user, m=n_user))
        st.code(rm.obj.render_chat(prompt), language=None, wrap_lines=True)
    shown = tokens[:400]
    st.markdown(tokens_line(shown) + (t(" … and {n} more", n=len(tokens) - len(shown)) if len(tokens) > 400 else ""))

# ---------------------------------------------------------------- layer, head, view

seed_from_query("llm_layer", "layer", 0, int, int_in(0, n_layers - 1))
seed_from_query("llm_head", "head", 0, int, int_in(0, n_heads - 1))
seed_from_query("llm_view", "view", "heads", valid=lambda v: v in VIEWS)
clamp_state("llm_layer", 0, n_layers - 1)
clamp_state("llm_head", 0, n_heads - 1)
c1, c2, c3 = st.columns([3, 1, 1])
view = c1.segmented_control(t("View"), list(VIEWS), format_func=lambda v: t(VIEWS[v], lang=lang), key="llm_view",
                            required=True)
layer = c2.selectbox(t("Layer"), range(n_layers), key="llm_layer")
head = c3.selectbox(t("Head"), range(n_heads), key="llm_head")
write_query(view=view, layer=layer, head=head)


# ---------------------------------------------------------------- heads


def _statistics(trace):
    """Every per-head statistic of this trace, by model.analysis.phenomena's recipes (one pass, shared)."""
    return PH.head_statistics(trace)


# Streamlit's on_select reports box/lasso selections, not a click on a heatmap cell: this listens to plotly's
# own click event on the overview (key `figure`) and reports the cell's customdata [layer, head]. Draws nothing.
_CELL_CLICKS_JS = """
export default function ({ data, setTriggerValue }) {
  let gd = null;
  const onClick = (ev) => {
    const cd = ev && ev.points && ev.points[0] && ev.points[0].customdata;
    if (cd && cd.length === 2) setTriggerValue("cell", [Number(cd[0]), Number(cd[1])]);
  };
  const attach = () => {
    const el = document.querySelector(".st-key-" + data.figure + " .js-plotly-plot");
    if (el && el !== gd && el.on) { gd = el; gd.on("plotly_click", onClick); }
  };
  attach();
  const timer = setInterval(attach, 250);  // the chart is redrawn (a new element) on reruns
  return () => clearInterval(timer);
}
"""
_cell_clicks = st.components.v2.component("attention_lab.llm_cell_clicks", js=_CELL_CLICKS_JS)


def _on_overview_click() -> None:
    """A click on a cell of the overview opens that head (before the rerun, so the selects may change)."""
    cell = getattr(st.session_state.get("llm_cell_clicks"), "cell", None)
    if isinstance(cell, list) and len(cell) == 2 and all(isinstance(v, int) for v in cell):
        if 0 <= cell[0] < n_layers and 0 <= cell[1] < n_heads:
            st.session_state["llm_layer"], st.session_state["llm_head"] = cell


def _use_repeated() -> None:
    st.session_state["llm_prompt"] = REPEATED


def heads_view() -> None:
    seed_from_query("llm_stat", "stat", "sink", cast=lambda v: FL.STAT_ALIASES.get(v, v),
                           valid=lambda v: v in FL.STATS)
    stat = st.selectbox(t("Per-head statistic"), list(FL.STATS), key="llm_stat",
                        format_func=lambda s: t(FL.STATS[s][0], lang=lang))
    write_query(stat=stat)
    scores = cached_figure(trace, _statistics, shared=True)[stat].scores
    if not (scores == scores).any():  # all NaN: nothing to draw
        st.info(t("This prompt repeats no token, so no head can show this score here: the duplicate-token and "
                  "induction scores look at a token's earlier copies."), icon="🔁")
        st.button(t("Use a prompt that repeats itself"), on_click=_use_repeated)
    else:
        fig = FL.head_overview(scores, stat, layer, head)
        show_figure(fig, key="llm_overview", filename=f"{sel.name}-{stat}")
        _cell_clicks(key="llm_cell_clicks", data={"figure": "llm_overview"}, height=0,
                     on_cell_change=_on_overview_click)
        best = divmod(int(np.nanargmax(scores)), n_heads)
        st.caption(t("{n_layers} layers × {n_heads} heads on this prompt; highest: layer {l} head {h} ({v}). Hover "
                     "a cell for its number, click it to open that head below.", n_layers=n_layers,
                     n_heads=n_heads, l=best[0], h=best[1], v=F.num(float(scores[best]))))
    name = modules[layer]
    fig = F.attention_heatmap(trace, name, head, meta=meta, all_heads=True)
    show_figure(fig, key="llm_head_fig", filename=f"{name}-head{head}", width="content")
    if len(fig.data) > 1:  # the head buttons switch in the browser; the server follows (as on the Attention page)
        _head_clicks(key="llm_head_clicks", data={"figure": "llm_head_fig"}, height=0,
                     on_head_change=functools.partial(_on_head_click, "llm", len(fig.data)))


# ---------------------------------------------------------------- generate

GEN_KEY = "_al_llm_generation"  # st.session_state: (inputs, steps) of this session's last generation


def _readable(piece: str) -> str:
    return lm_models.readable(piece)


def _top_table(step) -> str:
    rows = [f"| {i + 1} | `{_readable(tok).replace('`', 'ˋ').replace('|', '¦')}` | {F.num(p)} |"
            for i, (tok, p) in enumerate(step.top)]
    return "\n".join([f"| # | {t('token')} | {t('probability')} |", "|---|---|---|", *rows])


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
    inputs = (sel.name, prompt, chat, int(max_new), float(temp), int(top_k), float(top_p), int(seed))
    text_box, top_box = st.empty(), st.empty()
    if st.button(t("Generate"), type="primary", icon=":material/play_arrow:"):
        steps = []
        try:
            for step in rm.obj.stream(prompt, max_new_tokens=int(max_new), temperature=float(temp),
                                      top_k=int(top_k), top_p=float(top_p), seed=int(seed), chat=chat):
                steps.append(step)
                text = rm.obj.decode([s.id for s in steps])  # the text, not the pieces (end token left out)
                text_box.markdown(t("**Output so far** ({n} tokens): ", n=len(steps)) + md_escape(text))
                top_box.markdown(t("Step {i}: the model's top {k} before choosing", i=len(steps), k=len(step.top))
                                 + "\n\n" + _top_table(step))
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
    stop = rm.obj.stop_ids and steps and steps[-1].id in rm.obj.stop_ids
    out = rm.obj.decode([s.id for s in steps])
    st.markdown(t("**Output** ({n} tokens, {why}): ", n=len(steps),
                  why=t("stopped at the end token") if stop else t("stopped at the token limit"))
                + md_escape(out))
    clamp_state("llm_step", 0, len(steps) - 1)
    i = st.slider(t("Step"), 0, len(steps) - 1, key="llm_step") if len(steps) > 1 else 0
    step = steps[i]
    so_far = tokens + [_readable(s.token) for s in steps[:i]]
    c1, c2 = st.columns([1, 2])
    with c1:
        show_figure(FL.top_tokens_figure([(_readable(a), p) for a, p in step.top], _readable(step.token),
                                                title=t("Step {i}: top {k} next tokens", i=i, k=len(step.top))),
                           key="llm_top_fig")
        st.caption(t("Chosen: “{tok}” (probability {p}).", tok=_readable(step.token), p=F.num(step.prob)))
    with c2:
        if step.attention is not None:
            show_figure(FL.step_attention_figure(
                step.attention, so_far, head, title=t("Step {i}: where position {pos} looked, every layer · head "
                                                      "{head}", i=i, pos=step.position, head=head)),
                key="llm_step_attn")


# ---------------------------------------------------------------- logit lens


def _lens(trace, name: str, model=None):
    """model.analysis.logit_lens over this trace's own ids (chat-wrapped when it was), last positions only."""
    T = len(trace.meta["tgt_ids"][0])
    return LL.logit_lens(model.obj, trace.meta["tgt_ids"], positions=range(max(0, T - LENS_POSITIONS), T))


def lens_view() -> None:
    st.caption(t("The logit lens reads every layer's residual stream as if it were the last: the final norm "
                 "(its statistics recomputed for that layer's vector) and the unembedding turn it into next-token "
                 "probabilities. Each cell: the top token after that layer, coloured by its probability. It shows "
                 "where in depth the answer appears."))
    T = len(tokens)
    with st.spinner(t("Reading every layer…")):
        lens = cached_figure(trace, _lens, sel.name, shared=True, model=rm)
    positions = list(range(max(0, T - LENS_POSITIONS), T))
    if len(positions) < T:
        st.caption(t("A long prompt: the table shows its last {n} positions (of {T}).", n=len(positions), T=T))
    tops, probs = [rm.readable(row) for row in lens.top_tokens], lens.top_probs
    show_figure(FL.logit_lens_figure(tops, probs, positions, tokens, rows=lens.layers), key="llm_lens_fig")
    final = lens.top_ids[-1, -1]
    first = next(i for i in range(len(tops)) if (lens.top_ids[i:, -1] == final).all())
    st.markdown(t("At the last position the model's answer is “{tok}” ({p}); it is the lens's top token from "
                  "layer {l} on.", tok=tops[-1][-1], p=F.num(float(probs[-1, -1])), l=lens.layers[first]))


{"heads": heads_view, "generate": generate_view, "lens": lens_view}[view]()
