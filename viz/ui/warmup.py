"""Warm the server while the first browser is still loading Streamlit's frontend (issue 12: cold start).

`streamlit run app.py` imports app.py to find the `st.App` it serves, and that import calls `start()`:
the work begins while the server starts. Without this, the first visitor's script run pays for everything:
importing torch (~1 s here), loading the default models, tracing their example sentences and plotly's
first figure (it imports its validators lazily). Here that work runs in a background thread, in
parallel with the ~1 s the browser needs to fetch and start the frontend, through the very caches the
pages use (`models.load_ckpt`, `models.get_trace`), so the first script run finds them filled; a
script run that gets there first simply waits for the same cache entry instead of computing it twice.
"""

from __future__ import annotations

import logging
import os
import threading

# Idle OpenMP threads sleep instead of spinning. Every session's script thread that calls torch gets its own
# OpenMP team, and a spinning team burns the cores the others need: on this 2-core machine under load, one
# SmolLM2 forward took 2.7 s of CPU and 19 s wall with the default (active) policy, 0.26 s and 0.6-1.2 s
# passive (issue 26 §3). libgomp reads this once, when torch loads it: app.py imports this module before
# anything imports torch. An operator's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
_LOG = logging.getLogger(__name__)
_THREAD = "attention-lab-warm-up"
WARM_LM_ENV = "ATTENTION_LAB_WARM_LM"  # "0": do not load SmolLM2 at start (a server that never shows it)
# "0": load SmolLM2 but leave the lessons' and /phenomena's analyses to the first visitor who opens them (a test
# server that never shows them: ~1 min of CPU each server, spent beside the test on a 2-core machine)
WARM_ANALYSES_ENV = "ATTENTION_LAB_WARM_ANALYSES"
_started = threading.Lock()


def _not_from_warm_up(record: logging.LogRecord) -> bool:
    return record.threadName != _THREAD


# The caches warn "missing ScriptRunContext" outside a script run: expected here, so not printed.
logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(_not_from_warm_up)


def start() -> threading.Thread | None:
    """Start warming once per process (a daemon thread); None if already started."""
    if not _started.acquire(blocking=False):
        return None
    thread = threading.Thread(target=warm, name=_THREAD, daemon=True)
    thread.start()
    return thread


def warm() -> None:
    """Load what the first page of each language opens on. Never raises: a failure here only means the
    first visitor waits (and sees the real error message on the page, where it belongs)."""
    try:
        # First, before any session can draw: plotly checks every array against pandas *if imported*
        # (sys.modules, no import lock), so a session importing pandas (st.dataframe) while another draws
        # a heatmap made the latter fail with "partially initialized module 'pandas'" (bench/load.py --hall).
        import pandas  # noqa: F401

        from viz.figures import attention as F
        from viz.ui import models
        from viz.ui.attention_views import attention_modules
        from viz.ui.heap import freeze_heap_once
        from viz.ui.sidebar import default_checkpoint

        names = models.checkpoint_names()
        for lang in ("en", "zh"):  # each language opens on its own model and example
            name = default_checkpoint(names, lang)
            trace = models.get_trace(name, models.load_ckpt(name).example)
            mods = attention_modules(trace)
            first = (mods.get("cross") or next(iter(mods.values())))[0]
            F.attention_heatmap(trace, first, 0, meta=trace.meta, all_heads=True).to_json()
            F.heads_grid(trace, first, meta=trace.meta).to_json()
        freeze_heap_once()  # what is alive now lives as long as the server: out of the GC's walks
    except Exception:  # warming is an optimisation: the page reports real errors
        _LOG.warning("warm-up failed; the first page will load everything itself", exc_info=True)
    warm_learn()
    warm_lm()


def warm_learn() -> None:
    """After the first page's work (the toy models above), before SmolLM2's: /learn's recorded run, every
    checkpoint measured (~3 s of CPU on 2 cores, once per server), and the map the page opens on, through the
    caches /learn and lesson 17 read (viz/ui/learn_run.py). A fresh server's first /learn then opens warm.
    Never raises."""
    try:
        from viz.ui import learn_run

        runs, _, sm = learn_run.shipped()
        run = runs["attn2"]
        i = run.steps.index(sm.step) if sm.step in run.steps else len(run.steps) - 1
        learn_run.attention_at("attn2", i, sm.layer, sm.head)
    except Exception:
        _LOG.warning("/learn warm-up failed; its page measures the run itself", exc_info=True)


def warm_lm() -> None:
    """After the toy models (the first page's), SmolLM2: its load (~4 s of CPU) and the trace of the prompt
    it opens on, through the pages' caches, so the first /llm or ?checkpoint=smollm2 visitor does not pay
    them. Skipped when its package is missing or ATTENTION_LAB_WARM_LM=0. Never raises."""
    if os.environ.get(WARM_LM_ENV, "1") == "0":
        return
    from viz.ui.heap import freeze_heap_once

    try:
        from viz.ui import lm_models, models

        if "smollm2" not in lm_models.names():
            return
        rm = models.load_ckpt("smollm2")
        models.get_trace("smollm2", rm.example)
    except Exception:
        _LOG.warning("SmolLM2 warm-up failed; its first page will load it itself", exc_info=True)
        return
    finally:
        # SmolLM2's load froze the heap (models._load_shared); its first trace imports a few more modules
        freeze_heap_once("warm:lm")
    if os.environ.get(WARM_ANALYSES_ENV, "1") != "0":
        warm_analyses(rm.obj)


def warm_analyses(lm) -> None:
    """The SmolLM2 results that lessons 11–16 and /phenomena's sections show on their defaults, into the
    per-server shared cache (model/analysis/shared.py) the pages read: the first student finds them
    computed, the 30th too. Cheapest first; each one alone (a failure skips only that one). Never raises."""
    from model.analysis import shared
    from viz import lessons as LS
    from viz.ui.heap import freeze_heap_once

    for fn, args in ((shared.calibrate, ()),  # this server's batched throughput: the pages' "about N s"
                     (shared.sink_effect, (LS.IOI_TEXT,)),  # lesson 12, /phenomena sinks (the example prompt)
                     (shared.logit_lens, (LS.LENS_TEXT,)),  # lesson 15
                     (shared.induction, (50, 0)),  # lesson 13, /phenomena patterns and induction
                     (shared.induction_ablation, (50, 0, 5, "zero")),  # /phenomena induction: knock them out
                     (shared.ioi, ()),  # lesson 14, /phenomena IOI
                     (shared.needle_grid, ()),  # /phenomena needle: 6 prompts of 256/512 tokens (35 s cold, quiet)
                     (shared.needle_ablation, ())):  # and its "knock them out" at the default 5 heads
        try:
            fn(lm, *args)
        except Exception:
            _LOG.warning("warming %s failed; its page computes it itself", fn.__name__, exc_info=True)
    freeze_heap_once("warm:analyses")  # their results (and the modules they imported) live as long as the server
