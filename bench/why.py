"""Benchmark: one attention cell's explanation (issue 39 §6) on SmolLM2 at 2,048 tokens, beside path patching:

    python bench/why.py [--tokens 2048] [--layer 20] [--head 3] [--reps 3] [--patch 3]

- cold: `why.explain_score` with no trace held (it runs the layers up to the explained one, `run_layer`, fused
  attention before it), beside the whole forward a page's lazy trace costs (fused attention, last logits only);
- warm: the lazy trace held (as a page holds it), one explanation of another cell each repeat (median), and its
  causal check (top 3 sources a side, each re-scored with the live norm);
- path patching every source one forward at a time: one forward with a source taken out (a head's z zeroed at the
  key position by a hook), timed `--patch` times; × the number of sources the explanation names (query side +
  key side) gives its cost, printed as a ratio against warm and cold in the same run.

Targets (issue 39 §6): warm <= 1 s, cold <= 5 s (2 CPU cores).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flow import TEXT as FLOW_TEXT  # noqa: E402  (bench/flow.py, beside this file: the same text)

from model import load_model  # noqa: E402
from model.analysis import why  # noqa: E402
from model.core import recorder  # noqa: E402

TEXT = FLOW_TEXT + " "  # repeated to the length asked


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--layer", type=int, default=20)
    ap.add_argument("--head", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--patch", type=int, default=3)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    lm = load_model("smollm2")
    m = lm.model
    ids = lm.encode(TEXT * (args.tokens // 40 + 2))[:, :args.tokens]
    T = ids.shape[1]
    i, L, h = T - 1, args.layer, args.head
    print(f"SmolLM2, {T} tokens, layer {L} head {h}, query {i}")
    names = why.lazy_names(m, L)

    lazy = dict(names=names, lazy=True, fast=True, last_only=True)  # a page's lazy trace
    m.run_with_trace(ids, **lazy)  # warm-up: the first forward at this length pays the allocator
    t_fwd, _ = timed(lambda: m.run_with_trace(ids, **lazy))  # the reference: one whole forward
    t_cold, e = timed(lambda: why.explain_score(lm, ids, L, h, i, T // 2, against=T // 3))
    print(f"cold: {t_cold:.2f} s (a whole forward with a lazy trace {t_fwd:.2f} s: ratio {t_cold / t_fwd:.2f}); "
          f"|Σ terms − score| = {e.error:.2e} (bound {e.tolerance():.2e}), "
          f"{len(e.query_sources)} × {len(e.key_sources)} sources")

    _, tr = m.run_with_trace(ids, **lazy)
    warm = []
    for r in range(args.reps):
        t, e = timed(lambda r=r: why.explain_score(lm, ids, L, h, i, 7 + 101 * r, trace=tr))
        warm.append(t)
    t_warm = statistics.median(warm)
    t_check, chk = timed(lambda: why.check_explanation(e, top=3))
    print(f"warm: {t_warm:.3f} s median of {args.reps} ({', '.join(f'{t:.3f}' for t in warm)}); causal check "
          f"{t_check:.3f} s ({len(chk.disagreements)} of {len(chk.rows)} checked sources beyond the tolerance)")

    attn = f"decoder.layers.{max(0, L - 1)}.self_attn.z"
    key = e.key

    def patched():
        def drop(z, name):  # one source out: head 0's z at the key position
            z = z.clone()
            z[:, 0, key] = 0
            return z

        with recorder.fast_attention(True), m.hooks({attn: drop}):  # fused attention, as the lazy forward
            return m(ids, last_only=True)

    per = []
    for _ in range(args.patch):
        t, _ = timed(patched)
        per.append(t)
    t_one = statistics.median(per)
    n_src = len(e.query_sources) + len(e.key_sources)
    t_all = t_one * n_src
    frac = (L + 1) / m.cfg.n_layers  # a forward stopped at the explained layer: its share of the layers
    print(f"path patching: one forward {t_one:.2f} s (median of {args.patch}) × {n_src} sources = {t_all:.0f} s "
          f"(stopped at layer {L}: ~{t_all * frac:.0f} s)")
    print(f"ratio path patching / explanation: warm {t_all / t_warm:.0f}x ({t_all * frac / t_warm:.0f}x stopped), "
          f"cold {t_all / t_cold:.0f}x ({t_all * frac / t_cold:.0f}x stopped)")
    print(f"targets: warm <= 1 s: {'met' if t_warm <= 1 else 'NOT met'}; cold <= 5 s: "
          f"{'met' if t_cold <= 5 else 'NOT met'}")


if __name__ == "__main__":
    main()
