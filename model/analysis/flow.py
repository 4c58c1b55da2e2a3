"""Is attention an explanation? From attention weights to information flow, checked against ablation.

One prediction (an LM's next token, the translator's target word, MiniLM's chosen token), five
ways to say which input tokens it came from, and the causal answer they are judged against:

- raw weights: the last attention layer's softmax row, mean over heads (the baseline every tool draws);
- norm-based (Kobayashi et al. 2020): ||alpha_ij * v_j W^O_h|| per head, and ||sum_h ...|| per layer.
  A head that puts 90% of its weight on a sink whose value vector is near zero moves almost nothing;
  the norm says so, the weight does not. Grouped-query attention: query head h reads K/V head
  h // (H / H_kv) (the model's description says H and H_kv) and its own slice of W^O;
- attention rollout (Abnar & Zuidema 2020): A~ = 0.5 A + 0.5 I (the residual), rows normalised,
  multiplied through the layers (A = head mean); attention flow: max-flow over the same layered graph,
  feasible for short prompts only (`FlowTooLarge` carries the limit);
- information-flow routes (Ferrando & Voita 2024): every residual-stream sum  y = r + sum_k z_k
  (an attention sublayer: the residual plus one term per (source token, head); an FFN sublayer: the
  residual plus the FFN's output) gives each term the proximity
        prox_k = max(0, ||y||_1 - ||y - z_k||_1),     c_k = prox_k / sum_j prox_j,
  so the contributions into a node sum to 1. One forward pass; the per-(query, key, head) terms
  alpha * v W^O are made a block of query rows at a time (`CHUNK_BYTES`), never the whole
  L x T x T x H x d tensor. W^O's bias is in y but is no term (it depends on no token).
  Prune with tau, keep what is reachable from the output node (`Routes.edges`);
- ground truth (`causal_effect`): per source token, zero its value vectors in every attention layer
  that reads it (hooks on `<attn>.v`) and measure the change of the chosen output: the predicted
  token's log-prob (LM), the logit difference where there is a contrast (IOI), the target word's
  log-prob (translator), the cosine distance of the chosen token's final vector (MiniLM);
- agreement: Spearman's rho of each method's source-token importance with |causal effect|, and the
  overlap of their top-k; over a prompt set, the mean and spread (`agreement_table`).

Which attention module reads which token side comes from the model's own description
(`trace.meta["model"]`), never from parsing names. No streamlit or plotly here.
"""

from __future__ import annotations

import fnmatch
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from model.core import residual
from model.core.describe import described

CHUNK_BYTES = 32 * 2**20  # one block of alpha * v W^O terms (query rows x keys x heads x d_model, float32)
FLOW_MAX_NODES = 400  # attention flow: max-flow per source token over (positions x layers) nodes
METHODS = ("raw", "norm", "rollout", "routes")  # the four shown side by side (flow: when short enough)
NAMES = {"raw": "raw weights (last layer)", "norm": "norm-based (last layer)", "rollout": "attention rollout",
         "routes": "information-flow routes", "flow": "attention flow"}


class FlowTooLarge(ValueError):
    """Attention flow refused: the graph has more nodes than `limit`."""

    def __init__(self, nodes: int, limit: int, tokens: int, layers: int):
        self.nodes, self.limit, self.tokens, self.layers = nodes, limit, tokens, layers
        super().__init__(f"attention flow needs one max-flow per token over {nodes} nodes ({tokens} tokens x "
                         f"{layers + 1} layers); the limit is {limit} nodes, about {limit // (layers + 1)} tokens "
                         "for this model. Shorten the text, or use rollout, which has no limit.")


# ---------------------------------------------------------------------- the prediction under study


@dataclass
class Subject:
    """One prediction: the model, its inputs, the output position and what is measured there."""

    module: torch.nn.Module  # Transformer (seq2seq or encoder-only) or DecoderLM
    kind: str  # "lm", "seq2seq" or "encoder"
    ids: dict[str, torch.Tensor]  # "src" / "tgt": [1, n] token ids
    tokens: dict[str, list[str]]  # "src_tokens" / "tgt_tokens": display pieces
    position: int  # the query position on the output side
    target: int | None = None  # the token whose log-prob is measured (LM, translator)
    contrast: int | None = None  # with a contrast: logit(target) - logit(contrast) (IOI)
    target_token: str = ""
    piece: Callable[[int], str] = str  # token id -> display piece (the output side's vocabulary)

    @property
    def out_side(self) -> str:
        return "src_tokens" if self.kind == "encoder" else "tgt_tokens"

    @property
    def source_side(self) -> str:
        """The tokens whose importance is compared: the source sentence for the translator, else the prompt."""
        return "tgt_tokens" if self.kind == "lm" else "src_tokens"

    @property
    def sources(self) -> list[int]:
        """Positions (on `source_side`) compared: an LM's prompt up to the position, every source token else."""
        n = self.position + 1 if self.kind == "lm" else len(self.tokens[self.source_side])
        return list(range(n))

    @property
    def metric(self) -> str:
        if self.kind == "encoder":
            return "cosine distance of the chosen token's final vector"
        if self.contrast is not None:
            return "logit difference (target - contrast)"
        return "log-probability of the target token"

    def forward(self, hooks=None, batch: int = 1) -> torch.Tensor:
        """The model's output for `batch` copies of the inputs under `hooks`: logits [B, T, V] (an LM: the
        measured position's row only, [B, 1, V]), or MiniLM's last hidden state [B, S, D]."""
        m = self.module
        with torch.no_grad():
            if self.kind == "lm":
                ids = self.ids["tgt"][:, :self.position + 1].expand(batch, -1)  # later tokens cannot matter
                with m.hooks(hooks):  # the measured row only: T x vocab logits per row would be wasted
                    return m(ids, last_only=True)  # (B, 1, V): the position's row
            src = self.ids["src"].expand(batch, -1)
            if self.kind == "encoder":
                return m.run_with_hooks(src, hooks=hooks, token_type_ids=torch.zeros_like(src))
            return m.run_with_hooks(src, self.ids["tgt"].expand(batch, -1), hooks=hooks)

    def measure(self, out: torch.Tensor, clean: torch.Tensor | None = None) -> torch.Tensor:
        """[B] float64: the measured quantity of each batch row (MiniLM: distance from `clean`)."""
        at = -1 if self.kind == "lm" else self.position
        row = out[:, at].double()
        if self.kind == "encoder":
            ref = row if clean is None else clean[:, at].double()
            return 1.0 - F.cosine_similarity(row, ref.expand_as(row), dim=-1)
        if self.contrast is not None:
            return row[:, self.target] - row[:, self.contrast]
        return torch.log_softmax(row, dim=-1)[:, self.target]


def _is_lm(obj) -> bool:
    from model.families.lm import DecoderLM

    return isinstance(getattr(obj, "model", obj), DecoderLM)


def prepare(obj, text=None, *, position: int | None = None, target: int | None = None,
            contrast: int | None = None, output: str | None = None) -> Subject:
    """The Subject of a LanguageModel / DecoderLM (text or ids; default: the last position and the
    model's own prediction there), a toy translator Checkpoint (source text; the decoder is fed
    [BOS] + `output`, default the greedy translation; the position predicts that target word), or
    MiniLM (text; default position: the last token before [SEP])."""
    if hasattr(obj, "translate") and hasattr(obj, "src_tokenizer"):  # a toy translator checkpoint
        m = obj.model
        src = obj.encode_source(text)
        tgt_tok = obj.tgt_tokenizer
        out_ids = obj.target_ids(output) if output is not None else obj._greedy_ids(src)[0]
        tgt = torch.tensor([[tgt_tok.bos_id, *out_ids]])
        nxt = [*out_ids, tgt_tok.eos_id]
        pos = 0 if position is None else position
        _check_position(pos, tgt.shape[1])
        tokens = {"src_tokens": obj.src_tokenizer.tokens(src[0].tolist()),
                  "tgt_tokens": tgt_tok.tokens(tgt[0].tolist())}
        tid = nxt[pos] if target is None else target
        piece = lambda i: tgt_tok.tokens([i])[0]  # noqa: E731
        return Subject(m, "seq2seq", {"src": src, "tgt": tgt}, tokens, pos, tid, contrast, piece(tid), piece)
    if _is_lm(obj):
        m = getattr(obj, "model", obj)
        if isinstance(text, str):
            if not hasattr(obj, "encode"):
                raise ValueError("text needs a language model with a tokenizer; pass token ids to a bare model")
            ids = obj.encode(text)
        else:
            ids = torch.as_tensor(text, dtype=torch.long)
            ids = ids[None] if ids.dim() == 1 else ids[:1]
        pos = ids.shape[1] - 1 if position is None else position
        _check_position(pos, ids.shape[1])
        toks = obj.tokens(ids[0]) if getattr(obj, "tokenizer", None) is not None else [str(i) for i in ids[0].tolist()]
        if target is None:
            with torch.no_grad():
                target = int(m(ids)[0, pos].argmax())
        piece = (lambda i: obj.tokens([i])[0]) if getattr(obj, "tokenizer", None) is not None else str
        return Subject(m, "lm", {"tgt": ids}, {"tgt_tokens": toks}, pos, int(target), contrast, piece(int(target)),
                       piece)
    m = getattr(obj, "model", obj)
    if getattr(getattr(m, "cfg", None), "encoder_only", False):  # MiniLM (BERT) or a bare encoder
        if isinstance(text, str):
            ids, toks = obj.ids(text), obj.tokens(text)
        else:
            ids = torch.as_tensor(text, dtype=torch.long)
            ids = ids[None] if ids.dim() == 1 else ids[:1]
            toks = [str(i) for i in ids[0].tolist()]
        n = ids.shape[1]
        pos = max(0, n - 2) if position is None else position
        _check_position(pos, n)
        return Subject(m, "encoder", {"src": ids}, {"src_tokens": toks}, pos, None, None, toks[pos])
    raise ValueError("this model is not one the flow analyses know: a language model, MiniLM or a toy translator")


def _check_position(pos: int, n: int) -> None:
    if not 0 <= pos < n:
        raise ValueError(f"position {pos} is outside the text: it has {n} tokens (0..{n - 1})")


CAPTURE = ["*.embed.out", "*_attn.weights", "*_attn.v", "*_attn.out", "*.ffn.out", "*.norm*.in", "*.norm*.out",
           "*.layers.*.out"]  # "*.norm*" also holds the norms after a sublayer (norm_post_attn, norm_post_ffn)


def capture(subject: Subject):
    """The trace every analysis here reads (weights, values, sublayer outputs, the residual sums)."""
    m, ids = subject.module, subject.ids
    with torch.no_grad():
        if subject.kind == "lm":  # an attention-only model has no FFN: only the patterns that name something
            have = list(m.capture_names())
            names = [p for p in CAPTURE if fnmatch.filter(have, p)]
            return m.run_with_trace(ids["tgt"], names=names, meta={"tgt_tokens": subject.tokens["tgt_tokens"]})[1]
        meta = dict(subject.tokens)
        if subject.kind == "encoder":
            return m.run_with_trace(ids["src"], names=CAPTURE, meta=meta,
                                    token_type_ids=torch.zeros_like(ids["src"]))[1]
        return m.run_with_trace(ids["src"], ids["tgt"], names=CAPTURE, meta=meta)[1]


# ---------------------------------------------------------------------- the layer graph

# One residual update (model/core/residual.py owns the wiring: pre-norm, sandwich, post-norm, parallel,
# post-LN); the routes graph has one row of nodes after each.
Sublayer = residual.Update


def sublayers(desc: dict) -> dict[str, list[Sublayer]]:
    """Each stack's residual updates in computation order, from the model's description."""
    return residual.updates(desc)


def _first(trace, name: str) -> torch.Tensor:
    return trace[name][0].float()


def step_labels(desc: dict) -> dict[str, list[str]]:
    """Node rows of each stack: "embed", then "L0 attn", "L0 ffn", ... (one per residual update)."""
    return {s: ["embed"] + [f"L{u.layer} {u.kind}" for u in subs] for s, subs in sublayers(desc).items()}


# ---------------------------------------------------------------------- proximity contributions


def proximity(parts: torch.Tensor, whole: torch.Tensor, p: int = 1) -> torch.Tensor:
    """Ferrando & Voita's contribution of each part to a sum: max(0, ||whole|| - ||whole - part||),
    normalised over the parts (axis 0). parts [K, ..., d], whole [..., d] -> [K, ...], summing to 1.
    (llm-transparency-tool clips at 1e-5 instead of 0; its unit cases agree to 1e-4.)"""
    dist = torch.linalg.vector_norm(whole.unsqueeze(0) - parts, ord=p, dim=-1)
    prox = (torch.linalg.vector_norm(whole, ord=p, dim=-1).unsqueeze(0) - dist).clamp(min=0)
    return prox / prox.sum(0, keepdim=True).clamp(min=1e-30)


def threshold_renormalize(tau: float, blocks: torch.Tensor, residual: torch.Tensor):
    """Drop contributions <= tau and renormalise the rest to sum 1 per node (the tool's option; the
    routes graph here keeps the raw values). blocks [..., K...], residual [...]."""
    b = blocks * (blocks > tau)
    r = residual * (residual > tau)
    extra = b.dim() - r.dim()
    denom = r + b.sum(dim=tuple(range(r.dim(), b.dim())))
    return b / denom.reshape(denom.shape + (1,) * extra), r / denom


def head_values(module, v: torch.Tensor) -> torch.Tensor:
    """u[h, j] = v_{kv(h), j} W^O_h: what head h would write if it put all its weight on key j.
    v [H_kv, Tk, hs] (the model's own K/V heads) -> [H, Tk, D]."""
    W = module.w_o.weight.float()  # (D, H*hs)
    H, hs = module.n_heads, module.d_head
    v = v.repeat_interleave(H // v.shape[0], dim=0)  # query head h reads K/V head h // (H / H_kv)
    return torch.einsum("htk,dhk->htd", v.float(), W.view(W.shape[0], H, hs))


@dataclass
class Step:
    """The contributions into one row of nodes (all positions after one residual update)."""

    sub: Sublayer
    resid: np.ndarray  # [Tq]: the residual's share
    heads: np.ndarray | None = None  # attention [Tq, H, Tk]: each (head, key)'s share
    ffn: np.ndarray | None = None  # FFN [Tq]


@dataclass
class Routes:
    """Information-flow routes: every residual update's contributions, and the graph they make."""

    desc: dict
    steps: dict[str, list[Step]]  # per stack, one per sublayer (node row k+1 is after steps[k])
    tokens: dict[str, list[str]]
    out_stack: str
    position: int
    peak_chunk_bytes: int  # the largest block of alpha * v W^O terms held at once
    labels: dict[str, list[str]] = field(default_factory=dict)

    def n_rows(self, stack: str) -> int:
        return len(self.steps[stack]) + 1

    def edges(self, tau: float = 0.0, position: int | None = None) -> list[dict]:
        """The edges with contribution > tau reachable (backwards) from the output node
        (out_stack, top row, position): dicts src=(stack, row, pos), dst=(stack, row, pos), kind
        ("head", "resid", "ffn"), module, layer, head, weight."""
        pos = self.position if position is None else position
        top = {self.out_stack: self.n_rows(self.out_stack) - 1}
        frontier = {(self.out_stack, top[self.out_stack], pos)}
        seen = set(frontier)
        edges = []
        order = ([("decoder", k) for k in range(len(self.steps.get("decoder", [])), 0, -1)]
                 + [("encoder", k) for k in range(len(self.steps.get("encoder", [])), 0, -1)])
        for stack, row in order:
            nodes = sorted(i for s, r, i in seen if s == stack and r == row)
            st = self.steps[stack][row - 1]
            for i in nodes:
                dst = (stack, row, i)
                new = []
                if st.resid[i] > tau:
                    new.append(dict(src=(stack, row - 1, i), kind="resid", weight=float(st.resid[i])))
                if st.ffn is not None and st.ffn[i] > tau:
                    new.append(dict(src=(stack, row - 1, i), kind="ffn", weight=float(st.ffn[i])))
                if st.heads is not None:
                    ks = st.sub.key_stack
                    krow = row - 1 if ks == stack else self.n_rows(ks) - 1
                    for h, j in zip(*np.nonzero(st.heads[i] > tau), strict=True):
                        new.append(dict(src=(ks, krow, int(j)), kind="head", head=int(h),
                                        weight=float(st.heads[i, h, j])))
                for e in new:
                    e.update(dst=dst, module=st.sub.module, layer=st.sub.layer, sublayer=st.sub.kind)
                    e.setdefault("head", None)
                    edges.append(e)
                    seen.add(e["src"])
        return edges

    def n_edges(self) -> int:
        """Every edge of the unpruned graph (heads counted one by one, masked keys left out)."""
        n = 0
        for subs in self.steps.values():
            for st in subs:
                n += len(st.resid) + (len(st.ffn) if st.ffn is not None else 0)
                if st.heads is not None:
                    n += int((st.heads > 0).sum())
        return n

    def importance(self, position: int | None = None) -> dict[str, np.ndarray]:
        """How much of the output node comes from each input token: the contributions composed
        along every path down to the embedding row of each stack (all sum to 1 together)."""
        return compose(self.steps, self.out_stack, self.position if position is None else position,
                       {s: len(self.tokens[_side(self.desc, s)]) for s in self.steps})


def _side(desc: dict, stack: str) -> str:
    return desc["stacks"][stack]["tokens"]


def compose(steps: dict[str, list[Step]], out_stack: str, position: int,
            n_tok: dict[str, int]) -> dict[str, np.ndarray]:
    """Propagate a unit weight from (out_stack, top, position) down through the steps' shares:
    weight at a node is split among its incoming edges in proportion to them. Returns each stack's
    weight on its embedding row (the decoder's first, as the encoder top receives cross edges)."""
    w = {s: np.zeros(n_tok[s]) for s in steps}
    w[out_stack][position] = 1.0
    for stack in [s for s in ("decoder", "encoder") if s in steps]:
        x = w[stack]
        for st in reversed(steps[stack]):
            nxt = x * st.resid
            if st.ffn is not None:
                nxt = nxt + x * st.ffn
            if st.heads is not None:
                flow = np.einsum("i,ihj->j", x, st.heads)
                if st.sub.key_stack == stack:
                    nxt = nxt + flow
                else:
                    w[st.sub.key_stack] = w[st.sub.key_stack] + flow
            x = nxt
        w[stack] = x
    return w


@torch.no_grad()
def routes(subject: Subject, trace=None, chunk_bytes: int = CHUNK_BYTES) -> Routes:
    """The contributions of every edge of the prediction's layer graph (one forward pass, `trace`).
    Each update's terms are what it really adds to the stream (model/core/residual.py): through the norm
    after the sublayer (Gemma 2/3, OLMo 2) frozen at this run, and both sublayers' terms in one update for
    a parallel block (GPT-NeoX)."""
    trace = capture(subject) if trace is None else trace
    desc = described(trace.meta)
    modules = dict(subject.module.named_modules())
    steps: dict[str, list[Step]] = {}
    peak = 0
    for stack, subs in sublayers(desc).items():
        resid = _first(trace, f"{stack}.embed.out")  # (T, D): the residual stream entering the update
        rows = []
        for sub in subs:
            whole = residual.whole_of(trace, sub, resid)  # (Tq, D) = resid + update (+ W^O's bias)
            ffn = None
            if sub.ffn is not None:  # the FFN's term, through its post norm when it has one
                ffn = trace[sub.outs[-1]][0].float()
                if sub.post_ffn is not None:
                    pf = residual.frozen(modules[sub.post_ffn], trace, torch.float32)
                    ffn = ffn - pf.bias if pf.bias is not None else ffn  # the norm's bias is no term
            if sub.attn is None:
                c = proximity(torch.stack([resid, ffn]), whole)
                rows.append(Step(sub, c[0].numpy(), ffn=c[1].numpy()))
            else:
                post = residual.frozen(modules[sub.post_attn], trace, torch.float32) if sub.post_attn else None
                c_heads, c_res, c_ffn, chunk = _attention_shares(
                    modules[sub.attn], trace, sub, resid, whole, desc["attention"][sub.attn]["causal"], chunk_bytes,
                    post, ffn)
                peak = max(peak, chunk)
                rows.append(Step(sub, c_res, heads=c_heads, ffn=c_ffn))
            resid = residual.after_of(trace, sub, whole)
        steps[stack] = rows
    out_stack = "encoder" if subject.kind == "encoder" else "decoder"
    return Routes(desc, steps, {k: list(v) for k, v in subject.tokens.items()}, out_stack, subject.position,
                  peak, step_labels(desc))


def term_values(module, v: torch.Tensor, post: residual.FrozenNorm | None = None) -> torch.Tensor:
    """u[h, j] = v_{kv(h), j} W^O_h (`head_values`), centred when a LayerNorm follows the attention (centring is
    linear: centre(sum_j alpha_j u_j) = sum_j alpha_j centre(u_j)). v [H_kv, Tk, hs] -> [H, Tk, D]."""
    u = head_values(module, v)
    return u - u.mean(-1, keepdim=True) if post is not None and post.center else u


def attention_terms(A: torch.Tensor, u: torch.Tensor, post: residual.FrozenNorm | None, a: int, b: int,
                    k: int) -> torch.Tensor:
    """The terms alpha_hij * v_j W^O_h of query rows a..b-1 over keys 0..k-1, (H, rows, k, D): what each (head,
    key) adds to the residual stream, through the norm after attention (frozen: its scale at each query row and
    its gain) when the block has one. Summed over heads and keys, plus W^O's bias (through the norm) and the
    norm's bias, they are the update (model/core/residual.py; tests/test_residual.py)."""
    block = A[:, a:b, :k, None] * u[:, None, :k, :]
    if post is not None:
        block.mul_(post.scale[None, a:b, None, :].to(block.dtype) * post.gain.to(block.dtype))
    return block


def _attention_shares(module, trace, sub: Sublayer, resid, whole, causal: bool, chunk_bytes: int,
                      post: residual.FrozenNorm | None = None, ffn: torch.Tensor | None = None):
    """[Tq, H, Tk] head/key shares, [Tq] residual shares and ([Tq] or None) the FFN's shares of one update with
    attention, a block of query rows at a time: a block holds rows x H x keys x D floats, never the whole
    T x T x H x D. Each (head, key) term is alpha * v W^O_h, through `post` (the norm after attention, frozen);
    `ffn` [Tq, D]: a parallel block's FFN term, in the same sum."""
    A = _first(trace, f"{sub.attn}.weights")  # (H, Tq, Tk)
    u = term_values(module, trace[f"{sub.attn}.v"][0], post)  # (H, Tk, D)
    H, Tq, Tk = A.shape
    D = u.shape[-1]
    norm = whole.abs().sum(-1)  # (Tq,) ||y||_1
    prox_res = (norm - (whole - resid).abs().sum(-1)).clamp(min=0)  # (Tq,)
    prox_ffn = None if ffn is None else (norm - (whole - ffn).abs().sum(-1)).clamp(min=0)
    prox = torch.zeros(Tq, H, Tk)
    rows = max(1, chunk_bytes // (4 * H * Tk * D))
    peak = 0
    for a in range(0, Tq, rows):
        b = min(Tq, a + rows)
        k = b if causal and Tq == Tk else Tk  # a causal block's later keys have weight 0: prox 0
        block = attention_terms(A, u, post, a, b, k)  # (H, rows, k, D)
        peak = max(peak, block.numel() * block.element_size())
        block.neg_().add_(whole[None, a:b, None, :]).abs_()  # in place: |y_i - alpha v W^O|
        dist = block.sum(-1)  # (H, rows, k)
        del block
        prox[a:b, :, :k] = (norm[None, a:b, None] - dist).clamp_(min=0).permute(1, 0, 2)
        # a zero weight makes the term 0 and its proximity exactly 0; keep it so despite rounding
        prox[a:b, :, :k] *= (A[:, a:b, :k] > 0).permute(1, 0, 2)
    total = prox.sum((1, 2)) + prox_res + (0 if prox_ffn is None else prox_ffn)
    total = total.clamp(min=1e-30)
    return ((prox / total[:, None, None]).numpy(), (prox_res / total).numpy(),
            None if prox_ffn is None else (prox_ffn / total).numpy(), peak)


# ---------------------------------------------------------------------- weights, norms, rollout, flow


def attention_modules(desc: dict) -> list[str]:
    return list(desc["attention"])


def last_attention(subject: Subject, desc: dict) -> str:
    """The module whose row the baselines read: the last layer's cross-attention for the translator
    (the one that reads the source), else the last self-attention of the output stack."""
    want = "cross" if subject.kind == "seq2seq" else ("encoder_self" if subject.kind == "encoder" else "decoder_self")
    return [n for n, info in desc["attention"].items() if info["kind"] == want][-1]


@torch.no_grad()
def norm_based(module, weights: torch.Tensor, v: torch.Tensor, post: residual.FrozenNorm | None = None,
               q0: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Kobayashi et al.: per head ||alpha_hij v_{kv(h)j} W^O_h|| = alpha_hij ||u_hj||, [H, Tq, Tk], and per
    layer ||sum_h alpha_hij u_hj||, [Tq, Tk]. weights [H, Tq, Tk] (query rows q0..q0+Tq-1), v [H_kv, Tk, hs].
    `post`: the norm after attention (Gemma 2/3, OLMo 2), frozen: each term is measured as it enters the
    residual stream (`attention_terms`), through that norm's scale at its query row and its gain."""
    u = term_values(module, v, post)  # (H, Tk, D)
    Tq, Tk = weights.shape[1:]
    gain = torch.ones(u.shape[-1]) if post is None else post.gain.float()
    scale = torch.ones(Tq) if post is None else post.scale[q0:q0 + Tq, 0].float()
    per_head = weights.float() * (u * gain).norm(dim=-1)[:, None, :] * scale[None, :, None]
    per_layer = torch.empty(Tq, Tk)
    rows = max(1, CHUNK_BYTES // (4 * Tk * u.shape[-1]))
    for a in range(0, Tq, rows):
        b = min(Tq, a + rows)
        per_layer[a:b] = torch.einsum("hqk,hkd->qkd", weights[:, a:b].float(), u * gain).norm(dim=-1) * scale[a:b, None]
    return per_head, per_layer


def post_norm(subject: Subject, trace, module: str) -> residual.FrozenNorm | None:
    """The norm between attention `module` and the residual stream (sandwich, post), frozen at this run; None."""
    for subs in sublayers(described(trace.meta)).values():
        for u in subs:
            if u.attn == module and u.post_attn:
                return residual.frozen(dict(subject.module.named_modules())[u.post_attn], trace, torch.float32)
    return None


def rollout(attentions: Sequence[np.ndarray], residual: float = 0.5) -> np.ndarray:
    """Abnar & Zuidema: R = A~_L ... A~_1 with A~ = (1 - residual) A + residual I, rows normalised.
    attentions: per layer [T, T] (head mean), first layer first. Row i of R: how much of position i
    at the top comes from each input token."""
    T = attentions[0].shape[-1]
    R = np.eye(T)
    for A in attentions:
        At = (1 - residual) * np.asarray(A, dtype=np.float64) + residual * np.eye(T)
        At = At / At.sum(-1, keepdims=True)
        R = At @ R
    return R


def _rollout_steps(trace, desc: dict, residual: float = 0.5) -> dict[str, list[Step]]:
    """Rollout as shares on the same layer graph as the routes (so it also runs on the translator:
    a cross-attention row keeps `residual` for its own position and gives the rest to the encoder's
    top row); FFNs pass everything through."""
    steps: dict[str, list[Step]] = {}
    for stack, subs in sublayers(desc).items():
        rows = []
        for sub in subs:
            if sub.kind == "ffn":
                n = trace[sub.out].shape[1]
                rows.append(Step(sub, np.ones(n), ffn=np.zeros(n)))
                continue
            A = trace[f"{sub.module}.weights"][0].double().mean(0).numpy()  # (Tq, Tk)
            mix = (1 - residual) * A
            res = np.full(A.shape[0], residual)
            # self: A~ = (1-r) A + r I, rows normalised; cross: the same row, its keys on the encoder
            total = mix.sum(-1) + res
            rows.append(Step(sub, res / total, heads=(mix / total[:, None])[:, None, :]))
        steps[stack] = rows
    return steps


def rollout_importance(subject: Subject, trace, residual: float = 0.5) -> dict[str, np.ndarray]:
    desc = described(trace.meta)
    steps = _rollout_steps(trace, desc, residual)
    out_stack = "encoder" if subject.kind == "encoder" else "decoder"
    return compose(steps, out_stack, subject.position, {s: len(subject.tokens[_side(desc, s)]) for s in steps})


def max_flow(capacity: dict[int, dict[int, float]], source: int, sink: int) -> float:
    """Edmonds–Karp: the maximum flow from source to sink; capacity[u][v] >= 0 (a small graph)."""
    from collections import deque

    residual: dict[int, dict[int, float]] = {}
    for u, out in capacity.items():
        for v, c in out.items():
            residual.setdefault(u, {})[v] = residual.get(u, {}).get(v, 0.0) + c
            residual.setdefault(v, {}).setdefault(u, 0.0)
    total = 0.0
    while True:
        parent = {source: None}
        queue = deque([source])
        while queue and sink not in parent:
            u = queue.popleft()
            for v, c in residual.get(u, {}).items():
                if c > 1e-12 and v not in parent:
                    parent[v] = u
                    queue.append(v)
        if sink not in parent:
            return total
        path, v = [], sink
        while parent[v] is not None:
            path.append((parent[v], v))
            v = parent[v]
        push = min(residual[u][v] for u, v in path)
        for u, v in path:
            residual[u][v] -= push
            residual[v][u] += push
        total += push


def attention_flow(attentions: Sequence[np.ndarray], position: int, residual: float = 0.5,
                   max_nodes: int = FLOW_MAX_NODES) -> np.ndarray:
    """Abnar & Zuidema's attention flow: for each input token j, the max-flow from (layer 0, j) to
    (top, position) when the edge (l-1, j) -> (l, i) has capacity A~_l[i, j]. [T]."""
    L, T = len(attentions), attentions[0].shape[-1]
    nodes = T * (L + 1)
    if nodes > max_nodes:
        raise FlowTooLarge(nodes, max_nodes, T, L)
    cap: dict[int, dict[int, float]] = {}
    for layer, A in enumerate(attentions):
        At = (1 - residual) * np.asarray(A, dtype=np.float64) + residual * np.eye(T)
        At = At / At.sum(-1, keepdims=True)
        for i in range(T):
            for j in np.nonzero(At[i] > 0)[0]:
                cap.setdefault(layer * T + int(j), {})[(layer + 1) * T + i] = float(At[i, j])
    sink = L * T + position
    return np.array([max_flow(cap, j, sink) for j in range(T)])


# ---------------------------------------------------------------------- the causal answer


def value_hooks(subject: Subject, desc: dict, sources: Sequence[int]) -> dict:
    """Batch row r zeroes the value vector of source token sources[r] in every attention module whose
    keys are the source side (the model's description says which)."""
    idx = torch.tensor(list(sources))
    rows = torch.arange(len(idx))
    side = subject.source_side

    def zero(t: torch.Tensor, name: str) -> torch.Tensor:  # (B, H_kv, Tk, hs)
        t = t.clone()
        t[rows, :, idx] = 0
        return t

    mods = [n for n, info in desc["attention"].items() if info["key_tokens"] == side]
    return {f"{n}.v": zero for n in mods}


@torch.no_grad()
def causal_effect(subject: Subject, desc: dict | None = None, batch: int = 16, reuse_prefix: bool = True) -> np.ndarray:
    """Per source token: |change of the measured output| when its value vectors are zeroed in every
    layer (one batch row per token). [n_sources].

    reuse_prefix (a language model): a batch whose first source is token a runs positions a.. only, on the
    clean run's keys and values of the positions before a. Zeroing a value at or after a cannot change an
    earlier position (the look-ahead mask), so this is the same computation with half the work on average
    (SmolLM2, 128 tokens, quiet: 19.6 s -> 12.0 s, bench/flow.py); equal to the full runs within float rounding
    (tests/test_flow.py)."""
    desc = desc or subject.module.describe()
    clean_out = subject.forward()
    clean = subject.measure(clean_out)
    src = subject.sources
    n_tok = 1 if subject.kind == "lm" else clean_out.shape[1]  # an LM returns the measured row only
    vocab = clean_out.shape[-1]
    batch = max(1, min(batch, (256 * 2**20) // max(1, n_tok * vocab * 4)))
    if subject.kind == "lm" and reuse_prefix and hasattr(subject.module, "new_cache"):
        return _lm_causal_effect(subject, desc, clean, batch)
    out = []
    for a in range(0, len(src), batch):
        chunk = src[a:a + batch]
        o = subject.forward(value_hooks(subject, desc, chunk), batch=len(chunk))
        if subject.kind == "encoder":
            out.append(subject.measure(o, clean_out).numpy())
        else:
            out.append((subject.measure(o) - clean).abs().numpy())
    return np.concatenate(out)


def _lm_causal_effect(subject: Subject, desc: dict, clean: torch.Tensor, batch: int) -> np.ndarray:
    """causal_effect of a language model, each batch on the positions from its first source on (see there)."""
    m = subject.module
    ids = subject.ids["tgt"][:, :subject.position + 1]  # (1, P): later tokens cannot matter
    src = subject.sources  # 0 .. P-1: every position up to the measured one
    prefix, done = m.new_cache(), 0  # the clean run's keys and values of positions < done, per layer
    out = []
    for a in range(0, len(src), batch):
        chunk = src[a:a + batch]
        start, B = chunk[0], len(chunk)
        if start > done:
            m(ids[:, done:start], prefix, offset=done, last_only=True)
            done = start
        cache = [{k: t.expand(B, *t.shape[1:]) for k, t in d.items()} for d in prefix]  # (B, H_kv, start, hs)
        with m.hooks(value_hooks(subject, desc, [j - start for j in chunk])):  # hooks see positions start..
            o = m(ids[:, start:].expand(B, -1), cache, offset=start, last_only=True)  # (B, 1, V)
        out.append((subject.measure(o) - clean).abs().numpy())
    return np.concatenate(out)


# ---------------------------------------------------------------------- agreement


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their mean rank (as Spearman's rho wants)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x))
    r[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        tie = x == v
        if tie.sum() > 1:
            r[tie] = r[tie].mean()
    return r


def spearman(a, b) -> float:
    """Spearman's rank correlation; nan when either side is constant (or under 2 values)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    return float(np.corrcoef(ra, rb)[0, 1])


def top_k_overlap(a, b, k: int = 3) -> float:
    """|top-k(a) ∩ top-k(b)| / k (k capped by the length)."""
    k = min(k, len(a))
    if k == 0:
        return float("nan")
    ta = set(np.argsort(-np.asarray(a), kind="mergesort")[:k].tolist())
    tb = set(np.argsort(-np.asarray(b), kind="mergesort")[:k].tolist())
    return len(ta & tb) / k


@dataclass
class Comparison:
    """One prediction: each method's importance over the source tokens beside the causal effect."""

    tokens: list[str]  # the source tokens compared
    effect: np.ndarray
    methods: dict[str, np.ndarray]
    rho: dict[str, float]
    top_k: dict[str, float]
    k: int
    metric: str
    target_token: str
    position: int
    notes: dict[str, str] = field(default_factory=dict)  # a method left out, and why

    def best(self) -> tuple[str, float, str | None, float | None]:
        """(best method, its rho, runner-up, its rho) among the methods with a rho."""
        ok = sorted(((r, m) for m, r in self.rho.items() if not math.isnan(r)), reverse=True)
        if not ok:
            return "", float("nan"), None, None
        second = ok[1] if len(ok) > 1 else (None, None)
        return ok[0][1], ok[0][0], second[1], second[0]


def source_importance(subject: Subject, trace, routes_: Routes | None = None,
                      flow: bool = False) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Each method's importance of the source tokens (see Subject.sources) for the prediction."""
    desc = described(trace.meta)
    src = subject.sources
    side_stack = "encoder" if subject.source_side == "src_tokens" else "decoder"
    mod = last_attention(subject, desc)
    module = dict(subject.module.named_modules())[mod]
    W = trace[f"{mod}.weights"][0]  # (H, Tq, Tk)
    v = trace[f"{mod}.v"][0]
    _, per_layer = norm_based(module, W[:, subject.position:subject.position + 1], v, post_norm(subject, trace, mod),
                              subject.position)
    out = {"raw": W[:, subject.position].double().mean(0).numpy()[src],
           "norm": per_layer[0].double().numpy()[src],
           "rollout": rollout_importance(subject, trace)[side_stack][src]}
    r = routes_ if routes_ is not None else routes(subject, trace)
    out["routes"] = r.importance()[side_stack][src]
    notes = {}
    if flow:
        if subject.kind == "seq2seq":
            notes["flow"] = "attention flow is drawn over one stack's layers; the translator has two"
        else:
            A = [trace[f"{n}.weights"][0].double().mean(0).numpy() for n in desc["attention"]]
            try:
                out["flow"] = attention_flow([a[: subject.position + 1, : subject.position + 1]
                                              if subject.kind == "lm" else a for a in A], subject.position)[src]
            except FlowTooLarge as e:
                notes["flow"] = str(e)
    return out, notes


def compare(subject: Subject, k: int = 3, flow: bool = False, trace=None, routes_: Routes | None = None) -> Comparison:
    """Every method against the causal effect on one prediction."""
    trace = capture(subject) if trace is None else trace
    methods, notes = source_importance(subject, trace, routes_, flow)
    effect = causal_effect(subject, described(trace.meta))
    toks = [subject.tokens[subject.source_side][i] for i in subject.sources]
    return Comparison(toks, effect, methods, {m: spearman(v, effect) for m, v in methods.items()},
                      {m: top_k_overlap(v, effect, k) for m, v in methods.items()}, k, subject.metric,
                      subject.target_token, subject.position, notes)


# ---------------------------------------------------------------------- prompt sets


@dataclass
class Prompt:
    """One prediction of a prompt set: text or ids, the measured token, an optional contrast."""

    text_or_ids: object
    target: int | None = None
    contrast: int | None = None
    label: str = ""


def ioi_set(lm, n: int = 12) -> list[Prompt]:
    """The IOI prompts (model.analysis.ioi): measured as logit(IO) - logit(S) at the last position."""
    from model.analysis.ioi import ioi_prompts

    return [Prompt(p.text, p.io_id, p.s_id, p.text) for p in ioi_prompts(lm, n)]


def induction_set(lm, n: int = 10, length: int = 10, seed: int = 0) -> list[Prompt]:
    """n random token sequences repeated once, cut before the last repeated token, which is the
    measured target (an induction head completes it by copying what followed it the first time)."""
    from model.loaders.lm import encode_pieces

    vocab = getattr(lm, "model", lm).cfg.vocab_size
    lo, hi = min(1000, vocab // 4), min(20000, vocab)
    tok = getattr(lm, "tokenizer", None)
    special = {int(i) for i, a in tok.get_added_tokens_decoder().items() if a.special} if tok is not None else set()
    pool = [i for i in range(lo, hi) if i not in special]  # = range(lo, hi) where no special is there: same draws
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        seq = rng.sample(pool, length)
        ids, _ = encode_pieces(lm, [seq, seq[:-1]])  # the model's BOS rule once, first (Gemma 3: <bos>)
        out.append(Prompt(ids, seq[-1], None, "induction"))
    return out


ANIMAL = "The animal didn't cross the street because it was too tired"


@dataclass
class AgreementTable:
    """Spearman's rho (and top-k overlap) of each method with the causal effect, per prompt and summarised."""

    rows: list[Comparison]
    methods: list[str]

    def rhos(self, method: str) -> np.ndarray:
        return np.array([c.rho.get(method, float("nan")) for c in self.rows])

    def summary(self) -> dict[str, dict[str, float]]:
        """method -> mean, std (nan-aware: a prompt whose effect is constant has no rho), top-k mean, n."""
        out = {}
        for m in self.methods:
            r = self.rhos(m)
            ok = r[~np.isnan(r)]
            tk = np.array([c.top_k.get(m, float("nan")) for c in self.rows])
            out[m] = {"mean": float(ok.mean()) if len(ok) else float("nan"),
                      "std": float(ok.std()) if len(ok) else float("nan"),
                      "top_k": float(np.nanmean(tk)) if np.isfinite(tk).any() else float("nan"),
                      "n": int(len(ok))}
        return out

    def lead(self):
        """Whether one method clearly leads on this set: model.analysis.claims.lead over the per-prompt rhos
        (paired exact sign test against every other method, Bonferroni; else no method clearly leads)."""
        from model.analysis.claims import lead

        return lead({m: self.rhos(m) for m in self.methods})


def agreement_table(lm, prompts: Sequence[Prompt], k: int = 3,
                    progress: Callable[[int, int], None] | None = None) -> AgreementTable:
    """compare() on every prompt; `progress(done, total)` after each (the page's progress bar)."""
    rows = []
    for i, p in enumerate(prompts):
        subject = prepare(lm, p.text_or_ids, target=p.target, contrast=p.contrast)
        rows.append(compare(subject, k))
        if progress is not None:
            progress(i + 1, len(prompts))
    return AgreementTable(rows, list(METHODS))


# ---------------------------------------------------------------------- what a block wrote


@torch.no_grad()
def block_tokens(subject: Subject, trace, stack: str, row: int, position: int, k: int = 5):
    """What the update into node (stack, row, position) promoted and suppressed in vocabulary space:
    the update (an attention or FFN output, after any norm after it) through the final norm's gain and the
    unembedding (the norm's scale is left out: it rescales every token alike). None where the stack has no
    unembedding (MiniLM, the translator's encoder) or for the embedding row."""
    if row == 0 or subject.kind == "encoder" or stack != "decoder":
        return None
    m = subject.module
    sub = sublayers(described(trace.meta))[stack][row - 1]
    upd = sum(trace[n][0, position].float() for n in sub.outs)  # both sublayers' outputs in a parallel block
    norm = getattr(getattr(m, "decoder", None), "norm", None)
    if norm is not None:  # the final norm's gain (1 + w for Gemma's norm), frozen as in residual.FrozenNorm
        upd = upd * residual.FrozenNorm(norm, upd[None]).gain.float()
    logits = m.generator.weight.float() @ upd  # (V,)
    top, bot = logits.topk(k), (-logits).topk(k)
    piece = subject.piece
    return ([(piece(int(i)), float(v)) for v, i in zip(top.values, top.indices, strict=True)],
            [(piece(int(i)), float(-v)) for v, i in zip(bot.values, bot.indices, strict=True)])


def cross_alignment(subject: Subject, trace) -> dict[str, np.ndarray]:
    """The translator: for the chosen target position, each decoder layer's cross-attention row
    (head mean) over the source tokens, and the routes' share of each source token through the
    encoder. {"layer i": [S], ..., "routes": [S]}."""
    if subject.kind != "seq2seq":
        raise ValueError("cross-attention exists only in the encoder-decoder translator")
    desc = described(trace.meta)
    out = {f"layer {info['layer']}": trace[f"{n}.weights"][0, :, subject.position].double().mean(0).numpy()
           for n, info in desc["attention"].items() if info["kind"] == "cross"}
    out["routes"] = routes(subject, trace).importance()["encoder"]
    return out


# ---------------------------------------------------------------------- lesson 16: a sink head


@dataclass
class SinkHead:
    """One head at the last position: where its weights go, and where its norm-based output comes from."""

    layer: int
    head: int
    module: str
    weights: np.ndarray  # [T]: the attention row
    norms: np.ndarray  # [T]: ||alpha_j v_j W^O_h|| per key
    tokens: list[str]

    @property
    def weight_on_first(self) -> float:
        return float(self.weights[0])

    @property
    def norm_share_on_first(self) -> float:
        """Token 0's share of the head's norm-based output, sum_j ||alpha_j v_j W^O|| = 1."""
        total = float(self.norms.sum())
        return float(self.norms[0]) / total if total > 0 else float("nan")


@torch.no_grad()
def sink_head(lm, text, min_weight: float = 0.5) -> SinkHead:
    """Among the heads that put at least `min_weight` of the last position's attention on token 0, the one
    with the largest gap between that weight and token 0's norm-based share: the weights say "token 0", the
    vectors it moves say otherwise. (Falls back to the head with the most weight on token 0 when none
    reaches min_weight.)"""
    s = prepare(lm, text)
    trace = capture(s)
    desc = described(trace.meta)
    modules = dict(s.module.named_modules())
    best, fallback, best_gap = None, None, -math.inf
    for name, info in desc["attention"].items():
        W = trace[f"{name}.weights"][0][:, s.position]  # (H, T)
        per_head, _ = norm_based(modules[name], trace[f"{name}.weights"][0][:, s.position:s.position + 1],
                                 trace[f"{name}.v"][0], post_norm(s, trace, name), s.position)
        norms = per_head[:, 0]  # (H, T)
        for h in range(W.shape[0]):
            cand = SinkHead(info["layer"], h, name, W[h].double().numpy(), norms[h].double().numpy(),
                            list(s.tokens[s.out_side]))
            if fallback is None or cand.weight_on_first > fallback.weight_on_first:
                fallback = cand
            gap = cand.weight_on_first - cand.norm_share_on_first
            if cand.weight_on_first >= min_weight and (best is None or gap > best_gap):
                best, best_gap = cand, gap
    return best or fallback
