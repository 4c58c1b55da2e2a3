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

from viz import figures as F
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
    """The Attention page's URL parameters (viz/attention_views.py) for one kind: enc, dec or cross."""
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
    """The URL parameters of the page a block opens, for the chosen layer and head."""
    return {k: str(v).format(layer=layer, head=head) for k, v in BY_ID[block_id].params.items()}


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
