"""How each block writes into the residual stream: one decomposition that every analysis reads.

A block adds to the residual stream x. Written as a sum of parts, with every norm on the way FROZEN at
its scale on this run (1/rms, or 1/std after centring: the standard direct-logit-attribution
linearisation, exact on the run because the frozen scale is the one the model used):

    pre-norm (GPT-2, Llama):  x + Attn(N1(x)),        then + FFN(N2(x))            two updates
    sandwich (Gemma 2/3):     x + P1(Attn(N1(x))),    then + P2(FFN(N2(x)))        P = the norm after a sublayer
    post (OLMo 2):            x + P1(Attn(x)),        then + P2(FFN(x))
    parallel (GPT-NeoX):      x + Attn(N1(x)) + FFN(N2(x))                         one update, both terms
    post-LN (2017, BERT):     N(x + Attn(x)): the update's sum is N's input, the stream after it N's output

    Attn(.) = Σ_h z_h W^O_h + b_O        z_h = Σ_j α_hj v_j  (one term per head, or per (head, key))
    P(a)    = (a - mean a) · s ⊙ g + b   with s frozen: P(Σ_k a_k) = Σ_k P°(a_k) + b, P° linear
    FFN     = one term, or Σ_e w_e · expert_e + gate · shared  (mixtures of experts)

The language models' residual stream is never normalised, so the last residual (the final norm's input)
is exactly embeddings + every part of every layer (`parts`), and the logits are
    logits = softcap(W_U · (N_final°(x) + b_final))   with the soft-cap frozen too (`Unembedding`):
each token's cap·tanh(l/cap) / l at this run, so a part's logit is that factor × its uncapped logit.

`updates(desc)` gives the wiring from the model's description (trace.meta["model"]), so routes, DLA,
norm-based attention and the logit lens never re-derive it. No streamlit or plotly here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Update:
    """One residual update:  whole = resid + Σ parts  (then `after` = whole, or its norm in post-LN)."""

    stack: str  # "encoder" / "decoder"
    layer: int
    kind: str  # "attn" (self), "cross", "ffn" or "parallel" (attention and FFN in one update)
    attn: str | None  # the attention module whose heads are terms
    ffn: str | None  # the FFN (or mixture) whose output is a term
    post_attn: str | None  # the norm applied to the attention output before it joins (sandwich, post)
    post_ffn: str | None
    whole: str | None  # capture of resid + update; None = computed (no capture holds it: OLMo 2)
    after: str  # capture of the stream after the update ("" = whole)
    key_stack: str = ""  # attention: the stack whose tokens are the keys

    @property
    def module(self) -> str:
        """The module the update's edges name: its attention (also for a parallel block), or its FFN."""
        return self.attn or self.ffn

    @property
    def out(self) -> str:
        """The capture whose tensor is what this update adds (its last sublayer, after any post norm)."""
        if self.ffn is not None and self.attn is None:
            return f"{self.post_ffn}.out" if self.post_ffn else f"{self.ffn}.out"
        return f"{self.post_attn}.out" if self.post_attn else f"{self.attn}.out"

    @property
    def outs(self) -> list[str]:
        """Every capture whose sum is the update (two for a parallel block)."""
        names = []
        if self.attn is not None:
            names.append(f"{self.post_attn}.out" if self.post_attn else f"{self.attn}.out")
        if self.ffn is not None:
            names.append(f"{self.post_ffn}.out" if self.post_ffn else f"{self.ffn}.out")
        return names


def updates(desc: dict) -> dict[str, list[Update]]:
    """Each stack's residual updates in computation order, from the model's description."""
    blocks = desc.get("blocks", {})
    by_layer: dict[tuple[str, int], list[tuple[str, dict]]] = {}
    for name, info in desc["attention"].items():
        by_layer.setdefault((info["stack"], info["layer"]), []).append((name, info))
    out: dict[str, list[Update]] = {}
    for stack, s in desc["stacks"].items():
        subs: list[Update] = []
        for i in range(s["layers"]):
            p = f"{stack}.layers.{i}"
            mods = by_layer.get((stack, i), [])
            if desc.get("family") == "decoder_lm":
                subs += _lm_updates(blocks, p, i, mods[0][0])
                continue
            steps = [("cross" if info["kind"] == "cross" else "attn", name,
                      "encoder" if info["kind"] == "cross" else stack) for name, info in mods]
            steps.append(("ffn", f"{p}.ffn", ""))
            for k, (kind, name, key_stack) in enumerate(steps):
                if blocks.get("norm_first", False):  # pre-LN: the sum is the next norm's input (or the layer output)
                    whole = f"{p}.norm{k + 2}.in" if k + 1 < len(steps) else f"{p}.out"
                    after = whole
                else:  # post-LN: the sum is norm{k+1}'s input, the stream after is its output
                    whole, after = f"{p}.norm{k + 1}.in", f"{p}.norm{k + 1}.out"
                attn, ffn = (None, name) if kind == "ffn" else (name, None)
                subs.append(Update(stack, i, kind, attn, ffn, None, None, whole, after, key_stack))
        out[stack] = subs
    return out


def _lm_updates(blocks: dict, p: str, i: int, attn: str) -> list[Update]:
    """A decoder LM layer's updates (model/families/lm.py's LMBlock)."""
    position = blocks.get("norm_position", "pre")
    post = position != "pre"
    pa, pf = (f"{p}.norm_post_attn", f"{p}.norm_post_ffn") if post else (None, None)
    if blocks.get("residual_multiplier") is not None:  # Granite: each sublayer output × m, a frozen "norm" of scale 1
        pa, pf = f"{p}.scale_attn", f"{p}.scale_ffn"
    if blocks.get("ffn") == "none":  # attention-only (the /learn models): one update per layer
        return [Update("decoder", i, "attn", attn, None, pa, None, f"{p}.out", f"{p}.out", "decoder")]
    if blocks.get("parallel_residual"):
        return [Update("decoder", i, "parallel", attn, f"{p}.ffn", pa, pf, f"{p}.out", f"{p}.out", "decoder")]
    mid = None if position == "post" else f"{p}.norm2.in"  # OLMo 2's FFN reads x + a unnormalised: no capture
    return [Update("decoder", i, "attn", attn, None, pa, None, mid, mid or "", "decoder"),
            Update("decoder", i, "ffn", None, f"{p}.ffn", None, pf, f"{p}.out", f"{p}.out")]


def capture_names(desc: dict) -> list[str]:
    """What `whole`/`after` of every update reads (with the sublayer outputs), as capture names."""
    names = set()
    scaled = desc.get("blocks", {}).get("residual_multiplier") is not None  # Granite's post_* are × m: no .in
    for subs in updates(desc).values():
        for u in subs:
            names.update(u.outs)
            names.update(n for n in (u.whole, u.after) if n)
            names.update(f"{n}.in" for n in (u.post_attn, u.post_ffn) if n and not scaled)
    return sorted(names)


def whole_of(trace, u: Update, resid: torch.Tensor) -> torch.Tensor:
    """resid + the update [.., T, D] (batch 0): the capture where one holds it, else the sum as the model adds it."""
    if u.whole is not None:
        return trace[u.whole][0].float()
    out = resid
    for n in u.outs:
        out = out + trace[n][0].float()
    return out


def after_of(trace, u: Update, whole: torch.Tensor) -> torch.Tensor:
    return trace[u.after][0].float() if u.after and u.after != u.whole else whole


# ---------------------------------------------------------------------- frozen norms


class FrozenNorm:
    """A LayerNorm or RMSNorm with its scale frozen at its value on this run: linear in its input,
    plus its bias. `x_in` [.., T, D] is the norm's recorded input; `part(a)` maps any part of that
    input (same leading shape, or broadcastable to it with T on axis -2) to its share of the output,
    so Σ part(a_k) + bias = the norm's output when Σ a_k = x_in."""

    def __init__(self, module, x_in: torch.Tensor, dtype=torch.float64):
        x = x_in.to(dtype)
        self.center = not hasattr(module, "style") and not hasattr(module, "multiplier")  # LayerNorm centres
        if hasattr(module, "multiplier"):  # Granite's residual_multiplier (model/families/lm.py's Multiplier): × m
            self.scale = torch.ones_like(x[..., :1])
            self.gain = torch.full(x.shape[-1:], module.multiplier, dtype=dtype)
            self.bias = None
        elif self.center:
            self.scale = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + module.eps)  # (.., T, 1)
            self.gain = module.weight.detach().to(dtype)
            self.bias = None if module.bias is None else module.bias.detach().to(dtype)
        else:
            self.scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.eps)
            w = module.weight.detach().to(dtype)
            self.gain = 1.0 + w if module.style == "gemma" else w
            self.bias = None

    def part(self, a: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        a = a.to(self.gain.dtype)
        if self.center:
            a = a - a.mean(-1, keepdim=True)
        return a * (self.scale if scale is None else scale) * self.gain

    def rows(self, index) -> torch.Tensor:
        """The frozen scale of some positions (T axis), [.., n, 1]."""
        return self.scale[..., index, :]


def frozen(module_or_none, trace, dtype=torch.float64) -> FrozenNorm | None:
    """The post-sublayer norm `module` frozen at its recorded input (None stays None)."""
    if module_or_none is None:
        return None
    if hasattr(module_or_none, "multiplier"):  # a constant factor: only the shape of its output is read
        return FrozenNorm(module_or_none, trace[f"{module_or_none.name}.out"][0], dtype)
    return FrozenNorm(module_or_none, trace[f"{module_or_none.name}.in"][0], dtype)


# ---------------------------------------------------------------------- the parts of one update


def head_outputs(attn, z: torch.Tensor) -> torch.Tensor:
    """z_h W^O_h per head: z [H, T, hs] -> [H, T, D] (W^O's bias is a part of its own)."""
    W = attn.w_o.weight.to(z.dtype)  # (D, H*hs)
    H, hs = attn.n_heads, attn.d_head
    return torch.einsum("htk,dhk->htd", z, W.view(W.shape[0], H, hs))


def ffn_parts(ffn, trace, dtype=torch.float64) -> list[tuple[str, torch.Tensor]]:
    """The FFN's output as parts [T, D]: one, or each routed expert (its weight × its output) and the
    shared expert (× its gate) for a mixture of experts."""
    name = ffn.name
    if not hasattr(ffn, "experts"):
        return [("ffn", trace[f"{name}.out"][0].to(dtype))]
    ids = trace[f"{name}.router.topk_ids"][0]  # (T, k)
    w = trace[f"{name}.router.topk_weights"][0].to(dtype)  # (T, k)
    parts = []
    for e in range(len(ffn.experts)):
        weight = (w * (ids == e)).sum(-1, keepdim=True)  # (T, 1): 0 where not routed
        parts.append((f"expert {e}", trace[f"{name}.experts.{e}.out"][0].to(dtype) * weight))
    if ffn.shared_expert is not None:
        shared = trace[f"{name}.shared_expert.out"][0].to(dtype)
        if ffn.shared_gate is not None:
            shared = shared * trace[f"{name}.shared_gate"][0].to(dtype)
        parts.append(("shared expert", shared))
    return parts


def ffn_capture(ffn) -> list[str]:
    name = ffn.name
    if not hasattr(ffn, "experts"):
        return [f"{name}.out"]
    names = [f"{name}.router.topk_ids", f"{name}.router.topk_weights"]
    names += [f"{name}.experts.{e}.out" for e in range(len(ffn.experts))]
    if ffn.shared_expert is not None:
        names.append(f"{name}.shared_expert.out")
        if ffn.shared_gate is not None:
            names.append(f"{name}.shared_gate")
    return names


@dataclass
class Part:
    """One part of the residual stream at the chosen positions."""

    label: str  # "embed", "L3 H5", "L3 attn bias", "L3 ffn", "L3 expert 2", "L3 post-attn norm bias", ...
    kind: str  # "embed", "pos", "head", "attn_bias", "ffn", "expert", "norm_bias"
    layer: int | None
    head: int | None
    vector: torch.Tensor  # [n, D] float64 (n = positions asked for)


def lm_capture(model) -> list[str]:
    """Every capture `lm_parts` reads for this decoder LM."""
    c = model.cfg
    names = ["decoder.embed.tok", "decoder.norm.in", "logits"]
    names += ["decoder.embed.pos"] if c.positional == "learned" else []
    names += ["logits_uncapped"] if c.final_softcap is not None else []
    for layer in model.decoder.layers:
        names.append(f"{layer.self_attn.name}.z")
        names += ffn_capture(layer.ffn) if layer.ffn is not None else []
        names += [f"{n.name}.in" for n in (layer.norm_post_attn, layer.norm_post_ffn) if n is not None]
        names += [f"{n.name}.out" for n in (layer.scale_attn, layer.scale_ffn) if n is not None]
    return names


@torch.no_grad()
def update_parts(model, trace, u: Update, positions) -> list[Part]:
    """The parts one update of a decoder LM adds at `positions` ([n, D] float64 each): each head, W^O's bias,
    the FFN (or its experts), the bias of a norm after a sublayer, all through that norm frozen. They sum to
    the update (its `outs`' sum) at those positions."""
    pos = torch.as_tensor(positions).reshape(-1)
    modules = dict(model.named_modules())
    i, parts = u.layer, []
    if u.attn is not None:
        attn = modules[u.attn]
        pa = frozen(modules[u.post_attn], trace) if u.post_attn else None
        post = (lambda a: a) if pa is None else (lambda a: pa.part(a, pa.rows(pos)))
        heads = head_outputs(attn, trace[f"{u.attn}.z"][0][:, pos].double())  # (H, n, D)
        parts += [Part(f"L{i} H{h}", "head", i, h, post(heads[h])) for h in range(attn.n_heads)]
        if attn.w_o.bias is not None:
            bias = attn.w_o.bias.double().expand(len(pos), -1)
            parts.append(Part(f"L{i} attn bias", "attn_bias", i, None, post(bias)))
        if pa is not None and pa.bias is not None:
            parts.append(Part(f"L{i} post-attention norm bias", "norm_bias", i, None, pa.bias.expand(len(pos), -1)))
    if u.ffn is not None:
        pf = frozen(modules[u.post_ffn], trace) if u.post_ffn else None
        post = (lambda a: a) if pf is None else (lambda a: pf.part(a, pf.rows(pos)))
        for label, vec in ffn_parts(modules[u.ffn], trace):
            parts.append(Part(f"L{i} {label}", "ffn" if label == "ffn" else "expert", i, None, post(vec[pos])))
        if pf is not None and pf.bias is not None:
            parts.append(Part(f"L{i} post-FFN norm bias", "norm_bias", i, None, pf.bias.expand(len(pos), -1)))
    return parts


@torch.no_grad()
def lm_parts(model, trace, positions) -> list[Part]:
    """Every part of a decoder LM's last residual stream (the final norm's input) at `positions`, in float64:
    the embeddings, then every update's parts (`update_parts`). They sum to trace["decoder.norm.in"][0, positions]:
    the stream is never normalised between layers in these wirings, only inside a sublayer's branch."""
    pos = torch.as_tensor(positions).reshape(-1)
    parts = [Part("embed", "embed", None, None, trace["decoder.embed.tok"][0, pos].double())]
    if "decoder.embed.pos" in trace.names():
        parts.append(Part("positions", "pos", None, None, trace["decoder.embed.pos"][pos].double()))
    for u in updates(model.describe())["decoder"]:
        parts += update_parts(model, trace, u, pos)
    return parts


class Unembedding:
    """The path from the last residual stream to the logits, frozen at this run at `positions`: the final
    norm's scale and the final soft-cap's factor cap·tanh(l/cap)/l per token (1 without a cap). Linear:
    `logit(part, tokens)` is a part's contribution to those tokens' logits, and over every part of `lm_parts`
    plus `bias_logit` they sum to the model's logits exactly (up to float rounding)."""

    def __init__(self, model, trace, positions):
        pos = torch.as_tensor(positions).reshape(-1)
        self.norm = FrozenNorm(model.decoder.norm, trace["decoder.norm.in"][0, pos])
        self.W = model.generator.weight.detach()
        b = model.generator.bias  # Phi's unembedding bias: a part of its own (bias_logit)
        self.b = None if b is None else b.detach().double()
        c = model.cfg  # Cohere's logit_scale (×) and Granite's logits_scaling (÷): one constant factor
        self.scale = (c.logit_scale or 1.0) / (c.logits_scaling or 1.0)
        logits = trace["logits"][0, pos].double()
        if "logits_uncapped" in trace.names():
            raw = trace["logits_uncapped"][0, pos].double()
            safe = torch.where(raw == 0, torch.ones_like(raw), raw)
            self.factor = torch.where(raw == 0, torch.ones_like(raw), logits / safe)  # (n, V)
        else:
            self.factor = None

    def logit(self, vector: torch.Tensor, tokens) -> torch.Tensor:
        """[n, D] part -> [n, len(tokens)] its contribution to those tokens' (capped) logits."""
        tokens = torch.as_tensor(tokens).reshape(-1)
        out = self.norm.part(vector) @ self.W[tokens].double().T * self.scale
        return out if self.factor is None else out * self.factor[:, tokens]

    def bias_logit(self, tokens) -> torch.Tensor:
        """The final norm's bias (LayerNorm) through the unembedding, plus the unembedding's own bias (Phi):
        [n, len(tokens)] (0 for RMSNorm without one)."""
        tokens = torch.as_tensor(tokens).reshape(-1)
        n = self.norm.scale.shape[0]
        out = torch.zeros(n, len(tokens), dtype=torch.float64)
        if self.norm.bias is not None:
            out = out + (self.W[tokens].double() @ self.norm.bias).expand(n, -1)
        if self.b is not None:
            out = out + self.b[tokens].expand(n, -1)
        out = out * self.scale
        return out if self.factor is None else out * self.factor[:, tokens]

    def direction_gain(self) -> torch.Tensor:
        """The final norm's gain (1 + w for Gemma): what a part is multiplied by before W_U, apart from the
        frozen scale (the same for every token)."""
        return self.norm.gain


# ---------------------------------------------------------------------- vision transformer (issue 40)


def vit_capture(model) -> list[str]:
    """Every capture `vit_parts` and `ClassReadout` read for model/families/vit.py's VisionTransformer."""
    names = ["encoder.embed.tok", "encoder.embed.pos", "encoder.norm.in", "logits"]
    for layer in model.encoder.layers:
        names += [f"{layer.self_attn.name}.z", f"{layer.self_attn.name}.out", f"{layer.ffn.name}.out"]
    return names


@torch.no_grad()
def vit_parts(model, trace, positions) -> list[Part]:
    """Every part of a vision transformer's last residual stream (the final norm's input) at token `positions`
    (0 = [CLS]): the token embeddings ([CLS], registers, W_E·patch + b), the positions, then each pre-norm update's
    parts (`update_parts`: each head, W^O's bias, the FFN). They sum to trace["encoder.norm.in"][0, positions]."""
    pos = torch.as_tensor(positions).reshape(-1)
    parts = [Part("embed", "embed", None, None, trace["encoder.embed.tok"][0, pos].double()),
             Part("positions", "pos", None, None, trace["encoder.embed.pos"][pos].double())]
    for u in updates(model.describe())["encoder"]:
        parts += update_parts(model, trace, u, pos)
    return parts


class ClassReadout:
    """A vision transformer's logits from its [CLS] stream, the final norm frozen at this run:
    logits = W_head · (N°(x_CLS) + b_norm) + b_head, so Σ logit(part) + bias_logit() = the model's logits."""

    def __init__(self, model, trace):
        self.norm = FrozenNorm(model.encoder.norm, trace["encoder.norm.in"][0, :1])
        self.W = model.head.weight.detach().double()  # (C, D)
        self.b = model.head.bias.detach().double()

    def logit(self, vector: torch.Tensor) -> torch.Tensor:
        """[1, D] part at [CLS] -> [1, C] its contribution to each class's logit."""
        return self.norm.part(vector) @ self.W.T

    def bias_logit(self) -> torch.Tensor:
        return ((self.W @ self.norm.bias) + self.b)[None]
