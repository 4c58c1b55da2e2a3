"""Streamlit glue shared by every page: models and traces (shared or per session), the sidebar,
URL sync, figure rendering with export, and friendly error messages.

State rules (Streamlit serves many sessions from threads of one process):
- shipped checkpoints and their traces live in bounded `st.cache_resource` caches: shared,
  read-only (a `Trace` is immutable; nothing here writes into a model);
- a model trained in this session lives in `st.session_state["session_models"][name]` (the
  training page puts it there); its traces are cached in the session, never process-wide;
- everything a user chose or uploaded lives in `st.session_state` (per session).

URL rules (issue 13): the URL carries the view (model, text, page controls) so a link reopens it.
`write_query` is the one place that writes it. Streamlit's frontend *pushes* a history entry for
every query-string change; `install_history_patch` (app.py, first thing) turns a push that keeps the
page path into a replace, so only a page change adds an entry and Back leaves a page in one press.
`seed_from_query` gives a widget its first value: the URL, else the value this session last had
(so Attention -> Tokens -> Attention keeps the view, and so does an input error), else a default.

Pages call `selection()` / `require_trace()`; `app.py` draws the sidebar once, before the
page runs, so the checkpoint and text widgets keep their state across pages.
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import streamlit as st

from viz import lm_models
from viz.i18n import N_, current_lang, t

PREFERRED = ("dates", "zh-en", "reverse")  # default checkpoint: attention is readable on these
LANG_DEFAULT = {"zh": "zh-en"}  # a Chinese UI opens on the Chinese model (its example: 我爱机器学习)
TRACE_CACHE_ENTRIES = 16  # a full trace of a 256-token input is ~20 MB: bound the shared cache
LM_TRACE_ENTRIES = 6  # a real LM's full trace is far bigger (SmolLM2, 64 tokens: ~90 MB)
SESSION_TRACES = 4  # traces of session-trained models kept per session
MAX_URL_TEXT = 1000  # characters of source/target text mirrored into the URL
SESSION_MODELS = "session_models"  # st.session_state key: name -> Checkpoint trained in this session
_SEL_KEY = "_al_selection"
_KEPT = "_al_kept_"  # prefix: the last value of a URL-seeded widget, kept while it is not drawn


# ---------------------------------------------------------------- server cost

_frozen = threading.Event()


def freeze_heap_once() -> None:
    """Move everything alive after the first page (torch, plotly's validators, the first model: a
    few million long-lived objects) out of the garbage collector's reach, once per process.

    Without this, every full collection walks them all: ~130 ms of server CPU, about once per click,
    far more than the click's own work (issue 12). Later objects are collected as usual."""
    if not _frozen.is_set():
        _frozen.set()
        gc.collect()
        gc.freeze()


# ---------------------------------------------------------------- models and traces


EXTRA_ENV = "ATTENTION_LAB_CHECKPOINTS"  # os.pathsep-separated checkpoint dirs to offer too


def _checkpoint_api():
    try:
        from model import list_checkpoints, load_checkpoint
    except ImportError:  # the package root may not re-export them
        from model.toy.checkpoint import list_checkpoints, load_checkpoint
    return list_checkpoints, load_checkpoint


def session_models() -> dict:
    """name -> Checkpoint trained in this session (see the training page); {} outside a session."""
    try:
        return st.session_state.get(SESSION_MODELS) or {}
    except Exception:  # no Streamlit session (bare scripts)
        return {}


def checkpoint_names() -> list[str]:
    """Shipped checkpoint names, any directories listed in $ATTENTION_LAB_CHECKPOINTS, then the
    models trained in this session."""
    list_checkpoints, _ = _checkpoint_api()
    extra = [p for p in os.environ.get(EXTRA_ENV, "").split(os.pathsep) if p.strip()]
    names = list(list_checkpoints()) + extra
    names += [n for n in lm_models.names() if n not in names]  # SmolLM2, MiniLM, the server's --model ones
    return names + [n for n in session_models() if n not in names]


@st.cache_resource(show_spinner=False, max_entries=8)
def _load_shared(name: str):
    if lm_models.is_real(name):  # weights shared through model.load_model's own per-process cache
        try:
            return lm_models.load(name)
        except KeyError as e:
            raise ValueError(t("This server offers no model “{name}”.", name=name)) from e
    _, load_checkpoint = _checkpoint_api()
    ckpt = load_checkpoint(name)
    ckpt.model.eval()
    return ckpt


def load_ckpt(name: str):
    """The checkpoint `name`: a model trained in this session, else a shipped name or directory,
    loaded once and shared read-only by all sessions (never train or mutate it)."""
    own = session_models().get(name)
    return own if own is not None else _load_shared(name)


@st.cache_resource(show_spinner=False, max_entries=TRACE_CACHE_ENTRIES, ttl=3600)
def _cached_trace(name: str, text: str, target: str | None):
    return _load_shared(name).trace(text, target=target)


def _session_trace(name: str, text: str, target: str | None):
    """A session model's trace, in a small per-session LRU keyed by the model object too (a model
    retrained under the same name must not show the old one's trace)."""
    ckpt = session_models()[name]
    cache = st.session_state.setdefault("_al_session_traces", OrderedDict())
    key = (id(ckpt), name, text, target)
    if key not in cache:
        cache[key] = ckpt.trace(text, target=target)
        while len(cache) > SESSION_TRACES:
            cache.popitem(last=False)
    cache.move_to_end(key)
    return cache[key]


@st.cache_resource(show_spinner=False, max_entries=LM_TRACE_ENTRIES, ttl=3600)
def _cached_lm_trace(name: str, text: str, chat: bool):
    return _load_shared(name).trace(text, chat=chat)


def get_trace(name: str, text: str, target: str | None = None, chat: bool = False):
    """Full trace of checkpoint `name` on `text` (target None = the model's own greedy output; a real
    model's `chat=True` wraps the text in its chat template).

    Cached per (checkpoint, text, target): the same input always gives the same read-only trace.
    Raises ValueError (and subclasses) for input the model cannot take.
    """
    if lm_models.is_real(name) and name not in session_models():
        return _cached_lm_trace(name, text, bool(chat))[1]
    if name in session_models():
        return _session_trace(name, text, target or None)[1]
    return _cached_trace(name, text, target or None)[1]


# ---------------------------------------------------------------- input checks

# C0/C1 controls (tab, newline and carriage return allowed) and invisible direction/format marks.
# ZWJ/ZWNJ (U+200C/D) are allowed: emoji sequences and some scripts need them.
_CONTROL = re.compile(
    r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
MAX_SHOWN = 24  # characters of one token shown in a message (a 5,000-character word is cut)


def text_problems(text: str) -> str | None:
    """Why `text` cannot be run, in words a student understands; None when it can."""
    if not text:
        return t("The input is empty: type a sentence in the sidebar.")
    if not text.strip():
        return t("The input is only whitespace: type a sentence in the sidebar.")
    bad = _CONTROL.search(text)
    if bad:
        ch = bad.group()
        name = unicodedata.name(ch, "control character")
        return t("The input contains an invisible control character U+{code} ({name}) at position {pos}. "
                 "Remove it (it was probably pasted) and try again.",
                 code=f"{ord(ch):04X}", name=name, pos=bad.start())
    return None


def shorten(s: str, limit: int = MAX_SHOWN, markdown: bool = False) -> str:
    """`s` for a message: at most `limit` characters, the rest counted, never silently dropped.
    markdown=True: the characters of `s` are escaped for a Markdown message (see `md_escape`)."""
    from viz.figures import show_token

    shown = md_escape if markdown else (lambda x: x)
    if len(s) <= limit:
        return shown(show_token(s))
    return t("{start}… ({n} characters)", start=shown(show_token(s[:limit])), n=len(s))


def unk_note(pieces, text: str | None = None) -> str | None:
    """A warning listing what the tokenizer could not represent (e.g. emoji -> [UNK]), by the
    original characters of `text` (the text `pieces` were cut from), at most 8 of them."""
    unk = [p for p in pieces if p.is_unk]
    if not unk:
        return None
    shown = ", ".join(f"'{shorten(_original(p, text), markdown=True)}'" for p in unk[:8])
    shown += ", …" if len(unk) > 8 else ""
    return t("{n} token(s) are not in this model's vocabulary and became [UNK]: {shown}. "
             "The model still runs, but it sees only the [UNK] embedding there.", n=len(unk), shown=shown)


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~<>$:])")  # ":" too: Streamlit's :emoji: and :red[…]


def md_escape(s: str) -> str:
    """`s` shown literally in a Markdown message (st.warning, st.error): "*", "_", "`", "<"… would
    otherwise format the message or vanish."""
    return _MARKDOWN.sub(r"\\\1", s)


def _original(piece, text: str | None) -> str:
    a, b = piece.span
    if text is not None and 0 <= a < b <= len(text):
        return text[a:b]
    return piece.token if piece.token != "[UNK]" else f"[UNK]@{a}"


# Input errors the model raises in English, said again in the UI language (one sentence, no repeated advice).
_TOO_LONG = re.compile(r"the (input|target) is (\d+) tokens long; (?:with \[BOS\] )?this model's limit is (\d+) tokens")


def error_text(err: BaseException | str) -> tuple[str, bool]:
    """(message, whether it already says what to do) for a bad input or file."""
    if isinstance(err, str):
        return err, False
    word, tokens = getattr(err, "word", None), getattr(err, "tokens", None)
    if word is not None and tokens is not None:  # model.analysis.compare.NotATokenError
        listed = " ".join(shorten(x, markdown=True) for x in tokens[:40]) + (" …" if len(tokens) > 40 else "")
        if not word.strip():
            return t("The token box is empty: type one of the sentence's tokens ({tokens}).", tokens=listed), True
        return t("“{word}” is not a token of this sentence; its tokens: {tokens}.",
                 word=shorten(word.strip(), markdown=True), tokens=listed), True
    # str(KeyError) wraps its message in quotes; other messages keep theirs ("'street' is not…").
    msg = (str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)).strip() or type(err).__name__
    m = _TOO_LONG.search(msg)
    if m:
        which = t("The input") if m.group(1) == "input" else t("The target")
        return t("{which} is {n} tokens long; this model's limit is {limit} tokens. Shorten it: it is never "
                 "silently truncated.", which=which, n=m.group(2), limit=m.group(3)), True
    return msg[:1].upper() + msg[1:], False


def show_error(err: BaseException | str, hint: str | None = None) -> None:
    """A bad input or file as a message on the page, never a traceback. `hint` (what to do) is left out when
    the message already says it."""
    msg, advised = error_text(err)
    st.error(msg + (f"\n\n{hint}" if hint and not advised else ""), icon="⚠️")


# ---------------------------------------------------------------- URL (query string) sync

# Streamlit's frontend calls history.pushState for every query-string change (one entry per
# click, several per rerun). Keep pushes that change the page path (a page change); turn the
# others into replaceState. Installed once per browser tab; st.html is not iframed.
_HISTORY_PATCH = """<script>
(() => {
  const h = window.history;
  if (h.__attentionLabReplace) return;
  h.__attentionLabReplace = true;
  const push = h.pushState.bind(h);
  h.pushState = (state, title, url) => {
    const next = new URL(url ?? location.href, location.href);
    return next.pathname === location.pathname ? h.replaceState(state, title, url) : push(state, title, url);
  };
})();
</script>"""


def install_history_patch() -> None:
    """Draw the patch (an invisible script in the sidebar). app.py calls it once per run, before the
    first URL write (the language switch's ?lang=), so that write replaces the history entry too."""
    st.sidebar.html(_HISTORY_PATCH, unsafe_allow_javascript=True)


_history_patch = install_history_patch  # the name app.py uses


def seed_from_query(key: str, param: str, default: Any, cast: Callable[[str], Any] = str,
                    valid: Callable[[Any], bool] | None = None) -> None:
    """Give widget `key` its starting value when the session has none: the URL's `?param=`,
    else the value this session last gave it (Streamlit forgets a widget that was not drawn in a
    run: another page, an input error), else `default`. A link value the page cannot use is
    replaced, and the page says so once (`note_replaced`).
    """
    kept = _KEPT + key
    if key in st.session_state:
        # Written back, so the widget tells the browser its value (set_value): after a run that did not
        # draw it (an input error stopped the page; a fragment's widgets outlive such runs) the browser
        # builds it anew and would show its default beside a chart and URL that show this value.
        st.session_state[key] = st.session_state[kept] = st.session_state[key]
        return
    candidates = []
    raw = st.query_params.get(param)
    url_ok = False
    if raw is not None:
        try:
            candidates.append(cast(raw))
            url_ok = valid is None or bool(valid(candidates[0]))
        except (TypeError, ValueError):
            pass
    if kept in st.session_state:
        candidates.append(st.session_state[kept])
    value = next((v for v in candidates if valid is None or valid(v)), default)
    if raw is not None and not url_ok:
        note_replaced(param, raw, value)
    st.session_state[key] = st.session_state[kept] = value


_NOTED = "_al_noted"  # (what, value) pairs this session was already told about


def note_replaced(what: str, given: Any, used: Any, lo: Any = None, hi: Any = None) -> None:
    """Say, once per session and value, that a link's `what=given` could not be used and which value
    the page shows instead (`lo`..`hi`: the widget's range, when that is the reason)."""
    noted = st.session_state.setdefault(_NOTED, set())
    if (what, str(given)) in noted:
        return
    noted.add((what, str(given)))
    given = str(given).replace("`", "'")  # shown in a code span: the value exactly as the link has it
    given = given if len(given) <= 60 else given[:60] + "…"
    if lo is not None and hi is not None:
        msg = t("This link's `{what}={given}` is outside the range {lo} to {hi}, so the page uses {used}.",
                what=what, given=given, lo=lo, hi=hi, used=used)
    else:
        msg = t("This link's `{what}={given}` is not possible here, so the page uses {used}.",
                what=what, given=given, used=used)
    st.warning(msg, icon="🔗")


def write_query(**params: Any) -> None:
    """Mirror the current view into the URL so it can be shared (None removes a parameter).

    The one place that writes the URL: one message per call, none when nothing changed, and a
    replaced (not pushed) history entry, see `install_history_patch`."""
    current = {k: st.query_params.get_all(k) for k in st.query_params}
    new = {k: v[-1] if len(v) == 1 else v for k, v in current.items()}
    for k, v in params.items():
        if v is None:
            new.pop(k, None)
        else:
            new[k] = str(v)
    if new != {k: v[-1] if len(v) == 1 else v for k, v in current.items()}:
        st.query_params.from_dict(new)


def int_in(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and lo <= v <= hi


def clamp_state(key: str, lo: int, hi: int, what: str | None = None) -> None:
    """Keep a remembered widget value inside its current range (e.g. after switching to a
    smaller model), instead of letting the widget raise. `what` names a value that came from a
    link: its replacement is then said (`note_replaced`)."""
    v = st.session_state.get(key)
    if isinstance(v, int | float) and not lo <= v <= hi:
        st.session_state[key] = min(max(v, lo), hi)
        if what:
            note_replaced(what, v, st.session_state[key], lo, hi)


# ---------------------------------------------------------------- sidebar and selection


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
    try:
        st.session_state["source_text"] = load_ckpt(st.session_state["checkpoint"]).example
    except ValueError:
        return  # a broken checkpoint: sidebar() shows why on this rerun
    st.session_state["target_text"] = ""


def model_label(name: str) -> str:
    """How the model list shows a model: toy checkpoints by name, real models with what they are."""
    if name in lm_models.BUILTIN:
        return {"smollm2": t("SmolLM2-135M (language model)"), "minilm": t("MiniLM (pretrained encoder)")}[name]
    if name in lm_models.server_models():
        return t("{name} (started with the server)", name=name)
    return name


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
    seed_from_query("checkpoint", "checkpoint", default_checkpoint(names, current_lang()),
                    valid=lambda v: v in names)
    name = sb.selectbox(t("Model (checkpoint)"), names, key="checkpoint", on_change=_on_checkpoint_change,
                        format_func=model_label,
                        help=t("A small Transformer trained on a toy task, shipped with the app (or trained "
                               "on the Training page in this session), or a real pretrained model: SmolLM2 "
                               "(a language model), MiniLM (an encoder) and those the server was started with."))
    if name in session_models():
        sb.caption(t("Trained on the Training page in this session: only you see it, until the session ends."))
    real = lm_models.is_real(name) and name not in session_models()
    try:
        with st.spinner(t("Loading {name}…", name=name)):
            example = load_ckpt(name).example
    except ValueError as e:
        show_error(e)
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
    long = [label for label, s in ((t("source text"), text), (t("target text"), target)) if len(s) > MAX_URL_TEXT]
    if long:
        sb.caption(t("The {what} is longer than {n} characters, so the page's link does not carry it: "
                     "a copied link opens on the model's example instead.", what=t(" and ").join(long),
                     n=f"{MAX_URL_TEXT:,}"))
    sb.radio(t("Figure download format"), ["png", "svg"], key="export_format", horizontal=True,
             help=t("What the camera button in each figure's toolbar saves."))
    # Long texts stay out of the URL: a reload would send them in the request line.
    write_query(checkpoint=name, text=text if len(text) <= MAX_URL_TEXT else None,
                target=(target or None) if len(target) <= MAX_URL_TEXT else None)
    sel = Selection(name, text, target or None)
    st.session_state[_SEL_KEY] = sel
    freeze_heap_once()
    return sel


def selection() -> Selection | None:
    """The sidebar's choice for this run: app.py draws the sidebar before every page; a page
    run on its own (`streamlit run viz/pages/x.py`) draws it here."""
    if _SEL_KEY not in st.session_state:
        return sidebar()
    return st.session_state[_SEL_KEY]


def require_trace(sel: Selection | None = None):
    """(Selection, Trace) for the page, or a clear message and `st.stop()` for bad input."""
    sel = sel or selection()
    if sel is None:
        st.stop()
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
            trace = get_trace(sel.name, sel.text, sel.target)
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
#   common.require("toy")               # a model trained in this lab (task, tokenizers, training run)
#   common.require("cross_attention")   # an encoder-decoder Transformer
#   common.require("lm")                # a decoder-only language model
# Without it, the page says in one sentence what this model lacks, offers a model that has it, and stops.
CAPABILITIES = ("toy", "encoder", "decoder", "cross_attention", "lm")


def capabilities(name: str) -> set[str]:
    """What model `name` has, from its own description (describe()), never from its name."""
    ckpt = load_ckpt(name)
    if not isinstance(ckpt, lm_models.RealModel):
        return {"toy", "encoder", "decoder", "cross_attention"}
    desc = ckpt.describe()
    kinds = {a["kind"] for a in desc.get("attention", {}).values()}
    out = set(desc.get("stacks", {})) & {"encoder", "decoder"}
    if "cross" in kinds:
        out.add("cross_attention")
    if desc.get("family") == "decoder_lm":
        out.add("lm")
    return out


def _lacks(need: str, name: str, family: str) -> str:
    """One sentence: what model `name` (of `family`) lacks for a page that needs `need`."""
    if need in ("cross_attention", "encoder") and family == "decoder_lm":
        return t("A decoder-only model has no encoder and no cross-attention, and {model} is one.",
                 model=model_label(name))
    if need in ("cross_attention", "decoder") and family == "encoder":
        return t("An encoder-only model has no decoder and no cross-attention, and {model} is one.",
                 model=model_label(name))
    if need == "lm":
        return t("{model} is not a language model: this page runs a decoder-only LLM.", model=model_label(name))
    return t("{model} was not trained in this lab: this page needs a toy model's task, tokenizers and "
             "training run.", model=model_label(name))


def _model_with(need: str, names: list[str]) -> str | None:
    if need == "lm":
        return next((n for n in ("smollm2", *names) if n in names and lm_models.is_real(n)
                     and "lm" in capabilities(n)), None)
    toys = [n for n in names if not lm_models.is_real(n)]
    return default_checkpoint(toys, current_lang()) if toys else None


def switch_model(name: str) -> None:
    """Choose model `name` in the sidebar (a button's on_click: before the rerun draws the sidebar)."""
    st.session_state["checkpoint"] = st.session_state[_KEPT + "checkpoint"] = name
    _on_checkpoint_change()


LLM_PAGE = "viz/pages/llm.py"
LM_VIEWS = {"tokens": N_("See its tokens on the Language model page"),
            "generate": N_("Generate with it on the Language model page")}


def require(*needs: str, lm_view: str | None = None) -> Selection:
    """The sidebar's selection if its model has every capability in `needs` (see CAPABILITIES); else one
    sentence on what it lacks, a button that opens this page with a model that has it, and st.stop().
    lm_view: for a language model, also a link to that view of the Language model page (LM_VIEWS)."""
    sel = selection()
    if sel is None:
        st.stop()
    try:
        have = capabilities(sel.name)
    except ValueError as e:
        show_error(e)
        st.stop()
    missing = [n for n in needs if n not in have]
    if not missing:
        return sel
    ckpt = load_ckpt(sel.name)
    family = ckpt.family if isinstance(ckpt, lm_models.RealModel) else "transformer"
    need = missing[0]
    st.info(_lacks(need, sel.name, family), icon="🧩")
    if lm_view and family == "decoder_lm":
        st.page_link(LLM_PAGE, label=t(LM_VIEWS[lm_view]), icon=":material/chat:",
                     query_params={"checkpoint": sel.name, "view": "generate" if lm_view == "generate" else "heads"})
    other = _model_with(need, checkpoint_names())
    if other:
        st.button(t("Open this page with {model}", model=model_label(other)), key="_al_require_switch",
                  on_click=switch_model, args=(other,), type="primary")
    st.stop()


def is_real_model(sel: Selection | None) -> bool:
    """Whether the selection is a real pretrained model (SmolLM2, MiniLM, a server model), not a toy one."""
    return sel is not None and lm_models.is_real(sel.name) and sel.name not in session_models()


def target_unk_note(ckpt, target: str | None) -> str | None:
    """`unk_note` for a teacher-forced target (its characters outside the target vocabulary), or None."""
    note = unk_note(ckpt.tgt_tokenizer.pieces(target), target) if target else None
    return note and t("Target: ") + note


def model_tokens(ckpt, trace) -> list[str] | None:
    """Under teacher forcing, the model's own prediction at each decoder position (argmax of the trace's
    logits), to show beside the reference token it was fed there; None for the model's own output (there
    they are the same tokens) or a trace without logits."""
    if trace.meta.get("generated", True) or "logits" not in trace:
        return None
    return [ckpt.tgt_tokenizer.id_to_token(int(i)) for i in trace["logits"][0].argmax(-1)]


def return_freed_memory() -> None:
    """Give freed memory back to the OS: freed trace blocks (else they go 1 s later) and heap pages (glibc
    keeps a finished thread's arena, a training run: ~150 MB, for reuse); a classroom server should
    shrink once the run is over."""
    from model.core.recorder import release_trace_memory

    release_trace_memory()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def stop_note(meta) -> str | None:
    """Why the model's own output ended without [EOS] (a loop, or the shared length limit); None if it ended."""
    if not meta.get("generated") or meta.get("finished", True):
        return None
    loop = meta.get("looped")
    if loop:
        return t("The model did not stop: its output ends with “{ngram}” repeated {n} times, more often than the "
                 "source repeats it, so decoding stopped there (a loop).", ngram=" ".join(loop["ngram"]),
                 n=loop["repeats"])
    return t("The model did not stop: it produced no [EOS] and was stopped at the {limit}-token limit (the model's "
             "max_len − 1 positions; the same limit on every page).", limit=meta.get("max_new_tokens"))


# ---------------------------------------------------------------- figures


def plotly_config(filename: str = "attention-lab") -> dict:
    """Toolbar config: the camera button saves PNG or SVG (sidebar choice), at 2x for PNG."""
    fmt = st.session_state.get("export_format", "png")
    return {
        "displaylogo": False,
        "toImageButtonOptions": {"format": fmt, "filename": filename, "scale": 2 if fmt == "png" else 1},
    }


def safe_filename(name: str | None) -> str:
    """A download file name from free text (checkpoint paths, capture names)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name or "").strip("-.")[:80] or "attention-lab"


def show_figure(fig, key: str | None = None, filename: str | None = None, **kwargs):
    """Render a plotly figure with the export toolbar; extra kwargs go to st.plotly_chart
    (e.g. on_select="rerun" to get click selections back)."""
    name = filename or key or (fig.layout.title.text if fig.layout.title and fig.layout.title.text else None)
    if current_lang() == "zh":  # Chinese y titles horizontal (on a copy: the figure may be cached and shared)
        from viz.figures import upright_y_titles

        fig = upright_y_titles(fig, copy=True)
    return st.plotly_chart(fig, key=key, config=plotly_config(safe_filename(name)), **kwargs)


def tokens_of(trace, side: str) -> list[str]:
    """Token strings of one side ("src" or "tgt") from the trace metadata (first batch row)."""
    toks = trace.meta.get(f"{side}_tokens") or []
    if toks and isinstance(toks[0], list):
        toks = toks[0]
    return [str(t) for t in toks]
