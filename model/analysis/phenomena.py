"""Attention phenomena of decoder-only LMs, each found by its published recipe (issue 19 §2-§3).

Per-head scores over a trace, each [L, H] (layers x query heads), with the threshold used and the
heads over it (`HeadScores`):

- sink: share of a head's attention on token 0 ("Efficient Streaming Language Models with Attention
  Sinks", Xiao et al. 2023): mean over the query rows 1..T-1 of w[i, 0] (row 0 can only see token 0,
  so it is left out);
- previous_token / duplicate_token / induction on typed text: a pattern score of OUR OWN, next to
  TransformerLens's (`detect_head`, error_measure "mul"). Both take the attention on the pattern's cells
  (i -> i-1; i -> earlier copies of token i; i -> the token after each earlier copy of token i).
  TransformerLens divides it by the attention of all T rows (`tl_scores`); ours divides by the rows that
  have a pattern cell (`scores`), so a perfect head scores 1 on any input and a 0.5 threshold means the
  same on a short prompt and a long one. ours = TL's x T / (rows with a cell);
- induction on the repeated random sequence: Olsson et al. 2022 ("In-context Learning and Induction
  Heads"), on [BOS] + n random tokens repeated twice: mean attention from each position i of the second
  copy to i - (n - 1), the token after the previous occurrence of token i;
- entropy (nats) and mean attention distance (positions), means over the query rows.

Then the interventions that test them: per-token loss on the first vs second copy of the repeated
sequence, ablation of the top induction heads vs as many random heads (seeded control), and the
output change when token 0's key is blocked in one head or everywhere (`block_sink`: one KL, measured
at the last position, wherever a page or lesson shows it).

Everything runs through the recorder's per-call hooks; `lm` is a LanguageModel or a DecoderLM.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from model import interventions as iv
from model.analysis.inputs import as_decoder, as_ids, fit_batch  # shared with patching.py (was a circle)

THRESHOLDS = {"sink": 0.3, "previous_token": 0.5, "duplicate_token": 0.5, "induction": 0.5}
RECIPES = {
    "sink": "mean attention on token 0 over query rows 1..T-1 (Xiao et al. 2023, attention sinks)",
    "previous_token": "ours: attention on i -> i-1 over the rows that have it (TransformerLens's detect_head "
                      "'mul' divides by all T rows: tl_scores)",
    "duplicate_token": "ours: attention on earlier copies of the same token over the rows that have one "
                       "(TransformerLens's detect_head 'mul' divides by all T rows: tl_scores)",
    "induction": "mean attention from i to i-(n-1) over the second copy of [BOS] + n random tokens x 2 "
                 "(Olsson et al. 2022); on typed text, ours: attention on the token after every earlier copy "
                 "over the rows that have one (TransformerLens's 'mul' divides by all T rows: tl_scores)",
    "entropy": "mean over query rows of -sum w log w (nats)",
    "distance": "mean over query rows of sum w |i - j| (positions)",
}


# ---------------------------------------------------------------------- inputs


def attention_names(lm) -> list[str]:
    """The attention modules, in layer order, from the model's own description."""
    return list(as_decoder(lm).describe()["attention"])


@dataclass
class HeadScores:
    """One detector's [L, H] scores, its threshold, and the heads over it (best first)."""

    name: str
    scores: np.ndarray  # [L, H]
    threshold: float | None
    recipe: str
    heads: list[tuple[int, int, float]] = field(default_factory=list)  # (layer, head, score) >= threshold
    # TransformerLens's detect_head "mul" number on the same input ([L, H]; pattern detectors only):
    # the same attention on the pattern's cells, divided by all T rows instead of the rows with a cell
    tl_scores: np.ndarray | None = None

    def top(self, n: int = 5) -> list[tuple[int, int, float]]:
        order = np.argsort(-self.scores, axis=None)[:n]
        H = self.scores.shape[1]
        return [(int(i // H), int(i % H), float(self.scores.flat[i])) for i in order]


def _scored(name: str, scores: np.ndarray, threshold: float | None, tl: np.ndarray | None = None) -> HeadScores:
    heads = []
    if threshold is not None:
        L, H = np.nonzero(scores >= threshold)
        heads = sorted(((int(layer), int(h), float(scores[layer, h])) for layer, h in zip(L, H, strict=True)),
                       key=lambda x: -x[2])
    return HeadScores(name, scores, threshold, RECIPES[name], heads, tl)


# ---------------------------------------------------------------------- patterns (TransformerLens's)


def previous_token_pattern(T: int) -> torch.Tensor:
    """[T, T]: 1 at (i, i-1)."""
    p = torch.zeros(T, T)
    p[1:, :-1] = torch.eye(T - 1)
    return p


def duplicate_token_pattern(ids: torch.Tensor) -> torch.Tensor:
    """[T, T] for one sequence: 1 at (i, j) for j < i with ids[j] == ids[i]."""
    eq = (ids[:, None] == ids[None, :]).float()
    return torch.tril(eq, diagonal=-1)


def induction_pattern(ids: torch.Tensor) -> torch.Tensor:
    """[T, T]: 1 at (i, j + 1) for every earlier copy j of token i (the token after it). When the copy is
    the previous token (back-to-back repeats, "ha ha ha"), the token after it is i itself: the diagonal
    cell belongs to the pattern (TransformerLens keeps it too: its tril keeps the diagonal)."""
    dup = duplicate_token_pattern(ids)
    out = torch.zeros_like(dup)
    out[:, 1:] = dup[:, :-1]
    return torch.tril(out)  # j + 1 <= i always holds for j < i; tril only says so


def pattern_scores(weights: torch.Tensor, pattern: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head, (ours, TransformerLens's): the attention on the pattern's cells divided
    - ours: by the attention of the rows that have a cell (a perfect head scores 1 on any input);
    - TL's detect_head "mul": by the attention of all T rows (sum(w * p) / sum(w), averaged over the batch
      like detect_head on a list of sequences).
    weights [B, H, T, T], pattern [B, T, T] or [T, T]. Returns two [H] (ours NaN if no row has a cell)."""
    w = weights.double()
    p = pattern.double().expand(w.shape[0], *pattern.shape[-2:])
    rows = (p.sum(-1) > 0).double()  # [B, T]
    hit = (w * p[:, None]).sum((2, 3))  # [B, H]
    ours = hit.sum(0) / (w.sum(-1) * rows[:, None]).sum((0, 2))
    tl = (hit / w.sum((2, 3))).mean(0)
    return ours, tl


def pattern_score(weights: torch.Tensor, pattern: torch.Tensor) -> torch.Tensor:
    """Our pattern score alone (see pattern_scores): [H]."""
    return pattern_scores(weights, pattern)[0]


# ---------------------------------------------------------------------- per-head statistics


def _weights(trace, names: list[str]) -> list[torch.Tensor]:
    missing = [n for n in names if f"{n}.weights" not in trace]
    if missing:
        raise ValueError(f"the trace lacks {missing[0]}.weights: capture names='*.self_attn.weights'")
    return [trace[f"{n}.weights"].double() for n in names]


def head_statistics(trace, thresholds: dict | None = None, period: int | None = None) -> dict[str, HeadScores]:
    """Every per-head score of a decoder LM's trace (captured with at least '*.self_attn.weights';
    meta['tgt_ids'] gives the tokens). `period`: the length n of the repeated block, for the induction
    score (an `induction_sequence` trace); without it, the induction score uses TransformerLens's
    pattern (the token after every earlier copy), which needs repeated tokens in the input."""
    th = THRESHOLDS | (thresholds or {})
    desc = trace.meta["model"]
    names = [m for m, info in desc["attention"].items() if info["kind"] == "decoder_self"]
    ws = _weights(trace, names)
    B, H, T, _ = ws[0].shape
    ids = torch.as_tensor(trace.meta["tgt_ids"])
    out: dict[str, list[torch.Tensor]] = {k: [] for k in ("sink", "previous_token", "duplicate_token",
                                                          "induction", "entropy", "distance")}
    tl: dict[str, list[torch.Tensor]] = {k: [] for k in ("previous_token", "duplicate_token", "induction")}
    patterns = {"previous_token": previous_token_pattern(T),
                "duplicate_token": torch.stack([duplicate_token_pattern(r) for r in ids]),
                "induction": torch.stack([induction_pattern(r) for r in ids])}
    gap = (torch.arange(T)[:, None] - torch.arange(T)[None]).abs().double()
    for w in ws:
        out["sink"].append(w[:, :, 1:, 0].mean((0, 2)) if T > 1 else torch.full((H,), float("nan")))
        for k, p in patterns.items():
            ours, theirs = pattern_scores(w, p)
            out[k].append(ours)
            tl[k].append(theirs)  # TL's number on the same input, also for Olsson's induction input
        if period:
            out["induction"][-1] = induction_score(w, period)
        out["entropy"].append((-(w * w.clamp_min(1e-30).log()).sum(-1)).mean((0, 2)))
        out["distance"].append((w * gap).sum(-1).mean((0, 2)))
    return {k: _scored(k, torch.stack(v).numpy(), th.get(k), torch.stack(tl[k]).numpy() if k in tl else None)
            for k, v in out.items()}


def induction_score(weights: torch.Tensor, period: int) -> torch.Tensor:
    """Olsson et al.: on [BOS] + n random tokens + the same n again (period n), the mean over the
    second copy's positions i (n+1 .. 2n) of the attention from i to i - (n - 1). Returns [H]."""
    B, H, T, _ = weights.shape
    if T < 2 * period + 1:
        raise ValueError(f"the induction score needs [BOS] + 2 x {period} tokens, the trace has {T}")
    i = torch.arange(period + 1, 2 * period + 1)
    return weights.double()[:, :, i, i - (period - 1)].mean((0, 2))


# ---------------------------------------------------------------------- the repeated random sequence


def induction_sequence(lm, n: int = 50, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """[batch, 1 + 2n]: [BOS] + n random tokens + the same n tokens again. Tokens are drawn (seeded)
    from ids 1000..9999 like TransformerLens's demos (ordinary words, no special or byte tokens), or
    from every non-special id of a smaller vocabulary."""
    from model.loaders.lm import encode_pieces

    cfg = as_decoder(lm).cfg
    special = {i for i in (cfg.bos_id, cfg.eos_id, cfg.pad_id) if i is not None}
    tok = getattr(lm, "tokenizer", None)
    if tok is not None:  # the tokenizer's own special tokens (Gemma 3 has thousands) are never drawn
        special |= {int(i) for i, a in tok.get_added_tokens_decoder().items() if a.special}
    lo, hi = (1000, 10000) if cfg.vocab_size > 10000 else (0, cfg.vocab_size)
    pool = torch.tensor([i for i in range(lo, hi) if i not in special])
    g = torch.Generator().manual_seed(int(seed))
    body = pool[torch.randint(0, len(pool), (batch, n), generator=g)]
    # the recipe's input is [BOS] + tokens whatever the tokenizer's own rule (Olsson et al., TransformerLens's
    # prepend_bos): the one BOS, at position 0, joined in the one place prompts are built
    return torch.cat([encode_pieces(lm, [row, row], bos=True)[0] for row in body], dim=0)


def token_losses(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[B, T-1]: -log p(ids[:, t+1] | ids[:, :t+1]); column t is the loss on token t + 1."""
    return F.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")


@dataclass
class RepeatLoss:
    first: float  # mean loss on the tokens of the first copy (positions 1..n)
    second: float  # ... and of the second copy (positions n+1..2n)
    per_token: np.ndarray  # [2n]: mean over the batch, the loss on token 1..2n


def repeat_loss(logits: torch.Tensor, ids: torch.Tensor, n: int) -> RepeatLoss:
    per = token_losses(logits, ids).mean(0).double().numpy()  # token t+1 at index t
    return RepeatLoss(float(per[:n].mean()), float(per[n:2 * n].mean()), per)


@dataclass
class InductionResult:
    ids: torch.Tensor  # [B, 1 + 2n]
    n: int
    scores: dict[str, HeadScores]  # every per-head statistic on this input (induction: Olsson's)
    loss: RepeatLoss


@torch.no_grad()
def induction(lm, n: int = 50, batch: int = 1, seed: int = 0, thresholds: dict | None = None) -> InductionResult:
    """The induction experiment: the repeated random sequence, its per-head scores and its loss."""
    ids = induction_sequence(lm, n, batch, seed)
    logits, trace = as_decoder(lm).run_with_trace(ids, names="*.self_attn.weights")
    return InductionResult(ids, n, head_statistics(trace, thresholds, period=n), repeat_loss(logits, ids, n))


# ---------------------------------------------------------------------- ablation with a control


def heads_hooks(lm, heads: Sequence[tuple[int, int]], mode: str = "zero") -> dict:
    """One hooks dict knocking out every (layer, query head) in `heads` (model.interventions.ablate_head;
    mode "zero" or "mean": z over this pass's positions)."""
    names = attention_names(lm)
    return iv.combine(*(iv.ablate_head(names[layer], head, mode) for layer, head in heads))


def random_heads(lm, k: int, exclude: Sequence[tuple[int, int]] = (), seed: int = 0) -> list[tuple[int, int]]:
    """k distinct (layer, head) pairs drawn (seeded) from the heads not in `exclude`: the control."""
    cfg = as_decoder(lm).cfg
    pool = [(layer, h) for layer in range(cfg.n_layers) for h in range(cfg.n_heads)
            if (layer, h) not in set(exclude)]
    if k > len(pool):
        raise ValueError(f"cannot draw {k} control heads from {len(pool)}")
    return random.Random(seed).sample(pool, k)


@dataclass
class AblationResult:
    heads: list[tuple[int, int]]
    controls: list[list[tuple[int, int]]]  # one random set per control draw
    base: float  # the metric, intact
    ablated: float  # with `heads` knocked out
    control: list[float]  # with each random set knocked out
    metric: str
    mode: str


@torch.no_grad()
def ablate_top_induction(lm, result: InductionResult, k: int = 5, mode: str = "zero", n_controls: int = 3,
                         seed: int = 0) -> AblationResult:
    """Knock out the k heads with the highest induction score and watch the second copy's loss rise;
    knock out k random other heads (seeded, `n_controls` draws) as the control."""
    top = [(layer, h) for layer, h, _ in result.scores["induction"].top(k)]
    controls = [random_heads(lm, k, exclude=top, seed=seed + i) for i in range(n_controls)]
    m, names = as_decoder(lm), attention_names(lm)
    # ONE forward for the top heads and every control (issue 26 §3): batch block r = the input with sets[r]
    # knocked out (per-row hooks), the same numbers as one forward per set under heads_hooks
    sets, B = [top, *controls], result.ids.shape[0]
    table: dict[str, list[tuple[int, int]]] = {}
    for r, heads in enumerate(sets):
        for layer, h in heads:
            table.setdefault(names[layer], []).extend((r * B + b, int(h)) for b in range(B))
    logits = m.run_with_hooks(result.ids.repeat(len(sets), 1), hooks=iv.ablate_heads_by_row(table, mode))
    second = [repeat_loss(logits[r * B:(r + 1) * B], result.ids, result.n).second for r in range(len(sets))]
    return AblationResult(top, controls, result.loss.second, second[0], second[1:],
                          "mean loss on the second copy (nats)", mode)


# ---------------------------------------------------------------------- attention sinks


def block_first_key(layer_heads: dict[str, Sequence[int]] | None = None, names: Sequence[str] = ()) -> dict:
    """Hooks that hide token 0's key from every query row that can still see another key (rows 1..):
    - for whole modules (`names`): on `<attn>.mask` (True = blocked), shared by the module's heads;
    - for single heads (`layer_heads` {module: [heads]}): the mask has no head axis, so their scores
      at key 0 become -inf (softmax gives it exactly 0, the same as a blocked cell)."""

    def mask_hook(mask: torch.Tensor, name: str) -> torch.Tensor:  # [B, 1, Tq, Tk]
        mask = mask.clone()
        free = (~mask[..., 1:]).any(-1)  # rows that see some other key
        mask[..., 0] |= free
        return mask

    hooks = {f"{n}.mask": mask_hook for n in names}
    for module, heads in (layer_heads or {}).items():
        hs = list(heads)

        def score_hook(s: torch.Tensor, name: str, hs=hs) -> torch.Tensor:  # [B, H, Tq, Tk]
            s = s.clone()
            s[:, hs, 1:, 0] = float("-inf")  # with a causal mask, rows 1.. see key 1 too
            return s

        hooks[f"{module}.scores"] = score_hook
    return hooks


# One KL for "what blocking token 0 does", wherever a page or a lesson shows it (issue 26: a lesson said
# 1.18 nats and a page 2.33 for the same prompt, one averaged over positions, the other at the last one).
KL_WHERE = ("KL(intact || token 0 blocked) of the next-token distribution at the last position (the token "
            "that would follow the prompt), in nats")


def next_token_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) of the next-token distribution at the LAST position, per batch row: [B] (nats).
    p_logits, q_logits [B, T, V] (or [B, V], the last position already)."""
    p, q = (x[:, -1] if x.dim() == 3 else x for x in (p_logits, q_logits))
    lp, lq = p.double().log_softmax(-1), q.double().log_softmax(-1)
    return (lp.exp() * (lp - lq)).sum(-1)


@dataclass
class SinkBlock:
    """The next token at the last position, intact and with token 0's key blocked."""

    heads: list[tuple[int, int]] | None  # the (layer, head) pairs blocked; None = every head of every layer
    top_before: int  # the intact model's next token (its "answer")
    p_before: float  # its probability, intact
    top_after: int  # the next token with token 0 blocked
    p_after: float  # its probability then
    answer_p_after: float  # the intact answer's probability with token 0 blocked
    answer_logit_before: float  # the intact answer's logit, intact ...
    answer_logit_after: float  # ... and with token 0 blocked
    kl: float  # next_token_kl (KL_WHERE)

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
    position's next-token distribution. The one function behind every "blocking token 0 moves the
    output by KL = ..." (sink_effect calls it too)."""
    m = as_decoder(lm)
    ids = as_ids(lm, text_or_ids)[:1]
    if ids.shape[1] < 2:
        raise ValueError("blocking token 0 needs at least 2 tokens")
    before = m(ids)[:, -1].double()  # [1, V]
    after = m.run_with_hooks(ids, hooks=sink_hooks(lm, heads))[:, -1].double()
    return _sink_block(before, after, heads)


def _sink_block(before: torch.Tensor, after: torch.Tensor, heads) -> SinkBlock:
    """SinkBlock from the last position's logits [1, V] (float64), intact and with token 0 blocked."""
    lp, lq = before[0].log_softmax(-1), after[0].log_softmax(-1)
    answer, top = int(before.argmax()), int(after.argmax())
    return SinkBlock(None if heads is None else [(int(a), int(b)) for a, b in heads], answer,
                     float(lp[answer].exp()), top, float(lq[top].exp()), float(lq[answer].exp()),
                     float(before[0, answer]), float(after[0, answer]), float(next_token_kl(before, after)[0]))


@dataclass
class SinkEffect:
    share: HeadScores  # the sink score per head
    mean_share: float  # attention on token 0, averaged over every head and query row 1..T-1
    block: SinkBlock  # token 0 blocked in every head: block_sink(lm, input), the same numbers a page shows
    top_before: list[int]  # the argmax token at each position, intact
    top_after: list[int]  # ... with token 0 blocked everywhere
    loss_before: float  # mean next-token loss on the input itself
    loss_after: float
    kl_per_head: np.ndarray | None  # [L, H]: next_token_kl with token 0 blocked in that head alone

    @property
    def kl_everywhere(self) -> float:
        """KL_WHERE, token 0 blocked in every head (= block_sink(lm, input).kl)."""
        return self.block.kl


@torch.no_grad()
def sink_effect(lm, text_or_ids, per_head: bool = False, batch: int = 16,
                thresholds: dict | None = None, progress=None) -> SinkEffect:
    """Attention sinks on one input: each head's share on token 0, and what happens to the output when
    token 0's key is blocked everywhere (and, with per_head, in one head at a time: L x H passes,
    `batch` per forward). Every KL is next_token_kl (KL_WHERE). progress(done, total): called after each
    per-head batch (a page's progress bar)."""
    m = as_decoder(lm)
    ids = as_ids(lm, text_or_ids)[:1]
    if ids.shape[1] < 2:
        raise ValueError("blocking token 0 needs at least 2 tokens")
    logits, trace = m.run_with_trace(ids, names="*.self_attn.weights")
    stats = head_statistics(trace, thresholds)
    names = attention_names(lm)
    blocked = m.run_with_hooks(ids, hooks=block_first_key(names=names))
    per = None
    if per_head:
        L, H = m.cfg.n_layers, m.cfg.n_heads
        batch = fit_batch(batch, 1, m.cfg.vocab_size)  # last-position logits only: (rows, 1, V)
        pairs = [(layer, h) for layer in range(L) for h in range(H)]
        kls = []
        for s in range(0, len(pairs), batch):
            chunk = pairs[s:s + batch]
            with m.hooks(_rowwise_sink_hooks(names, chunk)):  # the KL reads the last position: skip the others'
                blocked_last = m(ids.expand(len(chunk), -1), last_only=True)  # logits (T x d x V each)
            kls.append(next_token_kl(logits[:, -1:].expand(len(chunk), -1, -1), blocked_last))
            if progress is not None:
                progress(s + len(chunk), len(pairs))
        per = torch.cat(kls).reshape(L, H).numpy()
    share = stats["sink"]
    return SinkEffect(share, float(np.mean(share.scores)), block_sink(lm, ids, None),
                      logits[0].argmax(-1).tolist(), blocked[0].argmax(-1).tolist(),
                      float(token_losses(logits, ids).mean()), float(token_losses(blocked, ids).mean()), per)


@torch.no_grad()
def sink_effect_long(lm, text_or_ids, share: HeadScores) -> SinkEffect:
    """sink_effect for an input too long to capture every attention map: `share` is the sink score computed
    tile by tile (model/analysis/long.py head_statistics_tiled, the same numbers as head_statistics), and two
    forwards, intact and with token 0 blocked everywhere, give the losses and the block: block_sink's very runs,
    so `block` equals block_sink(lm, input) (sink_effect runs them a second time). No per-head KL (L x H passes)."""
    m = as_decoder(lm)
    ids = as_ids(lm, text_or_ids)[:1]
    if ids.shape[1] < 2:
        raise ValueError("blocking token 0 needs at least 2 tokens")
    logits = m(ids)  # (1, T, V)
    blocked = m.run_with_hooks(ids, hooks=sink_hooks(lm, None))
    block = _sink_block(logits[:, -1].double(), blocked[:, -1].double(), None)
    return SinkEffect(share, float(np.mean(share.scores)), block, logits[0].argmax(-1).tolist(),
                      blocked[0].argmax(-1).tolist(), float(token_losses(logits, ids).mean()),
                      float(token_losses(blocked, ids).mean()), None)


def _rowwise_sink_hooks(names: list[str], pairs: list[tuple[int, int]]) -> dict:
    """Batch row r blocks token 0 in head pairs[r] = (layer, head) only."""
    by_layer: dict[int, list[tuple[int, int]]] = {}
    for r, (layer, h) in enumerate(pairs):
        by_layer.setdefault(layer, []).append((r, h))
    hooks = {}
    for layer, rh in by_layer.items():
        rows, heads = torch.tensor([r for r, _ in rh]), torch.tensor([h for _, h in rh])

        def hook(s: torch.Tensor, name: str, rows=rows, heads=heads) -> torch.Tensor:
            s = s.clone()
            s[rows, heads, 1:, 0] = float("-inf")
            return s

        hooks[f"{names[layer]}.scores"] = hook
    return hooks
