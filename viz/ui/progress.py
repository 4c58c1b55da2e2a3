"""A progress bar with an honest estimate, for the analyses that cannot be fast (issue 26 §3).

The estimate before a run comes from what this server measured (model/analysis/shared.py: tokens forwarded
per second by its batched analyses); during the run, from the run's own pace. Never a fixed "about half a
minute" written on a faster machine.
"""

from __future__ import annotations

import time

import streamlit as st

from viz.i18n import t


def estimate_text(seconds: float | None) -> str:
    """"about 12 s", "about 2 min", or "time unknown yet" before anything was measured on this server."""
    if seconds is None:
        return t("time not measured yet on this server")
    if seconds < 1.5:
        return t("about a second")
    if seconds < 90:
        return t("about {s} s", s=int(round(seconds)))
    return t("about {m} min", m=f"{seconds / 60:.0f}")


class ProgressBar:
    """A callable progress(done, total) drawing a bar: "{what}: 64 of 450 runs, about 20 s left"."""

    def __init__(self, what: str, estimate: float | None = None):
        self.what, self.t0 = what, time.perf_counter()
        self.bar = st.progress(0.0, text=t("{what}: {estimate}", what=what, estimate=estimate_text(estimate)))

    def __call__(self, done: int, total: int) -> None:
        elapsed = time.perf_counter() - self.t0
        left = elapsed / done * (total - done) if done else None
        self.bar.progress(min(1.0, done / max(total, 1)), text=t(
            "{what}: {done} of {total} runs, {left} left", what=self.what, done=done, total=total,
            left=estimate_text(left)))

    def close(self) -> None:
        self.bar.empty()
