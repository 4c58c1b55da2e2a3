"""Figures that do not depend on the head, built once per trace: a head switch costs nothing for them.

Apart from the views (viz/ui/attention_views.py) so that any panel can cache through it without importing the views
(the "Why here?" panel is drawn by them and caches its explanations here: no import circle)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import nullcontext

import streamlit as st

from viz.i18n import current_lang
from viz.ui.models import per_trace

FIGURE_CACHE = 8  # head-independent figures kept per session (each a few hundred kB at most)
SHARED_FIGURES = 32  # ... and shared by all sessions (figures of shared traces; pooled, so small)
_SHARED: OrderedDict = OrderedDict()  # head-independent figures of shared traces, all sessions
_SHARED_LOCK = threading.Lock()


def cached_figure(trace, build, *args, shared: bool = False, **kw):
    """`build(trace, *args, **kw)`, cached (bounded LRU) for figures that do not depend on the head, so a
    head switch costs nothing for them. `kw` is not part of the key: it must follow from the trace itself
    (e.g. its meta with the model's own predictions).

    shared=False: in this session (the figure may be changed in place, e.g. the model view's outline).
    shared=True: for every session (never changed after building): a class opening the same link builds
    it once. An entry refers to its trace weakly (it never keeps a trace alive) and is used only for that
    very trace object, so a new trace never meets an old trace's figure."""
    key = (id(trace), build.__name__, args, current_lang())
    if shared:
        cache, lock, size = _SHARED, _SHARED_LOCK, SHARED_FIGURES
    else:
        cache, lock, size = st.session_state.setdefault("_al_figures", OrderedDict()), nullcontext(), FIGURE_CACHE
    return per_trace(cache, lock, size, key, trace, lambda: build(trace, *args, **kw))
