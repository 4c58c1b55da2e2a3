"""Garbage in every query parameter of every page, in both languages: a shared or hand-edited link may
get a message, never a traceback.

Which parameters a page reads is found two ways, so a new one is covered without editing this file:
every literal name passed to `seed_from_query` / `st.query_params.get` / `url_text` in viz/ (static), and
every name the page actually reads in a run (a recorder around `st.query_params`, `seed_from_query`). A
page ignores the ones it does not read, so each run sets them all. Some parameters are read only in one
branch (the beam width under beam search, a lesson's own sentence): CONTEXTS opens those branches with a
valid selector and garbage in everything else. Sidebar parameters (checkpoint, text, target) get their
own runs: a bad text stops the page before it reads its own parameters.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import pytest
from conftest import APP
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "viz" / "pages").glob("*.py") if p.stem != "__init__")
GARBAGE = {"empty": "", "nan": "nan", "negative": "-5", "huge": "999999", "word": "abc", "emoji": "💥",
           "5000-chars": "x" * 5000, "path": "../../etc/passwd"}
# (value, language) runs: every value in English; in Chinese the values whose messages differ (a word, an emoji, a
# path, an over-long value). The code that reads a parameter is the same in both languages, only the sentence
# differs (test_i18n checks every catalog entry's placeholders): all 8 in zh too cost ~5 min of CI for no new path.
ZH_VALUES = ("word", "emoji", "path", "5000-chars")
RUNS = [(v, "en") for v in GARBAGE] + [(v, "zh") for v in ZH_VALUES]
RUN_IDS = [f"{v}-{lang}" for v, lang in RUNS]
SIDEBAR = ("checkpoint", "text", "target")
NOT_GARBAGE = {"lang"}  # the run's language: tested on its own below
# Branches that read more parameters: page -> valid selectors (one run each, the rest garbage).
CONTEXTS = {
    "viz/pages/decoder.py": [{"dec_strategy": "beam"}, {"dec_strategy": "sample"}],
    "viz/pages/lessons.py": [{"lesson": "2"}, {"lesson": "3"}, {"lesson": "4"}, {"lesson": "5"}, {"lesson": "8"}],
    "viz/pages/padding.py": [{"pad_model": "dates"}],
    "viz/pages/attention.py": [{"attn_kind": "dec", "view": "pipeline"}],
    "viz/pages/layer.py": [{"stack": "decoder", "sub": "cross_attn"}],
}
# seed_from_query(key, "param", ...) (also as q(...)), url_text(key, "param", ...), st.query_params.get("param")
READS = (re.compile(r"""(?:seed_from_query|url_text|\bq)\(\s*[^,()]+,\s*["']([a-z_0-9]+)["']"""),
         re.compile(r"""query_params\.get\(\s*["']([a-z_0-9]+)["']"""))



def open_link(page: str, query: dict, timeout: float = 300):
    """The app as a pasted link opens it: the URL's page and query, one run (no default page first)."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    at.query_params.update({k: str(v) for k, v in query.items()})
    at.switch_page(page)
    return at.run()

def static_params() -> set[str]:
    """Every literal parameter name read anywhere in viz/ (first or second argument of the readers)."""
    names = set()
    for path in (ROOT / "viz").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        names |= {name for pattern in READS for name in pattern.findall(text)}
    return names


@functools.cache
def read_params() -> frozenset[str]:
    """Static names plus the names each page reads in a plain run (dynamic names such as attn_kind)."""
    from streamlit.runtime.state.query_params_proxy import QueryParamsProxy

    from viz.ui import attention_views, sidebar, state  # noqa: F401  (imported now: their own names get patched)

    seen: set[str] = set()
    get, seed = QueryParamsProxy.get, state.seed_from_query

    def recording_get(self, key, *a, **kw):
        seen.add(key)
        return get(self, key, *a, **kw)

    def recording_seed(key, param, *a, **kw):
        seen.add(param)
        return seed(key, param, *a, **kw)

    # Every module that imported it by name (pages re-import it each run, from viz.ui.state).
    holders = [m for name, m in list(sys.modules.items())
               if name.startswith("viz.") and getattr(m, "seed_from_query", None) is seed]
    QueryParamsProxy.get = recording_get
    for m in holders:
        m.seed_from_query = recording_seed
    try:
        for page in PAGES:
            open_link(page, query={"lang": "en"})
    finally:
        QueryParamsProxy.get = get
        for m in holders:
            m.seed_from_query = seed
    return frozenset((static_params() | seen) - {""})


def assert_no_traceback(at, what: str) -> None:
    assert not at.exception, f"{what}: {[e.value for e in at.exception]}"


def test_the_parameter_list_covers_the_pages():
    names = read_params()
    for expected in ("lesson", "lesson_text", "layer", "head", "dec_beam", "exp", "pre_text", "positions", "side",
                     "attn_kind", "view", "vocab", "warmup"):
        assert expected in names, expected


@pytest.mark.slow
@pytest.mark.parametrize(("value", "lang"), RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("page", PAGES)
def test_garbage_in_page_parameters(page, value, lang):
    params = sorted(read_params() - set(SIDEBAR) - NOT_GARBAGE)
    for context in [{}, *CONTEXTS.get(page, [])]:
        query = {p: GARBAGE[value] for p in params if p not in context} | context | {"lang": lang}
        at = open_link(page, query=query)
        assert_no_traceback(at, f"{page} {context} with every parameter = {value!r}")


@pytest.mark.slow
@pytest.mark.parametrize(("value", "lang"), RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("page", PAGES)
def test_garbage_in_sidebar_parameters(page, value, lang):
    at = open_link(page, query={p: GARBAGE[value] for p in SIDEBAR} | {"lang": lang})
    assert_no_traceback(at, f"{page} with checkpoint/text/target = {value!r}")
    if value in ("empty", "5000-chars") or not at.error:
        return
    # A message, in the UI language.
    if lang == "zh":
        assert any(re.search(r"[\u4e00-\u9fff]", e.value) for e in at.error), [e.value for e in at.error]


@pytest.mark.parametrize("value", list(GARBAGE), ids=list(GARBAGE))
def test_garbage_language_falls_back(value):
    at = open_link("viz/pages/lessons.py", query={"lang": GARBAGE[value]})
    assert_no_traceback(at, f"lang = {value!r}")
    assert at.query_params["lang"] in ("en", "zh")


@pytest.mark.slow
@pytest.mark.parametrize("value", ["path", "5000-chars", "emoji"])
@pytest.mark.parametrize("page", PAGES)
def test_garbage_in_long_text_references(page, value):
    """A long text travels as `{param}_ref=` (viz/ui/text_store.py), read for any parameter the link lacks: a
    forged or foreign reference in every one of them gets a sentence, never a traceback or a file read."""
    params = sorted(read_params() - NOT_GARBAGE)
    at = open_link(page, query={f"{p}_ref": GARBAGE[value] for p in params} | {"lang": "en"})
    assert_no_traceback(at, f"{page} with every *_ref = {value!r}")
