"""Which heads matter, and what each head does.

head_importance: knock out each head of every attention module in turn and measure the change of a
score (the log-prob of the reference output, or any metric of the output). All ablations run in ONE
batched forward pass: row 0 is the intact model, row 1 + i·H + h has head h of module i knocked out
(`interventions.ablate_heads_by_row`).

head_summary: per head, from a trace: the mean entropy of its attention rows, the mean distance
between a query and the keys it attends to, and the share of attention on special tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from model import interventions as iv
from model.core.describe import KINDS, described  # noqa: F401  (KINDS: the keys of by_kind)

SPECIAL = {"[BOS]", "[EOS]", "[CLS]", "[SEP]"}


def attention_modules(model) -> list[str]:
    """Every attention module's name, in computation order ("encoder.layers.0.self_attn", ...)."""
    return list(model.describe()["attention"])


def kind_of(module: str, description: Mapping) -> tuple[str, int]:
    """(kind, layer) of an attention module, as the model describes itself (model/core/describe.py):
    "decoder.layers.1.cross_attn" -> ("cross", 1)."""
    info = description["attention"][module]
    return info["kind"], info["layer"]


@dataclass
class HeadImportance:
    modules: list[str]
    base: float  # the intact model's score
    delta: np.ndarray  # (n_modules, H): score with the head knocked out − base
    metric: str  # what the score is, in words
    description: dict = field(default_factory=dict)  # the model's own (model/core/describe.py)

    def by_kind(self) -> dict[str, np.ndarray]:
        """kind -> (layers, H) map of `delta`."""
        out: dict[str, list] = {}
        for m, row in zip(self.modules, self.delta, strict=True):
            out.setdefault(kind_of(m, self.description)[0], []).append(row)
        return {k: np.stack(v) for k, v in out.items()}

    def top(self, n: int = 5) -> list[tuple[str, int, float]]:
        """The n heads whose removal changes the score most: (module, head, delta), largest |delta| first."""
        order = np.argsort(-np.abs(self.delta), axis=None)[:n]
        H = self.delta.shape[1]
        return [(self.modules[i // H], int(i % H), float(self.delta.flat[i])) for i in order]


def ablation_hooks(modules: list[str], n_heads: int, mode: str = "zero", repeat: int = 1):
    """Hooks for one ablation per block of `repeat` rows: block 0 intact, block 1 + i·H + h knocks out
    head h of modules[i]. Returns (hooks, number of rows)."""
    table = {m: [(r, h) for h in range(n_heads)
                 for r in range((1 + i * n_heads + h) * repeat, (2 + i * n_heads + h) * repeat)]
             for i, m in enumerate(modules)}
    return iv.ablate_heads_by_row(table, mode), (1 + len(modules) * n_heads) * repeat


@torch.no_grad()
def head_importance(model, src: torch.Tensor, tgt: torch.Tensor | None = None,
                    labels: torch.Tensor | None = None, metric: Callable | None = None,
                    mode: str = "zero", metric_name: str = "log-prob of the reference output",
                    ) -> HeadImportance:
    """Score change per head, batched: src (1, S), tgt (1, T) the decoder input ([BOS] + reference),
    labels (1, T) what each position should predict (reference + [EOS]). The default score is the
    sum of log p(labels); `metric(output) -> (R,)` scores other outputs (an encoder's hidden states)."""
    modules = attention_modules(model)
    hooks, R = ablation_hooks(modules, model.cfg.n_heads, mode)
    out = model.run_with_hooks(src.repeat(R, 1), None if tgt is None else tgt.repeat(R, 1), hooks=hooks)
    if metric is None:
        logp = out.log_softmax(-1).gather(-1, labels.repeat(R, 1)[..., None])[..., 0]  # (R, T)
        scores = logp.sum(-1)
    else:
        scores = metric(out)
    scores = scores.double().numpy()
    delta = (scores[1:] - scores[0]).reshape(len(modules), model.cfg.n_heads)
    return HeadImportance(modules, float(scores[0]), delta, metric_name, model.describe())


@torch.no_grad()
def exact_match_importance(ckpt, pairs: list[tuple[str, str]]) -> HeadImportance:
    """Change in exact match (greedy, on `pairs`) when each head is zeroed: one batch of
    (1 + heads) × len(pairs) rows."""
    from model.analysis.runs import _limit, greedy

    t, model = ckpt.tgt_tokenizer, ckpt.model
    modules = attention_modules(model)
    N = len(pairs)
    hooks, R = ablation_hooks(modules, model.cfg.n_heads, "zero", repeat=N)
    rows = [ckpt.encode_source(s)[0] for s, _ in pairs]
    src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=model.cfg.pad_id)
    ids, _, _ = greedy(model, src.repeat(R // N, 1), t.bos_id, t.eos_id, hooks, _limit(ckpt))
    want = [t.decode(t.encode(y)) for _, y in pairs] * (R // N)
    hit = np.array([t.decode(o) == w for o, w in zip(ids, want, strict=True)], float).reshape(R // N, N).mean(1)
    delta = (hit[1:] - hit[0]).reshape(len(modules), model.cfg.n_heads)
    return HeadImportance(modules, float(hit[0]), delta, "exact match", model.describe())


def head_summary(trace, modules: list[str] | None = None) -> dict[str, np.ndarray]:
    """Per head of each module in `trace` (first batch row), stacked (n_modules, H):

    entropy: mean over query rows of −Σ_k w log w (nats; 0 = one key, log n = uniform);
    distance: mean over queries of Σ_k w·|q − k| in positions (self-attention; NaN for cross-attention,
    whose queries and keys are different sequences);
    special: mean over queries of the weight on [BOS]/[EOS]/[CLS]/[SEP] keys.
    Also "modules": the module names (a list)."""
    desc = described(trace.meta)
    names = modules or [m for m in desc["attention"] if f"{m}.weights" in trace]
    src, tgt = trace.meta.get("src_tokens") or [], trace.meta.get("tgt_tokens") or []
    ent, dist, spec = [], [], []
    for m in names:
        info = desc["attention"][m]
        if hasattr(trace, "attention") and info["kind"] != "cross":  # a lazy trace (a long input): tile by tile
            keys = {"src_tokens": src, "tgt_tokens": tgt}[info["key_tokens"]]
            for out, x in zip((ent, dist, spec), _summary_tiled(trace, m, keys), strict=True):
                out.append(x)
            continue
        w = trace[f"{m}.weights"][0].double()  # (H, Lq, Lk)
        H, Lq, Lk = w.shape
        ent.append((-(w * w.clamp_min(1e-30).log()).sum(-1)).mean(-1).numpy())
        if info["kind"] == "cross":  # queries and keys are different sequences: no distance between them
            dist.append(np.full(H, np.nan))
        else:
            gap = (torch.arange(Lq)[:, None] - torch.arange(Lk)[None]).abs().double()
            dist.append((w * gap).sum(-1).mean(-1).numpy())
        keys = {"src_tokens": src, "tgt_tokens": tgt}[info["key_tokens"]]
        special = torch.tensor([k in SPECIAL for k in keys[:Lk]] + [False] * (Lk - len(keys[:Lk])))
        spec.append(w[..., special].sum(-1).mean(-1).numpy())
    return {"modules": names, "kinds": [desc["attention"][m]["kind"] for m in names], "entropy": np.stack(ent),
            "distance": np.stack(dist), "special": np.stack(spec)}


def _summary_tiled(trace, module: str, keys: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """head_summary's entropy, distance and special weight of one self-attention module of a LazyTrace, from
    blocks of query rows (model.analysis.long's tiles: never H × T × T in float64): the same definitions,
    the row sums added in another order (equal to ~1e-12)."""
    from model.analysis.long import _tiles

    T = trace.n_tokens
    H = trace.n_heads(module)
    special = torch.tensor([k in SPECIAL for k in keys[:T]] + [False] * (T - len(keys[:T])))
    ent, dist, spec = (torch.zeros(H, dtype=torch.float64) for _ in range(3))
    for rows in _tiles(T, H):
        w = trace.attention(module, None, rows, slice(0, rows.stop)).double()  # (H, R, r1): causal rows
        gap = (torch.arange(rows.start, rows.stop)[:, None] - torch.arange(rows.stop)[None]).abs().double()
        ent += (-(w * w.clamp_min(1e-30).log()).sum(-1)).sum(-1)
        dist += (w * gap).sum(-1).sum(-1)
        spec += w[..., special[:rows.stop]].sum(-1).sum(-1)
    return (ent / T).numpy(), (dist / T).numpy(), (spec / T).numpy()


def importance_for(ckpt, trace, mode: str = "zero") -> HeadImportance:
    """Head importance on a checkpoint's teacher-forced trace: Δ log-prob of the output it traced."""
    from model.analysis.runs import teacher_forced

    return head_importance(ckpt.model, *teacher_forced(ckpt, trace), mode=mode)
