"""Server cost: the heap freezer and giving freed memory back to the OS (one process serves every session)."""

from __future__ import annotations

import ctypes
import gc
import threading
import time
from contextlib import contextmanager

_lock = threading.Lock()
_frozen: set[str] = set()  # the stages already frozen ("start", "lm:smollm2", ...)


def freeze_heap_once(stage: str = "start") -> bool:
    """Move everything alive now (torch, plotly's validators, the models loaded so far: a few hundred
    thousand long-lived objects) out of the garbage collector's reach, once per `stage` per process.
    Returns whether this call froze.

    Without this, every full collection walks them all: ~130 ms of server CPU, about once per click,
    far more than the click's own work (issue 12). Later objects are collected as usual.

    Stages: "start" after the first page's models (warm-up or the first script run, whichever comes
    first); then one per language model loaded later (`lm:<name>`, see freeze_after_load). Loading
    SmolLM2 imports transformers' and torch's rarer modules (~125,000 objects); left tracked, they made
    each full collection ~100 ms and a toy head switch 92 ms of server CPU instead of 26 (issue 26 §3).
    The warm-up loaded SmolLM2 after the one freeze there was, so its objects were never frozen.

    Cost of a late freeze: objects of sessions running at that moment are frozen too; the acyclic ones
    are still freed by reference counting, a cycle among them is kept (once per stage, a few kB)."""
    with _lock:
        if stage in _frozen:
            return False
        _frozen.add(stage)
    gc.collect()
    gc.freeze()
    return True


def freeze_after_load(name: str) -> bool:
    """After loading the language model `name` (its modules and tokenizer live as long as the server)."""
    return freeze_heap_once(f"lm:{name}")


def tracked_objects() -> int:
    """How many objects a full collection walks now (the frozen ones are not walked)."""
    return len(gc.get_objects())


def return_freed_memory() -> None:
    """Give freed memory back to the OS: freed trace blocks (else they go 1 s later) and heap pages (glibc
    keeps a finished thread's arena, a training run: ~150 MB, for reuse); a classroom server should
    shrink once the run is over."""
    from model.core.recorder import release_trace_memory

    release_trace_memory()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


@contextmanager
def training_job(job, slot: threading.Lock):
    """The end of a training run in a server thread (Training, live and /learn): its error is kept for the page to
    show (a thread would die silently), then the job is marked done, the one-run-at-a-time `slot` released and the
    run's optimizer and activations given back to the OS, so a classroom server shrinks once the run is over."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - shown on the page instead of dying silently in a thread
        job.error = f"{type(e).__name__}: {e}"
    finally:
        job.done = True
        job.elapsed = time.monotonic() - job.started
        slot.release()
        return_freed_memory()
        job.finished.set()
