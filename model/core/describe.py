"""What a model says about itself, once: its stacks and its attention modules, with their kind and
which token list labels their query and key axes. Every model's `describe()` returns this dict and
`run_with_trace` stores it in `trace.meta["model"]`, so figures and analyses read it instead of
parsing capture names:

    {"family": "transformer" | "encoder" | "decoder_lm",
     "stacks": {"encoder": {"layers": 2, "tokens": "src_tokens"}, "decoder": {...}},
     "attention": {"decoder.layers.0.cross_attn": {"kind": "cross", "stack": "decoder", "layer": 0,
                   "causal": False, "query_tokens": "tgt_tokens", "key_tokens": "src_tokens",
                   "n_heads": 4, "n_kv_heads": 4, "d_head": 16}, ...},   # in computation order
     "blocks": {...}}                                                 # positions, norm, FFN, sizes

Kinds: "encoder_self", "decoder_self" (masked: a query sees only earlier keys) and "cross" (queries
from the decoder, keys and values from the encoder output).

Decoder LMs (model/families/lm.py) add, per attention entry, what it takes to recompute the layer's
weights from its recorded q and k (`<attn>.q` is after q/k norm and RoPE, so these are all that is left):

    "scale":   float, the real query scale: scores = q·kᵀ × scale (1/√d_head, or Gemma 2/3's
               query_pre_attn_scalar^-0.5)
    "softcap": float | None, scores -> softcap · tanh(scores / softcap), after the scale, before the mask
    "window":  int | None, sliding window W: the query at position p sees keys p-W+1 .. p (blocked when
               p - j >= W, as Hugging Face's sliding_window_overlay); None = plain causal
    "rope":    None, or {"base", "scaling" ("default" | "linear" | "llama3" | "yarn"), "factor", ("low_freq_factor",
               "high_freq_factor", "original_max_len" for llama3), "rotary_dim" (< d_head: partial rotary,
               only the first rotary_dim dims turn), "angles" (the capture name of this layer's angles:
               "decoder.rope.angles" or, for Gemma 3's local layers, "decoder.rope.angles_local")}
    "qk_norm": bool (RMSNorm on q and k before RoPE); "qk_norm_over": "head" | "full" | None
    "layer_type": "full" | "sliding"

    weights = softmax(mask(softcap(q·kᵀ × scale)))  with the window in the mask, per query head
    (query head h reads K/V head h // (n_heads / n_kv_heads)); softmax in float32 for bf16/fp16 models.

and in "blocks": "norm_position" ("pre" | "sandwich" | "post"), "post_norms", "parallel_residual",
"embed_scale" (√d_model or None), "final_softcap", "sliding_window", "moe" (None or {"n_experts",
"top_k", "d_ff", "norm_topk", "shared", "shared_d_ff", "shared_gate", "layers"}).

Issue 32's mechanisms are in "blocks" only where the model has them (absent otherwise):
    "shared_norm": True        a parallel block whose attention and FFN read one norm, norm1 (Phi, Cohere)
    "norm_bias": False         LayerNorm without a bias (Cohere)
    "generator_bias": True     the unembedding has a bias (Phi): logits = W·x + b
    "logit_scale": s           logits × s (Cohere);  "logits_scaling": s   logits ÷ s (Granite)
    "embed_multiplier": m      token embedding × m (Granite)
    "residual_multiplier": m   each sublayer's output × m before it joins the stream (Granite; captured as
                               `<layer>.scale_attn.out`, `<layer>.scale_ffn.out`)
    "rope_interleaved": True   the checkpoint turns pairs (2i, 2i+1) (Cohere, GLM-4); the loader reordered each
                               head's q/k dims to the lab's (i, i + r/2), so `.q`/`.k` hold them in that order
    "nope_layers": [i, ...]    layers that attend without RoPE (SmolLM3): their entry's "rope" is None
    "attn_sinks": True         learned attention sinks (gpt-oss): each attention entry then has
                               "sinks": [s_0, ..., s_{H-1}], the head's learned logit, so that
                               weights, sink = softmax([q·kᵀ × scale + M, s_h]) split at the last column
                               (model/core/attention.sink_softmax; `<attn>.sink` is the last column)
    "moe" gains "router" ("topk_softmax": the top-k logits, then a softmax over them), "bias" (router and experts),
    "swiglu_limit", "swiglu_alpha" (the experts' clamped SwiGLU) where the model has them (gpt-oss)
and a "rope" entry of scaling "yarn" has "factor", "beta_fast", "beta_slow", "truncate", "original_max_len" and
"attention_factor" (cos and sin × it: `.q` and `.k` are that much longer after RoPE).
"""

from __future__ import annotations

from collections.abc import Mapping

KINDS = ("encoder_self", "decoder_self", "cross")
SIDES = {"encoder": "src_tokens", "decoder": "tgt_tokens"}  # the trace.meta key of each stack's tokens


def attention_entry(kind: str, stack: str, layer: int, n_heads: int, d_head: int,
                    n_kv_heads: int | None = None, **mechanisms) -> dict:
    """One attention module's description (`mechanisms`: the decoder LMs' keys documented above)."""
    query = SIDES[stack]
    return {"kind": kind, "stack": stack, "layer": layer, "causal": kind == "decoder_self",
            "query_tokens": query, "key_tokens": SIDES["encoder"] if kind == "cross" else query,
            "n_heads": n_heads, "n_kv_heads": n_kv_heads or n_heads, "d_head": d_head, **mechanisms}


def describe_transformer(cfg: Mapping) -> dict:
    """The description of a `TransformerConfig` (as a dict): built from the config alone, so a trace
    saved before descriptions existed is described from its metadata's config too."""
    H, d_head = cfg["n_heads"], cfg["d_model"] // cfg["n_heads"]
    n_enc, n_dec = cfg["n_encoder_layers"], cfg.get("n_decoder_layers", 0)
    attention = {f"encoder.layers.{i}.self_attn": attention_entry("encoder_self", "encoder", i, H, d_head)
                 for i in range(n_enc)}
    for i in range(n_dec):
        attention[f"decoder.layers.{i}.self_attn"] = attention_entry("decoder_self", "decoder", i, H, d_head)
        attention[f"decoder.layers.{i}.cross_attn"] = attention_entry("cross", "decoder", i, H, d_head)
    stacks = {"encoder": {"layers": n_enc, "tokens": SIDES["encoder"]}}
    if n_dec:
        stacks["decoder"] = {"layers": n_dec, "tokens": SIDES["decoder"]}
    blocks = {"positional": cfg.get("positional", "sinusoidal"), "norm": "layernorm",
              "norm_first": cfg.get("norm_first", False), "ffn": "plain", "activation": cfg.get("activation", "relu"),
              "d_model": cfg["d_model"], "d_ff": cfg["d_ff"]}
    return {"family": "transformer" if n_dec else "encoder", "stacks": stacks, "attention": attention,
            "blocks": blocks}


def described(meta: Mapping | None) -> dict:
    """The model description of a trace's metadata: meta["model"], or, for a trace saved before
    descriptions existed, the one its config implies; {} when neither is there."""
    meta = meta or {}
    desc = meta.get("model")
    if isinstance(desc, Mapping) and "attention" in desc:
        return dict(desc)
    cfg = meta.get("config")
    if isinstance(cfg, Mapping):
        try:
            return describe_transformer(cfg)
        except (KeyError, TypeError, ZeroDivisionError):
            return {}
    return {}


def attention_of(meta: Mapping | None, name: str) -> dict | None:
    """The description of the attention module a capture name belongs to ("...cross_attn.weights" ->
    the cross-attention module's entry, with "module" added), or None when it is no attention capture."""
    for module, info in described(meta).get("attention", {}).items():
        if name == module or name.startswith(module + "."):
            return {"module": module, **info}
    return None


def token_sides(meta: Mapping | None, name: str) -> tuple[str, str]:
    """The trace.meta keys of the token lists that label a capture's query and key axes. Captures
    outside attention (embeddings, norms, layer outputs) take the tokens of their stack."""
    info = attention_of(meta, name)
    if info is not None:
        return info["query_tokens"], info["key_tokens"]
    if name == "masks.src_pad":
        return SIDES["encoder"], SIDES["encoder"]
    for stack, s in described(meta).get("stacks", {}).items():
        if name.startswith(stack + "."):
            return s["tokens"], s["tokens"]
    return SIDES["decoder"], SIDES["decoder"]
