"""Limits of a long prompt on the pages that keep a full trace (issue 24 §2): every attention map of every
layer, L × H × T² floats, fits this server's budget only up to a few hundred tokens of SmolLM2. A page that
cannot show a prompt says so in the UI's words and language, names the longest length that works and offers
the Attention page's "Keep the last N tokens" button (viz/ui/long_views.py); `?keep=N` then cuts the
sidebar's prompt to its last N tokens on every page (`kept_text`). The model's own context length is a hard
limit with its own sentence.

    from viz.ui.long_limits import show_limit
    if show_limit(err):   # a CaptureBudgetError / ContextLengthError: said, with the button
        st.stop()

(render.show_error calls show_limit itself, so pages that show their errors with it need nothing more.)
"""

from __future__ import annotations

import streamlit as st

from model.core import recorder
from viz.i18n import t
from viz.ui.state import write_query

# Imports only downward (recorder, i18n, state): long_views and render import this module, never the reverse
# at import time, so viz/ui has no import circle (tests/test_import_cycles.py).

LIMIT_ERRORS = (recorder.CaptureBudgetError, recorder.ContextLengthError)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def limit_text(err: BaseException) -> str | None:
    """One or two sentences for a prompt over a limit, in the UI's language; None for any other error."""
    if isinstance(err, recorder.ContextLengthError) or (
            isinstance(err, recorder.CaptureBudgetError) and err.context_length and err.n_tokens > err.context_length):
        return t("This text is {n} tokens long, and the model reads at most {limit} tokens at once (its context "
                 "length).", n=f"{err.n_tokens:,}", limit=f"{err.context_length:,}")
    if isinstance(err, recorder.CaptureBudgetError) and getattr(err, "lazy", False):
        return t("This text is {n} tokens long; this page shows at most {fit} tokens of it on this server (what it "
                 "keeps of the model's run, the queries, keys and values and each layer's output, must fit in "
                 "{budget}). The Attention and Language model pages show longer texts.",
                 n=f"{err.n_tokens:,}", fit=f"{err.max_tokens:,}", budget=_mib(err.budget))
    if isinstance(err, recorder.CaptureBudgetError):
        return t("This text is {n} tokens long; this page shows at most {fit} tokens of it on this server (what it "
                 "keeps of the model's run, every attention map of every layer, must fit in {budget}). The "
                 "Attention and Language model pages show long texts whole.",
                 n=f"{err.n_tokens:,}", fit=f"{err.max_tokens:,}", budget=_mib(err.budget))
    return None


def keep_length(err: BaseException) -> int:
    """The longest prompt (in tokens) that works for the request that raised `err`; 0 when none does."""
    if isinstance(err, recorder.ContextLengthError):
        return err.context_length
    n = err.max_tokens
    return min(n, err.context_length) if err.context_length else n


def keep_button(n: int, key: str) -> None:
    """The "Keep the last N tokens" button: `?keep=N` cuts the sidebar's prompt to its end on every page."""
    if st.button(t("Keep the last {n} tokens", n=f"{n:,}"), key=f"{key}_keep_{n}",
                 help=t("The end of the text is kept: it is where the model predicts the next token.")):
        write_query(keep=n)
        st.rerun()


def show_limit(err: BaseException) -> bool:
    """Show `err` as a limit (sentence + keep-the-end button) if it is one; whether it was."""
    msg = limit_text(err)
    if msg is None:
        return False
    st.error(msg, icon="📏")
    n = keep_length(err)
    if n > 0:
        try:
            keep_button(n, "limit")
        except st.errors.StreamlitAPIException:  # the same limit said twice in one run: one button is enough
            pass
    return True


def check_length(lm, text: str, names=None, budget: int | None = None) -> None:
    """Before a page runs a language model `lm` on `text` for a full capture of `names` (None: every capture
    point): over the model's context length or the capture budget, say so (`show_limit`) and st.stop(), in
    milliseconds rather than after a forward pass that cannot be kept."""
    budget = recorder.DEFAULT_BUDGET_BYTES if budget is None else budget
    try:
        T = lm.encode(text).shape[1]
    except recorder.ContextLengthError as e:
        show_limit(e)
        st.stop()
    except ValueError:
        return  # the page says what else is wrong with the text
    need = lm.trace_bytes(T, names=names)
    if need > budget:
        fit = lm.max_tokens_within(budget, names=names)
        show_limit(recorder.CaptureBudgetError(
            "over budget", needed_bytes=need, budget=budget, n_tokens=T, max_tokens=fit, context_length=lm.max_tokens))
        st.stop()


def costly_cut(lm, text: str, above: int, why: str) -> str:
    """The text an analysis whose time grows too fast with the length (a forward pass per token, per head)
    runs on: the text itself up to `above` tokens, else its last `above` tokens (the end, where the next
    token is predicted), said in a warning beside `why`: never cut silently."""
    try:
        n = len(lm._need_tokenizer().encode(text).ids)
    except ValueError:
        return text  # no tokenizer: the page says so itself
    if n <= above:
        return text
    st.warning(t("{why} At {n} tokens that takes too long on this server, so it runs on the text's last {k} tokens.",
                 why=why, n=f"{n:,}", k=f"{above:,}"), icon="⏳")
    return kept_text(lm, text, above)[0]


def kept_text(lm, text: str, keep: int | None) -> tuple[str, int]:
    """(the text's last `keep` tokens as text, the text's whole length in tokens). The cut is decoded and
    re-read: it never holds more than `keep` tokens (a cut inside a word may re-tokenize longer)."""
    tok = lm._need_tokenizer()  # the same ids as lm.encode(text), without its context-length check
    ids = tok.encode(text).ids
    n = len(ids)
    if not keep or keep >= n:
        return text, n
    for k in range(keep, 0, -1):
        cut = lm.decode(ids[-k:])
        if cut.strip() and len(tok.encode(cut).ids) <= keep:
            return cut, n
    return text, n


def query_keep() -> int | None:
    raw = st.query_params.get("keep")
    return int(raw) if raw is not None and str(raw).isdigit() and int(raw) > 0 else None
