"""The Q/K map (issue 19 §5, after AttentionViz, Yeh et al. 2023): one head's queries and keys of a batch of
inputs in one 2-D picture. Pure: arrays in, plotly out (the page runs the model and caches the batch).

- `QKBatch`: one model's q, k and weights of every attention module over a batch of inputs, per input;
- `qk_map(batch, module, head)`: normalise (both changes leave every softmax row unchanged: keys shifted by one
  vector add a constant to each query's scores; q·a with k/a keeps q·k; the math is model/analysis/qk.py's
  `normalise`), then a joint PCA to 2-D. Works for any attention kind: causal self-attention (a query sees the
  keys up to its own position), encoder self-attention and cross-attention (every key of its input);
- `QKMap.top_keys`: a query's top-5 keys from the real weights (what a click highlights);
  `QKMap.clarity`: how well 2-D nearness recovers each query's top-5 keys (vs chance);
  `QKMap.pattern_share`: how often a query's nearest key is the one a pattern names (the previous token,
  the token after the earlier copy);
- `qk_figure(m, color, selected)`: the picture; `clarity_table(batch, kind)`: every head's clarity.

A long prompt (issue 24 §3) keeps q and k only (O(T·d)): `QKBatch.weights_of` gives one head's weight rows from
its trace when asked, `qk_map` computes the drawn head's T × T weights that way, clarity is measured on
`CLARITY_QUERIES` queries spread over the prompt (`clarity_rows`), and `qk_figure(max_points=)` draws every s-th
position's points (the projection, the top keys and clarity use every point).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go

from model.analysis.qk import normalise
from viz.figures.attention import num, show_token
from viz.i18n import N_, t

try:  # numpy's OpenBLAS threads fight torch's on 2 cores: a 64 × 64 eigh takes 100+ ms instead of < 1 ms
    from threadpoolctl import threadpool_limits
except ImportError:  # correct, only slower
    threadpool_limits = None

# Short, plain English sentences for the real models (SmolLM2, MiniLM and server models): 40 of them, 8-16
# tokens each, with repeated names and words so duplicate-token and induction-like structure has a chance.
SENTENCES = (
    "The cat sat on the mat and looked at the door.",
    "When Mary and John went to the store, John gave a drink to Mary.",
    "The animal didn't cross the street because it was too tired.",
    "A small boat drifted slowly across the quiet lake.",
    "She opened the window and the cold air rushed in.",
    "The teacher asked the students to read the first chapter.",
    "My brother bought a red bike, and then he bought a blue bike.",
    "It was raining, so we stayed inside and played cards.",
    "The train to Paris leaves at nine in the morning.",
    "Dogs like to run, and cats like to sleep in the sun.",
    "He wrote the letter, read the letter, and burned the letter.",
    "The price of bread went up again this week.",
    "After dinner, Anna and Tom walked to the park with Anna's dog.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The old man told the same story to everyone he met.",
    "Please close the door when you leave the room.",
    "The river flows north through the green valley.",
    "I think that the answer is seven, but I am not sure.",
    "The children built a castle of sand on the beach.",
    "Every morning the baker bakes bread for the whole town.",
    "The meeting was moved from Monday to Tuesday afternoon.",
    "One, two, three, four, five, six, seven, eight.",
    "Alice gave Bob a book, and Bob gave Alice a pen.",
    "The moon was full and the night was very bright.",
    "They planted apple trees along the edge of the field.",
    "The computer crashed before I could save my work.",
    "Birds fly south in winter to find warmer weather.",
    "The key to the house is under the blue flower pot.",
    "Sarah finished the race first, and Emma finished second.",
    "The museum opens at ten and closes at six.",
    "A good friend is someone who listens to you.",
    "The soup was too hot, so he waited for it to cool.",
    "In the summer, the city is full of tourists.",
    "The phone rang twice and then the phone stopped ringing.",
    "We need eggs, milk, flour and sugar for the cake.",
    "The king lived in a castle on top of a hill.",
    "Light travels faster than sound through the air.",
    "The little girl smiled when she saw the puppy.",
    "He forgot his umbrella, so he got wet on the way home.",
    "The library has more books than I could ever read.",
)

COLORS = {"kind": N_("query / key"), "position": N_("position"), "token": N_("token")}
KIND_COLORS = {"query": "#1f77b4", "key": "#ff7f0e"}
TOKEN_GROUPS = 10  # colour by token: the most frequent tokens get a colour each, the rest grey
TOP_K = 5
MAX_POINTS = 1024  # a long prompt's picture draws at most this many queries and as many keys (figure ≤ ~1.5 MB)
CLARITY_QUERIES, CLARITY_RUNS = 128, 4  # a long input's clarity: 4 runs of 32 consecutive queries, spread evenly


@dataclass
class QKBatch:
    """q, k and weights of every attention module over a batch of inputs (numpy, batch row removed).

    arrays[i]["<module>.q"]: [H, Tq, hs] (after RoPE where the model rotates); ".k": [H_kv, Tk, hs];
    ".weights": [H, Tq, Tk]. tokens[i]: the trace's token lists by meta key ("src_tokens", "tgt_tokens")."""

    desc: dict  # the model's description (model/core/describe.py)
    labels: list[str]  # one per input: the sentence, or what the sequence is
    tokens: list[dict[str, list[str]]]
    arrays: list[dict[str, np.ndarray]]
    period: int | None = None  # the repeated random sequence's n (its second copy starts at n + 1)
    # a long prompt (one input) stores no ".weights": weights_of(module, head, rows) gives that head's weight rows
    # [R, Tk] (head None: [H, R, Tk]) from the trace, computed when asked (rows: a slice, None = every query)
    weights_of: Callable[[str, int | None, slice | None], np.ndarray] | None = None

    def modules(self, kind: str | None = None) -> list[str]:
        return [m for m, a in self.desc.get("attention", {}).items()
                if (kind is None or a["kind"] == kind) and f"{m}.q" in self.arrays[0]]

    def kinds(self) -> list[str]:
        return list(dict.fromkeys(a["kind"] for m, a in self.desc.get("attention", {}).items()
                                  if f"{m}.q" in self.arrays[0]))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for arrs in self.arrays for a in arrs.values())


@dataclass
class QKMap:
    module: str
    head: int
    kv_head: int
    causal: bool
    xy: np.ndarray  # [N, 2]: queries first (n_query of them), then keys
    kind: np.ndarray  # [N] "query" | "key"
    token: list[str]
    position: np.ndarray  # [N]
    sentence: np.ndarray  # [N]
    explained: np.ndarray  # [2] share of the variance on each axis
    weights: list[np.ndarray]  # per input [Tq, Tk]: the head's real attention
    scale: float  # a: queries times a, keys divided by a
    shift: np.ndarray  # c: added to every key
    n_query: int
    _index: dict = field(default_factory=dict, repr=False)
    _pad: tuple | None = field(default=None, repr=False)

    def __post_init__(self):
        self._index = {(str(k), int(s), int(p)): i
                       for i, (k, s, p) in enumerate(zip(self.kind, self.sentence, self.position, strict=True))}

    def index(self, kind: str, sentence: int, position: int) -> int:
        try:
            return self._index[(kind, int(sentence), int(position))]
        except KeyError:
            raise ValueError(f"no {kind} at input {sentence}, position {position}") from None

    def visible(self, sentence: int, position: int) -> np.ndarray:
        """Key positions query `position` of input `sentence` can see (causal: up to its own)."""
        n_k = self.weights[sentence].shape[1]
        return np.arange(min(position + 1, n_k) if self.causal else n_k)

    def top_keys(self, query: int, k: int = TOP_K) -> list[tuple[int, float]]:
        """Point indices of query point `query`'s top-k visible keys by the head's real weights, with the weights."""
        if self.kind[query] != "query":
            raise ValueError(f"point {query} is a key; pick a query")
        s, p = int(self.sentence[query]), int(self.position[query])
        vis = self.visible(s, p)
        w = self.weights[s][p, vis]
        order = vis[np.argsort(-w, kind="stable")[:k]]
        return [(self.index("key", s, int(j)), float(self.weights[s][p, j])) for j in order]

    def _padded(self):
        """All inputs at once, padded to the longest: query xy [S, Tq, 2], key xy [S, Tk, 2], weights
        [S, Tq, Tk], visibility [S, Tq, Tk] (False on padding and, if causal, above the diagonal), real rows
        [S, Tq]. Queries and keys are stored input by input in position order, so each input is a slice."""
        if getattr(self, "_pad", None) is None:
            S = len(self.weights)
            nq = np.array([w.shape[0] for w in self.weights])
            nk = np.array([w.shape[1] for w in self.weights])
            tq, tk = int(nq.max()), int(nk.max())
            qxy, kxy = np.zeros((S, tq, 2)), np.zeros((S, tk, 2))
            w = np.zeros((S, tq, tk))
            qo, ko = np.concatenate([[0], np.cumsum(nq)]), self.n_query + np.concatenate([[0], np.cumsum(nk)])
            for s in range(S):
                qxy[s, :nq[s]] = self.xy[qo[s]:qo[s + 1]]
                kxy[s, :nk[s]] = self.xy[ko[s]:ko[s + 1]]
                w[s, :nq[s], :nk[s]] = self.weights[s]
            rows = np.arange(tq)[None, :] < nq[:, None]
            vis = rows[:, :, None] & (np.arange(tk)[None, None, :] < nk[:, None, None])
            if self.causal:
                vis &= np.arange(tk)[None, None, :] <= np.arange(tq)[None, :, None]
            self._pad = (qxy, kxy, w, vis, rows)
        return self._pad

    def clarity(self, k: int = TOP_K) -> tuple[float, float]:
        """(clarity, chance): over the queries that see more than k keys, the mean share of their true top-k
        keys (by weight) among their k nearest keys in the picture; chance = k / visible keys. NaN if none."""
        qxy, kxy, w, vis, rows = self._padded()
        n_vis = vis.sum(-1)
        use = rows & (n_vis > k)
        if not use.any():
            return math.nan, math.nan
        d = np.where(vis, ((qxy[:, :, None, :] - kxy[:, None, :, :]) ** 2).sum(-1), np.inf)[use]
        ww = np.where(vis, w, -np.inf)[use]
        near, true = np.zeros(d.shape, bool), np.zeros(d.shape, bool)
        np.put_along_axis(near, np.argsort(d, axis=1, kind="stable")[:, :k], True, 1)
        np.put_along_axis(true, np.argsort(-ww, axis=1, kind="stable")[:, :k], True, 1)
        return float(((near & true).sum(1) / k).mean()), float((k / n_vis[use]).mean())

    def clarity_rows(self, rows: Sequence[slice], k: int = TOP_K) -> tuple[float, float]:
        """clarity() over the queries in `rows` (position slices of the only input) instead of every query: the
        same numbers when the rows cover every position (a long prompt's clarity on CLARITY_QUERIES queries)."""
        nq = self.weights[0].shape[0]
        pos = np.concatenate([np.arange(nq)[r] for r in rows])
        return clarity_rows(self.xy[:self.n_query][pos], self.xy[self.n_query:], pos, self.weights[0][pos],
                            self.causal, k)

    def pattern_share(self, target: Callable[[np.ndarray], np.ndarray], first: int = 1) -> tuple[float, float, int]:
        """(share, chance, n): over queries p >= first whose pattern key target(p) is visible, how often the
        nearest key in the picture is that key; chance = 1 / visible keys, averaged. `target` maps an array of
        query positions to key positions (the previous token: p - 1)."""
        qxy, kxy, _, vis, rows = self._padded()
        S, tq, tk = vis.shape
        p = np.arange(tq)
        j = np.asarray(target(p))
        ok = (p >= first) & (j >= 0) & (j < tk)
        use = rows & ok[None, :] & vis[:, p, np.clip(j, 0, tk - 1)]
        if not use.any():
            return math.nan, math.nan, 0
        d = np.where(vis, ((qxy[:, :, None, :] - kxy[:, None, :, :]) ** 2).sum(-1), np.inf)
        nearest = d.argmin(-1)
        hits = (nearest == j[None, :])[use]
        return float(hits.mean()), float((1 / vis.sum(-1)[use]).mean()), int(use.sum())


def qk_map(batch: QKBatch, module: str, head: int, _limit: bool = True) -> QKMap:
    """The Q/K map of query head `head` of attention module `module` over the batch."""
    info = batch.desc["attention"].get(module)
    if info is None or f"{module}.q" not in batch.arrays[0]:
        raise ValueError(f"no attention module {module!r} in this batch")
    H, H_kv = info["n_heads"], info.get("n_kv_heads") or info["n_heads"]
    if not 0 <= head < H:
        raise ValueError(f"head {head} does not exist: {module} has {H} heads (0..{H - 1})")
    kv = head // (H // H_kv)  # grouped-query attention: the K/V head this query head reads
    qs = [a[f"{module}.q"][head].astype(np.float64) for a in batch.arrays]
    ks = [a[f"{module}.k"][kv].astype(np.float64) for a in batch.arrays]
    if f"{module}.weights" in batch.arrays[0]:
        ws = [a[f"{module}.weights"][head] for a in batch.arrays]
    else:  # a long prompt: this head's T x T weights, from the trace (16 MB at 2,048 tokens)
        ws = [np.asarray(batch.weights_of(module, head, None), dtype=np.float32)]
    with _one_blas_thread() if _limit else nullcontext():
        xy, share, scale, shift = _project(qs, ks)
    q_toks = [tok for i, a in enumerate(batch.tokens) for tok in _side(a, info["query_tokens"], len(qs[i]))]
    k_toks = [tok for i, a in enumerate(batch.tokens) for tok in _side(a, info["key_tokens"], len(ks[i]))]
    pos = np.concatenate([np.arange(len(q)) for q in qs] + [np.arange(len(k)) for k in ks])
    sent = np.concatenate([np.full(len(q), i) for i, q in enumerate(qs)]
                          + [np.full(len(k), i) for i, k in enumerate(ks)])
    nq, nk = sum(map(len, qs)), sum(map(len, ks))
    kinds = np.array(["query"] * nq + ["key"] * nk)
    return QKMap(module, head, kv, bool(info.get("causal")), xy, kinds, q_toks + k_toks, pos, sent, share, ws,
                 scale, shift, nq)


def _project(qs: list[np.ndarray], ks: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """Every input's queries and keys (float64) normalised, then the joint PCA: (xy, share, scale, shift)."""
    qn, kn, scale, shift = normalise(np.concatenate(qs), np.concatenate(ks))
    xy, share = pca2(np.concatenate([qn, kn]))
    return xy, share, scale, shift


def query_runs(T: int, n: int = CLARITY_QUERIES, runs: int = CLARITY_RUNS) -> list[slice]:
    """`runs` slices of n / runs consecutive query positions, spread evenly over 0..T-1 (the last one ends at T);
    one slice of every position when T <= n."""
    if T <= n:
        return [slice(0, T)]
    size = n // runs
    starts = np.linspace(0, T - size, runs).round().astype(int)
    return [slice(int(a), int(a) + size) for a in starts]


def clarity_rows(qxy: np.ndarray, kxy: np.ndarray, pos: np.ndarray, w: np.ndarray, causal: bool,
                 k: int = TOP_K, chunk: int = 32) -> tuple[float, float]:
    """QKMap.clarity's numbers for one input, over the queries at positions `pos` only: qxy [R, 2] their points,
    kxy [Tk, 2] every key's, w [R, Tk] their weight rows. NaN if no query sees more than k keys. Causal rows are
    taken `chunk` at a time over the keys they can see (the keys after are never among a row's top k)."""
    Tk = len(kxy)
    scores, chances = [], []
    for c0 in range(0, len(pos), chunk):
        p, q, ww = pos[c0:c0 + chunk], qxy[c0:c0 + chunk], w[c0:c0 + chunk]
        n_k = min(Tk, int(p.max()) + 1) if causal else Tk
        vis = np.arange(n_k)[None, :] <= p[:, None] if causal else np.ones((len(p), n_k), bool)
        n_vis = vis.sum(-1)
        use = n_vis > k
        if not use.any():
            continue
        vis, q, ww = vis[use], q[use], ww[use, :n_k]
        d = np.where(vis, ((q[:, None, :] - kxy[None, :n_k, :]) ** 2).sum(-1), np.inf)
        ww = np.where(vis, ww, -np.inf)
        near, true = _smallest(d, k), _smallest(-ww, k)
        scores.append((near & true).sum(1) / k)
        chances.append(k / n_vis[use])
    if not scores:
        return math.nan, math.nan
    return float(np.concatenate(scores).mean()), float(np.concatenate(chances).mean())


def _smallest(x: np.ndarray, k: int) -> np.ndarray:
    """[R, N] bool: each row's k smallest entries, ties taken by the lowest index: the first k of a stable
    argsort (what QKMap.clarity marks), found by a partition instead of a sort (a long prompt's 270 heads)."""
    kth = np.partition(x, k - 1, axis=1)[:, k - 1:k]  # (R, 1): the k-th smallest value
    less, tie = x < kth, x == kth
    need = k - less.sum(1, keepdims=True)  # how many of the ties make the cut
    return less | (tie & (np.cumsum(tie, axis=1) <= need))


def pca2(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Joint PCA to 2-D: (coordinates [N, 2], explained variance share [2]); model/analysis/qk.pca2's result (up
    to each axis's sign) from the d × d covariance's eigenvectors instead of an SVD of the N × d points: with
    torch loaded, numpy's SVD of 1,000 × 64 points takes ~0.5 s on 2 cores (OpenBLAS and torch's threads
    contend), the 64 × 64 eigh well under 1 ms, and the clarity list projects every head."""
    x = points - points.mean(0)
    val, vec = np.linalg.eigh(x.T @ x)
    order = np.argsort(val)[::-1][:2]
    total = float(np.clip(val, 0, None).sum())
    share = np.clip(val[order], 0, None) / total if total > 0 else np.zeros(2)
    return x @ vec[:, order], share


def _one_blas_thread():
    return threadpool_limits(1, user_api="blas") if threadpool_limits is not None else nullcontext()


def _side(tokens: dict[str, list[str]], key: str, n: int) -> list[str]:
    toks = list(tokens.get(key) or [])
    return (toks + [str(i) for i in range(len(toks), n)])[:n]


def clarity_table(batch: QKBatch, kind: str, k: int = TOP_K) -> tuple[list[tuple[str, int, int, float]], float]:
    """Every head of the attention modules of `kind`: [(module, layer, head, clarity)] best first, and the
    mean chance level."""
    if batch.weights_of is not None:
        return _clarity_table_long(batch, kind, k)
    rows, chances = [], []
    with _one_blas_thread():  # once for every head (each limit costs a look at the loaded libraries)
        for module in batch.modules(kind):
            info = batch.desc["attention"][module]
            for h in range(info["n_heads"]):
                c, chance = qk_map(batch, module, h, _limit=False).clarity(k)
                if c == c:
                    rows.append((module, int(info["layer"]), h, c))
                    chances.append(chance)
    rows.sort(key=lambda r: -r[3])
    return rows, float(np.mean(chances)) if chances else math.nan


def _clarity_table_long(batch: QKBatch, kind: str, k: int = TOP_K) -> tuple[list[tuple[str, int, int, float]], float]:
    """clarity_table of a long prompt: each head's clarity on the queries of query_runs (QKMap.clarity_rows's
    numbers), their weight rows computed per layer from the trace, never a head's whole T x T map."""
    rows, chances = [], []
    with _one_blas_thread():
        for module in batch.modules(kind):
            info = batch.desc["attention"][module]
            H, H_kv = info["n_heads"], info.get("n_kv_heads") or info["n_heads"]
            a = batch.arrays[0]
            runs = query_runs(a[f"{module}.q"].shape[1])
            pos = np.concatenate([np.arange(r.start, r.stop) for r in runs])
            w = np.concatenate([np.asarray(batch.weights_of(module, None, r), dtype=np.float32) for r in runs], 1)
            nq = a[f"{module}.q"].shape[1]
            for h in range(H):
                q, kk = a[f"{module}.q"][h].astype(np.float64), a[f"{module}.k"][h // (H // H_kv)].astype(np.float64)
                xy, _, _, _ = _project([q], [kk])  # qk_map's picture of this head
                c, chance = clarity_rows(xy[:nq][pos], xy[nq:], pos, w[h], bool(info.get("causal")), k)
                if c == c:
                    rows.append((module, int(info["layer"]), h, c))
                    chances.append(chance)
    rows.sort(key=lambda r: -r[3])
    return rows, float(np.mean(chances)) if chances else math.nan


# ---------------------------------------------------------------------- the figure


def _short(s: str, n: int = 70) -> str:
    s = s.replace("<", "‹").replace(">", "›")
    return s if len(s) <= n else s[:n - 1] + "…"


def _hover(m: QKMap, labels: Sequence[str], idx: np.ndarray) -> list[str]:
    kind = {"query": t("query"), "key": t("key")}
    return [f"{kind[m.kind[i]]} · “{_short(show_token(m.token[i]), 30)}” · {t('position')} {m.position[i]}"
            f"<br>{_short(labels[m.sentence[i]])}" for i in idx]


def point_stride(m: QKMap, max_points: int | None) -> int:
    """Draw every s-th position's query and key so that neither cloud has over `max_points` points (1: all)."""
    n = max(m.n_query, len(m.kind) - m.n_query)
    return 1 if not max_points or n <= max_points else math.ceil(n / max_points)


def qk_figure(m: QKMap, labels: Sequence[str], color: str = "kind", selected: int | None = None,
              title: str = "", k: int = TOP_K, max_points: int | None = None) -> go.Figure:
    """Queries (circles) and keys (diamonds) of one head; colour by "kind", "position" or "token". Every point's
    customdata is [its index in m]. `selected`: a query point whose top-k keys (by the real weights) are ringed
    and joined to it (trace name "_top_keys", customdata the key points' indices). max_points: a cloud with more
    points is drawn at every s-th position only (point_stride; the selected query and its top keys always)."""
    fig = go.Figure()
    stride = point_stride(m, max_points)
    drawn = m.position % stride == 0  # [N]
    symbol = {"query": "circle", "key": "diamond"}
    names = {"query": t("queries"), "key": t("keys")}
    if color == "token":
        counts: dict[str, int] = {}
        for tok in m.token:
            counts[tok] = counts.get(tok, 0) + 1
        top = [tok for tok, _ in sorted(counts.items(), key=lambda kv: -kv[1])[:TOKEN_GROUPS]]
        groups = [(tok, f"“{_short(show_token(tok), 16)}”") for tok in top] + [(None, t("other tokens"))]
        palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
                   "#17becf", "#7f7f7f"]
        for gi, (tok, label) in enumerate(groups):
            idx = np.array([i for i, x in enumerate(m.token) if drawn[i] and (x == tok if tok is not None
                                                                                else x not in top)], dtype=int)
            if not len(idx):
                continue
            fig.add_trace(go.Scatter(
                x=m.xy[idx, 0], y=m.xy[idx, 1], mode="markers", name=label, customdata=[[int(i)] for i in idx],
                hovertext=_hover(m, labels, idx), hoverinfo="text",
                marker=dict(symbol=[symbol[m.kind[i]] for i in idx], size=7, opacity=0.85,
                            color=palette[gi % len(palette)] if tok is not None else "#d0d0d0")))
    else:
        for kind in ("query", "key"):
            idx = np.nonzero((m.kind == kind) & drawn)[0]
            marker = dict(symbol=symbol[kind], size=7, opacity=0.8)
            if color == "position":
                marker |= dict(color=m.position[idx], colorscale="Viridis", cmin=0, cmax=int(m.position.max()),
                               showscale=kind == "query", colorbar=dict(title=t("position"), len=0.6))
            else:
                marker |= dict(color=KIND_COLORS[kind])
            fig.add_trace(go.Scatter(x=m.xy[idx, 0], y=m.xy[idx, 1], mode="markers", name=names[kind],
                                     customdata=[[int(i)] for i in idx], hovertext=_hover(m, labels, idx),
                                     hoverinfo="text", marker=marker))
    if selected is not None and 0 <= selected < len(m.kind) and m.kind[selected] == "query":
        top = m.top_keys(selected, k)
        keys = np.array([i for i, _ in top], dtype=int)
        lx, ly = [], []
        for i in keys:
            lx += [m.xy[selected, 0], m.xy[i, 0], None]
            ly += [m.xy[selected, 1], m.xy[i, 1], None]
        fig.add_trace(go.Scatter(x=lx, y=ly, mode="lines", line=dict(color="#333", width=1), hoverinfo="skip",
                                 showlegend=False, name="_top_lines"))
        fig.add_trace(go.Scatter(
            x=m.xy[keys, 0], y=m.xy[keys, 1], mode="markers+text", name="_top_keys",
            customdata=[[int(i)] for i in keys], text=[num(w, 2) for _, w in top], textposition="top center",
            hovertext=[h + f"<br>{t('weight')} {num(w)}"
                       for h, (_, w) in zip(_hover(m, labels, keys), top, strict=True)],
            hoverinfo="text", showlegend=False,
            marker=dict(symbol="diamond-open", size=16, line=dict(width=2.5), color="#d62728")))
        fig.add_trace(go.Scatter(x=[m.xy[selected, 0]], y=[m.xy[selected, 1]], mode="markers", name="_query",
                                 customdata=[[selected]], hovertext=_hover(m, labels, np.array([selected])),
                                 hoverinfo="text", showlegend=False,
                                 marker=dict(symbol="star", size=18, color="#d62728", line=dict(width=1))))
    ex = m.explained
    fig.update_layout(title=title, height=560, margin=dict(l=50, r=20, t=60, b=50), clickmode="event+select",
                      legend=dict(orientation="h", y=-0.12), dragmode="pan",
                      xaxis=dict(title=t("PC 1 ({p} of the variance)", p=f"{ex[0]:.0%}"), zeroline=False),
                      yaxis=dict(title=t("PC 2 ({p} of the variance)", p=f"{ex[1]:.0%}"), zeroline=False,
                                 scaleanchor="x", scaleratio=1))
    return fig


def clarity_figure(rows: list[tuple[str, int, int, float]], n_layers: int, n_heads: int, chance: float,
                   layer: int | None = None, head: int | None = None) -> go.Figure:
    """Layer × head grid of clarity; customdata (layer, head) per cell, so a click opens that head."""
    z = np.full((n_layers, n_heads), np.nan)
    for _, li, h, c in rows:
        z[li, h] = c
    cd = np.stack(np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij"), -1)
    fig = go.Figure(go.Heatmap(z=z, x=list(range(n_heads)), y=list(range(n_layers)), customdata=cd,
                               colorscale="Blues", zmin=0, zmax=1, colorbar=dict(title=t("clarity"), len=0.8),
                               hovertemplate=t("layer %{y} · head %{x}<br>clarity %{z:.2f}") + "<extra></extra>"))
    if layer is not None and head is not None:
        fig.add_shape(type="rect", x0=head - 0.5, x1=head + 0.5, y0=layer - 0.5, y1=layer + 0.5,
                      line=dict(color="#d62728", width=2))
    fig.update_layout(title=t("Which heads look clear (chance: {c})", c=num(chance, 2)),
                      height=max(260, 60 + 16 * n_layers), margin=dict(l=50, r=10, t=50, b=40),
                      xaxis=dict(title=t("head"), dtick=1), yaxis=dict(title=t("layer"), autorange="reversed"))
    return fig
