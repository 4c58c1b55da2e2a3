"""Autoregressive decoding: greedy, beam search and sampling, one token per step.

Each step feeds only the newest token and reuses the keys/values of earlier positions from
the decoder's cache (`Transformer.decode(..., cache=model.new_cache(), offset=t)`), so a step
costs O(t) instead of re-running the whole prefix. Every generated token gets a `Step`
record: the decoder self- and cross-attention of the position that predicted it (all layers
and heads, captured with `model.capture`), the top-k next-token probabilities and the logits.

Step t reads the decoder input [BOS, y_1 .. y_t-1] and predicts y_t; so with
tgt_tokens = [BOS] + tokens, step t's self-attention keys are tgt_tokens[:t+1], and a
teacher-forced pass over [BOS] + tokens gives steps[t].logits at position t.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .capture import capturing
from .transformer import Transformer

STRATEGIES = ("greedy", "beam", "sample")


@dataclass
class Step:
    """One generated token and what the decoder looked at to produce it."""

    token: str
    token_id: int
    prob: float  # probability of the chosen token (under the distribution it was chosen from)
    topk: list[tuple[str, float]]  # most likely next tokens, best first
    self_attn: torch.Tensor  # [L, H, t+1]: the new position over the decoder input so far
    cross_attn: torch.Tensor  # [L, H, S]: the new position over the source tokens
    logits: torch.Tensor  # [V], raw (before temperature / filtering)


@dataclass
class BeamNode:
    """One hypothesis of the beam-search tree (node 0 is the root, [BOS])."""

    id: int
    parent: int | None
    token: str
    token_id: int
    depth: int  # number of generated tokens, this one included
    logprob: float  # log P(this token | parent's prefix)
    score: float  # cumulative log-probability of the hypothesis
    norm_score: float  # score / length penalty: what finished hypotheses are ranked by
    finished: bool  # ended with [EOS]
    best: bool = False  # on the path of the returned hypothesis
    step: Step | None = field(default=None, repr=False)


@dataclass
class Translation:
    """Output of a decode. `steps` has one record per generated token, the final [EOS] included;
    `tokens` / `token_ids` are the output without [EOS]."""

    text: str
    tokens: list[str]
    token_ids: list[int]
    steps: list[Step]
    strategy: str
    src_tokens: list[str] = field(default_factory=list)
    finished: bool = True  # False if the length limit stopped it before [EOS]
    score: float = 0.0  # log-probability of the output (with [EOS]) under the model
    beam_tree: list[BeamNode] | None = None
    options: dict = field(default_factory=dict)  # the strategy's options, seed included

    @property
    def tgt_tokens(self) -> list[str]:
        """The decoder input that produced the steps: [BOS] + tokens."""
        return ["[BOS]", *self.tokens]


# ------------------------------------------------------------------ one decoder step


def _attn_names(model: Transformer) -> list[str]:
    L = model.cfg.n_decoder_layers
    return [f"decoder.layers.{i}.{kind}.weights" for kind in ("self_attn", "cross_attn") for i in range(L)]


def decoder_step(model, y, memory, src_pad, cache, offset: int, record: bool = False, use_cache: bool = True):
    """Next-token logits (B, V) for the last position of the decoder input.

    With the cache, `y` is the newest token only (B, 1) at position `offset`; without it, `y` is
    the whole prefix (B, t+1), recomputed from scratch. With `record`, also returns the
    self-attention (B, L, H, t+1) and cross-attention (B, L, H, S) of that last position.
    """
    kw = {"cache": cache, "offset": offset} if use_cache else {}
    if not record:
        return model.decode(y, memory, src_pad, **kw)[:, -1], None, None
    names = _attn_names(model)
    with capturing(set(names)) as rec:
        logits = model.decode(y, memory, src_pad, **kw)[:, -1]
    L = model.cfg.n_decoder_layers
    w = [rec.tensors[n][:, :, -1] for n in names]  # each (B, H, keys)
    return logits, torch.stack(w[:L], 1), torch.stack(w[L:], 1)


def _topk(probs: torch.Tensor, k: int, tok: Callable[[int], str]) -> list[tuple[str, float]]:
    p, i = probs.topk(min(k, probs.numel()))
    return [(tok(int(j)), float(q)) for j, q in zip(i, p, strict=True)]


def _prepare(model: Transformer, src: torch.Tensor, max_new_tokens: int | None):
    if model.cfg.encoder_only:
        raise ValueError("this is an encoder-only model: it has no decoder to generate with")
    if src.dim() == 1:
        src = src[None]
    if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 1):
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    # Positions 0 .. max_len-1 can be fed, so at most max_len tokens can be generated.
    limit = model.cfg.max_len if max_new_tokens is None else min(max_new_tokens, model.cfg.max_len)
    return src, limit


# ------------------------------------------------------------------ greedy and sampling


@torch.no_grad()
def greedy_batch(
    model: Transformer,
    src: torch.Tensor,
    bos: int,
    eos: int,
    max_new_tokens: int | None = None,
    use_cache: bool = True,
) -> list[list[int]]:
    """Fast batched greedy decoding (no records): token ids per row, without [EOS]."""
    src, limit = _prepare(model, src, max_new_tokens)
    B = src.shape[0]
    memory, src_pad = model.encode(src)
    cache = model.new_cache() if use_cache else None
    ys = torch.full((B, 1), bos, dtype=torch.long)
    done = torch.zeros(B, dtype=torch.bool)
    for t in range(limit):
        y = ys[:, -1:] if use_cache else ys
        logits, _, _ = decoder_step(model, y, memory, src_pad, cache, t, use_cache=use_cache)
        nxt = logits.argmax(-1)
        ys = torch.cat([ys, nxt[:, None]], 1)
        done |= nxt == eos
        if bool(done.all()):
            break
    out = []
    for row in ys[:, 1:].tolist():
        out.append(row[: row.index(eos)] if eos in row else row)
    return out


def _filter(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Probabilities to sample from: logits / temperature, then keep the top-k, then the nucleus
    (the smallest set of most likely tokens whose mass reaches top_p)."""
    logits = logits / temperature
    if top_k is not None and top_k < logits.numel():
        kth = logits.topk(top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, -1)
    if top_p is not None and top_p < 1.0:
        p, i = probs.sort(descending=True)
        before = p.cumsum(0) - p  # mass of the strictly more likely tokens
        p = p.masked_fill(before >= top_p, 0.0)  # the first token always survives
        probs = torch.zeros_like(probs).scatter(0, i, p)
        probs = probs / probs.sum()
    return probs


@torch.no_grad()
def generate(
    model: Transformer,
    src: torch.Tensor,
    bos: int,
    eos: int,
    strategy: str = "greedy",
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    max_new_tokens: int | None = None,
    record: bool = True,
    use_cache: bool = True,
    n_top: int = 5,
    id_to_token: Callable[[int], str] = str,
    detok: Callable[[Sequence[int]], str] | None = None,
) -> Translation:
    """Greedy or sampled decoding of one source (1, S), recording every step."""
    if strategy not in ("greedy", "sample"):
        raise ValueError(f"generate() does greedy or sample; use beam_search() for beams (got {strategy!r})")
    options: dict = {}
    gen = None
    if strategy == "sample":
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k!r}")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        seed = random.randrange(2**31) if seed is None else int(seed)  # recorded: rerun reproduces it
        gen = torch.Generator().manual_seed(seed)
        options = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}
    src, limit = _prepare(model, src, max_new_tokens)
    if src.shape[0] != 1:
        raise ValueError(f"generate() decodes one source at a time, got a batch of {src.shape[0]}")
    memory, src_pad = model.encode(src)
    cache = model.new_cache() if use_cache else None
    ys = torch.full((1, limit + 1), bos, dtype=torch.long)  # the decoder input, filled as we go
    steps, score, finished, n = [], 0.0, False, 0
    for t in range(limit):
        y = ys[:, t : t + 1] if use_cache else ys[:, : t + 1]
        logits, sa, ca = decoder_step(model, y, memory, src_pad, cache, t, record, use_cache)
        logits = logits[0]
        logp = F.log_softmax(logits, -1)
        if strategy == "greedy":
            nxt = int(logp.argmax())
            probs = logp.exp() if record else None
        else:
            probs = _filter(logits, temperature, top_k, top_p)
            nxt = int(torch.multinomial(probs, 1, generator=gen))
        score += float(logp[nxt])  # log-probability under the model itself (no temperature)
        if record:
            steps.append(
                Step(
                    id_to_token(nxt),
                    nxt,
                    float(probs[nxt]),
                    _topk(probs, n_top, id_to_token),
                    sa[0],
                    ca[0],
                    logits.clone(),
                )
            )
        if nxt == eos:
            finished = True
            break
        ys[0, t + 1] = nxt
        n += 1
    out = ys[0, 1 : n + 1].tolist()
    return Translation(
        detok(out) if detok else " ".join(map(id_to_token, out)),
        [id_to_token(i) for i in out],
        out,
        steps,
        strategy,
        finished=finished,
        score=score,
        options=options,
    )


# ------------------------------------------------------------------ beam search


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's ((5 + |Y|) / 6)^α: α = 0 ranks by raw log-probability (favours short outputs),
    larger α favours longer ones. The paper used beam 4, α = 0.6."""
    return ((5 + length) / 6) ** alpha


def _reorder(cache, index: torch.Tensor):
    """Select the cache rows of the surviving beams (recursively: layers, self/cross, k/v/pad)."""
    if isinstance(cache, torch.Tensor):
        return cache.index_select(0, index)
    if isinstance(cache, dict):
        return {k: _reorder(v, index) for k, v in cache.items()}
    return [_reorder(v, index) for v in cache]


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: torch.Tensor,
    bos: int,
    eos: int,
    *,
    beam_width: int = 4,
    length_penalty_alpha: float = 0.6,
    max_new_tokens: int | None = None,
    record: bool = True,
    n_top: int = 5,
    id_to_token: Callable[[int], str] = str,
    detok: Callable[[Sequence[int]], str] | None = None,
) -> Translation:
    """Beam search over one source, keeping the whole tree.

    Each step extends every live hypothesis by every token, keeps the 2W best candidates in
    order: a candidate ending in [EOS] is finished, the others fill the W live slots. Stops once
    W hypotheses have finished (or at the length limit); returns the finished hypothesis with the
    best length-penalised score. Width 1 is exactly greedy decoding.
    """
    if not isinstance(beam_width, int) or beam_width < 1:
        raise ValueError(f"beam_width must be a positive integer, got {beam_width!r}")
    src, limit = _prepare(model, src, max_new_tokens)
    if src.shape[0] != 1:
        raise ValueError(f"beam_search() decodes one source at a time, got a batch of {src.shape[0]}")
    W, alpha = beam_width, float(length_penalty_alpha)
    memory, src_pad = model.encode(src)
    cache = model.new_cache()
    tree = [BeamNode(0, None, id_to_token(bos), bos, 0, 0.0, 0.0, 0.0, False)]
    live = [0]  # node ids of the live hypotheses, one per cache row
    finished: list[int] = []
    y = torch.tensor([[bos]])
    for t in range(limit):
        n = len(live)
        logits, sa, ca = decoder_step(model, y, memory.expand(n, -1, -1), src_pad.expand(n, -1), cache, t, record)
        logp = F.log_softmax(logits, -1)  # (n, V)
        V = logp.shape[1]
        cand = torch.tensor([tree[i].score for i in live])[:, None] + logp
        values, flat = cand.view(-1).topk(min(2 * W, cand.numel()))
        rows, new_live, new_tokens = [], [], []
        for value, f in zip(values.tolist(), flat.tolist(), strict=True):
            b, tok = divmod(f, V)
            parent = tree[live[b]]
            is_eos = tok == eos
            last = t == limit - 1
            step = None
            if record:
                probs = logp[b].exp()
                step = Step(
                    id_to_token(tok),
                    tok,
                    float(probs[tok]),
                    _topk(probs, n_top, id_to_token),
                    sa[b],
                    ca[b],
                    logits[b].clone(),
                )
            node = BeamNode(
                len(tree),
                parent.id,
                id_to_token(tok),
                tok,
                t + 1,
                float(logp[b, tok]),
                value,
                value / length_penalty(t + 1, alpha),
                is_eos,
                step=step,
            )
            tree.append(node)
            if is_eos:
                finished.append(node.id)
            else:
                new_live.append(node.id)
                rows.append(b)
                new_tokens.append(tok)
                if last:  # out of room: the live ones are what we have, unfinished
                    finished.append(node.id)
            if len(new_live) == W:
                break
        if len([i for i in finished if tree[i].finished]) >= W or not new_live or t == limit - 1:
            break
        live = new_live
        cache = _reorder(cache, torch.tensor(rows))
        y = torch.tensor(new_tokens)[:, None]
    done = [i for i in finished if tree[i].finished] or finished
    best = max(done, key=lambda i: tree[i].norm_score)
    path, i = [], best
    while i is not None:
        tree[i].best = True
        path.append(tree[i])
        i = tree[i].parent
    path = path[::-1][1:]  # drop the root
    ended = tree[best].finished
    out_nodes = path[:-1] if ended else path
    out = [node.token_id for node in out_nodes]
    steps = [node.step for node in path] if record else []
    return Translation(
        detok(out) if detok else " ".join(map(id_to_token, out)),
        [id_to_token(i) for i in out],
        out,
        steps,
        "beam",
        finished=ended,
        score=tree[best].score,
        beam_tree=tree,
        options={"beam_width": W, "length_penalty": alpha},
    )
