"""Warm the server while the first browser is still loading Streamlit's frontend (issue 12: cold start), and
keep warming it afterwards without taking the cores from the people it serves (issue 43).

`streamlit run app.py` imports app.py to find the `st.App` it serves, and that import calls `start()`:
the work begins while the server starts. Without this, the first visitor's script run pays for everything:
importing torch (~1 s here), loading the default models, tracing their example sentences and plotly's
first figure (it imports its validators lazily). Here that work runs in a background thread, in
parallel with the ~1 s the browser needs to fetch and start the frontend, through the very caches the
pages use (`models.load_ckpt`, `models.get_trace`), so the first script run finds them filled; a
script run that gets there first simply waits for the same cache entry instead of computing it twice.

After the default page's model and trace, the rest (SmolLM2, /learn's run, the lessons' and /phenomena's analyses:
~1 min of CPU) is speculative, and a class that opens at once right after the start met it on the same two cores
(issue 43: six first views, median 57 s). So that part yields to people:
- it runs only while no script run is active (`script_run`, which app.py wraps around every session's run), and
  resumes GRACE_S after the last one ended; a script run that waits for a result the warm-up is computing does
  not count (it waits for us: pausing then would stall it);
- in small pieces: between pieces, and inside SmolLM2's forwards before each layer (forward pre-hooks while the
  analyses run), it stops when a script run starts;
- at a lower priority: Linux gives each thread its own nice value, so the warm-up thread (and the OpenMP workers it
  starts, which inherit it) runs at WARM_NICE while no script run is active: it gives way to the server's own
  threads (the event loop that serves files, websockets and the class polls) and, where the kernel does not group
  threads by session (autogroup), to other processes. As soon as a script run begins it is back at 0 until its
  next yield point, where it pauses: one process's threads share the GIL, and a low-priority thread that holds it
  but waits for a core stalls every session behind it (priority inversion; the likely cause of a page not drawn
  in 120 s in CI under load). Only where the process may raise a thread's priority again (probed once); else it
  keeps priority 0 and only pauses;
- in the measured order (ORDER): what the most entry points of the app open first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

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

GRACE_S = 1.0  # after the last script run ended, wait this long: a browser draws what the run sent, then often
               # clicks on (the next lesson, another page) within a second
WARM_NICE = 10  # the warm-up thread's nice value while nobody waits for it (0 is a session's): CFS gives it ~1/10 of a
               # busy core; not 19, which could starve it while it holds the GIL that a session then waits for
POLL_S = 0.2

# The order after the default page's model and trace (issue 43 §1), measured, not guessed: how many entry points
# of the app open a view that shows each piece on its defaults: the lessons (each lesson, and its link to the full
# page), the sidebar (each page opens on its default view: /phenomena on sinks), and the `?phen=…` links in the pages
# and the README (before its Performance section: the benchmarks' addresses are no entry point).
# `python bench/load.py --warm-order` counts them from the sources; tests/test_warmup_yield.py checks
# that ORDER is that count's order (more first; a tie, the cheaper first, a piece that needs another's result
# costing both). Counted when this was written: SmolLM2 (its load and /llm's trace: every language-model view) 18,
# sink_effect 4, induction 3, ioi 3, /learn's run 3, logit_lens 1, induction_ablation 1, needle_grid 1,
# needle_ablation 1. `calibrate` is no view: the pages' "about N s" estimates need it, and it costs one
# 16 x 16-token forward, so it comes right after SmolLM2's load.
ORDER = ("smollm2", "calibrate", "sink_effect", "induction", "ioi", "learn", "logit_lens", "induction_ablation",
         "needle_grid", "needle_ablation")
# what each piece costs, quiet, 2 cores (s of CPU; bench/lm_pages.py, the old warm-up's logs): the tie-breaker
COST_S = {"smollm2": 4.0, "calibrate": 0.1, "sink_effect": 0.5, "induction": 1.0, "ioi": 2.0, "learn": 3.0,
          "induction_ablation": 1.2, "needle_grid": 15.0, "needle_ablation": 6.0, "logit_lens": 0.5}


def _not_from_warm_up(record: logging.LogRecord) -> bool:
    return record.threadName != _THREAD


# The caches warn "missing ScriptRunContext" outside a script run: expected here, so not printed.
logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(_not_from_warm_up)


# ---------------------------------------------------------------- yielding to people

_cond = threading.Condition()
_active: set[int] = set()  # thread ids of the script runs now running (app.py: `with warmup.script_run()`)
_last_end = [float("-inf")]  # time.monotonic() when the last script run ended
_warming: dict = {"ident": None, "native": None, "nice": 0, "can_raise": None, "loading": None, "paused": False}
paused_s = [0.0]  # total seconds the warm-up waited for people (in the server's log at the end)


@contextlib.contextmanager
def script_run():
    """Around a session's script run (app.py's entry point: every page's run goes through it): while any is
    active, the warm-up pauses at its next yield point."""
    ident = threading.get_ident()
    with _cond:
        _active.add(ident)
        if not _warming["paused"]:
            _raise_priority()  # mid-piece: it reaches its next yield point at a session's priority, then pauses
    _note(f"run begins {ident}")
    try:
        yield
    finally:
        with _cond:
            _active.discard(ident)
            _last_end[0] = time.monotonic()
            _cond.notify_all()
        _note(f"run ends {ident}")


def someone_waits() -> bool:
    """Whether some thread waits for a shared result that the warm-up is computing (model/analysis/shared.py)."""
    from model.analysis import shared

    ident = _warming["ident"]
    return ident is not None and shared.waits_for(ident)


def busy() -> bool:
    """Whether the warm-up should pause: a script run is active that is not waiting for a shared result, or one
    ended less than GRACE_S ago; but never while anyone waits for the result the warm-up computes (pausing then
    would stall them, and with them every run queued behind them on a page's own cache lock)."""
    from model.analysis import shared

    with _cond:
        active = set(_active)
        recent = time.monotonic() - _last_end[0] < GRACE_S
    if not active and not recent:
        return False
    return not someone_waits() and (bool(active - shared.waiting_threads()) or not active)


TRACE_ENV = "ATTENTION_LAB_WARM_TRACE"  # a file: the warm-up appends when it paused, resumed and ran each piece


def _note(event: str) -> None:
    """One line in $ATTENTION_LAB_WARM_TRACE (bench/load.py --class-start reads it), if set."""
    path = os.environ.get(TRACE_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as f:
            f.write(f"{time.time():.3f} {event} active={len(_active)}\n")


def yield_to_people() -> None:
    """In the warm-up thread: wait until no script run needs the cores (`busy`), then go on at WARM_NICE if no script
    run is active, else (a run waits for what it computes) at 0. Anywhere else: nothing."""
    if threading.get_ident() != _warming["ident"]:
        return
    t0 = None
    while busy():
        if t0 is None:
            _note("pause")
        t0 = t0 or time.monotonic()
        with _cond:
            _warming["paused"] = True  # waiting here, it holds no GIL: its priority no longer matters
            _cond.wait(POLL_S)
    waited_for = someone_waits()  # (outside _cond: it takes the shared results' lock)
    with _cond:
        _warming["paused"] = False
        # low only while nobody runs a script: a run that begins from here raises it (script_run)
        _set_nice(WARM_NICE if not _active and not waited_for else 0)
    if t0 is not None:
        paused_s[0] += time.monotonic() - t0
        _note("resume")


def _set_nice(n: int) -> None:
    """This (the warm-up) thread's nice value: per thread on Linux (setpriority on its native id). Raising the
    priority again needs CAP_SYS_NICE or RLIMIT_NICE: probed once, and without it the thread stays at 0."""
    w = _warming
    if w["native"] is None or w["nice"] == n or not hasattr(os, "setpriority"):
        return
    if w["can_raise"] is None:  # the probe: down one step and back
        try:
            os.setpriority(os.PRIO_PROCESS, w["native"], 1)
            os.setpriority(os.PRIO_PROCESS, w["native"], 0)
            w["can_raise"] = True
        except OSError:
            w["can_raise"] = False
    if not w["can_raise"]:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, w["native"], n)
        w["nice"] = n
    except OSError:
        w["can_raise"] = False


def _raise_priority() -> None:
    """The warm-up thread back at priority 0, from any thread (a session's, or the warm-up's own)."""
    w = _warming
    if w["native"] is not None and w["nice"] != 0 and w["can_raise"]:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, w["native"], 0)
            w["nice"] = 0


def boost(name: str) -> None:
    """A script run is about to wait for model `name` (models.load_ckpt): if the warm-up is loading it now, at its
    lower priority, that load runs at the session's priority from here on (the wait is Streamlit's cache lock,
    which no yield point sees)."""
    if _warming["loading"] == name and threading.get_ident() != _warming["ident"]:
        _raise_priority()


@contextlib.contextmanager
def _yield_points(lm):
    """Inside SmolLM2's forwards, before each layer: a yield point for the warm-up thread (a pre-hook on each
    block, which returns at once in any other thread); removed afterwards."""
    import torch

    handles = []
    try:
        for name, mod in lm.model.named_modules():
            if name.endswith("layers") and isinstance(mod, torch.nn.ModuleList):
                handles += [block.register_forward_pre_hook(lambda *_: yield_to_people()) for block in mod]
        yield
    finally:
        for h in handles:
            h.remove()


# ---------------------------------------------------------------- the warm-up


def start() -> threading.Thread | None:
    """Start warming once per process (a daemon thread); None if already started."""
    if not _started.acquire(blocking=False):
        return None
    thread = threading.Thread(target=warm, name=_THREAD, daemon=True)
    thread.start()
    return thread


def warm() -> None:
    """Load what the first page of each language opens on, then the rest in ORDER, yielding to people. Never
    raises: a failure here only means the first visitor waits (and sees the real error message on the page,
    where it belongs)."""
    # its priority is lowered in the warm-up thread only (a test that calls warm() keeps its own)
    own = threading.current_thread().name == _THREAD
    from viz.ui import models

    if boost not in models.BEFORE_SHARED_LOAD:
        models.BEFORE_SHARED_LOAD.append(boost)
    _warming.update(ident=threading.get_ident(), native=threading.get_native_id() if own else None, nice=0)
    try:
        warm_default()
        lm = None
        _note("default page warm")
        for piece in ORDER:
            _note(f"start {piece}")
            if piece == "learn":
                yield_to_people()
                warm_learn()
            elif piece == "smollm2":
                lm = _warm_smollm2()
            elif lm is not None and os.environ.get(WARM_ANALYSES_ENV, "1") != "0":
                warm_analyses(lm, (piece,))
        if lm is not None and os.environ.get(WARM_ANALYSES_ENV, "1") != "0":
            from viz.ui.heap import freeze_heap_once

            freeze_heap_once("warm:analyses")  # their results and the modules they imported live as long as the server
    finally:
        _set_nice(0)
        _warming.update(ident=None, native=None, loading=None)
        _LOG.info("warm-up done; it paused %.1f s for sessions' script runs", paused_s[0])
        _note("done")


def warm_default() -> None:
    """The default page of each language: its model, its example's trace, its first figures. First, at full
    priority and without pauses: every first visitor needs it. Never raises."""
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


def warm_learn() -> None:
    """/learn's recorded run, every checkpoint measured (~3 s of CPU on 2 cores, once per server), and the map the
    page opens on, through the caches /learn and lesson 17 read (viz/ui/learn_run.py). A fresh server's first
    /learn then opens warm. Never raises."""
    try:
        from viz.ui import learn_run

        runs, _, sm = learn_run.shipped()
        run = runs["attn2"]
        i = run.steps.index(sm.step) if sm.step in run.steps else len(run.steps) - 1
        learn_run.attention_at("attn2", i, sm.layer, sm.head)
    except Exception:
        _LOG.warning("/learn warm-up failed; its page measures the run itself", exc_info=True)


def _warm_smollm2():
    """SmolLM2: its load (~4 s of CPU) and the trace of the prompt it opens on, through the pages' caches, so the
    first /llm or ?checkpoint=smollm2 visitor does not pay them. Its language model, or None (skipped when its
    package is missing or ATTENTION_LAB_WARM_LM=0; failed). Never raises."""
    if os.environ.get(WARM_LM_ENV, "1") == "0":
        return None
    from viz.ui.heap import freeze_heap_once

    try:
        from viz.ui import lm_models, models

        if "smollm2" not in lm_models.names():
            return None
        yield_to_people()
        _warming["loading"] = "smollm2"  # a script run that waits for it raises our priority (boost)
        try:
            rm = models.load_ckpt("smollm2")
        finally:
            _warming["loading"] = None
        yield_to_people()
        with _yield_points(rm.obj):
            models.get_trace("smollm2", rm.example)
        return rm.obj
    except Exception:
        _LOG.warning("SmolLM2 warm-up failed; its first page will load it itself", exc_info=True)
        return None
    finally:
        # SmolLM2's load froze the heap (models._load_shared); its first trace imports a few more modules
        freeze_heap_once("warm:lm")


def warm_lm() -> None:
    """SmolLM2 (`_warm_smollm2`), then its analyses (`warm_analyses`) unless ATTENTION_LAB_WARM_ANALYSES=0.
    Never raises."""
    lm = _warm_smollm2()
    if lm is not None and os.environ.get(WARM_ANALYSES_ENV, "1") != "0":
        warm_analyses(lm)


def _analyses(lm) -> dict:
    """piece -> (function, args): the SmolLM2 results the lessons and /phenomena's sections show on their defaults."""
    from model.analysis import shared
    from viz import lessons as LS

    return {"calibrate": (shared.calibrate, ()),  # this server's batched throughput: the pages' "about N s"
            "sink_effect": (shared.sink_effect, (LS.IOI_TEXT,)),  # lesson 12, /phenomena sinks (the example prompt)
            "logit_lens": (shared.logit_lens, (LS.LENS_TEXT,)),  # lesson 15
            "induction": (shared.induction, (50, 0)),  # lessons 13 and 19, /phenomena patterns and induction
            "induction_ablation": (shared.induction_ablation, (50, 0, 5, "zero")),  # /phenomena induction
            "ioi": (shared.ioi, ()),  # lesson 14, /phenomena IOI
            "needle_grid": (shared.needle_grid, ()),  # /phenomena needle: 6 prompts of 256/512 tokens
            "needle_ablation": (shared.needle_ablation, ())}  # and its "knock them out" at the default 5 heads


def warm_analyses(lm, pieces: tuple | None = None) -> None:
    """The SmolLM2 results that lessons 12–15 and 19 and /phenomena's sections show on their defaults (`pieces`,
    default all, in ORDER), into the per-server shared cache (model/analysis/shared.py) the pages read: the first
    student finds them computed, the 30th too. Each one alone (a failure skips only that one), each after a yield
    to people, with a yield point before each of SmolLM2's layers. Never raises."""
    table = _analyses(lm)
    with _yield_points(lm):
        for piece in (p for p in ORDER if p in table and (pieces is None or p in pieces)):
            fn, args = table[piece]
            yield_to_people()
            try:
                fn(lm, *args)
            except Exception:
                _LOG.warning("warming %s failed; its page computes it itself", fn.__name__, exc_info=True)
    if pieces is None:
        from viz.ui.heap import freeze_heap_once

        freeze_heap_once("warm:analyses")  # their results (and the modules they imported) live as long as the server
