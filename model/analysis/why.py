"""Why does a head look there? One attention score split exactly into (query source, key source) pairs (issue 39).

The residual decomposition (model/core/residual.py) writes the stream at every position as a sum of named parts
(embeddings, each head, each FFN or expert, biases), every norm frozen at its scale on this run. A head's query
at position i is then a sum of per-source vectors, each carried through the same linear steps the model took:

    x_i = Σ_s P_s(i)                                   the parts at i (the layer's input, or a post-LN norm's input)
    n_s = N°(P_s)   (+ the norm's bias, its own source) the layer's input norm frozen at its scale at i
    q_s = W_Q^h n_s (+ W_Q's bias, its own source)
    q_s ← g ⊙ q_s · r_i                                 q/k-norm frozen (per head: Qwen3, Gemma 3; whole: OLMo 2)
    q_s ← R_i q_s                                       RoPE: a fixed rotation at i (full or partial rotary)

and the key at j the same way with K/V head h // group. So s_ij = scale · q_i·k_j = Σ_{s,t} scale · q_s·k_t: a
sum over (query source, key source) pairs, equal to the recorded score up to float rounding. A soft-capped score
(Gemma 2) is frozen as the factor cap·tanh(s/cap)/s at this cell, as the final soft-cap is frozen for DLA. Softmax
depends only on differences, so "why j rather than j′" is the same sum for s_ij − s_ij′ (`against`).

The lab's models add no position bias to the scores (ALiBi models open only through transformers, which has no
decomposition): the positions enter through the embeddings' "positions" part (learned) or the rotation (RoPE).

The causal check (`check_explanation`) takes a source out of this head's key (or query) input alone, recomputes
the input norm live (not frozen), re-projects, re-norms q/k, re-rotates and re-scores, and reports the change
beside the attributed value; with `frozen_norm=True` it keeps every scale frozen and then equals the attribution
exactly (the test of the bookkeeping). No streamlit or plotly here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from model.core import recorder, residual
from model.core.attention import causal_mask, softcap
from model.core.layers import apply_rotary
from model.core.residual import FrozenNorm
from model.core.trace import LazyTrace, Trace

# The causal check's stated tolerance: attributed and actual effect of a source "agree" when they differ by at
# most CHECK_REL of the larger of the two, or CHECK_ABS × max(1, |score|) for effects near 0. Beyond that the
# norm's nonlinearity (the scale moves when a part is taken out: a large part changes ‖x‖) is what the linear
# attribution misses, and the row says so.
CHECK_REL = 0.1
CHECK_ABS = 1e-3

NO_DECOMPOSITION = ("{name} is opened through transformers, whose attention computes q, k and the norms inside its "
                    "own modules: the lab has no decomposition of its residual stream into parts, so it cannot "
                    "split a score into the sources that built its query and key.")


# ---------------------------------------------------------------------- results


@dataclass
class ScoreExplanation:
    """One attention score (or, with `against`, the difference of two in a row) as a sum over (query source,
    key source) pairs. `total` is the recorded logit the softmax read (after any soft-cap), `explained` Σ terms."""

    module: str
    layer: int
    head: int
    query: int
    key: int
    against: int | None
    total: float  # recorded s_ij (capped where the model caps), or s_ij − s_ij′
    score: float  # recorded s_ij, the softmax's logit (capped)
    uncapped: float  # recorded q·k·scale at (i, j), before any soft-cap
    weight: float  # recorded attention weight of (i, j)
    blocked: bool  # the mask blocks (i, j): its score is finite and explained, but its weight is 0
    query_sources: list[str]
    key_sources: list[str]
    matrix: np.ndarray  # [n_query_sources, n_key_sources] float64: the terms
    cap_factor: float | None = None  # cap·tanh(s/cap)/s at (i, j) (Gemma 2), None without a soft-cap
    notes: list[str] = field(default_factory=list)
    _ctx: object = field(default=None, repr=False, compare=False)  # what the causal check recomputes from

    @property
    def terms(self) -> dict[tuple[str, str], float]:
        return {(q, k): float(self.matrix[a, b]) for a, q in enumerate(self.query_sources)
                for b, k in enumerate(self.key_sources)}

    @property
    def query_side(self) -> dict[str, float]:
        """Each query source's total, summed over every key source."""
        return dict(zip(self.query_sources, self.matrix.sum(1).tolist(), strict=True))

    @property
    def key_side(self) -> dict[str, float]:
        """Each key source's total, summed over every query source."""
        return dict(zip(self.key_sources, self.matrix.sum(0).tolist(), strict=True))

    @property
    def explained(self) -> float:
        """Σ terms (float64): equals `total` up to the float32 rounding of the model's own computation."""
        return float(self.matrix.sum())

    @property
    def error(self) -> float:
        return abs(self.explained - self.total)

    magnitude: float = 0.0  # ‖q_i‖·‖k_j‖·scale (+ the same for j′), × the cap factor: see `tolerance`

    def tolerance(self, ulps: float = 4.0) -> float:
        """The float32 bound on |explained − total| (tests/tolerance.py): the model computed q and k in float32
        from a D-wide input, so each carries rounding of eps·√D of its norm, and the score q·k·scale of up to
        eps·√D·‖q‖‖k‖·scale, whatever the size of q·k itself (a near-orthogonal pair scores ~0 with the same
        absolute rounding). Σ |terms| covers cancellations among the terms summed in float64."""
        d = self._ctx.q.weight.shape[1] if self._ctx is not None else 1
        scale = max(self.magnitude, float(np.abs(self.matrix).sum()))
        return ulps * float(np.finfo(np.float32).eps) * scale * math.sqrt(d)

    def top_pairs(self, k: int = 10) -> list[tuple[str, str, float]]:
        flat = np.argsort(-np.abs(self.matrix), axis=None)[:k]
        rows, cols = np.unravel_index(flat, self.matrix.shape)
        return [(self.query_sources[a], self.key_sources[b], float(self.matrix[a, b]))
                for a, b in zip(rows, cols, strict=True)]


@dataclass
class CheckRow:
    """One source taken out of one side of the head's input: attributed effect against the actual one."""

    side: str  # "query" or "key"
    source: str
    attributed: float  # the source's side total in the explanation (its share of `total`)
    actual: float  # total(with the source) − total(without it), recomputed with the live norms
    weight_change: float  # weight(i, j) with the source − without it (softmax over the row, this head only)
    agrees: bool

    @property
    def gap(self) -> float:
        return abs(self.actual - self.attributed)


@dataclass
class Check:
    rows: list[CheckRow]
    frozen_norm: bool
    recompute_error: float  # |the check's own recomputation of the score − the recorded score|
    tolerance: str  # the stated tolerance, in words
    weight: float  # the check's own recomputation of the weight of (i, j), beside the recorded `expl.weight`

    @property
    def disagreements(self) -> list[CheckRow]:
        return [r for r in self.rows if not r.agrees]

    def summary(self) -> str:
        bad = self.disagreements
        if not bad:
            return (f"All {len(self.rows)} checked sources agree with their attribution ({self.tolerance}).")
        names = ", ".join(f"{r.source} ({r.side}: attributed {r.attributed:+.3g}, actual {r.actual:+.3g})"
                          for r in bad)
        return (f"{len(bad)} of {len(self.rows)} checked sources disagree with their attribution beyond the "
                f"tolerance ({self.tolerance}): {names}. The norm's scale moves when a source is taken out, "
                "which the frozen-norm attribution does not see.")


# ---------------------------------------------------------------------- one side of a head's input


@dataclass
class _Side:
    """What builds one side (query or key) of one head at some positions, in float64.

    labels, parts [S, n, D]: the named parts summing to the input of `norm` (or, without a norm, to the attention's
    input) at the n positions; norm: the layer's input norm (live in the check) with its recorded input [n, D];
    weight, bias: W_Q or W_K; qk: the q/k-norm module ("head" or "full") with its recorded input; angles [n, r/2]
    or None (no RoPE)."""

    labels: list[str]
    parts: torch.Tensor  # [S, n, D]
    norm: object | None
    norm_in: torch.Tensor | None  # [n, D] recorded input of `norm` (or the attention's input without one)
    norm_bias_label: str | None
    weight: torch.Tensor  # [rows, D] the whole projection (all heads of this side)
    bias: torch.Tensor | None
    bias_label: str
    head: int  # this side's head (the K/V head on the key side)
    d_head: int
    qk: object | None
    qk_over: str | None
    qk_in: torch.Tensor | None  # [n, H*hs] ("full") or [n, H, hs] ("head"): recorded input of the q/k-norm
    angles: torch.Tensor | None  # [n, r/2]
    rope_scale: float | None

    def _normed(self, x: torch.Tensor, live: bool, k: int) -> torch.Tensor:
        """The input norm at position k applied to x [.., D] (frozen: its recorded scale; live: x's own)."""
        if self.norm is None:
            return x
        fn = FrozenNorm(self.norm, (x if live else self.norm_in[k]).reshape(1, -1))
        return fn.part(x, fn.scale[0])

    def _qk(self, y: torch.Tensor, live: bool, k: int) -> torch.Tensor:
        """The projection y [.., rows] of position k -> this head's vector [.., hs]: q/k-norm, head slice."""
        hs, h = self.d_head, self.head
        sl = slice(h * hs, (h + 1) * hs)
        if self.qk is None:
            return y[..., sl]
        gain = self.qk.weight.detach().double()
        gain = 1.0 + gain if self.qk.style == "gemma" else gain
        if self.qk_over == "full":
            ref = y if live else self.qk_in[k].double()
            s = torch.rsqrt(ref.pow(2).mean(-1, keepdim=True) + self.qk.eps)
            return (y * s * gain)[..., sl]
        ref = (y[..., sl] if live else self.qk_in[k, h].double())
        s = torch.rsqrt(ref.pow(2).mean(-1, keepdim=True) + self.qk.eps)
        return y[..., sl] * s * gain

    def _rotate(self, v: torch.Tensor, k: int) -> torch.Tensor:
        if self.angles is None:
            return v
        return apply_rotary(v.reshape(-1, 1, 1, v.shape[-1]), self.angles[k:k + 1], False,
                            self.rope_scale).reshape(v.shape)

    def sources(self, k: int) -> tuple[list[str], torch.Tensor]:
        """Every source's share of this head's vector at position k (index into the side's positions):
        (labels, [S', hs]), the frozen linear path; Σ = the head's vector on the run."""
        W = self.weight.double()
        vecs = [self._normed(self.parts[:, k], False, k) @ W.T]
        labels = list(self.labels)
        if self.norm is not None and getattr(self.norm, "bias", None) is not None:
            vecs.append((self.norm.bias.detach().double() @ W.T)[None])
            labels.append(self.norm_bias_label)
        if self.bias is not None:
            vecs.append(self.bias.double()[None])
            labels.append(self.bias_label)
        y = torch.cat(vecs)
        return labels, self._rotate(self._qk(y, False, k), k)

    def vector(self, x: torch.Tensor, k: int, live: bool) -> torch.Tensor:
        """The head's vector from the input x [D] at position k: the norm, W (+ bias), q/k-norm, rotation;
        live norms (the model's map) or frozen ones (linear: the attribution's)."""
        h = self._normed(x, live, k)
        if self.norm is not None and getattr(self.norm, "bias", None) is not None:
            h = h + self.norm.bias.detach().double()
        y = h @ self.weight.double().T
        if self.bias is not None:
            y = y + self.bias.double()
        return self._rotate(self._qk(y, live, k), k)

    def input_at(self, k: int, live: bool = True) -> torch.Tensor:
        """The input at position k [D] float64: the recorded one (the norm's, or the attention's without one),
        or, for the frozen check, Σ parts (the attribution's own input: it differs from the recorded one by the
        float32 rounding of the model's sum, so the frozen check then equals the attribution in float64)."""
        return self.norm_in[k].double() if live else self.parts[:, k].sum(0)


# ---------------------------------------------------------------------- the model's side


def _model_of(lm_or_model):
    m = getattr(lm_or_model, "model", lm_or_model)
    desc = m.describe()
    if "lacks" in desc:
        name = getattr(lm_or_model, "name", None) or type(m).__name__
        raise ValueError(NO_DECOMPOSITION.format(name=name))
    return m, desc


def _ids(lm_or_model, m, ids):
    """(src, tgt) for an encoder-decoder; [1, T] ids otherwise (text through the wrapper's tokenizer)."""
    if isinstance(ids, tuple):
        return tuple(torch.as_tensor(x, dtype=torch.long).reshape(1, -1) for x in ids)
    if isinstance(ids, str):
        if hasattr(lm_or_model, "encode") and hasattr(m, "decoder") and not hasattr(m, "encoder"):
            return lm_or_model.encode(ids)[:1]
        if hasattr(lm_or_model, "ids"):
            return lm_or_model.ids(ids)
        raise ValueError("text needs a model with a tokenizer; pass token ids")
    x = torch.as_tensor(ids, dtype=torch.long)
    return (x[None] if x.dim() == 1 else x)[:1]


def _module_name(m, desc, layer) -> str:
    if isinstance(layer, str):
        if layer not in desc["attention"]:
            raise ValueError(f"no attention module {layer!r}; this model has {sorted(desc['attention'])[:4]}...")
        return layer
    names = [n for n, info in desc["attention"].items() if info["layer"] == int(layer)]
    if len(names) != 1:
        if not names:
            raise ValueError(f"layer {layer} is out of range: this model has "
                             f"{1 + max(i['layer'] for i in desc['attention'].values())} layers")
        raise ValueError(f"layer {layer} has {len(names)} attention modules ({', '.join(names)}): name one")
    return names[0]


def _lm_capture(m, li: int, name: str) -> list[str]:
    """What a decoder LM's explanation at layer l reads: the parts of every earlier layer, the layer's input norm
    (or stream), the q/k-norm inputs, the angles, the recorded scores, weights, mask, sink and keys."""
    names = ["decoder.embed.tok", "decoder.embed.out"] + (["decoder.embed.pos"] if m.cfg.positional == "learned"
                                                         else [])
    for layer in m.decoder.layers[:li]:
        names.append(f"{layer.self_attn.name}.z")
        names += residual.ffn_capture(layer.ffn) if layer.ffn is not None else []
        names += [f"{n.name}.in" for n in (layer.norm_post_attn, layer.norm_post_ffn) if n is not None]
        names += [f"{n.name}.out" for n in (layer.scale_attn, layer.scale_ffn) if n is not None]
        names.append(f"{layer.name}.out")
    block = m.decoder.layers[li]
    attn = block.self_attn
    if block.norm1 is not None:
        names.append(f"{block.norm1.name}.in")
    if attn.qk_norm:
        names += [f"{name}.q_norm.in", f"{name}.k_norm.in"]
    if block.rotary:
        names.append(m.cfg.rope_of(li)["angles"])
    names += [f"{name}.scores", f"{name}.weights", f"{name}.mask", f"{name}.k"]
    names += [f"{name}.scores_capped"] if attn.softcap is not None else []
    names += [f"{name}.sink"] if attn.sinks is not None else []
    return names


def _qk_input(tr, name: str, which: str, attn, pos) -> torch.Tensor | None:
    if not attn.qk_norm:
        return None
    t = tr[f"{name}.{which}_norm.in"][0].double()
    return t[pos] if attn.qk_norm == "full" else t[:, pos].transpose(0, 1)  # [n, H*hs] | [n, H, hs]


def _lm_sides(m, tr, name: str, li: int, head: int, qpos: list[int], kpos: list[int]) -> tuple[_Side, _Side]:
    block = m.decoder.layers[li]
    attn = block.self_attn
    allpos = list(qpos) + list(kpos)
    view = _Rows(tr, allpos)  # every T-axis tensor at these positions only, as positions 0..n-1
    every = torch.arange(len(allpos))
    parts = [residual.Part("embed", "embed", None, None, view["decoder.embed.tok"][0].double())]
    if "decoder.embed.pos" in tr.names():
        parts.append(residual.Part("positions", "pos", None, None, view["decoder.embed.pos"].double()))
    for u in residual.updates(m.describe())["decoder"]:
        if u.layer < li:
            parts += residual.update_parts(m, view, u, every)
    labels, stacked = [p.label for p in parts], torch.stack([p.vector for p in parts])  # [S, n, D]
    if block.norm1 is not None:
        x_in = view[f"{block.norm1.name}.in"][0].double()
    else:  # OLMo 2: attention reads the stream itself
        x_in = view[f"decoder.layers.{li - 1}.out" if li else "decoder.embed.out"][0].double()
    angles = view[m.cfg.rope_of(li)["angles"]].double() if block.rotary else None
    sides = []
    for which, sl in (("q", slice(0, len(qpos))), ("k", slice(len(qpos), len(allpos)))):
        proj = attn.w_q if which == "q" else attn.w_k
        idx = torch.as_tensor(allpos[sl])
        sides.append(_Side(
            labels=labels, parts=stacked[:, sl], norm=block.norm1,
            norm_in=x_in[sl], norm_bias_label=f"L{li} norm1 bias", weight=proj.weight.detach(),
            bias=None if proj.bias is None else proj.bias.detach(), bias_label=f"L{li} W_{which.upper()} bias",
            head=head if which == "q" else attn.kv_head_of(head), d_head=attn.d_head,
            qk=attn.q_norm if which == "q" else attn.k_norm, qk_over=attn.qk_norm,
            qk_in=_qk_input(tr, name, which, attn, idx), angles=None if angles is None else angles[sl],
            rope_scale=attn.rope_scale))
    return sides[0], sides[1]


class _Rows:
    """A trace seen at some positions only: each tensor with a token axis holds those rows, in that order, as
    positions 0..n-1 (so residual.update_parts reads [n, ..] tensors, never [T, ..] ones). `<attn>.z` from a lazy
    trace is computed at those rows alone (one row of weights per position @ v, the forward's functions), so no
    [H, T, T] map is formed."""

    def __init__(self, trace, positions: list[int]):
        self.trace, self.idx = trace, torch.as_tensor(positions)
        self.lazy = isinstance(trace, LazyTrace)

    def names(self) -> list[str]:
        return self.trace.names()

    def __contains__(self, name) -> bool:
        return name in self.trace

    def __getitem__(self, name: str) -> torch.Tensor:
        if name.endswith(".z") and self.lazy and name not in self.trace.stored():
            return self._z(name[:-2])
        t = self.trace[name]
        axis = 2 if name.endswith(".z") else 0 if name in ("decoder.embed.pos", "decoder.rope.angles",
                                                           "decoder.rope.angles_local") else 1
        return t.index_select(axis, self.idx)

    def _z(self, module: str) -> torch.Tensor:
        v = self.trace[f"{module}.v"][0]  # [H_kv, T, hs]
        H = self.trace.n_heads(module)
        if H != v.shape[0]:
            v = v.repeat_interleave(H // v.shape[0], dim=0)  # [H, T, hs]
        rows = [self.trace.attention(module, None, rows=int(p))[:, 0] for p in self.idx]  # [H, T] each
        w = torch.stack(rows, 1)  # [H, n, T]
        return (w @ v)[None]  # [1, H, n, hs]


# ---- the 2017 Transformer (translator) and BERT encoders (MiniLM): encoder, decoder, post-LN or pre-LN


def _tf_walk(m, tr, stack: str, stop: int, pos, prefix: str) -> tuple[list[tuple[str, torch.Tensor]], object, str]:
    """The parts [n, D] of `stack`'s stream before its update number `stop` (len = the whole stack), as they
    enter the last norm not yet applied: returns (parts, that norm or None, its name). In post-LN that norm is
    the previous update's (BERT: the embeddings' LayerNorm for layer 0); every earlier norm is frozen into the
    parts, its bias a part of its own."""
    modules = dict(m.named_modules())
    idx = torch.as_tensor(pos)
    parts = [(f"{prefix}embed", tr[f"{stack}.embed.tok"][0, idx].double()),
             (f"{prefix}positions", tr[f"{stack}.embed.pos"][idx].double())]
    if f"{stack}.embed.type" in tr.names():
        parts.append((f"{prefix}token type", tr[f"{stack}.embed.type"][0, idx].double()))
    emb = modules.get(f"{'src' if stack == 'encoder' else 'tgt'}_embed.norm")
    pending, pending_name = (emb, f"{prefix}embed norm") if emb is not None else (None, "")
    subs = residual.updates(m.describe())[stack]
    for u in subs[:stop]:
        if pending is not None:
            parts = _apply_frozen(pending, tr, idx, parts, pending_name)
            pending = None
        if u.attn is not None:
            attn = modules[u.attn]
            heads = residual.head_outputs(attn, tr[f"{u.attn}.z"][0][:, idx].double())
            what = "cross " if u.kind == "cross" else ""
            parts += [(f"{prefix}L{u.layer} {what}H{h}", heads[h]) for h in range(attn.n_heads)]
            if attn.w_o.bias is not None:
                parts.append((f"{prefix}L{u.layer} {what}attn bias", attn.w_o.bias.double().expand(len(idx), -1)))
        if u.ffn is not None:
            parts.append((f"{prefix}L{u.layer} ffn", tr[f"{u.ffn}.out"][0, idx].double()))
        if u.after != u.whole:  # post-LN: the stream after the update is its norm's output
            pending, pending_name = modules[u.after.removesuffix(".out")], f"{prefix}L{u.layer} " + \
                u.after.removesuffix(".out").rsplit(".", 1)[-1]
    return parts, pending, pending_name


def _apply_frozen(norm, tr, idx, parts, label):
    fn = FrozenNorm(norm, tr[f"{norm.name}.in"][0, idx])
    out = [(lab, fn.part(v)) for lab, v in parts]
    if fn.bias is not None:
        out.append((f"{label} bias", fn.bias.expand(len(idx), -1)))
    return out


def _tf_sides(m, desc, tr, name: str, head: int, qpos, kpos) -> tuple[_Side, _Side]:
    info = desc["attention"][name]
    modules = dict(m.named_modules())
    attn = modules[name]
    stack, li = info["stack"], info["layer"]
    two = not m.cfg.encoder_only
    subs = residual.updates(desc)[stack]
    k_step = next(n for n, u in enumerate(subs) if u.attn == name)
    pre = desc.get("blocks", {}).get("norm_first", False)
    sides = []
    for which, pos in (("q", qpos), ("k", kpos)):
        side_stack = stack
        if which == "k" and info["kind"] == "cross":
            side_stack, stop = "encoder", len(residual.updates(desc)["encoder"])
        else:
            stop = k_step
        prefix = f"{side_stack} " if two else ""
        parts, norm, norm_label = _tf_walk(m, tr, side_stack, stop, pos, prefix)
        idx = torch.as_tensor(pos)
        if pre:  # the norm still to apply: the sublayer's own (norm{k+1}), or the encoder's final norm for memory
            if norm is not None:
                parts = _apply_frozen(norm, tr, idx, parts, norm_label)
            if which == "k" and info["kind"] == "cross":
                norm = modules.get("encoder.norm")
                norm_label = f"{prefix}final norm"
            else:
                n_in_layer = [u for u in subs[:stop] if u.layer == li]
                norm = modules[f"{stack}.layers.{li}.norm{len(n_in_layer) + 1}"]
                norm_label = f"{prefix}L{li} norm{len(n_in_layer) + 1}"
        if norm is not None:
            x_in = tr[f"{norm.name}.in"][0, idx].double()
        else:  # post-LN layer 0 without an embedding norm: the attention reads the embeddings' sum
            x_in = tr[f"{side_stack}.embed.out"][0, idx].double()
        proj = attn.w_q if which == "q" else attn.w_k
        own = f"{stack} " if two else ""  # W_Q and W_K belong to the attention module, in its own stack
        what = "cross " if info["kind"] == "cross" else ""
        sides.append(_Side(
            labels=[lab for lab, _ in parts], parts=torch.stack([v for _, v in parts]), norm=norm, norm_in=x_in,
            norm_bias_label=f"{norm_label} bias", weight=proj.weight.detach(),
            bias=None if proj.bias is None else proj.bias.detach(),
            bias_label=f"{own}L{li} {what}W_{which.upper()} bias",
            head=head if which == "q" else attn.kv_head_of(head), d_head=attn.d_head, qk=None, qk_over=None,
            qk_in=None, angles=None, rope_scale=None))
    return sides[0], sides[1]


# ---------------------------------------------------------------------- the explanation


@dataclass
class _Context:
    q: _Side
    k: _Side
    scale: float
    softcap: float | None
    row: torch.Tensor  # [Lk] recorded logits of row i (after any soft-cap), float64
    factor: torch.Tensor  # [Lk] the soft-cap frozen per cell: capped / uncapped (1 without a cap)
    mask_row: torch.Tensor | None  # [Lk] bool, True = blocked
    sink: float | None  # the head's learned sink logit (gpt-oss)
    keys: torch.Tensor  # [Lk, hs] recorded (rotated) keys of this head's K/V head, float64
    key_cols: list[int]  # the key positions of `k` (j, and j′ with against)
    query: int
    key: int
    against: int | None

    def logits(self, q: torch.Tensor, k: torch.Tensor, cols, live: bool) -> torch.Tensor:
        """scale·q·k at key columns `cols` (k [n, hs]), soft-capped live or with the frozen factor."""
        s = (k @ q) * self.scale
        if self.softcap is None:
            return s
        return torch.tanh(s / self.softcap) * self.softcap if live else s * self.factor[cols]


def _head_scale(attn, info) -> float:
    return float(info.get("scale") or (attn.scale if attn.scale is not None else attn.d_head ** -0.5))


@torch.no_grad()
def explain_score(lm_or_model, ids, layer, head: int, query: int, key: int, against: int | None = None,
                  trace=None) -> ScoreExplanation:
    """Split head `head`'s pre-softmax score of (query, key) at `layer` (an index, or an attention module's name:
    "decoder.layers.1.cross_attn" for the translator's cross-attention) into (query source, key source) terms.
    ids: [1, T] ids or text (a decoder LM, an encoder), or (src, tgt) for an encoder-decoder. Positions may be
    negative (from the end). with `against`=j′: the terms of s_ij − s_ij′ (why j rather than j′).
    trace: a trace of these ids a page already holds (full, or lazy with names=lazy_names(model) or layers=True);
    without one a decoder LM runs one lazy forward (two positions' parts are read, never the T × T map)."""
    m, desc = _model_of(lm_or_model)
    x = _ids(lm_or_model, m, ids)
    name = _module_name(m, desc, layer)
    info = desc["attention"][name]
    attn = dict(m.named_modules())[name]
    li = info["layer"]
    if not 0 <= head < attn.n_heads:
        raise ValueError(f"head {head} is out of range: {name} has {attn.n_heads} heads")
    lm = desc.get("family") == "decoder_lm"
    if trace is None:
        if lm:
            trace = _trace_up_to(m, x, li, name)
        else:
            src, tgt = x if isinstance(x, tuple) else (x, None)
            _, trace = m.run_with_trace(src, tgt)  # the translator and MiniLM are small: every capture
    elif lm:
        held = trace.meta.get("tgt_ids")
        if held is not None and held[:1] != x.tolist():
            raise ValueError("the trace given was made on other token ids than these: pass the ids it was made on")
        missing = [n for n in _lm_capture(m, li, name) if n not in trace and not n.endswith(".mask")]
        if missing:
            raise ValueError(f"the trace given lacks {missing[0]} (and {len(missing) - 1} more names an explanation "
                             "reads): make it with names=why.lazy_names(model), lazy=True, or pass no trace")
    lazy = isinstance(trace, LazyTrace)
    if lazy:
        Lq = Lk = trace.n_tokens
    else:
        Lq, Lk = trace[f"{name}.scores"].shape[-2:]

    def where(p, n, what):
        if not -n <= p < n:
            raise ValueError(f"{what} position {p} is out of range: this input has {n} {what} positions")
        return p % n

    i, j = where(query, Lq, "query"), where(key, Lk, "key")
    jj = None if against is None else where(against, Lk, "key")
    kcols = [j] if jj is None else [j, jj]
    raw_row, capped_row, weights_row, mask_row = _row(trace, name, attn, info, head, i)
    if lm:
        qs, ks = _lm_sides(m, trace, name, li, head, [i], kcols)
    else:
        qs, ks = _tf_sides(m, desc, trace, name, head, [i], kcols)
    scale = _head_scale(attn, info)
    factor = torch.where(raw_row == 0, torch.ones_like(raw_row),
                         capped_row / torch.where(raw_row == 0, torch.ones_like(raw_row), raw_row))
    qlab, qv = qs.sources(0)
    mats = []
    magnitude = 0.0
    for c, col in enumerate(kcols):
        klab, kv = ks.sources(c)
        # the soft-cap frozen at this cell: cap·tanh(s/cap)/s (1 without a cap)
        f = float(factor[col])
        mats.append((qv @ kv.T) * scale * f)  # [Sq, Sk]
        magnitude += float(qv.sum(0).norm() * kv.sum(0).norm()) * scale * abs(f)
    matrix = mats[0] if jj is None else mats[0] - mats[1]
    total = float(capped_row[j]) if jj is None else float(capped_row[j] - capped_row[jj])
    blocked = bool(mask_row[j]) if mask_row is not None else False
    notes = []
    if blocked:
        notes.append(f"the mask blocks key {j} for query {i} (causal or sliding window): its score is finite and "
                     "explained here, but its attention weight is 0")
    if jj is not None and mask_row is not None and bool(mask_row[jj]):
        notes.append(f"the mask blocks key {jj} for query {i}: its weight is 0 whatever its score")
    sinks = attn.sinks
    if sinks is not None:
        notes.append("this head has a learned sink (a logit of its own in each row, not a key): the terms explain "
                     "the real key's score; the sink takes part in the softmax only")
    k_all = trace[f"{name}.k"][0, ks.head].double()  # [Lk, hs]
    ctx = _Context(qs, ks, scale, attn.softcap, capped_row, factor, mask_row,
                   None if sinks is None else float(sinks[head]), k_all, kcols, i, j, jj)
    return ScoreExplanation(
        module=name, layer=li, head=head, query=i, key=j, against=jj, total=total, score=float(capped_row[j]),
        uncapped=float(raw_row[j]), weight=float(weights_row[j]), blocked=blocked, query_sources=qlab,
        key_sources=klab, matrix=matrix.numpy(), cap_factor=float(factor[j]) if attn.softcap is not None else None,
        notes=notes, magnitude=magnitude, _ctx=ctx)


def _row(trace, name: str, attn, info, head: int, i: int):
    """Row i of head `head`: (scores before any cap, the softmax's logits, weights, mask (True = blocked) or None),
    [Lk] each, float64 (the mask bool). From a full trace, the recorded tensors; from a lazy one, one row computed
    with the forward's own functions (LazyTrace.attention)."""
    if isinstance(trace, LazyTrace):
        raw = trace.attention(name, head, rows=i, what="scores")[0].double()
        capped = softcap(raw, attn.softcap) if attn.softcap is not None else raw
        weights = trace.attention(name, head, rows=i)[0].double()
        T = raw.shape[0]
        mask = causal_mask(1, T, offset=i, window=info.get("window"))[0]
        return raw, capped, weights, mask
    raw = trace[f"{name}.scores"][0, head, i].double()
    capped = trace[f"{name}.scores_capped"][0, head, i].double() if attn.softcap is not None else raw
    mask = trace[f"{name}.mask"][0, 0, i].bool() if f"{name}.mask" in trace.names() else None
    return raw, capped, trace[f"{name}.weights"][0, head, i].double(), mask


@torch.no_grad()
def _trace_up_to(m, x: torch.Tensor, li: int, name: str) -> Trace:
    """The trace an explanation at layer `li` reads, from a forward stopped after that layer (the later layers and
    the unembedding cannot change its scores): the embeddings, then layers 0..li one at a time with the model's own
    `run_layer` (the forward's code, bit for bit with the same attention path). Layers before li run fused attention
    (their z differs from the step-by-step one by float32 rounding only); layer li records its scores, weights and
    mask (one layer's [H, T, T]: 151 MB for SmolLM2 at 2,048 tokens)."""
    m._check_ids(x, 0)
    T = x.shape[1]
    want = set(_lm_capture(m, li, name))
    head = {n for n in want if not n.startswith("decoder.layers.")}
    n_bytes = recorder.estimate_bytes(m.capture_names(1, T), sorted(head), next(m.parameters()).element_size())
    with recorder.capturing(head, n_bytes + 64 * len(head)) as rec:
        m._masks_and_angles(1, T, 0, x.device)  # records the RoPE angles, as the forward does
        h = m.decoder.embed(x)
    tensors = dict(rec.tensors)
    for i in range(li + 1):
        p = f"decoder.layers.{i}."
        got = m.run_layer(i, h, {n for n in want if n.startswith(p)} | {f"{p}out"}, fast=i < li)
        tensors.update(got)
        h = got[f"{p}out"]
    return Trace(tensors, {"tgt_ids": x.tolist()})


def lazy_names(m, layer: int | None = None) -> list[str]:
    """The O(T·d) names an explanation at `layer` (None: any layer) reads from a lazy trace
    (model.run_with_trace(ids, names=lazy_names(model), lazy=True)): embeddings, every layer's output, FFN (or
    experts'), the norms' inputs, q/k-norm inputs, RoPE angles. q, k, v are stored by every lazy trace."""
    n = m.cfg.n_layers if layer is None else layer + 1
    names = set()
    for li in range(n):
        names |= {x for x in _lm_capture(m, li, f"decoder.layers.{li}.self_attn")
                  if not x.endswith((".scores", ".weights", ".mask", ".k", ".z", ".scores_capped", ".sink"))}
    return sorted(names)


# ---------------------------------------------------------------------- the causal check


def _softmax_weight(row: torch.Tensor, mask: torch.Tensor | None, sink: float | None, j: int) -> float:
    """The weight of key j in a row of logits, as the model's softmax: blocked keys -inf, the sink one more column."""
    r = row.clone()
    if mask is not None:
        r = r.masked_fill(mask, float("-inf"))
    if sink is not None:
        r = torch.cat([r, torch.tensor([sink], dtype=r.dtype)])
    if not torch.isfinite(r).any():
        return 0.0
    return float(torch.softmax(r, -1)[j])


def agrees(attributed: float, actual: float, score: float) -> bool:
    """The causal check's rule: the attributed and the actual change agree within CHECK_REL of the larger effect,
    or within CHECK_ABS × max(1, |score|) (a change too small to compare)."""
    return abs(actual - attributed) <= max(CHECK_REL * max(abs(actual), abs(attributed)),
                                           CHECK_ABS * max(1.0, abs(score)))


@torch.no_grad()
def remove_sources(expl: ScoreExplanation, side: str, sources: list[str],
                   frozen_norm: bool = False) -> tuple[float, float]:
    """(actual change of expl.total, change of the weight of (i, j)) when `sources` are taken out of this head's
    `side` ("query" or "key") input together: the input norm recomputed live (`frozen_norm`=True: keep its
    recorded scale, and the q/k-norm's and the soft-cap's), re-projected, q/k re-normed, re-rotated, re-scored. A
    key source is taken out at j (and at j′ with `against`); a query source changes the whole row i, so the weight
    is the softmax of the row re-scored against the recorded keys. Names not on that side are ignored."""
    c: _Context = expl._ctx
    if c is None:
        raise ValueError("this explanation carries no context to check (build it with explain_score)")
    if side not in ("query", "key"):
        raise ValueError(f"side must be 'query' or 'key', got {side!r}")
    live = not frozen_norm
    cols = c.key_cols
    q0 = c.q.vector(c.q.input_at(0, live), 0, live)
    k0 = torch.stack([c.k.vector(c.k.input_at(n, live), n, live) for n in range(len(cols))])

    def total_of(q, ks):
        s = c.logits(q, ks, cols, live)
        return float(s[0]) if len(cols) == 1 else float(s[0] - s[1])

    def weight_key(ks):
        row = c.row.clone()
        row[cols] = c.logits(q0, ks, cols, live)
        return _softmax_weight(row, c.mask_row, c.sink, c.key)

    def weight_query(q):
        row = c.logits(q, c.keys, list(range(c.keys.shape[0])), live)
        return _softmax_weight(row, c.mask_row, c.sink, c.key)

    sd = c.q if side == "query" else c.k
    idx = [sd.labels.index(s) for s in sources if s in sd.labels]
    if side == "query":
        q1 = c.q.vector(c.q.input_at(0, live) - c.q.parts[idx, 0].sum(0), 0, live)
        return total_of(q0, k0) - total_of(q1, k0), weight_query(q0) - weight_query(q1)
    k1 = torch.stack([c.k.vector(c.k.input_at(n, live) - c.k.parts[idx, n].sum(0), n, live)
                      for n in range(len(cols))])
    return total_of(q0, k0) - total_of(q0, k1), weight_key(k0) - weight_key(k1)


@torch.no_grad()
def check_explanation(expl: ScoreExplanation, top: int = 3, frozen_norm: bool = False) -> Check:
    """Take each of the `top` sources of each side (by |side total|) out of this head's query (or key) input alone
    (`remove_sources`) and report the actual change of `total` and of the weight of (i, j) beside the attributed
    value. Biases are not in the stream and are not checked."""
    c: _Context = expl._ctx
    if c is None:
        raise ValueError("this explanation carries no context to check (build it with explain_score)")
    live = not frozen_norm
    cols = c.key_cols
    q0 = c.q.vector(c.q.input_at(0, live), 0, live)
    k0 = torch.stack([c.k.vector(c.k.input_at(n, live), n, live) for n in range(len(cols))])
    recompute_error = abs(float(c.logits(q0, k0, cols, live)[0]) - expl.score)
    row = c.row.clone()
    row[cols] = c.logits(q0, k0, cols, live)
    w0_key = _softmax_weight(row, c.mask_row, c.sink, c.key)
    rows = []
    for side, totals, sd in (("query", expl.query_side, c.q), ("key", expl.key_side, c.k)):
        ranked = sorted((s for s in totals if s in sd.labels), key=lambda s: -abs(totals[s]))[:top]
        for src in ranked:
            actual, dw = remove_sources(expl, side, [src], frozen_norm)
            attributed = totals[src]
            rows.append(CheckRow(side, src, float(attributed), float(actual), float(dw),
                                 bool(agrees(attributed, actual, expl.score))))
    tol = f"agree within {CHECK_REL:.0%} of the larger effect, or {CHECK_ABS:g} × max(1, |score|)"
    return Check(rows, frozen_norm, float(recompute_error), tol, w0_key)
