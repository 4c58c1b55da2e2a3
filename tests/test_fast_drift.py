"""The fast path's drift (issue 42 §3, bench/fast_drift.py): a lazy trace fed by the fused forward
(`run_with_trace(lazy=True, fast=True)`) against the step-by-step one, on tiny random models of the lab's own
wirings. The drift is float rounding, not a different computation: small, and the fast path is no further from a
float64 run than the step-by-step path is (Gemma 3 270M at 2,048 tokens, measured by the bench: the fast path's
weights 2.1e-5 from float64, the step-by-step ones 4.5e-5). Soft-capped modules stay step by step: exactly 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fast_drift import TINY, drift, tiny_model  # noqa: E402

T = 320  # the fused kernel runs from the first token; the drift grows with length (2,048: bench/fast_drift.py)


@pytest.mark.parametrize("label", ["tiny Llama (GQA, RoPE)", "tiny Gemma 3 (sliding + global, q/k-norm)",
                                   "tiny GPT-NeoX (partial rotary, parallel)"])
def test_the_fast_path_drifts_by_rounding_only(label, tmp_path):
    lm = tiny_model(*TINY[label], d=tmp_path)
    ids = torch.randint(3, lm.model.cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
    r = drift(lm, ids, f64=True)
    assert 0 < r["weights"] <= 1e-4  # the fused kernel ran (not the same bits), and only rounding separates them
    assert r["logits"] <= 1e-4 * max(1.0, r["logit_scale"]) and r["same_top"]
    # against float64, the fast path is as near exact as the step-by-step path (a few float32 ulps either way)
    assert r["f64"]["fast"] <= 2 * r["f64"]["step"] + 1e-6, r["f64"]


def test_soft_capped_scores_stay_step_by_step(tmp_path):
    lm = tiny_model(*TINY["tiny Gemma 2 (soft-capped scores)"], d=tmp_path)
    ids = torch.randint(3, lm.model.cfg.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))
    r = drift(lm, ids)
    assert r["weights"] == 0 and r["logits"] == 0 and r["last"] == 0
