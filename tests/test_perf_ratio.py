"""A warm language model must not make every toy click dearer (issue 26 §3).

The cause found: the warm-up froze the heap (gc.freeze, viz/ui/heap.py) *before* it loaded SmolLM2, whose
load imports transformers' and torch's rarer modules (~125,000 objects). They stayed tracked, so every full
collection walked them: a toy head switch cost 92 ms of server CPU with SmolLM2 warm, 26 ms without
(bench/load.py --warm-lm-ratio, before the fix).

What is measured here is deterministic, not a time: the objects a full collection would walk during a toy
click (an Attention-page head switch under AppTest, the collector paused so that nothing is freed
mid-count), in a server process that warmed SmolLM2 and in one that did not (ATTENTION_LAB_WARM_LM=0). Each
runs in its own interpreter: the collector's state is per process. A third case loads SmolLM2 later, as a
page does on a server that did not warm it: in the second process, after its first count (a new session clicks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_RATIO = 1.5  # before the fix: ~5x (125,000 objects over a click's ~25,000)

PROBE = r"""
import gc, json, sys
sys.path.insert(0, {root!r})
from streamlit.testing.v1 import AppTest
from viz.ui import warmup, models
from viz.ui.heap import tracked_objects

def click():
    at = AppTest.from_file({app!r}, default_timeout=300)
    at.run()  # the first page (the Attention page on the default toy model)
    at.selectbox(key="attn_head").set_value(1)
    at.run()  # a first switch: this session's caches warm
    gc.collect()
    gc.disable()  # count what a full collection would walk at the end of a click: nothing freed mid-way
    at.selectbox(key="attn_head").set_value(2)
    at.run()
    walked = tracked_objects()
    gc.enable()
    assert not at.exception, at.exception
    return {{"walked": walked, "frozen": gc.get_freeze_count()}}

warmup.warm()
seen = [click()]
if {late_lm}:  # then a page loads SmolLM2 on this server, which did not warm it; a new session clicks
    models.get_trace("smollm2", models.load_ckpt("smollm2").example)
    seen.append(click())
print(json.dumps(seen))
"""


def probe(warm_lm: bool, late_lm: bool = False) -> list[dict]:
    """The walk and freeze counts of a click, in one new server process; with `late_lm`, a second click's after
    a page loaded SmolLM2 in that process (the first click is then the no-language-model case: one interpreter
    fewer than a process for each, the same sessions' caches in both counts)."""
    env = {**os.environ, "ATTENTION_LAB_WARM_LM": "1" if warm_lm else "0"}
    code = PROBE.format(root=str(ROOT), app=str(ROOT / "app.py"), late_lm=late_lm)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two servers' worth of SmolLM2 warm-ups (~1 min): the full suite, not the fast subset
def test_a_warm_language_model_adds_nothing_to_the_collectors_walk():
    no_lm, late = probe(warm_lm=False, late_lm=True)
    (warm,) = probe(warm_lm=True)
    # SmolLM2's objects are frozen in both servers that hold it: far more frozen, no more walked
    assert warm["frozen"] > no_lm["frozen"] + 50_000 and late["frozen"] > no_lm["frozen"] + 50_000
    assert warm["walked"] / no_lm["walked"] <= MAX_RATIO, (warm, no_lm)
    assert late["walked"] / no_lm["walked"] <= MAX_RATIO, (late, no_lm)


# ---------------------------------------------------------------- one run per server (model/analysis/shared.py)


def tiny_lm():
    import torch

    from model.families.lm import DecoderLM, LMConfig

    torch.manual_seed(0)
    return DecoderLM(LMConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_len=128,
                              positional="rotary", norm="rmsnorm", ffn="gated", activation="silu",
                              tie_embeddings=True, bos_id=1)).eval()


def test_thirty_sessions_asking_at_once_run_the_analysis_once():
    import threading

    from model.analysis.shared import SharedResults

    cache, calls, release = SharedResults(max_entries=2), [], threading.Event()

    def compute():
        calls.append(1)
        release.wait(timeout=30)  # every other session arrives while this one computes
        return object()

    got = []
    sessions = [threading.Thread(target=lambda: got.append(cache.get(("lesson", 13), compute))) for _ in range(30)]
    for s in sessions:
        s.start()
    release.set()
    for s in sessions:
        s.join(timeout=30)
    assert len(calls) == 1 and len(got) == 30 and all(g is got[0] for g in got)
    cache.get("a", object)
    cache.get("b", object)  # bounded: the least recently used entry goes
    assert not cache.has(("lesson", 13)) and cache.has("a") and cache.has("b")


def test_a_failed_analysis_is_not_stored_and_the_next_caller_tries_again():
    import pytest

    from model.analysis.shared import SharedResults

    cache = SharedResults()

    def broken():
        raise ValueError("no names in this vocabulary")

    with pytest.raises(ValueError):
        cache.get("k", broken)
    assert cache.get("k", lambda: 42) == 42


def test_lesson_13_and_the_phenomena_page_share_one_induction_run():
    from model.analysis import shared
    from viz import lessons as LS

    lm = tiny_lm()
    before = shared.RESULTS.computed
    lesson = LS.lm_compute("induction", lm, "")
    page = shared.induction(lm, 50, 0)  # /phenomena's default (n=50, seed 0): the same object, not a second run
    assert page is lesson and shared.RESULTS.computed == before + 1
    ablation = shared.induction_ablation(lm, 50, 0, 2, "zero")
    assert ablation is shared.induction_ablation(lm, 50, 0, 2, "zero") and ablation.heads == [
        (layer, h) for layer, h, _ in page.scores["induction"].top(2)]


def test_the_shared_language_model_traces_are_bounded_in_bytes(monkeypatch):
    """Issue 24 §6's soak: six full SmolLM2 traces of 276-token prompts kept ~3 GB after the class. The cache
    keeps at most LM_TRACE_BYTES (the newest always), and one computation per input."""
    import torch

    from model.core.trace import Trace
    from viz.ui import models

    calls = []

    class Fake:
        def trace(self, text, chat=False):
            calls.append(text)
            return torch.zeros(1, 1, 4), Trace({"x": torch.zeros(256 * 1024)}, {})  # 1 MiB of float32

    monkeypatch.setattr(models, "_load_shared", lambda name: Fake())
    cache = models.BoundedTraces(max_entries=6, max_bytes=3 * 2**20 + 100)
    first = cache("m", "a", False)
    assert cache("m", "a", False) is first and calls == ["a"]
    for text in "bcde":
        cache("m", text, False)
    assert cache.nbytes() <= 3 * 2**20 + 100 and len(cache._done) == 3  # a and b went, the newest three stay
    cache("m", "a", False)
    assert calls == ["a", "b", "c", "d", "e", "a"]


def test_the_lm_trace_cache_lets_go_of_traces_unused_for_its_idle_time(monkeypatch):
    """The class has gone: its traces go after idle_s unused, the newest too (none held in the single flight)."""
    import gc
    import weakref

    import torch

    from model.core.trace import Trace
    from viz.ui import models

    now = [0.0]
    made = []

    def make(name, text, chat):
        made.append(Trace({"x": torch.zeros(1024)}, {}))
        return torch.zeros(1, 1, 4), made[-1]

    cache = models.BoundedTraces(max_entries=6, max_bytes=2**30, make=make, idle_s=60, clock=lambda: now[0])
    cache("m", "a", False)
    now[0] = 50
    cache("m", "b", False)
    now[0] = 100
    assert cache.sweep() == 1 and set(cache._done) == {("m", "b", False)}  # a: 100 s unused; b: 50 s
    cache("m", "b", False)  # used again: its clock restarts
    now[0] = 150
    assert cache.sweep() == 0
    now[0] = 161
    trimmed = []
    monkeypatch.setattr("viz.ui.heap.return_freed_memory", lambda: trimmed.append(1))
    assert models.sweep_all() >= 1 and cache.nbytes() == 0 and trimmed == [1]  # memory handed back once
    assert models.sweep_all() == 0 and trimmed == [1]
    gone = [weakref.ref(t) for t in made]
    made.clear()
    gc.collect()
    assert all(r() is None for r in gone)  # nothing else (the single flight) holds them
    cache("m", "a", False)
    assert len(made) == 1  # asked again: computed again
    assert models.trace_idle_s() == 1200.0
    monkeypatch.setenv("ATTENTION_LAB_TRACE_IDLE_S", "30")
    assert models.trace_idle_s() == 30.0
    monkeypatch.setenv("ATTENTION_LAB_TRACE_IDLE_S", "soon")
    assert models.trace_idle_s() == 1200.0
