"""Streamlit glue shared by every page: cached models and traces, the sidebar, URL sync,
figure rendering with export, and friendly error messages.

State rules (Streamlit serves many sessions from threads of one process):
- loaded checkpoints and traces live in `st.cache_resource`: shared, read-only (a `Trace`
  is immutable; nothing here writes into a model);
- everything a user chose or uploaded lives in `st.session_state` (per session).

Pages call `selection()` / `require_trace()`; `app.py` draws the sidebar once, before the
page runs, so the checkpoint and text widgets keep their state across pages.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import streamlit as st

PREFERRED = ("dates", "zh-en", "reverse")  # default checkpoint: attention is readable on these
TRACE_CACHE_ENTRIES = 16  # a full trace of a 256-token input is ~20 MB: bound the shared cache
MAX_URL_TEXT = 1000  # characters of source/target text mirrored into the URL
_SEL_KEY = "_al_selection"


# ---------------------------------------------------------------- models and traces


EXTRA_ENV = "ATTENTION_LAB_CHECKPOINTS"  # os.pathsep-separated checkpoint dirs to offer too


def _checkpoint_api():
    try:
        from model import list_checkpoints, load_checkpoint
    except ImportError:  # the package root may not re-export them
        from model.checkpoint import list_checkpoints, load_checkpoint
    return list_checkpoints, load_checkpoint


def checkpoint_names() -> list[str]:
    """Shipped checkpoint names, then any directories listed in $ATTENTION_LAB_CHECKPOINTS."""
    list_checkpoints, _ = _checkpoint_api()
    extra = [p for p in os.environ.get(EXTRA_ENV, "").split(os.pathsep) if p.strip()]
    return list(list_checkpoints()) + extra


@st.cache_resource(show_spinner="Loading the model…", max_entries=8)
def load_ckpt(name: str):
    """A loaded checkpoint (shipped name or directory), shared read-only by all sessions:
    never train or mutate it."""
    _, load_checkpoint = _checkpoint_api()
    ckpt = load_checkpoint(name)
    ckpt.model.eval()
    return ckpt


@st.cache_resource(show_spinner="Running the model…", max_entries=TRACE_CACHE_ENTRIES, ttl=3600)
def _cached_trace(name: str, text: str, target: str | None):
    return load_ckpt(name).trace(text, target=target)


def get_trace(name: str, text: str, target: str | None = None):
    """Full trace of checkpoint `name` on `text` (target None = the model's own greedy output).

    Cached per (checkpoint, text, target): the same input always gives the same read-only trace.
    Raises ValueError (and subclasses) for input the model cannot take.
    """
    return _cached_trace(name, text, target or None)[1]


# ---------------------------------------------------------------- input checks

# C0/C1 controls (tab, newline and carriage return allowed) and invisible direction/format marks.
# ZWJ/ZWNJ (U+200C/D) are allowed: emoji sequences and some scripts need them.
_CONTROL = re.compile(
    r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def text_problems(text: str) -> str | None:
    """Why `text` cannot be run, in words a student understands; None when it can."""
    if not text:
        return "The input is empty: type a sentence in the sidebar."
    if not text.strip():
        return "The input is only whitespace: type a sentence in the sidebar."
    bad = _CONTROL.search(text)
    if bad:
        ch = bad.group()
        name = unicodedata.name(ch, "control character")
        return (f"The input contains an invisible control character U+{ord(ch):04X} ({name}) at "
                f"position {bad.start()}. Remove it (it was probably pasted) and try again.")
    return None


def unk_note(pieces) -> str | None:
    """A warning listing what the tokenizer could not represent (e.g. emoji -> [UNK])."""
    unk = [p for p in pieces if p.is_unk]
    if not unk:
        return None
    shown = ", ".join(repr(p_text) for p_text in _unk_texts(unk)[:8])
    return (f"{len(unk)} token(s) are not in this model's vocabulary and became [UNK]: {shown}. "
            "The model still runs, but it sees only the [UNK] embedding there.")


def _unk_texts(unk) -> list[str]:
    return [p.token if p.token != "[UNK]" else f"[UNK]@{p.span[0]}" for p in unk]


def show_error(err: BaseException | str, hint: str | None = None) -> None:
    """A bad input or file as a message on the page, never a traceback."""
    msg = err if isinstance(err, str) else (str(err).strip("'\"") or type(err).__name__)
    st.error(msg + (f"\n\n{hint}" if hint else ""), icon="⚠️")


# ---------------------------------------------------------------- URL (query string) sync


def seed_from_query(key: str, param: str, default: Any, cast: Callable[[str], Any] = str,
                    valid: Callable[[Any], bool] | None = None) -> None:
    """Give widget `key` its starting value from the URL (`?param=...`) on first render.

    Only when the session has no value yet, so the URL sets the view once and the user's
    later choices win. An unusable URL value silently falls back to `default`.
    """
    if key in st.session_state:
        return
    value = default
    raw = st.query_params.get(param)
    if raw is not None:
        try:
            value = cast(raw)
        except (TypeError, ValueError):
            value = default
        if valid is not None and not valid(value):
            value = default
    st.session_state[key] = value


def write_query(**params: Any) -> None:
    """Mirror the current view into the URL so it can be shared (None removes a parameter)."""
    for k, v in params.items():
        if v is None:
            if k in st.query_params:
                del st.query_params[k]
        elif st.query_params.get(k) != str(v):
            st.query_params[k] = str(v)


def int_in(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and lo <= v <= hi


def clamp_state(key: str, lo: int, hi: int) -> None:
    """Keep a remembered widget value inside its current range (e.g. after switching to a
    smaller model), instead of letting the widget raise."""
    v = st.session_state.get(key)
    if isinstance(v, int | float) and not lo <= v <= hi:
        st.session_state[key] = min(max(v, lo), hi)


# ---------------------------------------------------------------- sidebar and selection


@dataclass(frozen=True)
class Selection:
    name: str  # checkpoint name
    text: str  # source text, exactly as typed
    target: str | None  # teacher-forced target, None = the model's greedy output

    @property
    def ckpt(self):
        return load_ckpt(self.name)


def default_checkpoint(names: list[str]) -> str:
    return next((n for n in PREFERRED if n in names), names[0])


def _on_checkpoint_change() -> None:
    # A new model has a new vocabulary: start from its own example sentence.
    try:
        st.session_state["source_text"] = load_ckpt(st.session_state["checkpoint"]).example
    except ValueError:
        return  # a broken checkpoint: sidebar() shows why on this rerun
    st.session_state["target_text"] = ""


def sidebar() -> Selection | None:
    """Checkpoint select, source text and figure-export format, in the sidebar. Call once per run
    (app.py does), before the page. Returns None (after showing why) if no model can be loaded."""
    st.session_state[_SEL_KEY] = None
    try:
        names = checkpoint_names()
    except Exception as e:  # any failure here must still leave a page with a message
        show_error(f"No trained checkpoints could be listed: {e}")
        return None
    if not names:
        show_error("No trained checkpoints are installed (model/checkpoints is empty).")
        return None
    sb = st.sidebar
    if st.session_state.get("checkpoint") not in (None, *names):  # e.g. a checkpoint directory removed
        del st.session_state["checkpoint"]
    seed_from_query("checkpoint", "checkpoint", default_checkpoint(names), valid=lambda v: v in names)
    name = sb.selectbox("Model (checkpoint)", names, key="checkpoint", on_change=_on_checkpoint_change,
                        help="A small Transformer trained on a toy task, shipped with the app.")
    try:
        example = load_ckpt(name).example
    except ValueError as e:
        show_error(e)
        return None
    seed_from_query("source_text", "text", example)
    seed_from_query("target_text", "target", "")
    text = sb.text_area("Source text", key="source_text", height=90,
                        help="The encoder reads this. One model input; every page shows its tensors.")
    with sb.expander("Target (teacher forcing)"):
        target = st.text_input(
            "Target text", key="target_text",
            help="Empty: the decoder reads the model's own greedy translation. Otherwise it reads this "
                 "text in one parallel pass under the look-ahead mask (teacher forcing).")
    sb.radio("Figure download format", ["png", "svg"], key="export_format", horizontal=True,
             help="What the camera button in each figure's toolbar saves.")
    # Long texts stay out of the URL: a reload would send them in the request line.
    write_query(checkpoint=name, text=text if len(text) <= MAX_URL_TEXT else None,
                target=(target or None) if len(target) <= MAX_URL_TEXT else None)
    sel = Selection(name, text, target or None)
    st.session_state[_SEL_KEY] = sel
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
        problem = problem and "Target: " + problem
    if problem:
        show_error(problem)
        st.stop()
    ckpt = sel.ckpt
    try:
        note = unk_note(ckpt.src_tokenizer.pieces(sel.text))
        trace = get_trace(sel.name, sel.text, sel.target)
    except ValueError as e:  # too long, unknown ids, capture over budget, ...
        show_error(e, "Shorten or change the text in the sidebar.")
        st.stop()
    if note:
        st.warning(note, icon="🔤")
    return sel, trace


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
    return st.plotly_chart(fig, key=key, config=plotly_config(safe_filename(name)), **kwargs)


def tokens_of(trace, side: str) -> list[str]:
    """Token strings of one side ("src" or "tgt") from the trace metadata (first batch row)."""
    toks = trace.meta.get(f"{side}_tokens") or []
    if toks and isinstance(toks[0], list):
        toks = toks[0]
    return [str(t) for t in toks]
