"""Rendering: figures with the export toolbar, bad input as a message (never a traceback), token labels."""

from __future__ import annotations

import re

import streamlit as st

from viz.i18n import current_lang
from viz.ui.long_limits import show_limit
from viz.ui.text import error_text


def show_error(err: BaseException | str, hint: str | None = None) -> None:
    """A bad input or file as a message on the page, never a traceback. `hint` (what to do) is left out when
    the message already says it. A prompt over a length limit is said with the longest length that works and a
    keep-the-end button (viz/ui/long_limits.py)."""
    if not isinstance(err, str) and show_limit(err):
        return
    msg, advised = error_text(err)
    st.error(msg + (f"\n\n{hint}" if hint and not advised else ""), icon="⚠️")


def plotly_config(filename: str = "attention-lab") -> dict:
    """Toolbar config: the camera button saves PNG or SVG (sidebar choice), at 2x for PNG."""
    from viz.i18n import current_lang
    from viz.ui.plotly_locale import locale_config

    fmt = st.session_state.get("export_format", "png")
    return {
        "displaylogo": False,
        "toImageButtonOptions": {"format": fmt, "filename": filename, "scale": 2 if fmt == "png" else 1},
        **locale_config(current_lang()),  # the toolbar's tooltips in the UI's language (issue 31 §4)
    }


def safe_filename(name: str | None) -> str:
    """A download file name from free text (checkpoint paths, capture names)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name or "").strip("-.")[:80] or "attention-lab"


def show_figure(fig, key: str | None = None, filename: str | None = None, **kwargs):
    """Render a plotly figure with the export toolbar; extra kwargs go to st.plotly_chart
    (e.g. on_select="rerun" to get click selections back)."""
    name = filename or key or (fig.layout.title.text if fig.layout.title and fig.layout.title.text else None)
    if current_lang() == "zh":  # Chinese y titles horizontal (on a copy: the figure may be cached and shared)
        from viz.figures.attention import upright_y_titles

        fig = upright_y_titles(fig, copy=True)
    return st.plotly_chart(fig, key=key, config=plotly_config(safe_filename(name)), **kwargs)


def tokens_of(trace, side: str) -> list[str]:
    """Token strings of one side ("src" or "tgt") from the trace metadata (first batch row)."""
    toks = trace.meta.get(f"{side}_tokens") or []
    if toks and isinstance(toks[0], list):
        toks = toks[0]
    return [str(t) for t in toks]


def model_tokens(ckpt, trace) -> list[str] | None:
    """Under teacher forcing, the model's own prediction at each decoder position (argmax of the trace's
    logits), to show beside the reference token it was fed there; None for the model's own output (there
    they are the same tokens) or a trace without logits."""
    if trace.meta.get("generated", True) or "logits" not in trace:
        return None
    return [ckpt.tgt_tokenizer.id_to_token(int(i)) for i in trace["logits"][0].argmax(-1)]
