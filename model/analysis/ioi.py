"""Who gave the drink? Indirect-object identification (Wang et al. 2022) on a decoder LM.

"When Mary and John went to the store, John gave a drink to" -> " Mary": the indirect object (IO,
Mary) is the name that is NOT repeated; the subject (S, John) appears twice. The model's preference
is the logit difference LD = logit(IO) - logit(S) at the last position.

- `ioi_prompts`: a dozen templates, each with its own pair of names (single tokens in the model's
  tokenizer, with their leading space), alternating the ABBA / BABA orders; each has a corrupted twin
  with the names swapped at the second mention (S2 := IO), the same length, for activation patching.
- `direct_logit_attribution`: each head's output at the last position, through its W^O slice, any norm
  after the sublayer, the final norm, the final soft-cap and the unembedding, onto u_IO - u_S. Every norm's
  scale (1/rms, or 1/std after centring for LayerNorm) and the soft-cap's factor are FROZEN at their values
  on the clean run: the standard DLA approximation that makes the logit a linear sum of the residual
  stream's pieces (model/core/residual.py, the one decomposition every analysis reads). With them frozen
  the pieces (embeddings, every head, W^O's bias, every FFN or expert, the norms' biases) add up exactly to
  LD, on every block wiring (pre-norm, sandwich, post-norm, parallel).
- `ablate_heads_ld`: knock out the top heads (and, as a control, as many random heads) and watch LD fall.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from model.analysis.patching import logit_diff
from model.analysis.phenomena import as_decoder, as_ids, attention_names, random_heads
from model.core import residual

# {A} and {B} are introduced in this order, {S} is the repeated one (the subject).
TEMPLATES = (
    "When {A} and {B} went to the store, {S} gave a drink to",
    "When {A} and {B} went to the park, {S} gave a ball to",
    "After {A} and {B} went to the market, {S} handed a bag to",
    "While {A} and {B} were working at the office, {S} gave a report to",
    "Then, {A} and {B} had a long argument, and afterwards {S} said to",
    "When {A} and {B} got a snack at the cafe, {S} decided to give it to",
    "The friends {A} and {B} found a necklace at the beach. {S} gave it to",
    "Afterwards, {A} and {B} went to the garden. {S} gave a flower to",
    "At the school, {A} and {B} were playing. {S} threw the ball to",
    "When {A} and {B} arrived at the house, {S} sent a letter to",
    "Yesterday {A} and {B} visited the museum, and {S} showed a painting to",
    "After the meeting, {A} and {B} went home. {S} passed a note to",
)
NAMES = ("Mary", "John", "Tom", "Sarah", "James", "Anna", "David", "Emma", "Paul", "Lisa", "Mark", "Kate",
         "Peter", "Alice", "Michael", "Laura", "Daniel", "Rachel", "Robert", "Susan", "Chris", "Jessica",
         "Steven", "Linda")


@dataclass
class IOIPrompt:
    text: str
    corrupted: str  # the same with S2 := IO, so the answer flips
    io: str
    s: str
    io_id: int  # the token id of " IO"
    s_id: int


def single_token_names(lm, names=NAMES) -> list[str]:
    """The names that are one token with a leading space (" Mary") in the model's tokenizer."""
    tok = lm.tokenizer
    return [n for n in names if len(tok.encode(" " + n, add_special_tokens=False).ids) == 1]


def ioi_prompts(lm, n: int = 12, templates=TEMPLATES, names=None) -> list[IOIPrompt]:
    """n prompts: template i with its own name pair, ABBA for even i and BABA for odd i."""
    pool = single_token_names(lm, names or NAMES)
    if len(pool) < 2:
        raise ValueError("the tokenizer has fewer than 2 single-token names for the IOI prompts")
    out = []
    for i in range(n):
        io, s = pool[(2 * i) % len(pool)], pool[(2 * i + 1) % len(pool)]
        a, b = (io, s) if i % 2 == 0 else (s, io)
        t = templates[i % len(templates)]
        tid = lambda name: lm.tokenizer.encode(" " + name, add_special_tokens=False).ids[0]  # noqa: E731
        out.append(IOIPrompt(t.format(A=a, B=b, S=s), t.format(A=a, B=b, S=io), io, s, tid(io), tid(s)))
    return out


# ---------------------------------------------------------------------- direct logit attribution


@dataclass
class DLA:
    heads: np.ndarray  # [L, H]: each head's direct contribution to LD
    attn_bias: np.ndarray  # [L]: W^O's bias (0 without one), and the bias of a norm after attention
    ffn: np.ndarray  # [L]: each FFN's output (all its experts), and the bias of a norm after it
    embed: float  # the embeddings (token + learned positions)
    norm_bias: float  # the final LayerNorm's bias (0 for RMSNorm)
    logit_diff: float  # the model's own LD
    experts: np.ndarray | None = None  # [L, E]: a mixture's routed experts and (last column) shared expert
    approximation: str = ("every norm on the way (after a sublayer, and the final one) and the final soft-cap are "
                          "frozen at their values on this run (standard DLA); with them frozen, the pieces add up to "
                          "the logit difference")

    def total(self) -> float:
        return float(self.heads.sum() + self.attn_bias.sum() + self.ffn.sum() + self.embed + self.norm_bias)


@torch.no_grad()
def direct_logit_attribution(lm, text_or_ids, good: int, bad: int) -> DLA:
    """Each part of the final residual stream at the last position (model/core/residual.py: every head, W^O's
    bias, every FFN or expert, the embeddings, through any norm after a sublayer), projected through the
    final norm and soft-cap (frozen at this run) and the unembedding onto logit(good) - logit(bad)."""
    m = as_decoder(lm)
    ids = as_ids(lm, text_or_ids)[:1]
    L, H = m.cfg.n_layers, m.cfg.n_heads
    logits, tr = m.run_with_trace(ids, names=residual.lm_capture(m))
    last = [ids.shape[1] - 1]
    unembed = residual.Unembedding(m, tr, last)
    piece = lambda vec: float(unembed.logit(vec, [good, bad]) @ torch.tensor([1.0, -1.0], dtype=torch.float64))  # noqa: E731
    heads, attn_bias, ffn = np.zeros((L, H)), np.zeros(L), np.zeros(L)
    embed, experts = 0.0, {}
    for part in residual.lm_parts(m, tr, last):
        v = piece(part.vector)
        if part.kind in ("embed", "pos"):
            embed += v
        elif part.kind == "head":
            heads[part.layer, part.head] = v
        elif part.kind == "attn_bias" or (part.kind == "norm_bias" and "attention" in part.label):
            attn_bias[part.layer] += v
        else:  # the FFN, an expert, or the bias of the norm after the FFN
            ffn[part.layer] += v
            if part.kind == "expert":
                experts.setdefault(part.layer, []).append(v)
    n_exp = max((len(v) for v in experts.values()), default=0)
    grid = None
    if n_exp:
        grid = np.full((L, n_exp), np.nan)
        for layer, vals in experts.items():
            grid[layer, :len(vals)] = vals
    bias = float(unembed.bias_logit([good, bad])[0] @ torch.tensor([1.0, -1.0], dtype=torch.float64))
    return DLA(heads, attn_bias, ffn, embed, bias, float(logit_diff(logits, good, bad)[0]), grid)


# ---------------------------------------------------------------------- the experiment


@dataclass
class IOIResult:
    prompts: list[IOIPrompt]
    logit_diffs: list[float]  # per prompt
    mean_logit_diff: float
    dla: np.ndarray  # [L, H]: mean over the prompts
    top_heads: list[tuple[int, int, float]]  # (layer, head, mean DLA), largest first

    def accuracy(self) -> float:
        """Share of prompts where IO beats S."""
        return float(np.mean([d > 0 for d in self.logit_diffs]))


def ioi(lm, prompts: list[IOIPrompt] | None = None, top: int = 10) -> IOIResult:
    """LD on each prompt and the mean per-head DLA over them."""
    prompts = prompts or ioi_prompts(lm)
    dlas = [direct_logit_attribution(lm, p.text, p.io_id, p.s_id) for p in prompts]
    mean = np.mean([d.heads for d in dlas], axis=0)
    order = np.argsort(-mean, axis=None)[:top]
    H = mean.shape[1]
    return IOIResult(prompts, [d.logit_diff for d in dlas], float(np.mean([d.logit_diff for d in dlas])), mean,
                     [(int(i // H), int(i % H), float(mean.flat[i])) for i in order])


@dataclass
class LDAblation:
    heads: list[tuple[int, int]]
    base: float  # mean LD intact
    ablated: float  # mean LD with `heads` knocked out
    controls: list[list[tuple[int, int]]]
    control: list[float]  # mean LD with each random set knocked out
    mode: str


@torch.no_grad()
def mean_logit_diff(lm, prompts: list[IOIPrompt], hooks=None) -> float:
    m = as_decoder(lm)
    return float(np.mean([float(logit_diff(m.run_with_hooks(as_ids(lm, p.text), hooks=hooks), p.io_id, p.s_id)[0])
                          for p in prompts]))


def ablate_heads_ld(lm, result: IOIResult, k: int = 5, mode: str = "mean", n_controls: int = 3,
                    seed: int = 0) -> LDAblation:
    """Knock out the k heads with the largest mean DLA (mode "mean": z's mean over each prompt's
    positions; or "zero") and as many random other heads (the control)."""
    top = [(layer, h) for layer, h, _ in result.top_heads[:k]]
    controls = [random_heads(lm, len(top), exclude=top, seed=seed + i) for i in range(n_controls)]
    ld = mean_logit_diff_per_set(lm, result.prompts, [top, *controls], mode)
    return LDAblation(top, result.mean_logit_diff, ld[0], controls, ld[1:], mode)


@torch.no_grad()
def mean_logit_diff_per_set(lm, prompts: list[IOIPrompt], sets: list[list[tuple[int, int]]],
                            mode: str = "mean") -> list[float]:
    """The mean LD over the prompts with each set of (layer, head) knocked out, batched: per prompt ONE
    forward whose batch row r knocks out sets[r] (per-row hooks, model.interventions.ablate_heads_by_row),
    instead of one forward per prompt and set (issue 26 §3: 12 forwards for the page's 3 sets, not 36).
    Row r equals a forward under heads_hooks(lm, sets[r], mode) up to float32 rounding."""
    from model import interventions as iv

    m, names = as_decoder(lm), attention_names(lm)
    table: dict[str, list[tuple[int, int]]] = {}
    for r, heads in enumerate(sets):
        for layer, h in heads:
            table.setdefault(names[layer], []).append((r, int(h)))
    hooks = iv.ablate_heads_by_row(table, mode)
    lds = [logit_diff(m.run_with_hooks(as_ids(lm, p.text)[:1].expand(len(sets), -1), hooks=hooks), p.io_id, p.s_id)
           for p in prompts]  # each [len(sets)]
    return [float(x) for x in torch.stack(lds).mean(0)]
