"""Decode speed: the decoder key/value cache versus recomputing the whole prefix every step.

    .venv/bin/python bench/decode.py [--tokens 128] [--reps 9] [--threads 2]

Both runs generate exactly `--tokens` tokens ([EOS] is never allowed to stop them) with the
shipped models' architecture (d_model 128, 4 heads, 2+2 layers, d_ff 512; --d-model/--layers/
--d-ff/--heads for others), interleaved in one process; medians of wall time and of CPU time,
and their ratio (target >= 3x at 128 tokens).

At this size a cached step is a few hundred small torch ops (~0.5 ms): per-op overhead, not
arithmetic, sets the pace, which caps the ratio; it grows with the model (try --d-model 512
--layers 6 --d-ff 2048, the paper's base size). On a shared, busy machine 2 threads thrash
(OpenMP waits on the busy core): --threads 1 and the CPU-time ratio are the steadier numbers.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from model import Transformer, TransformerConfig
from model import decode as dec


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--src-len", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-ff", type=int, default=512)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
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
    model = Transformer(cfg).eval()
    src = torch.randint(7, 64, (1, a.src_len))
    never = -1  # no token id is -1: the decode always runs the full length

    def run(use_cache: bool, record: bool) -> tuple[float, float, list[int]]:
        w0, c0 = time.perf_counter(), time.process_time()
        out = dec.generate(model, src, 5, never, max_new_tokens=a.tokens, use_cache=use_cache, record=record)
        return time.perf_counter() - w0, time.process_time() - c0, out.token_ids

    print(
        f"d_model {a.d_model}, {a.layers}+{a.layers} layers, d_ff {a.d_ff}, source {a.src_len} tokens, "
        f"{a.tokens} generated tokens, {a.threads} thread(s), median of {a.reps}"
    )
    for record in (False, True):
        run(True, record), run(False, record)  # warm up
        cached, full = [], []
        for _ in range(a.reps):  # interleaved: machine noise hits both sides alike
            *tc, ids_c = run(True, record)
            *tf, ids_f = run(False, record)
            assert ids_c == ids_f and len(ids_c) == a.tokens, "cache and recompute disagree"
            cached.append(tc)
            full.append(tf)
        wc, cc = (statistics.median(x) for x in zip(*cached, strict=True))
        wf, cf = (statistics.median(x) for x in zip(*full, strict=True))
        label = "with step records" if record else "plain"
        print(
            f"  {label:17s}: cache {wc * 1e3:7.1f} ms ({a.tokens / wc:5.0f} tok/s), recompute {wf * 1e3:7.1f} ms "
            f"({a.tokens / wf:5.0f} tok/s): speed-up {wf / wc:.2f}x wall, {cf / cc:.2f}x CPU time"
        )


if __name__ == "__main__":
    main()
