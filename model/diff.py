"""Compare traces with tolerances by kind; `python -m model.diff EXPECTED OBTAINED` prints the report.

Exit status: 0 the traces match, 1 they differ, 2 a file is unreadable (or bad arguments).
The tolerance rules here are the ones the pytest plugin (`model.testing.snapshot`) uses.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import torch

from model.core.trace import Trace, TraceDiff, TraceFileError, compare_traces


class Tolerance(NamedTuple):
    """A cell differs when |expected - obtained| > atol + rtol * |obtained|."""

    atol: float
    rtol: float = 0.0


EXACT = Tolerance(0.0, 0.0)

# By kind, as globs; the last matching rule wins. Integer and bool tensors are always exact.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "*": Tolerance(1e-5, 1e-4),  # activations: float32 noise scales with magnitude
    # softmax weights live in [0, 1]; float32 kernels of two CPUs (AVX2 vs AVX-512) differ by a few 1e-6
    "*.weights": Tolerance(1e-5),
    "logits": Tolerance(1e-4),  # the sum of a long matmul: the most accumulated noise
    "masks.*": EXACT,
    "*.mask": EXACT,
}

TolSpec = float | tuple[float, float] | Tolerance | Mapping[str, float]


def as_tolerance(spec: TolSpec) -> Tolerance:
    """A number is an absolute tolerance; a pair is (atol, rtol); a dict has keys atol/rtol."""
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"atol", "rtol"}
        if unknown:
            raise ValueError(f"a tolerance dict takes the keys atol and rtol, not {sorted(unknown)}")
        tol = Tolerance(float(spec.get("atol", 0.0)), float(spec.get("rtol", 0.0)))
    elif isinstance(spec, int | float):
        tol = Tolerance(float(spec))
    else:
        tol = Tolerance(*map(float, spec))
    if tol.atol < 0 or tol.rtol < 0:
        raise ValueError(f"tolerances must be >= 0, got {tol}")
    return tol


def resolve_tolerances(names: Iterable[str],
                       overrides: Mapping[str, TolSpec] | None = None) -> dict[str, Tolerance]:
    """Each name's tolerance: the defaults by kind, then the overrides (name globs; the last match wins).

    An override glob that matches no name is an error: a typo must not silently keep the default.
    """
    names = list(names)
    rules = list(DEFAULT_TOLERANCES.items())
    for glob, spec in (overrides or {}).items():
        if not fnmatch.filter(names, glob):
            raise ValueError(f"tolerance pattern {glob!r} matches no name in the trace; "
                             f"names: {', '.join(names)}")
        rules.append((glob, as_tolerance(spec)))
    return {n: next(tol for glob, tol in reversed(rules) if fnmatch.fnmatchcase(n, glob)) for n in names}


def compare(expected: Mapping[str, torch.Tensor], obtained: Mapping[str, torch.Tensor],
            overrides: Mapping[str, TolSpec] | None = None) -> TraceDiff:
    """compare_traces with the tolerances by kind, plus overrides {glob: tolerance}."""
    tols = resolve_tolerances(list(obtained), overrides)
    return compare_traces(expected, obtained, atol={n: t.atol for n, t in tols.items()},
                          rtol={n: t.rtol for n, t in tols.items()})


def recorded_overrides(trace: Trace) -> dict[str, Tolerance]:
    """Tolerance overrides a snapshot test recorded in the trace (so the CLI reaches the same verdict)."""
    raw = (trace.meta.get("snapshot") or {}).get("tolerances") or {}
    return {glob: as_tolerance(spec) for glob, spec in raw.items()}


def _parse_tol(text: str) -> tuple[str, Tolerance]:
    glob, sep, value = text.partition("=")
    try:
        if not sep or not glob:
            raise ValueError
        return glob, as_tolerance(tuple(float(x) for x in value.split(",")))
    except (ValueError, TypeError):
        raise argparse.ArgumentTypeError(f"expected GLOB=ATOL or GLOB=ATOL,RTOL, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model.diff", description=__doc__.split("\n")[0])
    parser.add_argument("expected", help="reference trace (e.g. __snapshots__/test_x.safetensors)")
    parser.add_argument("obtained", help="trace to check (e.g. __snapshots__/test_x.obtained.safetensors)")
    parser.add_argument("--tol", action="append", type=_parse_tol, default=[], metavar="GLOB=ATOL[,RTOL]",
                        help="tolerance for the names matching GLOB (repeatable; the last match wins)")
    parser.add_argument("--top", type=int, default=20, help="how many differing names to list (default 20)")
    args = parser.parse_args(argv)
    try:
        expected, obtained = Trace.load(args.expected), Trace.load(args.obtained)
        overrides = {**recorded_overrides(obtained), **dict(args.tol)}
        diff = compare(expected, obtained, overrides)
    except (TraceFileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"expected: {args.expected}\nobtained: {args.obtained}\n{diff.report(top=args.top)}")
    return 0 if diff.equal else 1


if __name__ == "__main__":
    sys.exit(main())
