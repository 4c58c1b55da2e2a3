"""Tolerances from the dtype's resolution and the magnitudes involved, in one place (issue 34).

Two computations of the same quantity that differ only in the order of their float reductions (the thread
split of a matmul, a batch of 7 rows against one row, a KV-cache path against a full forward, tiles against
one block) differ by rounding: each of the n terms summed carries up to one rounding of the largest term,
and those roundings add up like a random walk, so the result is off by about

    eps(dtype) x (largest magnitude involved) x sqrt(n)

A constant below that (1e-7 on float32 logits of order 1 is one ulp of them) passes or fails with the CPU and
the thread count, not with the code. `tol` returns that bound times a few ulps; a broken identity is off by
the size of the effect itself (a logit-difference span, a probability), orders of magnitude above it.

Bit-exact comparisons that are exact by design (the same code path on the same shapes: capture on/off, lazy
vs full trace) stay exact (torch.equal); this module is only for results that may legitimately differ.
"""

from __future__ import annotations

import math

import numpy as np
import torch

ULPS = 4.0  # rounding steps that may differ between the two paths, in units of eps x scale x sqrt(n)


def eps(dtype=torch.float32) -> float:
    """The dtype's resolution: the gap between 1 and the next float (float32: 1.19e-7, float64: 2.2e-16)."""
    if isinstance(dtype, torch.dtype):
        return torch.finfo(dtype).eps
    return float(np.finfo(dtype).eps)


def magnitude(*xs) -> float:
    """The largest |value| among tensors, arrays and numbers (NaN ignored)."""
    m = 0.0
    for x in xs:
        if isinstance(x, torch.Tensor):
            x = x.detach().double().cpu().numpy()
        a = np.abs(np.asarray(x, dtype=np.float64))
        if a.size and not np.isnan(a).all():
            m = max(m, float(np.nanmax(a)))
    return m


def tol(*xs, n: int = 1, dtype=torch.float32, ulps: float = ULPS) -> float:
    """An absolute bound for the rounding difference of two evaluations of the same quantity in `dtype` whose
    reductions run in different orders: ulps x eps(dtype) x max|xs| x sqrt(n), with `xs` the largest terms
    involved (e.g. the logits a difference is taken of) and n the number of terms summed along the reduction
    (e.g. d_model for a projection)."""
    return ulps * eps(dtype) * magnitude(*xs) * math.sqrt(max(n, 1))


def f32_tol(*xs, n: int = 1, ulps: float = ULPS) -> float:
    """tol(...) for float32."""
    return tol(*xs, n=n, dtype=torch.float32, ulps=ulps)


def f64_tol(*xs, n: int = 1, ulps: float = ULPS) -> float:
    """tol(...) for float64 (numpy's and Python's floats): a computation done in float64 throughout."""
    return tol(*xs, n=n, dtype=torch.float64, ulps=ulps)


def kl_tol(p_logits, q_logits, n: int, ulps: float = ULPS) -> float:
    """A bound for the rounding difference of KL(p || q) = sum p (log p - log q) (computed in float64 from float32
    logits, as model.analysis does) when both sets of logits carry float32 rounding up to d = f32_tol(logits, n=n)
    (another batch size, another thread count). To first order, logits of q moved by delta change the KL by
    -sum (p - q) delta, so by at most ||p - q||_1 x d; logits of p moved by delta change it by
    sum p (delta - mean_p delta) (log p - log q), at most 2 max|log p - log q| x d. A KL of 1e-5 then has a bound
    of a few 1e-8, not a fixed relative 1e-4 that a machine might not meet."""
    p = torch.as_tensor(p_logits).double().log_softmax(-1)
    q = torch.as_tensor(q_logits).double().log_softmax(-1)
    d = f32_tol(p_logits, q_logits, n=n, ulps=ulps)
    return float(((p.exp() - q.exp()).abs().sum(-1) + 2 * (p - q).abs().amax(-1)).max()) * d
