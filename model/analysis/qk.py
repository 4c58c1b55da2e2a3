"""The Q/K map (issue 19 §5, after AttentionViz, Yeh et al. 2023): one head's queries and keys of a
batch of inputs in one 2-D picture, where nearness tracks attention.

For one head: its queries (post-RoPE: `.q`, so scores = q·k/√d) and its keys (with grouped-query
attention, those of the K/V head it reads, h // (H / H_kv)). Two changes leave every softmax row unchanged,
so we make them before projecting:
- scale q by a and k by 1/a: q·k unchanged. a = sqrt(spread(k) / spread(q)) (spread: mean distance
  to the cloud's centroid) gives both clouds the same mean norm around their shared centroid;
- translate the keys by one vector c: q·(k + c) = q·k + q·c, the same constant added to one query's
  every score -> softmax unchanged. c moves the keys' centroid onto the queries'.
Then a joint PCA (numpy SVD of the centred points) to 2-D.

Each point carries its token, position, sentence index and kind ("query"/"key"). `top_keys` lists a
query's top-5 keys from the real attention weights, to check the picture. `clarity` scores a head:
for each query with more than k visible keys, the share of its true top-k keys (by weight) that are
among its k nearest keys in the 2-D picture, averaged; chance is k / (visible keys).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from model.analysis.phenomena import as_decoder, as_ids


@dataclass
class QKMap:
    module: str
    head: int
    kv_head: int
    xy: np.ndarray  # [N, 2]: the joint PCA of the normalised queries and keys
    kind: np.ndarray  # [N]: "query" or "key"
    token: list[str]
    position: np.ndarray  # [N]
    sentence: np.ndarray  # [N]
    explained: np.ndarray  # [2]: share of the variance on each axis
    weights: list[np.ndarray]  # per sentence [T, T]: the head's real attention
    q: list[np.ndarray]  # per sentence [T, hs]: normalised queries (a·q)
    k: list[np.ndarray]  # per sentence [T, hs]: normalised keys (k/a + c)
    scale: float  # a
    shift: np.ndarray  # c

    def index(self, kind: str, sentence: int, position: int) -> int:
        hit = np.nonzero((self.kind == kind) & (self.sentence == sentence) & (self.position == position))[0]
        if not len(hit):
            raise ValueError(f"no {kind} at sentence {sentence}, position {position}")
        return int(hit[0])

    def top_keys(self, query: int, k: int = 5) -> list[tuple[int, float]]:
        """The point indices of query point `query`'s top-k keys by the head's real weights, with the weights."""
        if self.kind[query] != "query":
            raise ValueError(f"point {query} is a key; pick a query")
        s, p = int(self.sentence[query]), int(self.position[query])
        w = self.weights[s][p]
        order = np.argsort(-w, kind="stable")[:min(k, p + 1)]  # causal: keys 0..p are visible
        return [(self.index("key", s, int(j)), float(w[j])) for j in order]

    def clarity(self, k: int = 5) -> tuple[float, float]:
        """(clarity, chance): see the module docstring. NaN when no query has more than k visible keys."""
        hits, chance = [], []
        for s, w in enumerate(self.weights):
            qi = np.nonzero((self.kind == "query") & (self.sentence == s))[0]
            ki = np.nonzero((self.kind == "key") & (self.sentence == s))[0]
            qxy, kxy = self.xy[qi[np.argsort(self.position[qi])]], self.xy[ki[np.argsort(self.position[ki])]]
            for p in range(k, w.shape[0]):  # query p sees keys 0..p: more than k of them
                true = set(np.argsort(-w[p, :p + 1], kind="stable")[:k].tolist())
                near = set(np.argsort(((kxy[:p + 1] - qxy[p]) ** 2).sum(-1), kind="stable")[:k].tolist())
                hits.append(len(true & near) / k)
                chance.append(k / (p + 1))
        return (float(np.mean(hits)), float(np.mean(chance))) if hits else (math.nan, math.nan)


def normalise(q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """(a·q, k/a + c, a, c): scale, then translate the keys so their centroid meets the queries'
    (c = a·mean(q) - mean(k)/a). a = sqrt(spread(k) / spread(q)), spread = mean distance to the cloud's
    own centroid, so both clouds have the same mean norm around the shared centroid (the picture PCA
    sees). Every query's scores change by one constant (a q·c), so softmax rows stay the same."""
    spread = lambda x: np.linalg.norm(x - x.mean(0), axis=1).mean()  # noqa: E731
    a = math.sqrt(spread(k) / spread(q)) if spread(q) > 1e-12 and spread(k) > 1e-12 else 1.0
    c = a * q.mean(0) - k.mean(0) / a
    return q * a, k / a + c, a, c


def pca2(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Joint PCA to 2-D by SVD of the centred points: (coordinates [N, 2], explained variance share [2])."""
    x = points - points.mean(0)
    _, s, vt = np.linalg.svd(x, full_matrices=False)
    var = s ** 2
    share = var[:2] / var.sum() if var.sum() > 0 else np.zeros(2)
    return x @ vt[:2].T, share


@torch.no_grad()
def gather(lm, inputs, modules: list[str]) -> list[dict[str, torch.Tensor]]:
    """One trace per input (texts or id lists; lengths may differ) of the modules' q, k and weights."""
    m = as_decoder(lm)
    names = [f"{mod}.{r}" for mod in modules for r in ("q", "k", "weights")]
    out = []
    for x in inputs:
        _, tr = m.run_with_trace(as_ids(lm, x)[:1], names=names)
        out.append({n: tr[n][0] for n in names} | {"tgt_ids": tr.meta["tgt_ids"][0]})
    return out


def qk_map(lm, inputs, module: str, head: int, traces=None) -> QKMap:
    """The Q/K map of query head `head` of attention module `module` over `inputs` (texts or ids)."""
    m = as_decoder(lm)
    H, Hkv = m.cfg.n_heads, m.cfg.kv_heads
    if not 0 <= head < H:
        raise ValueError(f"head {head} does not exist: {module} has {H} heads (0..{H - 1})")
    if module not in m.describe()["attention"]:
        raise ValueError(f"no attention module {module!r}")
    kv = head // (H // Hkv)
    traces = traces if traces is not None else gather(lm, inputs, [module])
    qs = [t[f"{module}.q"][head].double().numpy() for t in traces]
    ks = [t[f"{module}.k"][kv].double().numpy() for t in traces]
    ws = [t[f"{module}.weights"][head].double().numpy() for t in traces]
    qn, kn, a, c = normalise(np.concatenate(qs), np.concatenate(ks))
    xy_all, share = pca2(np.concatenate([qn, kn]))
    n_q = len(qn)
    lengths = [len(q) for q in qs]
    sent = np.concatenate([np.full(n, i) for i, n in enumerate(lengths)])
    pos = np.concatenate([np.arange(n) for n in lengths])
    toks = []
    for t in traces:
        ids = t["tgt_ids"]
        toks += lm.tokens(ids) if getattr(lm, "tokenizer", None) is not None else [str(i) for i in ids]
    cuts = np.cumsum(lengths)[:-1]
    return QKMap(module, head, kv, xy_all, np.array(["query"] * n_q + ["key"] * n_q),
                 toks + toks, np.concatenate([pos, pos]), np.concatenate([sent, sent]), share, ws,
                 np.split(qn, cuts), np.split(kn, cuts), a, c)


def head_clarity(lm, inputs, k: int = 5, modules: list[str] | None = None) -> tuple[np.ndarray, float]:
    """([L, H] clarity of every head's Q/K map over `inputs`, the mean chance level): which heads look clear."""
    m = as_decoder(lm)
    modules = modules or list(m.describe()["attention"])
    traces = gather(lm, inputs, modules)
    out = np.zeros((len(modules), m.cfg.n_heads))
    chance = 0.0
    for i, mod in enumerate(modules):
        for h in range(m.cfg.n_heads):
            out[i, h], chance = qk_map(lm, inputs, mod, h, traces=traces).clarity(k)
    return out, chance
