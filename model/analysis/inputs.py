"""Inputs shared by the analyses: a LanguageModel or DecoderLM in, the decoder and token ids out,
and how many batch rows a forward may take.

Its own module so that phenomena.py and patching.py both import it instead of each other
(they used to form an import circle: as_decoder/as_ids one way, fit_batch the other)."""

from __future__ import annotations

import torch


def as_decoder(lm):
    """The DecoderLM of a LanguageModel (or the DecoderLM itself)."""
    return getattr(lm, "model", lm)


def as_ids(lm, text_or_ids) -> torch.Tensor:
    """LongTensor [B, T] from text (the LanguageModel's tokenizer, no chat template) or ids."""
    if isinstance(text_or_ids, str):
        if not hasattr(lm, "encode"):
            raise ValueError("text needs a LanguageModel (with a tokenizer); pass token ids to a bare DecoderLM")
        return lm.encode(text_or_ids)
    ids = torch.as_tensor(text_or_ids, dtype=torch.long)
    return ids[None] if ids.dim() == 1 else ids


LOGITS_BUDGET_BYTES = 256 * 2**20


def fit_batch(batch: int, T: int, vocab: int) -> int:
    """At most `batch` rows, fewer if a forward's float32 logits [rows, T, V] would pass LOGITS_BUDGET_BYTES."""
    return max(1, min(batch, LOGITS_BUDGET_BYTES // (T * vocab * 4)))
