"""Benchmark: long inputs on SmolLM2-135M-Instruct (issue 24 §5), ratios in one run, each beside its target:

    python bench/long.py [--tokens 2048] [--long 8192] [--reps 3] [--new-tokens 16] [--skip-long]

- the forward that feeds a lazy trace (q, k, v per layer; run_with_trace(lazy=True, fast=True)) vs
  transformers' sdpa forward at --tokens (both return every position's logits); beside it, our
  step-by-step forward (what forward/run_with_trace without the fast path run) for scale;
- the first /llm view, model side: that lazy trace + one head's pooled overview (256 x 256) + the
  document view of the last position (the model's mean over layers and heads, top 10), vs the same
  sdpa forward;
- a click on another head: its pooled overview + its document view on the same trace (server time);
- the other pages' lazy trace (layers=True: q, k, v + each layer's output): its forward vs sdpa, bytes held, and
  the time to give a layer's other tensors (the layer run again);
- memory: the lazy trace's bytes at --tokens and --long, each measured in a fresh interpreter (bytes
  held, and the peak RSS growth of the call), beside the full capture's estimate (every capture point)
  and transformers' output_attentions=True (its peak RSS growth, measured at --tokens; at --long its
  attention tensors alone are computed: L x H x T² x 4 bytes);
- generation at --tokens of context, --new-tokens greedy tokens with every step's attention row
  recorded (generate(fast=True)), tokens/s vs transformers' generate with eager attention (greedy, no
  records), both timed from the prompt (prefill included).

Timed variants are interleaved and medians compared, so a shared machine's drift hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model.loaders.smollm2 import smollm2_path  # noqa: E402

TEXT = ("Attention relates every token to every other one. When Mary and John went to the store, John gave a "
        "drink to Mary. The lab records q, k and v of every layer and computes a head's weights when a page "
        "asks for them, so a long document costs memory in proportion to its length. ")

PEAK = """
import os, threading, time
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
class Peak:  # the largest RSS seen while the block runs (sampled every 2 ms), minus the RSS before it
    def __enter__(self):
        self.before = self.top = rss(); self.on = True
        self.t = threading.Thread(target=self.watch, daemon=True); self.t.start(); return self
    def watch(self):
        while self.on:
            self.top = max(self.top, rss()); time.sleep(0.002)
    def __exit__(self, *e):
        self.on = False; self.t.join(); self.top = max(self.top, rss()); self.growth = self.top - self.before
"""

MEM_OURS = PEAK + """
import json, sys
sys.path.insert(0, {root!r})
import torch
if {threads}:
    torch.set_num_threads({threads})
from model import load_model
lm = load_model("smollm2")
ids = torch.tensor([lm.tokenizer.encode({text!r} * ({T} // 40 + 2)).ids[:{T}]])
with Peak() as p:
    _, tr = lm.run_with_trace(ids, lazy=True, fast=True, last_only=True, budget_bytes=None)
print(json.dumps({{"nbytes": tr.nbytes(), "peak_growth": p.growth}}))
"""

MEM_REF = PEAK + """
import json, torch
if {threads}:
    torch.set_num_threads({threads})
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging
logging.disable_progress_bar()
m = AutoModelForCausalLM.from_pretrained({dir!r}, gguf_file={file!r}, attn_implementation="eager",
                                         dtype=torch.float32).eval()
ids = torch.tensor([{ids!r}])
with torch.no_grad(), Peak() as p:
    out = m(ids, output_attentions=True)
print(json.dumps({{"peak_growth": p.growth, "attn_bytes": sum(a.numel() * 4 for a in out.attentions)}}))
"""


def run_child(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def interleaved(fns: dict, reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(reps):
        for k in names[r % len(names):] + names[: r % len(names)]:
            t = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def line(what: str, ours: str, theirs: str, ratio: float | None, target: str, ok: bool | None) -> None:
    r = f"{ratio:>7.2f}x" if ratio is not None else " " * 8
    verdict = "" if ok is None else ("ok" if ok else "MISSED")
    print(f"{what:<58} {ours:>12} {theirs:>14} {r}  {target:<10} {verdict}")


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--long", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--skip-long", action="store_true", help="leave out the --long memory run")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (0: torch's default). On a machine shared by other busy processes, 1 "
                         "avoids OpenMP's spinning threads (measured: 2 threads 10-20x slower than 1 there)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    from model import load_model
    from model.analysis import long as lg
    from model.core import recorder

    logging.disable_progress_bar()
    path = smollm2_path()
    print(f"SmolLM2-135M-Instruct ({path.name}), torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f} (before)")
    lm = load_model("smollm2")
    ref = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, attn_implementation="sdpa",
                                               dtype=torch.float32).eval()
    T = args.tokens
    ids = torch.tensor([lm.tokenizer.encode(TEXT * (T // 40 + 2)).ids[:T]])
    assert ids.shape[1] == T
    cfg = lm.model.cfg
    L, H = cfg.n_layers, cfg.n_heads

    # ---- the forward that feeds a lazy trace, vs transformers' sdpa forward
    state: dict = {}

    def ours_lazy():
        state["logits"], state["trace"] = lm.run_with_trace(ids, lazy=True, fast=True, budget_bytes=None)

    def ours_step():
        with torch.no_grad():
            lm.model(ids)

    def ref_sdpa():
        with torch.no_grad():
            ref(ids)

    fwd = interleaved({"lazy": ours_lazy, "sdpa": ref_sdpa, "step": ours_step}, args.reps)

    # ---- the first view (model side) and a click on another head
    def first_view():
        ours_lazy()
        tr = state["trace"]
        lg.pooled_overview(tr, L // 2, 0, n=256)
        lg.document_view(tr, -1)
        state["predicted"] = state["logits"][0, -1].argmax()

    def click(layer: int, head: int):
        tr = state["trace"]
        lg.pooled_overview(tr, layer, head, n=256)
        lg.document_view(tr, -1, layer, head)

    view = interleaved({"view": first_view, "sdpa": ref_sdpa}, args.reps)
    clicks = []
    for layer, head in ((3, 1), (17, 5), (28, 8)):
        t = time.perf_counter()
        click(layer, head)
        clicks.append(time.perf_counter() - t)
    t_click = statistics.median(clicks)
    stats_t = time.perf_counter()
    lg.head_statistics_tiled(state["trace"])
    stats_t = time.perf_counter() - stats_t

    # ---- the other pages' lazy trace (layers=True: + each layer's output; a layer's other tensors run it again)
    def ours_layers():
        state["layers"] = lm.run_with_trace(ids, lazy=True, layers=True, fast=True, budget_bytes=None,
                                            last_only=True)[1]

    fwd_layers = interleaved({"layers": ours_layers, "sdpa": ref_sdpa}, args.reps)
    again = []
    for layer in (3, 17, 28):
        t = time.perf_counter()
        state["layers"][f"decoder.layers.{layer}.norm2.out"]
        again.append(time.perf_counter() - t)
    layers_bytes, t_again = state["layers"].nbytes(), statistics.median(again)

    # ---- generation at T of context
    n_new = args.new_tokens
    counts: dict[str, int] = {}
    ref.set_attn_implementation("eager")

    def ours_gen():
        counts["ours"] = len(lm.generate(ids, max_new_tokens=n_new, record=True, fast=True).ids)

    def ref_gen():
        with torch.no_grad():
            out = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new, min_new_tokens=n_new,
                               do_sample=False, pad_token_id=2)
        counts["ref"] = out.shape[1] - ids.shape[1]

    gen = interleaved({"ours": ours_gen, "ref": ref_gen}, max(2, args.reps - 1))
    tps_ours, tps_ref = counts["ours"] / gen["ours"], counts["ref"] / gen["ref"]
    state.clear()  # free the trace and the reference model before the memory children run
    ref = None

    # ---- memory, each in a fresh interpreter
    def full_estimate(n: int) -> int:
        shapes = lm.model.capture_names(1, n)
        return recorder.estimate_bytes(shapes, list(shapes), 4)

    mem = {T: run_child(MEM_OURS.format(root=str(ROOT), text=TEXT, T=T, threads=args.threads))}
    if not args.skip_long:
        mem[args.long] = run_child(MEM_OURS.format(root=str(ROOT), text=TEXT, T=args.long, threads=args.threads))
    ref_mem = run_child(MEM_REF.format(dir=str(path.parent), file=path.name, ids=ids[0].tolist(),
                                       threads=args.threads))

    print(f"load average {os.getloadavg()[0]:.1f} (after)")
    print(f"{'':<58} {'ours':>12} {'transformers':>14} {'ratio':>8}  {'target':<10}")
    r = fwd["lazy"] / fwd["sdpa"]
    line(f"forward feeding a lazy trace, {T} tokens, s (vs sdpa)", f"{fwd['lazy']:.2f}", f"{fwd['sdpa']:.2f}", r,
         "<= 1.1", r <= 1.1)
    line(f"  our step-by-step forward, {T} tokens, s (vs sdpa)", f"{fwd['step']:.2f}", f"{fwd['sdpa']:.2f}",
         fwd["step"] / fwd["sdpa"], "", None)
    r = view["view"] / view["sdpa"]
    line(f"first /llm view (model side), {T} tokens, s (vs sdpa)", f"{view['view']:.2f}", f"{view['sdpa']:.2f}",
         r, "<= 2", r <= 2)
    line("click on another head (overview + document view), s", f"{t_click:.3f}", "", None, "<= 1 s",
         t_click <= 1)
    line(f"per-head statistics, {L}x{H} heads, {T} tokens, tiled, s", f"{stats_t:.1f}", "", None, "", None)
    r = fwd_layers["layers"] / fwd_layers["sdpa"]
    line(f"lazy trace with layers (other pages), {T} tokens, s (vs sdpa)", f"{fwd_layers['layers']:.2f}",
         f"{fwd_layers['sdpa']:.2f}", r, "", None)
    line(f"  bytes held (q, k, v + each layer's output), {T} tokens", mib(layers_bytes), "", None, "", None)
    line("  a layer's other tensors: the layer run again, s", f"{t_again:.3f}", "", None, "", None)
    for n, target in ((T, 256 * 2**20), (args.long, 2**30)):
        if n not in mem:
            continue
        line(f"lazy trace, {n} tokens: bytes held", mib(mem[n]["nbytes"]), "", None,
             f"<= {mib(target)}", mem[n]["nbytes"] <= target)
        line("  peak RSS growth of that call (forward included)", mib(mem[n]["peak_growth"]), "", None, "", None)
        line("  full capture (every capture point), estimate", mib(full_estimate(n)), "", None, "", None)
        if n == T:
            line("  transformers output_attentions=True, peak RSS growth", "", mib(ref_mem["peak_growth"]), None,
                 "", None)
        else:
            line("  transformers output_attentions=True, attentions alone", "", mib(L * H * n * n * 4), None,
                 "(not run)", None)
    r = tps_ours / tps_ref
    line(f"generation, {T}-token context, {n_new} tokens, tokens/s (vs eager)", f"{tps_ours:.2f}",
         f"{tps_ref:.2f}", r, ">= 1.0", r >= 1.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
