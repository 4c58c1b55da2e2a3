"""`Trace`: the recorded tensors of one forward pass, plus JSON metadata; saved as safetensors."""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

FORMAT = "attention-lab-trace"
FORMAT_VERSION = "1"


class TraceFileError(ValueError):
    """A trace file that is missing, corrupt, or not an Attention Lab trace."""


class Trace(Mapping):
    """Read-only mapping: capture name -> detached CPU tensor. Holds no reference to the model."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], meta: Mapping | None = None):
        self._tensors = {k: v.detach().cpu() for k, v in tensors.items()}
        meta = copy.deepcopy(dict(meta or {}))
        json.dumps(meta)  # meta must stay JSON-able: it is saved beside the tensors
        self._meta = meta

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            close = [n for n in self._tensors if name.split(".")[-1] in n][:8]
            hint = f" Similar names: {close}" if close else ""
            raise KeyError(f"{name!r} is not in this trace ({len(self._tensors)} names).{hint}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def names(self) -> list[str]:
        return list(self._tensors)

    @property
    def meta(self) -> dict:
        return copy.deepcopy(self._meta)  # a copy: a Trace is read-only

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    def __repr__(self) -> str:
        return f"Trace({len(self)} names, {self.nbytes() / 2**20:.2f} MiB)"

    def save(self, path: str | Path) -> None:
        tensors = {k: v.contiguous() for k, v in self._tensors.items()}
        save_file(tensors, str(path), metadata={"format": FORMAT, "version": FORMAT_VERSION,
                                                "meta": json.dumps(self._meta)})

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        path = Path(path)
        if not path.is_file():
            raise TraceFileError(f"no trace file at {path}")
        try:
            with safe_open(str(path), framework="pt") as f:
                header = f.metadata() or {}
                if header.get("format") != FORMAT:
                    raise TraceFileError(
                        f"{path.name} is a safetensors file but not an Attention Lab trace "
                        f"(its metadata has no format={FORMAT!r}); it may be model weights."
                    )
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
        except TraceFileError:
            raise
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise TraceFileError(
                f"{path.name} is not a readable trace file (truncated, corrupt, or not safetensors): {e}"
            ) from None
        try:
            meta = json.loads(header.get("meta", "{}"))
        except json.JSONDecodeError as e:
            raise TraceFileError(f"{path.name}: the trace metadata is not valid JSON ({e})") from None
        return cls(tensors, meta)

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "upload") -> Trace:
        """Load from bytes (e.g. a browser upload) through a temporary file."""
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / name
            p.write_bytes(data)
            return cls.load(p)

    def to_bytes(self) -> bytes:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "trace.safetensors"
            self.save(p)
            return p.read_bytes()


# ---------------------------------------------------------------- comparison

_LAYER = re.compile(r"layers\.(\d+)")


def _axes(name: str, ndim: int) -> list[str]:
    """Axis labels of a capture, from its name (DESIGN.md's table)."""
    role = name.rsplit(".", 1)[-1]
    if name == "masks.causal":
        return ["query", "key"]
    if name.startswith("masks."):
        return ["batch", "position"]
    if ndim == 4 and role in ("scores", "weights", "mask"):
        return ["batch", "head", "query", "key"]
    if ndim == 4:
        return ["batch", "head", "position", "dim"]
    if ndim == 3:
        return ["batch", "position", "vocab" if role == "logits" else "dim"]
    if ndim == 2:
        return ["position", "dim"]
    return [f"axis{i}" for i in range(ndim)]


def _token_sides(name: str) -> tuple[str, str]:
    """Which metadata token list labels the query and key axes of a capture."""
    if name.startswith("encoder."):
        return "src_tokens", "src_tokens"
    if ".cross_attn." in name:
        return "tgt_tokens", "src_tokens"
    return "tgt_tokens", "tgt_tokens"


def locate(name: str, shape: tuple[int, ...], flat_index: int, meta: Mapping | None = None) -> dict:
    """Turn a flat index into named coordinates (layer, head, query, key...) with token strings."""
    idx = []
    for s in reversed(shape):
        idx.append(flat_index % s)
        flat_index //= s
    idx.reverse()
    where: dict = {}
    m = _LAYER.search(name)
    if m:
        where["layer"] = int(m.group(1))
    qside, kside = _token_sides(name)
    meta = meta or {}
    for axis, i in zip(_axes(name, len(shape)), idx, strict=True):
        where[axis] = i
        side = {"query": qside, "position": qside, "key": kside}.get(axis)
        tokens = meta.get(side) if side else None  # one list, or one list per batch row
        if tokens and isinstance(tokens[0], list):
            b = where.get("batch", 0)
            tokens = tokens[b] if b < len(tokens) else None
        if tokens and i < len(tokens):
            where[f"{axis}_token"] = tokens[i]
    return where


@dataclass
class NameDiff:
    name: str
    max_abs: float
    where: dict = field(default_factory=dict)
    problem: str = ""  # "shape", "dtype" or "" (values)


@dataclass
class TraceDiff:
    """Result of comparing two traces: worst differences first, plus new and missing names."""

    diffs: list[NameDiff]
    missing: list[str]  # in the reference, not in the other
    new: list[str]  # in the other, not in the reference
    meta_notes: list[str]

    @property
    def equal(self) -> bool:
        return not (self.diffs or self.missing or self.new)

    def report(self, top: int = 10) -> str:
        if self.equal:
            return "traces match" + ("" if not self.meta_notes else "\n" + "\n".join(self.meta_notes))
        lines = []
        for d in self.diffs[:top]:
            if d.problem:
                lines.append(f"{d.name}: {d.problem} changed {d.where}")
            else:
                where = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in d.where.items())
                lines.append(f"{d.name}: max |diff| {d.max_abs:.3g} at {where}")
        if len(self.diffs) > top:
            lines.append(f"... and {len(self.diffs) - top} more names differ")
        if self.missing:
            lines.append(f"missing names ({len(self.missing)}): {', '.join(self.missing[:10])}")
        if self.new:
            lines.append(f"new names ({len(self.new)}): {', '.join(self.new[:10])}")
        return "\n".join(lines + self.meta_notes)


def compare_traces(
    expected: Mapping[str, torch.Tensor],
    actual: Mapping[str, torch.Tensor],
    atol: float | Mapping[str, float] = 1e-5,
    rtol: float | Mapping[str, float] = 0.0,
    meta: Mapping | None = None,
) -> TraceDiff:
    """Compare two traces name by name; report each differing name's worst cell, worst first.

    atol/rtol may be dicts mapping a name to its tolerance (callers resolve globs).
    """
    meta = meta if meta is not None else getattr(expected, "meta", None)
    diffs: list[NameDiff] = []
    for name in [n for n in expected if n in actual]:
        a, b = expected[name], actual[name]
        if tuple(a.shape) != tuple(b.shape):
            diffs.append(NameDiff(name, math.inf, {"expected": list(a.shape), "actual": list(b.shape)}, "shape"))
            continue
        if a.dtype != b.dtype:
            diffs.append(NameDiff(name, math.inf, {"expected": str(a.dtype), "actual": str(b.dtype)}, "dtype"))
            continue
        if a.numel() == 0:
            continue
        at = atol[name] if isinstance(atol, Mapping) else atol
        rt = rtol[name] if isinstance(rtol, Mapping) else rtol
        if a.dtype == torch.bool or not a.is_floating_point():
            bad = a != b
            err = bad.to(torch.float64)
        else:
            a64, b64 = a.to(torch.float64), b.to(torch.float64)
            err = (a64 - b64).abs()
            nan_mismatch = a64.isnan() != b64.isnan()
            err = torch.where(a64.isnan() & b64.isnan(), torch.zeros_like(err), err)
            err = torch.where(nan_mismatch, torch.full_like(err, math.inf), err)
            bad = err > at + rt * b64.abs()
        if bool(bad.any()):
            flat = int(torch.where(bad, err, torch.zeros_like(err)).flatten().argmax())
            diffs.append(NameDiff(name, float(err.flatten()[flat]), locate(name, tuple(a.shape), flat, meta)))
    diffs.sort(key=lambda d: -d.max_abs)
    notes = []
    ma, mb = getattr(expected, "meta", {}) or {}, getattr(actual, "meta", {}) or {}
    for key in ("config", "versions"):
        if key in ma and key in mb and ma[key] != mb[key]:
            notes.append(f"note: metadata '{key}' differs: {ma[key]} vs {mb[key]}")
    return TraceDiff(
        diffs,
        missing=[n for n in expected if n not in actual],
        new=[n for n in actual if n not in expected],
        meta_notes=notes,
    )
