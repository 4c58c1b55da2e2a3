"""The recorder: every tensor the model records is a capture point and a hook point.

    x = record("encoder.layers.0.self_attn.weights", x)   # in the model: record, maybe replace

Two `contextvars.ContextVar`s, never module hooks or globals, so Streamlit's threads (one per
browser session) can trace and intervene at once without seeing each other:
- the recorder (`capturing`) keeps the named tensors of the forward passes inside it;
- the hooks (`hooking`) map a capture name to functions `fn(tensor, name) -> tensor | None`
  whose result the model continues with (the trace records what the model used).
With neither set, `record` is two ContextVar lookups and returns its input: nothing is paid.

Capture names are not listed here: each instrumented module declares its own points next to
the code that records them (`capture_points`); a model's `capture_names` walks its module tree.
"""

from __future__ import annotations

import fnmatch
import mmap
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from contextvars import ContextVar

import torch

DEFAULT_BUDGET_BYTES = 512 * 2**20
EXACT_UP_TO = 512  # a long input's forward (a lazy trace, a page's analysis) runs the named fast path
                  # (fast_attention) beyond this many tokens: equal to ~1e-6, 2x faster at 2,048 tokens

Hook = Callable[[torch.Tensor, str], "torch.Tensor | None"]

_RECORDER: ContextVar[Recorder | None] = ContextVar("attention_lab_recorder", default=None)
_HOOKS: ContextVar[dict[str, list[Hook]] | None] = ContextVar("attention_lab_hooks", default=None)
_FAST: ContextVar[bool] = ContextVar("attention_lab_fast_attention", default=False)


class CaptureError(ValueError):
    """A capture or hook request that cannot be served (unknown name pattern, over the memory budget)."""


class CaptureBudgetError(CaptureError):
    """Over the memory budget. Numbers, not words, for a page to say in its own language:
    needed_bytes and budget (bytes), n_tokens (the input's length), max_tokens (the longest input whose
    request fits: 0 when none does) and context_length (the model's own limit, or None)."""

    def __init__(self, message: str, *, needed_bytes: int, budget: int, n_tokens: int, max_tokens: int,
                 context_length: int | None = None):
        super().__init__(message)
        self.needed_bytes, self.budget, self.n_tokens = int(needed_bytes), int(budget), int(n_tokens)
        self.max_tokens, self.context_length = int(max_tokens), context_length


class ContextLengthError(ValueError):
    """An input longer than the model reads at all (its context length): a hard limit, no budget helps.
    n_tokens: the input's length; context_length: the model's limit."""

    def __init__(self, message: str, *, n_tokens: int, context_length: int):
        super().__init__(message)
        self.n_tokens, self.context_length = int(n_tokens), int(context_length)


class Recorder:
    """Keeps the wanted tensors. With `reserve_bytes` (run_with_trace: the trace's estimated size),
    they are copied into one `_Block` (see there why); without, they are kept as they are (no copy:
    the model never writes into a tensor after recording it)."""

    def __init__(self, wanted: set[str], reserve_bytes: int = 0):
        self.wanted = wanted
        self.tensors: dict[str, torch.Tensor] = {}
        self.block = _Block(reserve_bytes) if reserve_bytes >= BLOCK_MIN_BYTES else None

    def put(self, name: str, tensor: torch.Tensor) -> None:
        if name in self.wanted:
            kept = tensor.detach().cpu()
            self.tensors[name] = kept if self.block is None else self.block.store(tensor, kept)


# ---------------------------------------------------------------- trace memory

BLOCK_MIN_BYTES = 2**20  # smaller traces (a training film's frames) stay in malloc'd tensors
POOL_MAX_BYTES = 256 * 2**20  # freed blocks kept for the next trace, at most this much...
POOL_IDLE_SECONDS = 1.0  # ...and this long: then their memory goes back to the OS (a server's RSS falls
                         # back a second after its sessions' traces are freed; malloc_trim can't see them)


# A private anonymous mapping, not Python's default shared one: the block is never shared with another process,
# and a fresh block page-faults ~30% faster (plain anonymous pages, not shared memory's: 92 vs 128 ms for a
# 172 MiB trace, bench/families.py's Qwen3 at 128 tokens). Windows' mmap has no flags.
_PRIVATE = {"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS} if hasattr(mmap, "MAP_PRIVATE") else {}


class _Block:
    """One anonymous memory mapping holding a whole trace: each recorded tensor is copied into it.

    Why: a full trace is ~80 MiB of tensors that outlive the forward pass. Left where the forward
    allocated them, glibc returns them to the OS when the trace is freed and the next trace
    page-faults them in again: that cost 1.3-1.5x a plain forward (bench/forward.py). Copying into a
    block that `_POOL` recycles costs one memcpy (~8 ms for a full trace) and no page faults, and the
    forward's own tensors are freed at once and reused, as without capture. The block is handed to
    the pool only when the last tensor viewing it is gone (a tensor kept from a dropped trace stays
    valid), so every tensor of a trace keeps the whole block alive: `.clone()` what you keep longer.
    """

    def __init__(self, n_bytes: int):
        m = _POOL.take(n_bytes)
        view = memoryview(m)  # torch holds this view; when the last tensor on it dies, it dies
        self.buf = torch.frombuffer(view, dtype=torch.uint8)
        weakref.finalize(view, _POOL.give, m).atexit = False
        self.used = 0
        self.copies: dict[int, tuple[weakref.ref, torch.Tensor]] = {}  # id(recorded tensor) -> its copy

    def store(self, tensor: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        """The copy of `kept` (= tensor detached, on CPU) in the block; one copy per recorded tensor
        (in post-LN, `<layer>.out` IS `<layer>.norm2.out`: both names get the same storage)."""
        hit = self.copies.get(id(tensor))
        if hit is not None and hit[0]() is tensor:  # the same live tensor, not a reused id
            return hit[1]
        n = kept.numel() * kept.element_size()
        if self.used + n > self.buf.numel():  # larger than estimated: keep it where it is
            return kept
        slot = self.buf[self.used:self.used + n].view(kept.dtype).view(kept.shape)
        self.used += -(-n // 64) * 64  # next slot 64-byte aligned, as torch's own allocations
        slot.copy_(kept)  # bit-exact
        self.copies[id(tensor)] = (weakref.ref(tensor), slot)
        return slot


class _Pool:
    """Freed trace blocks, reused by the next traces instead of page-faulting fresh memory. Bounded
    (POOL_MAX_BYTES) and draining: a block not reused within POOL_IDLE_SECONDS is unmapped (returned
    to the OS), and `release_trace_memory()` unmaps them all at once. Thread-safe (sessions' threads)."""

    def __init__(self):
        self.free: list[tuple[float, mmap.mmap]] = []  # (when freed, block), oldest first
        self.lock = threading.RLock()  # re-entrant: a finalizer may run `give` inside a locked section
        self.timer: threading.Timer | None = None

    def take(self, n: int) -> mmap.mmap:
        with self.lock:
            fits = [i for i, (_, m) in enumerate(self.free) if n <= len(m) <= n + n // 4]  # little waste
            if fits:
                return self.free.pop(min(fits, key=lambda i: len(self.free[i][1])))[1]
        return mmap.mmap(-1, n, **_PRIVATE)

    def give(self, block: mmap.mmap) -> None:
        with self.lock:
            self.free.append((time.monotonic(), block))
            while sum(len(m) for _, m in self.free) > POOL_MAX_BYTES:
                self.free.pop(0)[1].close()
            self._schedule()

    def drain(self, idle_for: float = 0.0) -> int:
        """Unmap the free blocks freed at least `idle_for` seconds ago; returns the bytes released."""
        with self.lock:
            now = time.monotonic()
            old = [m for t, m in self.free if now - t >= idle_for]
            self.free = [(t, m) for t, m in self.free if now - t < idle_for]
            released = sum(len(m) for m in old)
            for m in old:
                m.close()
            if not self.free and self.timer is not None:  # nothing left to expire
                self.timer.cancel()
                self.timer = None
            return released

    def _schedule(self) -> None:  # with the lock held: wake up when the oldest free block expires
        if self.free and self.timer is None:
            delay = self.free[0][0] + POOL_IDLE_SECONDS - time.monotonic()
            self.timer = threading.Timer(max(delay, 0.0), self._expire)
            self.timer.daemon = True
            self.timer.start()

    def _expire(self) -> None:
        with self.lock:
            self.timer = None
            self.drain(POOL_IDLE_SECONDS)
            self._schedule()  # blocks freed since: wake up again for the next one


_POOL = _Pool()


def release_trace_memory() -> int:
    """Return the memory of freed traces to the OS now (else POOL_IDLE_SECONDS after they were freed).
    A server calls this with malloc_trim when sessions end; returns the bytes released."""
    return _POOL.drain()


def record(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Run the hooks registered for `name` (if any), record the result (if wanted), return it."""
    hooks = _HOOKS.get()
    if hooks is not None and name in hooks:
        tensor = _apply_hooks(name, tensor, hooks[name])
    rec = _RECORDER.get()
    if rec is not None:
        rec.put(name, tensor)
    return tensor


def hook(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Only the hooks of `name` (the caller records the tensor later, e.g. after a cache concat)."""
    hooks = _HOOKS.get()
    return _apply_hooks(name, tensor, hooks[name]) if hooks is not None and name in hooks else tensor


def keep(name: str, tensor: torch.Tensor) -> None:
    """Only record `name` (its hooks ran already, see `hook`)."""
    rec = _RECORDER.get()
    if rec is not None:
        rec.put(name, tensor)


def _apply_hooks(name: str, tensor: torch.Tensor, fns: list[Hook]) -> torch.Tensor:
    for fn in fns:
        out = fn(tensor, name)
        if out is None:
            continue
        if not isinstance(out, torch.Tensor) or out.shape != tensor.shape or out.dtype != tensor.dtype:
            got = (f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor)
                   else type(out).__name__)
            raise ValueError(f"hook {getattr(fn, '__name__', fn)!r} at {name!r} returned {got}; "
                             f"it must return a tensor of shape {tuple(tensor.shape)} and dtype "
                             f"{tensor.dtype} (or None to leave the tensor unchanged)")
        tensor = out
    return tensor


def recording(name: str | None = None) -> bool:
    """True inside `capturing`; with a name, only when that name is recorded."""
    rec = _RECORDER.get()
    return rec is not None and (name is None or name in rec.wanted)


def wanted(name: str) -> bool:
    """True when `name` is recorded or hooked in this call: a point that costs extra work to form
    (a mixture-of-experts expert's output spread over all positions) is built only then."""
    rec, hooks = _RECORDER.get(), _HOOKS.get()
    return (rec is not None and name in rec.wanted) or (hooks is not None and name in hooks)


_INSIDE = (".scores", ".mask", ".weights", ".sink")  # what a fused attention kernel never materializes


def fast_attention_allowed(module: str) -> bool:
    """True inside `fast_attention()` when nothing inside `module`'s softmax is recorded or hooked:
    then the module may compute z with a fused kernel (its scores/mask/weights are never formed)."""
    if not _FAST.get():
        return False
    rec, hooks = _RECORDER.get(), _HOOKS.get()
    inside = [module + r for r in _INSIDE]
    return not ((rec is not None and any(n in rec.wanted for n in inside))
                or (hooks is not None and any(n in hooks for n in inside)))


class fast_attention:
    """Context manager, the explicitly named fast inference mode: attention modules whose scores, mask
    and weights are neither recorded nor hooked compute z with torch's fused
    scaled_dot_product_attention. Logits then differ from `forward`'s in the last float bits (never use
    it where forward and run_with_trace must agree bit for bit); a lazy trace's recomputed weights
    are still the step-by-step function of the recorded q and k."""

    def __init__(self, on: bool = True):
        self.on = on

    def __enter__(self) -> None:
        self._token = _FAST.set(self.on)

    def __exit__(self, *exc) -> None:
        _FAST.reset(self._token)


class capturing:
    """Context manager: record the named tensors of every forward pass inside it (`reserve_bytes`:
    see `Recorder`)."""

    def __init__(self, wanted: set[str], reserve_bytes: int = 0):
        self.recorder = Recorder(wanted, reserve_bytes)

    def __enter__(self) -> Recorder:
        self._token = _RECORDER.set(self.recorder)
        return self.recorder

    def __exit__(self, *exc) -> None:
        _RECORDER.reset(self._token)


class hooking:
    """Context manager: run `hooks` ({capture name: [fn, ...]}, see `resolve_hooks`) in every
    forward pass inside it, after any hooks already active (an outer intervention stays on)."""

    def __init__(self, hooks: Mapping[str, list[Hook]] | None):
        self.hooks = dict(hooks or {})

    def __enter__(self) -> dict[str, list[Hook]]:
        merged = {k: list(v) for k, v in (_HOOKS.get() or {}).items()}
        for name, fns in self.hooks.items():
            merged.setdefault(name, []).extend(fns)
        self._token = _HOOKS.set(merged or None)
        return merged

    def __exit__(self, *exc) -> None:
        _HOOKS.reset(self._token)


def resolve_hooks(available: list[str], hooks: Mapping[str, Hook | list[Hook]] | None) -> dict[str, list[Hook]]:
    """{glob: fn or [fns]} -> {capture name: [fns]}, in the order given. A glob that matches no
    capture point, or a hook that is not callable, is an error naming the valid points."""
    out: dict[str, list[Hook]] = {}
    for pattern, fns in (hooks or {}).items():
        fns = list(fns) if isinstance(fns, list | tuple) else [fns]
        bad = [f for f in fns if not callable(f)]
        if bad:
            raise CaptureError(f"hook for {pattern!r} must be a function fn(tensor, name), got "
                               f"{type(bad[0]).__name__}")
        for name in select_names(available, pattern, what="hook"):
            out.setdefault(name, []).extend(fns)
    return out


# ---------------------------------------------------------------- names, shapes, budgets


def select_names(available: list[str], names: str | list[str] | None, what: str = "capture") -> list[str]:
    """Resolve fnmatch globs (`*` crosses dots) against the available names.

    A pattern that matches nothing is an error: a typo must not silently capture nothing.
    """
    if names is None:
        return list(available)
    patterns = [names] if isinstance(names, str) else list(names)
    chosen: set[str] = set()
    for pattern in patterns:
        hits = fnmatch.filter(available, pattern)
        if not hits:
            raise CaptureError(
                f"{what} pattern {pattern!r} matches no name. Valid names (globs like '*.weights' "
                f"or 'decoder.layers.*.cross_attn.*' work):\n  " + "\n  ".join(available)
            )
        chosen.update(hits)
    return [n for n in available if n in chosen]


def estimate_bytes(shapes: dict[str, tuple[int, ...]], names: list[str], itemsize: int = 4) -> int:
    total = 0
    for n in names:
        numel = 1
        for s in shapes[n]:
            numel *= s
        total += numel * (1 if n.endswith("mask") or n.startswith("masks.") else itemsize)
    return total


def check_budget(n_bytes: int, budget: int | None) -> None:
    if budget is not None and n_bytes > budget:
        raise CaptureError(
            f"capturing these tensors needs about {n_bytes / 2**20:.1f} MiB, over the budget of "
            f"{budget / 2**20:.1f} MiB. Capture fewer names (e.g. names='*.weights' or "
            f"'encoder.layers.0.*'), use shorter inputs or a smaller batch, or raise budget_bytes."
        )
