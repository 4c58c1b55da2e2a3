"""The recorder: every tensor the model records is a capture point and a hook point.

    x = record("encoder.layers.0.self_attn.weights", x)   # in the model: record, maybe replace

Two `contextvars.ContextVar`s, never module hooks or globals, so Streamlit's threads (one per
browser session) can trace and intervene at once without seeing each other:
- the recorder (`capturing`) keeps the named tensors of the forward passes inside it;
- the hooks (`hooking`) map a capture name to functions `fn(tensor, name) -> tensor | None`
  whose result the model continues with (the trace records what the model used).
With neither set, `record` is two ContextVar lookups and returns its input: nothing is paid.

Capture names are not listed here: each instrumented module declares its own points next to
the code that records them (`capture_points`), and `capture_shapes` walks the module tree.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Mapping
from contextvars import ContextVar

import torch

from .config import TransformerConfig

DEFAULT_BUDGET_BYTES = 512 * 2**20

Hook = Callable[[torch.Tensor, str], "torch.Tensor | None"]

_RECORDER: ContextVar[Recorder | None] = ContextVar("attention_lab_recorder", default=None)
_HOOKS: ContextVar[dict[str, list[Hook]] | None] = ContextVar("attention_lab_hooks", default=None)


class CaptureError(ValueError):
    """A capture or hook request that cannot be served (unknown name pattern, over the memory budget)."""


class Recorder:
    def __init__(self, wanted: set[str]):
        self.wanted = wanted
        self.tensors: dict[str, torch.Tensor] = {}

    def put(self, name: str, tensor: torch.Tensor) -> None:
        if name in self.wanted:
            # No copy: the model never writes into a tensor after recording it.
            self.tensors[name] = tensor.detach().cpu()


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


def recording() -> bool:
    return _RECORDER.get() is not None


class capturing:
    """Context manager: record the named tensors of every forward pass inside it."""

    def __init__(self, wanted: set[str]):
        self.recorder = Recorder(wanted)

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


@functools.lru_cache(maxsize=32)
def _skeleton(cfg: TransformerConfig):
    """The module tree of `cfg` on the meta device: no weights, no memory, built once per config."""
    from .transformer import Transformer  # lazy: the model imports this module

    with torch.device("meta"):
        return Transformer(cfg)


def capture_shapes(cfg: TransformerConfig, B: int, S: int, T: int = 0) -> dict[str, tuple[int, ...]]:
    """Every capture name of one forward pass, in computation order, with its shape.

    B: batch, S: source length, T: target length (0 for encoder-only). Derived from the module
    tree (each module's `capture_points`), so it cannot disagree with the `record` calls.
    """
    return _skeleton(cfg).capture_names(B, S, T)


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
