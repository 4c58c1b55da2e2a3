"""URL and state (issue 13): the URL carries the view (model, text, page controls) so a link reopens it.

`write_query` is the one place that writes it. Streamlit's frontend *pushes* a history entry for
every query-string change; `install_history_patch` (app.py, first thing) turns a push that keeps the
page path into a replace, so only a page change adds an entry and Back leaves a page in one press.
`seed_from_query` gives a widget its first value: the URL, else the value this session last had
(so Attention -> Tokens -> Attention keeps the view, and so does an input error), else a default.
A text over MAX_URL_TEXT characters goes into the URL as `?{param}_ref=`, a reference to a copy this
server keeps (text_store.py): a reload would send the text itself in the request line.
Everything a user chose or uploaded lives in `st.session_state` (per session).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from viz.i18n import t
from viz.ui import text_store

MAX_URL_TEXT = 1000  # characters of a text mirrored into the URL; a longer one goes as a reference (text_store)
REF = "_ref"  # ?text_ref=<16 hex>: the long text `text` kept on this server
_KEPT = "_al_kept_"  # prefix: the last value of a URL-seeded widget, kept while it is not drawn
_LINKED = "_al_linked_"  # prefix: a widget's value as this run's URL gave it (clamp_state's note is for it alone)
_SEEDED = "_al_seeded"  # the keys of every widget seed_from_query has seeded in this session (forget_view drops them)


# ---------------------------------------------------------------- URL (query string) sync

# Streamlit's frontend calls history.pushState for every query-string change (one entry per
# click, several per rerun). Keep pushes that change the page path (a page change); turn the
# others into replaceState. Installed once per browser tab; st.html is not iframed.
# Two cases the replace alone missed (issue 26 §4, found in a browser):
# - a fresh load pushes a few entries (same path) before this script runs: Back then took up to 6 presses.
#   Every entry made once the patch runs is marked (__al); Back landing on an unmarked entry of the page
#   it just left goes on back;
# - st.switch_page writes the next page's query into this page's entry a moment (one or more pushes) before
#   the page change: Back then reopened this page with the other page's parameters. The entry's URLs are kept
#   (its trail); at the page change, the newest one that is not wholly inside the next page's query is put
#   back. An earlier version kept "the URL as the last finished run left it" instead: on a loaded machine
#   Streamlit shows "not running" for a moment between the two runs of a switch, and that URL was lost.
_HISTORY_PATCH = """<script>
(() => {
  const h = window.history;
  if (h.__attentionLabReplace) return;
  h.__attentionLabReplace = true;
  const push = h.pushState.bind(h), replace = h.replaceState.bind(h);
  const mark = (state) => Object.assign({}, state || {}, {__al: 1});
  const pairs = (url) => [...new URL(url, location.href).searchParams].map(([k, v]) => k + "=" + v);
  let trail = [];  // this entry's earlier URLs and states, oldest first (bounded)
  const keep = () => { trail.push({url: location.href, state: h.state}); trail = trail.slice(-64); };
  h.replaceState = (state, title, url) => replace(mark(state), title, url);
  h.pushState = (state, title, url) => {
    const next = new URL(url ?? location.href, location.href);
    if (next.pathname === location.pathname) {
      keep();
      return replace(mark(state), title, url);
    }
    keep();
    const theirs = new Set(pairs(next.href));
    const own = trail.reverse().find((e) => !pairs(e.url).every((p) => theirs.has(p)));
    if (own && own.url !== location.href) replace(own.state, "", own.url);
    trail = [];
    return push(mark(state), title, url);
  };
  replace(mark(h.state), "", location.href);
  let path = location.pathname;
  window.addEventListener("popstate", (ev) => {
    const same = location.pathname === path;
    path = location.pathname;
    trail = [];
    if (same && !(ev.state && ev.state.__al)) h.back();
  });
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
    st.session_state.setdefault(_SEEDED, set()).add(key)
    if key in st.session_state:
        # Written back, so the widget tells the browser its value (set_value): after a run that did not
        # draw it (an input error stopped the page; a fragment's widgets outlive such runs) the browser
        # builds it anew and would show its default beside a chart and URL that show this value.
        st.session_state[key] = st.session_state[kept] = st.session_state[key]
        return
    candidates = []
    raw = st.query_params.get(param)
    if raw is None and (ref := st.query_params.get(param + REF)) is not None:
        raw = text_store.get(ref)
        if raw is None:  # another server's link, or a text trimmed from the store: say so, use the default
            note_gone(param, ref, st.session_state.get(kept, default))
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
    if raw is not None and url_ok:
        st.session_state[_LINKED + key] = value
    st.session_state[key] = st.session_state[kept] = value


def forget_view() -> None:
    """Drop every URL-seeded widget's value (and its kept copy), so the next run takes each from the URL, else its
    default: a class follower switching to the teacher's view (viz/ui/classroom.py) gets the teacher's page state,
    not the values it last had itself."""
    for key in st.session_state.get(_SEEDED, ()):
        for k in (key, _KEPT + key, _LINKED + key):
            st.session_state.pop(k, None)


_NOTED = "_al_noted"  # (what, value) pairs this session was already told about


def _first_time(what: str, given: Any) -> bool:
    """True the first time this session is told about the link's `what=given` (each note is said once)."""
    noted = st.session_state.setdefault(_NOTED, set())
    if (what, str(given)) in noted:
        return False
    noted.add((what, str(given)))
    return True


def _quoted(value: Any, most: int = 60) -> str:
    """A link's value as a note shows it in a code span: backticks replaced, at most `most` characters."""
    value = str(value).replace("`", "'")
    return value if len(value) <= most else value[:most] + "…"


def note_replaced(what: str, given: Any, used: Any, lo: Any = None, hi: Any = None) -> None:
    """Say, once per session and value, that a link's `what=given` could not be used and which value
    the page shows instead (`lo`..`hi`: the widget's range, when that is the reason)."""
    if not _first_time(what, given):
        return
    given = _quoted(given)  # the value exactly as the link has it
    if lo is not None and hi is not None:
        msg = t("This link's `{what}={given}` is outside the range {lo} to {hi}, so the page uses {used}.",
                what=what, given=given, lo=lo, hi=hi, used=used)
    else:
        msg = t("This link's `{what}={given}` is not possible here, so the page uses {used}.",
                what=what, given=given, used=used)
    st.warning(msg, icon="🔗")


def note_gone(what: str, ref: str, used: Any) -> None:
    """Say, once per session and link, that a link's long text is not kept on this server."""
    if not _first_time(what + REF, ref):
        return
    st.warning(t("This link's `{param}={ref}` names a long text that this server does not keep (the link was made on "
                 "another server, or the text was removed to make room), so the page uses {used}.",
                 param=what + REF, ref=_quoted(ref, 20), used=_quoted(used)), icon="🔗")


def long_text_note(*texts: str) -> str | None:
    """The caption under a text box whose text is over MAX_URL_TEXT characters (None when every text fits)."""
    long = [x for x in texts if len(x) > MAX_URL_TEXT]
    if not long:
        return None
    if all(text_store.put(x) is not None for x in long):
        return t("Over {n} characters, the link carries a reference to a copy kept on this server: the link "
                 "reopens it here, but not on another server.", n=f"{MAX_URL_TEXT:,}")
    return t("Over {n} characters, and this server could not keep a copy, so the page's link does not carry "
             "it: a copied link opens on the default text instead.", n=f"{MAX_URL_TEXT:,}")


def link_params(params: dict[str, Any]) -> dict[str, str]:
    """A link's parameters as the URL holds them: None left out, a text over MAX_URL_TEXT characters as
    `{param}_ref=`, a reference to this server's copy (left out if the copy cannot be kept)."""
    out = {}
    for k, v in params.items():
        if isinstance(v, str) and len(v) > MAX_URL_TEXT:
            if (ref := text_store.put(v)) is not None:
                out[k + REF] = ref
        elif v is not None:
            out[k] = str(v)
    return out


def write_query(**params: Any) -> None:
    """Mirror the current view into the URL so it can be shared (None removes a parameter).

    The one place that writes the URL: one message per call, none when nothing changed, and a
    replaced (not pushed) history entry, see `install_history_patch`. A text over MAX_URL_TEXT characters is
    written as `{param}_ref=`, a reference to a copy kept on this server (text_store): a reload would send the
    text itself in the request line. `seed_from_query` reads it back."""
    current = {k: st.query_params.get_all(k) for k in st.query_params}
    new = {k: v[-1] if len(v) == 1 else v for k, v in current.items()}
    for k, v in params.items():
        new.pop(k, None)
        new.pop(k + REF, None)
        new |= link_params({k: v})
    if new != {k: v[-1] if len(v) == 1 else v for k, v in current.items()}:
        st.query_params.from_dict(new)


def int_in(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and lo <= v <= hi


def clamp_state(key: str, lo: int, hi: int, what: str | None = None) -> None:
    """Keep a remembered widget value inside its current range (e.g. after switching to a
    smaller model), instead of letting the widget raise. `what` names the URL parameter: the replacement
    is said (`note_replaced`) only when this very run's URL carried that value (seed_from_query just took it from
    the link); a value the session itself chose, or a link's value on a later run (another model, another text),
    is clamped without a word about a link (issue 38 §5: switching model on /flow warned about "a link's pos=14"
    that the page itself had written)."""
    v = st.session_state.get(key)
    linked = st.session_state.pop(_LINKED + key, None)  # only the run that seeded it from the URL sees it
    if isinstance(v, int | float) and not lo <= v <= hi:
        st.session_state[key] = min(max(v, lo), hi)
        if what and linked is not None and linked == v:
            note_replaced(what, v, st.session_state[key], lo, hi)
