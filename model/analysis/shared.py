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
        self._owner: dict[Hashable, int] = {}  # key being computed -> the thread computing it
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
                    self._owner[key] = threading.get_ident()
                    break
            _note_waiting(self, key)  # the server's warm-up does not pause while a script run waits for its result
            try:
                event.wait()  # another caller computes it; then look again (it may have failed: then we try)
            finally:
                _note_waiting(self, None)
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
                self._owner.pop(key, None)
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


_WAITING: dict[int, tuple] = {}  # thread id -> (SharedResults, key) it waits for, while another thread computes it
_WAITING_LOCK = threading.Lock()


def _note_waiting(results: SharedResults, key) -> None:
    """This thread waits for `key` of `results` (None: no longer waits)."""
    with _WAITING_LOCK:
        if key is None:
            _WAITING.pop(threading.get_ident(), None)
        else:
            _WAITING[threading.get_ident()] = (results, key)


def waiting_threads() -> set[int]:
    """The threads now waiting for a result another thread computes."""
    with _WAITING_LOCK:
        return set(_WAITING)


def waits_for(owner: int) -> bool:
    """Whether some thread waits for a result that thread `owner` computes (viz/ui/warmup.py: a script run waiting
    for the warm-up's result, maybe with other runs queued behind it on a page's own cache lock, must never make
    the warm-up pause: that would stall them all)."""
    with _WAITING_LOCK:
        waits = list(_WAITING.values())
    for results, key in waits:
        with results._lock:
            if results._owner.get(key) == owner:
                return True
    return False


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

# Tokens forwarded per second by the batched analyses on this server, as measured (calibrate(), then every
# patching map, per-head sink run and needle grid): what a page's "about N s" is computed from. Only the
# measurements of the last RATE_WINDOW_S count (issue 31 §2: an all-time average mixed the warm-up's busy
# seconds with a quiet afternoon and said "about 6 minutes" for a 16 s run); with none that recent there is no
# rate, and a page re-measures (`fresh_rate`) or shows no estimate.
RATE_WINDOW_S = 120.0
_rates: list[tuple[float, float, float]] = []  # (when, tokens, seconds), oldest first
_rate_lock = threading.Lock()


def note_throughput(tokens: float, seconds: float) -> None:
    now = time.monotonic()
    with _rate_lock:
        _rates.append((now, float(tokens), float(seconds)))
        while _rates and now - _rates[0][0] > RATE_WINDOW_S:
            _rates.pop(0)


def tokens_per_second() -> float | None:
    """The rate measured over the last RATE_WINDOW_S (None when nothing was measured that recently)."""
    now = time.monotonic()
    with _rate_lock:
        recent = [(tk, sec) for when, tk, sec in _rates if now - when <= RATE_WINDOW_S]
    seconds = sum(sec for _, sec in recent)
    return sum(tk for tk, _ in recent) / seconds if seconds > 0 else None


def fresh_rate(lm) -> float | None:
    """This server's rate at this moment: the recent measurements', else one small calibration now (a 4 x 16
    token forward, well under a second on a quiet machine). None if even that fails."""
    rate = tokens_per_second()
    if rate is None:
        try:
            calibrate(lm, rows=4, T=16)
        except Exception:
            return None
        rate = tokens_per_second()
    return rate


def estimate_seconds(tokens: float, lm=None) -> float | None:
    """How long forwarding `tokens` token-rows in batches takes here, from what was measured in the last
    RATE_WINDOW_S (None without; given `lm`, a small calibration now fills the gap: `fresh_rate`)."""
    rate = tokens_per_second() if lm is None else fresh_rate(lm)
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


def horizon(lm, length: int = 2000, depth: float = 0.1):
    from model.analysis import long as LG

    return cached("horizon", lm, (int(length), float(depth)), lambda: LG.horizon(lm, int(length), float(depth)))


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


# ---------------------------------------------------------------- a needle in a haystack (/phenomena?phen=needle)

NEEDLE_LENGTHS = (256, 512)  # small, so the section is quick (README has SmolLM2 at 512-8,187 tokens)
NEEDLE_DEPTHS = (0.0, 0.5, 1.0)
NEEDLE_KEY, NEEDLE_ABLATE_KEY = "71432", "58219"  # the ablation runs on new prompts: another key, other depths
NEEDLE_ABLATE_DEPTHS = (0.25, 0.75)
NEEDLE_ABLATE_CONTROLS = 2  # random head sets zeroed beside the top k (each a control)
NEEDLE_ABLATE_K = 5  # the page's default "heads to ablate"
_needle_pace: dict[str, float] = {}  # "seconds_per_token" of the last needle grid run here, and "when" (monotonic)


def needle_lengths(lm) -> tuple[int, ...]:
    """The grid's lengths that fit the model's context (with room for the answer's tokens)."""
    from model.analysis.inputs import as_decoder

    ctx = getattr(as_decoder(lm).cfg, "max_len", None) or max(NEEDLE_LENGTHS) + 16
    return tuple(n for n in NEEDLE_LENGTHS if n + 16 <= ctx) or (ctx // 2,)


def needle_grid(lm, lengths: tuple | None = None, depths: tuple = NEEDLE_DEPTHS, key: str = NEEDLE_KEY,
                progress: Callable[[int, int], None] | None = None):
    """The page's needle grid, once per server (the warm-up computes the default one at start). Its pace
    (seconds per prompt token) is kept for `needle_estimate`."""
    from model.analysis import long as LG

    lengths = needle_lengths(lm) if lengths is None else tuple(lengths)

    def run():
        t0 = time.perf_counter()
        out = LG.needle_grid(lm, lengths, depths, key, progress=progress)
        _needle_pace.update(seconds_per_token=(time.perf_counter() - t0) / (sum(lengths) * len(depths)),
                            when=time.monotonic())
        return out

    return cached("needle_grid", lm, (lengths, tuple(depths), key), run)


def needle_estimate(lm, lengths: tuple, depths: tuple = NEEDLE_DEPTHS) -> float | None:
    """Seconds a needle grid takes here, from the last one measured in the last RATE_WINDOW_S (None: not
    measured at this moment; the bar then tells the run's own pace as it goes)."""
    if not _needle_pace or time.monotonic() - _needle_pace["when"] > RATE_WINDOW_S:
        return None
    return _needle_pace["seconds_per_token"] * sum(lengths) * len(depths)


def needle_ablation(lm, lengths: tuple | None = None, depths: tuple = NEEDLE_DEPTHS, k: int = NEEDLE_ABLATE_K):
    """The top-k retrieval heads of the grid zeroed on new prompts, against k random heads (twice)."""
    from model.analysis import long as LG

    lengths = needle_lengths(lm) if lengths is None else tuple(lengths)
    grid = needle_grid(lm, lengths, depths)

    def run():
        prompts = [LG.needle_prompt(lm, max(lengths), d, NEEDLE_ABLATE_KEY) for d in NEEDLE_ABLATE_DEPTHS]
        return LG.ablate_retrieval(lm, prompts, grid.retrieval, k=int(k), n_controls=NEEDLE_ABLATE_CONTROLS)

    return cached("needle_ablation", lm, (lengths, tuple(depths), NEEDLE_KEY, NEEDLE_ABLATE_KEY, int(k)), run)
