"""The fast path's drift per model the app serves (issue 42 §3): a lazy trace fed by the fused forward
(`run_with_trace(lazy=True, fast=True)`, what the app runs beyond recorder.EXACT_UP_TO tokens) against one fed by
the step-by-step forward (`fast=False`), at --tokens tokens of bench/long.py's text.

    python bench/fast_drift.py [--tokens 2048] [--models smollm2,gemma3,tiny] [--threads 0]

For each model: the largest |Δ| in any head's attention weights (over its whole T × T map; the worst layer and
head named, 0-based), and in the logits (every position, the final norm's output through the unembedding, in
chunks; and the last position's alone), and whether the last position's top token is the same. The weights a lazy
trace serves are the step-by-step function of the q, k it recorded; what drifts is the forward that produced
those q, k (fused attention rounds differently), compounding over the layers.

"tiny" adds one tiny random model (transformers' config, weights drawn here, no download) of each wiring of the
lab's own decoder families: GQA + RoPE (Llama), learned positions (GPT-2), a sliding window (Mistral), q/k-norm
(Qwen3), sliding and global layers with q/k-norm and sandwich norms (Gemma 3), partial rotary with a parallel
residual (GPT-NeoX), soft-capped scores (Gemma 2: those modules stay step by step, so 0) and attention sinks
(gpt-oss).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.long import TEXT  # noqa: E402

SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0)
TINY = {  # label -> (model type, config beyond SMALL)
    "tiny Llama (GQA, RoPE)": ("llama", {}),
    "tiny GPT-2 (learned positions)": ("gpt2", dict(n_embd=64, n_layer=4, n_head=4, n_positions=4096)),
    "tiny Mistral (sliding window 512)": ("mistral", dict(sliding_window=512, head_dim=16)),
    "tiny Qwen3 (q/k-norm)": ("qwen3", dict(head_dim=16)),
    "tiny Gemma 3 (sliding + global, q/k-norm)": ("gemma3_text", dict(
        head_dim=16, sliding_window=512, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"])),
    "tiny GPT-NeoX (partial rotary, parallel)": ("gpt_neox", dict(rotary_pct=0.25, num_key_value_heads=4)),
    "tiny Gemma 2 (soft-capped scores)": ("gemma2", dict(head_dim=16, sliding_window=512, query_pre_attn_scalar=16,
                                                         attn_logit_softcapping=50.0)),
    "tiny gpt-oss (attention sinks)": ("gpt_oss", dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                                       sliding_window=512, layer_types=["sliding_attention",
                                                                                        "full_attention"] * 2)),
}


def tiny_model(kind: str, extra: dict, seed: int = 0, d: Path | None = None):
    """A tiny random model of `kind`, saved by transformers and opened by the lab's own family: weights 0.2·N(0, 1)
    (norms around their identity), so attention is sharp enough to drift as a trained model's does."""
    import transformers

    from model.loaders.hf import load_hf_dir

    cfg = {**SMALL, **extra}
    if kind == "gpt2":
        cfg = {k: v for k, v in cfg.items() if k not in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                         "num_attention_heads", "num_key_value_heads",
                                                         "max_position_embeddings")}
    conf = transformers.AutoConfig.for_model(kind, vocab_size=512, **cfg)
    ref = transformers.AutoModelForCausalLM.from_config(conf)
    g = torch.Generator().manual_seed(seed)
    gemma = "gemma" in kind
    with torch.no_grad():
        for name, p in ref.named_parameters():
            base = 1.0 if "norm" in name and name.endswith("weight") and not gemma else 0.0
            p.copy_(base + 0.2 * torch.randn(p.shape, generator=g))
    d = Path(tempfile.mkdtemp(prefix=f"drift-{kind}-")) if d is None else d
    ref.save_pretrained(d)
    return load_hf_dir(d)


def drift(lm, ids: torch.Tensor, f64: bool = False) -> dict:
    """Max |Δ| between the fast and the step-by-step lazy traces of `ids`: weights (worst layer, head), every
    position's logits, the last position's logits, and whether the last top token agrees. f64: also each path's
    largest weight error against a step-by-step run of the model in float64 (which of the two is nearer exact)."""
    m = lm.model
    kw = dict(names="decoder.out", lazy=True, budget_bytes=None, last_only=True)
    t0 = time.perf_counter()
    slow_last, slow = lm.run_with_trace(ids, fast=False, **kw)
    t1 = time.perf_counter()
    fast_last, fast = lm.run_with_trace(ids, fast=True, **kw)
    t2 = time.perf_counter()
    exact = {}
    if f64:
        m.double()
        try:
            _, ref = lm.run_with_trace(ids, fast=False, **kw)
            for path, tr in (("step", slow), ("fast", fast)):
                exact[path] = max((tr.attention(i, head=h).double() - ref.attention(i, head=h)).abs().max().item()
                                  for i in range(m.cfg.n_layers) for h in range(m.cfg.n_heads))
        finally:
            m.float()
    cfg = m.cfg
    worst, per_layer = (0.0, -1, -1), []
    with torch.no_grad():
        for layer in range(cfg.n_layers):
            top = 0.0
            for head in range(cfg.n_heads):
                d = (slow.attention(layer, head=head) - fast.attention(layer, head=head)).abs().max().item()
                top = max(top, d)
                worst = max(worst, (d, layer, head))
            per_layer.append(top)
        logits, scale = 0.0, 0.0
        a, b = slow["decoder.out"], fast["decoder.out"]
        for s in range(0, a.shape[1], 256):  # every position's logits, a few rows at a time (262k-token vocab)
            la, lb = m._unembed_normed(a[:, s:s + 256]), m._unembed_normed(b[:, s:s + 256])
            logits, scale = max(logits, (la - lb).abs().max().item()), max(scale, la.abs().max().item())
    return {"weights": worst[0], "layer": worst[1], "head": worst[2], "per_layer": per_layer, "logits": logits,
            "logit_scale": scale, "last": (slow_last - fast_last).abs().max().item(),
            "same_top": bool(slow_last[0, -1].argmax() == fast_last[0, -1].argmax()),
            "seconds": (t1 - t0, t2 - t1), "f64": exact}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--models", default="smollm2,gemma3,tiny")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--per-layer", action="store_true", help="also print each layer's largest weight drift")
    ap.add_argument("--f64", action="store_true", help="also each path's weight error against a float64 run "
                    "(Gemma 3 at 2,048 tokens: about 3 more minutes on 2 cores)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from model import load_model

    T, rows = args.tokens, []
    for name in args.models.split(","):
        models = [(label, lambda k=kind, e=extra: tiny_model(k, e)) for label, (kind, extra) in TINY.items()] \
            if name == "tiny" else [(name, lambda n=name: load_model(n))]
        for label, make in models:
            lm = make()
            if lm.tokenizer is not None and lm.tokenizer.get_vocab_size() > 512:
                ids = lm.encode(TEXT * (T // 40 + 2))[:, :T]
            else:  # a tiny model: random ids
                ids = torch.randint(3, lm.model.cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
            r = drift(lm, ids, args.f64)
            rows.append((label, r))
            print(f"{label}: weights {r['weights']:.1e} (L{r['layer']}H{r['head']}), logits {r['logits']:.1e} "
                  f"(scale {r['logit_scale']:.0f}; last position {r['last']:.1e}, same top token: {r['same_top']}); "
                  f"step by step {r['seconds'][0]:.1f} s, fast {r['seconds'][1]:.1f} s", flush=True)
            if args.per_layer:
                print("  max |Δ weights| per layer: " + " ".join(f"{x:.1e}" for x in r["per_layer"]))
            if r["f64"]:
                print(f"  weights against float64: step by step {r['f64']['step']:.1e}, fast {r['f64']['fast']:.1e}")
            del lm
    print(f"\nfast vs step-by-step at {T} tokens, torch {torch.__version__}, {torch.get_num_threads()} threads")
    f64 = " | weights vs float64: step / fast" if args.f64 else ""
    print("| model | weights: max abs diff (layer, head) | logits: max abs diff (every position) | last position "
          f"| same top token{f64} |")
    print("|---|---|---|---|---|" + ("---|" if f64 else ""))
    for label, r in rows:
        e = f" | {r['f64']['step']:.1e} / {r['f64']['fast']:.1e}" if r["f64"] else ""
        print(f"| {label} | {r['weights']:.1e} (L{r['layer']} H{r['head']}) | {r['logits']:.1e} | {r['last']:.1e} "
              f"| {'yes' if r['same_top'] else 'no'}{e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
