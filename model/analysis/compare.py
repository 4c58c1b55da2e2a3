"""Compare two inputs on an encoder (MiniLM): how each head's attention from one query token moves.

    "The animal didn't cross the street because it was too tired"   ("it" = the animal)
    "The animal didn't cross the street because it was too wide"    ("it" = the street)

For every head: the chosen query's attention row in both sentences, their difference, and its
preference for one key over another (w[animal] − w[street]) in each. The head finder ranks heads by
how much that preference flips between the sentences: a head that follows the meaning flips; a head
that keeps pointing "it" at "animal" whatever the adjective does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class NotATokenError(ValueError):
    """`word` is not one of `tokens` (the UI words it in its own language from these two fields)."""

    def __init__(self, word: str, tokens: list[str]):
        self.word, self.tokens = word, list(tokens)
        shown = word if len(word) <= 40 else f"{word[:40]}… ({len(word)} characters)"  # never echo 5,000 chars
        super().__init__(f"{shown!r} is not a token of this sentence; its tokens: {' '.join(tokens)}" if word.strip()
                         else f"the token is empty; this sentence's tokens: {' '.join(tokens)}")


def find_token(tokens: list[str], word: str) -> int:
    """Index of the first token equal to `word` (case-insensitive); NotATokenError listing the tokens."""
    low = [t.lower() for t in tokens]
    if word.lower() not in low:
        raise NotATokenError(word, tokens)
    return low.index(word.lower())


@dataclass
class HeadFlip:
    tokens_a: list[str]
    tokens_b: list[str]
    rows_a: np.ndarray  # (layers, H, La): the query's attention row in sentence A
    rows_b: np.ndarray  # (layers, H, Lb)
    pref_a: np.ndarray  # (layers, H): w[to1] − w[to2] in A
    pref_b: np.ndarray
    query: tuple[int, int]  # the query's index in A and B
    keys: tuple[tuple[int, int], tuple[int, int]]  # (to1 in A, to2 in A), (to1 in B, to2 in B)

    @property
    def aligned(self) -> bool:
        """Same number of tokens: the rows can be subtracted position by position."""
        return self.rows_a.shape[-1] == self.rows_b.shape[-1]

    @property
    def diff(self) -> np.ndarray:
        """(layers, H, L): row in A − row in B (only when aligned)."""
        if not self.aligned:
            raise ValueError(f"the sentences have {self.rows_a.shape[-1]} and {self.rows_b.shape[-1]} tokens: "
                             "their rows cannot be subtracted position by position")
        return self.rows_a - self.rows_b

    @property
    def flip(self) -> np.ndarray:
        """(layers, H): preference in A − preference in B."""
        return self.pref_a - self.pref_b

    def ranking(self) -> list[dict]:
        """Heads by |flip|, largest first: layer, head, pref_a, pref_b, flip, and the weights on to1."""
        Lyr, H = self.flip.shape
        (a1, _), (b1, _) = self.keys
        rows = [{"layer": i, "head": h, "pref_a": float(self.pref_a[i, h]), "pref_b": float(self.pref_b[i, h]),
                 "flip": float(self.flip[i, h]), "to1_a": float(self.rows_a[i, h, a1]),
                 "to1_b": float(self.rows_b[i, h, b1])} for i in range(Lyr) for h in range(H)]
        return sorted(rows, key=lambda r: -abs(r["flip"]))


def _rows(encoder, text: str, query: str, to1: str, to2: str):
    _, trace = encoder.run_with_trace(text, names="*.self_attn.weights")
    tokens = list(trace.meta["src_tokens"])
    q, k1, k2 = (find_token(tokens, w) for w in (query, to1, to2))
    n = encoder.model.cfg.n_encoder_layers
    rows = np.stack([trace[f"encoder.layers.{i}.self_attn.weights"][0, :, q].double().numpy() for i in range(n)])
    return tokens, rows, q, (k1, k2)  # rows (layers, H, L)


def compare_inputs(encoder, text_a: str, text_b: str, query: str = "it", to1: str = "animal",
                   to2: str = "street") -> HeadFlip:
    """Per-head attention of `query` in two sentences (see the module docstring)."""
    ta, ra, qa, ka = _rows(encoder, text_a, query, to1, to2)
    tb, rb, qb, kb = _rows(encoder, text_b, query, to1, to2)
    return HeadFlip(ta, tb, ra, rb, ra[..., ka[0]] - ra[..., ka[1]], rb[..., kb[0]] - rb[..., kb[1]],
                    (qa, qb), (ka, kb))


def preference_importance(encoder, text: str, query: str = "it", to1: str = "animal", to2: str = "street"):
    """Per head of the encoder, the change of cos(h_query, h_to1) − cos(h_query, h_to2) (final hidden
    states) when that head is zeroed: which heads make "it" read like "animal" rather than "street".
    One batched pass of 1 + layers·heads rows."""
    import torch
    import torch.nn.functional as F

    from model.analysis.heads import head_importance

    enc = encoder.encode(text)
    q, k1, k2 = (find_token(enc.tokens, w) for w in (query, to1, to2))

    def metric(h: torch.Tensor) -> torch.Tensor:  # (R, L, D) -> (R,)
        return F.cosine_similarity(h[:, q], h[:, k1], -1) - F.cosine_similarity(h[:, q], h[:, k2], -1)

    return head_importance(encoder.model, torch.tensor([enc.ids]), metric=metric,
                           metric_name="cosine preference")
