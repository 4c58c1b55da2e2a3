"""The Q/K map's batch: one model's q, k and weights of every attention module over a batch of inputs
(viz.figures.qk.QKBatch). This runs the model (figure builders never do); the page caches the result per
model, so switching layer, head or colour only re-projects.

- a toy checkpoint: 40 held-out pairs of its task, teacher-forced (source → reference target);
- a decoder-only LM: the 40 sentences of viz.figures.qk.SENTENCES in one batched pass (right-padded: in causal
  attention a position never sees the padding after it, so each sentence's rows are its own pass's), or
  [BOS] + 50 random tokens repeated twice (model/analysis/phenomena.induction_sequence), 4 seeds;
- an encoder (MiniLM): the same 40 sentences, one pass each (bidirectional: padding would be seen);
- any model, "prompt": the sidebar's text alone (a toy model: with its target, or its own greedy output);
  a language model's prompt over FULL_UP_TO tokens (issue 24 §3): q and k from its trace (O(T·d)), a head's
  weights computed from the trace when drawn (`trace_batch`), never 30 layers × H × T × T.
"""

from __future__ import annotations

import numpy as np
import torch

from model.core import recorder
from model.core.describe import described
from viz.figures.qk import SENTENCES, QKBatch

N_PAIRS = 40
REPEAT_N, REPEAT_SEEDS = 50, 4
BATCHES = ("sentences", "repeat", "prompt")
FULL_UP_TO = 512  # a prompt keeps every head's weights up to this many tokens (SmolLM2: 30 × 9 × 512² floats,
                  # 283 MB); beyond, q and k only and a head's weights when drawn (at 2,048 tokens a full
                  # capture would be 30 × 151 MB)


def _arrays(trace, modules: list[str], row: int = 0, n_q: int | None = None, n_k: int | None = None) -> dict:
    out = {}
    for m in modules:
        q, k, w = trace[f"{m}.q"][row], trace[f"{m}.k"][row], trace[f"{m}.weights"][row]
        nq, nk = n_q or q.shape[1], n_k or k.shape[1]
        out[f"{m}.q"] = q[:, :nq].float().numpy().copy()
        out[f"{m}.k"] = k[:, :nk].float().numpy().copy()
        out[f"{m}.weights"] = w[:, :nq, :nk].float().numpy().copy()
    return out


NAMES = ["*attn.q", "*attn.k", "*attn.weights"]


def toy_batch(ckpt, n: int = N_PAIRS, pairs: list[tuple[str, str | None]] | None = None) -> QKBatch:
    """`pairs`: (source, target or None = the model's own greedy output) instead of n held-out pairs."""
    from model.analysis.runs import held_out

    pairs = pairs if pairs is not None else held_out(ckpt, n)
    labels, tokens, arrays, desc = [], [], [], {}
    for src, tgt in pairs:
        _, tr = ckpt.trace(src, target=tgt, names=NAMES)
        desc = described(tr.meta)
        arrays.append(_arrays(tr, list(desc["attention"])))
        tokens.append({"src_tokens": list(tr.meta["src_tokens"]), "tgt_tokens": list(tr.meta["tgt_tokens"])})
        labels.append(f"{src} → {tgt}" if tgt is not None else src)
    return QKBatch(desc, labels, tokens, arrays)


def lm_rows(lm, kind: str = "sentences", text: str | None = None) -> tuple[list[list[int]], list[str], int | None]:
    """The batch's rows of ids (each a whole prompt: the model's BOS rule once, first; the repeated sequence is
    Olsson et al.'s [BOS] + n tokens twice), their labels and the repeat period (None: no repeat)."""
    from model.analysis.phenomena import induction_sequence

    if kind == "repeat":
        ids = induction_sequence(lm, n=REPEAT_N, batch=REPEAT_SEEDS, seed=0)
        rows = [r.tolist() for r in ids]
        return rows, [f"[BOS] + {REPEAT_N} random tokens × 2 (sequence {i + 1})" for i in range(len(rows))], REPEAT_N
    texts = [text] if kind == "prompt" else list(SENTENCES)
    return [lm.encode(s)[0].tolist() for s in texts], texts, None


def lm_batch(lm, kind: str = "sentences", readable=None, text: str | None = None) -> QKBatch:
    """`lm`: a model.loaders.lm.LanguageModel. `readable`: piece -> display text (byte-level BPE symbols).
    kind "prompt": `text` alone."""
    readable = readable or (lambda p: p)
    rows, labels, period = lm_rows(lm, kind, text)
    T = max(map(len, rows))
    pad = lm.model.cfg.pad_id if lm.model.cfg.pad_id is not None else 0
    batch = torch.tensor([r + [pad] * (T - len(r)) for r in rows], dtype=torch.long)
    desc = lm.model.describe()
    modules = [m for m, a in desc["attention"].items() if a["kind"] == "decoder_self"]
    with torch.no_grad():
        _, tr = lm.model.run_with_trace(batch, names=[f"{m}.{r}" for m in modules for r in ("q", "k", "weights")])
    arrays = [_arrays(tr, modules, b, len(r), len(r)) for b, r in enumerate(rows)]
    tokens = [{"tgt_tokens": [readable(p) for p in lm.tokens(r)]} for r in rows]
    return QKBatch(desc, labels, tokens, arrays, period)


def draws_q_k(lm) -> bool:
    """Whether this language model's Q/K map is its attention: the lab's own families, or a model via transformers
    whose q and k are the ones its softmax compares (after its rotary, or it has none), which the adapter's probe at
    load checked against transformers' weights (model/loaders/adapter.py). Not ALiBi (a bias q·k does not hold), and
    not q and k before a rotary the lab could not reproduce."""
    desc = lm.model.describe()
    return desc.get("via") != "transformers" or desc["blocks"].get("q_k") in ("raw", "rotated")


def max_full_tokens(lm) -> int:
    """The longest prompt whose every head's q, k and weights this server keeps (FULL_UP_TO tokens, or fewer when
    the capture would pass its budget): a model via transformers has no lazy trace to read beyond it."""
    modules = [m for m, a in lm.model.describe()["attention"].items() if a["kind"] == "decoder_self"]
    names = [f"{m}.{r}" for m in modules for r in ("q", "k", "weights")]
    return min(FULL_UP_TO, lm.model.max_tokens_within(recorder.DEFAULT_BUDGET_BYTES, names))


def is_long(lm, text: str) -> bool:
    """Whether a language model's prompt is too long to keep every head's weights (FULL_UP_TO tokens, or the
    capture of q, k and weights over this server's budget): then the page builds `trace_batch`."""
    T = lm.encode(text).shape[1]
    modules = [m for m, a in lm.model.describe()["attention"].items() if a["kind"] == "decoder_self"]
    names = [f"{m}.{r}" for m in modules for r in ("q", "k", "weights")]
    return T > FULL_UP_TO or lm.trace_bytes(T, names=names) > recorder.DEFAULT_BUDGET_BYTES


def trace_batch(lm, trace, text: str, readable=None) -> QKBatch:
    """A long prompt's batch from its trace (viz.ui.models.get_trace: a LazyTrace that keeps q, k and v): q and
    k of every decoder self-attention module, as read-only views of the trace's tensors (no copy), and
    `weights_of` reading a head's weight rows from the trace (model/analysis/long.py head_rows: the numbers
    every other page shows)."""
    from model.analysis.long import head_rows

    readable = readable or (lambda p: p)
    desc = lm.model.describe()
    modules = [m for m, a in desc["attention"].items() if a["kind"] == "decoder_self"]
    layer = {m: i for i, m in enumerate(modules)}  # head_rows counts decoder self-attention modules
    arrays = {}
    for m in modules:
        for r in ("q", "k"):
            arrays[f"{m}.{r}"] = trace[f"{m}.{r}"][0].float().numpy()  # (H, T, hs); float32 already: a view

    def weights_of(module: str, head: int | None, rows: slice | None = None) -> np.ndarray:
        return head_rows(trace, layer[module], head, rows or slice(None)).float().numpy()

    ids = list(trace.meta["tgt_ids"][0])
    tokens = [{"tgt_tokens": [readable(p) for p in lm.tokens(ids)]}]
    return QKBatch(desc, [text], tokens, [arrays], weights_of=weights_of)


def encoder_batch(enc, texts: list[str] | None = None) -> QKBatch:
    """`enc`: a model.loaders.minilm.PretrainedEncoder; `texts` instead of the 40 sentences."""
    labels, tokens, arrays, desc = [], [], [], {}
    for s in texts or SENTENCES:
        _, tr = enc.run_with_trace(s, names=NAMES)
        desc = described(tr.meta)
        arrays.append(_arrays(tr, list(desc["attention"])))
        tokens.append({"src_tokens": list(tr.meta["src_tokens"])})
        labels.append(s)
    return QKBatch(desc, labels, tokens, arrays)


def previous_token_scores(batch: QKBatch, modules: list[str]) -> np.ndarray:
    """[L, H]: mean over queries i >= 1 of the weight on key i - 1 (the pattern score of a previous-token head)."""
    out = []
    for m in modules:
        rows = []
        for a in batch.arrays:
            n = a[f"{m}.weights"].shape[1]
            rows.append(a[f"{m}.weights"][:, np.arange(1, n), np.arange(n - 1)])
        out.append(np.concatenate(rows, axis=1).mean(1))
    return np.array(out)


def induction_scores(batch: QKBatch, modules: list[str]) -> np.ndarray:
    """[L, H] on the repeat batch: mean over the second copy's positions i of the weight on i - (n - 1)
    (Olsson et al. 2022; model/analysis/phenomena.induction_score)."""
    n = batch.period
    i = np.arange(n + 1, 2 * n + 1)
    return np.array([np.concatenate([a[f"{m}.weights"][:, i, i - (n - 1)] for a in batch.arrays], 1).mean(1)
                     for m in modules])
