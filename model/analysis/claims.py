"""When may a sentence say that one method "agrees best" or is "ahead"? (issue 31 §1)

A lead is claimed over a set of prompts only when it passes a stated test on that set: the method with the
highest mean score is compared with every other method prompt by prompt (paired), by an exact two-sided sign
test over the prompts where the two differ; the lead holds when every one of those p-values is under
alpha / (number of comparisons) (Bonferroni). Otherwise the sentence says that no method clearly leads.
The paired difference's mean and its 95% t-interval over the prompts are reported beside it (context, not
the test). Pure numpy: no streamlit, no model, no scipy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05
# Student's t, 97.5% quantile, df = 1..30 (scipy.stats.t.ppf(0.975, df), to 4 decimals; tested); past 30 the
# Cornish-Fisher expansion around 1.959964 (error < 1e-4).
T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.306, 2.2622, 2.2281, 2.201, 2.1788, 2.1604,
        2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.093, 2.086, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555,
        2.0518, 2.0484, 2.0452, 2.0423)


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with df degrees of freedom (the 95% two-sided interval's factor)."""
    if df < 1:
        return float("nan")
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959963985
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def sign_test(a: Sequence[float], b: Sequence[float]) -> tuple[int, int, float]:
    """(prompts where a > b, prompts where a < b, exact two-sided sign-test p). Pairs with a nan or a tie drop out."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    ok = ~(np.isnan(a) | np.isnan(b))
    d = a[ok] - b[ok]
    wins, losses = int((d > 0).sum()), int((d < 0).sum())
    n = wins + losses
    if n == 0:
        return wins, losses, 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return wins, losses, min(1.0, 2.0 * tail)


def paired_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float, int]:
    """(mean of a − b, low, high, n): the 95% t-interval of the paired difference over the prompts with both."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    ok = ~(np.isnan(a) | np.isnan(b))
    d = a[ok] - b[ok]
    n = len(d)
    if n == 0:
        return float("nan"), float("nan"), float("nan"), 0
    mean = float(d.mean())
    if n < 2:
        return mean, float("nan"), float("nan"), n
    half = float(t975(n - 1) * d.std(ddof=1) / math.sqrt(n))
    return mean, mean - half, mean + half, n


@dataclass(frozen=True)
class Rival:
    """The top method against one other method, prompt by prompt."""

    method: str
    wins: int  # prompts where the top method scores higher
    losses: int
    p: float  # exact two-sided sign test
    diff: float  # mean paired difference (top − this), and its 95% t-interval
    low: float
    high: float


@dataclass(frozen=True)
class Lead:
    """Which method, if any, clearly leads a prompt set (see the module docstring for the test)."""

    top: str | None  # the highest mean (None: no method has a value)
    means: dict[str, float]
    rivals: list[Rival]  # the top method against each other one, weakest comparison (largest p) first
    alpha: float
    n: int  # prompts in the set

    @property
    def threshold(self) -> float:
        """The p every comparison must stay under (Bonferroni over the comparisons)."""
        return self.alpha / max(1, len(self.rivals))

    @property
    def clear(self) -> bool:
        """The top method beats every other one under the stated test."""
        return self.top is not None and bool(self.rivals) and all(
            r.p < self.threshold and r.wins > r.losses for r in self.rivals)

    @property
    def weakest(self) -> Rival | None:
        return self.rivals[0] if self.rivals else None


def lead(scores: Mapping[str, Sequence[float]], alpha: float = ALPHA) -> Lead:
    """scores: method -> one score per prompt (same prompt order; nan where a prompt has none)."""
    arrs = {m: np.asarray(v, dtype=np.float64) for m, v in scores.items()}
    means = {m: (float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")) for m, v in arrs.items()}
    n = max((len(v) for v in arrs.values()), default=0)
    ok = {m: v for m, v in means.items() if not math.isnan(v)}
    if not ok:
        return Lead(None, means, [], alpha, n)
    top = max(ok, key=ok.get)
    rivals = []
    for m in ok:
        if m == top:
            continue
        w, lo_, p = sign_test(arrs[top], arrs[m])
        diff, low, high, _ = paired_interval(arrs[top], arrs[m])
        rivals.append(Rival(m, w, lo_, p, diff, low, high))
    rivals.sort(key=lambda r: (-r.p, r.diff))
    return Lead(top, means, rivals, alpha, n)
