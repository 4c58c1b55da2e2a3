"""Issue 31 §2, the waits: the needle grid is warmed at the server's start and, cold, runs under a progress bar
with this server's measured pace; an estimate comes from what was measured at this moment (the last
RATE_WINDOW_S), or a small calibration now, never from an all-time average."""

from __future__ import annotations

import pytest
from conftest import tiny_hf_lm

from model.analysis import long as LG
from model.analysis import shared as AN


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from viz.ui import lm_models

    return lm_models.load(tiny_hf_lm(tmp_path_factory.mktemp("tiny-i31w"), "llama")).obj


def test_needle_grid_reports_progress_and_its_pace(lm):
    seen = []
    lengths = AN.needle_lengths(lm)
    assert lengths == (128,)  # the tiny model reads 256 positions: the page's 256/512 do not fit
    grid = LG.needle_grid(lm, lengths, AN.NEEDLE_DEPTHS, progress=lambda i, n: seen.append((i, n)))
    assert seen == [(1, 3), (2, 3), (3, 3)] and grid.prob.shape == (3, 1)
    AN._needle_pace.clear()
    assert AN.needle_estimate(lm, lengths) is None  # nothing measured: no estimate
    AN.needle_grid(lm, lengths, (0.0, 1.0), progress=None)
    est = AN.needle_estimate(lm, lengths, (0.0, 1.0))
    assert est is not None and est > 0


def test_warm_up_computes_the_needle_section(lm):
    from viz.ui import warmup

    lengths = AN.needle_lengths(lm)
    assert not AN.is_cached("needle_grid", lm, lengths, AN.NEEDLE_DEPTHS, AN.NEEDLE_KEY)
    warmup.warm_analyses(lm)
    assert AN.is_cached("needle_grid", lm, lengths, AN.NEEDLE_DEPTHS, AN.NEEDLE_KEY)
    assert AN.is_cached("needle_ablation", lm, lengths, AN.NEEDLE_DEPTHS, AN.NEEDLE_KEY, AN.NEEDLE_ABLATE_KEY,
                        AN.NEEDLE_ABLATE_K)


def test_an_old_rate_is_no_estimate(monkeypatch, lm):
    clock = [1000.0]
    monkeypatch.setattr(AN.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(AN, "_rates", [])
    AN.note_throughput(1000, 100.0)  # a busy warm-up: 10 tokens/s
    assert AN.tokens_per_second() == pytest.approx(10)
    clock[0] += AN.RATE_WINDOW_S + 1  # minutes later, a quiet machine
    assert AN.tokens_per_second() is None and AN.estimate_seconds(1000) is None
    AN.note_throughput(1000, 1.0)  # what the server does now
    assert AN.estimate_seconds(2000) == pytest.approx(2.0)  # not (2000 / (2000 / 101 s)) = 101 s


def test_a_stale_rate_is_measured_again_now(monkeypatch, lm):
    clock = [5000.0]
    monkeypatch.setattr(AN.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(AN, "_rates", [])
    assert AN.tokens_per_second() is None
    est = AN.estimate_seconds(1000, lm)  # a small calibration now
    assert est is not None and est > 0 and len(AN._rates) == 1
