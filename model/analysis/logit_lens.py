"""The logit lens (nostalgebraist 2020): read each layer's residual stream as if it were the last.

Row "embed" reads the embeddings, row i the output of layer i. Each row goes through the model's own
final norm, with that row's OWN statistics (the norm is simply applied to that residual: its rms, or
mean and std, are recomputed per layer and position, not borrowed from the last layer), then through
the unembedding and the model's final soft-cap (Gemma 2), `DecoderLM.unembed`: the model's own last steps.
The last row is therefore exactly the model's logits. It shows at which depth the
answer appears.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from model.analysis.phenomena import as_decoder, as_ids


@dataclass
class LogitLens:
    layers: list[str]  # "embed", "0", ..., str(L - 1)
    tokens: list[str] | None  # the input pieces (positions)
    top_ids: np.ndarray  # [L + 1, T]: the most likely next token read at each layer and position
    top_probs: np.ndarray  # [L + 1, T]: its probability
    top_tokens: list[list[str]] | None  # the pieces of top_ids
    target_probs: np.ndarray | None  # [L + 1, T]: probability of `target` (if given)
    target_ranks: np.ndarray | None  # [L + 1, T]: its rank (0 = top)


@torch.no_grad()
def layer_logits(lm, text_or_ids) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(model logits [1, T, V], [residual of each row [1, T, D]]) for the lens: embeddings + each layer's output."""
    m = as_decoder(lm)
    ids = as_ids(lm, text_or_ids)[:1]
    names = ["decoder.embed.out"] + [f"decoder.layers.{i}.out" for i in range(m.cfg.n_layers)]
    logits, tr = m.run_with_trace(ids, names=names)
    return logits, [tr[n] for n in names]


@torch.no_grad()
def logit_lens(lm, text_or_ids, target: int | None = None, positions: Sequence[int] | None = None) -> LogitLens:
    """Layer x position table of the top next token and its probability (and of `target`'s, if given).
    One layer's [T, V] logits at a time, so memory stays at one row of the table. `positions`: read only
    these (a page shows a long prompt's last few: 31 layers x T x 49k logits would cost seconds)."""
    m = as_decoder(lm)
    ids = as_ids(lm, text_or_ids)[:1]
    _, resid = layer_logits(lm, ids)
    pos = list(range(ids.shape[1])) if positions is None else list(positions)
    top_ids, top_p, tgt_p, tgt_r = [], [], [], []
    for x in resid:
        logits = m.unembed(x[:, pos])[0]  # the final norm's own statistics for THIS residual, then soft-cap
        p = logits.float().softmax(-1)
        best = p.max(-1)
        top_ids.append(best.indices)
        top_p.append(best.values)
        if target is not None:
            tgt_p.append(p[:, target])
            tgt_r.append((logits > logits[:, target:target + 1]).sum(-1))
    has_tok = getattr(lm, "tokenizer", None) is not None
    top = torch.stack(top_ids).numpy()
    return LogitLens(["embed"] + [str(i) for i in range(m.cfg.n_layers)],
                     lm.tokens(ids[0, pos]) if has_tok else None, top, torch.stack(top_p).double().numpy(),
                     [lm.tokens(row) for row in top] if has_tok else None,
                     torch.stack(tgt_p).double().numpy() if target is not None else None,
                     torch.stack(tgt_r).numpy() if target is not None else None)


@dataclass
class Settles:
    """Where the model's answer at one position shows up in the lens (layers only, not the embeddings)."""

    token: int  # the model's own answer there (the last layer's top token)
    layer: int  # the first layer from which every later layer's top token is the answer
    n_layers: int
    first_top: int  # the first layer where the answer is the top token at all (it may leave again)

    @property
    def only_last(self) -> bool:
        """The answer tops the lens only at the last layer: it does not 'appear and stay' earlier."""
        return self.layer == self.n_layers - 1


def settles(lens: LogitLens, position: int = -1) -> Settles:
    """From which layer the answer tops the lens at `position` and stays there (the rows of `lens` after
    "embed"; the last row is the model's own output, so the answer always tops it)."""
    col = [int(v) for v in lens.top_ids[1:, position]]
    final = col[-1]
    layer = next(i for i in range(len(col)) if all(v == final for v in col[i:]))
    return Settles(final, layer, len(col), col.index(final))
