"""Decode speed: the decoder key/value cache versus recomputing the whole prefix every step.

    .venv/bin/python bench/decode.py [--tokens 128] [--reps 7]

Both runs generate exactly `--tokens` tokens ([EOS] is never allowed to stop them) with the
shipped models' architecture (d_model 128, 4 heads, 2+2 layers, d_ff 512), interleaved in
one process on 2 threads; medians, and their ratio (target >= 3x at 128 tokens).
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
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--src-len", type=int, default=16)
    # 2 = the target machine's cores; on a shared, busy machine 2 threads thrash (OpenMP waits on
    # the busy core), so --threads 1 gives the steadier ratio there.
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=64,
        tgt_vocab_size=64,
        d_model=128,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=512,
        dropout=0.0,
        max_len=a.tokens + 1,
    )
    model = Transformer(cfg).eval()
    src = torch.randint(7, 64, (1, a.src_len))
    never = -1  # no token id is -1: the decode always runs the full length

    def run(use_cache: bool, record: bool) -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        out = dec.generate(model, src, 5, never, max_new_tokens=a.tokens, use_cache=use_cache, record=record)
        return time.perf_counter() - t0, out.token_ids

    for record in (False, True):
        run(True, record), run(False, record)  # warm up
        cached, full = [], []
        for _ in range(a.reps):  # interleaved: machine noise hits both sides alike
            tc, ids_c = run(True, record)
            tf, ids_f = run(False, record)
            assert ids_c == ids_f and len(ids_c) == a.tokens, "cache and recompute disagree"
            cached.append(tc)
            full.append(tf)
        mc, mf = statistics.median(cached), statistics.median(full)
        label = "with step records" if record else "plain"
        print(
            f"{a.threads} thread(s), {a.tokens} tokens, {label:17s}: "
            f"cache {mc * 1e3:7.1f} ms ({a.tokens / mc:6.0f} tok/s)   "
            f"recompute {mf * 1e3:7.1f} ms ({a.tokens / mf:6.0f} tok/s)   speed-up {mf / mc:.2f}x"
        )


if __name__ == "__main__":
    main()
