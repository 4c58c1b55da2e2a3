"""A real batch with padding: several sentences of different lengths in one forward pass, and the
loss that must ignore [PAD] (seed 001 averages over every position instead).

    trace, losses = batch_trace(ckpt, [("3 november 2023", "2023-11-03"), ("14 OCT 1994", "1994-10-14")])
    losses.right_mean, losses.wrong_mean
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from model.core.trace import Trace
from model.toy.train import make_batch

MAX_SENTENCES = 4


@dataclass(frozen=True)
class TokenLosses:
    per_token: torch.Tensor  # (B, T) cross-entropy of each label; exactly 0 where the label is [PAD]
    real: torch.Tensor  # (B, T) bool, True where the label is a real token

    @property
    def right_mean(self) -> float:
        """Sum over real tokens / number of real tokens (what F.cross_entropy(ignore_index=pad) computes)."""
        return float(self.per_token.sum() / self.real.sum())

    @property
    def wrong_mean(self) -> float:
        """Seed 001's `torch.mean(loss * mask)`: the [PAD] zeros are counted in the denominator."""
        return float(self.per_token.mean())


def token_losses(logits: torch.Tensor, label: torch.Tensor, pad_id: int) -> TokenLosses:
    """Per-token cross-entropy (no label smoothing) of logits (B, T, V) against label (B, T), PAD masked to 0."""
    ce = F.cross_entropy(logits.transpose(1, 2), label, reduction="none")  # (B, T)
    real = label != pad_id
    return TokenLosses(torch.where(real, ce, torch.zeros_like(ce)), real)


def batch_trace(ckpt, pairs: list[tuple[str, str]]) -> tuple[Trace, TokenLosses]:
    """Teacher-forced pass of 2..MAX_SENTENCES (source, target) pairs as ONE padded batch.

    Trace.meta holds, per row, src_tokens / tgt_tokens (decoder input) / next_tokens (labels),
    with "[PAD]" where the row was padded."""
    if not 1 <= len(pairs) <= MAX_SENTENCES:
        raise ValueError(f"a batch here holds 1 to {MAX_SENTENCES} sentences, got {len(pairs)}")
    for s, tgt in pairs:
        ckpt.encode_source(s)  # refuses empty or too-long input with a clear message
        ckpt.target_ids(tgt)
    pad = ckpt.cfg.pad_id
    src, tgt_in, label = make_batch(pairs, ckpt.src_tokenizer, ckpt.tgt_tokenizer, pad, ckpt.src_eos)
    if src.shape[1] > ckpt.cfg.max_len or tgt_in.shape[1] > ckpt.cfg.max_len:
        raise ValueError(f"a sentence is longer than this model's limit of {ckpt.cfg.max_len} tokens")
    meta = {
        "src_tokens": [ckpt.src_tokenizer.tokens(r.tolist()) for r in src],
        "tgt_tokens": [ckpt.tgt_tokenizer.tokens(r.tolist()) for r in tgt_in],
        "next_tokens": [ckpt.tgt_tokenizer.tokens(r.tolist()) for r in label],
        "label_ids": label.tolist(),
        "pairs": [list(p) for p in pairs],
        "checkpoint": ckpt.name,
    }
    with torch.no_grad():
        logits, trace = ckpt.model.run_with_trace(src, tgt_in, meta=meta)
    return trace, token_losses(logits, label, pad)
