"""Small measurements the Attention phenomena page and lessons 11–15 need beyond phenomena.py / ioi.py:
what the output does at the last position when token 0's key is blocked (in some heads or everywhere).

Built on `phenomena.block_first_key` (the same hooks as `sink_effect`), so the page and the tests measure
one thing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from model.analysis.phenomena import as_decoder, as_ids, attention_names, block_first_key


@dataclass
class SinkBlock:
    """The next token at the last position, intact and with token 0's key blocked."""

    heads: list[tuple[int, int]] | None  # the (layer, head) pairs blocked; None = every head of every layer
    top_before: int  # the intact model's next token (its "answer")
    p_before: float  # its probability, intact
    top_after: int  # the next token with token 0 blocked
    p_after: float  # its probability then
    answer_p_after: float  # the intact answer's probability with token 0 blocked
    answer_logit_before: float
    answer_logit_after: float
    kl: float  # KL(intact || blocked) of the next-token distribution at the last position, nats

    @property
    def changed(self) -> bool:
        return self.top_before != self.top_after


def sink_hooks(lm, heads: Sequence[tuple[int, int]] | None = None) -> dict:
    """Hooks hiding token 0's key from query rows 1.. in the given (layer, head) pairs, or everywhere (None)."""
    names = attention_names(lm)
    if heads is None:
        return block_first_key(names=names)
    by_module: dict[str, list[int]] = {}
    for layer, head in heads:
        by_module.setdefault(names[layer], []).append(int(head))
    return block_first_key(layer_heads=by_module)


@torch.no_grad()
def block_sink(lm, text_or_ids, heads: Sequence[tuple[int, int]] | None = None) -> SinkBlock:
    """Run the input intact and with token 0's key blocked (`heads`, or everywhere); compare the last
    position's next-token distribution."""
    m = as_decoder(lm)
    ids = as_ids(lm, text_or_ids)[:1]
    if ids.shape[1] < 2:
        raise ValueError("blocking token 0 needs at least 2 tokens")
    before = m(ids)[0, -1].double()
    after = m.run_with_hooks(ids, hooks=sink_hooks(lm, heads))[0, -1].double()
    lp, lq = before.log_softmax(-1), after.log_softmax(-1)
    answer = int(before.argmax())
    top = int(after.argmax())
    return SinkBlock(None if heads is None else [(int(a), int(b)) for a, b in heads], answer,
                     float(lp[answer].exp()), top, float(lq[top].exp()), float(lq[answer].exp()),
                     float(before[answer]), float(after[answer]), float((lp.exp() * (lp - lq)).sum()))
