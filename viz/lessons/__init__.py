"""Short lessons: ten that follow the paper and the seeds, six on a real language model (SmolLM2), one on a model
trained in the lab (induction heads forming: the Watch attention learn run), one on Gemma 3's horizon, and one on
why a head looks where it does (19: the induction head's score split by source, model/analysis/why.py), and one on
an image read as patches (20: the lab's vision transformer, model/families/vit.py). Each has
text, one live view, a task, a question. Nothing counts them by hand: the page reads len(LESSONS).

Pure (no streamlit): a lesson's `live(data, param)` turns the model's own numbers (a `Trace`, a
decode, a schedule) into a `Live` — the figure drawn by the app's figure builders, the answer
options and the correct one, computed from the same numbers (never hard-coded), and a feedback
line. The page (viz/pages/lessons.py) loads `data` for the lesson's `source` and draws it.

Every English string is a catalog msgid (N_ here, t() when drawn: see viz/locale/zh/lessons.po).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go

from model.toy.tasks import date_fields
from viz.figures import attention as F
from viz.figures import decode as FD
from viz.figures import pretrained as FP
from viz.i18n import N_, current_lang, t


@dataclass
class Live:
    """What a lesson shows for the current data: figure, question options, the correct option."""

    figure: go.Figure
    options: list[str]  # stable ids (the radio's values)
    labels: dict[str, str]  # id -> text shown
    correct: tuple[str, ...]  # every accepted option (near-ties count); empty: no question, see `note`
    feedback: str  # shown after a correct answer: the model's numbers behind it
    note: str = ""  # why the question does not apply
    args: dict = field(default_factory=dict)  # fills the question's {placeholders}


@dataclass(frozen=True)
class Lesson:
    slug: str
    title: str
    body: str  # a few sentences of markdown
    try_this: str
    question: str  # may hold {placeholders}: `Live.args` fills them
    page: str  # the full page for more
    page_query: dict = field(default_factory=dict)  # URL params that page reads (its widgets' state ids)
    source: str = "trace"  # what the page loads: trace | decode | bert | lm (lm_compute on `checkpoint`) | none
    checkpoint: str | None = None
    text: str = ""  # the default input
    param: tuple | None = None  # (kind, label, options, default): a second control (slider)
    param_query: str | None = None  # the full page's URL parameter that takes the param's value
    live: Callable[..., Live] = field(default=None, repr=False)


# ---------------------------------------------------------------- helpers


def _options(values: Sequence) -> tuple[list[str], dict[str, str]]:
    ids = [str(v) for v in dict.fromkeys(values)]
    return ids, {i: i for i in ids}


def _tokens(trace, side: str) -> list[str]:
    toks = trace.meta.get(f"{side}_tokens") or []
    return list(toks[0]) if toks and isinstance(toks[0], list) else list(toks)


def closest(value: float, candidates: Mapping[str, float], log: bool = False) -> str:
    """The id whose number is closest to `value` (on a log scale if `log`)."""
    f = (lambda x: math.log(max(x, 1e-12))) if log else (lambda x: x)
    return min(candidates, key=lambda k: abs(f(candidates[k]) - f(value)))


# ---------------------------------------------------------------- 1. tokens and embeddings


def live_tokens(trace, param=None) -> Live:
    toks = _tokens(trace, "src")
    fig = F.embedding_sum_figure(trace["encoder.embed.tok"][0], trace["encoder.embed.pos"],
                                 trace["encoder.embed.out"][0], toks, scale_note=" ×√d_model")
    n = len(toks)
    ids, labels = _options(sorted({max(1, n - 1), n, n + 1, n + 2}))
    return Live(fig, ids, labels, (str(n),), t("The encoder reads {n} tokens: {tokens}", n=n, tokens=" · ".join(toks)))


# ---------------------------------------------------------------- 2. positional encoding


def live_positions(trace, param=64) -> Live:
    from model.families.transformer import sinusoidal_encoding  # the model's own PE function

    d = trace["encoder.embed.pos"].shape[-1]
    pe = sinusoidal_encoding(int(param), d).numpy()
    diag = float(np.mean(np.einsum("pd,pd->p", pe.astype(np.float64), pe)))
    cands = {"d": float(d), "half": d / 2, "one": 1.0, "sqrt": math.sqrt(d)}
    labels = {"d": f"d_model = {d}", "half": f"d_model / 2 = {d // 2}", "one": "1",
              "sqrt": f"√d_model ≈ {math.sqrt(d):.3g}"}
    fb = t("Every sin/cos pair adds sin² + cos² = 1, and there are d_model/2 = {h} pairs: the diagonal is {v:.6g}.",
           h=d // 2, v=diag)
    return Live(F.pe_similarity(pe), list(cands), labels, (closest(diag, cands),), fb)


# ---------------------------------------------------------------- 3. one head, step by step

HEAD_MODULE = "encoder.layers.0.self_attn"


def live_one_head(trace, param=0) -> Live:
    head = int(param)
    fig = F.score_pipeline(trace, HEAD_MODULE, head)
    w = F.arr(trace[f"{HEAD_MODULE}.weights"])[0, head, 0]  # query 0's row, (Lk,)
    labels = F.token_labels(_tokens(trace, "src"), len(w))
    best = int(np.argmax(w))
    fb = t("Query 0 gives {w:.3f} of its attention to key {k}; its row sums to {s:.6f}.",
           w=float(w[best]), k=labels[best], s=float(w.sum()))
    return Live(fig, labels, {x: x for x in labels}, (labels[best],), fb)


# ---------------------------------------------------------------- 4. why √d_k

VARIANCE_SAMPLES = 4000


def dot_variance(d_k: int, n: int = VARIANCE_SAMPLES, seed: int = 0) -> float:
    """Var(q·k) of the samples `figures.variance_demo(d_k, n, seed)` draws (same generator, same order)."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((n, d_k)), rng.standard_normal((n, d_k))
    return float((q * k).sum(-1).var())


def live_sqrt_dk(_data, param=64) -> Live:
    d_k = int(param)
    var = dot_variance(d_k)
    cands = {"one": 1.0, "sqrt": math.sqrt(d_k), "d": float(d_k), "d2": float(d_k) ** 2}
    labels = {"one": "1", "sqrt": f"√d_k ≈ {math.sqrt(d_k):.3g}", "d": f"d_k = {d_k}", "d2": f"d_k² = {d_k**2}"}
    fb = t("The sampled variance of q·k is {v:.4g} ≈ d_k = {d}; divided by √d_k it is {s:.3g} ≈ 1.",
           v=var, d=d_k, s=var / d_k)
    return Live(F.variance_demo(d_k, VARIANCE_SAMPLES), list(cands), labels, (closest(var, cands, log=True),), fb)


# ---------------------------------------------------------------- 5. multi-head: which head aligns the months?


def month_share(trace, layer: int) -> np.ndarray | None:
    """Per head of decoder layer `layer`'s cross-attention: the mean weight the queries that write
    the month digits (ISO positions 5, 6) put on the source characters of the month. None when the
    source is not a date in a trained format."""
    src_text = trace.meta.get("text", "")
    span = date_fields(src_text).get("month")
    nxt = list(trace.meta.get("next_tokens") or [])
    if span is None or len(nxt) < 7:
        return None
    w = F.arr(trace[f"decoder.layers.{layer}.cross_attn.weights"])[0]  # (H, T, S)
    return w[:, 5:7, span[0]:span[1]].sum(-1).mean(-1)  # (H,)


TIE = 0.02  # heads within 2 points of the best month share are right answers too


def live_multi_head(trace, param=0) -> Live:
    layer = min(int(param), trace.meta["config"]["n_decoder_layers"] - 1)
    name = f"decoder.layers.{layer}.cross_attn"
    fig = F.heads_grid(trace, name)
    share = month_share(trace, layer)
    ids = [str(h) for h in range(F.arr(trace[f"{name}.weights"]).shape[1])]
    labels = {h: t("head {h}", h=h) for h in ids}
    if share is None:
        return Live(fig, ids, labels, (), "", t("Type a date in a trained format (e.g. 3 november 2023) "
                                                 "to get this question."))
    best = int(np.argmax(share))
    accepted = tuple(str(h) for h in range(len(share)) if share[h] >= share[best] - TIE)
    fb = t("Head {h} puts {w:.0%} of the month digits' attention on the month's characters "
           "(the other heads: {others}).", h=best, w=float(share[best]),
           others=", ".join(f"{v:.0%}" for i, v in enumerate(share) if i != best))
    return Live(fig, ids, labels, accepted, fb)


# ---------------------------------------------------------------- 6. masks

MASK_MODULE = "decoder.layers.0.self_attn"


def live_masks(trace, param=None) -> Live:
    fig = F.mask_figure(trace, MASK_MODULE, 0)
    blocked = F.arr(trace[f"{MASK_MODULE}.mask"])[0, 0] > 0.5  # (T, T)
    T = blocked.shape[0]
    n = int(blocked.sum())
    w = F.arr(trace[f"{MASK_MODULE}.weights"])[0]  # (H, T, T)
    ids, labels = _options(sorted({T * (T - 1) // 2, T * (T + 1) // 2, T * T, T}))
    fb = t("{n} of the {T}×{T} cells are blocked (above the diagonal); the largest weight there is {m:g}.",
           n=n, T=T, m=float(w[:, blocked].max(initial=0.0)))
    return Live(fig, ids, labels, (str(n),), fb)


# ---------------------------------------------------------------- 7. cross-attention alignment


def alignment_rows(trace) -> np.ndarray:
    """Last decoder layer's cross-attention, mean over heads: [T, S], row t = the position that wrote
    next_tokens[t]."""
    n = trace.meta["config"]["n_decoder_layers"]
    return F.arr(trace[f"decoder.layers.{n - 1}.cross_attn.weights"])[0].mean(0)


def live_alignment(trace, param=None) -> Live:
    rows, src, nxt = alignment_rows(trace), _tokens(trace, "src"), list(trace.meta.get("next_tokens") or [])
    fig = FD.alignment_figure(rows, F.step_labels(_tokens(trace, "tgt"), nxt), src,
                              title=t("Cross-attention, last layer, mean of the heads"))
    words = [i for i, w in enumerate(nxt) if w != "[EOS]" and not w.startswith("##")]
    if not words:
        return Live(fig, [], {}, (), "", t("The model wrote no word for this input."))
    q = words[-1]  # the last word: for a time word it is where the reordering shows
    labels = F.token_labels(src, len(src))
    best = int(np.argmax(rows[q]))
    fb = t("Output “{w}” gives {p:.0%} of its cross-attention to source {k}.", w=nxt[q], p=float(rows[q, best]),
           k=labels[best])
    return Live(fig, labels, {x: x for x in labels}, (labels[best],), fb, args={"word": nxt[q]})


# ---------------------------------------------------------------- 8. teacher forcing and step by step


def forced_vs_free(trace, steps) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(tokens, step-by-step p, teacher-forced p) of each generated token, [EOS] included."""
    logits = F.arr(trace["logits"])[0].astype(np.float64)  # (T, V)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    n = min(len(steps), probs.shape[0])
    forced = np.array([probs[i, steps[i].token_id] for i in range(n)])
    free = np.array([float(s.prob) for s in steps[:n]])
    return [s.token for s in steps[:n]], free, forced


TF_BINS = {"zero": 1e-4, "small": 1e-2, "large": 1.0}  # upper bounds of max |difference|


def live_teacher_forcing(data, param=None) -> Live:
    trace, steps = data
    toks, free, forced = forced_vs_free(trace, steps)
    fig = FD.agreement_figure(toks, free, forced)
    diff = float(np.abs(free - forced).max(initial=0.0))
    correct = next(k for k, hi in TF_BINS.items() if diff < hi or k == "large")
    labels = {"zero": t("0, up to float rounding (< 0.0001)"), "small": t("small (0.0001 to 0.01)"),
              "large": t("large (over 0.01)")}
    fb = t("Largest difference over {n} tokens: {d:.2g}. One parallel pass under the look-ahead mask computes "
           "what step-by-step decoding computes.", n=len(toks), d=diff)
    return Live(fig, list(TF_BINS), labels, (correct,), fb)


# ---------------------------------------------------------------- 9. Noam warmup

NOAM_D_MODEL = 512


def noam_peak(d_model: int, warmup: int) -> int:
    steps = np.arange(1, 4 * warmup + 1)
    return int(steps[np.argmax(F.noam_curve(steps, d_model, warmup))])


def live_noam(_data, param=4000) -> Live:
    warmup = int(param)
    peak = noam_peak(NOAM_D_MODEL, warmup)
    ids, labels = _options(sorted({warmup // 2, warmup, 2 * warmup, round(math.sqrt(warmup))}))
    lr = float(F.noam_curve(np.array([peak]), NOAM_D_MODEL, warmup)[0])
    fb = t("The curve rises linearly until step {p} = warmup, peaks at lr = {lr:.3g}, then decays as step^-0.5.",
           p=peak, lr=lr)
    return Live(F.noam_figure(NOAM_D_MODEL, warmup), ids, labels, (str(peak),), fb)


# ---------------------------------------------------------------- 10. BERT: "it" -> "animal"

BERT_TIRED = "The animal didn't cross the street because it was too tired"
BERT_WIDE = "The animal didn't cross the street because it was too wide"


def it_weights(trace) -> tuple[np.ndarray, np.ndarray]:
    """([L, H] weight it→animal, [L, H] weight it→street), WordPiece pieces merged per word."""
    groups = FP.word_groups(trace.meta["word_ids"])
    words = [w.lower() for w in FP.group_labels(trace.meta["src_tokens"], groups, trace.meta["text"],
                                                trace.meta["offsets"])]
    rows = FP.attention_from(trace, groups[words.index("it")], groups)  # (L, H, G)
    return rows[..., words.index("animal")], rows[..., words.index("street")]


def live_bert(data, param=None) -> Live:
    tired, wide = data
    a1, s1 = it_weights(tired)
    a2, s2 = it_weights(wide)
    fig = FP.head_finder_figure(a1, s1, "it", "animal", "street", metric="difference")
    layer, head = np.unravel_index(int(np.argmax(a1)), a1.shape)
    more_street = bool(s2[layer, head] > a2[layer, head])
    labels = {"street": t("yes: it moves to “street”"), "animal": t("no: it still looks at “animal”")}
    fb = t("Layer {l}, head {h}: tired → animal {a1:.2f}, street {s1:.2f}; wide → animal {a2:.2f}, street {s2:.2f}.",
           l=int(layer), h=int(head), a1=float(a1[layer, head]), s1=float(s1[layer, head]),
           a2=float(a2[layer, head]), s2=float(s2[layer, head]))
    return Live(fig, list(labels), labels, ("street" if more_street else "animal",), fb,
                args={"layer": int(layer), "head": int(head)})


# ---------------------------------------------------------------- 11–16: a real language model (SmolLM2)

LM_NAME = "smollm2"  # the model lessons 11–16 open (the page says how to install it when it is missing)
IOI_TEXT = "When Mary and John went to the store, John gave a drink to"
LENS_TEXT = "The capital of France is"
LENS_COLUMNS = 12  # the lens lesson draws the last this-many positions


def lm_compute(slug: str, lm, text: str):
    """The numbers a language-model lesson draws, from model/analysis (the page caches them per input):
    `lm` is a model.loaders.lm.LanguageModel."""
    from model.analysis import shared  # computed once per server, shared with /phenomena's defaults

    if slug == "llm-2017":
        return lm.model.describe()
    if slug == "sinks":
        return shared.sink_effect(lm, text)
    if slug == "induction":
        return shared.induction(lm, n=50, seed=0)
    if slug == "ioi":
        return shared.ioi(lm)
    if slug == "lens":
        return shared.logit_lens(lm, text)
    if slug == "horizon":
        return shared.horizon(lm)
    if slug == "not-explanation":
        from model.analysis import flow

        return flow.sink_head(lm, text)
    if slug == "why-here":
        return why_induction(lm)
    raise ValueError(f"no language-model lesson {slug!r}")


@dataclass
class WhyInduction:
    """Lesson 19's numbers: the top induction head on the repeated random tokens, one query of the second copy,
    its score at the induction target split by source against the runner-up key (model.analysis.why), the causal
    check, and every head's previous-token score on the same input."""

    layer: int
    head: int
    induction: float  # the head's induction score (Olsson's, on this input)
    query: int
    key: int  # the token after the query token's earlier copy
    against: int | None  # the row's highest weight other than `key`
    expl: object  # model.analysis.why.ScoreExplanation of s(query, key) − s(query, against)
    check: object  # model.analysis.why.Check of it
    previous_token: np.ndarray  # [L, H] previous-token scores on this input
    tokens: list[str]


def why_induction(lm, n: int = 50, seed: int = 0) -> WhyInduction:
    """The induction head's key-side sources on [BOS] + n random tokens + the same n (the induction lesson's
    input): why it attends to the token after the earlier copy rather than anywhere else."""
    from model.analysis import shared
    from model.analysis import why as W
    from viz.figures import why as FW

    res = shared.induction(lm, n=n, seed=seed)
    layer, head, score = res.scores["induction"].top(1)[0]
    ids = res.ids[:1]
    query = 2 * n  # the last token of the second copy; its earlier copy is at n, followed by n + 1
    key = query - n + 1
    m = lm.model
    name = f"decoder.layers.{layer}.self_attn"
    _, tr = m.run_with_trace(ids, names=W.lazy_names(m, layer), lazy=True, fast=True, last_only=True)
    against = FW.runner_up(tr.attention(name, head, rows=query)[0].double().numpy(), key)
    expl = W.explain_score(lm, ids, layer, head, query, key, against=against, trace=tr)
    toks = [lm.decode([i]) for i in ids[0].tolist()]
    return WhyInduction(int(layer), int(head), float(score), query, key, against, expl,
                        W.check_explanation(expl, top=3), res.scores["previous_token"].scores, toks)


def _heads_ids(pairs) -> tuple[list[str], dict[str, str]]:
    ids = [f"{layer}-{head}" for layer, head in sorted(dict.fromkeys(pairs))]
    return ids, {i: t("layer {l} · head {h}", l=i.split("-")[0], h=i.split("-")[1]) for i in ids}


def live_llm_2017(desc, param=None) -> Live:
    from viz.figures import phenomena as FPH

    blocks = desc["blocks"]
    attn = next(iter(desc["attention"].values()))
    H, H_kv = attn["n_heads"], attn["n_kv_heads"]
    r = H // H_kv
    base = f"{blocks.get('rope_base', 0):g}"
    pos = {"rotary": t("rotary (RoPE, base {b}): q and k rotated by their position", b=base),
           "learned": t("learned, added to the embeddings"),
           "sinusoidal": t("sinusoidal, added to the embeddings")}.get(blocks["positional"], blocks["positional"])
    norm = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}.get(blocks["norm"], blocks["norm"])
    norm += ", " + (t("before each sublayer (pre-LN)") if blocks.get("norm_first") else t("after each sublayer "
                                                                                           "(post-LN)"))
    ffn = (t("gated ({act}): W₂(act(W_g x) ⊙ W₁x)", act=blocks["activation"]) if blocks["ffn"] == "gated"
           else t("{act}, two layers", act=blocks["activation"]))
    stack_names = {"encoder": t("encoder"), "decoder": t("decoder")}  # the description's keys, shown translated
    stacks = " + ".join(stack_names.get(k, k) for k in desc["stacks"])
    rows = [
        (t("stacks"), t("encoder + decoder, with cross-attention"), stacks),
        (t("layers × d_model"), "6 × 512", f"{desc['stacks']['decoder']['layers']} × {blocks['d_model']}"),
        (t("position encoding"), t("sinusoidal, added to the embeddings"), pos),
        (t("attention heads"), t("8 heads, each with its own K and V"),
         t("{h} query heads sharing {kv} K/V heads (grouped-query attention)", h=H, kv=H_kv)),
        (t("norm"), t("LayerNorm, after each sublayer (post-LN)"), norm),
        (t("feed-forward"), t("ReLU, two layers, d_ff = 2048"), ffn + f", d_ff = {blocks['d_ff']}"),
        (t("output"), t("shared with the target embedding"),
         t("tied to the token embedding") if blocks.get("tied_embeddings") else t("its own matrix")),
    ]
    fig = FPH.comparison_table(rows, (t("component"), t("2017 (base model)"), t("this model")),
                               title=t("From the 2017 Transformer to this language model"))
    values = sorted({1, r, 2 * r, H})
    ids = [str(v) for v in values]
    fb = t("Each layer has {h} query heads and {kv} K/V heads: query head h reads K/V head h // {r}, so {r} query "
           "heads share each one, and the KV cache is {r} times smaller.", h=H, kv=H_kv, r=r)
    return Live(fig, ids, {i: i for i in ids}, (str(r),), fb)


SINK_BINS = {"lt10": 0.10, "10-30": 0.30, "30-60": 0.60, "gt60": 1.01}  # upper bounds of the mean share


def live_sinks(eff, param=None) -> Live:
    from viz.figures import phenomena as FPH

    share = eff.share
    fig = FPH.head_map(share.scores, t("share on token 0"), [(a, b) for a, b, _ in share.heads], zmax=1.0,
                       title=t("Share of each head's attention on token 0 · outlined: ≥ {th}",
                               th=F.num(share.threshold)))
    labels = {"lt10": t("under 10%"), "10-30": t("10% to 30%"), "30-60": t("30% to 60%"), "gt60": t("over 60%")}
    correct = next(k for k, hi in SINK_BINS.items() if eff.mean_share < hi)
    fb = t("{p} of all attention (every head, query rows 1…T−1) lands on token 0; {k} of {n} heads put at least "
           "{th} there. Blocking token 0 everywhere moves the next-token distribution at the last position (the "
           "token after the prompt) by KL = {kl} nats.",
           p=f"{eff.mean_share:.1%}", k=len(share.heads), n=share.scores.size, th=F.num(share.threshold),
           kl=F.num(eff.kl_everywhere))
    return Live(fig, list(SINK_BINS), labels, (correct,), fb)


REPEAT_RATIOS = {"same": 1.0, "half": 0.5, "fifth": 0.2, "fiftieth": 0.02}  # second copy's loss / first's


def live_induction(res, param=None) -> Live:
    from viz.figures import phenomena as FPH

    loss = res.loss
    fig = FPH.repeat_loss_figure(loss.per_token, res.n)
    ratio = loss.second / loss.first
    labels = {"same": t("about the same"), "half": t("about half"), "fifth": t("about a fifth"),
              "fiftieth": t("about a fiftieth")}
    top = res.scores["induction"].top(3)
    fb = t("First copy {a} nats, second copy {b} nats (ratio {r}). The heads that copy: {heads}.",
           a=F.num(loss.first), b=F.num(loss.second), r=F.num(ratio),
           heads=", ".join(t("layer {l} · head {h} ({v})", l=la, h=h, v=F.num(v)) for la, h, v in top))
    return Live(fig, list(REPEAT_RATIOS), labels, (closest(ratio, REPEAT_RATIOS, log=True),), fb)


def live_why_here(w: WhyInduction, param=None) -> Live:
    """Which key-side source gives the induction head most of its lead over the runner-up key: the options are
    the four largest key-side sources (signed toward the lead), the answer the largest, from the explanation."""
    from viz.figures import why as FW

    e = w.expl
    sign = 1.0 if e.total >= 0 else -1.0
    ranked = sorted(e.key_side.items(), key=lambda kv: -sign * kv[1])[:4]
    ids = [s for s, _ in ranked]
    labels = {s: FW.source_label(s) for s in ids}
    best, value = ranked[0]
    fig = FW.pairs_heatmap(e, w.tokens, n=6)
    row = next((r for r in w.check.rows if r.side == "key" and r.source == best), None)
    prev = ""
    parts = best.split()
    if len(parts) == 2 and parts[0].startswith("L") and parts[1].startswith("H"):
        la, h = int(parts[0][1:]), int(parts[1][1:])
        p = float(w.previous_token[la, h])
        rank = int((w.previous_token > p).sum()) + 1
        # "a previous-token head" when most of its attention goes to the token just before (the stated test)
        prev = (t(" It is a previous-token head: its previous-token score on this input is {p} (rank {r} of {n}; "
                  "the test: over 0.5).", p=F.num(p), r=rank, n=w.previous_token.size) if p > 0.5 else
                t(" Its previous-token score on this input is {p} (rank {r} of {n}): not a previous-token head by "
                  "the test (over 0.5).", p=F.num(p), r=rank, n=w.previous_token.size))
    fb = (FW.why_sentence(e, f"L{w.layer}H{w.head}", w.tokens) + " "
          + t("{src} adds {v} of the lead {lead} at the key position.", src=labels[best], v=F.num(value),
              lead=F.num(e.total)) + prev)
    if row is not None:
        fb += " " + t("Taken out of the key's input alone (the norm recomputed), it changes the lead by {a} "
                      "(attributed: {b}){ok}.", a=F.num(row.actual), b=F.num(row.attributed),
                      ok="" if row.agrees else t(": the two disagree, read the actual change"))
    return Live(fig, ids, labels, (best,), fb,
                args={"layer": w.layer, "head": w.head, "q": w.query, "k": w.key,
                      "a": w.against if w.against is not None else "—"})


DLA_TIE = 0.05  # heads within this many logits of the largest DLA are right answers too


def live_ioi(res, param=None) -> Live:
    from viz.figures import phenomena as FPH

    top = res.top_heads[:4]
    fig = FPH.head_map(res.dla, t("DLA (logits)"), [(a, b) for a, b, _ in res.top_heads[:5]], diverging=True,
                       title=t("Direct logit attribution to IO − S per head"))
    ids, labels = _heads_ids([(a, b) for a, b, _ in top])
    best = top[0][2]
    accepted = tuple(f"{a}-{b}" for a, b, v in top if v >= best - DLA_TIE)
    fb = t("Mean logit difference over {n} prompts: {ld}. Layer {l} head {h} alone writes {v} of it directly.",
           n=len(res.prompts), ld=F.num(res.mean_logit_diff), l=top[0][0], h=top[0][1], v=F.num(best))
    return Live(fig, ids, labels, accepted, fb)


def lens_first_layer(top_ids) -> int:
    """The first layer (row of the lens without the embeddings) from which every later layer's top token at
    the last position is the model's own answer (the last row's): model.analysis.logit_lens.settles."""
    from model.analysis.logit_lens import LogitLens, settles

    rows = np.asarray(top_ids)
    full = np.vstack([rows[:1], rows])  # settles reads the rows after "embed"
    return settles(LogitLens([], None, full, np.zeros(full.shape), None, None, None)).layer


def live_lens(lens, param=None) -> Live:
    from viz.figures import llm as FL
    from viz.ui import lm_models

    rows = lens.top_ids[1:]  # the layers' outputs (row 0 of the lens reads the embeddings)
    T = rows.shape[1]
    cols = list(range(max(0, T - LENS_COLUMNS), T))
    readable = [[lm_models.readable(tok) for tok in row] for row in lens.top_tokens[1:]]
    inputs = [lm_models.readable(tok) for tok in lens.tokens]
    fig = FL.logit_lens_figure([[row[c] for c in cols] for row in readable], lens.top_probs[1:][:, cols], cols, inputs)
    from model.analysis.logit_lens import settles

    settled = settles(lens)  # computed from the lens: the sentence follows the data
    first = settled.layer
    L = rows.shape[0]
    ids = [str(v) for v in sorted({0, first // 2, max(0, first - 4), first, min(L - 1, first + 3), L - 1})]
    answer = readable[-1][-1]
    if settled.only_last:
        fb = t("The answer “{tok}” ({p}) tops the lens at the last position only at the last layer, {l}: it does "
               "not appear early and stay; layer {b} still reads “{before}”.", tok=answer,
               p=F.num(float(lens.top_probs[-1, -1])), l=first, b=first - 1,
               before=readable[first - 1][-1] if first > 0 else "—")
    else:
        fb = t("The answer “{tok}” ({p}) is the top token at the last position from layer {l} on; before that, the "
               "lens reads “{before}”.", tok=answer, p=F.num(float(lens.top_probs[-1, -1])), l=first,
               before=readable[first - 1][-1] if first > 0 else "—")
    return Live(fig, ids, {i: t("layer {l}", l=i) for i in ids}, (str(first),), fb, args={"token": answer})


def live_not_explanation(sh, param=None) -> Live:
    """Lesson 16: a sink head's weights beside its norm-based shares (model.analysis.flow.sink_head)."""
    from viz.figures import flow as FF
    from viz.ui import lm_models

    toks = [lm_models.readable(x) for x in sh.tokens]
    fig = FF.sink_head_figure(sh.weights, sh.norms, toks,
                              title=t("Layer {l} · head {h}: weights vs norm-based shares", l=sh.layer, h=sh.head))
    share = sh.norm_share_on_first
    labels = {"lt10": t("under 10%"), "10-30": t("10% to 30%"), "30-60": t("30% to 60%"), "gt60": t("over 60%")}
    correct = next(k for k, hi in SINK_BINS.items() if share < hi)
    fb = t("The weights put {w} on “{tok}”, but its vector is short: ‖α v W^O‖ gives token 0 only {s} of the head's "
           "output. The largest share goes to “{big}” ({b}).", w=f"{sh.weight_on_first:.0%}", tok=toks[0],
           s=f"{share:.0%}", big=toks[int(np.argmax(sh.norms))], b=f"{float(sh.norms.max() / sh.norms.sum()):.0%}")
    return Live(fig, list(SINK_BINS), labels, (correct,), fb,
                args={"layer": sh.layer, "head": sh.head, "w": f"{sh.weight_on_first:.0%}", "tok": toks[0]})


# ---------------------------------------------------------------- 17. induction heads form (the /learn run)


def induction_jump(run) -> tuple[int, int]:
    """(head, step) of a recorded run (model.toy.learn.Run, measured): the head the lesson's sentence names
    (model.toy.learn.summary: the last layer's best at the phase change, read from `Run.heads` as the heatmap is),
    and the checkpoint step at which its score rose most from the checkpoint before."""
    from model.toy import learn as LR

    layer = run.settings.layers - 1
    ind = run.heads("induction")[:, layer]  # (C, H): the heatmap's rows of the last layer
    head = LR.summary(run).head
    return head, int(run.steps[int(np.argmax(np.diff(ind[:, head]))) + 1])


def step_options(steps: Sequence[int], answer: int) -> list[int]:
    """The answer and three checkpoints far from it on the log scale (about 1/8, 1/3 and 3 times the step)."""
    def near(x: float) -> int:
        return min((s for s in steps if s > 0), key=lambda s: abs(math.log(s) - math.log(max(x, 1.0))))

    return sorted({answer, near(answer / 8), near(answer / 3), near(answer * 3)})


def live_learn(data, param=None) -> Live:
    """data: (the recorded runs {"attn2", "attn1"} measured, their model.toy.learn.Summary)."""
    from viz.figures import learn as FLN

    runs, sm = data
    run = runs["attn2"]
    fig = FLN.head_steps_figure(run.steps, run.heads("induction"), t("induction score"),
                                title=t("Induction score of every head over training (2 layers)"))
    if sm.step is None:
        return Live(fig, [], {}, (), "", t("The in-context loss never fell in this run: there is no phase change "
                                           "to find."))
    head, jump = induction_jump(run)
    ids = [str(x) for x in step_options(run.steps, sm.step)]
    accepted = tuple(dict.fromkeys(str(x) for x in (sm.step, jump)))  # the rule's step; the jump's, if another
    fb = FLN.sentence(sm) + " " + t(
        "Head {layer}.{head}'s induction score rises most between the checkpoint before and step {jump}; the "
        "phase-change rule (the steepest fall of the in-context loss) gives step {step}.",
        layer=run.settings.layers - 1, head=head, jump=jump, step=sm.step)
    return Live(fig, ids, {i: t("step {n}", n=i) for i in ids}, accepted, fb)


HORIZON_NAME = "gemma3"  # lesson 18 opens Gemma 3 270M: its sliding and global layers (model/loaders/gemma3.py)
HORIZON_BINS = {"none": 1e-9, "lt10": 0.10, "10-40": 0.40, "gt40": 1.01}  # upper bounds of the global layers' mean


def live_horizon(hz, param=None) -> Live:
    from viz.figures import modern as FM

    T = hz.prompt.length
    fig = FM.horizon_figure(hz.far, hz.kinds, hz.window, T)
    full, sliding = hz.full_layers, hz.sliding_layers
    mean = float(hz.far[full].mean())
    labels = {"none": t("none: 0%"), "lt10": t("under 10%"), "10-40": t("10% to 40%"), "gt40": t("over 40%")}
    correct = next(k for k, hi in HORIZON_BINS.items() if mean < hi)
    a, b = hz.prompt.needle
    fb = t("On this {T}-token text the {s} sliding layers put exactly 0 of the last token's attention {w} or more "
           "tokens back: their mask blocks those keys. The global layers ({layers}) put {lo} to {hi} there ({m} on "
           "average over their heads), {n} of it on the pass-key sentence (tokens {a}–{b}): whatever Gemma 3 reads "
           "from further back than {w} tokens, it reads in these {k} layers.",
           T=f"{T:,}", s=len(sliding), w=hz.window,
           layers=("、" if current_lang() == "zh" else ", ").join(map(str, full)),
           lo=f"{hz.far[full].min():.0%}", hi=f"{hz.far[full].max():.0%}", m=f"{mean:.0%}",
           n=f"{float(hz.needle[full].mean()):.1%}", a=a, b=b - 1, k=len(full))
    return Live(fig, list(HORIZON_BINS), labels, (correct,), fb, args={"w": hz.window})


# ---------------------------------------------------------------- 20. an image is a sequence of patches

VIT_NAME = "shapes"  # lesson 20 opens the lab's vision transformer (model/families/vit.py, trained on model/toy/shapes)


@dataclass
class VitSample:
    """Lesson 20's numbers for one sample of the shapes set: the image, its label and deciding patch, the trace."""

    image: np.ndarray  # (3, S, S)
    label: int
    decide: np.ndarray  # (rows, cols) bool
    probs: np.ndarray  # (C,)
    trace: object


def vit_sample(model, seed: int) -> VitSample:
    import torch

    from model.toy.shapes import make_batch

    cfg = model.cfg
    images, labels, decide = make_batch(1, int(seed), image_size=cfg.image_size, patch_size=cfg.patch_size)
    with torch.no_grad():
        logits, trace = model.run_with_trace(torch.from_numpy(images), names="*.weights")
    return VitSample(images[0], int(labels[0]), decide[0], torch.softmax(logits[0].double(), -1).numpy(), trace)


def cls_maps(trace) -> np.ndarray:
    """[CLS]'s attention over the patches at every layer, the heads' mean: (L, rows, cols)."""
    from viz.figures import vision as FV

    n, grid, L = trace.meta["n_prefix"], trace.meta["grid"], trace.meta["config"]["n_layers"]
    return np.stack([FV.patch_map(F.arr(trace[f"encoder.layers.{i}.self_attn.weights"])[0].mean(0)[0], n, grid)[0]
                     for i in range(L)])


def live_patches(data, param=0) -> Live:
    """data: the loaded vision transformer; param: the sample's seed. The question: in which layer does [CLS] put
    the most attention (heads' mean) on the square's patch, measured by model.analysis.vision.deciding_share (the
    number /vision shows per head)."""
    from model.analysis import vision as AV
    from viz.figures import vision as FV

    model = data
    sm = vit_sample(model, int(param))
    meta = sm.trace.meta
    maps = cls_maps(sm.trace)
    L = len(maps)
    fig = FV.heads_over_image(sm.image, maps, meta["patch_size"],
                              t("[CLS]'s attention over the image in every layer (heads' mean)"),
                              labels=[t("layer {l}", l=i) for i in range(L)], height=300)
    res = AV.deciding_share(sm.trace, sm.decide[None])
    by_layer = np.asarray(res["share"], dtype=np.float64).mean(1)  # (L,): the heads' mean
    best = int(np.argmax(by_layer))
    ids = [str(i) for i in range(L)]
    correct = tuple(str(i) for i in range(L) if by_layer[i] >= by_layer[best] - 0.05)  # a near-tie also counts
    dr, dc = (int(v) for v in np.argwhere(sm.decide)[0])
    names = model.cfg.names()
    fb = t("[CLS]'s attention on the square's patch (row {r}, column {c}), heads' mean, layer by layer: {shares}; "
           "the patch is {cov} of the image. The model answers {name} ({p}).", r=dr, c=dc,
           shares=" · ".join(f"{v:.0%}" for v in by_layer), cov=f"{float(res['coverage']):.1%}",
           name=t(names[int(np.argmax(sm.probs))]), p=f"{float(sm.probs.max()):.1%}")
    return Live(fig, ids, {i: t("layer {l}", l=i) for i in ids}, correct, fb)


# ---------------------------------------------------------------- the syllabus

# What "seed 001" means wherever a page names a seed post (st.caption(t(SEEDS_NOTE)) or help=t(SEEDS_NOTE)).
SEEDS_NOTE = N_("The seed posts (seed 000–004) are the Chinese blog posts on the Transformer that this lab teaches "
                "from. Their code has known bugs (seed 001's attention, masks and loss, seed 004's PE base): the "
                "Experiments page reproduces each one next to the correct version.")

LESSONS: list[Lesson] = [
    Lesson(
        "tokens", N_("Tokens and embeddings"),
        N_("A Transformer never sees text. A tokenizer cuts the sentence into tokens (for Chinese, best one "
           "character each) and maps each to an id; the embedding table turns each id into a vector of d_model "
           "numbers, multiplied by √d_model. Then the positional encoding is added: that sum is what layer 0 "
           "reads."),
        N_("Change the sentence to 我爱你 or type an English letter: which rows change, and what becomes [UNK]?"),
        N_("How many tokens does the encoder read for this sentence, [EOS] included?"),
        "viz/pages/tokens.py", source="trace", checkpoint="zh-en", text="我爱机器学习", live=live_tokens),
    Lesson(
        "positions", N_("Positional encoding"),
        N_("Attention itself ignores order: shuffle the tokens and each one gets the same output. So the paper "
           "adds PE(pos, 2i) = sin(pos / 10000^(2i/d)) and PE(pos, 2i+1) = cos(…) to the embeddings. The heatmap "
           "is the dot product of every pair of position vectors: it depends only on the distance between them."),
        N_("Slide the number of positions up: the stripes stay parallel to the diagonal (relative position)."),
        N_("What is the value on the diagonal, PE_pos · PE_pos?"),
        "viz/pages/tokens.py", source="trace", checkpoint="zh-en", text="我爱机器学习",
        param=("slider", N_("positions"), (16, 256), 64), param_query="positions", live=live_positions),
    Lesson(
        "one-head", N_("One head, step by step"),
        N_("One attention head: every token makes a query Q, a key K and a value V. The scores are QKᵀ, "
           "divided by √d_k; the mask adds −∞ where attention is not allowed; softmax turns each row into "
           "weights that sum to 1; the output is the weighted sum of the values."),
        N_("Pick another head and compare its weights panel with head 0."),
        N_("In this head, which key does query 0 (the first character) attend to most?"),
        "viz/pages/attention.py", {"attn_kind": "enc", "layer": 0, "view": "pipeline"}, source="trace",
        checkpoint="dates",
        text="3 november 2023", param=("head", N_("head"), None, 0), param_query="head", live=live_one_head),
    Lesson(
        "sqrt-dk", N_("Why divide by √d_k"),
        N_("If the entries of q and k are independent with variance 1, q·k is a sum of d_k such products and "
           "has variance d_k. Large scores push softmax to one-hot and its gradients towards 0; dividing by "
           "√d_k brings the variance back to 1, whatever d_k."),
        N_("Move d_k from 4 to 512 and watch the red histogram widen while the blue one stays put."),
        N_("What is the variance of q·k for random q, k?"),
        "viz/pages/attention.py", {"attn_kind": "enc", "view": "sqrt"}, source="none",
        param=("select", N_("d_k"), (4, 16, 64, 256, 512), 64), live=live_sqrt_dk),
    Lesson(
        "multi-head", N_("Multi-head attention"),
        N_("Instead of one attention over d_model dimensions, the model runs H heads of d_k = d_model / H side "
           "by side (split the vector, attend, concatenate, multiply by W^O). Each head can look for something "
           "else. Here: the decoder's cross-attention heads of the dates model, writing 2023-11-03."),
        N_("Write the date another way (2023年11月3日, Nov 3, 2023): does the same head still find the month?"),
        N_("Which head aligns the month names (where the month digits look at the month's characters)?"),
        "viz/pages/attention.py", {"attn_kind": "cross", "view": "heads"}, source="trace", checkpoint="dates",
        text="3 november 2023",
        param=("layer", N_("decoder layer"), None, 0), param_query="layer", live=live_multi_head),
    Lesson(
        "masks", N_("Masks"),
        N_("The decoder must not peek at the words it has not written yet: the look-ahead mask adds −∞ above "
           "the diagonal, so after softmax those weights are exactly 0. The padding mask blocks the [PAD] keys "
           "of shorter sentences in a batch the same way."),
        N_("Make the sentence longer and count the blocked cells again."),
        N_("How many cells of the decoder's self-attention are blocked?"),
        "viz/pages/attention.py", {"attn_kind": "dec", "layer": 0, "view": "masks"}, source="trace",
        checkpoint="zh-en", text="我昨天吃了一个苹果",
        live=live_masks),
    Lesson(
        "alignment", N_("Cross-attention alignment"),
        N_("In encoder–decoder attention the queries come from the decoder and the keys and values from the "
           "encoder's output. Each row shows where an English word looked in the Chinese source: time words "
           "move to the end in English, and the alignment follows them."),
        N_("Try 我们明天会喝两杯茶 and follow “tomorrow” back to 明天."),
        N_("Which source token does the last output word “{word}” attend to most?"),
        "viz/pages/decoder.py", source="trace", checkpoint="zh-en", text="我昨天吃了一个苹果", live=live_alignment),
    Lesson(
        "teacher-forcing", N_("Teacher forcing and step-by-step decoding"),
        N_("At inference the decoder writes one token at a time, each step reading what it wrote so far. In "
           "training, teacher forcing feeds the whole target at once under the look-ahead mask: one parallel "
           "pass. Both compute the same probabilities for the same prefix."),
        N_("Type a date the model gets wrong (e.g. 1 january 2060) and compare the two curves again."),
        N_("How much do the two curves differ?"),
        "viz/pages/decoder.py", source="decode", checkpoint="dates", text="3 november 2023",
        live=live_teacher_forcing),
    Lesson(
        "noam", N_("Learning-rate warmup (Noam)"),
        N_("The paper's schedule: lr = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5). It grows linearly "
           "for `warmup` steps (Adam's statistics are still noisy at the start), then decays as 1/√step."),
        N_("Move the warmup slider: the peak moves with it, and a longer warmup gives a lower peak."),
        N_("At which step does the learning rate peak (d_model = 512)?"),
        "viz/pages/schedule.py", {"d_model": 512}, source="none",
        param=("slider", N_("warmup steps"), (500, 16000), 4000), param_query="warmup", live=live_noam),
    Lesson(
        "bert", N_("BERT: “it” → “animal”"),
        N_("BERT keeps only the encoder. In “The animal didn't cross the street because it was too tired” some "
           "heads link “it” to “animal”. Change tired to wide and “it” means the street — but does the same "
           "head change its mind? Attention shows where information flows, not what the model concluded."),
        N_("Open the full page and rank the heads for the wide sentence."),
        N_("Take the head with the largest weight it → animal in the tired sentence (layer {layer}, head {head}). "
           "In the wide sentence, does it look more at “street” than at “animal”?"),
        "viz/pages/pretrained.py", source="bert", live=live_bert),
    Lesson(
        "llm-2017", N_("From the 2017 Transformer to today's LLM"),
        N_("A language model such as SmolLM2 keeps only the decoder stack: no encoder and no cross-attention, just "
           "masked self-attention that lets each token read the ones before it. Its pieces changed since 2017: "
           "positions are rotations of q and k (RoPE) instead of vectors added to the input, the norm comes "
           "before each sublayer (RMSNorm), the FFN is gated, and several query heads share one key/value head."),
        N_("Open the Language model page and compare a head's pattern with the 2017 model's decoder heads."),
        N_("In this model, how many query heads share one key/value head?"),
        "viz/pages/llm.py", {"view": "heads"}, source="lm", checkpoint=LM_NAME, live=live_llm_2017),
    Lesson(
        "sinks", N_("Attention sinks"),
        N_("Softmax gives every query row weights that sum to 1, even when the head has nothing to read. Many "
           "heads then park their attention on the first token, the one every query can see: an attention sink "
           "(Xiao et al., 2023). Blocking it changes the output, although the token itself means nothing."),
        N_("Start the prompt with another word: does the sink move with it, or stay on position 0?"),
        N_("What share of all attention lands on token 0?"),
        "viz/pages/phenomena.py", {"phen": "sinks"}, source="lm", checkpoint=LM_NAME, text=IOI_TEXT,
        live=live_sinks),
    Lesson(
        "induction", N_("Induction heads: how a model copies"),
        N_("Feed [BOS] + 50 random tokens, then the same 50 again. The first copy is unpredictable; in the "
           "second, a head that looks at the token after the previous occurrence of the current one (an "
           "induction head) can copy the answer. The loss per token shows whether the model does."),
        N_("On the full page, knock out the top induction heads and watch the second copy's loss climb back."),
        N_("How does the loss on the second copy compare with the loss on the first?"),
        "viz/pages/phenomena.py", {"phen": "induction"}, source="lm", checkpoint=LM_NAME, live=live_induction),
    Lesson(
        "ioi", N_("Who gave the drink? (IOI)"),
        N_("“When Mary and John went to the store, John gave a drink to” → “Mary”: the answer is the name that "
           "is not repeated. The logit difference logit(Mary) − logit(John) measures the preference; direct logit "
           "attribution splits it into what each head writes straight to the output."),
        N_("On the full page, patch the clean run into the one with the names swapped and find where the answer "
           "travels."),
        N_("Which head writes the most of IO − S directly (the largest direct logit attribution)?"),
        "viz/pages/phenomena.py", {"phen": "ioi"}, source="lm", checkpoint=LM_NAME, live=live_ioi),
    Lesson(
        "lens", N_("The logit lens"),
        N_("Read every layer's residual stream as if it were the last: apply the final norm (with that layer's "
           "own statistics) and the unembedding. Early layers mostly predict something generic; the lens shows at "
           "which depth the answer appears, and whether it stays. Each cell is the top token, coloured by its "
           "probability."),
        N_("Type another fact (“The capital of Japan is”): does the answer appear at the same depth?"),
        N_("From which layer on is “{token}” the top token at the last position?"),
        "viz/pages/llm.py", {"view": "lens"}, source="lm", checkpoint=LM_NAME, text=LENS_TEXT, live=live_lens),
    Lesson(
        "not-explanation", N_("Attention is not (quite) an explanation"),
        N_("A head's weights say where it looks, not what it moves. Each key j adds α_j · v_j W^O to the output, "
           "so a head can put most of its weight on token 0 (a sink) while that token's value vector is nearly "
           "zero: the weight is large, the vector it carries is small. Norm-based attention (Kobayashi et al., "
           "2020) measures ‖α_j v_j W^O‖ instead; the “Why this token?” page goes further and checks every method "
           "against the causal effect of removing a token."),
        N_("Open the “Why this token?” page and compare the raw weights' ρ with the routes' ρ on this prompt, then "
           "run the agreement table over the 12 IOI prompts below it. On SmolLM2 no method clearly leads over the "
           "set (a sign test over the prompts): the order on one prompt is an anecdote, not a finding."),
        N_("Layer {layer}, head {head} puts {w} of the last position's attention on token 0 (“{tok}”). What share "
           "of what the head moves (its norm-based output ‖α_j v_j W^O‖) comes from token 0?"),
        "viz/pages/flow.py", source="lm", checkpoint=LM_NAME, text=IOI_TEXT, live=live_not_explanation),
    Lesson(
        "induction-forms", N_("Watch an induction head form"),
        N_("Induction heads are not there from the start: they appear during training, suddenly. A 2-layer "
           "attention-only Transformer, trained in this lab on sequences where each token tends to be followed by "
           "what followed it earlier in the same sequence, can only predict well by copying from its context. For "
           "hundreds of steps nothing happens; then, within a few checkpoints, a layer-1 head starts attending to "
           "the token after the previous occurrence of the current token, and the in-context loss falls: a phase "
           "change (Olsson et al. 2022). The head needs a layer-0 head that looks at the previous token, so the "
           "1-layer control never gets there."),
        N_("On the full page, move the step slider across the phase change and watch the induction stripe appear in "
           "the map; then train the 1-layer model yourself."),
        N_("At which training step does the best layer-1 head's induction score jump?"),
        "viz/pages/learn.py", source="learn", live=live_learn),
    Lesson(
        "horizon", N_("A horizon for attention: sliding and global layers"),
        N_("In most of Gemma 3's layers a query sees only the last W keys, not the whole text: a sliding window. "
           "Such a layer costs the same at token 100 and at token 30,000, and its KV cache stops growing at W. "
           "Every few layers comes a global layer that sees everything before it, and it is the only way a token "
           "far back can reach the present in one step. Here Gemma 3 270M reads a 2,000-token text with a pass "
           "key near its start, and each bar is the share of the last token's attention that lands W or more "
           "tokens back."),
        N_("Open “What changed since 2017” with Gemma 3 (section 6): how far back can a token reach after each "
           "layer, and how many layers does a global layer save?"),
        N_("In the global layers, what share of the last token's attention lands {w} or more tokens back, where "
           "no sliding layer can look?"),
        "viz/pages/since2017.py", source="lm", checkpoint=HORIZON_NAME, live=live_horizon),
    Lesson(
        "why-here", N_("Why does this head look there?"),
        N_("A head's score for a (query, key) pair is q·k, and both q and k are built from the residual stream: the "
           "embeddings plus everything each earlier head and MLP wrote there. With every norm frozen at its scale "
           "on this run, each step to q and k is linear, so the score splits exactly into one term per (query "
           "source, key source) pair. Here SmolLM2 reads [BOS] + 50 random tokens + the same 50 again; its top "
           "induction head attends from the last token to the token after that token's earlier copy. Softmax "
           "only sees differences, so the heatmap splits the score's lead over the runner-up key."),
        N_("Open the Language model page on this head and click other cells of its heatmap: which sources carry "
           "the induction stripe, and which the attention to token 0?"),
        N_("Layer {layer}, head {head} attends from position {q} to {k} rather than {a}. Which source, written at "
           "the key position, gives the most of that lead?"),
        "viz/pages/llm.py", {"view": "heads"}, source="lm", checkpoint=LM_NAME, live=live_why_here),
    Lesson(
        "patches", N_("An image is a sequence of patches"),
        N_("A vision transformer reads an image the way a text model reads a sentence. It cuts the image into "
           "square patches (here 4 × 4 patches of 8 × 8 pixels), flattens each patch's pixels into one vector and "
           "maps it to d_model numbers with one linear layer: those are its tokens. A learned position embedding "
           "says where each patch was, and a [CLS] token in front collects what the class head reads. The rest "
           "is the encoder you know. This one was trained in the lab to answer “What colour is the square?”, "
           "among other shapes: the patch that decides the answer is known."),
        N_("Move the seed to draw other images: does [CLS] find the square wherever it is, and whatever shapes "
           "share its colour? On the full page, compare the heads and see what blanking each patch does."),
        N_("In which layer does [CLS] put the most of its attention on the square's patch (the heads' mean)?"),
        "viz/pages/vision.py", {"q": "cls", "head": "mean", "img": "sample"}, source="vit",
        checkpoint=None, param=("slider", N_("sample (seed)"), (0, 99), 0), param_query="seed",
        live=live_patches),
]

