"""Autoregressive decoding: greedy, beam search and sampling, one token per step.

Each step feeds only the newest token and reuses the keys/values of earlier positions from
the decoder's cache (`Transformer.decode(..., cache=model.new_cache(), offset=t)`), so a step
costs O(t) instead of re-running the whole prefix. Every generated token gets a `Step`
record: the decoder self- and cross-attention of the position that predicted it (all layers
and heads, captured with `model.capture`), the top-k next-token probabilities and the logits.

Step t reads the decoder input [BOS, y_1 .. y_t-1] and predicts y_t; so with
tgt_tokens = [BOS] + tokens, step t's self-attention keys are tgt_tokens[:t+1], and a
teacher-forced pass over [BOS] + tokens gives steps[t].logits at position t.

Decoding runs under `torch.inference_mode()` (no autograd bookkeeping: a cached step is a few
hundred tiny ops, so that bookkeeping is a real share of its cost); the math is unchanged.

Loops: a small model can fall into repeating itself ("i love study study study ..."). Greedy and
sampled decoding stop when the output ends with one n-gram repeated `stop_loops` times, more often
than the source repeats it (reversing "aaaa" is not a loop), and say so in `Translation.loop`.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from model.core.recorder import capturing
from model.families.transformer import Transformer

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
    loop: Loop | None = None  # this token completed a loop: the hypothesis stopped here


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
    loop: Loop | None = None  # set when decoding stopped because the output repeated itself

    @property
    def looped(self) -> bool:
        return self.loop is not None

    @property
    def tgt_tokens(self) -> list[str]:
        """The decoder input that produced the steps: [BOS] + tokens."""
        return ["[BOS]", *self.tokens]


# ------------------------------------------------------------------ loops

MAX_LOOP_NGRAM = 4  # longest repeating unit looked for (in tokens)


@dataclass(frozen=True)
class Loop:
    """The output ended with `ngram` repeated `repeats` times, so decoding stopped there."""

    ngram: tuple[str, ...]
    repeats: int
    at_step: int  # index of the step that completed the last repeat


def _canon(block: Sequence) -> tuple:
    """The same cycle whatever its phase: ("b", "a") and ("a", "b") both give ("a", "b")."""
    block = tuple(block)
    return min(block[i:] + block[:i] for i in range(len(block)))


def _periodic_runs(tokens: Sequence, max_n: int) -> dict[tuple, int]:
    """(n, cycle) -> the longest stretch of `tokens` that repeats that n-token cycle (in tokens),
    read in either direction."""
    best: dict[tuple, int] = {}
    for n in range(1, max_n + 1):
        run = 0  # positions i with tokens[i] == tokens[i - n], consecutive
        for i in range(n, len(tokens) + 1):
            if i < len(tokens) and tokens[i] == tokens[i - n]:
                run += 1
                continue
            if run:
                block = tokens[i - run - n : i - run]
                for key in ((n, _canon(block)), (n, _canon(block[::-1]))):  # reversed too: "abcabc" -> "cbacba"
                    best[key] = max(best.get(key, 0), run + n)
            run = 0
    return best


class LoopGuard:
    """Watches an output token by token; `push` returns a `Loop` once the output ends with one
    n-gram (n <= max_n) repeated `repeats` times over a longer stretch than any the source has.

    O(max_n) per token: for each n it keeps how many trailing tokens equal the token n before.
    """

    def __init__(self, src_tokens: Sequence[str], repeats: int = 3, max_n: int = MAX_LOOP_NGRAM):
        if not isinstance(repeats, int) or repeats < 2:
            raise ValueError(f"stop_loops must be an integer >= 2 (or None to never stop), got {repeats!r}")
        self.repeats, self.max_n = repeats, max_n
        self.src = _periodic_runs(list(src_tokens), max_n)
        self.out: list[str] = []
        self.run = [0] * (max_n + 1)

    def copy(self) -> LoopGuard:
        twin = object.__new__(LoopGuard)
        twin.repeats, twin.max_n, twin.src, twin.out, twin.run = (self.repeats, self.max_n, self.src,
                                                                  list(self.out), list(self.run))
        return twin

    def push(self, token: str) -> Loop | None:
        out = self.out
        out.append(token)
        for n in range(1, self.max_n + 1):
            self.run[n] = self.run[n] + 1 if len(out) > n and out[-1] == out[-1 - n] else 0
            span = self.run[n] + n  # the trailing stretch with period n
            if span >= n * self.repeats:
                block = tuple(out[-n:])
                if span > self.src.get((n, _canon(block)), 0):
                    return Loop(block, span // n, len(out) - 1)
        return None


# ------------------------------------------------------------------ one decoder step


@functools.lru_cache(maxsize=16)
def _attn_names_for(n_layers: int) -> tuple[str, ...]:
    kinds = ("self_attn", "cross_attn")
    return tuple(f"decoder.layers.{i}.{kind}.weights" for kind in kinds for i in range(n_layers))


def _attn_names(model: Transformer) -> tuple[str, ...]:
    return _attn_names_for(model.cfg.n_decoder_layers)


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
    with capturing(frozenset(names)) as rec:
        logits = model.decode(y, memory, src_pad, **kw)[:, -1]
    L = model.cfg.n_decoder_layers
    w = [rec.tensors[n][:, :, -1] for n in names]  # each (B, H, keys)
    return logits, torch.stack(w[:L], 1), torch.stack(w[L:], 1)


def _steps(ids: list[int], probs: torch.Tensor, logits: list[torch.Tensor], attn: list, n_top: int,
           tok: Callable[[int], str]) -> list[Step]:
    """Step records from per-step rows: probs (steps, V) the distributions the tokens were chosen from."""
    p_top, i_top = probs.topk(min(n_top, probs.shape[1]))
    p_chosen = probs.gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()
    return [
        Step(tok(i), i, p, [(tok(j), q) for j, q in zip(ti, tp, strict=True)], sa, ca, row)
        for i, p, ti, tp, row, (sa, ca) in zip(
            ids, p_chosen, i_top.tolist(), p_top.tolist(), logits, attn, strict=True)
    ]


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


@torch.no_grad()  # not inference_mode: evaluation runs between training steps of the same model
def greedy_batch(
    model: Transformer,
    src: torch.Tensor,
    bos: int,
    eos: int,
    max_new_tokens: int | None = None,
    use_cache: bool = True,
    *,
    src_tokens: Sequence[Sequence[str]] | None = None,
    id_to_token: Callable[[int], str] = str,
    stop_loops: int | None = 3,
) -> list[list[int]]:
    """Fast batched greedy decoding (no records): token ids per row, without [EOS].

    With `src_tokens` (one list per row), a row that falls into a loop stops as `generate` would
    (same rule, same output), so a trace of the greedy output shows what the decoder page shows.
    """
    src, limit = _prepare(model, src, max_new_tokens)
    B = src.shape[0]
    memory, src_pad = model.encode(src)
    cache = model.new_cache() if use_cache else None
    ys = torch.full((B, 1), bos, dtype=torch.long)
    done = torch.zeros(B, dtype=torch.bool)
    guards = _guards(src_tokens, stop_loops, B)
    stops: dict[int, int] = {}  # row -> its length when its loop guard stopped it
    for t in range(limit):
        y = ys[:, -1:] if use_cache else ys
        logits, _, _ = decoder_step(model, y, memory, src_pad, cache, t, use_cache=use_cache)
        nxt = logits.argmax(-1)
        ys = torch.cat([ys, nxt[:, None]], 1)
        done |= nxt == eos
        if guards:
            for b, (tok, over) in enumerate(zip(nxt.tolist(), done.tolist(), strict=True)):
                if not over and guards[b].push(id_to_token(tok)) is not None:
                    done[b], stops[b] = True, t + 1
        if bool(done.all()):
            break
    out = []
    for b, row in enumerate(ys[:, 1:].tolist()):
        row = row[: stops[b]] if b in stops else row
        out.append(row[: row.index(eos)] if eos in row else row)
    return out


def _guards(src_tokens, stop_loops: int | None, batch: int) -> list[LoopGuard]:
    if stop_loops is None or src_tokens is None:
        return []
    if len(src_tokens) != batch:
        raise ValueError(f"src_tokens has {len(src_tokens)} rows for a batch of {batch}")
    return [LoopGuard(row, stop_loops) for row in src_tokens]


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


@torch.inference_mode()
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
    src_tokens: Sequence[str] | None = None,
    stop_loops: int | None = 3,
) -> Translation:
    """Greedy or sampled decoding of one source (1, S), recording every step.

    stop_loops: stop once the output ends with one n-gram repeated this many times, more than the
    source repeats it (`Translation.loop` says so; None: never). It needs `src_tokens` (the source's
    token strings, compared with `id_to_token` of the output) to tell a loop from a repeat the input
    asks for, and is off without them.
    """
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
    guards = _guards(None if src_tokens is None else [src_tokens], stop_loops, 1)
    guard = guards[0] if guards else None
    memory, src_pad = model.encode(src)
    cache = model.new_cache() if use_cache else None
    ys = torch.full((1, limit + 1), bos, dtype=torch.long)  # the decoder input, filled as we go
    rows, chosen, attn, sampled = [], [], [], []  # per step: logits, token id, (self, cross), probs
    finished, loop = False, None
    for t in range(limit):
        y = ys[:, t : t + 1] if use_cache else ys[:, : t + 1]
        logits, sa, ca = decoder_step(model, y, memory, src_pad, cache, t, record, use_cache)
        logits = logits[0]  # (V,)
        if strategy == "greedy":
            nxt = int(logits.argmax())  # as greedy_batch: the same tokens
        else:
            probs = _filter(logits, temperature, top_k, top_p)
            nxt = int(torch.multinomial(probs, 1, generator=gen))
            sampled.append(probs)
        rows.append(logits)
        chosen.append(nxt)
        if record:
            attn.append((sa[0], ca[0]))
        if nxt == eos:
            finished = True
            break
        ys[0, t + 1] = nxt
        if guard is not None and (loop := guard.push(id_to_token(nxt))) is not None:
            break
    # Per-step bookkeeping in one batch after the loop: fewer, larger ops (row-wise, so the same numbers).
    logp = F.log_softmax(torch.stack(rows), -1)  # (steps, V)
    ids = torch.tensor(chosen)
    score = sum(logp.gather(1, ids[:, None])[:, 0].tolist())  # log-probability under the model (no temperature)
    steps = []
    if record:
        probs = logp.exp() if strategy == "greedy" else torch.stack(sampled)  # what each token was chosen from
        steps = _steps(chosen, probs, rows, attn, n_top, id_to_token)
    n = len(chosen) - finished
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
        loop=loop,
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


@torch.inference_mode()
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
    src_tokens: Sequence[str] | None = None,
    stop_loops: int | None = 3,
) -> Translation:
    """Beam search over one source, keeping the whole tree.

    Each step extends every live hypothesis by every token, keeps the 2W best candidates in
    order: a candidate ending in [EOS] is finished, the others fill the W live slots. Stops once
    W hypotheses have finished (or at the length limit); returns the finished hypothesis with the
    best length-penalised score. Width 1 is exactly greedy decoding, up to a loop.
    A hypothesis that falls into a loop (see `generate`: needs `src_tokens`) stops there, like one cut
    by the length limit: it is returned only if none finished with [EOS] (so where greedy decoding
    stops at a loop, beam search carries on with the next best candidates).
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
    root_guard = _guards(None if src_tokens is None else [src_tokens], stop_loops, 1)
    guards = {0: root_guard[0]} if root_guard else None  # node id -> its hypothesis's loop guard
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
            if guards is not None and not is_eos:
                guards[node.id] = guards[parent.id].copy()
                node.loop = guards[node.id].push(node.token)
            if is_eos or node.loop is not None:
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
    loop = tree[best].loop
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
        loop=loop,
    )
