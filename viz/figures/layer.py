"""Inside one Transformer layer: the residual stream, Add & Norm, the FFN, W^O, one query step by step.

Pure builders (Trace in, plotly Figure out, no streamlit, no model runs). Every number drawn is a
captured tensor, or a closed form of captured tensors (a norm, a mean, a dot product), batch row `b`.

The residual stream around one sublayer, in the two wirings (capture names, see DESIGN.md):

    post-LN (paper):  x → sublayer(x) → x + sublayer(x) = normK.in → LayerNorm → normK.out
    pre-LN:           x = normK.in → LayerNorm → normK.out → sublayer(·) → x + sublayer(·)

A layer's sublayers come from the model's own description (trace.meta["model"]): its attention modules
under that layer, in computation order, then "ffn"; its norms (norm1, norm2, ...) pair with them in order.
So the 2017 encoder/decoder, BERT and a decoder-only LM (pre-LN, RMSNorm, no cross-attention) share one path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from model.core.describe import attention_of, described, token_sides
from model.core.trace import LazyTrace
from viz.figures import attention as F
from viz.i18n import N_, t

SUBLAYERS = {  # the 2017 layout: stack -> [(sublayer, its norm)]; a trace's own layout is `sublayers(trace, layer)`
    "encoder": [("self_attn", "norm1"), ("ffn", "norm2")],
    "decoder": [("self_attn", "norm1"), ("cross_attn", "norm2"), ("ffn", "norm3")],
}
NORM_LABELS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}
ACT_LABELS = {"relu": "ReLU", "gelu": "GELU", "gelu_tanh": "GELU (tanh)", "silu": "SiLU"}
SUBLAYER_TITLES = {"self_attn": N_("self-attention"), "cross_attn": N_("cross-attention"),
                   "ffn": N_("feed-forward network")}
STEP_COLORS = ["#636efa", "#ef553b", "#00cc96", "#ab63fa"]
# A long prompt (issue 24: 2,048 tokens): a figure with one row (or column) per token shows a window of at most
# ROWS_UP_TO tokens, and at most FIGURE_CELLS heatmap cells (float32 in plotly's JSON: ~1 MB), so a browser is
# never sent SmolLM2's 2,048 × 1,536 FFN units (33 MB). Pages read these at run time (tests lower them).
ROWS_UP_TO = 256
FIGURE_CELLS = 200_000


class Step(NamedTuple):
    """One point of the residual stream: a label, the capture it is, and its value [L, D] (batch row b)."""

    label: str
    name: str
    value: np.ndarray


# ---------------------------------------------------------------- names


def is_pre_ln(trace) -> bool:
    """Whether the model normalises a sublayer's input (pre-LN) rather than the residual sum (post-LN), as it
    describes itself (an LM's config has no norm_first: every decoder-only LM here is pre-LN)."""
    blocks = described(trace.meta).get("blocks", {})
    if "norm_first" in blocks:
        return bool(blocks["norm_first"])
    return bool(trace.meta.get("config", {}).get("norm_first", False))


def norm_kind(trace) -> str:
    """"layernorm" or "rmsnorm" (RMSNorm: no mean-centring, no bias), from the model's description (Gemma's
    (1 + w) RMSNorm and OLMo 2's are RMSNorms too)."""
    kind = str(described(trace.meta).get("blocks", {}).get("norm", "layernorm"))
    return "rmsnorm" if kind.startswith("rmsnorm") else kind if kind in NORM_LABELS else "layernorm"


WIRINGS = ("post-ln", "pre", "sandwich", "post_norm", "parallel")


def wiring_kind(trace) -> str:
    """How a layer wires its norms and residual sums, from the model's description:
    "post-ln" (2017: Norm(x + sublayer(x))), "pre" (x + sublayer(Norm(x))), "sandwich" (Gemma 2/3:
    x + Norm'(sublayer(Norm(x)))), "post_norm" (OLMo 2: x + Norm(sublayer(x))) or "parallel" (GPT-NeoX:
    x + Attn(Norm₁(x)) + FFN(Norm₂(x)))."""
    blocks = described(trace.meta).get("blocks", {})
    if blocks.get("parallel_residual"):
        return "parallel"
    if blocks.get("norm_position") == "sandwich":
        return "sandwich"
    if blocks.get("norm_position") == "post":
        return "post_norm"
    return "pre" if is_pre_ln(trace) else "post-ln"


def sublayers(trace, layer: str) -> list[tuple[str, str]]:
    """[(sublayer, its norm)] of one layer ("decoder.layers.0"), in computation order: the attention modules
    the model describes under that layer, then "ffn"; the layer's norms (norm1, norm2, ...) in order. Falls
    back to the 2017 layout for a trace without a description."""
    mods = [m.rsplit(".", 1)[1] for m in described(trace.meta).get("attention", {})
            if m.rsplit(".", 1)[0] == layer]
    found = {n[len(layer) + 1:].split(".")[0] for n in trace.names()
             if n.startswith(layer + ".norm") and n.endswith(".in")}
    norms = sorted((n for n in found if n[4:].isdigit() or n == "norm"), key=lambda n: int(n[4:] or 0))
    ffn = described(trace.meta).get("blocks", {}).get("ffn") != "none"  # an attention-only model has no FFN
    subs = mods + (["ffn"] if ffn else [])
    if mods and described(trace.meta).get("blocks", {}).get("shared_norm") and norms == ["norm1"]:
        return [(sub, "norm1") for sub in subs]  # Phi, Cohere: attention and FFN read one norm of the same x
    posts = [n for n in ("norm_post_attn", "norm_post_ffn") if n in found]  # OLMo 2: norms after the sublayers only
    if mods and not norms and len(posts) == len(subs):
        return list(zip(subs, posts, strict=True))
    if not mods or len(norms) != len(subs):
        return list(SUBLAYERS[layer.split(".")[0]])
    return list(zip(subs, norms, strict=True))


def layers_of(trace, stack: str) -> list[str]:
    """The layer prefixes of one stack present in the trace: ["encoder.layers.0", ...]."""
    found = {n.split(".")[2] for n in trace.names() if n.startswith(f"{stack}.layers.") and n.endswith(".out")}
    return [f"{stack}.layers.{i}" for i in sorted(int(i) for i in found)]


def sublayer_output(layer: str, sublayer: str) -> str:
    return f"{layer}.{sublayer}.out"


def _norm_of(layer: str, sublayer: str, subs: Sequence[tuple[str, str]]) -> tuple[int, str]:
    j = [s for s, _ in subs].index(sublayer)
    return j, f"{layer}.{subs[j][1]}"


def _layer_input(layer: str) -> str:
    """The capture that feeds `layer`: the embedding output, or the previous layer's output."""
    stack, _, i = layer.split(".")
    return f"{stack}.embed.out" if int(i) == 0 else f"{stack}.layers.{int(i) - 1}.out"


def residual_names(layer: str, sublayer: str, pre_ln: bool, subs: Sequence[tuple[str, str]] | None = None,
                   norm_label: str = "LayerNorm") -> list[tuple[str, str]]:
    """[(label, capture name)] of the residual stream around one sublayer, in computation order. `subs`: the
    layer's [(sublayer, norm)] (`sublayers`; default the 2017 layout); `norm_label`: LayerNorm or RMSNorm."""
    subs = list(subs or SUBLAYERS[layer.split(".")[0]])
    j, norm = _norm_of(layer, sublayer, subs)
    out = sublayer_output(layer, sublayer)
    ln = norm_label
    if not pre_ln:
        x = _layer_input(layer) if j == 0 else f"{layer}.{subs[j - 1][1]}.out"
        return [("x", x), ("sublayer(x)", out), ("x + sublayer(x)", f"{norm}.in"),
                (f"{ln}(x + sublayer(x))", f"{norm}.out")]
    after = f"{layer}.{subs[j + 1][1]}.in" if j + 1 < len(subs) else f"{layer}.out"
    return [("x", f"{norm}.in"), (f"{ln}(x)", f"{norm}.out"), (f"sublayer({ln}(x))", out),
            (f"x + sublayer({ln}(x))", after)]


def residual_steps(trace, layer: str, sublayer: str, b: int = 0) -> list[Step]:
    """The residual stream around one sublayer as captured, in the model's own wiring order (`wiring_kind`):
    x, norm, sublayer, sum for 2017's two wirings; the 2024–2026 wirings add their extra steps
    (`modern_steps`)."""
    if wiring_kind(trace) in ("sandwich", "post_norm", "parallel"):
        return modern_steps(trace, layer, sublayer, b)
    names = residual_names(layer, sublayer, is_pre_ln(trace), sublayers(trace, layer),
                           NORM_LABELS[norm_kind(trace)])
    return [Step(label, name, F.arr(trace[name])[b]) for label, name in names]


POST = {"self_attn": "norm_post_attn", "ffn": "norm_post_ffn"}


def modern_steps(trace, layer: str, sublayer: str, b: int = 0) -> list[Step]:
    """The residual stream around one sublayer of a sandwich-norm (Gemma 2/3), post-norm (OLMo 2) or
    parallel-residual (GPT-NeoX) layer, each step a capture (or, for OLMo 2's stream between its two sublayers,
    which no module outputs, the sum of two captures, named as such):

        sandwich:   x → Norm(x) → sublayer(·) → Norm'(sublayer(·)) → x + Norm'(sublayer(·))
        post_norm:  x → sublayer(x) → Norm(sublayer(x)) → x + Norm(sublayer(x))
        parallel:   x → Normₖ(x) → this sublayer(·) → the other sublayer (same x) → x + Attn + FFN
    """
    kind = wiring_kind(trace)
    ln = NORM_LABELS[norm_kind(trace)]
    pairs = sublayers(trace, layer)
    subs = [s for s, _ in pairs]
    j = subs.index(sublayer)
    val = lambda name: F.arr(trace[name])[b]  # noqa: E731
    out = sublayer_output(layer, sublayer)
    if kind == "parallel":
        norm = f"{layer}.{pairs[j][1]}"  # norm1 / norm2, or the one shared norm (Phi, Cohere)
        other = subs[1 - j] if len(subs) == 2 else subs[0]
        return [Step("x", f"{norm}.in", val(f"{norm}.in")), Step(f"{ln}(x)", f"{norm}.out", val(f"{norm}.out")),
                Step(f"{sublayer}({ln}(x))", out, val(out)),
                Step(f"{other}({ln}'(x))", sublayer_output(layer, other), val(sublayer_output(layer, other))),
                Step("x + attn + ffn", f"{layer}.out", val(f"{layer}.out"))]
    post = f"{layer}.{POST[sublayer]}"
    if kind == "sandwich":
        norm = f"{layer}.norm{j + 1}"
        after = f"{layer}.norm{j + 2}.in" if j + 1 < len(subs) else f"{layer}.out"
        return [Step("x", f"{norm}.in", val(f"{norm}.in")), Step(f"{ln}(x)", f"{norm}.out", val(f"{norm}.out")),
                Step(f"sublayer({ln}(x))", out, val(out)), Step(f"{ln}'(sublayer)", f"{post}.out", val(f"{post}.out")),
                Step(f"x + {ln}'(sublayer)", after, val(after))]
    # post_norm: the stream between the sublayers is h = x + Norm(attn(x)), the input of the FFN
    x_in = _layer_input(layer)
    h_name = f"{x_in} + {layer}.{POST[subs[0]]}.out"
    h = val(x_in) + val(f"{layer}.{POST[subs[0]]}.out")
    x_name, x = (x_in, val(x_in)) if j == 0 else (h_name, h)
    after_name, after = (h_name, h) if j == 0 else (f"{layer}.out", val(f"{layer}.out"))
    return [Step("x", x_name, x), Step("sublayer(x)", out, val(out)),
            Step(f"{ln}(sublayer(x))", f"{post}.out", val(f"{post}.out")),
            Step(f"x + {ln}(sublayer(x))", after_name, after)]


def side_tokens(trace, name: str, b: int = 0) -> list[str]:
    """The tokens of a capture's positions (for attention: its queries), as the model describes itself."""
    return meta_tokens(trace, token_sides(trace.meta, name)[0], b)


def meta_tokens(trace, key: str, b: int = 0) -> list[str]:
    """The token strings of trace.meta[key] ("src_tokens", "tgt_tokens"), batch row b."""
    toks = trace.meta.get(key) or []
    return [str(x) for x in (toks[b] if toks and isinstance(toks[0], list) else toks)]


# ---------------------------------------------------------------- a window of tokens (long prompts)


def window_size(n_tokens: int, width: int = 1) -> int:
    """How many tokens a figure with `width` cells per token shows at once: all of them when they fit
    (ROWS_UP_TO rows, FIGURE_CELLS cells)."""
    return max(1, min(n_tokens, ROWS_UP_TO, FIGURE_CELLS // max(1, width)))


def token_window(n_tokens: int, first: int, size: int) -> slice:
    """Tokens first .. first + size − 1, moved back so the window stays inside the prompt."""
    first = max(0, min(int(first), n_tokens - size))
    return slice(first, first + size)


def window_labels(tokens: Sequence[str], rows: slice) -> list[str]:
    """The axis labels "i: tok" of a window's positions (i counts from the prompt's start)."""
    return F.token_labels(tokens, rows.stop)[rows]


def relabel_rows(fig: go.Figure, labels: Sequence[str]) -> go.Figure:
    """A figure built from a window's rows (position 0 = the window's first) relabelled with the prompt's
    positions: its heatmaps' y and the y axes that list every tick."""
    labels = list(labels)
    fig.update_traces(y=labels, selector={"type": "heatmap"})
    fig.for_each_yaxis(lambda ax: ax.update(tickvals=labels, ticktext=labels) if ax.tickvals else None)
    return fig


# ---------------------------------------------------------------- residual stream


def token_norms(m: np.ndarray) -> np.ndarray:
    """‖row‖₂ of an [L, D] matrix, computed in float64."""
    return np.linalg.norm(m.astype(np.float64), axis=-1)


def residual_figure(steps: Sequence[Step], tokens: Sequence[str], token: int) -> go.Figure:
    """Top: ‖·‖ per token for every step of the residual stream. Bottom: the chosen token's vectors
    (one row per step, D columns), on one colour range."""
    labels = F.token_labels(tokens, steps[0].value.shape[0])
    # The top chart's token axis: at most NORM_TICKS labels (every k-th, the chosen token's always), each cut to
    # NORM_TICK_CHARS characters; the gap under it is sized for those labels (tilted -60°) plus the bottom
    # chart's title, so neither is drawn over them at 2,404 tokens (issue 31 §3).
    every = max(1, -(-len(labels) // NORM_TICKS))
    ticks = sorted(set(range(0, len(labels), every)) | {token})
    short = [_cut(labels[i], NORM_TICK_CHARS) for i in ticks]
    height, top = 720, 130
    label_px = 7 * max(len(x) for x in short) * 0.87 + 12  # ~7 px a character at 12 px, sin 60°
    spacing = min(0.4, (label_px + 48) / (height - top - 10))
    fig = make_subplots(rows=2, cols=1, row_heights=[0.45, 0.55], vertical_spacing=spacing, subplot_titles=[
        t("‖vector‖ per token at each step"), t("the vectors of token {tok}", tok=labels[token])])
    for c, s in enumerate(steps):
        fig.add_trace(go.Scatter(x=labels, y=token_norms(s.value).astype(np.float32), mode="lines+markers",
                                 name=f"{s.label}  ({s.name})", line={"color": STEP_COLORS[c % 4]},
                                 hovertemplate=f"{s.label}<br>%{{x}}<br>‖·‖ = %{{y:.4g}}<extra></extra>"), 1, 1)
    strip = np.stack([s.value[token] for s in steps])  # (steps, D)
    fig.add_trace(F.heatmap_trace(strip, "values", list(range(strip.shape[1])), [s.label for s in steps],
                                  t("value"), hover_x="dim", hover_y="step"), 2, 1)
    fig.add_vline(x=token, line={"color": "#ff4b4b", "dash": "dot"}, row=1, col=1)
    fig.update_xaxes(type="category", tickangle=-60, tickmode="array", tickvals=[labels[i] for i in ticks],
                     ticktext=short, row=1, col=1)
    fig.update_yaxes(title="‖·‖₂", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(autorange="reversed", type="category", row=2, col=1)
    fig.update_xaxes(title=t("dimension"), row=2, col=1)
    F._layout(fig, t("residual stream around the sublayer"), height,
              legend={"orientation": "h", "y": 1.04, "yanchor": "bottom", "x": 0})
    return fig.update_layout(margin={"t": top})


NORM_TICKS = 48  # token labels on the per-token norm chart's axis, at most
NORM_TICK_CHARS = 16  # characters of one such label, at most


def _cut(label: str, n: int) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"


# ---------------------------------------------------------------- LayerNorm


def ln_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-token mean and (biased) variance over the D features, what LayerNorm normalises by."""
    x = x.astype(np.float64)
    return x.mean(-1), x.var(-1)


def rms_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-token mean μ (which RMSNorm leaves in) and mean square mean(x²), what RMSNorm divides by."""
    x = x.astype(np.float64)
    return x.mean(-1), (x * x).mean(-1)


def layernorm_figure(x_in: np.ndarray, x_out: np.ndarray, tokens: Sequence[str], name: str,
                     kind: str = "layernorm", first: int = 0) -> go.Figure:
    """Per-token mean μ and variance σ² over the features, before and after LayerNorm (`name`). For RMSNorm
    (kind="rmsnorm") the right panel is the mean square mean(x²) it divides by, and the left panel's μ is
    what it does *not* remove (no mean-centring). first: the position of x_in's first row (a window of a long
    prompt)."""
    labels = window_labels(tokens, slice(first, first + x_in.shape[0]))
    rms = kind == "rmsnorm"
    ln = NORM_LABELS.get(kind, "LayerNorm")
    titles = ([t("mean μ per token (RMSNorm does not subtract it: no mean-centring)"),
               t("mean square mean(x²) per token")] if rms else [t("mean μ per token"), t("variance σ² per token")])
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08, subplot_titles=titles)
    stats = rms_stats if rms else ln_stats
    syms = ("μ", "mean(x²)") if rms else ("μ", "σ²")
    for stage, m, color in ((t("{norm} input", norm=ln), x_in, "#636efa"),
                            (t("{norm} output", norm=ln), x_out, "#00cc96")):
        for c, (v, sym) in enumerate(zip(stats(m), syms, strict=True), start=1):
            fig.add_trace(go.Bar(x=labels, y=v.astype(np.float32), name=stage, marker_color=color,
                                 legendgroup=stage, showlegend=c == 1,
                                 hovertemplate=f"{stage}<br>%{{x}}<br>{sym} = %{{y:.4g}}<extra></extra>"), 1, c)
    fig.update_xaxes(type="category", tickangle=-60)
    fig.update_layout(barmode="group")
    title = (t("{name}: RMSNorm(x) = γ ⊙ x / √(mean(x²) + ε), per token (no μ subtracted, no β)", name=name) if rms
             else t("{name}: LayerNorm(x) = γ ⊙ (x − μ) / √(σ² + ε) + β, per token", name=name))
    return F._layout(fig, title, 380, legend={"orientation": "h", "y": -0.3})


# ---------------------------------------------------------------- wiring diagrams


_BOX = {"w": 0.36, "h": 0.085}


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def wiring_figure(steps: Sequence[Step], pre_ln: bool, token: int, sublayer: str,
                  title: str | None = None, norm: str = "layernorm") -> go.Figure:
    """The wiring of one sublayer as a block diagram (bottom to top, as in the paper), with the live
    tensors of token `token` on it: ‖·‖ of every edge, and μ, σ² of what the LayerNorm receives.

    `steps` must be in the wiring's order (residual_steps). The exact numbers are in the node
    markers' customdata: [‖value‖, μ, σ²] of each step, in step order."""
    sub = t(SUBLAYER_TITLES.get(sublayer, sublayer))
    ln = NORM_LABELS.get(norm, "LayerNorm")
    rms = norm == "rmsnorm"
    if pre_ln:  # x → LN → sublayer → ⊕ (the residual skips the LayerNorm)
        ys, kinds = [0.05, 0.32, 0.58, 0.86], ["in", "ln", "sub", "add"]
        boxes = ["x", ln, sub, "⊕"]
    else:  # x → sublayer → ⊕ → LN (the LayerNorm sits on the residual path)
        ys, kinds = [0.05, 0.32, 0.58, 0.86], ["in", "sub", "add", "ln"]
        boxes = ["x", sub, "⊕", ln]
    fig = go.Figure()
    colors = {"in": "#eef1f5", "ln": "#fde9c9", "sub": "#d7e8fb", "add": "#ffffff"}
    for y, kind, text in zip(ys, kinds, boxes, strict=True):
        w = 0.1 if kind == "add" else _BOX["w"]
        fig.add_shape(type="rect", x0=0.5 - w / 2, x1=0.5 + w / 2, y0=y - _BOX["h"] / 2, y1=y + _BOX["h"] / 2,
                      fillcolor=colors[kind], line={"color": "#444"})
        fig.add_annotation(x=0.5, y=y, text=f"<b>{text}</b>", showarrow=False)
    for a, b in zip(ys, ys[1:], strict=False):  # the main path
        fig.add_annotation(x=0.5, y=b - _BOX["h"] / 2, ax=0.5, ay=a + _BOX["h"] / 2, xref="x", yref="y",
                           axref="x", ayref="y", showarrow=True, arrowhead=2, text="")
    add_y = ys[kinds.index("add")]  # the residual connection: from x around to ⊕
    fig.add_shape(type="path", path=f"M 0.5 {ys[0] + _BOX['h'] / 2} L 0.12 {ys[0] + 0.08} L 0.12 {add_y} "
                  f"L {0.5 - 0.05} {add_y}", line={"color": "#ff4b4b", "width": 2, "dash": "dot"})
    fig.add_annotation(x=0.1, y=(ys[0] + add_y) / 2, text=t("residual"), textangle=-90, showarrow=False,
                       font={"color": "#ff4b4b"})
    vals = [s.value[token] for s in steps]
    stat = rms_stats if rms else ln_stats  # RMSNorm: [‖·‖, μ, mean(x²)]
    stats = [[float(token_norms(v[None])[0]), *(float(z[0]) for z in stat(v[None]))] for v in vals]
    norms = [s[0] for s in stats]
    _, mu, var = stats[0] if pre_ln else stats[2]  # what the LayerNorm receives
    # Edge labels: each step's value leaves its box upward (the last one leaves the diagram).
    text = [f"{s.label}<br>‖·‖ = {_fmt(n)}" for s, n in zip(steps, norms, strict=True)]
    fig.add_trace(go.Scatter(x=[0.72] * 4, y=[y + 0.09 for y in ys], mode="markers+text", text=text,
                             textposition="middle right", marker={"size": 6, "color": STEP_COLORS},
                             customdata=stats, showlegend=False,
                             hovertemplate="‖·‖ = %{customdata[0]:.4g}<br>μ = %{customdata[1]:.4g}<br>"
                                           + ("mean(x²)" if rms else "σ²")
                                           + " = %{customdata[2]:.4g}<extra></extra>"))
    ln_y = ys[kinds.index("ln")]
    fig.add_annotation(x=0.5 - _BOX["w"] / 2 - 0.01, y=ln_y, xanchor="right", showarrow=False,
                       text=t("input μ = {mu} (kept)<br>mean(x²) = {ms}", mu=_fmt(mu), ms=_fmt(var)) if rms
                       else t("input μ = {mu}<br>σ² = {var}", mu=_fmt(mu), var=_fmt(var)))
    fig.update_xaxes(visible=False, range=[0, 1.25])
    fig.update_yaxes(visible=False, range=[-0.05, 1.02])
    name = f"pre-LN: x + Sublayer({ln}(x))" if pre_ln else f"post-LN: {ln}(x + Sublayer(x))"
    return F._layout(fig, title or name, 470, plot_bgcolor="white")


WIRING_TITLES = {"sandwich": N_("sandwich norms: x + Norm'(Sublayer(Norm(x)))"),
                 "post_norm": N_("norms after the sublayers: x + Norm(Sublayer(x))"),
                 "parallel": N_("parallel residual: x + Attn(Norm₁(x)) + FFN(Norm₂(x))")}


def model_wiring_figure(steps: Sequence[Step], kind: str, token: int, sublayer: str,
                        norm: str = "rmsnorm") -> go.Figure:
    """The wiring of one sublayer as the model computes it (`modern_steps`, kind = "sandwich", "post_norm" or
    "parallel"), bottom to top, with the live ‖·‖ of token `token` at every step (exact numbers in the markers'
    customdata: [‖value‖, μ, mean square or σ²], in step order). Parallel: both sublayers read the same x side
    by side and one ⊕ adds them to it."""
    ln = NORM_LABELS.get(norm, "LayerNorm")
    sub = t(SUBLAYER_TITLES.get(sublayer, sublayer))
    other_id = "ffn" if sublayer != "ffn" else "self_attn"
    other = t(SUBLAYER_TITLES[other_id])
    colors = {"in": "#eef1f5", "ln": "#fde9c9", "sub": "#d7e8fb", "add": "#ffffff"}
    if kind == "parallel":  # (x, y, text, colour kind); the step markers sit at the nodes listed in `at`
        nodes = [(0.5, 0.05, "x", "in"), (0.3, 0.3, f"{ln}₁" if sublayer != "ffn" else f"{ln}₂", "ln"),
                 (0.3, 0.56, sub, "sub"), (0.72, 0.3, f"{ln}₂" if sublayer != "ffn" else f"{ln}₁", "ln"),
                 (0.72, 0.56, other, "sub"), (0.5, 0.84, "⊕", "add")]
        edges = [(0, 1), (1, 2), (0, 3), (3, 4), (2, 5), (4, 5)]
        at = [0, 1, 2, 4, 5]
    elif kind == "sandwich":
        nodes = [(0.5, 0.04, "x", "in"), (0.5, 0.24, ln, "ln"), (0.5, 0.44, sub, "sub"),
                 (0.5, 0.64, f"{ln}'", "ln"), (0.5, 0.86, "⊕", "add")]
        edges, at = [(0, 1), (1, 2), (2, 3), (3, 4)], [0, 1, 2, 3, 4]
    else:  # post_norm
        nodes = [(0.5, 0.05, "x", "in"), (0.5, 0.32, sub, "sub"), (0.5, 0.58, ln, "ln"), (0.5, 0.86, "⊕", "add")]
        edges, at = [(0, 1), (1, 2), (2, 3)], [0, 1, 2, 3]
    fig = go.Figure()
    bw = 0.3 if kind == "parallel" else _BOX["w"]
    for x, y, text, c in nodes:
        w = 0.1 if c == "add" else bw
        fig.add_shape(type="rect", x0=x - w / 2, x1=x + w / 2, y0=y - _BOX["h"] / 2, y1=y + _BOX["h"] / 2,
                      fillcolor=colors[c], line={"color": "#444"})
        fig.add_annotation(x=x, y=y, text=f"<b>{text}</b>", showarrow=False)
    for a, b in edges:
        (xa, ya, *_), (xb, yb, *_) = nodes[a], nodes[b]
        fig.add_annotation(x=xb, y=yb - _BOX["h"] / 2, ax=xa, ay=ya + _BOX["h"] / 2, xref="x", yref="y",
                           axref="x", ayref="y", showarrow=True, arrowhead=2, text="")
    x0, y0 = nodes[0][:2]
    add_y = nodes[-1][1]
    xr = 0.06 if kind == "parallel" else 0.12
    fig.add_shape(type="path", path=f"M {x0} {y0 + _BOX['h'] / 2} L {xr} {y0 + 0.08} L {xr} {add_y} "
                  f"L {nodes[-1][0] - 0.05} {add_y}", line={"color": "#ff4b4b", "width": 2, "dash": "dot"})
    fig.add_annotation(x=xr - 0.02, y=(y0 + add_y) / 2, text=t("residual"), textangle=-90, showarrow=False,
                       font={"color": "#ff4b4b"})
    stat = rms_stats if norm == "rmsnorm" else ln_stats
    vals = [s.value[token] for s in steps]
    stats = [[float(token_norms(v[None])[0]), *(float(z[0]) for z in stat(v[None]))] for v in vals]
    xs = [nodes[i][0] + (0.16 if kind == "parallel" else 0.22) for i in at]
    fig.add_trace(go.Scatter(x=xs, y=[nodes[i][1] + 0.08 for i in at], mode="markers+text",
                             text=[f"‖·‖ = {_fmt(st[0])}" for st in stats], textposition="middle right",
                             marker={"size": 6, "color": [STEP_COLORS[i % 4] for i in range(len(at))]},
                             customdata=stats, showlegend=False,
                             hovertext=[s.label for s in steps],
                             hovertemplate="%{hovertext}<br>‖·‖ = %{customdata[0]:.4g}<extra></extra>"))
    fig.update_xaxes(visible=False, range=[0, 1.2])
    fig.update_yaxes(visible=False, range=[-0.05, 1.0])
    return F._layout(fig, t(WIRING_TITLES[kind]), 470, plot_bgcolor="white")


# ---------------------------------------------------------------- FFN


def zero_share(hidden: np.ndarray) -> np.ndarray:
    """Per token, the share of d_ff units the activation set to exactly 0 (ReLU), [L]."""
    return (hidden == 0).mean(-1)


def ffn_figure(hidden: np.ndarray, tokens: Sequence[str], name: str, first: int = 0) -> go.Figure:
    """The FFN's hidden activations act(x W₁ + b₁), d_ff units (rows) × tokens (columns), and below,
    per token, the share of units the activation zeroed. first: the position of hidden's first row."""
    h = F.arr(hidden)  # (L, d_ff)
    labels = window_labels(tokens, slice(first, first + h.shape[0]))
    share = zero_share(h)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.78, 0.22], vertical_spacing=0.04)
    fig.add_trace(go.Heatmap(z=h.T, x=labels, y=list(range(h.shape[1])), colorscale="Inferno", zmin=0,
                             zmax=float(max(h.max(initial=0), 1e-6)), colorbar={"len": 0.75, "y": 0.62},
                             hovertemplate=t("unit") + " %{y}<br>%{x}<br>" + t("activation")
                             + " = %{z:.4g}<extra></extra>"), 1, 1)
    fig.add_trace(go.Bar(x=labels, y=share.astype(np.float32), marker_color="#555",
                         text=[f"{s:.0%}" for s in share], textposition="outside", showlegend=False,
                         hovertemplate="%{x}<br>" + t("zeroed") + " = %{y:.1%}<extra></extra>"), 2, 1)
    fig.update_yaxes(title=t("hidden unit (of {n})", n=h.shape[1]), autorange="reversed", row=1, col=1)
    fig.update_yaxes(title=t("zeroed"), range=[0, 1.15], tickformat=".0%", row=2, col=1)
    fig.update_xaxes(type="category", tickangle=-60)
    return F._layout(fig, t("{name}: FFN hidden layer, {n} units × {m} tokens", name=name, n=h.shape[1],
                            m=h.shape[0]), 640)


def gated_ffn_figure(gate: np.ndarray, hidden: np.ndarray, tokens: Sequence[str], name: str,
                     act: str = "silu", first: int = 0) -> go.Figure:
    """A gated FFN (SwiGLU): the gate act(W_gate·x) beside the hidden units act(W_gate·x) ⊙ (W_up·x), d_ff units
    (rows) × tokens (columns), each on a colour range symmetric around 0 (both can be negative). first: the
    position of the first row."""
    g, h = F.arr(gate), F.arr(hidden)  # (L, d_ff)
    labels = window_labels(tokens, slice(first, first + h.shape[0]))
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.06, subplot_titles=[
        t("gate: {act}(W_gate·x)", act=act), t("hidden: gate ⊙ (W_up·x), what W_down reads")])
    for c, (m, bar_x) in enumerate(((g, 0.46), (h, 1.0)), start=1):
        r = float(max(np.abs(m).max(initial=0), 1e-6))
        fig.add_trace(go.Heatmap(z=m.T, x=labels, y=list(range(m.shape[1])), colorscale="RdBu", zmid=0, zmin=-r,
                                 zmax=r, colorbar={"len": 0.9, "x": bar_x, "thickness": 12},
                                 hovertemplate=t("unit") + " %{y}<br>%{x}<br>" + t("activation")
                                 + " = %{z:.4g}<extra></extra>"), 1, c)
    fig.update_yaxes(title=t("hidden unit (of {n})", n=h.shape[1]), autorange="reversed", row=1, col=1)
    fig.update_xaxes(type="category", tickangle=-60)
    return F._layout(fig, t("{name}: gated FFN, {n} units × {m} tokens", name=name, n=h.shape[1], m=h.shape[0]),
                     640)


# ---------------------------------------------------------------- W^O


def concat_heads(z: np.ndarray) -> np.ndarray:
    """(H, L, d_k) head outputs → (L, H·d_k): transpose back and concatenate, as before W^O."""
    H, L, hs = z.shape
    return np.ascontiguousarray(z.transpose(1, 0, 2)).reshape(L, H * hs)


def wo_figure(z: np.ndarray, out: np.ndarray, tokens: Sequence[str], name: str, first: int = 0) -> go.Figure:
    """Concat(head_1, …, head_h) (tokens × H·d_k, head boundaries marked) and its projection by W^O
    (tokens × d_model, the captured `<attn>.out`). first: the position of the first row (a window)."""
    z, out = F.arr(z), F.arr(out)
    H, L, hs = z.shape
    cat = concat_heads(z)
    y = window_labels(tokens, slice(first, first + L))
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.06, subplot_titles=[
        t("Concat(head_1, …, head_{h})  ({L} × {n})", h=H, L=L, n=H * hs),
        t("· W^O + b  =  {name}.out  ({L} × {n})", name=name.split(".")[-1], L=L, n=out.shape[1])])
    fig.add_trace(F.heatmap_trace(cat, "values", list(range(cat.shape[1])), y, "concat", showscale=False,
                                  hover_x="dim", hover_y="position"), 1, 1)
    fig.add_trace(F.heatmap_trace(out, "values", list(range(out.shape[1])), y, "W^O output",
                                  hover_x="dim", hover_y="position"), 1, 2)
    for h in range(1, H):
        fig.add_vline(x=h * hs - 0.5, line={"color": "#222", "width": 2}, row=1, col=1)
    for h in range(H):  # head names under the concatenation, where its dimension ticks would be
        fig.add_annotation(x=h * hs + hs / 2 - 0.5, y=0, yref="y domain", yanchor="top", xref="x",
                           text=t("head {h}", h=h), showarrow=False, font={"size": 11})
    fig.update_xaxes(showticklabels=False, row=1, col=1)
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_yaxes(showticklabels=False, row=1, col=2)
    fig.update_xaxes(title=t("dimension"))
    return F._layout(fig, t("{name}: heads concatenated, then mixed by W^O", name=name),
                     F._size(L, 320, 14, 700))


# ---------------------------------------------------------------- one query, step by step


def kv_head(trace, name: str, head: int) -> int:
    """The K/V head query head `head` reads: h // (H / H_kv) (grouped-query attention; = head otherwise), with
    H and H_kv as the model describes itself (viz.figures.attention.kv_head)."""
    return F.kv_head(trace, name, head)


def _lazy(trace, name: str) -> bool:
    """Whether `name` is computed on demand from q, k and v (a long prompt's LazyTrace): a page then asks for
    the rows it shows, never the whole [B, H, T, T] map (151 MB for SmolLM2 at 2,048 tokens)."""
    return isinstance(trace, LazyTrace) and name not in trace.stored()


def head_outputs(trace, name: str, rows: slice = slice(None), b: int = 0) -> np.ndarray:
    """Every head's output z = Σ p_i v_i of attention module `name` for the query rows `rows`: (H, R, d_k), the
    captured `<name>.z`; from a LazyTrace, those rows' weights (over every key) times v, the same numbers."""
    if not _lazy(trace, f"{name}.z"):
        return F.arr(trace[f"{name}.z"])[b][:, rows]
    w = trace.attention(name, None, rows, batch=b)  # (H, R, T)
    v = trace[f"{name}.v"][b]  # (H_kv, T, d_k): grouped-query heads share a K/V head
    H, H_kv = F.kv_group(trace, name)
    r = H // H_kv  # query head h reads K/V head h // r
    return F.arr(w @ (v.repeat_interleave(r, dim=0) if r != 1 else v))


def query_steps(trace, name: str, head: int, query: int, b: int = 0) -> dict[str, np.ndarray]:
    """The soft lookup of one query, from the captures: q·k_i (q and k dotted here, in float64),
    ÷√d_k (the captured scores), + M (−∞ where blocked), softmax (the captured weights), p_i v_i and z.
    Grouped-query attention: the keys and values are those of K/V head `kv_head`. Rotary positions: q and k
    are the rotated ones (what the scores use); "qk_unrot" is the same dot product before the rotation.
    A LazyTrace gives this query's row only (its scores, weights and mask), never the module's whole map."""
    g = kv_head(trace, name, head)
    q = F.arr(trace[f"{name}.q"])[b, head, query].astype(np.float64)  # (d_k,)
    k = F.arr(trace[f"{name}.k"])[b, g].astype(np.float64)  # (Lk, d_k)
    v = F.arr(trace[f"{name}.v"])[b, g]
    extra = {}
    if f"{name}.q_unrot" in trace and f"{name}.k_unrot" in trace:
        qu = F.arr(trace[f"{name}.q_unrot"])[b, head, query].astype(np.float64)
        extra["qk_unrot"] = F.arr(trace[f"{name}.k_unrot"])[b, g].astype(np.float64) @ qu
    lazy = _lazy(trace, f"{name}.weights")
    if lazy:  # one row: (Lk,)
        p = F.arr(trace.row(name, query, head, batch=b))
        raw = trace.attention(name, head, query, what="scores", batch=b)[0]
        scaled = F.arr(raw)
    else:
        p = F.arr(trace[f"{name}.weights"])[b, head, query]
        scaled = F.arr(trace[f"{name}.scores"])[b, head, query]
    blocked = (F.arr(trace[f"{name}.mask"][b, 0, query]) > 0.5 if f"{name}.mask" in trace
               else np.zeros(k.shape[0], bool))
    info = attention_of(getattr(trace, "meta", None), name) or {}
    if info.get("scale"):  # the model's own query scale (Gemma 2/3: not 1/√d_k)
        extra["scale"] = np.array(float(info["scale"]))
    if info.get("softcap") and f"{name}.scores_capped" in trace:  # softmax reads the capped scores
        if lazy:
            from model.core.attention import softcap

            extra["capped"] = F.arr(softcap(raw, info["softcap"]))
        else:
            extra["capped"] = F.arr(trace[f"{name}.scores_capped"])[b, head, query]
        extra["softcap"] = np.array(float(info["softcap"]))
    if info.get("sinks"):  # gpt-oss: the head's learned sink logit joins the softmax and takes its share of the row
        extra["sink_logit"] = np.array(float(info["sinks"][head]))
        extra["sink"] = (np.array(1.0 - float(np.asarray(p, np.float64).sum())) if lazy or f"{name}.sink" not in trace
                         else np.array(float(F.arr(trace[f"{name}.sink"])[b, head, query])))
    last = extra.get("capped", scaled)
    z = p @ v if lazy else F.arr(trace[f"{name}.z"])[b, head, query]
    return {"qk": k @ q, "scaled": scaled, "masked": np.where(blocked, -np.inf, last), "blocked": blocked,
            "weights": p, "pv": p[:, None] * v, "z": z, "d_k": np.array(q.shape[0]), "kv_head": np.array(g),
            "head": np.array(head), "kv_group": np.array(F.kv_group(trace, name)), **extra}


PER_KEY = ("qk", "scaled", "capped", "masked", "blocked", "weights", "qk_unrot")  # query_steps' arrays over keys


def query_window(steps: Mapping[str, np.ndarray], keys: slice) -> dict[str, np.ndarray]:
    """One query's steps on a window of keys (a long prompt): each per-key array cut to the window, and what
    the keys outside it add to z summed into "pv_rest", so the z panel still stacks up to z."""
    out = dict(steps)
    for name in PER_KEY:
        if name in steps:
            out[name] = steps[name][keys]
    inside = np.zeros(len(steps["pv"]), bool)
    inside[keys] = True
    out["pv"], out["pv_rest"] = steps["pv"][keys], steps["pv"][~inside].sum(0)
    out["first"] = np.array(keys.start or 0)
    return out


def query_figure(steps: Mapping[str, np.ndarray], q_token: str, k_tokens: Sequence[str]) -> go.Figure:
    """Five panels, top to bottom: q·k_i, ÷√d_k, + M, softmax, and z = Σ p_i v_i (per d_k dimension,
    stacked from each key's contribution p_i v_i). Steps cut to a window of keys (`query_window`): the keys
    from steps["first"] on, and one more bar in the z panel for the keys outside the window."""
    d_k = int(steps["d_k"])
    first = int(steps.get("first", 0))
    x = window_labels(k_tokens, slice(first, first + steps["qk"].shape[0]))
    scale = float(steps["scale"]) if "scale" in steps else 1 / math.sqrt(d_k)
    two = (t("2. ÷ √d_k = {s}", s=f"{math.sqrt(d_k):.4g}") if math.isclose(scale, 1 / math.sqrt(d_k), rel_tol=1e-6)
           else t("2. × the model's scale {s} (not 1/√d_k)", s=f"{scale:.4g}"))
    three = (t("3. soft-cap {c}·tanh(s/{c}), + M  (−∞ where blocked)", c=f"{float(steps['softcap']):.4g}")
             if "capped" in steps else t("3. + M  (−∞ where blocked)"))
    four = (t("4. softmax with the sink s_h = {s} → p_i (sums to 1 − {sink})", s=f"{float(steps['sink_logit']):.4g}",
              sink=f"{float(steps['sink']):.4g}") if "sink" in steps else t("4. softmax → p_i (sums to 1)"))
    titles = [t("1. q·k_i  (query {q} against every key)", q=q_token), two, three, four,
              t("5. z = Σ p_i v_i  ({d} dimensions; each colour is one key's p_i v_i)", d=d_k)]
    if "kv_group" in steps and "head" in steps:  # grouped K/V heads: the keys and values are a shared head's
        shared = F.kv_label(*(int(n) for n in steps["kv_group"]), int(steps["head"]))
        if shared:
            titles[0] += " · " + shared
            titles[4] += " · " + shared
    fig = make_subplots(rows=5, cols=1, subplot_titles=titles, vertical_spacing=0.07,
                        row_heights=[0.18, 0.18, 0.18, 0.18, 0.28])
    blocked = steps["blocked"].astype(bool)
    masked_y = np.where(blocked, np.nan, steps["masked"]).astype(np.float32)
    bars = [(steps["qk"], "q·k"), (steps["scaled"], "q·k/√d_k"), (masked_y, "q·k/√d_k + M"),
            (steps["weights"], "p")]
    for r, (y, what) in enumerate(bars, start=1):
        y = np.asarray(y, dtype=np.float32)
        text = ["−∞" if (r == 3 and blocked[i]) else F.num(y[i]) for i in range(len(y))]
        fig.add_trace(go.Bar(x=x, y=y, text=text, textposition="outside", showlegend=False, cliponaxis=False,
                             marker_color=np.where(blocked, "#9aa0a6", "#1f77b4" if r < 4 else "#2ca02c").tolist(),
                             hovertemplate=f"%{{x}}<br>{what} = %{{y:.4g}}<extra></extra>"), r, 1)
    dims = [f"d{j}" for j in range(d_k)]
    for i in np.flatnonzero(~blocked):
        fig.add_trace(go.Bar(x=dims, y=steps["pv"][i].astype(np.float32), name=x[i], showlegend=False,
                             hovertemplate=f"{x[i]}: p·v = %{{y:.4g}}<extra></extra>"), 5, 1)
    if "pv_rest" in steps:  # the keys outside the window, summed: z is still the stack's total
        other = t("the other keys")
        fig.add_trace(go.Bar(x=dims, y=np.asarray(steps["pv_rest"], np.float32), name=other, showlegend=False,
                             marker_color="#c7c7c7", hovertemplate=f"{other}: Σ p·v = %{{y:.4g}}<extra></extra>"), 5, 1)
    fig.add_trace(go.Scatter(x=dims, y=np.asarray(steps["z"], np.float32), mode="markers", name="z",
                             marker={"color": "black", "symbol": "line-ew-open", "size": 12, "line": {"width": 2}},
                             hovertemplate="%{x}<br>z = %{y:.4g}<extra></extra>"), 5, 1)
    fig.update_layout(barmode="relative")
    fig.update_xaxes(type="category", tickangle=-60)
    fig.update_yaxes(range=[0, 1.15], row=4, col=1)
    return F._layout(fig, t("one query, step by step: the soft lookup"), 1100, showlegend=False)


# ---------------------------------------------------------------- post-LN vs pre-LN in practice

WIRING_COLORS = {"post-LN": "#d62728", "pre-LN": "#1f77b4"}


def prenorm_figure(results: Mapping) -> go.Figure:
    """Training loss of post-LN and pre-LN side by side: one panel per warmup (the results of
    model.prenorm.run_experiment). A run that diverged ends with a ✕ at its last finite step."""
    warmups = list(results["warmups"])
    fig = make_subplots(rows=1, cols=len(warmups), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[t("warmup = {w}", w=w) for w in warmups])
    for r in results["runs"]:
        c = warmups.index(r["warmup"]) + 1
        color = WIRING_COLORS.get(r["wiring"], "#555")
        fig.add_trace(go.Scatter(x=r["step"], y=np.asarray(r["loss"], np.float32), mode="lines", name=r["wiring"],
                                 legendgroup=r["wiring"], showlegend=c == 1, line={"color": color},
                                 hovertemplate=f"{r['label']}<br>step %{{x}}<br>loss %{{y:.4g}}<extra></extra>"),
                      1, c)
        if r["diverged"] and r["step"]:
            fig.add_trace(go.Scatter(x=[r["step"][-1]], y=[r["loss"][-1]], mode="markers", showlegend=False,
                                     marker={"symbol": "x", "size": 14, "color": color},
                                     hovertemplate=t("diverged (loss not finite) after step %{x}")
                                     + "<extra></extra>"), 1, c)
    fig.update_xaxes(title=t("training step"))
    fig.update_yaxes(title=t("training loss (label-smoothed cross-entropy)"), row=1, col=1)
    return F._layout(fig, t("post-LN vs pre-LN: training loss with and without learning-rate warmup"), 420,
                     legend={"orientation": "h", "y": -0.2})
