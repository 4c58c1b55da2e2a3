"""Long inputs (issue 24): views and statistics of a language model's attention over thousands of
tokens, computed tile by tile from a trace, never H x T x T for the whole stack at once.

- `head_rows`: a block of one head's attention rows from any trace (a LazyTrace computes them from
  q and k; a full trace slices its stored weights), the one door every function here goes through;
- `pooled_overview`: a head's T x T map pooled to n x n cells that keep meaning: keys pooled by SUM,
  queries by MEAN, so a pooled row is a distribution over key blocks and still sums to 1;
- `zoom`: the exact cells of a window (query rows q0..q1, key columns k0..k1);
- `document_view`: where one query position looks, over every key, for one head, a layer's mean
  or the model's mean, with the top sources (the view a person reading a long prompt wants);
- `head_statistics_tiled`: the per-head scores of phenomena.head_statistics (sink share,
  previous-token, duplicate-token, induction, entropy, mean distance), same definitions, one pass
  over row tiles: the numbers equal the whole-matrix ones (float64 sums in another order);
- `length_profile`: how sink share and entropy change with the input's length;
- needle in a haystack (`needle_prompt`, `needle_trial`, `needle_grid`, `retrieval_scores`,
  `ablate_retrieval`): a pass key hidden at a depth in filler text, asked for at the end; the
  answer's probability by depth x length; retrieval heads (Wu et al. 2024, "Retrieval Head
  Mechanistically Explains Long-Context Factuality"); their ablation against random heads;
- `horizon`: on a model with sliding-window layers (Gemma 2/3), the share of the last token's attention that each
  layer puts beyond the window, on a long needle prompt (lesson 18).

Pure torch/numpy; `lm` is a LanguageModel (text needs its tokenizer) or a DecoderLM with ids.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from model.analysis.inputs import as_decoder
from model.analysis.phenomena import THRESHOLDS, HeadScores, _scored, heads_hooks, random_heads
from model.loaders.lm import encode_pieces

TILE_BYTES = 64 * 2**20  # one tile of float64 rows (H x R x T) at most this large
KEEP_TILES_UP_TO = 4096  # head statistics keep each tile's cell matrices for the next layer up to this length
                         # (T²/2 x 16 bytes: 128 MiB at 4,096); beyond, rebuilt per layer


# ---------------------------------------------------------------------- rows of any trace


def _meta(trace, key: str):
    """One entry of a trace's meta (Trace.meta_item: not a copy of all of it, token lists and all)."""
    return trace.meta_item(key) if hasattr(trace, "meta_item") else trace.meta[key]


def _modules(trace) -> list[str]:
    return [m for m, info in _meta(trace, "model")["attention"].items() if info["kind"] == "decoder_self"]


def n_tokens(trace) -> int:
    if isinstance(getattr(trace, "n_tokens", None), int):  # a LazyTrace: its stored q's length
        return trace.n_tokens
    return len(_meta(trace, "tgt_ids")[0])


def head_rows(trace, layer: int, head: int | None, rows: slice, batch: int = 0, cols: slice | None = None
              ) -> torch.Tensor:
    """Attention weights of query rows `rows` over keys `cols` (default every key): [R, K] for one
    head, [H, R, K] for head=None. A LazyTrace computes them (trace.attention); a full trace slices
    its weights. Causal rows r0..r1-1 have all their weight in keys 0..r1-1: cols=slice(0, r1) loses nothing."""
    if hasattr(trace, "attention"):
        return trace.attention(layer, head, rows, cols, batch=batch)
    w = trace[f"{_modules(trace)[layer]}.weights"][batch]  # (H, T, T)
    w = w[:, rows] if head is None else w[head, rows]
    return w if cols is None else w[..., cols]


def _tiles(T: int, H: int, budget: int = TILE_BYTES, start: int = 0):
    """Row slices of start..T-1 such that an (H, R, T) float64 tile stays under `budget`."""
    R = max(1, min(T, budget // max(1, H * T * 8)))
    for r0 in range(start, T, R):
        yield slice(r0, min(T, r0 + R))


# ---------------------------------------------------------------------- overview and zoom


@dataclass
class Overview:
    """A head's attention pooled to cells: cells[a, b] = mean over the queries of block a of the summed
    weight on the keys of block b. Each row sums to 1 (a row with no query in it is all 0)."""

    cells: np.ndarray  # [n_q, n_k]
    q_edges: list[int]  # block a holds queries q_edges[a] .. q_edges[a+1]-1
    k_edges: list[int]
    layer: int
    head: int


def block_edges(T: int, n: int) -> list[int]:
    """n+1 block boundaries over 0..T (n <= T blocks, sizes differ by at most one)."""
    n = max(1, min(n, T))
    return [round(i * T / n) for i in range(n + 1)]


def pooled_overview(trace, layer: int, head: int, n: int = 256) -> Overview:
    """The head's T x T map pooled to n x n (keys by sum, queries by mean), tile by tile."""
    T = n_tokens(trace)
    edges = block_edges(T, n)
    nb = len(edges) - 1
    block_of = torch.repeat_interleave(torch.arange(nb), torch.tensor(np.diff(edges)))  # (T,) position -> block
    out = torch.zeros(nb, nb, dtype=torch.float64)
    for rows in _tiles(T, 1):
        w = head_rows(trace, layer, head, rows, cols=slice(0, rows.stop)).double()  # (R, r1): causal rows
        by_key = torch.zeros(w.shape[0], nb, dtype=torch.float64).index_add_(1, block_of[:rows.stop], w)  # summed
        out.index_add_(0, block_of[rows], by_key)  # queries summed, divided by the block size below
    out /= torch.tensor(np.diff(edges), dtype=torch.float64)[:, None]
    return Overview(out.numpy(), edges, edges, layer, head)


def zoom(trace, layer: int, head: int, q0: int, q1: int, k0: int, k1: int) -> np.ndarray:
    """The exact weights of query rows q0..q1-1 over keys k0..k1-1 (the rows computed over all keys)."""
    T = n_tokens(trace)
    q0, q1 = max(0, min(q0, T)), max(0, min(q1, T))
    k0, k1 = max(0, min(k0, T)), max(0, min(k1, T))
    return head_rows(trace, layer, head, slice(q0, q1))[:, k0:k1].numpy()


# ---------------------------------------------------------------------- the document view


@dataclass
class DocumentView:
    """Where one query position looks: weights [T_keys] over the keys it sees (one head, a layer's mean
    over heads, or the model's mean over layers and heads) and the top sources."""

    position: int
    weights: np.ndarray  # [T_keys], sums to 1
    top: list[tuple[int, float]]  # (key position, weight), heaviest first
    layer: int | None  # None: the mean over layers
    head: int | None  # None: the mean over heads


def focus(rows: torch.Tensor, layer: int | None = None, head: int | None = None, top: int = 10,
          position: int | None = None) -> DocumentView:
    """The document view of one query's rows [L, H, T] (every layer's and head's weights, e.g. a
    generation step's `attention`): one head (layer and head given), a layer's mean (head None) or
    the model's mean (layer None)."""
    r = rows.double()
    if layer is None:
        w = r.mean((0, 1))
    elif head is None:
        w = r[layer].mean(0)
    else:
        w = r[layer, head]
    k = min(top, w.numel())
    vals, idx = w.topk(k)
    pos = rows.shape[-1] - 1 if position is None else position
    return DocumentView(pos, w.numpy(), [(int(i), float(v)) for i, v in zip(idx, vals, strict=True)], layer, head)


def query_rows(trace, position: int, layers: Sequence[int] | None = None) -> torch.Tensor:
    """[L, H, T]: every layer's and head's attention from one query position (keys after it get 0)."""
    mods = _modules(trace)
    position = position % n_tokens(trace)
    layers = range(len(mods)) if layers is None else layers
    return torch.stack([head_rows(trace, i, None, slice(position, position + 1))[:, 0] for i in layers])


def document_view(trace, position: int = -1, layer: int | None = None, head: int | None = None,
                  top: int = 10) -> DocumentView:
    """The document view of a trace at one query position (-1: the last, whose output is the next token)."""
    T = n_tokens(trace)
    position = position % T
    if layer is None:
        rows = query_rows(trace, position)
        return focus(rows[:, :, :position + 1], None, None, top, position)
    view = focus(query_rows(trace, position, [layer])[:, :, :position + 1], 0, head, top, position)
    view.layer = layer
    return view


# ---------------------------------------------------------------------- per-head statistics, tiled


STATS = ("sink", "previous_token", "duplicate_token", "induction", "entropy", "distance")
_PATTERNS = ("duplicate_token", "induction")  # per-cell patterns (previous_token is one cell a row: gathered)


def head_statistics_tiled(trace, thresholds: dict | None = None, period: int | None = None,
                          stats: Sequence[str] = STATS, layers: Sequence[int] | None = None,
                          first_query: int = 0) -> dict[str, HeadScores]:
    """phenomena.head_statistics (same definitions, same HeadScores), computed over row tiles of each
    head's attention: memory O(H x tile x T), never the T x T matrices of the stack. Batch row 0.
    stats: the scores wanted (fewer: faster). layers: a subset of layers (rows of the result).
    first_query: only the query rows first_query..T-1 are scored, each over all its keys (a long
    prompt's statistics over its last positions: the cost grows like rows x T, not T²/2); every mean
    is then over those rows (0: every row, the whole-matrix numbers).

    One pass over a tile's float32 weights gives, per row and head, the row sum, the mean distance and
    the attention on the duplicate-token and induction cells (a batched dot with the tile's cell
    matrices), a second the entropy; the sink and previous-token cells are gathered. Sums over rows
    are float64. The numbers equal the float64 whole-matrix ones to ~1e-7 relative."""
    th = THRESHOLDS | (thresholds or {})
    mods = _modules(trace)
    layers = list(range(len(mods))) if layers is None else list(layers)
    ids = torch.as_tensor(trace.meta["tgt_ids"][0])
    T = ids.numel()
    first_query = max(0, min(int(first_query), T - 1))
    if period and first_query:
        raise ValueError("the induction score over a repeated block needs every row: first_query must be 0")
    if period and "induction" in stats and T < 2 * period + 1:
        raise ValueError(f"the induction score needs [BOS] + 2 x {period} tokens, the trace has {T}")
    tl_kinds = [k for k in stats if k in ("previous_token", "duplicate_token", "induction")]
    cells = [k for k in _PATTERNS if k in stats and not (k == "induction" and period)]
    acc: dict[str, list[torch.Tensor]] = {k: [] for k in stats}
    tl: dict[str, list[torch.Tensor]] = {k: [] for k in tl_kinds}
    tiles = []  # the per-tile cell matrices, built once for every layer
    for layer in layers:
        H = head_rows(trace, layer, None, slice(0, 1)).shape[0]
        total, sink, ent, dist, prev_hit, prev_tot, ind_sum = (torch.zeros(H, dtype=torch.float64) for _ in range(7))
        hit = {k: torch.zeros(H, dtype=torch.float64) for k in cells}
        tot = {k: torch.zeros(H, dtype=torch.float64) for k in cells}
        for n, rows in enumerate(_tiles(T, H, start=first_query)):
            r0, r1 = rows.start, rows.stop
            if n < len(tiles):
                cols, has_cell = tiles[n]
            else:
                cols, has_cell = _tile_cells(ids, r0, r1, cells)
                if T * T - first_query ** 2 <= KEEP_TILES_UP_TO ** 2:  # the kept cells: ~(T² - first²) / 2
                    tiles.append((cols, has_cell))
            w = head_rows(trace, layer, None, rows, cols=slice(0, r1)).float()  # (H, R, r1)
            i = torch.arange(r0, r1)
            # (R, H, r1) @ (R, r1, 2 + len(cells)): row sum, distance and each pattern's attention at once
            per_row = (w.transpose(0, 1) @ cols).double()  # (R, H, C)
            rowsum = per_row[..., 0].T  # (H, R)
            total += rowsum.sum(-1)
            dist += per_row[..., 1].sum(0)
            for c, k in enumerate(cells):
                hit[k] += per_row[..., 2 + c].sum(0)
                tot[k] += (rowsum * has_cell[c]).sum(-1)
            if "sink" in stats:
                sink += w[:, i >= 1, 0].double().sum(-1)
            if "previous_token" in stats:
                has = i >= 1
                prev_hit += w[:, has.nonzero()[:, 0], (i[has] - 1)].double().sum(-1)
                prev_tot += rowsum[:, has].sum(-1)
            if "entropy" in stats:
                ent -= torch.special.xlogy(w, w).sum(-1, dtype=torch.float64).sum(-1)
            if period and "induction" in stats:
                sel = (i >= period + 1) & (i <= 2 * period)
                ind_sum += w[:, sel.nonzero()[:, 0], i[sel] - (period - 1)].double().sum(-1)
        n_rows, n_sink = T - first_query, T - max(1, first_query)  # rows scored; of them, rows with a key 0 before
        scores = {"sink": sink / n_sink if n_sink > 0 else torch.full((H,), float("nan")), "entropy": ent / n_rows,
                  "distance": dist / n_rows, "previous_token": prev_hit / prev_tot}
        hits = {"previous_token": prev_hit} | hit
        for k in cells:
            scores[k] = hit[k] / tot[k]
        if period and "induction" in stats:
            scores["induction"] = ind_sum / period
            if "induction" in tl:  # TL's number on the same input uses the pattern: one more pass for it
                hits["induction"] = _pattern_hits(trace, layer, ids, "induction", H)
        for k in stats:
            acc[k].append(scores[k])
            if k in tl:
                tl[k].append(hits[k] / total)  # TransformerLens's 'mul': over all T rows (batch of one)
    return {k: _scored(k, torch.stack(acc[k]).numpy(), th.get(k), torch.stack(tl[k]).numpy() if k in tl else None)
            for k in stats}


def _tile_cells(ids: torch.Tensor, r0: int, r1: int, cells: Sequence[str]) -> tuple[torch.Tensor, list]:
    """(R, r1, 2 + len(cells)) float32 columns for one row tile: ones (row sum), |i - j| (distance), then
    each pattern's cells (phenomena's duplicate_token_pattern, induction_pattern rows); and, per pattern,
    which rows have a cell ([R] float64)."""
    i, j = torch.arange(r0, r1)[:, None], torch.arange(r1)[None]
    cols = [torch.ones(r1 - r0, r1), (i - j).abs().float()]
    has = []
    for k in cells:
        p = _pattern_tile(k, ids[:r1], i[:, 0])
        cols.append(p.float())
        has.append(p.any(-1).double())
    return torch.stack(cols, -1), has


def _pattern_hits(trace, layer: int, ids: torch.Tensor, kind: str, H: int) -> torch.Tensor:
    T = ids.numel()
    out = torch.zeros(H, dtype=torch.float64)
    for rows in _tiles(T, H):
        p = _pattern_tile(kind, ids[:rows.stop], torch.arange(rows.start, rows.stop)).float()
        w = head_rows(trace, layer, None, rows, cols=slice(0, rows.stop)).float()
        out += (w * p).sum((-1, -2), dtype=torch.float64)
    return out


def _pattern_tile(kind: str, ids: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """Rows i of phenomena's [T, T] patterns (previous_token_pattern, duplicate_token_pattern,
    induction_pattern) over keys 0..len(ids)-1, as bool, built for the tile only."""
    T = ids.numel()
    j = torch.arange(T)
    if kind == "previous_token":
        return j[None] == (i[:, None] - 1)
    if kind == "duplicate_token":
        return (ids[i][:, None] == ids[None]) & (j[None] < i[:, None])
    # induction: (i, j + 1) for each earlier copy j of token i, diagonal kept (j + 1 <= i)
    out = torch.zeros(len(i), T, dtype=torch.bool)
    out[:, 1:] = (ids[i][:, None] == ids[None, :-1]) & (j[None, :-1] < i[:, None])
    return out & (j[None] <= i[:, None])


# ---------------------------------------------------------------------- length


@dataclass
class LengthProfile:
    lengths: list[int]
    sink: np.ndarray  # [n_lengths, L]: mean over heads of each layer's sink share
    entropy: np.ndarray  # [n_lengths, L]: mean over heads of each layer's mean row entropy (nats)
    uniform_entropy: list[float]  # the mean row entropy of uniform attention at that length, for scale


@torch.no_grad()
def length_profile(lm, ids: torch.Tensor, lengths: Sequence[int]) -> LengthProfile:
    """Sink share and entropy per layer on the first n tokens of `ids` ([1, T]), for each n in lengths."""
    m = as_decoder(lm)
    sink, ent, uni = [], [], []
    for n in lengths:
        _, tr = m.run_with_trace(ids[:, :n], lazy=True, fast=True, budget_bytes=None)
        st = head_statistics_tiled(tr, stats=("sink", "entropy"))
        sink.append(st["sink"].scores.mean(-1))
        ent.append(st["entropy"].scores.mean(-1))
        uni.append(float(np.mean([math.log(i + 1) for i in range(n)])))
    return LengthProfile(list(lengths), np.stack(sink), np.stack(ent), uni)


# ---------------------------------------------------------------------- needle in a haystack

FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ")
INTRO = ("There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the pass key there. ")
QUESTION = " What is the pass key? The pass key is"


@dataclass
class NeedlePrompt:
    ids: torch.Tensor  # [1, T]: the prompt (ending with the question)
    answer: list[int]  # the answer's token ids (" 71432" as the tokenizer splits it)
    needle: tuple[int, int]  # token positions [start, end) of the sentence holding the key
    key: str
    depth: float  # where the needle sits in the filler, 0 = start, 1 = end
    length: int  # len(prompt)


def needle_prompt(lm, length: int, depth: float, key: str = "71432", filler: str = FILLER) -> NeedlePrompt:
    """A passkey-retrieval prompt of about `length` tokens (Mohtashami & Jaggi 2023's format): intro,
    filler, at `depth` the sentence "The pass key is KEY. Remember it. KEY is the pass key.", more filler,
    the question. Built from token ids (lm.encode_pieces: each piece without special tokens, the model's BOS
    rule once at the start), so the needle's positions are exact and no `<bos>` sits inside the text."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth!r}")

    def bare(text: str) -> list[int]:  # a piece's ids, no special token (they are counted to fit `length`)
        return lm.encode_pieces([text], bos=False, check_length=False)[0][0].tolist()

    head = len(lm.bos_prefix())
    intro, q = bare(INTRO), bare(QUESTION)
    needle = bare(f" The pass key is {key}. Remember it. {key} is the pass key. ")
    answer = bare(f" {key}")
    fill_one = bare(filler)
    n_fill = max(0, length - head - len(intro) - len(needle) - len(q))
    fill = (fill_one * (n_fill // max(1, len(fill_one)) + 1))[:n_fill]
    cut = int(round(depth * n_fill))
    # cut the filler at a sentence boundary at or before `cut` (a needle inside a word reads oddly)
    stops = [i + 1 for i, t in enumerate(fill[:cut]) if lm.tokenizer.decode([t]).strip().endswith(".")]
    cut = stops[-1] if stops and depth < 1 else cut
    ids, spans = lm.encode_pieces([INTRO, fill[:cut], needle, fill[cut:], QUESTION])
    return NeedlePrompt(ids, answer, spans[2], key, depth, ids.shape[1])


@dataclass
class NeedleTrial:
    prompt: NeedlePrompt
    prob: float  # p(answer tokens | prompt), teacher-forced: the product over the answer's tokens
    first_prob: float  # p(first answer token | prompt)
    correct: bool  # greedy continuation reproduces the whole answer
    copy_hits: np.ndarray  # [L, H]: answer tokens this head copied (retrieval-head criterion)
    copied: int  # answer tokens the model predicted right (the steps where copying is scored)


def teacher_forced_ids(lm, prompt: NeedlePrompt) -> torch.Tensor:
    """[1, T + len(answer) - 1]: the prompt with the answer's tokens but the last appended, the bare ids
    needle_prompt gave (no special token between prompt and answer), joined where every prompt is."""
    return encode_pieces(lm, [prompt.ids[0], prompt.answer[:-1]], bos=False)[0]


@torch.no_grad()
def needle_trial(lm, prompt: NeedlePrompt, hooks=None, heads_scored: bool = True) -> NeedleTrial:
    """One needle prompt, teacher-forced with the answer appended (one forward, lazy trace). For each
    answer token the model predicts right (argmax = the answer token), a head scores a copy hit when
    its most-attended key lies inside the needle and holds that very token (Wu et al. 2024)."""
    m = as_decoder(lm)
    ids = teacher_forced_ids(lm, prompt)
    P = prompt.ids.shape[1]
    if heads_scored and not hooks:
        logits, tr = m.run_with_trace(ids, lazy=True, fast=True, budget_bytes=None)
    else:
        from model.core import recorder

        with recorder.fast_attention():
            logits, tr = m.run_with_hooks(ids, hooks=hooks), None
    steps = range(P - 1, P - 1 + len(prompt.answer))  # query positions predicting each answer token
    logits = logits[0, P - 1:P - 1 + len(prompt.answer)].float()  # (n_answer, V): not T x V (8,192 x 49k: 1.6 GB)
    logp = logits.log_softmax(-1)
    lp = [float(logp[j, a]) for j, a in enumerate(prompt.answer)]
    right = [int(logits[j].argmax()) == a for j, a in enumerate(prompt.answer)]
    cfg = m.cfg
    hits = np.zeros((cfg.n_layers, cfg.n_heads))
    if tr is not None:
        s0, s1 = prompt.needle
        flat = ids[0]
        for t, a, ok in zip(steps, prompt.answer, right, strict=True):
            if not ok:
                continue
            hits += copy_hits(query_rows(tr, t), flat, (s0, s1), a).numpy()
    return NeedleTrial(prompt, math.exp(sum(lp)), math.exp(lp[0]), all(right), hits, sum(right))


def copy_hits(rows: torch.Tensor, ids: torch.Tensor, span: tuple[int, int], token: int) -> torch.Tensor:
    """[L, H] bool: the heads whose most-attended key (rows [L, H, T], one query) lies in the needle
    span [start, end) and holds `token`, the token being copied (Wu et al. 2024's copy-paste test)."""
    top = rows.argmax(-1)  # (L, H)
    return (top >= span[0]) & (top < span[1]) & (ids[top] == token)


@dataclass
class NeedleGrid:
    lengths: list[int]
    depths: list[float]
    prob: np.ndarray  # [n_depths, n_lengths]: p(answer)
    correct: np.ndarray  # [n_depths, n_lengths] bool
    retrieval: HeadScores  # per head: copy hits / answer tokens copied, over every trial
    trials: list[NeedleTrial] = field(default_factory=list)


RETRIEVAL_RECIPE = ("share of copied answer tokens for which the head's most-attended key lies in the needle "
                    "and is that token (Wu et al. 2024, retrieval heads)")
RETRIEVAL_THRESHOLD = 0.1  # Wu et al. call a head a retrieval head at a score >= 0.1


def needle_grid(lm, lengths: Sequence[int], depths: Sequence[float], key: str = "71432",
                progress: Callable[[int, int], None] | None = None) -> NeedleGrid:
    """Every (depth, length) trial; retrieval scores pooled over the trials (Wu et al. average the
    score over many needles, lengths and depths). `progress(done, total)` after each trial (a page's bar)."""
    trials, prob, correct = [], [], []
    for d in depths:
        row_p, row_c = [], []
        for n in lengths:
            t = needle_trial(lm, needle_prompt(lm, n, d, key))
            trials.append(t)
            if progress is not None:
                progress(len(trials), len(depths) * len(lengths))
            row_p.append(t.prob)
            row_c.append(t.correct)
        prob.append(row_p)
        correct.append(row_c)
    return NeedleGrid(list(lengths), list(depths), np.array(prob), np.array(correct),
                      retrieval_scores(trials), trials)


def retrieval_scores(trials: Sequence[NeedleTrial]) -> HeadScores:
    """Per head: copy hits over every answer token copied, pooled over the trials ([L, H], 0..1)."""
    hits = sum(t.copy_hits for t in trials)
    n = sum(t.copied for t in trials)
    scores = hits / n if n else np.full_like(hits, np.nan)
    L, H = np.nonzero(scores >= RETRIEVAL_THRESHOLD)
    heads = sorted(((int(a), int(b), float(scores[a, b])) for a, b in zip(L, H, strict=True)), key=lambda x: -x[2])
    return HeadScores("retrieval", scores, RETRIEVAL_THRESHOLD, RETRIEVAL_RECIPE, heads)


@dataclass
class RetrievalAblation:
    heads: list[tuple[int, int]]
    controls: list[list[tuple[int, int]]]
    base: float  # mean p(answer) over the prompts, intact
    ablated: float  # with the top retrieval heads zeroed
    control: list[float]  # with each random set zeroed
    base_correct: float  # share of prompts answered right (greedy)
    ablated_correct: float
    control_correct: list[float]


def ablate_retrieval(lm, prompts: Sequence[NeedlePrompt], scores: HeadScores, k: int = 5, n_controls: int = 3,
                     seed: int = 0) -> RetrievalAblation:
    """Zero the k heads with the highest retrieval score and measure p(answer) on `prompts`; zero k
    random other heads (seeded, n_controls draws) as the control."""
    top = [(layer, h) for layer, h, _ in scores.top(k)]
    controls = [random_heads(lm, k, exclude=top, seed=seed + i) for i in range(n_controls)]

    def run(heads):
        hooks = heads_hooks(lm, heads) if heads else None
        ts = [needle_trial(lm, p, hooks=hooks, heads_scored=False) for p in prompts]
        return float(np.mean([t.prob for t in ts])), float(np.mean([t.correct for t in ts]))

    base, base_c = run([])
    abl, abl_c = run(top)
    ctrl = [run(c) for c in controls]
    return RetrievalAblation(top, controls, base, abl, [c[0] for c in ctrl], base_c, abl_c, [c[1] for c in ctrl])


__all__ = ["DocumentView", "LengthProfile", "NeedleGrid", "NeedlePrompt", "NeedleTrial", "Overview",
           "RetrievalAblation", "ablate_retrieval", "block_edges", "document_view",
           "copy_hits", "focus", "head_rows", "head_statistics_tiled", "length_profile", "needle_grid", "needle_prompt",
           "needle_trial", "pooled_overview", "query_rows", "retrieval_scores", "teacher_forced_ids", "zoom"]


# ---------------------------------------------------------------------- the horizon of sliding layers


@dataclass
class Horizon:
    prompt: NeedlePrompt
    window: int  # W of the sliding layers: a query there sees the keys p - W + 1 ... p
    kinds: list[str]  # per layer: "sliding" or "full" (the model's own description)
    far: np.ndarray  # [L, H]: share of the last position's attention on keys W or more positions back
    needle: np.ndarray  # [L, H]: share on the sentence holding the pass key

    @property
    def full_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k != "sliding"]

    @property
    def sliding_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k == "sliding"]


def horizon(lm, length: int = 2000, depth: float = 0.1) -> Horizon:
    """Where the last token of a `length`-token needle prompt (the pass key at `depth`, far back) looks, layer by
    layer: the share of its attention row (each head) on keys at least W positions back, and on the pass-key
    sentence. The row is the model's own (one step of generation with its fused attention: the last row computed
    from its query and the cached keys, trace.last_row), so a sliding layer's share beyond W is exactly 0 by its
    mask and a full layer's is whatever the model does."""
    m = as_decoder(lm)
    infos = [a for a in m.describe()["attention"].values() if a["kind"] == "decoder_self"]
    windows = [a.get("window") for a in infos]
    if not any(windows):
        raise ValueError("this model has no sliding-window layer: every layer sees the whole text")
    W = next(w for w in windows if w)
    prompt = needle_prompt(lm, length, depth)
    step = next(lm.stream(prompt.ids, max_new_tokens=1, fast=True))
    rows = step.attention.double().numpy()  # [L, H, T]: the last position's row in every layer and head
    T = rows.shape[-1]
    kinds = ["sliding" if w else "full" for w in windows]
    return Horizon(prompt, int(W), kinds, rows[:, :, : max(0, T - W)].sum(-1),
                   rows[:, :, prompt.needle[0]:prompt.needle[1]].sum(-1))
