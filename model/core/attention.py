"""Masks and multi-head attention, written out step by step so every tensor can be recorded.

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V,    M = -∞ where blocked, 0 elsewhere
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O

Mask convention (everywhere in this project): True = attention is blocked.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model.core.layers import RMSNorm, apply_rotary, tensor_version
from model.core.recorder import fast_attention_allowed, hook, keep, record


def padding_mask(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, L) bool, True where the token is padding. A new tensor: `ids` is never modified."""
    return ids == pad_id


def causal_mask(n_query: int, n_key: int | None = None, offset: int = 0, device=None,
                window: int | None = None) -> torch.Tensor:
    """(Lq, Lk) bool, True above the diagonal: query i (at absolute position offset + i) cannot see later keys.

    With a key/value cache, the new queries start at `offset` and the keys at 0.
    window (sliding-window attention: Mistral, Gemma 2/3 local layers): the query at position p also
    cannot see keys at p - window or earlier, so it sees the `window` positions p - window + 1 .. p
    (itself included), as Hugging Face's sliding_window_overlay (kv_idx > q_idx - window).
    """
    n_key = n_query + offset if n_key is None else n_key
    ones = torch.ones(n_query, n_key, dtype=torch.bool, device=device)
    mask = torch.triu(ones, diagonal=offset + 1)
    if window is not None:
        mask |= torch.tril(ones, diagonal=offset - window)  # key j blocked when (offset + i) - j >= window
    return mask


def softcap(scores: torch.Tensor, cap: float) -> torch.Tensor:
    """Soft-capping (Gemma 2): cap · tanh(scores / cap), smooth and bounded to (-cap, cap); near 0 it is
    the identity, so only large logits are squeezed."""
    return torch.tanh(scores / cap) * cap


def attention_mask(key_pad: torch.Tensor, n_query: int, causal: torch.Tensor | None = None) -> torch.Tensor:
    """(B, 1, Lq, Lk): padding blocks keys only (a padded query still attends to real tokens);
    the decoder's self-attention adds the look-ahead mask: blocked = future OR key is padding."""
    B, Lk = key_pad.shape
    mask = key_pad[:, None, None, :].expand(B, 1, n_query, Lk)
    if causal is not None:
        mask = mask | causal[None, None]
    return mask


def attention_scores(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """(B, H, Lq, hs) x (B, H, Lk, hs) -> (B, H, Lq, Lk): q·kᵀ/√d_k (scale None: divide by √d_k, as the
    paper), or q·kᵀ × scale. The one function the forward and a lazy trace's recompute call, so both
    give the same bits."""
    s = q @ k.transpose(-2, -1)
    # Var(q·k) = d_k for unit-variance entries: dividing by √d_k keeps softmax out of saturation.
    return s / math.sqrt(q.shape[-1]) if scale is None else s * scale


def attention_weights(scores: torch.Tensor, mask: torch.Tensor | None, sinks: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """softmax(scores + M) over keys, M = -inf where `mask` (B, 1, Lq, Lk) is True: blocked cells get
    exactly 0, a row with no visible key is all 0 (not NaN). Shared by the forward and the recompute.
    sinks (H,): gpt-oss's learned sink logits (sink_softmax's weights: each row sums to 1 − its sink)."""
    if sinks is not None:
        return sink_softmax(scores, mask, sinks)[0]
    bias, empty_row = _additive_mask(mask, scores.dtype, scores.device)
    if bias is not None:  # none blocked (a new token's row): + 0 changes nothing
        weights = _softmax(scores + bias)
        if empty_row:  # a row with no visible key: softmax gives NaN; make it 0
            weights = weights.masked_fill(mask, 0.0)
        return weights
    return _softmax(scores)


def _additive_mask(mask: torch.Tensor | None, dtype: torch.dtype, device) -> tuple[torch.Tensor | None, bool]:
    """The additive M of a bool mask (B, 1, Lq, Lk): 0 where visible, -inf where blocked (None when nothing is
    blocked), and whether some row has no visible key. The additive M is H times smaller than the scores: cheaper
    than masked_fill. Built once per mask tensor and kept on it: a forward hands the same mask to every layer of
    a kind (as Hugging Face builds its additive mask once per forward); the same numbers as building it each time."""
    if mask is None:
        return None, False
    key = (dtype, device, tensor_version(mask))  # an in-place change of the mask invalidates the memo
    memo = getattr(mask, "_lab_additive", None)
    if memo is not None and memo[0] == key:
        return memo[1], memo[2]
    bias, empty_row = None, False
    if bool(mask.any()):
        bias = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(mask, float("-inf"))
        empty_row = bool(mask.all(dim=-1).any())
    mask._lab_additive = (key, bias, empty_row)
    return bias, empty_row


def sink_softmax(scores: torch.Tensor, mask: torch.Tensor | None,
                 sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with a learned sink (gpt-oss): each head h has one more logit, sinks[h], that every query row
    sees beside its keys; the softmax runs over [scores + M, sinks[h]] and the sink's column is then dropped, so
    a head can give its queries' weight to nothing (the row's weights over real keys sum to 1 − sink).
    Returns (weights (B, H, Lq, Lk), sink (B, H, Lq): the probability each row gave the sink). As transformers'
    gpt-oss eager attention: the max subtracted in the scores' dtype, the softmax in that dtype."""
    bias, _ = _additive_mask(mask, scores.dtype, scores.device)
    if bias is not None:
        scores = scores + bias  # a blocked key gets exactly 0; the sink is always there, so no row is empty
    B, H, Lq, _ = scores.shape
    col = sinks.to(scores.dtype).reshape(1, H, 1, 1).expand(B, H, Lq, 1)
    combined = torch.cat([scores, col], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = F.softmax(combined, dim=-1, dtype=combined.dtype)
    return probs[..., :-1], probs[..., -1]


def _sink_attention_z(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                      scale: float | None, sinks: torch.Tensor, cells: int = 1 << 24) -> torch.Tensor:
    """The fast path's z for a module with sinks (no fused kernel takes a per-head extra logit): the step-by-step
    math a block of query rows at a time, so no (H, Lq, Lk) tensor is formed for a long prompt."""
    r = q.shape[1] // k.shape[1]
    if r != 1:
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
    B, H, Lq, _ = q.shape
    rows = max(1, cells // (B * H * k.shape[2]))
    out = []
    for a in range(0, Lq, rows):
        m = None if mask is None else mask[:, :, a:a + rows]
        w, _ = sink_softmax(attention_scores(q[:, :, a:a + rows], k, scale), m, sinks)
        out.append(w @ v)
    return torch.cat(out, dim=2)


def _softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over keys; in bfloat16/float16 computed in float32 and cast back (as Hugging Face's eager
    attention), in float32 and float64 the plain softmax (never narrowed: a float64 model, as the attribution
    tests' finite differences use, keeps float64)."""
    if x.dtype not in (torch.bfloat16, torch.float16):
        return F.softmax(x, dim=-1)
    return F.softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    scale: float | None = None) -> torch.Tensor:
    """The fast path's z: torch's fused scaled_dot_product_attention (tiled: no (Lq, Lk) matrix per head),
    for k, v with the model's own K/V heads (grouped-query served by enable_gqa). Same math as
    attention_weights(attention_scores(...)) @ v up to float rounding, NOT the same bits: used only
    under `recorder.fast_attention()` when nothing inside attention is recorded or hooked."""
    Lq, Lk = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    gqa = k.shape[1] != q.shape[1]
    if mask is None or not bool(mask.any()):
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)
    if Lq == Lk and bool((mask == causal_mask(Lq, device=mask.device)).all()):  # look-ahead only
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    if bool(mask.all(dim=-1).any()):  # a row with no visible key: sdpa gives NaN there, we give 0
        return attention_weights(attention_scores(q, k, scale), mask) @ v  # never here for an LM
    return F.scaled_dot_product_attention(q, k, v, attn_mask=~mask, scale=scale, enable_gqa=gqa)


class MultiHeadAttention(nn.Module):
    """W^Q, W^K, W^V, W^O are nn.Linear(d_model, d_model): all heads side by side (E = N x H).

    Language models add three switches (the 2017 defaults leave the math untouched):
    - n_kv_heads < n_heads: grouped-query attention. W^K, W^V give n_kv_heads heads; query head h
      reads key/value head h // (n_heads / n_kv_heads), so K/V head g is shared by query heads
      g*r .. g*r + r - 1 (r = n_heads / n_kv_heads). `.k`/`.v` keep the model's own n_kv_heads.
    - qkv_bias / out_bias: biases of W^Q, W^K, W^V and of W^O (Llama has none, Qwen2 only on Q/K/V).
    - rotary: forward's `angles` rotate q and k (RoPE); `.q_unrot`/`.k_unrot` record them before.
    And the 2024-2026 mechanisms, each one switch (off by default):
    - scale: the query scale scores = q·kᵀ × scale (Gemma 2/3: query_pre_attn_scalar^-0.5); None = 1/√d_k;
    - softcap: scores -> softcap · tanh(scores / softcap) before the mask (Gemma 2); `.scores` is before
      the cap, `.scores_capped` after;
    - qk_norm: RMSNorm of q and k before RoPE, "head" (over each head's d_head: Qwen3, Gemma 3) or "full"
      (over the whole projection, before the split into heads: OLMo 2, OLMoE); modules `q_norm`, `k_norm`
      record `<attn>.q_norm.in/.out`, `<attn>.k_norm.in/.out`. `.q_unrot`/`.k_unrot` are after the norm.
    - sinks (gpt-oss): a learned logit per head (parameter `sinks`, (H,)) joins each row's softmax as one more
      column and is dropped after it (sink_softmax): `.weights` sum to 1 − `.sink` per row, `.sink` (B, H, Lq)
      is the probability each query gave the sink, i.e. to no token;
    - rope_scale: YaRN's attention factor, cos and sin × it (gpt-oss), so `.q`/`.k` are × it after RoPE.
    The sliding window is in the mask the layer is given (causal_mask(..., window=W)).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, n_kv_heads: int | None = None,
                 d_head: int | None = None, qkv_bias: bool = True, out_bias: bool = True,
                 scale: float | None = None, softcap: float | None = None, qk_norm: str | None = None,
                 norm_eps: float = 1e-6, norm_style: str = "llama", rope_float32: bool = False,
                 sinks: bool = False, rope_scale: float | None = None):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_head or d_model // n_heads
        self.n_kv_heads = n_kv_heads or n_heads
        if n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads}): "
                             "each key/value head serves the same number of query heads")
        hs = self.d_head
        self.w_q = nn.Linear(d_model, n_heads * hs, bias=qkv_bias)
        self.w_k = nn.Linear(d_model, self.n_kv_heads * hs, bias=qkv_bias)
        self.w_v = nn.Linear(d_model, self.n_kv_heads * hs, bias=qkv_bias)
        self.w_o = nn.Linear(n_heads * hs, d_model, bias=out_bias)
        self.dropout = nn.Dropout(dropout)
        self.scale, self.softcap, self.qk_norm = scale, softcap, qk_norm
        self.rope_float32 = rope_float32  # OLMo 2 rotates bfloat16 q/k with float32 cos/sin
        self.rope_scale = rope_scale  # YaRN's attention factor on cos/sin (gpt-oss); None = 1
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if sinks else None  # gpt-oss: one learned logit per head
        if qk_norm not in (None, "head", "full"):
            raise ValueError(f"qk_norm must be None, 'head' or 'full', got {qk_norm!r}")
        full = qk_norm == "full"
        self.q_norm = RMSNorm(n_heads * hs if full else hs, norm_eps, norm_style) if qk_norm else None
        self.k_norm = RMSNorm(self.n_kv_heads * hs if full else hs, norm_eps, norm_style) if qk_norm else None
        self.name = "attn"  # set to the module path (e.g. "encoder.layers.0.self_attn") by the model

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        return x.view(B, L, -1, self.d_head).transpose(1, 2)  # (B, L, H*hs) -> (B, H, L, hs)

    def project(self, x: torch.Tensor, which: str) -> torch.Tensor:
        """(B, L, D) -> (B, heads, L, hs): W^Q or W^K ("q" / "k"), split into heads, with the q/k norm."""
        h = (self.w_q if which == "q" else self.w_k)(x)
        norm = self.q_norm if which == "q" else self.k_norm
        if norm is not None and self.qk_norm == "full":  # OLMo 2: one RMSNorm over all heads together
            h = norm(h)
        h = self.split_heads(h)
        if norm is not None and self.qk_norm == "head":  # Qwen3, Gemma 3: each head's vector on its own
            h = norm(h)
        return h

    def kv_head_of(self, head: int) -> int:
        """The key/value head that query head `head` reads (grouped-query attention)."""
        return head // (self.n_heads // self.n_kv_heads)

    def forward(
        self,
        x_q: torch.Tensor,  # (B, Lq, D): the queries' source (the decoder for cross-attention)
        x_kv: torch.Tensor,  # (B, Lk, D): the keys' and values' source (the encoder output for cross-attention)
        mask: torch.Tensor | None,  # (B, 1, Lq, Lk) bool, True = blocked
        cache: dict | None = None,  # key/value cache for step-by-step decoding
        static_kv: bool = False,  # cross-attention: K and V depend on the encoder only, compute them once
        angles: torch.Tensor | None = None,  # RoPE: (Lq, hs/2) rotation angles of the new positions
    ) -> torch.Tensor:
        n = self.name
        if angles is None:
            q = record(f"{n}.q", self.project(x_q, "q"))  # (B, H, Lq, hs)
        else:  # `.q` is the rotated query, so scores = q·kᵀ/√d_k holds for every family
            q = record(f"{n}.q", apply_rotary(record(f"{n}.q_unrot", self.project(x_q, "q")), angles,
                                                 self.rope_float32, self.rope_scale))
        if cache is not None and static_kv and "k" in cache:
            k, v = cache["k"], cache["v"]  # cross-attention: hooked once, when first computed
        else:
            # Hooks see the keys/values computed in this call (with a cache: only the new positions),
            # so a position-wise hook acts once per position, as in a full teacher-forced pass.
            if angles is None:
                k = hook(f"{n}.k", self.project(x_kv, "k"))  # (B, H_kv, Lk, hs)
            else:
                k_unrot = hook(f"{n}.k_unrot", self.project(x_kv, "k"))
                k = hook(f"{n}.k", apply_rotary(k_unrot, angles, self.rope_float32, self.rope_scale))
                # The cache holds tensors only: patching and /flow's causal check expand every entry to a batch
                # (a list of parts here broke them).
                if cache is not None and "k_unrot" in cache:
                    k_unrot = torch.cat([cache["k_unrot"], k_unrot], dim=2)
                if cache is not None:
                    cache["k_unrot"] = k_unrot
                keep(f"{n}.k_unrot", k_unrot)
            v = hook(f"{n}.v", self.split_heads(self.w_v(x_kv)))
            if cache is not None and not static_kv and "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
        if cache is not None:
            cache["k"], cache["v"] = k, v
        keep(f"{n}.k", k)
        keep(f"{n}.v", v)
        if not self.training and self.softcap is None and fast_attention_allowed(n):  # the named fast path
            z = (fused_attention(q, k, v, mask, self.scale) if self.sinks is None
                 else _sink_attention_z(q, k, v, mask, self.scale, self.sinks))
            z = record(f"{n}.z", z)  # (B, H, Lq, hs)
            B, H, Lq, hs = z.shape
            return record(f"{n}.out", self.w_o(z.transpose(1, 2).reshape(B, Lq, H * hs)))
        if self.n_kv_heads == 1 and self.n_heads > 1 and k.shape[0] == 1:  # one K/V head for all (multi-query),
            # one sequence (generation, a page's trace): a stride-0 view, not H copies; matmul folds (1, H) to H
            # as a view and runs the copies' per-head products (same bits), without copying the whole cache per
            # token (transformers' repeat_kv copies it). With B > 1 the fold would copy in another layout: copies.
            k, v = k.expand(-1, self.n_heads, -1, -1), v.expand(-1, self.n_heads, -1, -1)
        elif self.n_kv_heads != self.n_heads:  # grouped-query: each K/V head serves r query heads in a row
            r = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)

        scores = record(f"{n}.scores", attention_scores(q, k, self.scale))  # (B, H, Lq, Lk)
        if self.softcap is not None:  # Gemma 2: bounded logits, before the mask
            scores = record(f"{n}.scores_capped", softcap(scores, self.softcap))
        if mask is not None:
            mask = record(f"{n}.mask", mask)
        # + M with M = -inf where blocked: exp(-inf) = 0, so blocked cells get exactly 0.
        if self.sinks is None:
            weights = record(f"{n}.weights", attention_weights(scores, mask))
        else:  # gpt-oss: the row's softmax also has the head's sink logit; what it takes is recorded as `.sink`
            weights, sink = sink_softmax(scores, mask, self.sinks)
            weights = record(f"{n}.weights", weights)
            record(f"{n}.sink", sink)

        z = record(f"{n}.z", (self.dropout(weights) if self.training else weights) @ v)  # (B, H, Lq, hs)
        B, H, Lq, hs = z.shape
        return record(f"{n}.out", self.w_o(z.transpose(1, 2).reshape(B, Lq, H * hs)))  # concat heads, then W^O

    def capture_points(self, B: int, Lq: int, Lk: int, rotary: bool = False) -> dict[str, tuple[int, ...]]:
        """Names and shapes `forward` records, in order (module path + role)."""
        n, H, Hkv, hs = self.name, self.n_heads, self.n_kv_heads, self.d_head
        q = {f"{n}.q": (B, H, Lq, hs)}
        kv = {f"{n}.k": (B, Hkv, Lk, hs), f"{n}.v": (B, Hkv, Lk, hs)}
        if rotary:  # recorded in this order by forward
            q = {f"{n}.q_unrot": (B, H, Lq, hs)} | q
            kv = {f"{n}.k_unrot": (B, Hkv, Lk, hs)} | kv
        if self.qk_norm:  # (B, H, L, hs) per head; (B, L, H*hs) over the whole projection
            qs, ks = ((B, H, Lq, hs), (B, Hkv, Lk, hs)) if self.qk_norm == "head" else ((B, Lq, H * hs),
                                                                                     (B, Lk, Hkv * hs))
            q = {f"{n}.q_norm.in": qs, f"{n}.q_norm.out": qs} | q
            kv = {f"{n}.k_norm.in": ks, f"{n}.k_norm.out": ks} | kv
        capped = {f"{n}.scores_capped": (B, H, Lq, Lk)} if self.softcap is not None else {}
        sink = {f"{n}.sink": (B, H, Lq)} if self.sinks is not None else {}
        return q | kv | {f"{n}.scores": (B, H, Lq, Lk)} | capped | {
            f"{n}.mask": (B, 1, Lq, Lk), f"{n}.weights": (B, H, Lq, Lk)} | sink | {
            f"{n}.z": (B, H, Lq, hs), f"{n}.out": (B, Lq, self.w_o.out_features)}
