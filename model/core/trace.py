"""`Trace`: the recorded tensors of one forward pass, plus JSON metadata; saved as safetensors."""

from __future__ import annotations

import copy
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from model.core.describe import token_sides

FORMAT = "attention-lab-trace"
FORMAT_VERSION = "1"


class TraceFileError(ValueError):
    """A trace file that is missing, corrupt, or not an Attention Lab trace.

    `kind` says which, for a UI that words its own message: "missing", "empty", "pickle", "zip",
    "too_many_names" (`info`: n, limit), "foreign" (safetensors, not a trace), or "corrupt"."""

    def __init__(self, message: str, kind: str = "corrupt", **info):
        super().__init__(message)
        self.kind, self.info = kind, info


MAX_NAMES = 5000  # a trace of one forward pass has a few hundred names (MiniLM's full trace: ~300)
MAX_HEADER_BYTES = 16 * 2**20  # the JSON header: names, shapes, offsets and the metadata
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
             "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


def check_safetensors_header(path: Path, label: str, max_names: int, what: str = "trace") -> None:
    """Refuse, from the first bytes and the JSON header alone, what is not a sane safetensors file
    (`what` names the expected content in messages: "trace", "model")."""
    size = path.stat().st_size
    if size == 0:
        raise TraceFileError(f"{label}: the file is empty (0 bytes)", "empty")
    with path.open("rb") as f:
        head = f.read(8)
        if head[:1] == b"\x80" and head[1:2] and 2 <= head[1] <= 5:
            raise TraceFileError(f"{label} is a Python pickle (torch.save's old format), not safetensors; "
                                 "pickles can run code when loaded, so this app never opens them", "pickle")
        if head.startswith(b"PK\x03\x04"):
            raise TraceFileError(f"{label} is a zip archive (torch.save's format?), not safetensors; "
                                 "pickled tensors can run code when loaded, so this app never opens them", "zip")
        if len(head) < 8:
            raise TraceFileError(f"{label} is {size} bytes: too short to be a safetensors file")
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER_BYTES:
            raise TraceFileError(f"{label} is not a safetensors {what}: this is not a safetensors file (it does not "
                                 "begin with the length of a safetensors header)")
        if 8 + n > size:
            raise TraceFileError(f"{label} is truncated (or not safetensors): its header alone should take "
                                 f"{n:,} bytes, and the file has {size:,}")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise TraceFileError(f"{label} is not a safetensors {what}: its header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise TraceFileError(f"{label} is not a safetensors {what}: its header is not a JSON object")
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    if len(entries) > max_names:
        raise TraceFileError(f"{label} holds {len(entries):,} tensors; a trace of one forward pass has a few "
                             f"hundred (limit {max_names:,}). Capture fewer names (e.g. names='*.weights').",
                             "too_many_names", n=len(entries), limit=max_names)
    data = size - 8 - n
    for name, e in entries.items():
        try:
            shape, (start, end) = [int(d) for d in e["shape"]], map(int, e["data_offsets"])
            itemsize = _ITEMSIZE[e["dtype"]]
        except (TypeError, KeyError, ValueError):
            raise TraceFileError(f"{label}: the header entry of {name[:80]!r} is malformed") from None
        claimed = math.prod(shape) * itemsize
        if min(shape, default=0) < 0 or not 0 <= start <= end <= data or end - start != claimed:
            raise TraceFileError(f"{label}: tensor {name[:80]!r} claims shape {shape[:8]} ({claimed:,} bytes) at "
                                 f"bytes {start:,}..{end:,}, but the file holds {data:,} bytes of data; "
                                 "the file is truncated, corrupt or forged")


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

    def meta_item(self, key: str, default=None):
        """One metadata entry (a copy), without copying the rest: a long prompt's meta holds its token lists
        several times over, and `meta` copies them all (~12 ms at 2,380 tokens, several times a page run)."""
        return copy.deepcopy(self._meta.get(key, default))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    def with_meta(self, meta: Mapping) -> Trace:
        """The same tensors (not copied, nothing computed) under another metadata dict; a LazyTrace stays
        lazy (its meta["lazy"] is kept). Use this, not Trace(trace, meta), which reads every name."""
        meta = dict(meta)
        if "lazy" in self._meta:
            meta["lazy"] = self._meta["lazy"]
        out = type(self)(self._tensors, meta)
        if isinstance(out, LazyTrace):
            out.attach(self._model)
            if out._meta.get("fast_attention") == self._meta.get("fast_attention"):
                out._ran, out._lock = self._ran, self._lock  # the layers run again so far: same tensors, same model
        return out

    def __repr__(self) -> str:
        return f"Trace({len(self)} names, {self.nbytes() / 2**20:.2f} MiB)"

    def save(self, path: str | Path) -> None:
        tensors, seen = {}, set()
        for k, v in self._tensors.items():  # safetensors refuses shared storage (e.g. encoder.out is
            v = v.contiguous()               # the last layer's output in post-LN): copy repeats
            key = (v.untyped_storage().data_ptr(), v.storage_offset())
            tensors[k] = v.clone() if key in seen else v
            seen.add(key)
        save_file(tensors, str(path), metadata={"format": FORMAT, "version": FORMAT_VERSION,
                                                "meta": json.dumps(self._meta),
                                                "names": json.dumps(list(tensors))})  # keeps capture order

    @classmethod
    def load(cls, path: str | Path, *, max_names: int | None = None, label: str | None = None) -> Trace:
        """Read a trace file. Anything else (a pickle, weights, a header that claims more than the
        file holds, more than `max_names` tensors) is refused with a TraceFileError saying what it
        is, before any tensor is read: memory stays bounded by the file's size.
        label: the name to use in messages (e.g. an upload's file name); default the file name."""
        path = Path(path)
        label = label or path.name
        if not path.is_file():
            raise TraceFileError(f"no trace file at {path}", "missing")
        check_safetensors_header(path, label, MAX_NAMES if max_names is None else max_names)
        try:
            with safe_open(str(path), framework="pt") as f:
                header = f.metadata() or {}
                if header.get("format") != FORMAT:
                    raise TraceFileError(
                        f"{label} is a safetensors file but not an Attention Lab trace "
                        f"(its metadata has no format={FORMAT!r}); it may be model weights.", "foreign"
                    )
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
        except TraceFileError:
            raise
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise TraceFileError(
                f"{label} is not a readable trace file (truncated, corrupt, or not safetensors): {e}"
            ) from None
        try:
            meta = json.loads(header.get("meta", "{}"))
        except json.JSONDecodeError as e:
            raise TraceFileError(f"{label}: the trace metadata is not valid JSON ({e})") from None
        if not isinstance(meta, dict):
            raise TraceFileError(f"{label}: the trace metadata is a JSON {type(meta).__name__}, not an object")
        try:
            order = json.loads(header.get("names", "[]"))
        except json.JSONDecodeError:
            order = []
        if isinstance(order, list) and sorted(map(str, order)) == sorted(tensors):  # restore computation order
            tensors = {n: tensors[n] for n in order}
        if cls is Trace and _is_lazy(tensors, meta):  # a saved long trace: still lazy
            return LazyTrace(tensors, meta)
        return cls(tensors, meta)

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "upload", **kw) -> Trace:
        """Load from bytes (e.g. a browser upload) through a temporary file. `name` only labels
        messages: the file is written under a fixed name (an upload's name is not a safe path)."""
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "trace.safetensors"
            p.write_bytes(data)
            return cls.load(p, label=name, **kw)

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
    qside, kside = token_sides(meta, name)
    meta = meta or {}
    for axis, i in zip(_axes(name, len(shape)), idx, strict=True):
        where[axis] = i
        # k and v are indexed by key positions (the source, for cross-attention)
        position_side = kside if name.rsplit(".", 1)[-1] in ("k", "v") else qside
        side = {"query": qside, "position": position_side, "key": kside}.get(axis)
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
    n_bad: int = 0  # cells over tolerance
    numel: int = 0
    heads: list[int] | None = None  # heads with a cell over tolerance (captures with a head axis)
    n_heads: int = 0
    expected: float | None = None  # the worst cell's values
    actual: float | None = None
    atol: float = 0.0
    rtol: float = 0.0


def _fmt_where(where: Mapping) -> str:
    """{"layer": 1, "query": 2, "query_token": "l"} -> "layer 1, query 2 'l'"."""
    parts = []
    for k, v in where.items():
        if k.endswith("_token"):
            continue
        tok = where.get(f"{k}_token")
        parts.append(f"{k} {v}" + ("" if tok is None else f" {tok!r}"))
    return ", ".join(parts)


def _fmt_heads(heads: list[int], n_heads: int) -> str:
    if len(heads) == n_heads > 1:
        return "all heads"
    return ("head " if len(heads) == 1 else "heads ") + ", ".join(map(str, heads))


def _short(value) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _meta_note(key: str, old, new) -> str:
    """One line per metadata difference; dicts (config, versions) show only the keys that changed."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        changed = [f"{k} {_short(old.get(k))} -> {_short(new.get(k))}"
                   for k in sorted(set(old) | set(new), key=str) if old.get(k) != new.get(k)]
        detail = ", ".join(changed)
    else:
        detail = f"{_short(old)} -> {_short(new)}"
    why = {
        "versions": " (numeric noise may come from the library upgrade)",
        "config": " (a different model: expect differences everywhere)",
    }.get(key, " (other tokens: the text, target or tokenizer changed)")
    return f"note: metadata '{key}' differs: {detail}{why}"


@dataclass
class TraceDiff:
    """Result of comparing two traces: worst differences first, plus new and missing names."""

    diffs: list[NameDiff]
    missing: list[str]  # in the reference, not in the other
    new: list[str]  # in the other, not in the reference
    meta_notes: list[str]
    order: list[str] = field(default_factory=list)  # names in computation order, to find the first to differ
    n_compared: int = 0

    @property
    def equal(self) -> bool:
        return not (self.diffs or self.missing or self.new)

    @property
    def first(self) -> NameDiff | None:
        """The earliest differing name in computation order: where a change starts, not where it peaks."""
        by_name = {d.name: d for d in self.diffs if not d.problem}
        rank = {n: i for i, n in enumerate(self.order)}
        values = sorted(by_name.values(), key=lambda d: rank.get(d.name, len(rank)))
        return values[0] if values else None

    def report(self, top: int = 10) -> str:
        if self.equal:
            return "traces match" + ("" if not self.meta_notes else "\n" + "\n".join(self.meta_notes))
        lines = []
        values = [d for d in self.diffs if not d.problem]
        if values:
            lines.append(f"{len(values)} of {self.n_compared or len(values)} names differ, worst first "
                         f"(a cell differs when |expected - obtained| > atol + rtol * |obtained|):")
            width = min(max(len(d.name) for d in values[:top]), 48)
            for d in values[:top]:
                tol = f"atol {d.atol:g}" + (f", rtol {d.rtol:g}" if d.rtol else "")
                heads = f" in {_fmt_heads(d.heads, d.n_heads)}" if d.heads else ""
                vals = "" if d.expected is None else f": {d.expected:.6g} -> {d.actual:.6g}"
                lines.append(f"  {d.name:<{width}}  max |diff| {d.max_abs:.3g} ({tol}), "
                             f"{d.n_bad}/{d.numel} cells{heads}; worst at {_fmt_where(d.where)}{vals}")
            if len(values) > top:
                lines.append(f"  ... and {len(values) - top} more names differ")
            first = self.first
            if first is not None and self.order:
                at = [f"layer {first.where['layer']}"] if "layer" in first.where else []
                at += [_fmt_heads(first.heads, first.n_heads)] if first.heads else []
                lines.append(f"first to differ in computation order: {first.name}"
                             + (f" ({', '.join(at)})" if at else "") + ": the change starts there")
        for d in self.diffs:
            if d.problem:
                lines.append(f"{d.problem} changed: {d.name} {d.where['expected']} -> {d.where['actual']}")
        for label, names in (("missing names", self.missing), ("new names", self.new)):
            if names:
                whose = "expected but not obtained" if names is self.missing else "obtained but not expected"
                more = " ..." if len(names) > 10 else ""
                lines.append(f"{label} ({len(names)}, {whose}): {', '.join(names[:10])}{more}")
        return "\n".join(self.meta_notes + lines)  # notes first: a changed input or model explains the rest


META_KEYS = ("config", "versions", "src_tokens", "tgt_tokens", "src_ids", "tgt_ids")


def compare_traces(
    expected: Mapping[str, torch.Tensor],
    actual: Mapping[str, torch.Tensor],
    atol: float | Mapping[str, float] = 1e-5,
    rtol: float | Mapping[str, float] = 0.0,
    meta: Mapping | None = None,
) -> TraceDiff:
    """Compare two traces name by name; report each differing name's worst cell, worst first.

    atol/rtol may be dicts mapping a name to its tolerance (callers resolve globs).
    Integer and bool tensors (masks, ids) are always compared exactly.
    Two lazy traces whose attention modules have the same switches (scale, soft-cap, window) compare
    their stored tensors only: every computed one is the same function of those (a 2,048-token trace
    would otherwise build each module's T × T maps)."""
    meta = meta if meta is not None else getattr(expected, "meta", None)
    diffs: list[NameDiff] = []
    common = [n for n in expected if n in actual]
    if (isinstance(expected, LazyTrace) and isinstance(actual, LazyTrace)
            and expected.meta["lazy"]["modules"] == actual.meta["lazy"]["modules"]):
        stored = set(expected.stored()) & set(actual.stored())
        common = [n for n in common if n in stored]
    for name in common:
        a, b = expected[name], actual[name]
        if tuple(a.shape) != tuple(b.shape):
            shapes = {"expected": list(a.shape), "actual": list(b.shape)}
            diffs.append(NameDiff(name, math.inf, shapes, "shape"))
            continue
        if a.dtype != b.dtype:
            diffs.append(NameDiff(name, math.inf, {"expected": str(a.dtype).removeprefix("torch."),
                                                   "actual": str(b.dtype).removeprefix("torch.")}, "dtype"))
            continue
        if a.numel() == 0:
            continue
        at = atol[name] if isinstance(atol, Mapping) else atol
        rt = rtol[name] if isinstance(rtol, Mapping) else rtol
        if a.dtype == torch.bool or not a.is_floating_point():
            at = rt = 0.0
            a64, b64 = a.to(torch.float64), b.to(torch.float64)
            bad = a != b
            err = (a64 - b64).abs()
        else:
            a64, b64 = a.to(torch.float64), b.to(torch.float64)
            err = (a64 - b64).abs()
            nan_mismatch = a64.isnan() != b64.isnan()
            err = torch.where(a64.isnan() & b64.isnan(), torch.zeros_like(err), err)
            err = torch.where(nan_mismatch, torch.full_like(err, math.inf), err)
            bad = err > at + rt * b64.abs()
        if bool(bad.any()):
            flat = int(torch.where(bad, err, torch.zeros_like(err)).flatten().argmax())
            where = locate(name, tuple(a.shape), flat, meta)
            axes = _axes(name, a.dim())
            if axes[0] == "batch" and a.shape[0] == 1:  # "batch 0" of a batch of one is noise in a report
                del where["batch"]
            heads, n_heads = None, 0
            if "head" in axes and a.shape[axes.index("head")] > 1:  # which heads changed: the actionable part
                h = axes.index("head")
                n_heads = a.shape[h]
                heads = [i for i, x in enumerate(bad.transpose(0, h).flatten(1).any(1).tolist()) if x]
            diffs.append(NameDiff(name, float(err.flatten()[flat]), where, n_bad=int(bad.sum()),
                                  numel=a.numel(), heads=heads, n_heads=n_heads, atol=at, rtol=rt,
                                  expected=float(a64.flatten()[flat]), actual=float(b64.flatten()[flat])))
    diffs.sort(key=lambda d: -d.max_abs)
    notes = []
    ma, mb = getattr(expected, "meta", {}) or {}, getattr(actual, "meta", {}) or {}
    for key in META_KEYS:
        if key.endswith("_ids") and key.replace("_ids", "_tokens") in ma:
            continue  # the token strings say the same, readably
        if key in ma and key in mb and ma[key] != mb[key]:
            notes.append(_meta_note(key, ma[key], mb[key]))
    return TraceDiff(
        diffs,
        missing=[n for n in expected if n not in actual],
        new=[n for n in actual if n not in expected],
        meta_notes=notes,
        order=list(actual),  # a trace keeps its names in computation order (run_with_trace, save/load)
        n_compared=len(common),
    )


# ---------------------------------------------------------------- lazy traces (long inputs)

LAZY_ROLES = ("scores", "scores_capped", "mask", "weights", "sink", "z")  # computed from q, k, v when asked


def _serves(role: str, params: Mapping) -> bool:
    """Whether a lazy module gives `role`: the capped scores only with a soft-cap, the sink only with sinks."""
    return ((role != "scores_capped" or params.get("softcap") is not None)
            and (role != "sink" or bool(params.get("sinks"))))


def _sinks(params: Mapping, like: torch.Tensor) -> torch.Tensor | None:
    """A module's learned sink logits (gpt-oss) as a tensor of the scores' dtype, or None."""
    s = params.get("sinks")
    return None if not s else torch.tensor(s, dtype=like.dtype, device=like.device)
STORED_ROLES = ("q", "k", "v")  # O(T·d) per layer: what a lazy trace keeps of each attention module


def _is_lazy(tensors: Mapping, meta: Mapping) -> bool:
    """A LazyTrace's file: meta["lazy"] names its modules, and their q, k, v are all there (a trace
    materialized from a lazy one, e.g. by the snapshot plugin, keeps the meta but maybe not q, k, v)."""
    lazy = meta.get("lazy")
    if not isinstance(lazy, Mapping) or not isinstance(lazy.get("modules"), Mapping) or not lazy["modules"]:
        return False
    return all(f"{m}.{r}" in tensors for m in lazy["modules"] for r in STORED_ROLES)


class LazyTrace(Trace):
    """A trace that grows like T, not T²: per attention module it stores q (after RoPE), k and v (the
    model's own K/V heads), and computes `.scores`, `.mask`, `.weights` and `.z` (and `masks.causal`)
    when they are asked for, with the forward's own functions (attention.attention_scores,
    attention_weights), so `trace[name]` is what `run_with_trace(names=None)` records, bit for bit
    when the forward ran step by step.

        trace["decoder.layers.17.self_attn.weights"]     # [B, H, T, T], refused over budget_bytes
        trace.attention(17, head=3, rows=slice(100, 200)) # [100, T]: one head's rows, cheap
        trace.row(17, position=-1)                        # [H, T]: where the last position looks

    meta["lazy"] = {"modules": {module: {"scale", "window"}}, "names": every name in computation
    order (stored and computed), "budget_bytes": the largest tensor one __getitem__ may build,
    "layers": {layer: its input's name} (run_with_trace(lazy=True, layers=True))}.

    With "layers", each layer's output is stored too, and any other tensor of a layer (its norms, FFN,
    residual steps) is computed by running that one layer again on its stored input, which needs the
    model: `attach(model)` (run_with_trace attaches it). The last LAYERS_KEPT layers run are kept.
    Saved with `save`, it holds the stored tensors and meta; `Trace.load` gives a LazyTrace back
    (without a model: a layer's other tensors are then not in it)."""

    LAYERS_KEPT = 2  # a SmolLM2 layer's tensors at 2,048 tokens: ~80 MB

    def __init__(self, tensors: Mapping[str, torch.Tensor], meta: Mapping | None = None):
        super().__init__(tensors, meta)
        lazy = self._meta["lazy"]
        self._modules: dict[str, dict] = lazy["modules"]
        self._order: list[str] = lazy["names"]
        self.budget_bytes: int | None = lazy.get("budget_bytes")
        self._served = {f"{m}.{r}" for m, p in self._modules.items() for r in LAZY_ROLES if _serves(r, p)}
        if self._modules:
            self._served.add("masks.causal")
        if self._window() and "masks.sliding" in self._order:
            self._served.add("masks.sliding")
        self._served -= set(self._tensors)
        self._inputs: dict[str, str] = dict(lazy.get("layers") or {})
        self._again = {n for n in self._order if n.startswith(tuple(f"{m}." for m in self._inputs))}
        self._again -= set(self._tensors) | self._served
        self._model = None
        self._ran: OrderedDict[str, dict] = OrderedDict()  # layer -> its tensors, last run last
        self._lock = threading.Lock()

    def attach(self, model) -> LazyTrace:
        """Give the model that made this trace (the same weights), so that a layer's tensors not stored
        can be computed by running the layer again. Returns self."""
        self._model = model
        return self

    # ---- the Mapping: stored names and computed ones, in computation order

    def __contains__(self, name) -> bool:  # never compute to answer `in`
        return name in self._tensors or name in self._served or (self._model is not None and name in self._again)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def names(self) -> list[str]:
        return [n for n in self._order if n in self]

    def stored(self) -> list[str]:
        """The names this trace holds (the rest is computed when asked)."""
        return list(self._tensors)

    def __repr__(self) -> str:
        again = len(self._again) if self._model is not None else 0
        return (f"LazyTrace({len(self._tensors)} stored names, {self.nbytes() / 2**20:.2f} MiB; "
                f"{len(self._served) + again} computed on demand)")

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self._again and self._model is not None:
            return self._layer_tensors(name)[name]
        if name in self._tensors or name not in self._served:
            return super().__getitem__(name)
        T = self.n_tokens
        if name in ("masks.causal", "masks.sliding"):
            from model.core.attention import causal_mask

            return causal_mask(T, window=self._window() if name == "masks.sliding" else None)
        module, role = name.rsplit(".", 1)
        q = self._tensors[f"{module}.q"]
        B, H = q.shape[:2]
        if role == "sink":  # (B, H, T): O(T), computed a block of rows at a time
            return self._sink(module)
        cells = B * (1 if role == "mask" else H) * T * T
        self._check_budget(cells * (1 if role == "mask" else q.element_size()), name)
        return self._compute(module, role)

    # ---- accessors for pages: one head, one row, one tile

    @property
    def n_tokens(self) -> int:
        return self._tensors[f"{next(iter(self._modules))}.q"].shape[2]

    def module(self, layer: int | str) -> str:
        """The attention module of a layer index (its position in computation order) or a module name."""
        if isinstance(layer, str):
            if layer not in self._modules:
                raise KeyError(f"{layer!r} is not an attention module of this trace: {list(self._modules)}")
            return layer
        mods = list(self._modules)
        if not -len(mods) <= int(layer) < len(mods):
            raise IndexError(f"layer {layer} is out of range: this trace has {len(mods)} attention modules")
        return mods[int(layer)]

    def n_heads(self, layer: int | str = 0) -> int:
        return self._tensors[f"{self.module(layer)}.q"].shape[1]

    def attention(self, layer: int | str, head: int | None = None, rows: slice | int | None = None,
                  cols: slice | None = None, what: str = "weights", batch: int = 0) -> torch.Tensor:
        """One head's (or, head=None, every head's) attention over a block of query rows and key
        columns: [rows, cols] (or [H, rows, cols]). what: "weights" (softmax, each full row sums to 1)
        or "scores" (before masking). Rows are computed over all keys, so a tile's weights equal the
        whole matrix's cells (≤ 1e-6; bit for bit where the matmul kernel agrees)."""
        from model.core.attention import attention_weights

        module = self.module(layer)
        T = self.n_tokens
        rows = slice(rows, rows + 1 if rows != -1 else None) if isinstance(rows, int) else (rows or slice(None))
        r0, r1, _ = rows.indices(T)
        c0, c1, _ = (cols or slice(None)).indices(T)
        # Causal: rows r0..r1-1 see keys 0..r1-1 only, so keys past max(r1, c1) are never needed (a blocked
        # key adds exactly 0 to the softmax's sum; the result may differ from the full row in the last bit).
        n_keys = max(r1, c1) if what == "weights" else c1
        q = self._tensors[f"{module}.q"][batch:batch + 1, :, r0:r1]  # (1, H, R, hs)
        k = self._tensors[f"{module}.k"][batch:batch + 1, :, :n_keys]  # (1, H_kv, n_keys, hs)
        H, Hkv = q.shape[1], k.shape[1]
        if head is not None:
            if not 0 <= head < H:
                raise IndexError(f"head {head} is out of range: {module} has {H} heads")
            q, k = q[:, head:head + 1], k[:, head // (H // Hkv):head // (H // Hkv) + 1]
        elif Hkv != H:
            k = k.repeat_interleave(H // Hkv, dim=1)
        params = self._modules[module]
        if what not in ("weights", "scores"):
            raise ValueError(f"what must be 'weights' or 'scores', got {what!r}")
        scores = scores_of(q, k, params, capped=what == "weights")  # (1, h, R, n_keys)
        sinks = _sinks(params, scores)
        if sinks is not None and head is not None:
            sinks = sinks[head:head + 1]
        out = scores if what == "scores" else attention_weights(scores, self._mask_rows(module, slice(r0, r1),
                                                                                        n_keys), sinks)
        out = out[0, :, :, c0:c1]
        return out[0] if head is not None else out

    def row(self, layer: int | str, position: int = -1, head: int | None = None, batch: int = 0) -> torch.Tensor:
        """Where one query position looks: [T] for one head, [H, T] for all (weights)."""
        position = position % self.n_tokens
        return self.attention(layer, head, slice(position, position + 1), batch=batch)[..., 0, :]

    def modules(self) -> list[str]:
        return list(self._modules)

    def materialize(self, names: str | list[str] | None = None) -> Trace:
        """A plain Trace with the computed names filled in (short inputs: it is O(T²))."""
        from model.core.recorder import select_names

        chosen = select_names(self.names(), names)
        meta = {k: v for k, v in self._meta.items() if k != "lazy"}
        return Trace({n: self[n] for n in chosen}, meta)

    # ---- internals

    def _window(self) -> int | None:
        """The sliding window of the model's local layers (None: no local layer)."""
        return next((p["window"] for p in self._modules.values() if p.get("window")), None)

    def _layer_tensors(self, name: str) -> dict[str, torch.Tensor]:
        """The tensors of the layer holding `name`, from running it again on its stored input (single
        flight: sessions sharing this trace wait for one run)."""
        layer = next(m for m in self._inputs if name.startswith(m + "."))
        with self._lock:
            if layer not in self._ran:
                wanted = {n for n in self._again if n.startswith(layer + ".")}
                x = self._tensors[self._inputs[layer]]
                i = int(layer.rsplit(".", 1)[1])
                self._ran[layer] = self._model.run_layer(i, x, wanted, fast=bool(self._meta.get("fast_attention")))
                while len(self._ran) > self.LAYERS_KEPT:
                    self._ran.popitem(last=False)
            self._ran.move_to_end(layer)
            return self._ran[layer]

    def _check_budget(self, n_bytes: int, name: str) -> None:
        from model.core.recorder import CaptureBudgetError

        if self.budget_bytes is None or n_bytes <= self.budget_bytes:
            return
        T, per_cell = self.n_tokens, n_bytes / self.n_tokens ** 2
        fit = int(math.isqrt(int(self.budget_bytes / per_cell)))
        raise CaptureBudgetError(
            f"{name} at {T} tokens is {n_bytes / 2**20:.1f} MiB, over this trace's budget of "
            f"{self.budget_bytes / 2**20:.1f} MiB (it fits up to {fit} tokens): ask for one head, one row "
            f"or one tile with trace.attention(layer, head, rows, cols)", needed_bytes=n_bytes,
            budget=self.budget_bytes, n_tokens=T, max_tokens=fit,
            context_length=(self._meta.get("config") or {}).get("max_len"))

    def _mask_rows(self, module: str, rows: slice, n_keys: int | None = None) -> torch.Tensor:
        """(1, 1, R, n_keys) bool, True = blocked: the look-ahead mask of these query rows over keys
        0..n_keys-1 (default all), + a sliding window."""
        from model.core.attention import causal_mask

        T = self.n_tokens
        n_keys = T if n_keys is None else n_keys
        r0, r1, _ = rows.indices(T)
        mask = causal_mask(r1 - r0, n_keys, offset=r0)
        window = self._modules[module].get("window")
        if window:  # a key more than `window - 1` positions back is out of the window
            i = torch.arange(r0, r1)[:, None]
            mask = mask | (torch.arange(n_keys)[None] <= i - window)
        return mask[None, None]

    def _sink(self, module: str, cells: int = 1 << 22) -> torch.Tensor:
        """`<module>.sink` (B, H, T): each query row's weight on gpt-oss's learned sink, rows computed in blocks
        (no (H, T, T) tensor), with the forward's sink_softmax on the forward's scores: the same bits."""
        from model.core.attention import sink_softmax

        q, k = self._tensors[f"{module}.q"], self._tensors[f"{module}.k"]
        B, H, T, _ = q.shape
        r = H // k.shape[1]
        k = k.repeat_interleave(r, dim=1) if r != 1 else k
        params = self._modules[module]
        sinks = _sinks(params, q)
        out, rows = [], max(1, cells // (B * H * T))
        for a in range(0, T, rows):
            b = min(T, a + rows)
            mask = self._mask_rows(module, slice(a, b)).expand(B, 1, b - a, T)
            out.append(sink_softmax(scores_of(q[:, :, a:b], k, params, capped=False), mask, sinks)[1])
        return torch.cat(out, dim=2)

    def _compute(self, module: str, role: str) -> torch.Tensor:
        """A whole module's tensor, exactly as MultiHeadAttention.forward computes it."""
        from model.core.attention import attention_weights

        q, k = self._tensors[f"{module}.q"], self._tensors[f"{module}.k"]
        B, H, T, _ = q.shape
        mask = self._mask_rows(module, slice(0, T)).expand(B, 1, T, T)
        if role == "mask":
            return mask
        r = H // k.shape[1]
        if r != 1:
            k = k.repeat_interleave(r, dim=1)
        params = self._modules[module]
        scores = scores_of(q, k, params, capped=False)
        if role == "scores":
            return scores
        if params.get("softcap") is not None:
            from model.core.attention import softcap

            scores = softcap(scores, params["softcap"])
            if role == "scores_capped":
                return scores
        sinks = _sinks(params, scores)
        if sinks is not None:
            from model.core.attention import sink_softmax

            weights, sink = sink_softmax(scores, mask, sinks)
            if role == "sink":
                return sink
        else:
            weights = attention_weights(scores, mask)
        if role == "weights":
            return weights
        v = self._tensors[f"{module}.v"]
        return weights @ (v.repeat_interleave(r, dim=1) if r != 1 else v)  # z


def recompute_params(info: Mapping, module=None) -> dict:
    """{"scale", "softcap", "window"} (+ "sinks", gpt-oss's learned logits per head, where the module has them) of
    an attention module as its forward uses them: the module's own switches when the module is given (scale None =
    divide by √d_head, as the forward does), else its description entry (a "scale" equal to 1/√d_head is that same
    division)."""
    window = info.get("window")
    if module is not None:
        out = {"scale": getattr(module, "scale", None), "softcap": getattr(module, "softcap", None),
               "window": window}
        sinks = getattr(module, "sinks", None)
        if sinks is not None:
            out["sinks"] = [float(v) for v in sinks.detach().float().cpu()]
        return out
    scale = info.get("scale")
    if scale is not None and math.isclose(scale, info["d_head"] ** -0.5, rel_tol=1e-12):
        scale = None
    out = {"scale": scale, "softcap": info.get("softcap"), "window": window}
    if info.get("sinks"):
        out["sinks"] = list(info["sinks"])
    return out


def scores_of(q: torch.Tensor, k: torch.Tensor, params: Mapping, capped: bool = True) -> torch.Tensor:
    """The forward's scores (attention.attention_scores), soft-capped as the forward does when the module
    caps them (Gemma 2) and `capped`."""
    from model.core.attention import attention_scores

    s = attention_scores(q, k, params.get("scale"))
    if capped and params.get("softcap") is not None:
        from model.core.attention import softcap

        s = softcap(s, params["softcap"])
    return s


def last_row(q: torch.Tensor, k: torch.Tensor, params: Mapping) -> torch.Tensor:
    """Where the newest position looks, from its query q (H, hs) and every key k (H_kv, T, hs) (a KV
    cache): softmax over keys of attention_scores, [H, T]; keys out of a sliding window get 0."""
    from model.core.attention import attention_weights

    H, (Hkv, T, hs) = q.shape[0], k.shape
    qg = q.reshape(Hkv, H // Hkv, hs)[None]  # (1, H_kv, r, hs): a K/V head's query heads together
    scores = scores_of(qg, k[None], params)  # (1, H_kv, r, T), no K/V copy
    mask = None
    if params.get("window"):
        mask = (torch.arange(T) <= T - 1 - params["window"])[None, None, None]
    sinks = _sinks(params, scores)  # (H,) -> per K/V group (H_kv, r), as the query heads are grouped here
    if sinks is not None:
        from model.core.attention import sink_softmax

        return sink_softmax(scores.reshape(1, H, 1, T), mask, sinks)[0].reshape(H, T)
    return attention_weights(scores, mask).reshape(H, T)


def lazy_plan(shapes: Mapping[str, tuple], attention: Mapping[str, Mapping], names, hooked: set[str],
              modules: Mapping | None = None, layers: Sequence[str] = ()) -> tuple[list[str], dict[str, dict]]:
    """What a lazy trace stores and which attention modules it serves on demand.

    shapes: every capture name -> shape (computation order); attention: the model description's
    attention entries (self-attention ones are served lazily); names: globs of extra O(T·d) names to
    store (None: none); hooked: capture names with a hook; modules: name -> the attention module (its
    own switches: scale, softcap). A module whose scores/mask/weights/z are
    hooked cannot be recomputed from q, k, v (the hook changed them): it is stored whole.
    layers: the decoder layers a model can run again (`DecoderLM.run_layer`): each one's output is
    stored, and so is every O(T·d) name outside the layers (embeddings, RoPE angles, the final norm)."""
    from model.core.recorder import select_names

    extra = set(select_names(list(shapes), names)) if names is not None else set()
    if layers:
        extra |= {f"{m}.out" for m in layers}
        extra |= {n for n in shapes if not n.startswith(tuple(f"{m}." for m in layers))
                  and not n.startswith(("masks.", "logits"))}  # T² and T × vocab: never stored
    modules = modules or {}
    lazy: dict[str, dict] = {}
    stored: set[str] = set()
    for m, info in attention.items():
        inside = {f"{m}.{r}" for r in LAZY_ROLES}
        if info.get("kind") == "cross" or inside & hooked:  # not recomputed from q, k, v
            stored |= {n for n in shapes if n.startswith(m + ".")} & (inside | {f"{m}.{r}" for r in STORED_ROLES})
            continue
        lazy[m] = recompute_params(info, modules.get(m))
        stored |= {f"{m}.{r}" for r in STORED_ROLES}
        extra -= inside
    extra.discard("masks.causal")
    return [n for n in shapes if n in stored | extra], lazy


def layer_inputs(model) -> dict[str, str]:
    """{decoder layer: the capture name of its input} for a model that can run one layer again
    (`run_layer`): layer 0 reads decoder.embed.out, layer i layer i-1's output. {} for any other model."""
    if not hasattr(model, "run_layer"):
        return {}
    n = model.cfg.n_layers
    return {f"decoder.layers.{i}": "decoder.embed.out" if i == 0 else f"decoder.layers.{i - 1}.out" for i in range(n)}


def run_lazy(model, ids: torch.Tensor, names=None, hooks=None, budget_bytes: int | None = None,
             meta: dict | None = None, fast: bool = False, last_only: bool = False, layers: bool = False
             ) -> tuple[torch.Tensor, LazyTrace]:
    """`model.run_with_trace(ids, lazy=True)`: one forward pass that keeps q, k, v of every attention
    module (+ the O(T·d) names in `names`), under `recorder.fast_attention()` when `fast`; last_only: the
    logits of the last position only (a long input's [T, vocab] logits outweigh its whole trace). Refused
    before running, with numbers (CaptureBudgetError), when even that is over `budget_bytes`.
    layers=True (no hooks): also each layer's output and the names outside the layers, so that every
    other tensor of a layer is given on demand by running that layer again (LazyTrace.attach)."""
    from model.core import recorder

    model._check_ids(ids, 0)
    B, T = ids.shape
    shapes = model.capture_names(B, T)
    resolved = model.resolve_hooks(hooks)
    desc = model.describe()
    mods = dict(model.named_modules())
    mods = {m: mods[m] for m in desc["attention"] if m in mods}
    inputs = layer_inputs(model) if layers and not resolved else {}  # a hooked run cannot be re-run by a layer
    wanted, lazy = lazy_plan(shapes, desc["attention"], names, set(resolved), mods, list(inputs))
    itemsize = next(model.parameters()).element_size()
    n_bytes = recorder.estimate_bytes(shapes, wanted, itemsize)
    if budget_bytes is not None and n_bytes > budget_bytes:
        lo, hi = 0, T  # the longest input whose lazy trace fits (sizes grow with T)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            s = model.capture_names(B, mid)
            w, _ = lazy_plan(s, desc["attention"], names, {n for n in s if n in resolved}, mods, list(inputs))
            lo, hi = (mid, hi) if recorder.estimate_bytes(s, w, itemsize) <= budget_bytes else (lo, mid - 1)
        raise recorder.CaptureBudgetError(
            f"a lazy trace of {T} tokens needs about {n_bytes / 2**20:.1f} MiB, over the budget of "
            f"{budget_bytes / 2**20:.1f} MiB; up to {lo} tokens fit", needed_bytes=n_bytes, budget=budget_bytes,
            n_tokens=T, max_tokens=lo, context_length=getattr(model.cfg, "max_len", None))
    with (recorder.hooking(resolved), recorder.fast_attention(fast),
          recorder.capturing(set(wanted), n_bytes + 64 * len(wanted)) as rec):
        out = model(ids, last_only=True) if last_only else model(ids)
    served = {f"{m}.{r}" for m, p in lazy.items() for r in LAZY_ROLES if _serves(r, p)} | (
        {"masks.causal"} if lazy else set())
    served |= {"masks.sliding"} if any(p.get("window") for p in lazy.values()) and "masks.sliding" in shapes else set()
    info = {"config": model.cfg.to_dict(), "model": desc, "tgt_ids": ids.tolist(),
            "mask_convention": "True = blocked (attention not allowed)", "training": model.training,
            "dtype": str(out.dtype).removeprefix("torch."), "fast_attention": bool(fast)}
    if hooks:
        info["hooks"] = {p: getattr(fn, "__name__", repr(fn)) if callable(fn) else repr(fn) for p, fn in hooks.items()}
    info.update(meta or {})
    again = {n for n in shapes if n.startswith(tuple(f"{m}." for m in inputs))} - set(rec.tensors) - served
    info["lazy"] = {"modules": lazy, "names": [n for n in shapes if n in rec.tensors or n in served or n in again],
                    "budget_bytes": recorder.DEFAULT_BUDGET_BYTES if budget_bytes is None else budget_bytes,
                    "layers": inputs}
    trace = LazyTrace({n: rec.tensors[n] for n in wanted if n in rec.tensors}, info)
    return out, trace.attach(model) if inputs else trace
