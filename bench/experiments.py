"""Head importance cost, as a ratio to one forward pass of the same model (measured in the same run).

All ablations run batched: one forward pass with 1 + (modules × heads) rows, one head knocked out
per row. Compared with one forward pass of the intact input, and with the naive loop (one pass per
head). Interleaved repetitions, medians; ratios only (the machine is noisy).
    python bench/experiments.py [--reps 7]
Targets (2 cores): the full map of a shipped model <= 1 s; MiniLM's 72 heads <= 5 s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from model import interventions as iv
from model import load_checkpoint
from model.analysis import compare, heads, importance_for
from model.loaders import minilm as pretrained


def report(label: str, cases: dict, reps: int) -> None:
    """Interleaved: every repetition runs each case once, so a load spike hits all of them alike."""
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(reps):
        for k, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    t = {k: statistics.median(v) for k, v in times.items()}
    one = t["one forward pass"]
    print(f"\n{label}")
    for k, v in t.items():
        print(f"  {k:<34} {v * 1000:9.1f} ms   {v / one:7.1f} x forward")


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")

    ckpt = load_checkpoint("dates")
    _, trace = ckpt.trace(ckpt.example)
    src, tgt = torch.tensor(trace.meta["src_ids"]), torch.tensor(trace.meta["tgt_ids"])
    modules = heads.attention_modules(ckpt.model)
    H = ckpt.cfg.n_heads
    report(f"dates ({len(modules)} attention modules × {H} heads = {len(modules) * H} ablations), "
           f"'{ckpt.example}'", {
               "one forward pass": lambda: ckpt.model(src, tgt),
               "head importance (batched)": lambda: importance_for(ckpt, trace),
               "one pass per head (loop)": lambda: [ckpt.model.run_with_hooks(src, tgt, iv.ablate_head(m, h))
                                                    for m in modules for h in range(H)],
           }, args.reps)

    if not pretrained.is_available():
        print(f"\nMiniLM skipped: {pretrained.INSTALL_HINT}")
        return
    enc = pretrained.load_minilm()
    text = "The animal didn't cross the street because it was too tired"
    ids = enc.ids(text)
    report(f"MiniLM (6 layers × 12 heads = 72 ablations), '{text}'", {
        "one forward pass": lambda: enc.forward_ids(ids),
        "head importance (batched)": lambda: compare.preference_importance(enc, text),
    }, args.reps)


if __name__ == "__main__":
    main()
