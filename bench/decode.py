"""Decode speed, two targets in one run (issue #12):

- step records vs plain cached decoding, 128 tokens: <= 1.3x (the decoder page records every step);
- KV cache vs recompute at the shipped size: >= 3x (plain, and with step records).

    .venv/bin/python bench/decode.py [--tokens 128] [--reps 9] [--threads 1]

Every run generates exactly `--tokens` tokens ([EOS] is never allowed to stop them) with the
shipped models' architecture (d_model 128, 4 heads, 2+2 layers, d_ff 512; --d-model/--layers/
--d-ff/--heads for others). The four variants are interleaved in one process (machine noise hits
them alike); medians of CPU time (the ratios) and of wall time (shown). Each variant is checked to
produce the same tokens, and the step records the same numbers as the recompute path.

At this size a cached step is a few hundred small torch ops (~0.4 ms): per-op overhead, not
arithmetic, sets the pace. On a shared, busy machine 2 threads thrash (OpenMP waits on the busy
core), so the default is 1 thread; --threads 2 shows the other case.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from model import Transformer, TransformerConfig
from model.toy import decode as dec

VARIANTS = {  # label -> (use_cache, record)
    "cache, plain": (True, False),
    "cache, step records": (True, True),
    "recompute, plain": (False, False),
    "recompute, step records": (False, True),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--src-len", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-ff", type=int, default=512)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=64,
        tgt_vocab_size=64,
        d_model=a.d_model,
        n_heads=a.heads,
        n_encoder_layers=a.layers,
        n_decoder_layers=a.layers,
        d_ff=a.d_ff,
        dropout=0.0,
        max_len=a.tokens + 1,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Transformer(cfg).eval()
    src = torch.randint(7, 64, (1, a.src_len), generator=gen)
    never = -1  # no token id is -1: the decode always runs the full length

    def run(use_cache: bool, record: bool):
        w0, c0 = time.perf_counter(), time.process_time()
        out = dec.generate(model, src, 5, never, max_new_tokens=a.tokens, use_cache=use_cache, record=record)
        return time.perf_counter() - w0, time.process_time() - c0, out

    outs = {k: run(*v)[2] for k, v in VARIANTS.items()}  # warm-up, and the same-output checks
    ids = {k: o.token_ids for k, o in outs.items()}
    assert len(set(map(tuple, ids.values()))) == 1 and len(ids["cache, plain"]) == a.tokens, "variants disagree"
    for s, r in zip(outs["cache, step records"].steps, outs["recompute, step records"].steps, strict=True):
        torch.testing.assert_close(s.self_attn, r.self_attn, atol=1e-5, rtol=0)
        torch.testing.assert_close(s.logits, r.logits, atol=1e-4, rtol=0)

    wall: dict[str, list[float]] = {k: [] for k in VARIANTS}
    cpu: dict[str, list[float]] = {k: [] for k in VARIANTS}
    for _ in range(a.reps):
        for k, v in VARIANTS.items():
            w, c, _ = run(*v)
            wall[k].append(w)
            cpu[k].append(c)
    mw = {k: statistics.median(v) for k, v in wall.items()}
    mc = {k: statistics.median(v) for k, v in cpu.items()}

    print(f"d_model {a.d_model}, {a.layers}+{a.layers} layers, d_ff {a.d_ff}, source {a.src_len} tokens, "
          f"{a.tokens} generated tokens, {a.threads} thread(s), median of {a.reps}")
    for k in VARIANTS:
        print(f"  {k:24s} CPU {mc[k] * 1e3:7.1f} ms   wall {mw[k] * 1e3:7.1f} ms ({a.tokens / mw[k]:5.0f} tok/s)")

    def ratio(label: str, num: str, den: str, target: str, ok) -> None:
        r, rw = mc[num] / mc[den], mw[num] / mw[den]
        print(f"{label:44s} {r:5.2f}x CPU ({rw:.2f}x wall)   target {target}  {'met' if ok(r) else 'NOT met'}")

    ratio("step records / plain (cached)", "cache, step records", "cache, plain", "<= 1.3x", lambda r: r <= 1.3)
    ratio("KV cache speed-up, plain", "recompute, plain", "cache, plain", ">= 3x", lambda r: r >= 3)
    ratio("KV cache speed-up, with step records", "recompute, step records", "cache, step records", ">= 3x",
          lambda r: r >= 3)


if __name__ == "__main__":
    main()
