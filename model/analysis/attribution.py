"""Is attention an explanation? Four ways to say which source token drove an output token.

- raw attention: the last decoder layer's cross-attention row, mean over heads;
- attention rollout (Abnar & Zuidema 2020): each layer's head-mean attention with the residual
  identity, Â = ½A + ½I, multiplied through the layers (for the decoder, see `rollout_seq2seq`);
- gradient × input: Σ_d ∂log p/∂x_d · x_d at each source token embedding (a first-order estimate of
  what removing the token would cost);
- blank-out: hide each source token as a key (as if it were [PAD]) and measure the drop in
  log p of the output token; all tokens in one batched pass. The reference the others are ranked
  against (Spearman's ρ).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from model import interventions as iv


def spearman(a, b) -> float:
    """Spearman's rank correlation (ties get their average rank): Pearson's r of the ranks.
    NaN when either side is constant."""
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):  # ties: the mean of the ranks they span
        tie = x == v
        ranks[tie] = ranks[tie].mean()
    return ranks


def _with_residual(A: np.ndarray) -> np.ndarray:
    """½A + ½I, rows renormalized (a fully masked row of zeros keeps only its identity)."""
    A = 0.5 * A + 0.5 * np.eye(A.shape[-1])
    return A / A.sum(-1, keepdims=True)


def rollout(attentions: list[np.ndarray]) -> np.ndarray:
    """Abnar & Zuidema's rollout over self-attention layers: each (H, L, L) is averaged over heads,
    gets the residual identity, and R = Â_n ··· Â_1. R[i, j]: how much input token j flows into
    position i at the top."""
    R = np.eye(attentions[0].shape[-1])
    for A in attentions:
        R = _with_residual(A.mean(0)) @ R
    return R


def rollout_seq2seq(encoder: list[np.ndarray], decoder_self: list[np.ndarray],
                    cross: list[np.ndarray]) -> np.ndarray:
    """Rollout through an encoder–decoder, (T, S): how much each source token flows into each target
    position. Target positions carry a distribution over [source tokens | target tokens]; per decoder
    layer the self-attention mixes it (Â = ½A + ½I), then the cross-attention sublayer keeps half
    (the residual) and adds half of its head-mean attention times the encoder's rollout. Rows are
    renormalized over the source part."""
    R_src = rollout(encoder)  # (S, S)
    S, T = R_src.shape[0], decoder_self[0].shape[-1]
    flow = np.hstack([np.zeros((T, S)), np.eye(T)])  # (T, S + T)
    from_src = np.hstack([R_src, np.zeros((S, T))])  # (S, S + T)
    for A_self, A_cross in zip(decoder_self, cross, strict=True):
        flow = _with_residual(A_self.mean(0)) @ flow
        flow = 0.5 * flow + 0.5 * A_cross.mean(0) @ from_src
    src_part = flow[:, :S]
    return src_part / src_part.sum(-1, keepdims=True)


@dataclass
class Attribution:
    src_tokens: list[str]
    position: int  # output position explained (index into next_tokens)
    token: str  # the output token there
    scores: dict[str, np.ndarray]  # method -> (S,): raw, rollout, grad_x_input, blank_out
    spearman: dict[str, float]  # method -> ρ with blank_out
    by_layer: list[dict]  # per decoder layer l: ρ of raw attention of layer l and of rollout up to l,
    # at this position ("raw", "rollout") and averaged over every output position ("raw_mean", "rollout_mean")


def attribute(model, src: torch.Tensor, tgt: torch.Tensor, labels: torch.Tensor, position: int,
              meta: dict | None = None) -> Attribution:
    """Source-token importance for output `position` (src (1, S), tgt (1, T) = [BOS] + output,
    labels (1, T) = output + [EOS]), four ways, with each one's Spearman ρ against blank-out."""
    T = tgt.shape[1]
    if not 0 <= position < T:
        raise ValueError(f"output position {position} does not exist: the output has {T} positions (0..{T - 1})")
    with torch.no_grad():
        _, trace = model.run_with_trace(src, tgt, names="*_attn.weights")
    w = {n: trace[n][0].double().numpy() for n in trace.names()}  # (H, Lq, Lk)
    L_enc, L_dec = model.cfg.n_encoder_layers, model.cfg.n_decoder_layers
    enc = [w[f"encoder.layers.{i}.self_attn.weights"] for i in range(L_enc)]
    dec = [w[f"decoder.layers.{i}.self_attn.weights"] for i in range(L_dec)]
    cross = [w[f"decoder.layers.{i}.cross_attn.weights"] for i in range(L_dec)]
    blank = _blank_out(model, src, tgt, labels)  # (T, S)
    scores = {
        "raw": cross[-1].mean(0)[position],
        "rollout": rollout_seq2seq(enc, dec, cross)[position],
        "grad_x_input": _grad_x_input(model, src, tgt, position, int(labels[0, position])),
        "blank_out": blank[position],
    }
    rho = {k: spearman(v, scores["blank_out"]) for k, v in scores.items() if k != "blank_out"}
    by_layer = []
    for layer in range(L_dec):
        raw, roll = cross[layer].mean(0), rollout_seq2seq(enc, dec[:layer + 1], cross[:layer + 1])  # (T, S)
        each = {k: [spearman(m[t], blank[t]) for t in range(T)] for k, m in (("raw", raw), ("rollout", roll))}
        by_layer.append({"layer": layer, "raw": each["raw"][position], "rollout": each["rollout"][position],
                         "raw_mean": float(np.nanmean(each["raw"])),
                         "rollout_mean": float(np.nanmean(each["rollout"]))})
    meta = meta or {}
    toks = meta.get("next_tokens") or []
    return Attribution(list(meta.get("src_tokens") or []), position,
                       toks[position] if position < len(toks) else str(int(labels[0, position])), scores, rho,
                       by_layer)


def _grad_x_input(model, src, tgt, position: int, label: int) -> np.ndarray:
    """Σ_d ∂log p(label)/∂x · x at each source token embedding (token embedding × √d_model): the
    hook swaps in a leaf tensor that asks for its gradient."""
    leaf: list[torch.Tensor] = []

    def grab(x: torch.Tensor, name: str) -> torch.Tensor:
        leaf.append(x.detach().requires_grad_(True))
        return leaf[-1]

    with torch.enable_grad():
        logits = model.run_with_hooks(src, tgt, hooks={"encoder.embed.tok": grab})
        # autograd.grad, not backward(): nothing accumulates in the (shared) model's parameters
        (grad,) = torch.autograd.grad(logits[0, position].log_softmax(-1)[label], leaf[0])
    return (grad * leaf[0].detach())[0].sum(-1).double().numpy()


@torch.no_grad()
def _blank_out(model, src, tgt, labels) -> np.ndarray:
    """(T, S): log p(label_t) intact − log p(label_t) with source token j hidden, for every output
    position t and source token j, in one batch of S + 1 rows."""
    S = src.shape[1]
    hooks = iv.block_source_by_row(list(range(S)), first_row=1)
    logits = model.run_with_hooks(src.repeat(S + 1, 1), tgt.repeat(S + 1, 1), hooks=hooks)  # (S+1, T, V)
    logp = logits.log_softmax(-1).gather(-1, labels.repeat(S + 1, 1)[..., None])[..., 0].double()  # (S+1, T)
    return (logp[0] - logp[1:]).T.numpy()


def attribution_for(ckpt, trace, position: int) -> Attribution:
    """`attribute` on a checkpoint's teacher-forced trace, for output `position`."""
    from model.analysis.runs import teacher_forced

    return attribute(ckpt.model, *teacher_forced(ckpt, trace), position, trace.meta)
