"""UI language: gettext catalogs (Babel .po files), English msgids, one helper for every page.

    from viz.i18n import t
    st.title(t("Attention"))
    st.caption(t("{n} tokens", n=len(tokens)))       # placeholders are filled after translation

The English text in the code *is* the message id (gettext's convention), so the English UI
needs no lookup. Chinese lives in `viz/locale/zh/*.po`: one file per area of the app (each
page's owner edits only its own file); all of them are merged at start-up. Extract and check:

    pybabel extract -k t -k N_ -o messages.pot viz app.py model/toy/tasks.py   # every msgid the code uses
    pytest tests/test_i18n.py        # fails on a missing zh string, a bad .po, a lost {placeholder}

(pybabel misses t() calls inside f-strings; the test finds those too.) model/toy/tasks.py marks the
toy tasks' grammar texts with its own N_ (model/ never imports viz).

The language comes from `?lang=zh|en` in the URL, else the browser's Accept-Language, and is
kept per session (`st.session_state`), never in module state: sessions differ in language.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

LANGS = {"en": "English", "zh": "简体中文"}
DEFAULT_LANG = "en"
LOCALE_DIR = Path(__file__).parent / "locale"
_STATE_KEY = "lang"
_CHOICE_KEY = "_lang_choice"  # the sidebar control's widget key


@functools.cache
def catalog(lang: str) -> dict[str, str]:
    """msgid -> translation for `lang`, merged from every `locale/<lang>/*.po` (empty for English)."""
    from babel.messages.pofile import read_po  # lazy: figure tests that stay in English never pay

    out: dict[str, str] = {}
    for po in sorted((LOCALE_DIR / lang).glob("*.po")):
        with po.open("rb") as f:
            for msg in read_po(f, locale=lang):
                if msg.id and isinstance(msg.id, str) and msg.string and not msg.fuzzy:
                    out[msg.id] = msg.string
    return out


def N_(msg: str) -> str:
    """Mark a string for extraction without translating it now (module-level tables)."""
    return msg


def lang_from_header(accept_language: str | None) -> str:
    """The first supported language in an Accept-Language header ('zh-CN,zh;q=0.9,en;q=0.8' -> 'zh')."""
    ranked = []
    for i, part in enumerate((accept_language or "").split(",")):
        tag, _, q = part.strip().partition(";q=")
        try:
            weight = float(q) if q else 1.0
        except ValueError:
            weight = 0.0
        ranked.append((-weight, i, tag.strip().lower().split("-")[0]))
    return next((code for _, _, code in sorted(ranked) if code in LANGS), DEFAULT_LANG)


def current_lang() -> str:
    """This session's language: URL `?lang=`, else the session's choice, else Accept-Language."""
    import streamlit as st
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    if get_script_run_ctx(suppress_warning=True) is None:  # figure builders in tests, scripts: English
        return DEFAULT_LANG
    try:
        url = st.query_params.get("lang")
        if url in LANGS:
            st.session_state[_STATE_KEY] = url
        if st.session_state.get(_STATE_KEY) not in LANGS:
            try:
                header = st.context.headers.get("Accept-Language")
            except Exception:  # no browser request (AppTest, bare mode)
                header = None
            st.session_state[_STATE_KEY] = lang_from_header(header)
        return st.session_state[_STATE_KEY]
    except Exception:  # a session without query params or headers (bare mode)
        return DEFAULT_LANG


def t(msg: str, /, lang: str | None = None, **fmt) -> str:
    """`msg` in the session's language, with `{placeholders}` filled from `fmt`."""
    lang = lang or current_lang()
    out = catalog(lang).get(msg, msg) if lang != DEFAULT_LANG else msg
    return out.format(**fmt) if fmt else out


def option_labels(options, label=lambda o: o) -> Callable:
    """A widget `format_func` over stable option values whose labels are translated *now*:

        st.radio(t("Kind"), KINDS, format_func=option_labels(KINDS, lambda k: t(KIND_LABELS[k])))

    AppTest calls format_func again outside the session (where t() gives English) to find the
    chosen option, so a format_func that calls t() lazily breaks widget tests in zh mode."""
    table = {o: label(o) for o in options}
    return table.__getitem__


def _on_switch() -> None:
    """The user picked a language: it wins over the URL's (rewritten here, before the rerun reads it)."""
    import streamlit as st

    choice = st.session_state.get(_CHOICE_KEY)
    if choice in LANGS:
        st.session_state[_STATE_KEY] = choice
        st.query_params["lang"] = choice


def language_switch() -> str:
    """The sidebar's language control, kept in the URL (`?lang=`) so a shared link keeps it."""
    import streamlit as st

    lang = current_lang()
    st.session_state[_CHOICE_KEY] = lang  # also when the URL changed it (a pasted link), or a click deselected
    st.sidebar.segmented_control("Language / 语言", list(LANGS), format_func=LANGS.get, key=_CHOICE_KEY,
                                 on_change=_on_switch)
    if st.query_params.get("lang") != lang:
        st.query_params["lang"] = lang
    return lang
