"""What changed since 2017: the 2017 Transformer's blocks beside a modern LM's, each with live tensors.

The modern side is the sidebar's language model (SmolLM2 when the sidebar shows another kind of model); the 2017
side is the sidebar's toy model (the default toy model otherwise). Sections: RoPE vs sinusoidal PE, grouped-query
attention, RMSNorm vs LayerNorm, SwiGLU, pre-LN. URL parameters: layer, head (the LM's), pos (the token shown).

A long prompt (more tokens than long_views.CELLS_UP_TO; the trace is then usually a LazyTrace that computes a
layer's tensors when asked): every section still draws, in views that keep meaning at that length: per-token
figures show the FM.WINDOW_ROWS tokens around the chosen one, the sliding-window mask is pooled to blocks (share
of open cells) and its reach is the closed form, the soft-cap's numbers are summed tile by tile over every visible
cell and its points are the chosen token's row. Nothing holds every layer's T × T at once.
"""

import numpy as np
import streamlit as st
import torch

from model.analysis import long as LG
from model.core.attention import softcap
from model.core.trace import LazyTrace
from viz.figures import attention as F
from viz.figures import modern as FM
from viz.i18n import t
from viz.ui import lm_models
from viz.ui.long_views import CELLS_UP_TO
from viz.ui.models import checkpoint_names, get_trace, is_real_model, is_real_name, load_ckpt
from viz.ui.render import show_error, show_figure, tokens_of
from viz.ui.sidebar import default_checkpoint, model_label, selection
from viz.ui.state import clamp_state, int_in, seed_from_query, write_query
from viz.ui.text import md_escape, text_problems

KV_TOKENS = 8192  # the context length the KV-cache bytes are given at

st.title(t("What changed since 2017"))
st.caption(t("Today's language models are still the decoder of “Attention Is All You Need”, with five blocks "
             "replaced. Each section below shows one, with the live tensors of a modern model beside the lab's "
             "2017-style toy model.") + " " + t("Sections 6–11 add what the 2024–2026 families brought (sliding "
                                              "windows, q/k norm, soft-capping, RoPE scaling, mixtures of experts, "
                                              "learned attention sinks), drawn on a model that has them."))
sel = selection()
if sel is None:
    st.stop()


def stand_in_note(chosen: str, lm_label: str) -> str:
    """Why the modern side shows another model than the sidebar's (issue 38 §5: SmolLM2 was drawn, unsaid)."""
    ck = load_ckpt(chosen)
    if getattr(ck, "family", None) == "decoder_lm_adapter":
        why = t("it runs via transformers, which does not give the norms, the feed-forward network's internals or "
                "the rotary q and k that these sections draw")
    else:
        why = t("it is not a decoder-only language model")
    return t("The sidebar's model is {chosen}, but {why}: the modern side of this page shows {lm} instead.",
             chosen=model_label(chosen), why=why, lm=lm_label)

names = checkpoint_names()
sel_is_lm = is_real_model(sel) and sel.ckpt.family == "decoder_lm"
lm_name = sel.name if sel_is_lm else next((n for n in ("smollm2", *lm_models.names()) if n in names
                                           and lm_models.is_real(n)
                                           and load_ckpt(n).family == "decoder_lm"), None)
toys = [n for n in names if not is_real_name(n)]  # a /learn checkpoint is a language model
toy_name = sel.name if sel.name in toys else (default_checkpoint(toys) if toys else None)
if lm_name is None or toy_name is None:
    show_error(t("This page needs a language model (such as SmolLM2) and a toy model, and this server "
                        "offers {what}.", what=t("no language model") if lm_name is None else t("no toy model")))
    st.stop()
rm = load_ckpt(lm_name)
toy = load_ckpt(toy_name)
lm_text = sel.text if sel_is_lm else rm.example
toy_text = sel.text if sel.name == toy_name else toy.example
problem = text_problems(lm_text)
if problem:
    show_error(problem)
    st.stop()
try:
    with st.spinner(t("Running the model…")):
        trace = get_trace(lm_name, lm_text)
        toy_trace = get_trace(toy_name, toy_text)
except ValueError as e:
    show_error(e, t("Shorten or change the text in the sidebar."))
    st.stop()

lm = rm.obj.model
cfg = lm.cfg
desc = trace.meta["model"]
blocks = desc.get("blocks", {})
lm_label, toy_label = model_label(lm_name), model_label(toy_name)
tokens = tokens_of(trace, "tgt")
T = len(tokens)
st.info(t("Modern: {lm} on “{text}” ({n} tokens). 2017: the toy model {toy} on “{toy_text}”.", lm=lm_label,
          text=md_escape(lm_text[:120]), n=T, toy=toy_label, toy_text=md_escape(toy_text[:120])),
        icon="🧭")
if not sel_is_lm and sel.name != toy_name:  # the modern side is not the sidebar's model: said, never silently
    st.warning(stand_in_note(sel.name, lm_label), icon="🔁")

n_layers, n_heads = cfg.n_layers, cfg.n_heads
seed_from_query("s17_layer", "layer", 0, int, int_in(0, n_layers - 1))
seed_from_query("s17_head", "head", 0, int, int_in(0, n_heads - 1))
seed_from_query("s17_pos", "pos", T - 1, int, int_in(0, T - 1))
clamp_state("s17_layer", 0, n_layers - 1)
clamp_state("s17_head", 0, n_heads - 1)
clamp_state("s17_pos", 0, T - 1)
c1, c2, c3 = st.columns(3)
layer = c1.selectbox(t("Layer"), range(n_layers), key="s17_layer")
head = c2.selectbox(t("Head"), range(n_heads), key="s17_head")
pos = c3.selectbox(t("Token"), range(T), key="s17_pos",
                   format_func=dict(enumerate(f"{i}: {F.show_token(tok)}" for i, tok in enumerate(tokens))).get)
write_query(layer=layer, head=head, pos=pos)
L = f"decoder.layers.{layer}"
labels = F.token_labels(tokens, T)
# A long prompt: T × T maps pooled, per-token figures a window of tokens around the chosen one (issue 24).
long = T > CELLS_UP_TO
w0, w1 = FM.token_window(T, pos) if long else (0, T)
rows = slice(w0, w1)


def window_caption(what: str) -> None:
    """Under a per-token figure of a long prompt: which tokens its rows are."""
    st.caption(t("{what}: tokens {a} to {b} of {T}, the {n} around the chosen token (pick another token above to "
                 "move the window).", what=what, a=w0, b=w1 - 1, T=f"{T:,}", n=w1 - w0))


def arr(name: str) -> np.ndarray:
    return trace[name][0].double().numpy() if trace[name].dim() > 2 else trace[name].double().numpy()


# ---------------------------------------------------------------- 1. RoPE

st.header(t("1. Positions: rotated, not added"))
st.markdown(t("2017 adds a fixed pattern to each token's embedding, $x_p = e + PE(p)$ with $PE(p, 2i) = "
              "\\sin(p / 10000^{2i/d})$, so every score mixes content with absolute position. RoPE instead turns "
              "each pair of q's and k's dimensions by the angle $p\\,\\theta_i$, $\\theta_i = b^{-2i/d}$: then "
              "$\\mathrm{rot}(q, m) \\cdot \\mathrm{rot}(k, n)$ depends only on $m - n$, the distance."))
if blocks.get("positional") != "rotary":
    st.info(t("{model} does not rotate: its positions are {kind}, added to the embeddings as in 2017.",
              model=lm_label, kind=blocks.get("positional")), icon="🧩")
elif desc["attention"][f"{L}.self_attn"]["rope"] is None:  # SmolLM3: some layers use no positions at all
    st.info(t("Layer {l} of {model} does not rotate q and k: it has no positional information at all (NoPE); the "
              "layers around it use RoPE. Pick another layer in the sidebar to see its angles.",
              l=layer, model=lm_label), icon="🧩")
else:
    rope0 = desc["attention"][f"{L}.self_attn"]["rope"]  # this layer's RoPE, as the model describes it
    base = float(rope0["base"])
    rd = int(rope0.get("rotary_dim") or cfg.d_head)  # partial rotary (GPT-NeoX): only the first rd dims turn
    inv = FM.inv_freq_of(rope0, cfg.d_head)
    live = arr(rope0["angles"])  # [T, rd/2]: this prompt's angles, as the model computed them
    angles = FM.rope_angles(max(T, 64), rd, base, inv=inv)  # the same formula over more positions
    angle_diff = float(np.abs(angles[:T] - live).max())
    kv = head // (n_heads // cfg.kv_heads)
    key_pos = 1 if pos > 1 else 0
    q = arr(f"{L}.self_attn.q_unrot")[head, pos][:rd]
    k = arr(f"{L}.self_attn.k_unrot")[kv, key_pos][:rd]
    max_delta = 256
    rope = FM.rope_scores(q, k, base, [key_pos, key_pos + 200], max_delta, inv)
    toy_cfg = toy.cfg
    added = None
    if toy_cfg.positional == "sinusoidal" and not toy_cfg.norm_first:
        from model.core.layers import sinusoidal_encoding

        tm = toy.model
        att = tm.encoder.layers[0].self_attn
        tok = toy_trace["encoder.embed.tok"][0].double().numpy()
        n_src = tok.shape[0]
        starts = [0, min(10, toy_cfg.max_len // 4)]
        toy_delta = min(max_delta, toy_cfg.max_len - 1 - starts[-1])
        pe = sinusoidal_encoding(toy_cfg.max_len, toy_cfg.d_model).double().numpy()
        added = FM.added_scores(tok[min(1, n_src - 1)], tok[0], pe, att.w_q.weight.detach().double().numpy(),
                                att.w_q.bias.detach().double().numpy(), att.w_k.weight.detach().double().numpy(),
                                att.w_k.bias.detach().double().numpy(), min(head, toy_cfg.n_heads - 1),
                                toy_cfg.n_heads, starts, toy_delta)
    pair = t("(“{q}” → “{k}”)", q=F.show_token(tokens[pos]), k=F.show_token(tokens[key_pos]))
    if long:  # the live angles of the window's positions (all T rows would be ~1 pixel each)
        fig = FM.rope_figure(live[rows], rope, added, pair_label=pair, positions=range(w0, w1))
    else:
        fig = FM.rope_figure(angles, rope, added, pair_label=pair)
    show_figure(fig, key="s17_rope")
    if long:
        window_caption(t("Left, each row is one position's angles as the model computed them, mod 2π"))
    spread = float(np.abs(rope[key_pos] - rope[key_pos + 200]).max())
    nums = dict(l=layer, h=head, q=F.show_token(tokens[pos]), k=F.show_token(tokens[key_pos]), diff=f"{spread:.1e}",
                fast=F.num(float(inv[0])), slow=f"{inv[-1]:.2e}", turn=f"{2 * np.pi / inv[-1]:,.0f}",
                base=f"{base:,.0f}", adiff=f"{angle_diff:.1e}")
    if not long:
        msg = t("Layer {l}, head {h}: the query “{q}” and the key “{k}” moved together by 200 positions change their "
                "score by at most {diff} (float rounding): only the distance counts. Pair 0 turns {fast} rad a "
                "position, the last pair {slow} rad (one turn every {turn} positions); base b = {base}. The picture's "
                "first {T} rows are this prompt's angles as the model computed them (largest difference from the "
                "formula: {adiff}).", T=T, **nums)
    else:
        msg = t("Layer {l}, head {h}: the query “{q}” and the key “{k}” moved together by 200 positions change their "
                "score by at most {diff} (float rounding): only the distance counts. Pair 0 turns {fast} rad a "
                "position, the last pair {slow} rad (one turn every {turn} positions); base b = {base}. Over all {T} "
                "positions of this prompt, the model's angles differ from the formula by at most {adiff}.",
                T=f"{T:,}", **nums)
    if added is not None:
        a0, a1 = list(added.values())
        n = min(len(a0), len(a1))
        msg += " " + t("The toy model's layer-0 head, with PE added: the same two tokens' score changes by up to "
                       "{diff} when both move by {shift} positions.", diff=F.num(float(np.abs(a0[:n] - a1[:n]).max())),
                       shift=list(added)[1])
    st.markdown(msg)

# ---------------------------------------------------------------- 2. GQA

st.header(t("2. Grouped-query attention: fewer keys and values"))
info = desc["attention"][f"{L}.self_attn"]
H, H_kv, d_head = info["n_heads"], info["n_kv_heads"], info["d_head"]
bytes_per = next(lm.parameters()).element_size()
st.markdown(t("In 2017 every head had its own $W^K$, $W^V$. With grouped-query attention, $H$ query heads share "
              "$H_{kv}$ key/value heads (query head $h$ reads K/V head $\\lfloor h / (H/H_{kv}) \\rfloor$). "
              "Generation keeps every layer's K and V of every past token (the KV cache), "
              "$2 \\cdot L \\cdot H_{kv} \\cdot d_{head} \\cdot n$ numbers, so sharing shrinks it by $H / H_{kv}$."))
full = FM.kv_cache_bytes(n_layers, H, d_head, KV_TOKENS, bytes_per)
shared = FM.kv_cache_bytes(n_layers, H_kv, d_head, KV_TOKENS, bytes_per)
show_figure(FM.gqa_figure(n_layers, H, H_kv, d_head, bytes_per, KV_TOKENS), key="s17_gqa")
if H_kv == H:
    st.markdown(t("{model} gives every query head its own K/V head ({h} of each): no sharing, as in 2017.",
                  model=lm_label, h=H))
else:
    st.markdown(t("{model}: {h} query heads, {kv} K/V heads, {l} layers, d_head = {d}, {b}-byte numbers. At {n} "
                  "tokens its KV cache takes {shared} MiB instead of {full} MiB: {saved} MiB saved ({x}× smaller).",
                  model=lm_label, h=H, kv=H_kv, l=n_layers, d=d_head, b=bytes_per, n=f"{KV_TOKENS:,}",
                  shared=f"{shared / FM.MIB:,.0f}", full=f"{full / FM.MIB:,.0f}",
                  saved=f"{(full - shared) / FM.MIB:,.0f}", x=F.num(full / shared)))

# ---------------------------------------------------------------- 3. RMSNorm

st.header(t("3. RMSNorm: no mean, no bias"))
st.markdown(t("LayerNorm centres and scales: $\\mathrm{LN}(x) = \\frac{x - \\mu}{\\sigma}\\, g + b$. RMSNorm "
              "drops the mean-centring and the bias: $\\mathrm{RMS}(x) = \\frac{x}{\\sqrt{\\mathrm{mean}(x^2) "
              "+ \\epsilon}}\\, g$. Cheaper, and the model learns to do without them."))
if not str(blocks.get("norm", "")).startswith("rmsnorm"):
    st.info(t("{model} uses LayerNorm, as in 2017.", model=lm_label), icon="🧩")
else:
    # The layer's first norm: before attention (pre-LN, sandwich), or after it (OLMo 2's post norms).
    nname = "norm1" if f"{L}.norm1.in" in trace else "norm_post_attn"
    x = arr(f"{L}.{nname}.in")[pos]
    rms_out = arr(f"{L}.{nname}.out")[pos]
    nmod = getattr(lm.decoder.layers[layer], nname)
    g = nmod.weight.detach().double().numpy() + (1.0 if getattr(nmod, "style", "") == "gemma" else 0.0)  # Gemma: 1 + w
    ln_out = FM.layer_norm(x, g, None, cfg.norm_eps)
    show_figure(FM.norm_figure(x, rms_out, ln_out, tokens[pos]), key="s17_norm")
    rms, mu, sd = float(np.sqrt((x ** 2).mean())), float(x.mean()), float(x.std())
    cos = float(rms_out @ ln_out / (np.linalg.norm(rms_out) * np.linalg.norm(ln_out)))
    toy_bias = toy.model.encoder.layers[0].norm1.bias.detach().double().numpy()
    nums = dict(l=layer, tok=F.show_token(tokens[pos]), mu=F.num(mu), rms=F.num(rms), sd=F.num(sd),
                cos=F.num(cos, 4), diff=F.num(float(np.abs(rms_out - ln_out).max())))
    if abs(mu) < 0.1 * rms:  # what mean-centring would remove is small here
        st.markdown(t("The input of layer {l}'s first norm at “{tok}”: mean {mu}, RMS {rms}, standard deviation {sd}. "
                      "The mean is small beside the RMS, so the two norms nearly agree: cosine {cos}, largest "
                      "difference {diff}.", **nums))
    else:
        st.markdown(t("The input of layer {l}'s first norm at “{tok}”: mean {mu}, RMS {rms}, standard deviation {sd}. "
                      "Here the mean is not small, so the norms differ: cosine {cos}, largest difference {diff}.",
                      **nums))
    st.markdown(t("The bias RMSNorm drops: the toy model's first LayerNorm learned one of norm {b} (its gain's "
                  "mean is {g}).", b=F.num(float(np.linalg.norm(toy_bias))),
                  g=F.num(float(toy.model.encoder.layers[0].norm1.weight.detach().mean()))))

# ---------------------------------------------------------------- 4. SwiGLU

st.header(t("4. SwiGLU: a gated feed-forward network"))
st.markdown(t("2017: $\\mathrm{FFN}(x) = W_2\\, \\mathrm{ReLU}(W_1 x)$. SwiGLU multiplies the up projection by a "
              "learned gate: $\\mathrm{FFN}(x) = W_2\\,(\\mathrm{SiLU}(W_g x) \\odot W_1 x)$, "
              "$\\mathrm{SiLU}(z) = z\\,\\sigma(z)$. Each hidden unit's gate decides, token by token, how much of "
              "its up projection passes."))
if blocks.get("moe") and f"{L}.ffn.gate" not in trace:  # this layer's FFN is experts (a dense layer may sit between)
    st.info(t("The feed-forward network of {model} is a mixture of experts, each expert a SwiGLU network: section 10 "
              "shows which experts each token uses.", model=lm_label), icon="🧩")
elif blocks.get("ffn") != "gated":
    st.info(t("{model} has a plain feed-forward network, as in 2017.", model=lm_label), icon="🧩")
else:
    gate = arr(f"{L}.ffn.gate")
    hidden = arr(f"{L}.ffn.hidden")
    ffn = lm.decoder.layers[layer].ffn
    with torch.no_grad():
        # The FFN's input: the norm before it (pre-LN, sandwich), or the residual stream after attention (post norms).
        # Phi and Cohere: one norm (norm1) feeds both sublayers of the parallel block.
        ffn_in = (trace[f"{L}.norm2.out"][0] if f"{L}.norm2.out" in trace else
                  trace[f"{L}.norm1.out"][0] if blocks.get("shared_norm") else
                  trace[f"decoder.layers.{layer - 1}.out" if layer else "decoder.embed.out"][0]
                  + trace[f"{L}.norm_post_attn.out"][0])
        up = ffn.linear1(ffn_in[rows]).double().numpy()  # the drawn rows only (all of them on a short prompt)
    units = sorted(np.argsort(-np.abs(hidden).mean(0), kind="stable")[:32].tolist())  # over every token
    show_figure(FM.swiglu_figure(gate[rows], up, tokens, units, labels=labels[rows] if long else None),
                key="s17_swiglu")
    if long:
        window_caption(t("Rows"))
    shut = float((np.abs(gate) < 0.05).mean())
    neg = float((gate < 0).mean())
    st.markdown(t("Layer {l}, the {n} hidden units (of {d_ff}) with the largest mean |gate · up| on this text. Over "
                  "all units and tokens, {shut} of the gates are nearly shut (|gate| < 0.05) and {neg} are negative "
                  "(SiLU dips to −0.28): the gate does more than switch a unit on and off.",
                  l=layer, n=len(units), d_ff=gate.shape[1], shut=f"{shut:.0%}", neg=f"{neg:.0%}"))

# ---------------------------------------------------------------- 5. Pre-LN

st.header(t("5. Pre-LN: normalise the input, not the sum"))
st.markdown(t("2017 (post-LN): $x \\leftarrow \\mathrm{LN}(x + \\mathrm{sublayer}(x))$, so the residual stream "
              "is normalised after every sublayer. Today (pre-LN): $x \\leftarrow x + \\mathrm{sublayer}"
              "(\\mathrm{LN}(x))$: the stream itself is never normalised (one final norm before the output), "
              "which keeps a clean path for gradients and trains without a warmup's care."))
wiring = {"sandwich": t("{model} is pre-LN with a second norm after each sublayer (a sandwich: "
                        "x + Norm(sublayer(Norm(x)))), so what each sublayer adds is normalised too.", model=lm_label),
          "post": t("{model} puts its norms after the sublayers, inside the residual branch: x + Norm(sublayer(x)). "
                    "The stream itself is still never normalised, unlike 2017's Norm(x + sublayer(x)).",
                    model=lm_label)}.get(blocks.get("norm_position"))
if blocks.get("parallel_residual") and blocks.get("shared_norm"):
    wiring = t("{model} runs attention and the feed-forward network side by side on the same input, both reading "
               "one norm of it: x + Attn(Norm(x)) + FFN(Norm(x)) (parallel residual).", model=lm_label)
elif blocks.get("parallel_residual"):
    wiring = t("{model} runs attention and the feed-forward network side by side on the same input: "
               "x + Attn(Norm₁(x)) + FFN(Norm₂(x)) (parallel residual).", model=lm_label)
if wiring:
    st.markdown(wiring)
# One layer's stream at a time (a generator): a long prompt never holds every layer's [T, D] together.
lm_outs = (arr(n) for n in ["decoder.embed.out", *(f"decoder.layers.{i}.out" for i in range(n_layers))])
toy_n = toy.cfg.n_encoder_layers
toy_outs = [toy_trace["encoder.embed.out"][0].double().numpy()] + [
    toy_trace[f"encoder.layers.{i}.out"][0].double().numpy() for i in range(toy_n)]
lm_norms, toy_norms = FM.residual_norms(lm_outs), FM.residual_norms(toy_outs)
show_figure(FM.preln_figure(lm_norms, toy_norms, lm_label, toy_label), key="s17_preln")
st.markdown(t("In {lm} the stream's median norm grows from {a} after the embedding to {b} after the last layer "
              "({x}×); in the post-LN toy model every layer's output is normalised, so it stays near {c}.",
              lm=lm_label, a=F.num(float(lm_norms[0])), b=F.num(float(lm_norms[-1])),
              x=F.num(float(lm_norms[-1] / lm_norms[0])), c=F.num(float(np.median(toy_norms[1:])))))
st.page_link("viz/pages/layer.py", label=t("Inside a layer: post-LN vs pre-LN wiring, and both trained with and "
                                           "without warmup"), icon=":material/layers:",
             query_params={"checkpoint": toy_name})

# ---------------------------------------------------------------- 6.–10. the 2024–2026 mechanisms
# Each section reads the model's own description (trace.meta["model"]): it draws a mechanism where the model has
# it, and says in one sentence when it has not.

FAR = 5000  # "a token this many positions back": what can it still reach through the layers?
infos = [desc["attention"][f"decoder.layers.{i}.self_attn"] for i in range(n_layers)]
info_l = infos[layer]
A = f"{L}.self_attn"

st.header(t("6. Sliding windows: attention with a horizon"))
st.markdown(t("A sliding-window layer lets the query at position p see only the W keys p − W + 1 … p, so its cost "
              "grows with W, not with the whole text. What lies further back is not lost: each layer can pass it on "
              "W − 1 positions, so after L sliding layers information can have travelled L·(W − 1) positions, and "
              "one full (global) layer reaches everything before it."))
windows = [i.get("window") for i in infos]
kinds = [i.get("layer_type") or ("sliding" if i.get("window") else "full") for i in infos]
if not any(windows):
    st.info(t("{model} uses no sliding window: every layer's query sees every earlier token.", model=lm_label),
            icon="🧩")
else:
    W = next(w for w in windows if w)
    first = next(i for i, w in enumerate(windows) if w)
    far = FM.reach_back(kinds, windows, FAR)
    if long:  # one layer's mask, pooled to blocks; the reach in closed form (no layer's T × T kept)
        edges = LG.block_edges(T, FM.POOL_BLOCKS)
        open_share = FM.pooled_open(FM._arr(trace[f"decoder.layers.{first}.self_attn.mask"])[0, 0], edges)
        reach = FM.window_reach(kinds, windows, T)
        show_figure(FM.sliding_figure(open_share, [FM.pooled_share(r, edges) for r in reach], far, FAR,
                                      FM.block_labels(edges), W, pooled=True), key="s17_window")
        st.caption(t("{T} tokens, drawn in blocks of about {b} positions. Left, a cell is a block of queries × a "
                     "block of keys: the share of its cells the mask leaves open (light = open). Middle, a cell is "
                     "the share of a block's positions that can have reached the last token; here it follows from "
                     "the windows (each query's open keys are the W positions up to it) instead of walking every "
                     "layer's mask.", T=f"{T:,}", b=max(1, round(T / (len(edges) - 1)))))
    else:
        masks = [FM._arr(trace[f"decoder.layers.{i}.self_attn.mask"])[0, 0].astype(bool) for i in range(n_layers)]
        reach = FM.live_reach(masks)
        show_figure(FM.sliding_figure(masks[first], reach, far, FAR, labels, W), key="s17_window")
    earliest = int(np.flatnonzero(reach[-1])[0])  # the earliest position that reaches the last token
    n_sl = sum(k == "sliding" for k in kinds)
    full = [i for i, k in enumerate(kinds) if k != "sliding"]
    msg = t("{model}: {s} of its {l} layers slide with a window of W = {w} tokens (layer {first} on the left: each "
            "row sees {w} keys at most). On this prompt, after all the layers, the last token has been reached by "
            "positions {a} to {b}.", model=lm_label, s=n_sl, l=n_layers, w=W, first=first, a=earliest, b=T - 1)
    if full:
        msg += " " + t("Its full layers ({layers}) read every earlier token directly, so a token {far:,} positions "
                       "back reaches the present in one step there.", layers=", ".join(map(str, full)), far=FAR)
    else:
        msg += " " + t("Every layer slides, so a token can travel at most {l} × (W − 1) = {r:,} positions through "
                       "the stack: a token {far:,} positions back {verdict}.", l=n_layers, r=n_layers * (W - 1),
                       far=FAR, verdict=t("can still reach the last one") if n_layers * (W - 1) >= FAR
                       else t("cannot reach the last one at all"))
    st.markdown(msg)

st.header(t("7. q/k norm: queries and keys of one length"))
st.markdown(t("A norm on each query and key (RMSNorm with a learned gain, before RoPE) bounds their lengths, so the "
              "scores q·k cannot blow up as the residual stream grows, a cause of unstable training in large "
              "models."))
if not info_l.get("qk_norm"):
    st.info(t("{model} does not normalise q and k: its scores grow with their lengths, as in 2017.", model=lm_label),
            icon="🧩")
else:
    qi, qo = FM._arr(trace[f"{A}.q_norm.in"])[0], FM._arr(trace[f"{A}.q_norm.out"])[0]
    ki, ko = FM._arr(trace[f"{A}.k_norm.in"])[0], FM._arr(trace[f"{A}.k_norm.out"])[0]
    per_head = qi.ndim == 3  # (H, T, d_head) per head; (T, H·d_head) when the whole projection is normalised
    kv = head // (n_heads // info_l["n_kv_heads"])
    if per_head:
        qi, qo, ki, ko = qi[head], qo[head], ki[kv], ko[kv]
    if long:  # one point per position: a line over the whole prompt still reads; the x axis is the position
        show_figure(FM.qk_norm_figure(qi, qo, ki, ko, list(range(T)), x_title=t("position")), key="s17_qknorm")
        st.caption(t("Each point is one token's query (key) length, at every one of the {T} positions.",
                     T=f"{T:,}"))
    else:
        show_figure(FM.qk_norm_figure(qi, qo, ki, ko, labels), key="s17_qknorm")
    nq_in, nq_out = FM.vector_norms(qi), FM.vector_norms(qo)
    st.markdown(t("Layer {l}, {what}: before the norm the queries' lengths range from {a} to {b} ({x}×); after it "
                  "from {c} to {d} ({y}×), set by the learned gain alone.", l=layer,
                  what=t("head {h}", h=head) if per_head else t("all heads together (one norm over the whole "
                                                                 "projection)"),
                  a=F.num(float(nq_in.min())), b=F.num(float(nq_in.max())),
                  x=F.num(float(nq_in.max() / max(nq_in.min(), 1e-12))), c=F.num(float(nq_out.min())),
                  d=F.num(float(nq_out.max())), y=F.num(float(nq_out.max() / max(nq_out.min(), 1e-12)))))

st.header(t("8. Soft-capping: scores that cannot run away"))
st.markdown(t("Soft-capping passes each score through c·tanh(s / c): almost unchanged while |s| ≪ c, never beyond "
              "±c. Gemma 2 caps attention scores (c = 50) and the final logits (c = 30), so no single score can "
              "dominate a softmax however large it grows."))
cap = info_l.get("softcap")
final_cap = blocks.get("final_softcap")
if not cap and not final_cap:
    st.info(t("{model} does not cap its scores: softmax reads them as they are, as in 2017.", model=lm_label),
            icon="🧩")
if cap and long:
    # One head's T × T scores never at once: its rows tile by tile for the numbers, the chosen token's row drawn.
    blocked = FM._arr(trace[f"{A}.mask"])[0, 0].astype(bool)  # (T, T) bool: one layer's, 4 MB at 2,048 tokens

    def score_rows(r: slice) -> tuple[np.ndarray, np.ndarray]:
        """This head's scores before and after the cap, query rows r × every key ([R, T] each), as the trace
        gives them: a lazy trace computes them from q and k as the forward does, a full one slices its captures."""
        if isinstance(trace, LazyTrace):
            s = trace.attention(A, head, r, what="scores")  # (R, T), before the cap, as `.scores`
            return FM._arr(s).astype(np.float64), FM._arr(softcap(s, float(cap))).astype(np.float64)
        return (FM._arr(trace[f"{A}.scores"][0, head, r]).astype(np.float64),
                FM._arr(trace[f"{A}.scores_capped"][0, head, r]).astype(np.float64))

    tile = max(1, 2**21 // T)  # rows per tile: 2M cells (16 MB in float64)

    def visible_tiles():
        for r0 in range(0, T, tile):
            b, a = score_rows(slice(r0, min(T, r0 + tile)))
            o = ~blocked[r0:r0 + tile]
            yield b[o], a[o]

    sm = FM.softcap_summary(visible_tiles())
    b, a = score_rows(slice(pos, pos + 1))
    o = ~blocked[pos]
    show_figure(FM.softcap_figure(b[0][o], a[0][o], float(cap), points=t("the scores of “{tok}”",
                                                                          tok=F.show_token(tokens[pos]))),
                key="s17_softcap")
    st.caption(t("{T} tokens: the points are the scores of the chosen token “{tok}” (position {p}) over the {n} "
                 "keys it sees; the numbers below count every visible cell of the head ({cells}).", T=f"{T:,}",
                 tok=F.show_token(tokens[pos]), p=pos, n=int(o.sum()), cells=f"{sm['cells']:,}"))
    st.markdown(t("Layer {l}, head {h}: cap c = {c}. The largest score before the cap is {b}, after it {a}; {p} of "
                  "the visible cells moved by more than 1%.", l=layer, h=head, c=F.num(float(cap)),
                  b=F.num(sm["max_before"]), a=F.num(sm["max_after"]), p=f"{sm['bent']:.0%}"))
elif cap:
    before = FM._arr(trace[f"{A}.scores"])[0, head].astype(np.float64)
    after = FM._arr(trace[f"{A}.scores_capped"])[0, head].astype(np.float64)
    open_ = ~FM._arr(trace[f"{A}.mask"])[0, 0].astype(bool)
    show_figure(FM.softcap_figure(before[open_], after[open_], float(cap)), key="s17_softcap")
    bent = float((np.abs(after[open_] - before[open_]) > 0.01 * np.abs(before[open_])).mean())
    st.markdown(t("Layer {l}, head {h}: cap c = {c}. The largest score before the cap is {b}, after it {a}; {p} of "
                  "the visible cells moved by more than 1%.", l=layer, h=head, c=F.num(float(cap)),
                  b=F.num(float(np.abs(before[open_]).max())), a=F.num(float(np.abs(after[open_]).max())),
                  p=f"{bent:.0%}"))
if final_cap:
    st.markdown(t("The final logits are capped too, at c = {c}: `logits_uncapped` holds them before.",
                  c=F.num(float(final_cap))))

st.header(t("9. RoPE scaling for long context"))
st.markdown(t("A model trained on a context of n tokens has RoPE pairs whose angle never made a full turn over n "
              "positions. To read longer texts, scaling slows those pairs down: \"linear\" divides every frequency by "
              "a factor; Llama 3's scaling divides only the slow pairs (wavelength above n / low_freq_factor), keeps "
              "the fast ones (below n / high_freq_factor) and blends between, so nearby word order stays sharp."))
scaled_layers = [i for i, info in enumerate(infos) if (info.get("rope") or {}).get("scaling", "default") != "default"]
if not scaled_layers:
    st.info(t("{model} uses plain RoPE, no scaling for long context.", model=lm_label), icon="🧩")
else:
    sl_i = layer if layer in scaled_layers else scaled_layers[0]
    rope = infos[sl_i]["rope"]
    inv_s, inv_p = FM.inv_freq_of(rope, cfg.d_head), FM.inv_freq_of(rope, cfg.d_head, scaled=False)
    show_figure(FM.rope_scaling_figure(inv_p, inv_s, rope.get("original_max_len")), key="s17_ropescale")
    live = FM._arr(trace[rope["angles"]]).astype(np.float64)
    diff = float(np.abs(live - np.arange(live.shape[0])[:, None] * inv_s[None, :]).max())
    ratio = inv_p / inv_s
    st.markdown(t("Layer {l}: {kind} scaling, factor {f}. {n_k} of its {n} pairs keep their speed, {n_s} turn {f}× "
                  "slower, {n_b} in between. This prompt's angles are position × the scaled frequencies (largest "
                  "difference {d}).", l=sl_i, kind=FM.scaling_name(rope["scaling"]),
                  f=F.num(float(rope.get("factor") or 1)),
                  n=len(ratio), n_k=int(np.isclose(ratio, 1).sum()),
                  n_s=int(np.isclose(ratio, float(rope.get("factor") or 1)).sum()),
                  n_b=int((~np.isclose(ratio, 1) & ~np.isclose(ratio, float(rope.get("factor") or 1))).sum()),
                  d=f"{diff:.1e}"))
    m = float(rope.get("attention_factor") or 1.0)
    if rope["scaling"] == "yarn" and m != 1.0:  # YaRN: cos and sin × m, so q and k × m and every score × m²
        st.markdown(t("YaRN also multiplies cos and sin by m = {m} (0.1·ln(factor) + 1), so q and k come out of RoPE "
                      "m times longer and every score q·k is m² = {m2} times larger: the softmax is sharpened to make "
                      "up for the slower pairs.", m=F.num(m, 4), m2=F.num(m * m, 4)))

st.header(t("10. Mixture of experts: a router picks the FFN"))
st.markdown(t("In a mixture-of-experts layer the one feed-forward network becomes E experts. A router scores them "
              "for each token, p = softmax(W_r x); only the top k run, and their outputs are summed with weights "
              "from p. Parameters grow with E, the compute per token only with k."))
moe = blocks.get("moe")
if not moe:
    st.info(t("{model} has one dense feed-forward network per layer: every token goes through all of it.",
              model=lm_label), icon="🧩")
else:
    E, k = int(moe["n_experts"]), int(moe["top_k"])
    moe_layers = [i for i in moe.get("layers", range(n_layers)) if f"decoder.layers.{i}.ffn.router.probs" in trace]
    ml = layer if layer in moe_layers else moe_layers[0]
    R = f"decoder.layers.{ml}.ffn.router"
    probs = FM._arr(trace[f"{R}.probs"])[0].astype(np.float64)  # (T, E)
    ids = FM._arr(trace[f"{R}.topk_ids"])[0].astype(np.int64)  # (T, k)
    wts = FM._arr(trace[f"{R}.topk_weights"])[0].astype(np.float64)
    loads = np.stack([FM.expert_load(FM._arr(trace[f"decoder.layers.{i}.ffn.router.topk_ids"])[0], E)
                      for i in moe_layers])

    def _pick_token() -> None:  # a click on the map picks that token (before the rerun: the select may change)
        pts = ((st.session_state.get("s17_moe") or {}).get("selection") or {}).get("points") or []
        if pts and isinstance(pts[0].get("y"), str) and pts[0]["y"] in labels:
            st.session_state["s17_pos"] = labels.index(pts[0]["y"])

    show_figure(FM.moe_figure(probs[rows], ids[rows], loads, labels[rows], ml), key="s17_moe",
                on_select=_pick_token, selection_mode="points")
    if long:
        window_caption(t("Left, rows"))
    show_figure(FM.router_choice_figure(probs[pos], ids[pos], wts[pos], tokens[pos]), key="s17_router")
    load = loads[moe_layers.index(ml)]
    msg = t("Layer {l}: {E} experts, each token runs {k}. On this prompt expert {busy} takes {nb} of the {n} picks "
            "and expert {idle} {ni}. “{tok}” (click a row, or pick the token above) goes to experts {chosen} with "
            "weights {w}.", l=ml, E=E, k=k, busy=int(load.argmax()), nb=int(load.max()), n=int(load.sum()),
            idle=int(load.argmin()), ni=int(load.min()), tok=F.show_token(tokens[pos]),
            chosen=", ".join(str(int(e)) for e in ids[pos]), w=", ".join(f"{x:.3f}" for x in wts[pos]))
    if moe.get("shared"):
        g = f"decoder.layers.{ml}.ffn.shared_gate"
        msg += " " + (t("A shared expert runs on every token as well, scaled by its own gate (here {g} for this "
                        "token).", g=f"{float(FM._arr(trace[g])[0, pos, 0]):.3f}") if g in trace
                      else t("A shared expert runs on every token as well."))
    st.markdown(msg)

st.header(t("11. Attention sinks: a learned place to put nothing"))
st.markdown(t("A softmax row must give all its weight to the keys, so a head with nothing to read parks it on some "
              "token (often the first: an attention sink). gpt-oss gives each head h one more logit s_h, learned, that "
              "every query sees beside its keys: the weights come from softmax([q·k₁, …, q·kₙ, s_h]) and the sink's "
              "share is dropped, so a row's weights over the tokens sum to 1 − sink, and a head can attend to "
              "nothing."))
sinks_l = info_l.get("sinks")
if not sinks_l:
    # a fact about this model's softmax, not a view the page cannot draw: a caption, not the page's "lacks" notice
    st.caption(t("{model} has no learned sinks: each row's weights over the tokens sum to 1, as in 2017.",
                 model=lm_label))
else:
    sink_row = FM._arr(trace[f"{A}.sink"])[0, head].astype(np.float64)  # (T,): this head's weight on the sink
    show_figure(FM.sink_figure(sinks_l, sink_row[rows], head, labels[rows]), key="s17_sinks")
    if long:
        window_caption(t("Right, the queries"))
    wsum = None
    if not long:  # the row sums of the head's weights, as the trace holds them: 1 − sink, to float rounding
        wsum = FM._arr(trace[f"{A}.weights"])[0, head].astype(np.float64).sum(-1)
    st.markdown(t("Layer {l}: the learned sink logits of its {H} heads range from {lo} to {hi}; head {h}'s is {s}. On "
                  "this prompt head {h} gives the sink from {a} to {b} of a query's weight (mean {mean}); at "
                  "“{tok}” {here}, so its weights over the tokens sum to {rest}.", l=layer, H=len(sinks_l),
                  lo=F.num(float(min(sinks_l)), 4), hi=F.num(float(max(sinks_l)), 4), h=head,
                  s=F.num(float(sinks_l[head]), 4), a=f"{sink_row.min():.1%}", b=f"{sink_row.max():.1%}",
                  mean=f"{sink_row.mean():.1%}", tok=F.show_token(tokens[pos]), here=f"{sink_row[pos]:.1%}",
                  rest=F.num(float(wsum[pos]) if wsum is not None else 1 - float(sink_row[pos]), 4)))
