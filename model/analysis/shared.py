"""Analyses of shipped models on shipped prompts, computed once per process and shared read-only (issue 26 §3).

When 30 students open the same lesson, the same analysis must run once. A lesson and a /phenomena section
often show the same experiment (lesson 13's induction run is /phenomena's default; lesson 14's IOI run
too), so both ask this cache, keyed by what was run: (analysis, model, arguments). A second caller of a
result being computed waits for it instead of computing it again (single flight); results are never
written after they are stored (dataclasses of numpy arrays, read by the figures).

The cache is bounded (least recently used out first), per process, and holds a reference to each model it
keys on, so that a model's id cannot be reused by another object while its results are stored.

model/ never imports streamlit: the pages may wrap these in their own caches; the warm-up
(viz/ui/warmup.py) fills them at server start.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

MAX_ENTRIES = 48


class SharedResults:
    """A bounded, thread-safe, single-flight cache: get(key, compute) runs compute() once per key."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        self.max_entries = max_entries
        self._done: OrderedDict[Hashable, tuple[Any, float]] = OrderedDict()  # key -> (result, seconds)
        self._running: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()
        self.computed = 0  # how many computations ran (a test counts them)

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        while True:
            with self._lock:
                if key in self._done:
                    self._done.move_to_end(key)
                    return self._done[key][0]
                event = self._running.get(key)
                if event is None:  # ours to compute
                    event = self._running[key] = threading.Event()
                    break
            event.wait()  # another caller computes it; then look again (it may have failed: then we try)
        try:
            t0 = time.perf_counter()
            result = compute()
            with self._lock:
                self.computed += 1
                self._done[key] = (result, time.perf_counter() - t0)
                while len(self._done) > self.max_entries:
                    self._done.popitem(last=False)
            return result
        finally:
            with self._lock:
                self._running.pop(key, None)
            event.set()

    def has(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._done

    def seconds(self, key: Hashable) -> float | None:
        """How long the stored result took to compute (None if not stored)."""
        with self._lock:
            hit = self._done.get(key)
            return None if hit is None else hit[1]

    def clear(self) -> None:
        with self._lock:
            self._done.clear()


RESULTS = SharedResults()
_models: dict[int, object] = {}  # id -> model: keeps every keyed model alive, so its id stays its own
_models_lock = threading.Lock()


def _key(analysis: str, lm, *args) -> tuple:
    with _models_lock:
        _models.setdefault(id(lm), lm)
    return (analysis, id(lm), *args)


def cached(analysis: str, lm, args: tuple, compute: Callable[[], Any]) -> Any:
    """compute(), once per (analysis, lm, args) in this process."""
    return RESULTS.get(_key(analysis, lm, *args), compute)


def is_cached(analysis: str, lm, *args) -> bool:
    return RESULTS.has(_key(analysis, lm, *args))


# ---------------------------------------------------------------- honest estimates

# Tokens forwarded per second by the batched analyses on this server, as measured (calibrate() at warm-up,
# then every patching map and per-head sink run): what a page's "about N s" is computed from.
_rate = {"tokens": 0.0, "seconds": 0.0}
_rate_lock = threading.Lock()


def note_throughput(tokens: float, seconds: float) -> None:
    with _rate_lock:
        _rate["tokens"] += tokens
        _rate["seconds"] += seconds


def tokens_per_second() -> float | None:
    with _rate_lock:
        return _rate["tokens"] / _rate["seconds"] if _rate["seconds"] > 0 else None


def estimate_seconds(tokens: float) -> float | None:
    """How long forwarding `tokens` token-rows in batches takes here, from what was measured (None before)."""
    rate = tokens_per_second()
    return None if rate is None else tokens / rate


def calibrate(lm, rows: int = 16, T: int = 16) -> float:
    """Time one batched forward (rows x T tokens) and record it; returns tokens per second."""
    import torch

    from model.analysis.phenomena import as_decoder

    m = as_decoder(lm)
    ids = torch.randint(0, m.cfg.vocab_size, (rows, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        m(ids[:1, :4])  # the first call's one-off costs stay out of the rate
        t0 = time.perf_counter()
        m(ids)
        seconds = time.perf_counter() - t0
    note_throughput(rows * T, seconds)
    return rows * T / seconds


# ---------------------------------------------------------------- the analyses the pages and lessons show


def sink_effect(lm, text: str):
    from model.analysis import phenomena as PH

    return cached("sink_effect", lm, (text,), lambda: PH.sink_effect(lm, text))


def sinks_per_head(lm, text: str, progress: Callable[[int, int], None] | None = None):
    """[L, H] KL with token 0 blocked in one head at a time (L x H rows, batched)."""
    from model.analysis import phenomena as PH

    def run():
        d = PH.as_decoder(lm)
        T = PH.as_ids(lm, text).shape[1]
        t0 = time.perf_counter()
        out = PH.sink_effect(lm, text, per_head=True, progress=progress).kl_per_head
        note_throughput(d.cfg.n_layers * d.cfg.n_heads * T, time.perf_counter() - t0)
        return out

    return cached("sinks_per_head", lm, (text,), run)


def block_sink(lm, text: str, heads: tuple | None):
    from model.analysis import phenomena as PH

    return cached("block_sink", lm, (text, heads), lambda: PH.block_sink(lm, text, None if heads is None else
                                                                         list(heads)))


def induction(lm, n: int = 50, seed: int = 0):
    from model.analysis import phenomena as PH

    return cached("induction", lm, (int(n), int(seed)), lambda: PH.induction(lm, n=int(n), seed=int(seed)))


def induction_ablation(lm, n: int, seed: int, k: int, mode: str):
    from model.analysis import phenomena as PH

    return cached("induction_ablation", lm, (int(n), int(seed), int(k), mode),
                  lambda: PH.ablate_top_induction(lm, induction(lm, n, seed), k=int(k), mode=mode))


def ioi(lm):
    from model.analysis import ioi as IOI

    return cached("ioi", lm, (), lambda: IOI.ioi(lm))


def ioi_ablation(lm, k: int, mode: str, n_controls: int = 2):
    from model.analysis import ioi as IOI

    return cached("ioi_ablation", lm, (int(k), mode, int(n_controls)),
                  lambda: IOI.ablate_heads_ld(lm, ioi(lm), k=int(k), mode=mode, n_controls=int(n_controls)))


def patching(lm, i: int, progress: Callable[[int, int], None] | None = None):
    """The residual patching map of IOI prompt i (clean vs names swapped). progress(done, total): patched
    runs done (not part of the key: a second caller waits for the first's result)."""
    from model.analysis import patching as PT
    from model.analysis.phenomena import as_ids

    def run():
        p = ioi(lm).prompts[int(i)]
        T = as_ids(lm, p.text).shape[1]
        t0 = time.perf_counter()
        out = PT.activation_patching(lm, p.text, p.corrupted, p.io_id, p.s_id, heads=False, progress=progress)
        note_throughput(patching_token_rows(lm, T), time.perf_counter() - t0)
        return out

    return cached("patching", lm, (int(i),), run)


def patching_token_rows(lm, T: int) -> int:
    """Tokens the residual patching map of a T-token prompt forwards: per position t, one row per layer and
    an unpatched baseline row, each running positions t..T-1 only (patching.activation_patching's KV cache)."""
    from model.analysis.phenomena import as_decoder

    return (as_decoder(lm).cfg.n_layers + 1) * T * (T + 1) // 2


def logit_lens(lm, text: str):
    from model.analysis import logit_lens as LLN

    return cached("logit_lens", lm, (text,), lambda: LLN.logit_lens(lm, text))
