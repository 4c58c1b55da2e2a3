"""pytest plugin: pin a model's captured tensors in a test. Installed with the package (entry point pytest11).

    def test_dates_cross_attention(trace_snapshot):
        _, trace = load_checkpoint("dates").trace("3 november 2023", names="*.cross_attn.weights")
        trace_snapshot.check(trace)

The first run fails and says how to create the snapshot: `pytest --update-trace-snapshots`
writes `__snapshots__/<test name>.safetensors` beside the test file. Later runs compare with
tolerances by kind (`model.diff.DEFAULT_TOLERANCES`); a difference fails with a report (which
names, where: layer, head, query and key tokens) and writes `<test name>.obtained.safetensors`
beside the snapshot, for `python -m model.diff` or the app's Snapshots page.

pytest loads this plugin into every run in an environment where the package is installed, so it
imports nothing heavy at load time: torch and the model load when a test first uses the fixture.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch

    from model.core.trace import Trace
    from model.diff import DEFAULT_TOLERANCES, Tolerance, TolSpec  # noqa: F401  (lazy re-exports, see __getattr__)
    from model.testing.repro import deterministic  # noqa: F401

__all__ = ["DEFAULT_TOLERANCES", "Tolerance", "TraceSnapshot", "TraceSnapshotError", "deterministic",
           "snapshot_stem"]
_LAZY = {"DEFAULT_TOLERANCES": "model.diff", "Tolerance": "model.diff", "deterministic": "model.testing.repro"}


def __getattr__(name: str):
    """The re-exported names, imported on first use (PEP 562): loading the plugin stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

SNAPSHOT_DIR = "__snapshots__"
UPDATE_FLAG = "--update-trace-snapshots"
_STATS = pytest.StashKey[Counter]()


class TraceSnapshotError(AssertionError):
    """A trace snapshot is missing, unreadable, or differs from the obtained trace."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("trace-snapshot").addoption(
        UPDATE_FLAG, action="store_true", default=False,
        help="write missing trace snapshots and refresh the ones that differ (__snapshots__/*.safetensors)")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_STATS] = Counter()


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    stats = config.stash.get(_STATS, Counter())
    if not (stats.keys() - {"passed"}):  # all passed: nothing to say
        return
    done = ", ".join(f"{n} {what}" for what, n in sorted(stats.items()) if what != "failed")
    line = f"trace snapshots: {done}" if done else "trace snapshots:"
    if stats["failed"]:
        line += (f"{',' if done else ''} {stats['failed']} failed (obtained traces written beside the "
                 f"snapshots; review, then accept with {UPDATE_FLAG})")
    terminalreporter.write_line(line)


_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def snapshot_stem(nodeid: str) -> str:
    """A safe, unique file stem for a test: "tests/t.py::TestA::test_x[a b-1]" -> "TestA.test_x-a_b-1-<hash>".

    Parameters follow a "-"; characters a file name cannot hold become "_", and then a short hash of
    the test id keeps two ids apart that would otherwise map to one name.
    """
    name = nodeid.split("::", 1)[-1].replace("::", ".")
    base, bracket, params = name.partition("[")
    readable = base + ("-" + params.removesuffix("]") if bracket else "")
    stem = _UNSAFE.sub("_", readable)
    if stem != readable or len(stem) > 120:
        stem = f"{stem[:100]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return stem


def _relative(path: Path, root: Path) -> str:
    try:
        return os.path.relpath(path, root)
    except ValueError:  # another drive (Windows)
        return str(path)


class TraceSnapshot:
    """The `trace_snapshot` fixture: `check(trace)` compares with (or, when updating, writes) a snapshot."""

    def __init__(self, directory: Path, nodeid: str, update: bool, stats: Counter, root: Path):
        self.directory, self.nodeid, self.update = directory, nodeid, update
        self._stats, self._root = stats, root
        self._used: set[str] = set()

    def path(self, name: str | None = None) -> Path:
        """The snapshot file of this test (`name` tells several snapshots of one test apart)."""
        stem = snapshot_stem(self.nodeid) + ("" if name is None else "." + _UNSAFE.sub("_", name))
        return self.directory / f"{stem}.safetensors"

    def obtained_path(self, name: str | None = None) -> Path:
        return self.path(name).with_suffix(".obtained.safetensors")

    def check(
        self,
        trace: Mapping[str, torch.Tensor],
        *,
        tolerances: Mapping[str, TolSpec] | None = None,
        names: str | Sequence[str] | None = None,
        name: str | None = None,
    ) -> None:
        """Compare `trace` (a Trace or a dict of tensors) with this test's snapshot.

        tolerances: {name glob: atol | (atol, rtol) | {"atol":..., "rtol":...}} over the defaults by
            kind; the last matching glob wins; integer and bool tensors stay exact.
        names: globs of the names to pin (default: all in the trace).
        name: a label, for a test that checks more than one trace.
        """
        __tracebackhide__ = True
        from model.core.trace import Trace, TraceFileError
        from model.diff import compare

        key = name or ""
        if key in self._used:
            raise ValueError("this test already checked a trace under that name: pass check(..., name='...') "
                             "to keep each snapshot apart")
        if name == "obtained":
            raise ValueError("name='obtained' is reserved for the obtained-trace files")
        self._used.add(key)
        obtained = self._prepare(trace, names, tolerances)
        path, obtained_path = self.path(name), self.obtained_path(name)
        rel = lambda p: _relative(p, self._root)
        expected, unreadable = None, None
        if path.exists():
            try:
                expected = Trace.load(path)
            except TraceFileError as e:
                unreadable = str(e)
        diff = None if expected is None else compare(expected, obtained, tolerances)

        if self.update:
            if diff is not None and diff.equal:  # within tolerance: keep the file (no churn in git)
                self._stats["unchanged"] += 1
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                obtained.save(path)
                self._stats["written" if expected is None and unreadable is None else "updated"] += 1
            obtained_path.unlink(missing_ok=True)
            return
        if diff is not None and diff.equal:
            obtained_path.unlink(missing_ok=True)  # a leftover from an earlier failure
            self._stats["passed"] += 1
            return

        self._stats["failed"] += 1
        obtained_path.parent.mkdir(parents=True, exist_ok=True)
        obtained.save(obtained_path)
        accept = f"pytest {UPDATE_FLAG} {shlex.quote(self.nodeid)}"
        if unreadable is not None:
            raise TraceSnapshotError(
                f"trace snapshot {rel(path)} is unreadable: {unreadable}\n"
                f"To recreate it from this run: {accept}")
        if diff is None:
            raise TraceSnapshotError(
                f"no trace snapshot for this test yet: {rel(path)}\n"
                f"Create it (then review and commit it): {accept}\n"
                f"This run's trace ({len(obtained)} names) is in {rel(obtained_path)}")
        raise TraceSnapshotError(
            f"trace differs from the snapshot {rel(path)}\n{diff.report(top=15)}\n"
            f"The obtained trace is in {rel(obtained_path)}: inspect with "
            f"`python -m model.diff {shlex.quote(rel(path))} {shlex.quote(rel(obtained_path))}` "
            f"or the app's Snapshots page.\nIf the change is intended, accept it: {accept}")

    def _prepare(self, trace: Mapping[str, torch.Tensor], names, tolerances) -> Trace:
        """Validate and select what to pin; record the test and its tolerance overrides in the meta."""
        __tracebackhide__ = True
        import torch

        from model.core.recorder import select_names
        from model.core.trace import Trace
        from model.diff import as_tolerance, resolve_tolerances

        if not isinstance(trace, Mapping) or not all(isinstance(v, torch.Tensor) for v in trace.values()):
            raise TypeError("trace_snapshot.check takes a Trace or a dict of name -> torch.Tensor")
        meta = trace.meta if isinstance(trace, Trace) else {}
        if meta.get("training") and (meta.get("config") or {}).get("dropout", 0) > 0:
            raise ValueError("this trace was captured in training mode, where dropout makes it random: call "
                             "model.eval() first (or capture inside model.testing.repro.deterministic(model))")
        odd = sorted({str(v.dtype) for v in trace.values()
                      if v.is_floating_point() and v.dtype != torch.float32})
        if odd:
            raise ValueError(f"snapshots are float32, this trace has {odd}: capture with model.float() "
                             "(or inside model.testing.repro.deterministic(model))")
        chosen = select_names(list(trace), names)
        overrides = {glob: list(as_tolerance(spec)) for glob, spec in (tolerances or {}).items()}
        resolve_tolerances(chosen, tolerances)  # fail early on a pattern that matches nothing
        if "versions" not in meta:  # a plain dict: still record what produced it
            from model.families.transformer import _versions

            meta["versions"] = _versions()
        meta["snapshot"] = {"test": self.nodeid, "tolerances": overrides}
        return Trace({n: trace[n] for n in chosen}, meta)


@pytest.fixture
def trace_snapshot(request: pytest.FixtureRequest):
    """Snapshot tests of captured tensors; the test runs in `deterministic()` (1 thread, float32, seeded)."""
    config = request.config
    snap = TraceSnapshot(
        directory=Path(request.node.path).parent / SNAPSHOT_DIR,
        nodeid=request.node.nodeid,
        update=config.getoption("update_trace_snapshots"),
        stats=config.stash.setdefault(_STATS, Counter()),
        root=Path(config.rootpath),
    )
    from model.testing.repro import deterministic

    with deterministic():
        yield snap
