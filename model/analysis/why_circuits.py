"""Circuits found live with `why.explain_score` (issue 39 §4): numbers a researcher can recompute.

Each function explains the scores of the heads a published recipe finds, sums the per-source terms over a few
query positions, and states one claim that passes a STATED test or says that no source clearly leads:

- `induction_composition`: the induction heads (Olsson et al.'s score on [BOS] + n random tokens × 2) attend to
  the token after the earlier copy rather than to the runner-up key. Whose key-side terms make that lead? The
  claim "the key-side lead comes from previous-token heads (K-composition)" passes only if the previous-token
  heads' summed share is the largest of the groups (previous-token heads, other heads, FFNs, embeddings, biases)
  and removing them all from the key input (live norm) changes the lead by what they were attributed, within
  why.py's tolerance.
- `ioi_query_sources`: the name movers (IOI's top direct-logit heads that attend from the last token to the
  indirect object) prefer IO over S: whose query-side terms make that lead, and are they S-inhibition-like heads
  (heads that attend from the last token to S2, Wang et al. 2022)?
- `sink_sources`: the heads that put most of their weight on token 0: whose key-side terms at token 0 earn it
  (the early FFN's massive activation, Sun et al. 2024), against the runner-up key.
- `learn_composition`: /learn's 2-layer attention-only run: the share of the induction head's key-side lead that
  layer 0's heads write, at every checkpoint, beside the weight-based K-composition score already drawn.

"Leads" (the one test for a single source): its summed term is ≥ LEAD_RATIO × the next source's (by |value|)
and the causal check (the source taken out of that side's input, live norm, summed over the positions) agrees
with its attribution within why.CHECK_REL / why.CHECK_ABS.

Shares are of the summed lead Σ_positions (s_ij − s_ij′): every source's side total divided by it, so over all
the sources of a side they sum to 1, up to the float32 rounding of the recorded scores (why's tolerance), signed: a
source that works against the lead has a negative share, and one group can give more than 100%.
Sentences are module-level plain format strings (LEADS_SENTENCE, GROUP_PASS, REASON_*, IND_*, ...) filled with
numbers. Each result's `sentence` is English; its `render(tr, label)` is the same sentence with every template and
word passed through `tr` (the UI's translation) and every source name through `label` (the UI's source names):
the page shows it in the user's language from the very numbers stored. `circuits(lm)` runs all three once per
model per process (model/analysis/shared.py's cache: every session of the page shares it).
No streamlit or plotly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import torch

from model.analysis import phenomena as PH
from model.analysis import why
from model.analysis.inputs import as_decoder, as_ids

LEAD_RATIO = 1.5  # a source "leads" when its term is ≥ 1.5 × the next one's (and the check agrees)
PREV_THRESHOLD = PH.THRESHOLDS["previous_token"]  # 0.5: a previous-token head (the phenomena page's threshold)
SINK_THRESHOLD = 0.5  # a sink head puts most (> half) of its weight on token 0, over rows 1..T-1
S_INHIBITION_THRESHOLD = 0.3  # an S-inhibition-like head puts ≥ 0.3 of its weight at END on S2
N_QUERIES = 8  # query positions explained per head

GROUPS = ("previous-token heads", "other heads", "FFNs", "embeddings", "biases")

LEADS_SENTENCE = ("{source} leads: {value:+.3g} of the summed lead {total:+.3g} ({share:.0%}), {ratio:.1f}× the next "
                  "source ({next}).")
NO_LEAD_SENTENCE = ("No source clearly leads: the top source {source} ({value:+.3g}) is {ratio:.2f}× the next "
                    "({next}, {next_value:+.3g}){check}; the test asks ≥ {need:.1f}× and a causal check that agrees.")
CHECK_DISAGREES = " and its causal check disagrees (attributed {attributed:+.3g}, actual {actual:+.3g})"
GROUP_PASS = ("{head} ({what}) {does} by a summed lead of {total:+.3g} over {n} {where}. {side} side by group: "
              "{groups}. {members} ({named}) give the most, {value:+.3g} ({share:.0%} of the lead); taking them out of "
              "the {side_l} input (live norm) changes the lead by {actual:+.3g} (attributed {attributed:+.3g}) and the "
              "weight by {dw:+.3f} on average: {mechanism}. {lead}")
GROUP_FAIL = ("{head} ({what}) {does} by a summed lead of {total:+.3g} over {n} {where}. {side} side by group: "
              "{groups}. The claim that {members} ({named}) lead ({mechanism}) fails: {reason}. {lead}")
REASON_NO_MEMBERS = "there are none"
REASON_NO_LEAD = "the head does not prefer the target key (the summed lead is ≤ 0)"
REASON_NOT_LARGEST = "{largest} give more ({largest_value:+.3g}) than they do ({value:+.3g})"
REASON_CHECK = ("they give the most ({value:+.3g}), but taking them out of the {side_l} input (live norm) changes the "
                "lead by {actual:+.3g}, not the attributed {attributed:+.3g} (the norms' nonlinearity), and the weight "
                "by {dw:+.3f} on average")
IOI_NONE = ("No name mover found: none of the top {k} direct-logit heads puts more weight from the last token on the "
            "indirect object than on either subject token, with at least {min_w:.2f} on it.")
SINK_WHAT = "sink {score:.2f}"
SINK_DOES = "puts its weight on token 0 rather than the runner-up key"
SINK_NONE = "No head puts more than {th:.0%} of its weight on token 0 on this text (the highest: {head} {score:.2f})."
LEARN_BEFORE = ("Up to step {step} the induction head 1.{head} prefers another key over the token after the "
                "earlier copy (the summed lead is ≤ 0 at {k} of the checkpoints): no lead to split there. ")
# the pieces of each circuit's claim sentence (GROUP_PASS / GROUP_FAIL's {what}, {does}, {where}, {members},
# {mechanism}), words the UI translates
IND_WHAT = "induction {score:.2f}"
IND_DOES = "attends to the token after the earlier copy rather than the runner-up key"
IND_WHERE = "queries of the repeated half"
PREV_GROUP = GROUPS[0]
K_COMPOSITION = "K-composition"
IOI_WHAT = "name mover, DLA {dla:+.2f}"
IOI_DOES = "prefers the indirect object over the subject token it weights more"
IOI_WHERE = "prompts"
S_INHIBITION_GROUP = "S-inhibition-like heads"
Q_COMPOSITION = "Q-composition"
SINK_WHERE = "queries"
FFN_GROUP = GROUPS[2]
MASSIVE = "the massive activation"
SIDES = {"key": "Key", "query": "Query"}  # "{side} side by group"
NONE = "none"
LEARN_SENTENCE = ("Layer 0's heads write {first:.0%} of the induction head 1.{head}'s key-side lead at step {s0} and "
                  "{last:.0%} at step {s1}; the weight-based K-composition of 0.{prev} into 1.{head} goes "
                  "{k0:.3f} → {k1:.3f}.")


# ---------------------------------------------------------------------- the shared machinery


def _same(s: str) -> str:
    return s


def head_name(layer: int, head: int) -> str:
    return f"L{layer} H{head}"


_HEAD = re.compile(r"^L(\d+) H(\d+)$")


def group_of(source: str, members: set[str], label: str = "previous-token heads") -> str:
    """The group a source name (why.py's: "embed", "L3 H5", "L3 ffn", "L3 attn bias", ...) belongs to: `label`
    for the circuit's own heads (`members`), else one of GROUPS[1:]."""
    if source in members:
        return label
    if _HEAD.match(source):
        return "other heads"
    if "bias" in source:
        return "biases"
    if source in ("embed", "positions", "token type"):
        return "embeddings"
    return "FFNs"  # "L3 ffn", experts, shared experts


@dataclass
class Removal:
    """Sources taken out of one side's input (live norm) at every explained position: summed over them."""

    sources: list[str]
    side: str
    attributed: float  # Σ the sources' side totals (their attributed part of the summed lead)
    actual: float  # Σ lead(with) − lead(without)
    weight_change: float  # Σ weight(i, j) with − without (mean: / n)
    n: int
    score_scale: float  # mean |recorded score of (i, j)|, for why.CHECK_ABS

    @property
    def agrees(self) -> bool:
        return _agree(self.attributed, self.actual, self.score_scale)

    @property
    def mean_weight_change(self) -> float:
        return self.weight_change / max(self.n, 1)


_agree = why.agrees
remove_sources = why.remove_sources  # a circuit's group taken out at once: the check's own recomputation


def removal(expls: list[why.ScoreExplanation], side: str, sources: list[str]) -> Removal:
    att = act = dw = 0.0
    for e in expls:
        totals = e.key_side if side == "key" else e.query_side
        att += sum(totals.get(s, 0.0) for s in sources)
        a, w = remove_sources(e, side, sources)
        act, dw = act + a, dw + w
    scale = float(np.mean([abs(e.score) for e in expls])) if expls else 1.0
    return Removal(list(sources), side, att, act, dw, len(expls), scale)


@dataclass
class Lead:
    """The summed lead of one head over its explained positions, split by source on one side."""

    layer: int
    head: int
    side: str  # "key" or "query"
    queries: list[int]
    keys: list[int]
    against: list[int]
    leads: list[float]  # each explanation's total (s_ij − s_ij′)
    total: float  # Σ leads
    sources: dict[str, float]  # Σ over positions of each source's side total (largest |value| first)
    groups: dict[str, float]  # Σ by group
    top: Removal | None  # the top source taken out (live norm), summed over the positions
    leads_test: bool  # the top source leads: ≥ LEAD_RATIO × the next and its check agrees
    sentence: str
    max_error: float  # max over positions of |Σ terms − recorded total|
    max_tolerance: float  # ... and of why's float32 bound
    explanations: list[why.ScoreExplanation] = field(default_factory=list, repr=False)

    def share(self, source: str) -> float:
        return self.sources.get(source, 0.0) / self.total if self.total else float("nan")

    def shares(self) -> dict[str, float]:
        return {s: v / self.total for s, v in self.sources.items()} if self.total else {}

    def group_shares(self) -> dict[str, float]:
        return {g: v / self.total for g, v in self.groups.items()} if self.total else {}

    def render(self, tr=_same, label=_same) -> str:
        """`sentence`, translated by `tr`, its source names by `label`."""
        names = list(self.sources)
        return _lead_sentence(self.sources, names, _ratio(self.sources, names), self.leads_test, self.total, self.top,
                              tr, label)


def runner_up(trace, module: str, head: int, query: int, key: int) -> int:
    """The key the head would otherwise pick: the highest-weighted key of row `query` other than `key`."""
    w = trace[f"{module}.weights"][0, head, query].double().clone()
    w[key] = -1.0
    w[query + 1:] = -1.0
    return int(torch.argmax(w))


def explain_lead(lm, ids, trace, layer: int, head: int, pairs: list[tuple[int, int]], side: str,
                 members: set[str], label: str = "previous-token heads") -> Lead:
    """Explain s_ij − s_ij′ (j′ the runner-up) at each (query, key) pair, sum one side's sources, apply the test."""
    module = f"decoder.layers.{layer}.self_attn"
    expls, against = [], []
    for i, j in pairs:
        jj = runner_up(trace, module, head, i, j)
        against.append(jj)
        expls.append(why.explain_score(lm, ids, layer, head, i, j, against=jj, trace=trace))
    return _lead_of(layer, head, side, expls, members, label)


def _lead_of(layer, head, side, expls, members: set[str], label: str = "previous-token heads") -> Lead:
    """A Lead from explanations already made (the IOI prompts each have their own ids and trace). `members` form
    the group `label` (GROUPS[0]'s slot: for IOI, the S-inhibition-like heads)."""
    sums: dict[str, float] = {}
    for e in expls:
        for s, v in (e.key_side if side == "key" else e.query_side).items():
            sums[s] = sums.get(s, 0.0) + v
    sums = dict(sorted(sums.items(), key=lambda kv: -abs(kv[1])))
    groups = {g: 0.0 for g in (label, *GROUPS[1:])}
    for s, v in sums.items():
        groups[group_of(s, members, label)] += v
    total = float(sum(e.total for e in expls))
    names = list(sums)
    top = removal(expls, side, names[:1]) if names else None
    ratio = _ratio(sums, names)
    ok = bool(top is not None and ratio >= LEAD_RATIO and top.agrees and np.sign(sums[names[0]]) == np.sign(total))
    return Lead(layer, head, side, [e.query for e in expls], [e.key for e in expls], [e.against for e in expls],
                [e.total for e in expls], total, sums, groups, top, ok,
                _lead_sentence(sums, names, ratio, ok, total, top), max(e.error for e in expls),
                max(e.tolerance() for e in expls), expls)


def _ratio(sums: dict[str, float], names: list[str]) -> float:
    return abs(sums[names[0]]) / abs(sums[names[1]]) if len(names) > 1 and sums[names[1]] else float("inf")


NOTHING = "No source: nothing was explained."


def _lead_sentence(sums, names, ratio, ok, total, top, tr=_same, label=_same) -> str:
    if not names:
        return tr(NOTHING)
    nxt = names[1] if len(names) > 1 else None
    nxt_label = label(nxt) if nxt is not None else tr(NONE)
    if ok:
        return tr(LEADS_SENTENCE).format(source=label(names[0]), value=sums[names[0]], total=total,
                                         share=sums[names[0]] / total, ratio=ratio, next=nxt_label)
    check = "" if top.agrees else tr(CHECK_DISAGREES).format(attributed=top.attributed, actual=top.actual)
    return tr(NO_LEAD_SENTENCE).format(source=label(names[0]), value=sums[names[0]], ratio=ratio, next=nxt_label,
                                       next_value=sums.get(nxt, 0.0), check=check, need=LEAD_RATIO)


def _largest_group(lead: Lead, exclude: str) -> tuple[str, float]:
    others = {g: v for g, v in lead.group_shares().items() if g != exclude}
    g = max(others, key=lambda k: others[k])
    return g, others[g]


def _full_trace(m, ids):
    """Every capture of one forward: the explanations, the runner-ups and the head statistics read it (short inputs)."""
    _, tr = m.run_with_trace(ids)
    return tr


def groups_phrase(lead: Lead, tr=_same) -> str:
    """"FFNs -96.1, previous-token heads +80.3, ..." (largest |value| first; groups that give nothing left out)."""
    items = sorted(((g, v) for g, v in lead.groups.items() if v != 0.0), key=lambda kv: -abs(kv[1]))
    return ", ".join(f"{tr(g)} {v:+.3g}" for g, v in items)


@dataclass
class GroupClaim:
    """"The lead comes from `group`": passes when the group's summed term is the largest of GROUPS' and taking all
    its sources out of the side's input together (live norm) agrees with their attribution (why's tolerance)."""

    group: str
    members: list[str]
    value: float  # Σ the members' terms over the positions
    share: float  # value / the summed lead
    largest_other: tuple[str, float]  # the largest other group and its value
    removal: Removal | None
    passes: bool
    reason: str  # "" when it passes; else REASON_* filled
    lead_total: float = 0.0  # the summed lead the claim splits (the test's "no lead" case)
    side: str = "key"


def group_claim(lead: Lead, group: str, members: list[str]) -> GroupClaim:
    value = lead.groups.get(group, 0.0)
    others = {g: v for g, v in lead.groups.items() if g != group}
    largest = max(others, key=lambda g: others[g])
    rem = removal(lead.explanations, lead.side, sorted(members)) if members else None
    share = value / lead.total if lead.total else float("nan")
    claim = GroupClaim(group, list(members), value, share, (largest, others[largest]), rem, False, "", lead.total,
                       lead.side)
    claim.reason = reason_text(claim)
    claim.passes = not claim.reason
    return claim


def reason_text(claim: GroupClaim, tr=_same) -> str:
    """Why the claim fails, "" when it passes (the test, in the order stated): translated by `tr`."""
    largest, largest_value = claim.largest_other
    r = claim.removal
    if not claim.members:
        return tr(REASON_NO_MEMBERS)
    if claim.lead_total <= 0:
        return tr(REASON_NO_LEAD)
    if claim.value <= largest_value:
        return tr(REASON_NOT_LARGEST).format(largest=tr(largest), largest_value=largest_value, value=claim.value)
    if not r.agrees:
        return tr(REASON_CHECK).format(value=claim.value, side_l=tr(claim.side), actual=r.actual,
                                       attributed=r.attributed, dw=r.mean_weight_change)
    return ""


def claim_sentence(claim: GroupClaim, lead: Lead, head: str, what: str, does: str, where: str, members: str,
                   named: str, mechanism: str, tr=_same, label=_same) -> str:
    """The claim's sentence. `what` .. `mechanism` come already in the sentence's language; `tr` translates the
    templates, the side and the group names, `label` the source names."""
    common = dict(head=head, what=what, does=does, total=lead.total, n=len(lead.leads), where=where,
                  side=tr(SIDES[lead.side]), side_l=tr(lead.side), groups=groups_phrase(lead, tr),
                  named=named or tr(NONE), mechanism=mechanism, lead=lead.render(tr, label))
    if claim.passes:
        r = claim.removal
        return tr(GROUP_PASS).format(**common, members=members[:1].upper() + members[1:], value=claim.value,
                                     share=claim.share, actual=r.actual,
                                     attributed=r.attributed, dw=r.mean_weight_change)
    return tr(GROUP_FAIL).format(**common, members=members, reason=reason_text(claim, tr))


# ---------------------------------------------------------------------- 1. induction: K-composition


@dataclass
class TopSource:
    source: str
    value: float  # Σ over the queries of its key-side term
    share: float  # value / the summed lead
    previous: float | None  # its previous-token score (a head), None for an FFN, the embeddings or a bias
    removal: Removal  # it alone taken out of the key input (live norm): change in the lead and in the weight


@dataclass
class InductionHead:
    layer: int
    head: int
    induction: float  # Olsson et al.'s score on this input
    lead: Lead  # the key-side lead over the runner-up, summed over the query positions
    prev_heads: list[tuple[str, float]]  # the previous-token heads before this layer (score ≥ PREV_THRESHOLD)
    top_sources: list[TopSource]  # the largest key-side sources, each with its own causal check
    claim: GroupClaim  # "the key-side lead comes from previous-token heads" and its test
    sentence: str = ""

    @property
    def passes(self) -> bool:
        return self.claim.passes

    def render(self, tr=_same, label=_same) -> str:
        return claim_sentence(self.claim, self.lead, head_name(self.layer, self.head),
                              tr(IND_WHAT).format(score=self.induction), tr(IND_DOES), tr(IND_WHERE), tr(PREV_GROUP),
                              _named(self.prev_heads), tr(K_COMPOSITION), tr, label)


def _named(heads: list[tuple[str, float]]) -> str:
    """The group's members as the sentence names them: the 4 with the highest score, "L16 H0 0.91, ..."."""
    return ", ".join(f"{x} {v:.2f}" for x, v in sorted(heads, key=lambda t: -t[1])[:4])


@dataclass
class InductionComposition:
    model: str
    n: int
    seed: int
    ids: torch.Tensor
    scores: dict  # phenomena.head_statistics on the input (induction, previous_token, ...)
    heads: list[InductionHead]
    test: str = (f"passes when the previous-token heads (previous-token score ≥ {PREV_THRESHOLD}) give the largest "
                 "summed share of the key-side lead of the groups " + ", ".join(GROUPS) + ", and taking them out "
                 "of the key input (live norm) changes the lead by their attribution within why's tolerance "
                 f"({why.CHECK_REL:.0%} of the larger, or {why.CHECK_ABS:g} × max(1, |score|))")

    @property
    def sentence(self) -> str:
        return " ".join(h.sentence for h in self.heads)

    def render(self, tr=_same, label=_same) -> str:
        return " ".join(h.render(tr, label) for h in self.heads)


def query_positions(n: int, k: int = N_QUERIES) -> list[int]:
    """k query positions spread evenly over the second copy n+1 .. 2n, both ends included. Each i has its
    induction target i − (n − 1), the token after the earlier copy of token i (n + 1 → 2)."""
    return sorted({int(round(x)) for x in np.linspace(n + 1, 2 * n, min(k, n))})


@torch.no_grad()
def induction_composition(lm, n: int = 30, seed: int = 0, top_heads: int = 3, queries: int = N_QUERIES,
                          top_sources: int = 3) -> InductionComposition:
    m = as_decoder(lm)
    ids = PH.induction_sequence(lm, n, 1, seed)
    tr = _full_trace(m, ids)
    stats = PH.head_statistics(tr, period=n)
    prev = stats["previous_token"].scores
    out = []
    for layer, head, score in stats["induction"].top(top_heads):
        prev_heads = [(head_name(li, h), float(prev[li, h])) for li in range(layer) for h in range(prev.shape[1])
                      if prev[li, h] >= PREV_THRESHOLD]
        pset = {p for p, _ in prev_heads}
        pairs = [(i, i - (n - 1)) for i in query_positions(n, queries)]
        lead = explain_lead(lm, ids, tr, layer, head, pairs, "key", pset)
        shares = lead.shares()
        tops = []
        for s in list(lead.sources)[:top_sources]:
            mh = _HEAD.match(s)
            tops.append(TopSource(s, lead.sources[s], shares.get(s, float("nan")),
                                  float(prev[int(mh[1]), int(mh[2])]) if mh else None,
                                  removal(lead.explanations, "key", [s])))
        claim = group_claim(lead, PREV_GROUP, sorted(pset))
        h = InductionHead(layer, head, float(score), lead, prev_heads, tops, claim)
        h.sentence = h.render()
        out.append(h)
    return InductionComposition(getattr(lm, "name", type(m).__name__), n, seed, ids, stats, out)


# ---------------------------------------------------------------------- 2. IOI: the name movers' queries


@dataclass
class NameMover:
    layer: int
    head: int
    dla: float  # mean direct logit attribution to logit(IO) − logit(S)
    weight_io: float  # mean weight from END on IO
    lead: Lead  # query-side lead of IO over the S token it weights more, summed over the prompts
    s_inhibition: list[tuple[str, float]]  # earlier heads with mean weight END → S2 ≥ S_INHIBITION_THRESHOLD
    claim: GroupClaim  # "the query-side lead comes from S-inhibition-like heads"
    sentence: str = ""

    @property
    def passes(self) -> bool:
        return self.claim.passes

    def render(self, tr=_same, label=_same) -> str:
        return claim_sentence(self.claim, self.lead, head_name(self.layer, self.head),
                              tr(IOI_WHAT).format(dla=self.dla), tr(IOI_DOES), tr(IOI_WHERE), tr(S_INHIBITION_GROUP),
                              _named(self.s_inhibition), tr(Q_COMPOSITION), tr, label)


@dataclass
class IOIQuerySources:
    model: str
    n_prompts: int
    top_dla: list[tuple[int, int, float]]
    movers: list[NameMover]
    sentence: str
    test: str = ("a name mover: a top direct-logit head whose mean weight from END is larger on IO than on S1 and "
                 "S2; an S-inhibition-like head: an earlier head with mean weight END → S2 ≥ "
                 f"{S_INHIBITION_THRESHOLD}; the claim (Q-composition) passes when they give the largest group term "
                 "of the query-side lead of IO over S and taking them out of the query input (live norm) agrees "
                 "within why's tolerance")
    k: int = 10  # the top direct-logit heads searched
    min_weight: float = 0.2  # a name mover's least mean weight on IO
    prompts: list[str] = field(default_factory=list)  # the prompts explained, in the order of each lead's positions

    def render(self, tr=_same, label=_same) -> str:
        if not self.movers:
            return tr(IOI_NONE).format(k=self.k, min_w=self.min_weight)
        return " ".join(x.render(tr, label) for x in self.movers)


def _positions(ids: torch.Tensor, tok: int) -> list[int]:
    return [int(x) for x in torch.nonzero(ids[0] == tok).flatten()]


@torch.no_grad()
def ioi_query_sources(lm, n_prompts: int = 6, top_dla: int = 10, movers: int = 3, min_weight: float = 0.2
                      ) -> IOIQuerySources:
    from model.analysis import ioi as IOI

    m = as_decoder(lm)
    prompts = IOI.ioi_prompts(lm, n_prompts)
    res = IOI.ioi(lm, prompts, top=top_dla)
    runs, texts = [], []
    for p in prompts:
        ids = as_ids(lm, p.text)[:1]  # the ids ioi.direct_logit_attribution reads
        tr = _full_trace(m, ids)
        io, s = _positions(ids, p.io_id), _positions(ids, p.s_id)
        if len(io) != 1 or len(s) != 2:
            continue
        runs.append((ids, tr, io[0], s[0], s[1]))
        texts.append(p.text)
    L, H = m.cfg.n_layers, m.cfg.n_heads
    w_io, w_s1, w_s2 = (np.zeros((L, H)) for _ in range(3))
    for ids, tr, io, s1, s2 in runs:
        end = ids.shape[1] - 1
        for li in range(L):
            w = tr[f"decoder.layers.{li}.self_attn.weights"][0, :, end].double().numpy()
            w_io[li] += w[:, io] / len(runs)
            w_s1[li] += w[:, s1] / len(runs)
            w_s2[li] += w[:, s2] / len(runs)
    found = [(li, h, d) for li, h, d in res.top_heads if d > 0 and w_io[li, h] >= min_weight
             and w_io[li, h] > max(w_s1[li, h], w_s2[li, h])][:movers]
    out = []
    for li, h, d in found:
        sinh = [(head_name(a, b), float(w_s2[a, b])) for a in range(li) for b in range(H)
                if w_s2[a, b] >= S_INHIBITION_THRESHOLD]
        sset = {x for x, _ in sinh}
        expls = []
        for ids, tr, io, s1, s2 in runs:
            end = ids.shape[1] - 1
            w = tr[f"decoder.layers.{li}.self_attn.weights"][0, h, end]
            other = s1 if w[s1] >= w[s2] else s2  # the subject token this head would otherwise read
            expls.append(why.explain_score(lm, ids, li, h, end, io, against=other, trace=tr))
        lead = _lead_of(li, h, "query", expls, sset, S_INHIBITION_GROUP)
        claim = group_claim(lead, S_INHIBITION_GROUP, sorted(sset))
        mv = NameMover(li, h, float(d), float(w_io[li, h]), lead, sinh, claim)
        mv.sentence = mv.render()
        out.append(mv)
    r = IOIQuerySources(getattr(lm, "name", type(m).__name__), len(runs), res.top_heads, out, "", k=top_dla,
                        min_weight=min_weight, prompts=texts)
    r.sentence = r.render()
    return r


# ---------------------------------------------------------------------- 3. sinks: what earns token 0


SINK_TEXT = ("The old lighthouse keeper climbed the narrow stairs every evening, lit the lamp, and watched the ships "
             "pass safely through the dark water below.")


@dataclass
class SinkHead:
    layer: int
    head: int
    sink: float  # mean weight on token 0 over rows 1..T-1
    lead: Lead  # key-side lead of token 0 over the runner-up key, summed over the query positions
    claim: GroupClaim  # "token 0's key-side lead comes from the FFNs" (the massive activation) and its test
    sentence: str = ""

    def render(self, tr=_same, label=_same) -> str:
        return claim_sentence(self.claim, self.lead, head_name(self.layer, self.head),
                              tr(SINK_WHAT).format(score=self.sink), tr(SINK_DOES), tr(SINK_WHERE), tr(FFN_GROUP),
                              ", ".join(label(x) for x in self.claim.members[:4]), tr(MASSIVE), tr, label)


@dataclass
class SinkSources:
    model: str
    text: str
    heads: list[SinkHead]
    sentence: str
    test: str = (f"sink heads: mean weight on token 0 over rows 1..T-1 > {SINK_THRESHOLD} (layers ≥ 1: layer 0's "
                 "key is the embedding alone); the claim that the FFNs earn token 0's lead passes when their summed "
                 "key-side term is the largest group's and taking every FFN out of the key input (live norm) agrees "
                 f"within why's tolerance; a single key source leads when it is ≥ {LEAD_RATIO}× the next and its check "
                 "agrees")
    best: tuple[int, int, float] | None = None  # the highest sink score (layer, head, score): SINK_NONE's

    def render(self, tr=_same, label=_same) -> str:
        if self.heads:
            return " ".join(x.render(tr, label) for x in self.heads)
        li, h, s = self.best
        return tr(SINK_NONE).format(th=SINK_THRESHOLD, head=head_name(li, h), score=s)


@torch.no_grad()
def sink_sources(lm, text: str = SINK_TEXT, top_heads: int = 3, queries: int = N_QUERIES) -> SinkSources:
    m = as_decoder(lm)
    ids = as_ids(lm, text)[:1]
    tr = _full_trace(m, ids)
    stats = PH.head_statistics(tr)
    T = ids.shape[1]
    rows = sorted({int(round(x)) for x in np.linspace(max(1, T // 4), T - 1, queries)})
    chosen = [(li, h, s) for li, h, s in stats["sink"].top(top_heads) if s > SINK_THRESHOLD and li > 0]
    out = []
    for li, h, s in chosen:
        lead = explain_lead(lm, ids, tr, li, h, [(i, 0) for i in rows], "key", set())
        ffns = [x for x in lead.sources if group_of(x, set()) == FFN_GROUP]
        claim = group_claim(lead, FFN_GROUP, ffns)
        sh = SinkHead(li, h, float(s), lead, claim)
        sh.sentence = sh.render()
        out.append(sh)
    li, h, s = stats["sink"].top(1)[0]
    r = SinkSources(getattr(lm, "name", type(m).__name__), text, out, "", best=(int(li), int(h), float(s)))
    r.sentence = r.render()
    return r


# ---------------------------------------------------------------------- 4. /learn: K-composition over training


@dataclass
class LearnComposition:
    steps: list[int]
    head: int  # layer 1's induction head (learn.summary's: the heatmap's brightest at the phase change)
    prev_head: int  # layer 0's previous-token head (learn.summary's)
    lead: list[float]  # Σ key-side lead over the runner-up, per checkpoint
    layer0: list[float]  # Σ layer 0's heads' key-side terms of it (defined at every checkpoint, a lead or not)
    layer0_share: list[float]  # share of it from layer 0's heads (NaN where the lead is ≤ 0: no lead to split)
    per_head_share: np.ndarray  # [checkpoints, H0]: each layer-0 head's share
    kcomp: list[float]  # the weight-based K-composition of prev_head into head (learn.Scores.kcomp)
    sentence: str
    test: str = "shares are Σ_positions key-side terms / Σ_positions lead; NaN where the summed lead is ≤ 0"


@torch.no_grad()
def learn_composition(run=None, checkpoints: list[int] | None = None, queries: int = N_QUERIES) -> LearnComposition:
    from model.toy import learn as LR

    run = run if run is not None else LR.load_run()["attn2"]
    s = run.settings
    sm = LR.summary(run)
    idx = list(range(len(run.steps))) if checkpoints is None else list(checkpoints)
    ids = LR.probe_ids(s)[:1]
    n, H = s.n, s.heads
    pairs = [(i, i - (n - 1)) for i in query_positions(n, queries)]
    layer0 = [head_name(0, g) for g in range(H)]
    leads, l0, share, per, kc = [], [], [], np.full((len(idx), H), np.nan), []
    for r, c in enumerate(idx):
        m = run.model_at(c)
        tr = _full_trace(m, ids)
        lead = explain_lead(m, ids, tr, 1, sm.head, pairs, "key", set())
        leads.append(lead.total)
        l0.append(sum(lead.sources.get(x, 0.0) for x in layer0))
        ok = lead.total > 0
        share.append(l0[-1] / lead.total if ok else float("nan"))
        if ok:
            per[r] = [lead.share(x) for x in layer0]
        kc.append(float(run.scores[c].kcomp[sm.prev_head, sm.head]))
    steps = [run.steps[c] for c in idx]
    fin = [k for k, v in enumerate(share) if np.isfinite(v)]
    a, b = (fin[0], fin[-1]) if fin else (0, len(idx) - 1)
    sentence = LEARN_SENTENCE.format(first=share[a] if fin else float("nan"), last=share[b] if fin else float("nan"),
                                     head=sm.head, prev=sm.prev_head, s0=steps[a], s1=steps[b], k0=kc[a], k1=kc[b])
    before = [k for k, v in enumerate(leads) if v <= 0]
    if before:
        sentence = LEARN_BEFORE.format(step=steps[before[-1]], head=sm.head, k=len(before)) + sentence
    return LearnComposition(steps, sm.head, sm.prev_head, leads, l0, share, per, kc, sentence)


# ---------------------------------------------------------------------- all three, once per model


@dataclass
class Circuits:
    """What /phenomena's "Why do these heads look there?" shows: the three circuits on one model, defaults."""

    induction: InductionComposition
    ioi: IOIQuerySources
    sinks: SinkSources


def circuits(lm) -> Circuits:
    """Induction (K-composition), the IOI name movers' query-side sources and the sinks' key-side sources on `lm`
    with the defaults, once per model per process (model/analysis/shared.py: read-only, single flight): every
    session of /phenomena shares the result. ~15 s of CPU on SmolLM2, ~22 s on Gemma 3 (2 quiet cores)."""
    from model.analysis import shared

    return shared.cached("why_circuits", lm, (), lambda: Circuits(induction_composition(lm), ioi_query_sources(lm),
                                                                  sink_sources(lm)))
