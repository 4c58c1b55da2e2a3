"""The fast path's drift on SmolLM2-135M-Instruct (issue 30 §6): a lazy trace fed by the fused forward
(`run_with_trace(lazy=True, fast=True)`) vs one fed by the step-by-step forward (`fast=False`), at --tokens
tokens of bench/long.py's text: every head's weights compared (max |Δ| over its T × T map), the worst head named,
and the last position's logits.

    python bench/drift.py [--tokens 2048] [--threads 1]

The weights a lazy trace serves are the step-by-step function of the q, k it recorded; what drifts is the forward
that produced those q, k (fused attention rounds differently), compounding over the layers.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.long import TEXT  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from model import load_model

    lm = load_model("smollm2")
    T = args.tokens
    ids = torch.tensor([lm.tokenizer.encode(TEXT * (T // 40 + 2)).ids[:T]])
    t0 = time.perf_counter()
    slow_logits, slow = lm.run_with_trace(ids, lazy=True, fast=False, budget_bytes=None, last_only=True)
    t1 = time.perf_counter()
    fast_logits, fast = lm.run_with_trace(ids, lazy=True, fast=True, budget_bytes=None, last_only=True)
    t2 = time.perf_counter()
    cfg = lm.model.cfg
    worst, per_layer = (0.0, -1, -1), []
    with torch.no_grad():
        for layer in range(cfg.n_layers):
            top = 0.0
            for head in range(cfg.n_heads):
                d = (slow.attention(layer, head=head) - fast.attention(layer, head=head)).abs().max().item()
                top = max(top, d)
                worst = max(worst, (d, layer, head))
            per_layer.append(top)
    print(f"SmolLM2-135M-Instruct, {T} tokens, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"step-by-step forward {t1 - t0:.1f} s, fast {t2 - t1:.1f} s")
    print("max |Δ weights| per layer: " + " ".join(f"{x:.1e}" for x in per_layer))
    print(f"worst head: L{worst[1]}H{worst[2]} (0-based), max |Δ weights| = {worst[0]:.2e}")
    print(f"last position's logits: max |Δ| = {(slow_logits - fast_logits).abs().max().item():.2e} "
          f"(scale {slow_logits.abs().max().item():.1f}); same top token: "
          f"{bool(slow_logits[0, -1].argmax() == fast_logits[0, -1].argmax())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
