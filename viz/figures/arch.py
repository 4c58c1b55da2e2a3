"""The architecture map: a block diagram of the live model (the paper's figure 1), tensor shapes on its
edges from the config, and one clickable marker per block (customdata = [block id]).

Pure: a config dict and sizes in, a plotly Figure out. `BLOCKS` says which page (and URL parameters)
each block opens; the page turns a click into that link.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

import plotly.graph_objects as go

from viz.figures import attention as F
from viz.i18n import N_, t


class Block(NamedTuple):
    id: str
    label: str  # msgid
    x: float
    y: float
    color: str
    page: str  # url_path of the page it opens
    params: Mapping[str, object]  # URL parameters of that page ("{layer}"/"{head}" filled at click time)


ATTN, NORM, FFN, EMB, OUT = "#fbe3b3", "#f6f6b8", "#c9e7f8", "#f7cfd6", "#d9d2f0"
ENC_X, DEC_X = 0.27, 0.73


def _attention(kind: str) -> dict:
    """The Attention page's URL parameters (viz/ui/attention_views.py) for one kind: enc, dec or cross."""
    return {"attn_kind": kind, "layer": "{layer}", "head": "{head}"}


def _sublayer(stack: str, sub: str) -> dict:
    """The Inside-a-layer page's URL parameters for one sublayer (its Add & Norm included); its W^O view
    shows the chosen head."""
    return {"stack": stack, "layer": "{layer}", "sub": sub, "head": "{head}"}


BLOCKS = [
    Block("src_embed", N_("Input embedding ×√d + positional encoding"), ENC_X, 0.10, EMB, "tokens",
          {"side": "encoder"}),
    Block("enc_self", N_("Multi-head self-attention"), ENC_X, 0.30, ATTN, "attention", _attention("enc")),
    Block("enc_norm1", N_("Add & Norm"), ENC_X, 0.41, NORM, "layer", _sublayer("encoder", "self_attn")),
    Block("enc_ffn", N_("Feed-forward network"), ENC_X, 0.53, FFN, "layer", _sublayer("encoder", "ffn")),
    Block("enc_norm2", N_("Add & Norm"), ENC_X, 0.64, NORM, "layer", _sublayer("encoder", "ffn")),
    Block("tgt_embed", N_("Output embedding ×√d + positional encoding"), DEC_X, 0.10, EMB, "tokens",
          {"side": "decoder"}),
    Block("dec_self", N_("Masked multi-head self-attention"), DEC_X, 0.26, ATTN, "attention", _attention("dec")),
    Block("dec_norm1", N_("Add & Norm"), DEC_X, 0.35, NORM, "layer", _sublayer("decoder", "self_attn")),
    Block("cross", N_("Multi-head cross-attention (Q: decoder, K, V: encoder)"), DEC_X, 0.46, ATTN, "attention",
          _attention("cross")),
    Block("dec_norm2", N_("Add & Norm"), DEC_X, 0.55, NORM, "layer", _sublayer("decoder", "cross_attn")),
    Block("dec_ffn", N_("Feed-forward network"), DEC_X, 0.65, FFN, "layer", _sublayer("decoder", "ffn")),
    Block("dec_norm3", N_("Add & Norm"), DEC_X, 0.74, NORM, "layer", _sublayer("decoder", "ffn")),
    Block("generator", N_("Linear + softmax → next-token probabilities"), DEC_X, 0.92, OUT, "decoder", {}),
    Block("masks", N_("Masks"), 0.5, 0.10, "#e4e7ec", "padding", {}),
]
BY_ID = {b.id: b for b in BLOCKS}
# The link list names every block on its own line: the map's five "Add & Norm" boxes say which sublayer.
LIST_LABELS = {"enc_norm1": N_("Add & Norm after self-attention"), "enc_norm2": N_("Add & Norm after the FFN"),
               "dec_norm1": N_("Add & Norm after self-attention"), "dec_norm2": N_("Add & Norm after cross-attention"),
               "dec_norm3": N_("Add & Norm after the FFN")}
BOX_W, BOX_H = 0.36, 0.065
NARROW = {"masks": 0.08}  # block id -> its width, where not BOX_W


def _width(block_id: str) -> float:
    return NARROW.get(block_id, BOX_W)


def block_params(block_id: str, layer: int, head: int) -> dict[str, str]:
    """The URL parameters of the page a block opens, for the chosen layer and head (2017 or LM blocks)."""
    block = BY_ID.get(block_id) or LM_BY_ID[block_id]
    return {k: str(v).format(layer=layer, head=head) for k, v in block.params.items()}


def shapes(cfg: Mapping, B: int, S: int, T: int) -> dict[str, str]:
    """Edge label -> its tensor shape, from the config (D, H, d_k, d_ff, V)."""
    D, H, d_ff = cfg["d_model"], cfg["n_heads"], cfg["d_ff"]
    dk = D // H
    return {
        "src_ids": f"(B, S) = ({B}, {S})", "tgt_ids": f"(B, T) = ({B}, {T})",
        "enc": f"(B, S, D) = ({B}, {S}, {D})", "dec": f"(B, T, D) = ({B}, {T}, {D})",
        "enc_heads": f"Q, K, V: (B, H, S, d_k) = ({B}, {H}, {S}, {dk})",
        "dec_heads": f"Q, K, V: (B, H, T, d_k) = ({B}, {H}, {T}, {dk})",
        "cross_heads": f"Q: ({B}, {H}, {T}, {dk}); K, V: ({B}, {H}, {S}, {dk})",
        "enc_ffn": f"hidden (B, S, d_ff) = ({B}, {S}, {d_ff})", "dec_ffn": f"hidden (B, T, d_ff) = ({B}, {T}, {d_ff})",
        "logits": f"logits (B, T, V) = ({B}, {T}, {cfg['tgt_vocab_size']})",
    }


LABEL_SIZE = 14  # px: block labels; edge labels are 2 px smaller. Presentation mode passes a larger size.
INK = "#1a1a1a"  # near-black on the pastel boxes (Streamlit's chart theme would draw light grey)
BOX_PX = 260  # a box's width in px at the page's usual ~750 px figure width: labels wrap to fit it


def _px(s: str, size: float) -> float:
    """Rough width in px: CJK and full-width characters are square, Latin ones ~0.52 em (Source Sans)."""
    return sum(size if "\u3000" <= ch <= "\u9fff" or "\uff00" <= ch <= "\uffef" else 0.52 * size for ch in s)


def wrap(label: str, size: float, width: float = BOX_PX) -> str:
    """`label` broken into lines (<br>) of at most ~`width` px at `size` px: at spaces, or between
    Chinese characters (never before a closing mark, never after an opening bracket)."""
    pieces = re.findall(r"[\u3000-\u9fff\uff00-\uffef]|[^\s\u3000-\u9fff\uff00-\uffef]+\s*|\s+", label)
    lines, line = [], ""
    for piece in pieces:
        if line.strip() and piece not in "，。、；：）)" and _px(line + piece.rstrip(), size) > width:
            carry = line[-1] if line.endswith(("（", "(")) else ""  # an opening bracket goes with what it opens
            lines.append(line[:len(line) - len(carry)].rstrip())
            line = carry + piece.lstrip()
        else:
            line += piece
    return "<br>".join([*lines, line.rstrip()])


def _arrow(fig: go.Figure, x0: float, y0: float, x1: float, y1: float, text: str = "", color: str = "#444",
           size: float = LABEL_SIZE - 2) -> None:
    fig.add_annotation(x=x1, y=y1, ax=x0, ay=y0, xref="x", yref="y", axref="x", ayref="y", showarrow=True,
                       arrowhead=2, arrowwidth=1.5, arrowcolor=color, text="")
    if text:
        fig.add_annotation(x=(x0 + x1) / 2 + 0.01, y=(y0 + y1) / 2, text=text, showarrow=False, xanchor="left",
                           font={"size": size, "color": "#333"})


def architecture_figure(cfg: Mapping, B: int, S: int, T: int, selected: str | None = None,
                        size: int = LABEL_SIZE) -> go.Figure:
    """The live model as the paper's block diagram, bottom to top, with shapes on the edges; `size`: the
    block labels' font in px (edge labels 2 px smaller)."""
    sh = shapes(cfg, B, S, T)
    small = size - 2
    pre_ln = bool(cfg.get("norm_first"))
    fig = go.Figure()
    for b in BLOCKS:
        label = t(b.label)
        if pre_ln and b.label == "Add & Norm":
            label = t("Add (pre-LN: LayerNorm sits before the sublayer)")
        w = _width(b.id)
        fig.add_shape(type="rect", x0=b.x - w / 2, x1=b.x + w / 2, y0=b.y - BOX_H / 2, y1=b.y + BOX_H / 2,
                      fillcolor=b.color, layer="below", line={"color": "#ff4b4b" if b.id == selected else "#555",
                                                              "width": 3 if b.id == selected else 1})
        fig.add_annotation(x=b.x, y=b.y, text=wrap(label, size, BOX_PX * w / BOX_W - 16), showarrow=False,
                           font={"size": size, "color": INK})
    for x, n, y0, y1, side, sign in ((ENC_X, cfg["n_encoder_layers"], 0.24, 0.69, N_("encoder"), -1),
                                     (DEC_X, cfg["n_decoder_layers"], 0.20, 0.79, N_("decoder"), 1)):
        fig.add_shape(type="rect", x0=x - BOX_W / 2 - 0.02, x1=x + BOX_W / 2 + 0.02, y0=y0, y1=y1, layer="below",
                      line={"color": "#888", "dash": "dot"}, fillcolor="rgba(0,0,0,0)")
        fig.add_annotation(x=x + sign * (BOX_W / 2 + 0.025), y=(y0 + y1) / 2, textangle=-90, showarrow=False,
                           text=t("{side} layer × N = {n}", side=t(side), n=n), font={"size": size, "color": INK},
                           xanchor="right" if sign < 0 else "left")
    # Edges with the tensors that flow on them.
    _arrow(fig, ENC_X, 0.0, ENC_X, 0.10 - BOX_H / 2, sh["src_ids"] + " " + t("source ids"), size=small)
    _arrow(fig, DEC_X, 0.0, DEC_X, 0.10 - BOX_H / 2, sh["tgt_ids"] + " " + t("[BOS] + target ids"), size=small)
    _arrow(fig, ENC_X, 0.10 + BOX_H / 2, ENC_X, 0.30 - BOX_H / 2, sh["enc"], size=small)
    _arrow(fig, DEC_X, 0.10 + BOX_H / 2, DEC_X, 0.26 - BOX_H / 2, sh["dec"], size=small)
    for a, b in (("enc_self", "enc_norm1"), ("enc_norm1", "enc_ffn"), ("enc_ffn", "enc_norm2"),
                 ("dec_self", "dec_norm1"), ("dec_norm1", "cross"), ("cross", "dec_norm2"),
                 ("dec_norm2", "dec_ffn"), ("dec_ffn", "dec_norm3")):
        _arrow(fig, BY_ID[a].x, BY_ID[a].y + BOX_H / 2, BY_ID[b].x, BY_ID[b].y - BOX_H / 2)
    _arrow(fig, DEC_X, 0.74 + BOX_H / 2, DEC_X, 0.92 - BOX_H / 2, sh["dec"], size=small)
    _arrow(fig, DEC_X, 0.92 + BOX_H / 2, DEC_X, 1.0, sh["logits"], size=small)
    # Encoder output → K, V of every decoder layer's cross-attention.
    fig.add_shape(type="path", path=f"M {ENC_X} {0.64 + BOX_H / 2} L {ENC_X} 0.76 L 0.5 0.76 L 0.5 0.46",
                  line={"color": "#2b6cb0", "width": 2}, layer="below")
    _arrow(fig, 0.5, 0.46, DEC_X - BOX_W / 2, 0.46, color="#2b6cb0")
    fig.add_annotation(x=ENC_X, y=0.79, text=t("encoder output (memory)") + " " + sh["enc"], showarrow=False,
                       font={"size": small, "color": "#2b6cb0"})
    # Clickable markers (hover: what is inside; click: open its view).
    hover = {"masks": t("[PAD] keys (padding mask); future keys in the decoder (look-ahead mask)"),
             "enc_self": sh["enc_heads"], "dec_self": sh["dec_heads"], "cross": sh["cross_heads"],
             "enc_ffn": sh["enc_ffn"], "dec_ffn": sh["dec_ffn"], "generator": sh["logits"]}
    fig.add_trace(go.Scatter(
        x=[b.x + _width(b.id) / 2 - 0.015 for b in BLOCKS], y=[b.y for b in BLOCKS], mode="markers",
        customdata=[[b.id] for b in BLOCKS], showlegend=False,
        marker={"size": 16, "symbol": "circle", "color": "#ff4b4b", "opacity": 0.85},
        text=[f"{t(b.label)}<br>{hover.get(b.id, '')}" for b in BLOCKS],
        hovertemplate="%{text}<br>" + t("click to open its view") + "<extra></extra>"))
    fig.update_xaxes(visible=False, range=[0, 1])
    fig.update_yaxes(visible=False, range=[-0.03, 1.03])
    D, H = cfg["d_model"], cfg["n_heads"]
    title = t("the live model: D = {D}, H = {H}, d_k = {dk}, d_ff = {f}, {ln}", D=D, H=H, dk=D // H,
              f=cfg["d_ff"], ln="pre-LN" if pre_ln else "post-LN")
    fig.update_layout(hoverlabel={"font": {"size": small}})
    return F._layout(fig, title, 900 if size <= LABEL_SIZE else 1100, plot_bgcolor="white", dragmode=False)


# ---------------------------------------------------------------- decoder-only language models

LM_X, SIDE_X = 0.36, 0.86  # the stack's column; side boxes (RoPE, learned positions) to its right
NORM_NAMES = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm", "rmsnorm_gemma": "RMSNorm", "rmsnorm_olmo": "RMSNorm"}
ACT_NAMES = {"relu": "ReLU", "gelu": "GELU", "gelu_tanh": "GELU", "silu": "SiLU"}


def _lm_sub(sub: str) -> dict:
    return {"stack": "decoder", "layer": "{layer}", "sub": sub, "head": "{head}"}


# Block id -> (y, colour, page, URL parameters); labels depend on the description (`lm_blocks`).
LM_LAYOUT = {
    "lm_embed": (0.08, EMB, "tokens", {}),
    "lm_pos": (0.08, EMB, "tokens", {}),  # learned positions (GPT-2), beside the token embedding
    "lm_norm1": (0.22, NORM, "layer", _lm_sub("self_attn")),
    "lm_attn": (0.34, ATTN, "attention", _attention("dec")),
    "lm_rope": (0.34, "#e2f0d9", "since2017", {"layer": "{layer}", "head": "{head}"}),
    "lm_add1": (0.45, "#ffffff", "layer", _lm_sub("self_attn")),
    "lm_norm2": (0.54, NORM, "layer", _lm_sub("ffn")),
    "lm_ffn": (0.65, FFN, "layer", _lm_sub("ffn")),
    "lm_add2": (0.76, "#ffffff", "layer", _lm_sub("ffn")),
    "lm_norm": (0.86, NORM, "llm", {"view": "lens"}),
    "lm_unembed": (0.96, OUT, "llm", {"view": "generate"}),
    # The 2024–2026 blocks, placed by `lm_layout` where the description has them.
    "lm_qknorm": (0.24, NORM, "attention", {**_attention("dec"), "view": "pipeline"}),
    "lm_post1": (0.40, NORM, "layer", _lm_sub("self_attn")),
    "lm_post2": (0.71, NORM, "layer", _lm_sub("ffn")),
    "lm_router": (0.65, "#f3d9fa", "since2017", {"layer": "{layer}"}),
}
LM_NARROW = {"lm_add1": 0.07, "lm_add2": 0.07, "lm_rope": 0.24, "lm_pos": 0.24, "lm_qknorm": 0.24, "lm_router": 0.24}
SIDE_IDS = ("lm_rope", "lm_pos", "lm_qknorm", "lm_router")  # boxes beside the stack, not on its path
FRAME_RIGHT = 0.32  # the layer frame reaches this far right of the column: the edge labels fit inside


def lm_facts(desc: Mapping) -> dict:
    """What the map needs from a decoder-only model's description: sizes and block kinds."""
    blocks = desc.get("blocks", {})
    first = next(iter(desc.get("attention", {}).values()))
    return {"L": desc["stacks"]["decoder"]["layers"], "H": first["n_heads"], "G": first["n_kv_heads"],
            "dh": first["d_head"], "D": blocks["d_model"], "d_ff": blocks["d_ff"], "V": blocks.get("vocab_size"),
            "rotary": blocks.get("positional") == "rotary", "norm": blocks.get("norm", "layernorm"),
            "gated": blocks.get("ffn") == "gated", "act": blocks.get("activation", "gelu"),
            "tied": bool(blocks.get("tied_embeddings")), "rope_base": blocks.get("rope_base"),
            "wiring": ("parallel" if blocks.get("parallel_residual") else
                       {"sandwich": "sandwich", "post": "post"}.get(blocks.get("norm_position"), "pre")),
            "qk_norm": bool(first.get("qk_norm")), "moe": blocks.get("moe") or None,
            "rotary_dim": (first.get("rope") or {}).get("rotary_dim") or first["d_head"],
            "shared_norm": bool(blocks.get("shared_norm")), "mechanisms": lm_mechanisms(blocks)}


def lm_mechanisms(blocks: Mapping) -> list[str]:
    """Issue 32's mechanisms in notation (no prose: the same in every language), where the description has them:
    one norm for both sublayers of a parallel block (Phi, Cohere), LayerNorm without a bias, the unembedding's bias,
    logits × logit_scale (Cohere) or ÷ logits_scaling (Granite), Granite's embedding and residual multipliers,
    interleaved RoPE pairs (Cohere, GLM-4), layers without RoPE (SmolLM3), gpt-oss's learned attention sinks, its
    router (top-k logits, then a softmax over them) and clamped SwiGLU experts."""
    out = []
    if blocks.get("attn_sinks"):
        out.append("softmax([q·k, s_h]): sink s_h")
    moe = blocks.get("moe") or {}
    if moe.get("router") == "topk_softmax":
        out.append("softmax(top-k)")
    if moe.get("swiglu_limit") is not None:
        out.append(f"SwiGLU clamp ±{moe['swiglu_limit']:g}")
    if blocks.get("shared_norm"):
        out.append("x + Attn(N(x)) + FFN(N(x))")
    if blocks.get("norm_bias") is False:
        out.append("LayerNorm: β = 0")
    if blocks.get("embed_multiplier") is not None:
        out.append(f"embedding_multiplier = {blocks['embed_multiplier']:g}")
    if blocks.get("residual_multiplier") is not None:
        out.append(f"x + {blocks['residual_multiplier']:g}·f(x)")
    if blocks.get("rope_interleaved"):
        out.append("RoPE (2i, 2i+1)")
    if blocks.get("nope_layers"):
        out.append("NoPE: " + ", ".join(f"L{i}" for i in blocks["nope_layers"]))
    if blocks.get("generator_bias"):
        out.append("logits + b")
    if blocks.get("logit_scale") is not None:
        out.append(f"logits × {blocks['logit_scale']:g}")
    if blocks.get("logits_scaling") is not None:
        out.append(f"logits ÷ {blocks['logits_scaling']:g}")
    return out


def layer_facts(desc: Mapping, layer: int) -> dict:
    """One layer's attention mechanisms from the description: window (None = full), soft-cap, query scale
    (None when it is 1/√d_head), RoPE base and scaling."""
    info = desc.get("attention", {}).get(f"decoder.layers.{layer}.self_attn", {})
    scale = info.get("scale")
    plain = scale is None or abs(scale * info.get("d_head", 1) ** 0.5 - 1) < 1e-6
    rope = info.get("rope") or {}
    return {"window": info.get("window"), "softcap": info.get("softcap"), "scale": None if plain else scale,
            "rope_base": rope.get("base"), "scaling": rope.get("scaling", "default"), "factor": rope.get("factor"),
            "attention_factor": rope.get("attention_factor"), "sinks": info.get("sinks")}


def layer_types(desc: Mapping) -> str:
    """"sliding (W = 4) × 5, full × 1"-style summary of the layers' attention spans, or "" when all are full."""
    kinds = [(a.get("window") or 0) for a in desc.get("attention", {}).values() if a.get("kind") == "decoder_self"]
    if not any(kinds):
        return ""
    parts = [t("sliding (W = {w}) × {n}", w=w, n=kinds.count(w)) for w in sorted(set(kinds) - {0})]
    if 0 in kinds:
        parts.append(t("full × {n}", n=kinds.count(0)))
    return ", ".join(parts)


def lm_shapes(desc: Mapping, B: int, T: int, layer: int = 0) -> dict[str, tuple[int, ...]]:
    """Capture name -> the shape the model gives it for (B, T) ids, from the description alone: what the map
    writes on its edges (the tests check it against a trace)."""
    f = lm_facts(desc)
    a = f"decoder.layers.{layer}"
    out = {"decoder.embed.tok": (B, T, f["D"]), "decoder.embed.out": (B, T, f["D"]),
           f"{a}.norm1.out": (B, T, f["D"]), f"{a}.self_attn.q": (B, f["H"], T, f["dh"]),
           f"{a}.self_attn.k": (B, f["G"], T, f["dh"]), f"{a}.self_attn.v": (B, f["G"], T, f["dh"]),
           f"{a}.self_attn.weights": (B, f["H"], T, T), f"{a}.self_attn.out": (B, T, f["D"]),
           f"{a}.ffn.hidden": (B, T, f["d_ff"]), f"{a}.out": (B, T, f["D"]), "decoder.norm.out": (B, T, f["D"])}
    if f["V"]:
        out["logits"] = (B, T, f["V"])
    if f["rotary"]:
        out["decoder.rope.angles"] = (T, f["rotary_dim"] // 2)  # partial rotary (GPT-NeoX): rotary_dim < d_head
    else:
        out["decoder.embed.pos"] = (T, f["D"])
    if f["gated"]:
        out[f"{a}.ffn.gate"] = (B, T, f["d_ff"])
    if f["wiring"] == "post":  # OLMo 2: no norm before the sublayers, one after each
        del out[f"{a}.norm1.out"]
    if f["wiring"] in ("post", "sandwich"):
        out[f"{a}.norm_post_attn.out"] = out[f"{a}.norm_post_ffn.out"] = (B, T, f["D"])
    if f["qk_norm"]:
        info = desc["attention"][f"{a}.self_attn"]
        per_head = info.get("qk_norm_over") != "full"
        out[f"{a}.self_attn.q_norm.out"] = (B, f["H"], T, f["dh"]) if per_head else (B, T, f["H"] * f["dh"])
        out[f"{a}.self_attn.k_norm.out"] = (B, f["G"], T, f["dh"]) if per_head else (B, T, f["G"] * f["dh"])
    moe = f["moe"]
    if moe and layer in moe.get("layers", [layer]):  # experts in place of the FFN
        for k in (f"{a}.ffn.hidden", f"{a}.ffn.gate"):
            out.pop(k, None)
        out[f"{a}.ffn.router.probs"] = (B, T, moe["n_experts"])
        out[f"{a}.ffn.router.topk_ids"] = (B, T, moe["top_k"])
    return out


def _shape(dims: str, shape: tuple[int, ...]) -> str:
    """"B, T, D" and (1, 14, 576) -> "B×T×D = (1, 14, 576)" (× joins the names: a list of four letters would
    read as a sentence to the zh prose check)."""
    return f"{dims.replace(', ', '×')} = ({', '.join(str(n) for n in shape)})"


PAR_W = 0.28  # a parallel-residual layer's two columns (attention | FFN) are this wide
WIRING_YS = {  # the 2024–2026 wirings' main paths, bottom to top: block id -> y (pre-LN uses LM_LAYOUT)
    "sandwich": {"lm_embed": 0.08, "lm_norm1": 0.19, "lm_attn": 0.28, "lm_post1": 0.37, "lm_add1": 0.45,
                 "lm_norm2": 0.53, "lm_ffn": 0.62, "lm_post2": 0.71, "lm_add2": 0.79, "lm_norm": 0.88,
                 "lm_unembed": 0.96},
    "post": {"lm_embed": 0.08, "lm_attn": 0.28, "lm_post1": 0.39, "lm_add1": 0.48, "lm_ffn": 0.59, "lm_post2": 0.70,
             "lm_add2": 0.79, "lm_norm": 0.88, "lm_unembed": 0.96},
    "parallel": {"lm_embed": 0.08, "lm_norm1": 0.25, "lm_attn": 0.41, "lm_norm2": 0.25, "lm_ffn": 0.41,
                 "lm_add2": 0.57, "lm_norm": 0.78, "lm_unembed": 0.92},
}
PAR_X = {"lm_norm1": 0.54, "lm_attn": 0.54, "lm_norm2": 0.2, "lm_ffn": 0.2}  # attention on the side of RoPE


def lm_layout(desc: Mapping) -> dict[str, tuple[float, float]]:
    """Block id -> (x, y) of a decoder-only model's map, from the wiring its description says: pre-LN (the
    classic map), sandwich norms, norms after the sublayers, or attention and FFN side by side (parallel)."""
    f = lm_facts(desc)
    if f["wiring"] == "pre":
        pos = {b: (LM_X, y) for b, (y, *_) in LM_LAYOUT.items() if b in (
            "lm_embed", "lm_norm1", "lm_attn", "lm_add1", "lm_norm2", "lm_ffn", "lm_add2", "lm_norm", "lm_unembed")}
    else:
        pos = {b: (PAR_X.get(b, LM_X) if f["wiring"] == "parallel" else LM_X, y)
               for b, y in WIRING_YS[f["wiring"]].items()}
    if f["wiring"] == "parallel" and f["shared_norm"]:  # Phi, Cohere: one norm under both sublayers
        pos.pop("lm_norm2", None)
        pos["lm_norm1"] = (LM_X, pos["lm_norm1"][1])
    attn_y, ffn_y = pos["lm_attn"][1], pos["lm_ffn"][1]
    pos["lm_rope" if f["rotary"] else "lm_pos"] = (SIDE_X, attn_y) if f["rotary"] else (SIDE_X, 0.08)
    if f["qk_norm"]:
        pos["lm_qknorm"] = (SIDE_X, attn_y - 0.14)  # below RoPE's angles line
    if f["moe"]:
        pos["lm_router"] = (SIDE_X, ffn_y)
    return pos


def lm_blocks(desc: Mapping, layer: int = 0) -> list[Block]:
    """The blocks of a decoder-only model's map, labelled from its description (RoPE or learned positions,
    RMSNorm or LayerNorm, SwiGLU or a plain FFN, grouped-query or multi-head attention, tied or not; q/k norm,
    sandwich or post norms, parallel residual, experts with their router, and `layer`'s sliding window,
    soft-cap and query scale)."""
    f = lm_facts(desc)
    lf = layer_facts(desc, layer)
    norm = NORM_NAMES.get(f["norm"], f["norm"])
    act = ACT_NAMES.get(f["act"], f["act"])
    attn = (t("Masked self-attention, GQA: {H} query heads, {G} K/V heads", H=f["H"], G=f["G"]) if f["G"] < f["H"]
            else t("Masked multi-head self-attention ({H} heads)", H=f["H"]))
    extra = []
    if lf["window"]:
        extra.append(t("sliding window W = {w}", w=lf["window"]))
    if lf["sinks"]:  # gpt-oss: this layer's learned sink logits, one per head (live numbers)
        lo, hi = min(lf["sinks"]), max(lf["sinks"])
        extra.append(t("learned sinks s_h from {lo} to {hi}", lo=f"{lo:.2f}", hi=f"{hi:.2f}"))
    if extra:
        attn += " · " + " · ".join(extra)
    ffn = (t("SwiGLU FFN: down({act}(gate·x) ⊙ up·x), d_ff = {f}", act=act, f=f["d_ff"]) if f["gated"]
           else t("Feed-forward network: {act}, d_ff = {f}", act=act, f=f["d_ff"]))
    moe = f["moe"] if f["moe"] and layer in f["moe"].get("layers", [layer]) else None  # dense layers between
    if moe:
        ffn = t("Mixture of experts: top {k} of {E}, d_ff = {f}", k=moe["top_k"], E=moe["n_experts"], f=moe["d_ff"])
        if moe.get("shared"):
            ffn += " " + t("+ shared expert")
    labels = {"lm_embed": t("Token embedding (no ×√d)") if not desc.get("blocks", {}).get("embed_scale")
              else t("Token embedding × √d"),
              "lm_norm1": norm, "lm_attn": attn,
              "lm_add1": "+", "lm_norm2": norm, "lm_ffn": ffn, "lm_add2": "+",
              "lm_norm": t("Final {norm}", norm=norm),
              "lm_unembed": (t("Unembedding, tied to the token embedding → logits") if f["tied"]
                             else t("Unembedding → logits"))}
    if f["wiring"] in ("sandwich", "post"):
        labels["lm_post1"] = t("{norm} after attention", norm=norm)
        labels["lm_post2"] = t("{norm} after the FFN", norm=norm)
    if f["wiring"] == "post":
        del labels["lm_norm1"], labels["lm_norm2"]
    if f["wiring"] == "parallel":
        del labels["lm_add1"]
        labels["lm_norm1"], labels["lm_norm2"] = f"{norm}₁", f"{norm}₂"
    if f["wiring"] == "parallel" and f["shared_norm"]:  # Phi, Cohere: the attention and the FFN read one norm
        labels["lm_norm1"] = norm
        del labels["lm_norm2"]
    b = desc.get("blocks", {})
    if b.get("residual_multiplier") is not None:  # Granite: each sublayer's output × m before the "+"
        for k in ("lm_add1", "lm_add2"):
            if k in labels:
                labels[k] = f"+ {b['residual_multiplier']:g}×"
    if b.get("embed_multiplier") is not None:
        labels["lm_embed"] += f" × {b['embed_multiplier']:g}"
    for key, sign in (("logit_scale", "×"), ("logits_scaling", "÷")):  # Cohere, Granite
        if b.get(key) is not None:
            labels["lm_unembed"] += f" {sign} {b[key]:g}"
    if f["rotary"]:
        labels["lm_rope"] = (t("RoPE: rotates q and k by position") if f["rotary_dim"] >= f["dh"]
                             else t("RoPE on {r} of {d} dims", r=f["rotary_dim"], d=f["dh"]))  # partial rotary
        if lf["scaling"] != "default":
            kind = {"linear": t("linear"), "yarn": "YaRN"}.get(lf["scaling"], "Llama 3")
            labels["lm_rope"] += " · " + t("{kind} scaling ×{x}", kind=kind, x=f"{lf['factor']:g}")
            if lf["attention_factor"] not in (None, 1.0):  # YaRN: cos and sin × m
                labels["lm_rope"] += f" · q, k × {lf['attention_factor']:.3g}"
    else:
        labels["lm_pos"] = t("+ learned position embedding")
    if f["rotary"] and layer in (b.get("nope_layers") or []):  # SmolLM3: this layer's q and k are not turned
        labels["lm_rope"] = "NoPE"
    if f["qk_norm"]:
        labels["lm_qknorm"] = t("q/k {norm}", norm=norm)
    if moe:
        labels["lm_router"] = t("Router → top {k}", k=moe["top_k"])
    pos = lm_layout(desc)
    out = []
    for bid, (_, color, page, params) in LM_LAYOUT.items():
        if bid in labels and bid in pos:
            out.append(Block(bid, labels[bid], *pos[bid], color, page, params))
    return out


LM_LIST_LABELS = {"lm_norm1": N_("{norm} before self-attention"), "lm_add1": N_("+ residual after self-attention"),
                  "lm_norm2": N_("{norm} before the FFN"), "lm_add2": N_("+ residual after the FFN")}


def lm_list_label(block: Block, desc: Mapping, layer: int) -> str:
    """A block's name in the link list under the map: each on its own line, so the two norms and the two "+"
    say which sublayer they belong to, and the layer's blocks say which layer a click opens."""
    norm = NORM_NAMES.get(lm_facts(desc)["norm"], "")
    name = t(LM_LIST_LABELS[block.id], norm=norm) if block.id in LM_LIST_LABELS else block.label
    if block.id == "lm_add2" and lm_facts(desc)["wiring"] == "parallel":
        name = t("+ residual: x + attention + FFN")
    in_layer = block.page in ("layer", "attention") or block.id in ("lm_rope", "lm_router")
    return t("Layer {i}: {block}", i=layer, block=name) if in_layer else name


LM_BY_ID = {bid: Block(bid, "", 0, y, c, page, params) for bid, (y, c, page, params) in LM_LAYOUT.items()}


def lm_architecture_figure(desc: Mapping, B: int, T: int, layer: int = 0, size: int = LABEL_SIZE,
                           title_name: str = "") -> go.Figure:
    """A decoder-only LM as a block diagram, bottom to top (one layer drawn, × N, in the wiring its description
    says), with the shapes of (B, T) ids on its edges from the description (`lm_shapes`); one clickable marker
    per block."""
    f = lm_facts(desc)
    sh = lm_shapes(desc, B, T, layer)
    a = f"decoder.layers.{layer}.self_attn"
    small = size - 2
    blocks = lm_blocks(desc, layer)
    by = {b.id: b for b in blocks}
    par = f["wiring"] == "parallel"
    width = {b.id: LM_NARROW.get(b.id, PAR_W if par and b.id in PAR_X else BOX_W) for b in blocks}
    fig = go.Figure()
    for b in blocks:
        w = width[b.id]
        fig.add_shape(type="rect", x0=b.x - w / 2, x1=b.x + w / 2, y0=b.y - BOX_H / 2, y1=b.y + BOX_H / 2,
                      fillcolor=b.color, layer="below", line={"color": "#555", "width": 1})
        fig.add_annotation(x=b.x, y=b.y, text=wrap(b.label, size, BOX_PX * w / BOX_W - 16), showarrow=False,
                           font={"size": size + (6 if b.label == "+" else 0), "color": INK})
    # The layer's frame, × N.
    in_layer = [b for b in blocks if b.id not in ("lm_embed", "lm_norm", "lm_unembed") and b.id not in SIDE_IDS]
    y0 = min(b.y for b in in_layer) - BOX_H / 2 - 0.03
    y1 = by["lm_add2"].y + BOX_H / 2 + 0.006
    x0 = min(LM_X - BOX_W / 2 - 0.09, min(b.x - width[b.id] / 2 for b in in_layer) - 0.06)
    fig.add_shape(type="rect", x0=x0, x1=LM_X + FRAME_RIGHT, y0=y0, y1=y1, layer="below",
                  line={"color": "#888", "dash": "dot"}, fillcolor="rgba(0,0,0,0)")
    fig.add_annotation(x=x0 - 0.01, y=(y0 + y1) / 2, textangle=-90, showarrow=False, xanchor="right",
                       text=t("{side} layer × N = {n}", side=t("decoder"), n=f["L"]),
                       font={"size": size, "color": INK})
    # The main path with its tensors.
    ids = _shape("B, T", (B, T))
    _arrow(fig, LM_X, -0.01, LM_X, by["lm_embed"].y - BOX_H / 2, ids + " " + t("token ids"), size=small)
    if par:  # both sublayers read the layer's input; one sum adds both to it
        n2 = "lm_norm2" if "lm_norm2" in by else "lm_norm1"  # Phi, Cohere: one norm feeds both
        edges = [("lm_embed", "lm_norm1")] + ([("lm_embed", n2)] if n2 != "lm_norm1" else []) + [
            ("lm_norm1", "lm_attn"), (n2, "lm_ffn"), ("lm_attn", "lm_add2"), ("lm_ffn", "lm_add2"),
            ("lm_add2", "lm_norm"), ("lm_norm", "lm_unembed")]
    else:
        chain = [b for b in ("lm_embed", "lm_norm1", "lm_attn", "lm_post1", "lm_add1", "lm_norm2", "lm_ffn", "lm_post2",
                             "lm_add2", "lm_norm", "lm_unembed") if b in by]
        edges = list(zip(chain, chain[1:], strict=False))
    ffn_shape = (_shape("B, T, d_ff", sh[f"decoder.layers.{layer}.ffn.hidden"])
                 if f"decoder.layers.{layer}.ffn.hidden" in sh else "")
    qk_text = ("Q " + _shape("B, H, T, d_head", sh[f"{a}.q"]) + "<br>K, V "
               + _shape("B, H_kv, T, d_head", sh[f"{a}.k"]))
    ffn_text = (t("gate, up → hidden {shape}", shape=ffn_shape) if f["gated"] and ffn_shape
                else t("hidden {shape}", shape=ffn_shape) if ffn_shape
                else t("router {shape}", shape=_shape("B, T, E", sh[f"decoder.layers.{layer}.ffn.router.probs"])))
    edge_text = {}
    for lo, hi in edges:
        if hi == "lm_attn" and f["wiring"] == "sandwich":  # too little room between the boxes: in the hover only
            edge_text[(lo, hi)] = ""
        elif hi == "lm_attn":
            edge_text[(lo, hi)] = qk_text
        elif hi == "lm_ffn":
            edge_text[(lo, hi)] = ffn_text
        elif (lo == "lm_embed" and not par) or (lo == "lm_add2" and hi == "lm_norm"):
            edge_text[(lo, hi)] = _shape("B, T, D", sh["decoder.embed.out" if lo == "lm_embed"
                                                       else f"decoder.layers.{layer}.out"])
    if par:
        edge_text[("lm_embed", "lm_norm1")] = _shape("B, T, D", sh["decoder.embed.out"])
    for lo, hi in edges:
        _arrow(fig, by[lo].x, by[lo].y + BOX_H / 2, by[hi].x, by[hi].y - BOX_H / 2, edge_text.get((lo, hi), ""),
               size=small)
    _arrow(fig, LM_X, by["lm_unembed"].y + BOX_H / 2, LM_X, 1.04,
           "logits " + _shape("B, T, V", sh["logits"]) if "logits" in sh else "", size=small)
    # Residual connections: around each sublayer, from its input to its "+" (parallel: one, around both).
    first_attn = "lm_norm1" if "lm_norm1" in by else "lm_attn"
    first_ffn = "lm_norm2" if "lm_norm2" in by else "lm_ffn"
    loops = [(first_attn, "lm_add2")] if par else [(first_attn, "lm_add1"), (first_ffn, "lm_add2")]
    xr = x0 + 0.04 if par else LM_X - BOX_W / 2 - 0.05
    for start, add in loops:
        ys, ya = by[start].y - BOX_H / 2 - 0.015, by[add].y
        fig.add_shape(type="path", path=f"M {LM_X} {ys} L {xr} {ys} L {xr} {ya} L {LM_X - 0.035} {ya}",
                      line={"color": "#ff4b4b", "width": 2, "dash": "dot"}, layer="below")
    fig.add_annotation(x=xr - 0.015, y=by["lm_attn"].y, text=t("residual"), textangle=-90,
                       showarrow=False, font={"size": small, "color": "#ff4b4b"})
    # RoPE rotates q and k inside attention (nothing is added to the embedding); learned positions are added.
    side = by.get("lm_rope") or by.get("lm_pos")
    target = by["lm_attn"] if "lm_rope" in by else by["lm_embed"]
    w_side = LM_NARROW[side.id]
    _arrow(fig, side.x - w_side / 2, side.y, target.x + width[target.id] / 2, target.y, color="#2b7a3d")
    if "lm_rope" in by:
        base = layer_facts(desc, layer)["rope_base"] or f["rope_base"]
        fig.add_annotation(x=side.x, y=side.y - BOX_H / 2 - 0.012, yanchor="top", showarrow=False,
                           font={"size": small, "color": "#2b7a3d"},
                           text=t("angles {shape}, base {base}", shape=_shape("T, d_head/2", sh["decoder.rope.angles"]),
                                  base=f"{base:g}"))
    else:
        fig.add_annotation(x=side.x, y=side.y - BOX_H / 2 - 0.012, yanchor="top", showarrow=False,
                           font={"size": small, "color": "#2b7a3d"}, text=_shape("T, D", sh["decoder.embed.pos"]))
    for sid, tid in (("lm_qknorm", "lm_attn"), ("lm_router", "lm_ffn")):  # the 2024–2026 side blocks
        if sid in by:
            sb, tb = by[sid], by[tid]
            _arrow(fig, sb.x - LM_NARROW[sid] / 2, sb.y, tb.x + width[tid] / 2, tb.y, color="#7b61c4")
    if f["tied"]:  # the unembedding reuses the token table (transposed): a line on the left, clear of the labels
        xl, xb = 0.03, LM_X - BOX_W / 2
        fig.add_shape(type="path", path=f"M {xb} {by['lm_embed'].y} L {xl} {by['lm_embed'].y} "
                      f"L {xl} {by['lm_unembed'].y} L {xb} {by['lm_unembed'].y}",
                      line={"color": "#7b61c4", "width": 1.5, "dash": "dash"}, layer="below")
        fig.add_annotation(x=xl + 0.005, y=by["lm_norm"].y, xanchor="left", showarrow=False,
                           text=t("same matrix (tied)"), font={"size": small, "color": "#7b61c4"})
    into_attn = next(k for k in edge_text if k[1] == "lm_attn")
    into_ffn = next(k for k in edge_text if k[1] == "lm_ffn")
    hover = {"lm_attn": (edge_text[into_attn] or qk_text) + "<br>weights " + _shape("B, H, T, T", sh[f"{a}.weights"]),
             "lm_ffn": edge_text[into_ffn],
             "lm_unembed": "logits " + _shape("B, T, V", sh["logits"]) if "logits" in sh else "",
             "lm_embed": "decoder.embed.tok " + _shape("B, T, D", sh["decoder.embed.tok"])}
    fig.add_trace(go.Scatter(
        x=[b.x + width[b.id] / 2 - 0.015 for b in blocks], y=[b.y for b in blocks], mode="markers",
        customdata=[[b.id] for b in blocks], showlegend=False,
        marker={"size": 14 if size <= LABEL_SIZE else 18, "symbol": "circle", "color": "#ff4b4b", "opacity": 0.85},
        text=[f"{b.label}<br>{hover.get(b.id, '')}" for b in blocks],
        hovertemplate="%{text}<br>" + t("click to open its view") + "<extra></extra>"))
    fig.update_xaxes(visible=False, range=[0, 1])
    fig.update_yaxes(visible=False, range=[-0.03, 1.06])
    lf = layer_facts(desc, layer)
    wiring = {"pre": "pre-LN", "sandwich": t("sandwich norms"), "post": t("norms after the sublayers"),
              "parallel": t("parallel residual")}[f["wiring"]]
    kinds = " · ".join(x for x in ("RoPE" if f["rotary"] else t("learned positions"), NORM_NAMES.get(f["norm"], ""),
                                  "SwiGLU" if f["gated"] and not f["moe"] else "" if f["moe"]
                                  else ACT_NAMES.get(f["act"], ""), wiring,
                                  t("q/k norm") if f["qk_norm"] else "", layer_types(desc),
                                  t("soft-cap ±{c}", c=f"{lf['softcap']:g}") if lf["softcap"] else "",
                                  t("query scale {s}", s=f"{lf['scale']:.4g}") if lf["scale"] else "",
                                  t("experts: top {k} of {E}", k=f["moe"]["top_k"], E=f["moe"]["n_experts"])
                                  if f["moe"] else "", *f["mechanisms"]) if x)
    title = t("the live model{name}: D = {D}, {L} layers, H = {H}, H_kv = {G}, d_head = {dh}, d_ff = {f}, {kinds}",
              name=f" {title_name}" if title_name else "", D=f["D"], L=f["L"], H=f["H"], G=f["G"], dh=f["dh"],
              f=f["d_ff"], kinds=kinds)
    if title.endswith(kinds):  # the block kinds on a line of their own: one line would run off the figure
        title = title[:-len(kinds)].rstrip(", ，") + f"<br><sup>{kinds}</sup>"
    fig.update_layout(hoverlabel={"font": {"size": small}})
    return F._layout(fig, title, 900 if size <= LABEL_SIZE else 1100, plot_bgcolor="white", dragmode=False)


# ---------------------------------------------------------------- vision transformers (issue 40)

VIT_X = 0.42  # the column; the positions box sits to its right


def vit_architecture_figure(cfg: Mapping, size: int = LABEL_SIZE) -> go.Figure:
    """The lab's vision transformer (model/families/vit.py) as a block diagram, bottom to top: the image cut into
    patches, the patch embedding, [CLS] (and registers) in front, the positions added, the pre-LN encoder blocks,
    the final norm and the class head on [CLS]. `cfg`: ViTConfig.to_dict() (a trace's meta["config"])."""
    S, p, C, D, H = cfg["image_size"], cfg["patch_size"], cfg["channels"], cfg["d_model"], cfg["n_heads"]
    rows = cols = S // p
    N, R = rows * cols, int(cfg.get("n_registers") or 0)
    T = 1 + R + N
    small = size - 2
    pos = t("learned positions, one per patch") if cfg["positional"] == "learned" else \
        t("fixed 2-D sin/cos positions (half row, half column)")
    prefix = t("[CLS] in front") + (" " + t("+ {n} registers", n=R) if R else "")
    boxes = [  # (y, label, colour, shape on the edge into the next box)
        (0.06, t("image ({C} × {S} × {S})", C=C, S=S), "#eeeeee", f"({N}, {C}·{p}·{p} = {C * p * p})"),
        (0.17, t("cut into {r} × {c} patches of {p} × {p}, row by row", r=rows, c=cols, p=p), EMB, f"({N}, {D})"),
        (0.28, t("patch embedding: one linear layer {a} → {D}", a=C * p * p, D=D), EMB, f"({T}, {D})"),
        (0.39, prefix, EMB, f"({T}, {D})"),
        (0.50, "+", EMB, f"({T}, {D})"),
        (0.64, t("{L} encoder blocks (pre-LN): LayerNorm → self-attention, {H} heads → +; LayerNorm → FFN "
                 "{D} → {f} → {D} → +", L=cfg["n_layers"], H=H, D=D, f=cfg["d_ff"]), ATTN, f"({T}, {D})"),
        (0.78, t("final LayerNorm"), NORM, f"[CLS]: ({D},)"),
        (0.90, t("class head: linear {D} → {k}", D=D, k=cfg["n_classes"]), OUT, t("{k} class logits",
                                                                                  k=cfg["n_classes"])),
    ]
    fig = go.Figure()
    w, h = 0.5, 0.075
    for i, (y, label, colour, edge) in enumerate(boxes):
        bw = 0.08 if label == "+" else w
        fig.add_shape(type="rect", x0=VIT_X - bw / 2, x1=VIT_X + bw / 2, y0=y - h / 2, y1=y + h / 2,
                      fillcolor=colour, line={"color": "#555", "width": 1}, layer="below")
        fig.add_annotation(x=VIT_X, y=y, text=wrap(label, size, BOX_PX * bw / BOX_W - 16), showarrow=False,
                           font={"size": size, "color": INK})
        top = boxes[i + 1][0] - h / 2 if i + 1 < len(boxes) else 1.0
        _arrow(fig, VIT_X, y + h / 2, VIT_X, top, edge, size=small)
    fig.add_shape(type="rect", x0=0.76, x1=0.98, y0=0.50 - h / 2, y1=0.50 + h / 2, fillcolor=EMB,
                  line={"color": "#555", "width": 1}, layer="below")
    fig.add_annotation(x=0.87, y=0.50, text=wrap(pos, size, BOX_PX * 0.22 / BOX_W - 12), showarrow=False,
                       font={"size": size, "color": INK})
    _arrow(fig, 0.76, 0.50, VIT_X + 0.04, 0.50)
    fig.add_shape(type="rect", x0=VIT_X - w / 2 - 0.02, x1=VIT_X + w / 2 + 0.02, y0=0.58, y1=0.70,
                  line={"color": "#888", "dash": "dot"}, fillcolor="rgba(0,0,0,0)", layer="below")
    fig.update_xaxes(visible=False, range=[0, 1])
    fig.update_yaxes(visible=False, range=[0.0, 1.03])
    title = t("the vision transformer: {T} tokens = [CLS] + {R} registers + {N} patches, D = {D}, H = {H}",
              T=T, R=R, N=N, D=D, H=H)
    return F._layout(fig, title, 760 if size <= LABEL_SIZE else 900, plot_bgcolor="white", dragmode=False)
