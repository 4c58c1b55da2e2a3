"""Benchmark: ~150M-parameter random Qwen3- and Gemma 3-shaped models in our DecoderLM against transformers
(eager attention, float32, the same saved directory), ratios in one run (issue 23, Speed):

    python bench/families.py [--tokens 128] [--new-tokens 32] [--reps 5] [--layers 16]

- full capture at 128 tokens (every capture point) vs transformers' forward with output_attentions=True
  (target: ours <= 1.2x theirs);
- generation with per-step records (top-10 + every layer's attention of the new position) vs transformers'
  generate, greedy (target: ours >= 1.0x their tokens/s);
- load time of the directory, ours vs transformers' from_pretrained.
Timed variants are interleaved and medians compared, so a shared machine's drift hits both alike; on a
crowded machine, --cpu-time measures each variant's own CPU seconds on one thread instead of wall time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    "qwen3": dict(vocab_size=49152, hidden_size=768, intermediate_size=2048, num_attention_heads=12,
                  num_key_value_heads=4, head_dim=64, max_position_embeddings=4096, tie_word_embeddings=True),
    "gemma3_text": dict(vocab_size=49152, hidden_size=768, intermediate_size=2048, num_attention_heads=4,
                        num_key_value_heads=1, head_dim=256, max_position_embeddings=4096, sliding_window=64,
                        query_pre_attn_scalar=256),
}


CLOCK = time.perf_counter


def interleaved(fns: dict, reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t = CLOCK()
            fn()
            times[k].append(CLOCK() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def bench(kind: str, shape: dict, a) -> None:
    import transformers

    from model.loaders.hf import load_hf_dir

    cfg = transformers.AutoConfig.for_model(kind, num_hidden_layers=a.layers, **shape)
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    n = sum(p.numel() for p in ref.parameters())
    with tempfile.TemporaryDirectory() as d:
        ref.save_pretrained(d)
        loads = interleaved({"ours": lambda: load_hf_dir(d), "theirs": lambda: transformers.AutoModelForCausalLM
                             .from_pretrained(d, attn_implementation="eager")}, 3)
        lm = load_hf_dir(d)
    ids = torch.randint(0, shape["vocab_size"], (1, a.tokens), generator=torch.Generator().manual_seed(1))

    def capture():
        lm.run_with_trace(ids)

    def ref_attn():
        ref(ids, output_attentions=True)

    def gen():
        lm.generate(ids, max_new_tokens=a.new_tokens, record=True)

    def ref_gen():
        ref.generate(ids, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, do_sample=False,
                     eos_token_id=None, pad_token_id=0)

    with torch.no_grad():
        assert float((lm.model(ids) - ref(ids).logits).abs().max()) < 1e-3
        capture(), ref_attn()  # warm-up
        fwd = interleaved({"ours": capture, "theirs": ref_attn}, a.reps)
        g = interleaved({"ours": gen, "theirs": ref_gen}, max(1, a.reps // 2))
    print(f"{kind}: {n / 1e6:.0f}M parameters, {a.layers} layers, {a.tokens} tokens")
    r = fwd["ours"] / fwd["theirs"]
    print(f"  full capture   ours {fwd['ours'] * 1e3:7.1f} ms  transformers+attentions {fwd['theirs'] * 1e3:7.1f} ms  "
          f"ratio {r:.2f}x  (target <= 1.2x: {'ok' if r <= 1.2 else 'MISSED'})")
    r = g["theirs"] / g["ours"]
    print(f"  generation     ours {a.new_tokens / g['ours']:6.1f} tok/s (records)  transformers "
          f"{a.new_tokens / g['theirs']:6.1f} tok/s  ratio {r:.2f}x  "
          f"(target >= 1.0x: {'ok' if r >= 1.0 else 'MISSED'})")
    print(f"  load           ours {loads['ours']:.2f} s  transformers {loads['theirs']:.2f} s  "
          f"ratio {loads['ours'] / loads['theirs']:.2f}x")


def main() -> int:
    import transformers

    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--only", choices=list(SHAPES))
    ap.add_argument("--cpu-time", action="store_true", help="one thread, process CPU seconds (a crowded machine)")
    a = ap.parse_args()
    if a.cpu_time:
        global CLOCK
        CLOCK = time.process_time
        torch.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads")
    for kind, shape in SHAPES.items():
        if a.only in (None, kind):
            bench(kind, shape, a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
