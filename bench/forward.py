"""Forward-pass cost of the instrumented model vs torch.nn.Transformer, and of capture.

One run, interleaved repetitions, medians of CPU time (steadier than wall time on a shared
machine; wall time shown too); ratios only.
    python bench/forward.py [--reps 30] [--threads 1]
Targets: off / nn.Transformer <= 1.10; full capture / off <= 1.35 (issue #12: with the LayerNorm and
FFN capture points; TransformerLens's full cache costs 1.41-2.14x); weights only / off <= 1.10.

A full trace of this batch is ~79 MiB that outlives the call. Left in the tensors the forward
allocated, glibc returned it to the OS when the trace was freed and the next call page-faulted it
again: 1.16-1.50x. The recorder now copies a trace into one block that later traces reuse
(model/recorder.py, `_Block`), so "capture all" measures a forward, the copies (~8 ms) and no faults.
Every case runs the public API (`model(...)`, `model.run_with_trace(...)`) as a user calls it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from model import Transformer, TransformerConfig, causal_mask
from model.testing.reference import to_torch_transformer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (2 thrash on a busy 2-core machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=1000, tgt_vocab_size=1000, d_model=256, n_heads=8, n_encoder_layers=3,
                            n_decoder_layers=3, d_ff=1024, dropout=0.1, max_len=128)
    model = Transformer(cfg).eval()
    ref = to_torch_transformer(model)
    B, S, T = 8, 64, 64
    src, tgt = torch.randint(1, 1000, (B, S)), torch.randint(1, 1000, (B, T))
    src[: B // 2, S - 8:] = 0  # some padding, as in real batches
    future = causal_mask(T)

    def torch_ref():
        y = ref(model.src_embed(src), model.tgt_embed(tgt), tgt_mask=future, src_key_padding_mask=src == 0,
                tgt_key_padding_mask=tgt == 0, memory_key_padding_mask=src == 0)
        return model.generator(y)

    cases = {
        "nn.Transformer": torch_ref,
        "capture off": lambda: model(src, tgt),
        "capture all": lambda: model.run_with_trace(src, tgt, budget_bytes=None),
        "capture weights": lambda: model.run_with_trace(src, tgt, names="*.weights"),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    walls: dict[str, list[float]] = {k: [] for k in cases}
    with torch.no_grad():
        for fn in cases.values():  # warm-up
            fn()
        for _ in range(args.reps):
            for name, fn in cases.items():  # interleaved: drift hits every case alike
                w0, c0 = time.perf_counter(), time.process_time()
                fn()
                times[name].append(time.process_time() - c0)
                walls[name].append(time.perf_counter() - w0)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:16s} median CPU {v * 1e3:8.2f} ms, wall {statistics.median(walls[k]) * 1e3:8.2f} ms")
    off = med["capture off"]
    for label, value, target in (("capture off / nn.Transformer", off / med["nn.Transformer"], 1.10),
                                 ("capture all / capture off", med["capture all"] / off, 1.35),
                                 ("weights only / capture off", med["capture weights"] / off, 1.10)):
        print(f"{label:30s}= {value:.3f}  (target <= {target:.2f}: {'met' if value <= target else 'NOT met'})")

if __name__ == "__main__":
    main()
