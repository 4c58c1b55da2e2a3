"""Small measurements the pages and lessons 11–15 need beyond phenomena.py / ioi.py: interventions on a
language model for the Experiments page, and head importance.

What the output does when token 0's key is blocked (`block_sink`, `SinkBlock`, `sink_hooks`) lives in
phenomena.py beside `sink_effect`, which calls it: one KL for the page and the lesson. They are
re-exported here for the callers that import them from this module."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from model.analysis.phenomena import SinkBlock, as_decoder, as_ids, attention_names, block_sink, sink_hooks
from model.core import recorder

__all__ = ["SinkBlock", "block_sink", "sink_hooks", "LM_INTERVENTIONS", "NEXT_TOKEN_METRIC", "no_rope", "lm_hooks",
           "LMBeforeAfter", "lm_before_after", "lm_head_importance"]


# ---------------------------------------------------------------------- the Experiments page on a language model

# What a decoder-only model can be broken with (specs as on the Experiments page, `id:arg=value,...`). The
# seq2seq-only ones (a source token or order, padding, the seeds' encoder-decoder bugs) do not apply.
LM_INTERVENTIONS = ("ablate_head", "ablate_kv_head", "scale_head", "no_scaling", "no_positional",
                    "no_lookahead_mask")
NEXT_TOKEN_METRIC = "log-prob of the model's next token"


def no_rope() -> dict:
    """Rotate q and k by angle 0 (RoPE off): attention no longer sees where the tokens are."""
    return {"decoder.rope.angles": lambda a, name: torch.zeros_like(a)}


def lm_hooks(specs: Sequence[str], lm) -> dict:
    """The hooks of LM intervention specs. `ablate_kv_head:module=...,kv_head=g,mode=zero|mean` knocks out a
    shared K/V head; `no_positional` removes the model's own positions (RoPE's rotation, or learned ones)."""
    from model import interventions as iv

    m = as_decoder(lm)
    out = []
    for spec in specs:
        ident, _, args = spec.partition(":")
        if ident not in LM_INTERVENTIONS:
            raise iv.SpecError(f"{ident!r} does not apply to a decoder-only language model; choose one of: "
                               f"{', '.join(LM_INTERVENTIONS)}")
        if ident == "ablate_kv_head":
            kw = dict(part.split("=", 1) for part in filter(None, args.split(",")))
            try:
                out.append(iv.ablate_kv_head(kw["module"], int(kw.get("kv_head", 0)), kw.get("mode", "zero")))
            except (KeyError, ValueError) as e:
                raise iv.SpecError(f"{spec!r}: ablate_kv_head needs module=..., kv_head=<int>, mode=zero|mean") from e
        elif ident == "no_positional":
            out.append(no_rope() if m.cfg.positional == "rotary" else iv.no_positional("decoder"))
        else:
            out.append(iv.build([spec], m.cfg))
    return iv.combine(*out)


@dataclass
class LMBeforeAfter:
    """The next token at the last position and the prompt's own loss, intact and under hooks."""

    top_before: list[tuple[int, float]]  # the 5 most likely next tokens (id, probability), intact
    top_after: list[tuple[int, float]]
    kl: float  # KL(intact || after) of the last position's next-token distribution, nats
    logit_diff_before: float  # logit(intact top token) - logit(intact runner-up)
    logit_diff_after: float  # the same two tokens' logits, under the hooks
    loss_before: float  # mean next-token loss over the prompt (teacher-forced on its own tokens)
    loss_after: float


@torch.no_grad()
def lm_before_after(lm, text_or_ids, hooks: dict) -> LMBeforeAfter:
    import torch.nn.functional as F

    m = as_decoder(lm)
    ids = as_ids(lm, text_or_ids)[:1]
    T = ids.shape[1]
    with recorder.fast_attention(T > recorder.EXACT_UP_TO):  # a long prompt: both runs on the fused path
        a, b = m(ids)[0], m.run_with_hooks(ids, hooks=hooks)[0]  # (T, V) float: [T, V] in float64 would be 2x

    def top(logits):
        p = logits[-1].double().softmax(-1)
        v, i = p.topk(5)
        return [(int(j), float(x)) for j, x in zip(i, v, strict=True)]

    def loss(logits):  # mean next-token cross-entropy in float64, 256 rows at a time
        if T < 2:
            return float("nan")
        total = sum(float(F.cross_entropy(logits[r:min(r + 256, T - 1)].double(), ids[0, r + 1:r + 257],
                                          reduction="sum")) for r in range(0, T - 1, 256))
        return total / (T - 1)

    la, lb = a[-1].double(), b[-1].double()
    first, second = (int(x) for x in la.topk(2).indices)
    lp, lq = la.log_softmax(-1), lb.log_softmax(-1)
    return LMBeforeAfter(top(a), top(b), float((lp.exp() * (lp - lq)).sum()), float(la[first] - la[second]),
                         float(lb[first] - lb[second]), loss(a), loss(b))


@torch.no_grad()
def lm_head_importance(lm, text_or_ids, mode: str = "zero", batch: int = 32):
    """Head importance on a language model: knock out each (layer, query head) in turn, one per batch row,
    `batch` rows per forward, and measure the log-prob of the intact model's next token at the last position.
    Returns a model.analysis.heads.HeadImportance (delta [L, H])."""
    import numpy as np

    from model import interventions as iv
    from model.analysis.heads import HeadImportance

    m = as_decoder(lm)
    ids = as_ids(lm, text_or_ids)[:1]
    names = attention_names(lm)
    H = m.cfg.n_heads
    base_logp = m(ids)[0, -1].double().log_softmax(-1)
    answer = int(base_logp.argmax())
    pairs = [(i, h) for i in range(len(names)) for h in range(H)]
    scores = []
    for s in range(0, len(pairs), batch):
        chunk = pairs[s:s + batch]
        table: dict[str, list[tuple[int, int]]] = {}
        for r, (i, h) in enumerate(chunk):
            table.setdefault(names[i], []).append((r, h))
        out = m.run_with_hooks(ids.expand(len(chunk), -1), hooks=iv.ablate_heads_by_row(table, mode))
        scores.append(out[:, -1].double().log_softmax(-1)[:, answer])
    delta = (torch.cat(scores) - base_logp[answer]).numpy().reshape(len(names), H)
    return HeadImportance(names, float(base_logp[answer]), np.asarray(delta), NEXT_TOKEN_METRIC, m.describe())
