"""Decoder-only language models (GPT-2, Llama, Qwen2, SmolLM2...), instrumented like the 2017 Transformer.

A decoder-only LM is the paper's decoder stack without cross-attention, so its module tree and
capture names follow the decoder's (every view that reads `decoder.*` works):

    decoder.embed.{tok, pos}            token table (+ learned positions, GPT-2)
    decoder.layers[i].norm1             LayerNorm or RMSNorm, before attention (pre-LN)
    decoder.layers[i].self_attn         masked self-attention: w_q, w_k, w_v, w_o (+ RoPE, grouped K/V)
    decoder.layers[i].norm2             before the FFN
    decoder.layers[i].ffn               linear1 (up), gate (SwiGLU only), linear2 (down)
    decoder.norm                        final norm
    generator                           output projection, tied to decoder.embed.tok when configured

One config (`LMConfig`, in the style of nanoGPT / TransformerLens's HookedTransformerConfig) holds
every switch: positions learned or rotary, n_kv_heads (grouped-query attention), norm, plain or gated
FFN, activation, biases, tied embeddings.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from model.core import recorder
from model.core.attention import MultiHeadAttention, causal_mask
from model.core.config import DictConfig
from model.core.describe import SIDES, attention_entry
from model.core.layers import ACTIVATIONS, FeedForward, LayerNorm, RMSNorm, rotary_angles
from model.core.recorder import CaptureError, Hook, record
from model.core.trace import Trace, run_lazy

POSITIONALS = ("learned", "rotary")
NORMS = ("layernorm", "rmsnorm")
FFNS = ("plain", "gated")


@dataclass(frozen=True)
class LMConfig(DictConfig):
    vocab_size: int
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    n_kv_heads: int | None = None  # None = n_heads; fewer = grouped-query attention
    d_ff: int = 3072
    max_len: int = 1024  # longest sequence (learned: the position table's rows)
    positional: str = "learned"  # or "rotary"
    rope_base: float = 10000.0
    norm: str = "layernorm"  # or "rmsnorm"
    norm_eps: float = 1e-5
    ffn: str = "plain"  # or "gated" (SwiGLU: down(act(gate(x)) * up(x)))
    activation: str = "gelu_tanh"  # "gelu" (erf), "gelu_tanh" (GPT-2), "silu" (Llama), "relu"
    qkv_bias: bool = True
    out_bias: bool = True
    ffn_bias: bool = True
    tie_embeddings: bool = True  # generator.weight is decoder.embed.tok.weight
    d_head: int | None = None  # None = d_model // n_heads (filled in at init)
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int | None = None

    def __post_init__(self) -> None:
        for f in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{f} must be a positive integer, got {v!r}")
        for f in ("n_kv_heads", "d_head", "bos_id", "eos_id", "pad_id"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"{f} must be a non-negative integer or None, got {v!r}")
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}), "
                                 "or give d_head")
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)  # always an int after init
        elif self.d_head == 0:
            raise ValueError("d_head must be a positive integer")
        if self.kv_heads <= 0 or self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        for f, allowed in (("positional", POSITIONALS), ("norm", NORMS), ("ffn", FFNS),
                           ("activation", ACTIVATIONS)):
            if getattr(self, f) not in allowed:
                raise ValueError(f"{f} must be one of {allowed}, got {getattr(self, f)!r}")
        if self.positional == "rotary" and self.head_dim % 2:
            raise ValueError(f"rotary positions rotate pairs of dimensions: d_head ({self.head_dim}) must be even")
        if not self.rope_base > 0 or not self.norm_eps > 0:
            raise ValueError(f"rope_base and norm_eps must be > 0, got {self.rope_base!r}, {self.norm_eps!r}")
        for f in ("bos_id", "eos_id", "pad_id"):
            v = getattr(self, f)
            if v is not None and v >= self.vocab_size:
                raise ValueError(f"{f} ({v}) must be below vocab_size ({self.vocab_size})")

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:  # = d_head (the name Hugging Face configs use)
        return self.d_head

    def num_parameters(self) -> int:
        """Parameter count implied by the sizes (checked before anything is allocated)."""
        D, F, V, hs = self.d_model, self.d_ff, self.vocab_size, self.head_dim
        H, Hkv = self.n_heads, self.kv_heads
        attn = D * hs * (2 * H + 2 * Hkv) + (hs * (H + 2 * Hkv) if self.qkv_bias else 0) + (D if self.out_bias else 0)
        ffn = (3 if self.ffn == "gated" else 2) * D * F + ((2 if self.ffn == "gated" else 1) * F + D
                                                          if self.ffn_bias else 0)
        norm = D * (2 if self.norm == "layernorm" else 1)
        per_layer = attn + ffn + 2 * norm
        embed = V * D + (self.max_len * D if self.positional == "learned" else 0)
        return self.n_layers * per_layer + embed + norm + (0 if self.tie_embeddings else V * D)



def _norm(cfg: LMConfig) -> nn.Module:
    return LayerNorm(cfg.d_model, eps=cfg.norm_eps) if cfg.norm == "layernorm" else RMSNorm(cfg.d_model, cfg.norm_eps)


class LMEmbeddings(nn.Module):
    """Token embedding (not scaled by √d_model, unlike the paper) + learned positions (GPT-2);
    rotary models add no position here (RoPE rotates q and k inside attention)."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model) if cfg.positional == "learned" else None

    def forward(self, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        x = record("decoder.embed.tok", self.tok(ids))  # (B, T, D)
        if self.pos is not None:
            x = x + record("decoder.embed.pos", self.pos.weight[offset:offset + ids.shape[1]])  # (T, D)
        return record("decoder.embed.out", x)

    def capture_points(self, B: int, T: int) -> dict[str, tuple[int, ...]]:
        D = self.tok.embedding_dim
        pos = {} if self.pos is None else {"decoder.embed.pos": (T, D)}
        return {"decoder.embed.tok": (B, T, D)} | pos | {"decoder.embed.out": (B, T, D)}


class LMBlock(nn.Module):
    """Pre-LN decoder layer without cross-attention: x + Attn(Norm1(x)), then + FFN(Norm2(x))."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.norm1 = _norm(cfg)
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, 0.0, n_kv_heads=cfg.kv_heads,
                                            d_head=cfg.head_dim, qkv_bias=cfg.qkv_bias, out_bias=cfg.out_bias)
        self.norm2 = _norm(cfg)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, 0.0, cfg.ffn_bias, gated=cfg.ffn == "gated")
        self.rotary = cfg.positional == "rotary"
        self.name = "decoder.layers.?"

    def forward(self, x, mask, angles=None, cache: dict | None = None) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.self_attn(h, h, mask, cache, angles=angles)
        x = x + self.ffn(self.norm2(x))
        return record(f"{self.name}.out", x)

    def capture_points(self, B: int, T: int) -> dict[str, tuple[int, ...]]:
        return (self.norm1.capture_points(B, T) | self.self_attn.capture_points(B, T, T, self.rotary)
                | self.norm2.capture_points(B, T) | self.ffn.capture_points(B, T)
                | {f"{self.name}.out": (B, T, self.ffn.linear2.out_features)})


class LMDecoder(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.embed = LMEmbeddings(cfg)
        self.layers = nn.ModuleList(LMBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = _norm(cfg)


class DecoderLM(nn.Module):
    """A decoder-only language model; same API shape as `Transformer` (forward, run_with_trace,
    run_with_hooks, hooks, resolve_hooks, capture_names, new_cache, describe, num_parameters)."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.decoder = LMDecoder(cfg)
        self.generator = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if not self.decoder.embed.tok.weight.is_meta:
            self._init_weights()
        self.tie()
        for path, module in self.named_modules():  # capture names = module path + role
            if isinstance(module, MultiHeadAttention | FeedForward | LMBlock | LayerNorm | RMSNorm):
                module.name = path

    def _init_weights(self) -> None:  # GPT-2's init; real models overwrite it
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def tie(self) -> None:
        """Share the token table and the output projection (again after load_state_dict(assign=True))."""
        if self.cfg.tie_embeddings:
            self.generator.weight = self.decoder.embed.tok.weight

    # ------------------------------------------------------------------ forward

    def forward(self, ids: torch.Tensor, cache: list[dict] | None = None, offset: int = 0,
                last_only: bool = False) -> torch.Tensor:
        """(B, T) ids -> logits (B, T, V). With `cache` (new_cache()), `ids` are the new tokens at
        absolute positions offset..offset+T-1; their keys and values are appended to the cache.
        last_only: logits of the last position only, (B, 1, V) (generation: a long prompt's other rows
        would cost T × d_model × vocab for nothing)."""
        self._check_ids(ids, offset)
        T = ids.shape[1]
        B = ids.shape[0]
        future = record("masks.causal", causal_mask(T, offset=offset, device=ids.device))  # (T, offset + T)
        mask = future[None, None].expand(B, 1, T, offset + T)
        x = self.decoder.embed(ids, offset)
        angles = None
        if self.cfg.positional == "rotary":
            angles = record("decoder.rope.angles", rotary_angles(T, self.cfg.head_dim, self.cfg.rope_base, offset))
        for i, layer in enumerate(self.decoder.layers):
            x = layer(x, mask, angles, None if cache is None else cache[i])
        x = record("decoder.out", self.decoder.norm(x))
        return record("logits", self.generator(x[:, -1:] if last_only else x))

    def new_cache(self) -> list[dict]:
        return [{} for _ in range(self.cfg.n_layers)]

    def _check_ids(self, ids: torch.Tensor, offset: int) -> None:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            got = f"{tuple(ids.shape)} {ids.dtype}" if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise ValueError(f"ids must be an integer tensor of shape (batch, length), got {got}")
        if ids.shape[1] == 0:
            raise ValueError("the token sequence is empty")
        if offset + ids.shape[1] > self.cfg.max_len:
            raise recorder.ContextLengthError(
                f"sequence of {offset + ids.shape[1]} tokens is longer than this model's limit "
                f"max_len={self.cfg.max_len}", n_tokens=offset + ids.shape[1], context_length=self.cfg.max_len)
        if int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size:
            raise ValueError(f"ids must be in [0, {self.cfg.vocab_size}); got ids in [{int(ids.min())}, "
                             f"{int(ids.max())}] (does the tokenizer match the model?)")

    # ------------------------------------------------------------------ capture

    def capture_names(self, B: int = 1, T: int = 1) -> dict[str, tuple[int, ...]]:
        """Every capture (and hook) point of a forward pass on (B, T) ids, in computation order, with
        its shape: walked from the module tree, each module listing its own."""
        pts = {"masks.causal": (T, T)} | self.decoder.embed.capture_points(B, T)
        if self.cfg.positional == "rotary":
            pts["decoder.rope.angles"] = (T, self.cfg.head_dim // 2)
        for layer in self.decoder.layers:
            pts |= layer.capture_points(B, T)
        return pts | self.decoder.norm.capture_points(B, T) | {"decoder.out": (B, T, self.cfg.d_model),
                                                              "logits": (B, T, self.cfg.vocab_size)}

    def resolve_hooks(self, hooks: Mapping[str, Hook | list[Hook]] | None) -> dict[str, list[Hook]]:
        """{glob: fn} -> {capture name: [fn]}; a glob that matches no point is an error listing them."""
        return recorder.resolve_hooks(list(self.capture_names()), hooks)

    def hooks(self, hooks: Mapping[str, Hook | list[Hook]] | None) -> recorder.hooking:
        """`with lm.hooks({"decoder.layers.3.self_attn.z": fn}):` every forward pass inside it runs under them."""
        return recorder.hooking(self.resolve_hooks(hooks))

    def run_with_hooks(self, ids: torch.Tensor, hooks=None, cache: list[dict] | None = None,
                       offset: int = 0) -> torch.Tensor:
        with self.hooks(hooks):
            return self(ids, cache, offset)

    def run_with_trace(
        self,
        ids: torch.Tensor,
        names: str | Sequence[str] | None = None,
        hooks: Mapping[str, Hook | list[Hook]] | None = None,
        budget_bytes: int | None = recorder.DEFAULT_BUDGET_BYTES,
        meta: dict | None = None,
        lazy: bool = False,
        fast: bool = False,
    ) -> tuple[torch.Tensor, Trace]:
        """Forward pass recording the named tensors (None = all; fnmatch globs); same math as forward,
        so the logits are bit-identical. A capture over `budget_bytes` is refused before running, with
        what would fit (CaptureBudgetError: needed_bytes, budget, max_tokens).

        lazy=True (long inputs): a LazyTrace (model/core/trace.py) that stores q, k, v per layer (+ the
        O(T·d) names in `names`) and computes scores/mask/weights/z when asked; fast=True runs it
        under recorder.fast_attention() (fused attention; logits equal forward's to float rounding)."""
        if lazy:
            return run_lazy(self, ids, names, hooks, budget_bytes, meta, fast)
        self._check_ids(ids, 0)
        B, T = ids.shape
        shapes = self.capture_names(B, T)
        wanted = recorder.select_names(list(shapes), names)
        itemsize = next(self.parameters()).element_size()
        n_bytes = recorder.estimate_bytes(shapes, wanted, itemsize)
        if budget_bytes is not None and n_bytes > budget_bytes:
            raise self._over_budget(names, shapes, wanted, n_bytes, budget_bytes, B, T, itemsize)
        with self.hooks(hooks), recorder.capturing(set(wanted), n_bytes + 64 * len(wanted)) as rec:
            out = self(ids)
        info = {
            "config": self.cfg.to_dict(),
            "model": self.describe(),
            "tgt_ids": ids.tolist(),
            "mask_convention": "True = blocked (attention not allowed)",
            "training": self.training,
            "dtype": str(out.dtype).removeprefix("torch."),
        }
        if hooks:
            info["hooks"] = {p: getattr(fn, "__name__", repr(fn)) if callable(fn) else repr(fn)
                             for p, fn in hooks.items()}
        info.update(meta or {})
        return out, Trace({n: rec.tensors[n] for n in wanted if n in rec.tensors}, info)

    def _over_budget(self, names, shapes, wanted, n_bytes, budget, B, T, itemsize) -> CaptureError:
        """The refusal message: how long an input these names fit, and how many of them fit at this length."""
        def size(t: int) -> int:
            s = self.capture_names(B, t)
            return recorder.estimate_bytes(s, recorder.select_names(list(s), names), itemsize)

        lo, hi = 0, T  # largest length that fits (sizes grow with T)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if size(mid) <= budget else (lo, mid - 1)
        fits, used = 0, 0
        for n in wanted:
            used += recorder.estimate_bytes(shapes, [n], itemsize)
            if used > budget:
                break
            fits += 1
        shown = names if isinstance(names, str) or names is None else list(names)
        one = f"decoder.layers.{self.cfg.n_layers // 2}.self_attn.weights"
        return recorder.CaptureBudgetError(
            f"capturing {shown!r} at {T} tokens needs about {n_bytes / 2**20:.1f} MiB, over the budget of "
            f"{budget / 2**20:.1f} MiB. What fits: the same names up to {lo} tokens; or, at {T} tokens, "
            f"{fits} of these {len(wanted)} tensors, e.g. one layer's attention: names={one!r} "
            f"({recorder.estimate_bytes(shapes, [one], itemsize) / 2**20:.1f} MiB); or lazy=True. Or raise "
            f"budget_bytes.", needed_bytes=n_bytes, budget=budget, n_tokens=T, max_tokens=lo,
            context_length=self.cfg.max_len)

    # ------------------------------------------------------------------ description

    def describe(self) -> dict:
        """The model's own description (see model/core/describe.py), recorded in trace.meta["model"]."""
        c = self.cfg
        attention = {f"decoder.layers.{i}.self_attn": attention_entry("decoder_self", "decoder", i, c.n_heads,
                                                                      c.head_dim, c.kv_heads)
                     for i in range(c.n_layers)}
        blocks = {"positional": c.positional, "norm": c.norm, "norm_first": True, "ffn": c.ffn,
                  "activation": c.activation, "tied_embeddings": c.tie_embeddings, "d_model": c.d_model,
                  "d_ff": c.d_ff, "vocab_size": c.vocab_size}
        if c.positional == "rotary":
            blocks["rope_base"] = c.rope_base
        return {"family": "decoder_lm", "stacks": {"decoder": {"layers": c.n_layers, "tokens": SIDES["decoder"]}},
                "attention": attention, "blocks": blocks}

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


@functools.lru_cache(maxsize=8)
def _skeleton(cfg: LMConfig) -> DecoderLM:
    with torch.device("meta"):
        return DecoderLM(cfg)


def lm_capture_shapes(cfg: LMConfig, B: int, T: int) -> dict[str, tuple[int, ...]]:
    """Every capture name of one forward pass on (B, T) ids, with its shape (from the module tree)."""
    return _skeleton(cfg).capture_names(B, T)

