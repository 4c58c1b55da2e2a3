"""The sidebar and what a page needs from it: the model and text a session chose (`Selection`), the default
model per language, and `require(...)`, which stops a page whose model lacks what it needs.

Pages call `selection()` / `require_trace()` / `require()`; `app.py` draws the sidebar once, before the
page runs, so the checkpoint and text widgets keep their state across pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from viz.i18n import N_, current_lang, option_labels, t
from viz.ui import lm_models
from viz.ui.heap import freeze_heap_once
from viz.ui.models import (
    capabilities,
    checkpoint_names,
    get_trace,
    is_real_name,
    load_ckpt,
    load_failed,
    server_file_exists,
    session_models,
)
from viz.ui.render import show_error
from viz.ui.state import _KEPT, long_text_note, seed_from_query, write_query
from viz.ui.text import model_name_text, stop_note, target_unk_note, text_problems, unk_note

PREFERRED = ("dates", "zh-en", "reverse")  # default checkpoint: attention is readable on these
LANG_DEFAULT = {"zh": "zh-en"}  # a Chinese UI opens on the Chinese model (its example: 我爱机器学习)
_SEL_KEY = "_al_selection"


@dataclass(frozen=True)
class Selection:
    name: str  # checkpoint name
    text: str  # source text, exactly as typed
    target: str | None  # teacher-forced target, None = the model's greedy output

    @property
    def ckpt(self):
        return load_ckpt(self.name)


def default_checkpoint(names: list[str], lang: str | None = None) -> str:
    """The model a session opens on: the language's own model (zh -> zh-en), else the first of PREFERRED."""
    own = LANG_DEFAULT.get(lang or "")
    if own in names:
        return own
    return next((n for n in PREFERRED if n in names), names[0])


def _on_checkpoint_change() -> None:
    # A new model has a new vocabulary: start from its own example sentence.
    name = st.session_state.get("checkpoint")
    if name is None:  # a class follower's switch dropped the widget's value (state.forget_view) while the browser
        return  # still sent the old one: the run seeds it from the teacher's URL, with that model's own text
    try:
        st.session_state["source_text"] = load_ckpt(name).example
    except ValueError:
        return  # a broken checkpoint: sidebar() shows why on this rerun
    st.session_state["target_text"] = ""


def model_label(name: str) -> str:
    """How the model list shows a model: toy checkpoints by name, real models with what they are."""
    if name in lm_models.BUILTIN:
        return {"smollm2": t("SmolLM2-135M-Instruct (language model)"),
                "gemma3": t("Gemma 3 270M (language model)"),
                "minilm": t("MiniLM (pretrained encoder)")}[name]
    if name in lm_models.server_models():
        # A model that cannot open says so, whichever path it would take (issue 38 §5: a broken directory of a
        # type transformers runs was labelled "via transformers", a broken GGUF not, though neither opens).
        if load_failed(name) or not server_file_exists(name):
            return t("{name} (started with the server, cannot be opened)", name=name)
        if _via_transformers(name):
            return t("{name} (via transformers, started with the server)", name=name)
        return t("{name} (started with the server)", name=name)
    return model_name_text(name)  # a /learn checkpoint's name in the UI's language; a toy checkpoint's as it is


def _via_transformers(name: str) -> bool:
    """A server model opened through transformers' own modules (model/loaders/adapter.py), from its config.json
    (the model list labels every model: none is loaded for that)."""
    return name not in session_models() and lm_models.via_transformers(name)


# What each page (its file's stem) reads that a model opened via transformers does not give: the refusal names it
# (issue 38 §5: the sentence ended "this view needs the lab's own model" without saying what is missing).
PAGE_NEEDS = {
    "flow": N_("each head's value vectors and output z, and the norms inside each layer (norm-based attention and "
               "the information-flow routes are made of them)"),
    "layer": N_("the norms inside a layer and the feed-forward network's internals"),
    "qk": N_("q and k as its softmax compares them (after its own rotary, or none)"),
    "architecture": N_("the lab's own description of each block: its norms, feed-forward network and attention "
                       "wiring"),
    "phenomena": N_("hooks inside the attention (q, k, v, scores, weights), where the head ablations and patching act"),
    "experiments": N_("hooks inside the attention (q, k, v, scores, weights), where the interventions act"),
    "snapshots": N_("every capture point of the lab's own families (the norms, the feed-forward network, q, k, v)"),
    "tokens": N_("the lab's own tokenizer tables and embeddings"),
    "attention": N_("q, k, v, the scores and the mask of this view"),
    "llm": N_("logits that are exactly the unembedding of the final norm's output (the logit lens reads every layer "
              "through them)"),
}


def _current_page() -> str | None:
    """The running page's file stem ("flow" for viz/pages/flow.py), from Streamlit's page manager; None when it
    cannot be told (a bare script, an older Streamlit)."""
    try:
        from pathlib import Path

        from streamlit.runtime.scriptrunner import get_script_run_ctx

        ctx = get_script_run_ctx()
        pm = ctx.pages_manager
        info = (pm.get_pages() or {}).get(pm.current_page_script_hash) or {}
        where = info.get("script_path") or info.get("url_pathname")
        return Path(str(where)).stem if where else None
    except Exception:  # only a better sentence depends on it
        return None


def adapter_note(name: str, needs: str | None = None) -> str:
    """One sentence: what a model opened via transformers gives and does not give a page that needs the lab's own
    family, from its own description (model/loaders/adapter.py: each head's q, k, v and z only where its attention
    exposes them exactly), and what this view needs of what it does not give: `needs`, else the running page's
    PAGE_NEEDS, else everything it lacks."""
    try:
        blocks = load_ckpt(name).describe().get("blocks", {})
    except Exception:  # a sentence must still come out: the model's own description is only for the details
        blocks = {}
    gives = [t("attention weights"), t("the residual stream after each layer"), t("the logits")]
    lacks = [t("the norms inside a layer"), t("the feed-forward network's internals")]
    if blocks.get("v_z"):
        gives.append(t("each head's v and output z"))
        if blocks.get("scores"):
            gives.append(t("q, k and the scores"))
        elif blocks.get("q_k") == "alibi":
            gives.append(t("q and k"))
            lacks.append(t("the scores (its ALiBi bias is added inside transformers)"))
        elif blocks.get("q_k") == "unrot":
            gives.append(t("q and k before the rotary"))
            lacks.append(t("q and k after the rotary, and the scores"))
        else:
            lacks.append(t("q, k and the scores"))
        gives.append(t("hooks on each head's output and on the residual stream"))
    else:
        lacks.append(t("q, k, v and each head's output"))
    sep = "、" if current_lang() == "zh" else ", "
    if needs is None:
        page = PAGE_NEEDS.get(_current_page() or "")
        needs = t(page) if page else sep.join(lacks)
    return t("{model} runs via transformers, not one of the lab's own families: it gives {gives}, but not {lacks}. "
             "This view needs {needs}, which only the lab's own families record.", model=model_label(name),
             gives=sep.join(gives), lacks=sep.join(lacks), needs=needs)


def sidebar() -> Selection | None:
    """Checkpoint select, source text and figure-export format, in the sidebar. Call once per run
    (app.py does), before the page. Returns None (after showing why) if no model can be loaded."""
    st.session_state[_SEL_KEY] = None
    try:
        names = checkpoint_names()
    except Exception as e:  # any failure here must still leave a page with a message
        show_error(t("No trained checkpoints could be listed: {err}", err=e))
        return None
    if not names:
        show_error(t("No trained checkpoints are installed (model/checkpoints is empty)."))
        return None
    sb = st.sidebar
    for key in ("checkpoint", _KEPT + "checkpoint"):  # e.g. a checkpoint directory removed
        if st.session_state.get(key) not in (None, *names):
            del st.session_state[key]
    if "checkpoint" not in st.session_state and (hint := lm_models.install_note(st.query_params.get("checkpoint"))):
        st.info(hint, icon="📦")  # a link to a real model this server has not installed: the command that adds it
    seed_from_query("checkpoint", "checkpoint", default_checkpoint(names, current_lang()),
                    valid=lambda v: v in names)
    if st.session_state["checkpoint"] in lm_models.server_models():  # tried before its label is drawn: a model
        try:  # that cannot open is labelled so from the first run that shows it (a link straight to it too)
            load_ckpt(st.session_state["checkpoint"])
        except ValueError:
            pass  # said below, once the select box shows it
    name = sb.selectbox(t("Model (checkpoint)"), names, key="checkpoint", on_change=_on_checkpoint_change,
                        format_func=option_labels(names, model_label),  # labels made now: see i18n.option_labels
                        help=t("A small Transformer trained on a toy task, shipped with the app (or trained "
                               "on the Training page in this session), or a real pretrained model: SmolLM2 "
                               "(a language model), MiniLM (an encoder) and those the server was started with."))
    if isinstance(session_models().get(name), lm_models.RealModel):  # a /learn checkpoint (viz/ui/learn_run.py)
        sb.caption(t("A checkpoint of Watch attention learn's run, opened in this session: only you see it, until "
                     "the session ends. Its prompt is token ids, numbers separated by spaces."))
    elif name in session_models():
        sb.caption(t("Trained on the Training page in this session: only you see it, until the session ends."))
    real = is_real_name(name)
    try:
        with st.spinner(t("Loading {name}…", name=name)):
            example = load_ckpt(name).example
    except ValueError as e:
        show_error(e)
        # The URL names the model the sidebar shows, even one that cannot open: a reload or a shared link then
        # shows the same model and the same sentence (issue 38 §5: the URL kept the model before it).
        write_query(checkpoint=name)
        return None
    seed_from_query("source_text", "text", example)
    seed_from_query("target_text", "target", "")
    if real:  # one text in, no target: a real model reads the text as it is (no teacher forcing here)
        text = sb.text_area(t("Prompt"), key="source_text", height=90,
                            help=t("The model reads this text, as typed. One model input; every page shows its "
                                   "tensors."))
        target = ""
    else:
        text = sb.text_area(t("Source text"), key="source_text", height=90,
                            help=t("The encoder reads this. One model input; every page shows its tensors."))
        with sb.expander(t("Target (teacher forcing)")):
            target = st.text_input(
                t("Target text"), key="target_text",
                help=t("Empty: the decoder reads the model's own greedy translation. Otherwise it reads this "
                       "text in one parallel pass under the look-ahead mask (teacher forcing)."))
    if note := long_text_note(text, target):
        sb.caption(note)
    sb.radio(t("Figure download format"), ["png", "svg"], key="export_format", horizontal=True,
             help=t("What the camera button in each figure's toolbar saves."))
    write_query(checkpoint=name, text=text, target=target or None)  # a long text goes as a reference (?text_ref=)
    sel = Selection(name, _kept(name, text) if real else text, target or None)
    st.session_state[_SEL_KEY] = sel
    freeze_heap_once()
    return sel


_KEEP_FOR = "_al_keep_for"  # st.session_state: the prompt that `?keep=N` cuts (another prompt drops the cut)


def _kept(name: str, text: str) -> str:
    """The prompt's last N tokens when `?keep=N` (a page's "Keep the last N tokens" button: long_limits), else
    the prompt; every page then reads the same cut, said once here."""
    from viz.ui.long_limits import kept_text, query_keep

    keep, rm = query_keep(), load_ckpt(name)
    if keep is None:
        st.session_state.pop(_KEEP_FOR, None)
        return text
    if st.session_state.get(_KEEP_FOR, text) != text:  # a new prompt: its cut was for the old one
        st.query_params.pop("keep", None)
        st.session_state.pop(_KEEP_FOR, None)
        return text
    st.session_state[_KEEP_FOR] = text
    if getattr(rm, "family", None) != "decoder_lm" or not text.strip():
        return text
    try:
        cut, n = kept_text(rm.obj, text, keep)
    except ValueError:  # no tokenizer: the page says so itself
        return text
    if cut is not text:
        st.sidebar.info(t("Showing the last {k} of the text's {n} tokens.", k=f"{min(keep, n):,}", n=f"{n:,}"),
                        icon="✂️")
    return cut


def selection() -> Selection | None:
    """The sidebar's choice for this run: app.py draws the sidebar before every page; a page
    run on its own (`streamlit run viz/pages/x.py`) draws it here."""
    if _SEL_KEY not in st.session_state:
        return sidebar()
    return st.session_state[_SEL_KEY]


def require_own_family(sel: Selection | None = None) -> Selection | None:
    """For a page (or view) that needs the lab's own family: a model opened via transformers stops here with one
    sentence (what it does not give) and a button to a model of the lab's own families."""
    sel = sel or selection()
    if sel is not None and _via_transformers(sel.name):
        require("lm")
    return sel


def require_trace(sel: Selection | None = None, via_transformers: bool = False, next_tokens: bool = True):
    """(Selection, Trace) for the page, or a clear message and `st.stop()` for bad input. A model opened via
    transformers (weights, residuals and logits only) stops here with one sentence unless the page draws from those
    alone (`via_transformers=True`). next_tokens=False: the page shows no "input → predicted" labels, so a long
    prompt's shared lazy trace need not unembed every position for it (models.get_trace)."""
    sel = sel or selection()
    if sel is None:
        st.stop()
    if not via_transformers and _via_transformers(sel.name):
        require("lm")  # the sentence, and a button to a model of the lab's own families
    problem = text_problems(sel.text)
    if problem is None and sel.target is not None:
        problem = text_problems(sel.target)
        problem = problem and t("Target: ") + problem
    if problem:
        show_error(problem)
        st.stop()
    ckpt = sel.ckpt
    try:
        notes = [] if isinstance(ckpt, lm_models.RealModel) else [  # byte-level BPE has no [UNK]
            unk_note(ckpt.src_tokenizer.pieces(sel.text), sel.text), target_unk_note(ckpt, sel.target)]
        with st.spinner(t("Running the model…")):
            trace = get_trace(sel.name, sel.text, sel.target, next_tokens=next_tokens)
    except ValueError as e:  # too long, unknown ids, capture over budget, ...
        show_error(e, t("Shorten or change the text in the sidebar."))
        st.stop()
    for note in filter(None, notes):
        st.warning(note, icon="🔤")
    stop = stop_note(trace.meta)
    if stop:
        st.warning(stop, icon="✂️")
    return sel, trace


# ---------------------------------------------------------------- what a page needs from the model

# A page that cannot work with every model calls `require(...)` at its top, before anything else:
#   sidebar.require("toy")               # a model trained in this lab (task, tokenizers, training run)
#   sidebar.require("cross_attention")   # an encoder-decoder Transformer
#   sidebar.require("lm")                # a decoder-only language model
# Without it, the page says in one sentence what this model lacks, offers a model that has it, and stops.
# What each model has: models.capabilities (models.CAPABILITIES).


def _lacks(need: str, name: str, family: str) -> str:
    """One sentence: what model `name` (of `family`) lacks for a page that needs `need`."""
    if need in ("cross_attention", "encoder") and family in ("decoder_lm", "decoder_lm_adapter"):
        return t("A decoder-only model has no encoder and no cross-attention, and {model} is one.",
                 model=model_label(name))
    if need in ("cross_attention", "decoder") and family == "encoder":
        return t("An encoder-only model has no decoder and no cross-attention, and {model} is one.",
                 model=model_label(name))
    if family == "decoder_lm_adapter":
        return adapter_note(name)
    if need == "lm":
        return t("{model} is not a language model: this page runs a decoder-only LLM.", model=model_label(name))
    return t("{model} was not trained in this lab: this page needs a toy model's task, tokenizers and "
             "training run.", model=model_label(name))


def _model_with(need: str, names: list[str]) -> str | None:
    if need == "lm":
        return next((n for n in ("smollm2", *names) if n in names and lm_models.is_real(n)
                     and "lm" in capabilities(n)), None)
    toys = [n for n in names if not is_real_name(n)]
    return default_checkpoint(toys, current_lang()) if toys else None


def switch_model(name: str) -> None:
    """Choose model `name` in the sidebar (a button's on_click: before the rerun draws the sidebar)."""
    st.session_state["checkpoint"] = st.session_state[_KEPT + "checkpoint"] = name
    _on_checkpoint_change()


LLM_PAGE = "viz/pages/llm.py"
LM_VIEWS = {"tokens": N_("See its tokens on the Language model page"),
            "generate": N_("Generate with it on the Language model page")}


def require(*needs: str, lm_view: str | None = None, via_transformers: bool = False) -> Selection:
    """The sidebar's selection if its model has every capability in `needs` (see models.CAPABILITIES); else one
    sentence on what it lacks, a button that opens this page with a model that has it, and st.stop().
    lm_view: for a language model, also a link to that view of the Language model page (LM_VIEWS).
    via_transformers: a model opened via transformers passes too (the page draws from weights, residuals, logits)."""
    sel = selection()
    if sel is None:
        st.stop()
    try:
        have = capabilities(sel.name)
    except ValueError as e:
        show_error(e)
        st.stop()
    missing = [n for n in needs if n not in have]
    if not missing or (via_transformers and "via_transformers" in have):  # the page draws what the adapter gives
        return sel
    ckpt = load_ckpt(sel.name)
    family = ckpt.family if isinstance(ckpt, lm_models.RealModel) else "transformer"
    need = missing[0]
    st.info(_lacks(need, sel.name, family), icon="🧩")
    if lm_view and family in ("decoder_lm", "decoder_lm_adapter"):  # /llm draws a model via transformers too
        st.page_link(LLM_PAGE, label=t(LM_VIEWS[lm_view]), icon=":material/chat:",
                     query_params={"checkpoint": sel.name, "view": "generate" if lm_view == "generate" else "heads"})
    other = _model_with(need, checkpoint_names())
    if other:
        st.button(t("Open this page with {model}", model=model_label(other)), key="_al_require_switch",
                  on_click=switch_model, args=(other,), type="primary")
    st.stop()
