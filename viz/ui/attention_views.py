"""The attention explorer as one reusable Streamlit composition.

`render_attention(trace)` draws the whole explorer for any trace: the encoder-decoder
checkpoints (encoder self / decoder self / cross attention) and encoder-only traces (only
`encoder.*` names, tokens from meta "src_tokens"), e.g. the Pretrained encoder page:

    from viz.ui.attention_views import render_attention
    render_attention(trace, key="pre")      # key: a prefix for widget keys and URL params

Cheap per click (issue 12): the head heatmap carries every head of the layer and switches heads with
its own buttons in the browser (no server round trip); a tiny component then tells the server, so the
Head select, the view below and the URL follow. The explorer is an `st.fragment`, so changing the
kind, layer, head or view reruns only the explorer, not the page; only the chosen view is built (a
segmented control, kept in the URL, instead of tabs that build every view on every run); figures that
do not depend on the head are cached in the session (bounded), so a head switch rebuilds two figures.

Long inputs (up to 512 tokens) stay light: the chosen head's heatmap is at full resolution, the
all-heads grid and the model view are max-pooled (said in their titles and captions), and the
score pipeline and masks show a window of query rows picked with a selector.
"""

from __future__ import annotations

import functools
import re

import streamlit as st

from model.core.describe import attention_of, described
from viz.figures import attention as F
from viz.figures import modern as FM
from viz.i18n import N_, current_lang, t
from viz.ui.figure_cache import cached_figure  # noqa: F401  (pages import it from here too)
from viz.ui.models import session_models
from viz.ui.render import show_figure
from viz.ui.state import clamp_state, int_in, seed_from_query, write_query

KIND_IDS = {"encoder_self": "enc", "decoder_self": "dec", "cross": "cross"}  # model/core/describe.py kinds
KINDS = {  # stable id (URL value) -> (label, module name pattern, what it teaches)
    "enc": (N_("Encoder self-attention"), "encoder.layers.{i}.self_attn",
            N_("Q, K and V all come from the source: every source token looks at every source token (only "
               "[PAD] keys are masked).")),
    "dec": (N_("Decoder self-attention (masked)"), "decoder.layers.{i}.self_attn",
            N_("Q, K and V come from the target; the look-ahead mask M (−∞ above the diagonal) keeps position "
               "t from seeing t+1, t+2, …")),
    "cross": (N_("Cross-attention (encoder–decoder)"), "decoder.layers.{i}.cross_attn",
              N_("Q comes from the decoder (target), K and V from the encoder output (source): each target "
                 "token looks up the source tokens it needs.")),
}
VIEWS = {  # stable id (URL value) -> label
    "heads": N_("All heads"), "model": N_("Model view"), "pipeline": N_("Score pipeline"),
    "masks": N_("Masks"), "qkvz": N_("Q · K · V · z"), "sqrt": N_("Why √d_k"),
}
_LAYER = re.compile(r"\.layers\.(\d+)\.")

# Reports a click on a head button of the head heatmap (key `figure`) as the trigger "head"; draws nothing.
# Plotly has already switched the picture; this only lets the server catch up (select, views, URL).
_HEAD_CLICKS_JS = """
export default function ({ data, setTriggerValue }) {
  const onClick = (event) => {
    const button = event.target.closest && event.target.closest(".updatemenu-button");
    if (!button || !button.closest(".st-key-" + data.figure)) return;
    const buttons = [...button.parentNode.children].filter((el) => el.classList.contains("updatemenu-button"));
    setTriggerValue("head", buttons.indexOf(button));
  };
  document.addEventListener("click", onClick, true);
  return () => document.removeEventListener("click", onClick, true);
}
"""
_head_clicks = st.components.v2.component("attention_lab.head_clicks", js=_HEAD_CLICKS_JS)


def attention_modules(trace) -> dict[str, list[str]]:
    """Kind id -> the attention modules of that kind present in `trace`, by layer (from the model's own
    description in trace.meta, never from parsing names)."""
    out: dict[str, list[str]] = {}
    for module, info in described(trace.meta).get("attention", {}).items():
        if f"{module}.weights" in trace:
            out.setdefault(KIND_IDS[info["kind"]], []).append(module)
    return {k: out[k] for k in KINDS if k in out}


def _choose(trace, key: str) -> tuple[str, list[str], int, int]:
    """Kind, layer and head widgets (seeded from the URL or the session, written back to the URL)."""
    mods = attention_modules(trace)
    if not mods:
        st.info(t("This trace holds no attention weights (capture '*.weights' to see them)."))
        st.stop()
    kinds = list(mods)
    lang = current_lang()  # labels in this session's language, also when a test formats them later
    # Open on cross-attention when there is one: it is where a trained model's alignment shows.
    seed_from_query(f"{key}_kind", f"{key}_kind", "cross" if "cross" in mods else kinds[0],
                           valid=lambda v: v in mods)
    c1, c2, c3 = st.columns([2, 1, 1])
    kind = c1.radio(t("Attention"), kinds, format_func=lambda k: t(KINDS[k][0], lang=lang), key=f"{key}_kind",
                    horizontal=True)
    names = mods[kind]
    n_heads = trace[f"{names[0]}.weights"].shape[1]
    seed_from_query(f"{key}_layer", "layer", 0, int, int_in(0, len(names) - 1))
    seed_from_query(f"{key}_head", "head", 0, int, int_in(0, n_heads - 1))
    # Another kind or model may have fewer layers/heads than the value remembered in the session.
    clamp_state(f"{key}_layer", 0, len(names) - 1)
    clamp_state(f"{key}_head", 0, n_heads - 1)
    layer = c2.selectbox(t("Layer"), range(len(names)), key=f"{key}_layer")
    head = c3.selectbox(t("Head"), range(n_heads), key=f"{key}_head")
    write_query(**{f"{key}_kind": kind, "layer": layer, "head": head})
    return kind, names, layer, head


def _choose_view(key: str) -> str:
    lang = current_lang()
    seed_from_query(f"{key}_view", "view", "heads", valid=lambda v: v in VIEWS)
    view = st.segmented_control(t("View"), list(VIEWS), format_func=lambda v: t(VIEWS[v], lang=lang), key=f"{key}_view",
                                required=True, label_visibility="collapsed")
    write_query(view=view)
    return view


def _on_model_view_click(key: str, chart_key: str) -> None:
    """Clicking a thumbnail selects its layer and head (runs before the rerun, so widgets may change)."""
    state = st.session_state.get(chart_key) or {}
    for p in (state.get("selection") or {}).get("points") or []:
        cd = p.get("customdata") if isinstance(p, dict) else None
        if cd and len(cd) == 2:
            st.session_state[f"{key}_layer"], st.session_state[f"{key}_head"] = int(cd[0]), int(cd[1])
            return


def _on_head_click(key: str, n_heads: int) -> None:
    """A head button was clicked in the browser: select that head (before the rerun, so the widget may change)."""
    h = getattr(st.session_state.get(f"{key}_head_clicks"), "head", None)
    if isinstance(h, int) and 0 <= h < n_heads:
        st.session_state[f"{key}_head"] = h


def _query_rows(trace, name: str, key: str) -> tuple[int, int] | None:
    """On a long input, a selector of query-row windows (pages of F.QUERY_WINDOW rows) and a caption;
    None (every row) when the input is short."""
    _, _, n_q, n_k = trace[f"{name}.weights"].shape
    if n_q <= F.QUERY_WINDOW:
        return None
    windows = F.query_windows(n_q)
    lang = current_lang()
    clamp_state(key, 0, len(windows) - 1)  # another module may have fewer query rows
    i = st.selectbox(t("Query rows ({n} at a time)", n=F.QUERY_WINDOW), range(len(windows)), key=key,
                     format_func=lambda j: t("rows {a}–{b} of {n}", lang, a=windows[j][0],
                                              b=windows[j][1] - 1, n=n_q))
    a, b = windows[i]
    st.caption(t("A long input ({n} queries): this view shows query rows {a}–{b}, each with all {k} keys and "
                 "exact values, to keep the page light. Pick other rows above; the head heatmap at the top "
                 "shows every row.", n=n_q, a=a, b=b - 1, k=n_k))
    return a, b




def _shared(trace) -> bool:
    """Whether `trace` comes from the process-wide trace cache (a shipped model), not from a model
    trained in this session (whose traces must not outlive the session in a process-wide cache)."""
    return trace.meta.get("checkpoint") not in session_models()


def render_attention(trace, key: str = "attn", output: str | None = None, model_tokens=None, model=None) -> None:
    """The full attention explorer for `trace` (see the module docstring). `output`: one line shown
    under the controls (e.g. the model's translation); `model_tokens`: under teacher forcing, the model's
    own prediction at each decoder position (`render.model_tokens`), named beside the reference's; `model`: the
    model that made the trace, for "Why here?" on a cell of the head heatmap (viz/ui/why_panel.py; None: no panel)."""
    _explorer(trace, key, output, model_tokens, model)


@st.fragment
def _explorer(trace, key: str, output: str | None, model_tokens=None, model=None) -> None:
    meta = trace.meta
    if model_tokens:
        meta["model_tokens"] = list(model_tokens)
    kind, names, layer, head = _choose(trace, key)
    if output:
        st.markdown(output)
    name = names[layer]
    d_k = trace[f"{name}.q"].shape[-1] if f"{name}.q" in trace else None
    st.caption(
        t("**{label}**, `{name}`. {what} Each row is one query's softmax distribution over the keys (rows sum "
          "to 1): S = softmax(QKᵀ/√d_k + M), head output z = S·V.", label=t(KINDS[kind][0]), name=name,
          what=t(KINDS[kind][2]))
        + (" " + _d_k_note(trace, name, d_k) if d_k else "")
        + _scale_note(attention_of(meta, name) or {})
        + (" " + _row_caption(meta) if attention_of(meta, name)["stack"] == "decoder" else ""))
    fig = F.attention_heatmap(trace, name, head, meta=meta, all_heads=True)
    show_figure(fig, key=f"{key}_head_fig", filename=f"{name}-head{head}", width="content")
    if len(fig.data) > 1:  # the figure's head buttons switch in the browser; the server follows
        _head_clicks(key=f"{key}_head_clicks", data={"figure": f"{key}_head_fig"}, height=0,
                     on_head_change=functools.partial(_on_head_click, key, len(fig.data)))
    if model is not None:  # "Why here?": a click on a cell (or the panel's inputs) explains that cell's score
        from viz.ui.why_panel import cell_clicks, render_why

        q_tok, k_tok = F.attention_tokens(meta, name)
        n_q, n_k = trace[f"{name}.weights"].shape[-2:]
        q_tok, k_tok = [(list(tok) + ["?"] * n)[:n] for tok, n in ((q_tok, n_q), (k_tok, n_k))]
        cell_clicks(key, f"{key}_head_fig", n_q, n_k, head_key=f"{key}_head", n_curves=len(fig.data))
        render_why(model, trace, name, layer, head, q_tok, key=key, key_tokens=k_tok,
                   label=f"{F.module_title(name, meta)} · H{head}")
    view = _choose_view(key)
    if (meta.get("model") or {}).get("family") == "decoder_lm_adapter" and view not in WEIGHTS_ONLY:
        from viz.ui.sidebar import adapter_note  # a model via transformers: weights only, no q/k/v or masks

        st.info(adapter_note(meta.get("checkpoint", "")), icon="🧩")
        return
    VIEW_BUILDERS[view](trace, key, names, layer, head, meta)


def _d_model(meta) -> int | None:
    d = described(meta).get("blocks", {}).get("d_model")
    return int(d) if d else None


def _d_k_note(trace, name: str, d_k: int) -> str:
    """d_k as this model sets it: d_model / h for the 2017 layout, or a size of its own (Gemma 3: 4 heads of 256
    on d_model = 640)."""
    H, d_model = F.kv_group(trace, name)[0], _d_model(trace.meta)
    if d_model is None or d_model == H * d_k:
        return t("Here d_k = d_model / h = {d_k}.", d_k=d_k)
    return t("Here d_k = {d_k}, a size the model sets (h × d_k = {h} × {d_k} = {hd}; d_model = {d}).", d_k=d_k,
             h=H, hd=H * d_k, d=d_model)


def heads_text(trace, name: str) -> str:
    """The All heads caption, for what this module has: every head its own W^Q, W^K, W^V (2017), or query heads
    that share K/V heads (grouped-query attention; multi-query with one K/V head), and its sizes."""
    H, H_kv = F.kv_group(trace, name)
    info = attention_of(trace.meta, name) or {}
    d_k, d_model = info.get("d_head"), _d_model(trace.meta)
    if H_kv == H and (d_k is None or d_model is None or d_model == H * d_k):
        return t("Multi-head attention: h heads, each with its own W^Q, W^K, W^V (d_model × d_k), look at the "
                 "same tokens in different ways. Their outputs are concatenated and mixed by W^O: MultiHead = "
                 "Concat(head_1, …, head_h)·W^O, with d_model = h × d_k (E = N × H).")
    if H_kv == H:
        who = t("Multi-head attention: {h} heads, each with its own W^Q, W^K, W^V (d_model × d_k), look at the same "
                "tokens in different ways.", h=H)
    elif H_kv == 1:
        who = t("Multi-query attention: {h} query heads share one K/V head. Each query head has its own W^Q "
                "(d_model × d_k); all {h} read the same keys and values, made by one W^K and one W^V.", h=H)
    else:
        who = t("Grouped-query attention: {h} query heads share {kv} K/V heads. Each query head has its own W^Q "
                "(d_model × d_k); every {r} share one W^K and one W^V, so query head h reads K/V head ⌊h / {r}⌋.",
                h=H, kv=H_kv, r=H // H_kv)
    out = who + " " + t("The heads' outputs are concatenated and mixed by W^O: MultiHead = Concat(head_1, …, "
                        "head_h)·W^O.")
    if d_k and d_model:
        out += " " + (t("Here d_model = h × d_k = {h} × {d_k} = {d}.", h=H, d_k=d_k, d=d_model) if d_model == H * d_k
                      else t("Here h × d_k = {h} × {d_k} = {hd}, which W^O maps back to d_model = {d}.", h=H, d_k=d_k,
                             hd=H * d_k, d=d_model))
    return out


def qkvz_text(trace, name: str, head: int) -> str:
    """The Q · K · V · z caption: the 2017 split into heads, and, where K/V heads are shared, which one this query
    head reads (the K and V panels are that head's)."""
    text = t("Q = X·W^Q, K = X·W^K, V = X·W^V, split into heads: (B, L, d_model) → view (B, L, h, d_k) → "
             "transpose → (B, h, L, d_k). Here one head's Q, K, V (position × d_k) and its output "
             "z = softmax(QKᵀ/√d_k + M)·V; the heads' z are transposed back and concatenated before W^O.")
    H, H_kv = F.kv_group(trace, name)
    if H_kv == H:
        return text
    if H_kv == 1:
        return text + " " + t("This model has one K/V head (multi-query attention): K and V are (B, 1, L, d_k), and "
                              "all {h} query heads read them, so the K and V panels are the same for every head.",
                              h=H)
    return text + " " + t("This model has {kv} K/V heads for {h} query heads (grouped-query attention): K and V are "
                          "(B, {kv}, L, d_k), and query head {head} reads {which}, so the K and V panels are that "
                          "head's.", kv=H_kv, h=H, head=head, which=F.kv_label(H, H_kv, head))


def _scale_note(info) -> str:
    """A sentence when the module does not compute softmax(QKᵀ/√d_k + M) as written (its description says)."""
    if not info.get("scale") or not FM.is_modern(info):
        return ""
    m = FM.mechanisms(info)
    parts = [] if m["scale_is_plain"] else [t("scales by {s}, not 1/√d_k", s=f"{m['scale']:.4g}")]
    if m["softcap"]:
        parts.append(t("soft-caps the scores at ±{c}", c=FM.F_num(m["softcap"])))
    if m["window"]:
        parts.append(t("sees only the last {w} keys (sliding window)", w=m["window"]))
    if m["qk_norm"]:
        parts.append(t("normalises q and k first"))
    if m["sinks"]:
        parts.append(t("gives part of each row to a learned sink, so its weights over the keys sum to 1 − sink"))
    return " " + t("This layer {what}: the Score pipeline and Masks views show how.", what=t(", ").join(parts))


def _row_caption(meta) -> str:
    """How decoder rows are labelled: under teacher forcing "→" is the reference, not a prediction."""
    if not F.teacher_forced(meta):
        return t("Rows are labelled “position: input → predicted”: the token the decoder reads there and the "
                 "token it predicts from there.")
    return t("Teacher forcing: rows are labelled “position: input → reference”: the token the decoder reads there "
             "and the reference token it should predict from there. Where the model's own prediction (the argmax "
             "of its logits) differs, it follows in brackets: “9: 0 → 4 (model: 3)”.")


def _all_heads(trace, key: str, names: list[str], layer: int, head: int, meta) -> None:
    name = names[layer]
    st.caption(heads_text(trace, name))
    block = F.pool_factor(trace[f"{name}.weights"].shape[2:], F.MAX_GRID)
    if block > 1:
        st.caption(t("A long input: each panel is downsampled {b}×, each cell is the max of a {b}×{b} block of "
                     "weights (a single sharp weight stays visible); hover shows the positions a cell covers. "
                     "The head heatmap above is at full resolution.", b=block))
    show_figure(cached_figure(trace, F.heads_grid, name, shared=_shared(trace), meta=meta),
                       key=f"{key}_heads_fig", filename=f"{name}-heads")


def _model_view(trace, key: str, names: list[str], layer: int, head: int, meta) -> None:
    chart_key = f"{key}_model_view"
    st.caption(t("Every layer (row) × head (column) of this attention kind. Click a thumbnail (or pick the "
                 "layer and head above) to enlarge it. Long inputs are shown as the maximum over small blocks "
                 "(the title says how big), to keep the page light; hover shows the positions a cell covers."))
    fig = F.select_thumbnail(cached_figure(trace, F.model_view, tuple(names)), layer, head)
    show_figure(fig, key=chart_key, filename=f"model-view-{names[0].split('.')[0]}",
                       selection_mode="points", on_select=functools.partial(_on_model_view_click, key, chart_key))


def _pipeline(trace, key: str, names: list[str], layer: int, head: int, meta) -> None:
    name = names[layer]
    info = attention_of(meta, name) or {}
    if FM.is_modern(info):  # a 2024–2026 module: its own scale, soft-cap, window and q/k norm
        _modern_pipeline(trace, key, name, head, info, meta)
        return
    st.caption(t("The score pipeline of one head, left to right: the raw dot products QKᵀ; divided by √d_k "
                 "(Var(q·k) = d_k for unit-variance entries, so this brings the spread back to 1); plus the "
                 "mask M (−∞ where blocked); softmax over each row. The three score panels share one colour "
                 "scale (below them)."))
    rows = _query_rows(trace, name, f"{key}_pipe_rows")
    show_figure(F.score_pipeline(trace, name, head, meta=meta, rows=rows), key=f"{key}_pipe_fig",
                       filename=f"{name}-head{head}-pipeline")


def _modern_pipeline(trace, key: str, name: str, head: int, info, meta) -> None:
    """The pipeline as the model describes it (trace.meta["model"]): the real query scale, the soft-cap, the
    sliding window in the mask, and the q/k norm before it all."""
    m = FM.mechanisms(info)
    steps = [t("the dot products q·kᵀ")]
    steps.append(t("times the query scale {s}", s=f"{m['scale']:.4g}") if m["scale_is_plain"] else
                 t("times the model's own query scale {s} (not 1/√d_k = {p}: the model sets it)",
                   s=f"{m['scale']:.4g}", p=f"{FM.plain_scale(info):.4g}"))
    if m["softcap"]:
        steps.append(t("soft-capped, c·tanh(s / c) with c = {c}, so no score goes beyond ±{c}",
                       c=FM.F_num(m["softcap"])))
    steps.append(t("plus the mask M, which on this sliding layer also blocks keys {w} or more positions back "
                   "(window W = {w})", w=m["window"]) if m["window"] else t("plus the mask M (−∞ where blocked)"))
    steps.append(t("softmax over each row"))
    text = t("The score pipeline of one head as this model computes it, left to right: {steps}.",
             steps="; ".join(steps))
    if m["qk_norm"]:
        text += " " + t("Before all this, q and k went through their own norm (q/k norm), drawn below the pipeline.")
    st.caption(text)
    rows = _query_rows(trace, name, f"{key}_pipe_rows")
    n_q, n_k = trace[f"{name}.weights"].shape[2:]
    labels = F.axis_labels(meta, name, n_q, n_k)
    show_figure(FM.described_pipeline(trace, name, head, info, rows=rows, labels=labels), key=f"{key}_pipe_fig",
                filename=f"{name}-head{head}-pipeline")
    if m["qk_norm"] and f"{name}.q_norm.in" in trace:
        qi, qo = FM._arr(trace[f"{name}.q_norm.in"])[0], FM._arr(trace[f"{name}.q_norm.out"])[0]
        ki, ko = FM._arr(trace[f"{name}.k_norm.in"])[0], FM._arr(trace[f"{name}.k_norm.out"])[0]
        if qi.ndim == 3:  # per head: this head's queries and the keys of the K/V head it reads
            kv = F.kv_head(trace, name, head)
            qi, qo, ki, ko = qi[head], qo[head], ki[kv], ko[kv]
        st.caption(t("q/k norm: the length of each token's query and key before and after their norm (`{name}.q_norm`, "
                     "`{name}.k_norm`). After it, every query has nearly one length, so the scores above are "
                     "bounded by the norm's learned gain, not by the residual stream.", name=name))
        show_figure(FM.qk_norm_figure(qi, qo, ki, ko, labels[1][:qi.shape[0]]), key=f"{key}_qknorm_fig",
                    filename=f"{name}-head{head}-qk-norm")


def _masks(trace, key: str, names: list[str], layer: int, head: int, meta) -> None:
    name = names[layer]
    _masks_caption(name, trace.meta)
    info = attention_of(meta, name) or {}
    if f"{name}.mask" in trace and info.get("window"):  # a sliding layer: its window beside the look-ahead mask
        st.caption(t("This layer slides: its query at position p sees only the {w} keys p − {v} … p (window "
                     "W = {w}); older keys are blocked like future ones. The model's other layers may see "
                     "further (the full layers see every earlier token).", w=info["window"], v=info["window"] - 1))
        rows = _query_rows(trace, name, f"{key}_mask_rows")
        w = F.arr(trace[f"{name}.weights"])[0, head]
        show_figure(FM.window_mask_figure(FM.window_masks(trace, name, info), w, info["window"],
                                          F.axis_labels(meta, name, *w.shape), rows=rows),
                    key=f"{key}_mask_fig", filename=f"{name}-masks")
    elif f"{name}.mask" in trace:
        rows = _query_rows(trace, name, f"{key}_mask_rows")
        show_figure(F.mask_figure(trace, name, head, meta=meta, rows=rows), key=f"{key}_mask_fig",
                           filename=f"{name}-masks")
    else:
        st.info(t("No mask was captured for this module."))


def _qkvz(trace, key: str, names: list[str], layer: int, head: int, meta) -> None:
    name = names[layer]
    st.caption(qkvz_text(trace, name, head))
    show_figure(F.qkvz_figure(trace, name, head, meta=meta), key=f"{key}_qkvz_fig",
                       filename=f"{name}-head{head}-qkvz")


def _masks_caption(name: str, meta) -> None:
    kind = attention_of(meta, name)["kind"]
    if kind == "decoder_self":
        text = t("Decoder self-attention uses the look-ahead mask OR the target padding mask. The look-ahead "
                 "mask M has 0 on and below the diagonal and −∞ above it, so softmax gives the future exactly "
                 "0: this is what lets training feed the whole target at once (teacher forcing, one parallel "
                 "pass) while each position still only sees its past.")
    elif kind == "cross":
        text = t("Cross-attention masks only the source's [PAD] keys: every target position may look at every "
                 "real source token.")
    else:
        text = t("The padding mask blocks [PAD] *keys* (a query at a padding position still attends to real "
                 "tokens; its output is ignored). A single unpadded sentence has no padding, so the mask is "
                 "empty here; in a padded batch the [PAD] columns would be dark.")
    st.caption(text + " " + t("Dark = blocked: −∞ is added before softmax, so the weight there is exactly 0."))


def _scaling_lesson(trace, key: str, names: list[str], layer: int, head: int, meta) -> None:
    name = names[layer]
    st.caption(t(
        "Why divide by √d_k? If the entries of q and k are independent with mean 0 and variance 1, "
        "q·k = Σ_{i=1}^{d_k} q_i k_i has mean 0 and Var(q·k) = Σ Var(q_i k_i) = d_k. Large scores push "
        "softmax into saturation (almost one-hot rows, vanishing gradients); dividing by √d_k brings the "
        "variance back to 1. Left: this head's actual scores with and without the scaling; right: how peaked "
        "the softmax rows would be (entropy 0 = one-hot, log n = uniform)."))
    info = attention_of(meta, name) or {}
    if info.get("scale") and not FM.mechanisms(info)["scale_is_plain"]:  # Gemma 2/3: query_pre_attn_scalar
        st.caption(t("This model does not divide by √d_k = {r}: it multiplies q·kᵀ by {s} (1/√{n}, a size the model "
                     "sets). The figures below follow the paper's √d_k; the Score pipeline view shows the model's "
                     "own scale.", r=f"{info['d_head'] ** 0.5:.4g}", s=f"{info['scale']:.4g}",
                     n=f"{info['scale'] ** -2:.4g}"))
    show_figure(cached_figure(trace, F.scaling_figure, name, shared=_shared(trace)), key=f"{key}_scale_fig",
                       filename=f"{name}-sqrt-dk")
    s = F.scaling_stats(trace, name)
    st.caption(t("Measured on this module: Var(q) = {vq}, Var(k) = {vk}, Var(QKᵀ) = {vqk}, Var(QKᵀ/√d_k) = "
                 "{vs} (d_k = {d_k}). A trained model's q and k are not unit-variance, so these need not be d_k "
                 "and 1.", vq=f"{s['var_q']:.3g}", vk=f"{s['var_k']:.3g}", vqk=f"{s['var_qk']:.3g}",
                 vs=f"{s['var_qk'] / s['d_k']:.3g}", d_k=s["d_k"]))
    d_k = st.select_slider(t("d_k for the random-vector demo"), [1, 4, 8, 16, 32, 64, 128, 256, 512],
                           value=64, key=f"{key}_demo_dk")
    show_figure(F.variance_demo(d_k), key=f"{key}_demo_fig", filename=f"sqrt-dk-demo-{d_k}")


WEIGHTS_ONLY = ("heads", "model")  # the views drawn from the attention weights alone (a model via transformers)
VIEW_BUILDERS = {"heads": _all_heads, "model": _model_view, "pipeline": _pipeline, "masks": _masks,
                 "qkvz": _qkvz, "sqrt": _scaling_lesson}
