"""Issue 43 §1: the server's warm-up yields to people (viz/ui/warmup.py). It pauses while a session's script run is
active, also inside a language model's forward (before each layer), but not while that run waits for the very
result the warm-up computes; and it warms in the measured order (bench/load.py --warm-order)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from model.analysis import shared
from viz.ui import warmup

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import load  # noqa: E402  (bench/load.py: the measured order)


@pytest.fixture(autouse=True)
def no_grace(monkeypatch):
    monkeypatch.setattr(warmup, "GRACE_S", 0.0)  # resume as soon as the run ended (the server waits 1 s)
    monkeypatch.setattr(warmup, "POLL_S", 0.02)


def as_warm_up(fn, done: threading.Event) -> threading.Thread:
    """fn() in a thread that the gate treats as the warm-up's (its priority left alone: no native id)."""
    def run():
        warmup._warming.update(ident=threading.get_ident(), native=None)
        try:
            fn()
            done.set()
        finally:
            warmup._warming.update(ident=None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


class Stack(torch.nn.Module):
    """A language model's shape where the yield points go: blocks in a ModuleList named "layers"."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        for block in self.layers:
            x = block(x)
        return x


def test_the_warm_up_pauses_inside_a_forward_while_a_script_run_is_active():
    lm = SimpleNamespace(model=torch.nn.Module())
    lm.model.decoder = Stack()
    reached = []
    lm.model.decoder.layers[0].register_forward_hook(lambda *_: reached.append(0))
    done = threading.Event()

    def forward():
        with warmup._yield_points(lm), torch.no_grad():
            lm.model.decoder(torch.ones(1, 4))

    with warmup.script_run():  # a session's run is active: the forward stops before its first layer
        thread = as_warm_up(forward, done)
        assert not done.wait(0.5)
        assert reached == [] and thread.is_alive()
    assert done.wait(30) and reached == [0]  # the run ended: the forward went on
    thread.join()
    assert not any(block._forward_pre_hooks for block in lm.model.decoder.layers)  # gone with the piece
    reached.clear()
    lm.model.decoder(torch.ones(1, 4))  # the same forward in a session's thread: no pause, no yield point
    assert reached == [0]


def test_a_run_waiting_for_the_warm_ups_result_does_not_pause_it():
    """A session that waits for the result the warm-up is computing (single flight) must not make it pause, nor
    may another run queued behind that session (on a page's own cache lock, which no one can see): that would stall
    them all."""
    cache = shared.SharedResults()
    started, done, release = threading.Event(), threading.Event(), threading.Event()

    def compute():
        started.set()
        while not shared.waiting_threads():  # the session has begun to wait for us
            threading.Event().wait(0.01)
        warmup.yield_to_people()  # a yield point of a piece: the active runs wait for us, so on we go
        return 42

    def queued():  # an active run that is not waiting for a shared result
        with warmup.script_run():
            release.wait(30)

    queue = threading.Thread(target=queued, daemon=True)
    queue.start()
    as_warm_up(lambda: cache.get("k", compute), done)
    assert started.wait(10)
    with warmup.script_run():
        assert cache.get("k", lambda: pytest.fail("computed twice")) == 42
    assert done.wait(10)
    release.set()
    queue.join()
    assert shared.waiting_threads() == set() and not warmup.busy()


def test_the_warm_up_order_is_the_measured_order():
    """ORDER (after `calibrate`, which is no view) is the entry points' count's order, counted from the lessons, the
    sidebar and the links in the pages and the README."""
    measured = load.measured_order(warmup.COST_S)
    assert [p for p in warmup.ORDER if p != "calibrate"] == measured
    assert measured[0] == "smollm2" and measured.index("needle_grid") < measured.index("needle_ablation")
    assert set(warmup.ORDER) - {"smollm2", "learn"} == set(warmup._analyses(None))  # every analysis is in ORDER


def test_a_run_that_begins_mid_piece_lifts_the_warm_ups_priority_until_it_pauses():
    """The warm-up computes at WARM_NICE only while no script run is active. A run that begins while it is inside
    a piece (between yield points) puts it back at 0: it shares the GIL with that run, and at low priority on a busy
    machine it held the GIL while waiting for a core (a page not drawn in 120 s in CI). At its next yield point it
    pauses; once the run has ended it goes on at WARM_NICE again."""
    mid_piece, run_began, seen = threading.Event(), threading.Event(), {}

    def piece():
        native = threading.get_native_id()
        warmup._warming.update(ident=threading.get_ident(), native=native, nice=0, paused=False)
        try:
            warmup.yield_to_people()  # nobody runs a script: on at WARM_NICE (where the process may raise it again)
            seen["alone"] = os.getpriority(os.PRIO_PROCESS, native)
            mid_piece.set()
            assert run_began.wait(30)  # ... computing, between two yield points, when a session's run begins
            seen["run"] = os.getpriority(os.PRIO_PROCESS, native)
            warmup.yield_to_people()  # the next yield point: it waits here until the run has ended
            seen["after"] = os.getpriority(os.PRIO_PROCESS, native)
        finally:
            warmup._set_nice(0)
            warmup._warming.update(ident=None, native=None, paused=False)

    thread = threading.Thread(target=piece, daemon=True)
    thread.start()
    assert mid_piece.wait(30)
    with warmup.script_run():
        run_began.set()
        for _ in range(500):  # it reaches its yield point and pauses there
            if warmup._warming["paused"]:
                break
            threading.Event().wait(0.01)
        assert warmup._warming["paused"] and thread.is_alive()
    thread.join(30)
    low = warmup.WARM_NICE if warmup._warming["can_raise"] else 0  # no CAP_SYS_NICE/RLIMIT_NICE: never lowered
    assert seen == {"alone": low, "run": 0, "after": low}
