"""Server cost: the heap freezer and giving freed memory back to the OS (one process serves every session)."""

from __future__ import annotations

import ctypes
import gc
import threading

_frozen = threading.Event()


def freeze_heap_once() -> None:
    """Move everything alive after the first page (torch, plotly's validators, the first model: a
    few million long-lived objects) out of the garbage collector's reach, once per process.

    Without this, every full collection walks them all: ~130 ms of server CPU, about once per click,
    far more than the click's own work (issue 12). Later objects are collected as usual."""
    if not _frozen.is_set():
        _frozen.set()
        gc.collect()
        gc.freeze()


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
