"""Benchmark: a needle in a haystack on SmolLM2-135M-Instruct at long lengths (issue 24 §4):

    python bench/needle.py [--lengths 2048,4096,8192] [--depths 0.1,0.5,0.9] [--ablate 4096] [--k 5]
                           [--filler repeat|readme]

For each (length, depth): model.analysis.long.needle_trial on needle_prompt (the pass key " 71432" hidden in
filler, asked for at the end; one forward with the answer appended, a lazy trace, Wu et al.'s copy test per
head). Prints p(answer) (teacher-forced over the answer's tokens), p(first answer token), right/wrong (greedy
reproduces the whole key), answer tokens copied, the trial's seconds and the process's peak RSS; then per
length the retrieval heads (score >= 0.1, pooled over that length's depths) and the ratios to the first
length (the reference: 2,048 tokens, the longest the /phenomena page and README measured).
--filler readme: the haystack is this repository's README (prose, code and numbers, no sentence repeated)
instead of the page's few repeated sentences, where the needle is the only new text: a harder test.
--ablate N: zero the top-k retrieval heads of the N-token trials against k random heads (one seeded draw)
on N-token prompts with another key at the same depths (model.analysis.long.ablate_retrieval).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model import load_model  # noqa: E402
from model.analysis import long as LG  # noqa: E402


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="2048,4096,8192")
    ap.add_argument("--depths", default="0.1,0.5,0.9")
    ap.add_argument("--ablate", type=int, default=0, help="length of the ablation prompts (0: no ablation)")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--key", default="71432")
    ap.add_argument("--filler", choices=("repeat", "readme"), default="repeat")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    depths = [float(x) for x in a.depths.split(",")]
    lm = load_model("smollm2")
    filler = LG.FILLER
    if a.filler == "readme":  # the README describes this very test: its lines naming a key or "pass key" are left out
        lines = (ROOT / "README.md").read_text()[:60_000].splitlines(keepends=True)
        filler = "".join(x for x in lines if "pass key" not in x.lower() and a.key not in x and "58219" not in x)
    n_answer = len(LG.needle_prompt(lm, 64, 0.5, a.key).answer)
    room = lm.max_tokens - (n_answer - 1)  # a trial appends the answer's tokens but the last (teacher forcing)
    print(f"SmolLM2-135M-Instruct, {a.filler} filler, key {a.key!r} ({n_answer} answer tokens; a prompt is at most "
          f"{room:,} tokens, the context {lm.max_tokens:,} less the answer's tokens appended but the last)")
    print(f"{'length':>7} {'depth':>5} {'p(answer)':>10} {'p(first)':>9} {'right':>5} {'copied':>6} {'s':>6} "
          f"{'peak RSS GiB':>12}", flush=True)
    by_len: dict[int, list] = {}
    secs: dict[int, list[float]] = {}
    for n in lengths:
        for d in depths:
            p = LG.needle_prompt(lm, min(n, room), d, a.key, filler)
            t0 = time.perf_counter()
            tr = LG.needle_trial(lm, p)
            s = time.perf_counter() - t0
            by_len.setdefault(n, []).append(tr)
            secs.setdefault(n, []).append(s)
            print(f"{p.length:>7} {d:>5.2f} {tr.prob:>10.3g} {tr.first_prob:>9.3g} {'yes' if tr.correct else 'NO':>5} "
                  f"{tr.copied:>3}/{len(p.answer)} {s:>6.1f} {peak_gib():>12.2f}", flush=True)
    ref = lengths[0]
    print(f"\nper length (ratios to {ref:,} tokens):")
    for n in lengths:
        ts = by_len[n]
        mean_p = sum(x.prob for x in ts) / len(ts)
        ref_p = sum(x.prob for x in by_len[ref]) / len(by_len[ref])
        mean_s, ref_s = sum(secs[n]) / len(secs[n]), sum(secs[ref]) / len(secs[ref])
        heads = LG.retrieval_scores(ts).heads[:5]
        print(f"  {n:>6,}: mean p {mean_p:.3g} ({mean_p / ref_p:.2f}x), right {sum(x.correct for x in ts)}/{len(ts)}, "
              f"{mean_s:.1f} s a trial ({mean_s / ref_s:.2f}x); retrieval heads "
              + (", ".join(f"L{la}H{h} {v:.2f}" for la, h, v in heads) or "none (no answer token copied)"), flush=True)
    if a.ablate:
        trials = by_len.get(a.ablate) or [
            LG.needle_trial(lm, LG.needle_prompt(lm, min(a.ablate, room), d, a.key, filler)) for d in depths]
        scores = LG.retrieval_scores(trials)
        prompts = [LG.needle_prompt(lm, min(a.ablate, room), d, "58219", filler) for d in depths]
        t0 = time.perf_counter()
        ab = LG.ablate_retrieval(lm, prompts, scores, k=a.k, n_controls=1)
        print(f"\nablation at {a.ablate:,} tokens (key 58219, depths {depths}), {time.perf_counter() - t0:.0f} s:")
        print(f"  intact: p {ab.base:.3g}, right {ab.base_correct:.0%}")
        print(f"  top {a.k} retrieval heads {ab.heads} zeroed: p {ab.ablated:.3g}, right {ab.ablated_correct:.0%}")
        for c, p, r in zip(ab.controls, ab.control, ab.control_correct, strict=True):
            print(f"  {a.k} random heads {c} zeroed: p {p:.3g}, right {r:.0%}")
    print(f"\npeak RSS {peak_gib():.2f} GiB")


if __name__ == "__main__":
    main()
