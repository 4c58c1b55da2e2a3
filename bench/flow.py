"""Benchmark: information flow on SmolLM2 (issue 25, Speed), each beside one forward pass, in one run:

    python bench/flow.py [--tokens 64] [--reps 5] [--ioi 12] [--induction 10]

- one forward pass (no capture) and the capture the analyses read;
- the routes graph (every edge's contribution, chunked over query rows), rollout, norm-based attention
  (every layer, per head and per layer), with the routes' peak block and the process's RSS growth;
- attention flow: refused past its limit at this length (the sentence is printed);
- the causal effect with each batch run from its first source on (the clean prefix's keys and values reused)
  against full runs, interleaved: time ratio and the largest difference;
- the agreement table over the IOI prompts (seconds) and over induction sequences: each method's mean
  Spearman rho against the causal effect (zeroing a token's value vectors in every layer), the numbers
  the "Why this token?" page shows from the same function.

Targets: routes <= 3 s, rollout and norm-based <= 1 s, the 12-prompt IOI table <= 60 s (2 CPU cores).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model import load_model  # noqa: E402
from model.analysis import flow  # noqa: E402

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based ink and a wooden press adapted from wine making. Within fifty years "
        "presses were running in more than two hundred cities across Europe, and the price of books fell so "
        "far that ordinary merchants could own them.")


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def table(name: str, t: flow.AgreementTable) -> None:
    print(f"\n{name}: Spearman rho vs |causal effect| (mean ± std over prompts with a rho), top-3 overlap")
    for m, row in t.summary().items():
        print(f"  {flow.NAMES[m]:<28} rho {row['mean']:+.3f} ± {row['std']:.3f}  top-3 {row['top_k']:.2f}  "
              f"(n={row['n']})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ioi", type=int, default=12)
    ap.add_argument("--induction", type=int, default=10)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    lm = load_model("smollm2")
    ids = lm.encode(" ".join([TEXT] * 4))[:, :args.tokens]
    T = ids.shape[1]
    s = flow.prepare(lm, ids)
    m = lm.model
    desc = m.describe()
    mods = dict(m.named_modules())
    trace = flow.capture(s)

    def norms():
        return [flow.norm_based(mods[n], trace[f"{n}.weights"][0], trace[f"{n}.v"][0]) for n in desc["attention"]]

    def forward():
        with torch.no_grad():
            return m(ids)

    # interleaved: rep k runs every variant once, so a shared machine's drift hits them alike
    jobs = {"forward": forward, "capture": lambda: flow.capture(s), "routes": lambda: flow.routes(s, trace),
            "norms": norms, "rollout": lambda: flow.rollout_importance(s, trace)}
    times: dict[str, list[float]] = {k: [] for k in jobs}
    before = rss_mib()
    for _ in range(args.reps):
        for k, fn in jobs.items():
            t0 = time.perf_counter()
            out = fn()
            times[k].append(time.perf_counter() - t0)
            if k == "routes":
                r = out
    grew = rss_mib() - before
    fwd, cap, rt, nt, ro = (statistics.median(times[k]) for k in jobs)
    cfg = m.cfg
    full = cfg.n_layers * T * T * cfg.n_heads * cfg.d_model * 4
    print(f"\nSmolLM2, {T} tokens ({cfg.n_layers} layers, {cfg.n_heads} heads, {cfg.kv_heads} K/V heads), "
          f"median of {args.reps}:")
    print(f"  one forward pass            {fwd * 1000:8.1f} ms   1.00x")
    print(f"  capture (the analyses' names){cap * 1000:7.1f} ms   {cap / fwd:5.2f}x")
    print(f"  routes graph                {rt * 1000:8.1f} ms   {rt / fwd:5.2f}x   (target <= 3 s)")
    print(f"  norm-based, every layer     {nt * 1000:8.1f} ms   {nt / fwd:5.2f}x   (target <= 1 s)")
    print(f"  rollout                     {ro * 1000:8.1f} ms   {ro / fwd:5.2f}x   (target <= 1 s)")
    print(f"  routes: peak block {r.peak_chunk_bytes / 2**20:.1f} MiB (the whole L x T x T x H x d tensor would be "
          f"{full / 2**30:.2f} GiB); process max RSS grew {grew:.0f} MiB over the timed runs (the capture included)")
    print(f"  edges: {r.n_edges()} in the full graph; reachable from the prediction with contribution > tau:")
    for tau in (0.01, 0.03, 0.05, 0.1):
        print(f"    tau {tau:<5} {len(r.edges(tau)):6d}")
    t0 = time.perf_counter()
    c = flow.compare(s, flow=True, trace=trace, routes_=r)  # + the causal effect: one ablated batch row per token
    print(f"  one full comparison (all methods + the causal effect, {T} ablations): {time.perf_counter() - t0:.2f} s")
    # the causal effect: each batch from its first source on, over the clean prefix's keys and values, vs full runs
    ct: dict[str, list[float]] = {"full": [], "prefix": []}
    eff = {}
    for _ in range(max(1, args.reps // 2)):
        for k in ct:
            t0 = time.perf_counter()
            eff[k] = flow.causal_effect(s, desc, reuse_prefix=k == "prefix")
            ct[k].append(time.perf_counter() - t0)
    full_s, pre_s = statistics.median(ct["full"]), statistics.median(ct["prefix"])
    print(f"  causal effect ({T} ablations, median of {len(ct['full'])}): full runs {full_s:.2f} s, each batch from "
          f"its first source on {pre_s:.2f} s ({pre_s / full_s:.2f}x); max |difference| "
          f"{abs(eff['full'] - eff['prefix']).max():.1e} of max {eff['full'].max():.2f}")
    print("  flow:", c.notes.get("flow", "computed"))
    print("  rho here:", ", ".join(f"{k} {v:+.2f}" for k, v in c.rho.items()))

    if not args.ioi and not args.induction:
        return
    prompts = flow.ioi_set(lm, args.ioi)
    t0 = time.perf_counter()
    ioi = flow.agreement_table(lm, prompts, progress=lambda i, n: print(f"\r  IOI {i}/{n}", end="", flush=True))
    took = time.perf_counter() - t0
    print(f"\n  agreement table over {len(prompts)} IOI prompts: {took:.1f} s (target <= 60 s)")
    table(f"IOI ({len(prompts)} prompts, logit difference IO - S)", ioi)
    if not args.induction:
        return
    ind = flow.agreement_table(lm, flow.induction_set(lm, args.induction))
    table(f"Induction ({args.induction} random sequences repeated, log-prob of the copied token)", ind)


if __name__ == "__main__":
    main()
