"""The Noam learning-rate schedule (paper, section 5.3)."""

from __future__ import annotations


def noam_lr(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step >= 1.

    It rises linearly for `warmup_steps` steps, peaks at step = warmup, then decays as 1/√step.
    """
    if step < 1:
        raise ValueError(f"step must be >= 1 (the schedule is undefined at 0), got {step}")
    if d_model < 1 or warmup_steps < 1:
        raise ValueError(f"d_model and warmup_steps must be >= 1, got {d_model}, {warmup_steps}")
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)
