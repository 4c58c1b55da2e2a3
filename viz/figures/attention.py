"""Pure figure builders: `Trace` / arrays in, `plotly.graph_objects.Figure` out.

No streamlit here (unit-testable), and no model runs: every number drawn is a captured
tensor or a closed-form function of captured tensors (e.g. QKᵀ = scores × √d_k).

Conventions:
- one colour scale per quantity, the same on every page: attention weights on a fixed
  [0, 1] sequential scale; scores (QKᵀ, QKᵀ/√d_k) on a diverging scale centred at 0;
  masks binary (light = allowed, dark = blocked); vectors (embeddings, Q/K/V) on their
  own diverging scale centred at 0;
- heatmap data is sent as float32 arrays (plotly encodes them as compact base64), never
  as per-cell hover strings, so a 256-token input stays small;
- axes are categorical with labels "i tok" (unique even when a token repeats); hover
  shows the token names and the exact value;
- long inputs stay light (a 512-token page well under 20 MB): the single-head heatmap is always
  at full resolution; the all-heads grid and the model view are max-pooled (a sharp weight stays
  visible; the title says so, and hover shows the pooled max and the positions it covers); the
  score pipeline and the masks show a window of query rows (exact values, every key).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from model.core.describe import attention_of, described, token_sides
from viz.i18n import N_, t

WEIGHTS_SCALE = "Viridis"  # softmax weights, always zmin=0, zmax=1
SCORES_SCALE = "RdBu_r"  # logits before softmax: diverging, centred at 0
VALUES_SCALE = "PuOr_r"  # vectors (embeddings, PE, Q/K/V/z): diverging, centred at 0
DIFF_SCALE = "PiYG"  # snapshot differences (other - reference): diverging, centred at 0
ALLOWED, BLOCKED = "#eef1f5", "#2b2d42"
MASK_SCALE = [[0.0, ALLOWED], [0.5, ALLOWED], [0.5, BLOCKED], [1.0, BLOCKED]]
MAX_THUMB = 64  # model view: each thumbnail is pooled down to at most this many cells a side
MAX_GRID = 128  # all-heads grid: each panel is pooled down to at most this many cells a side
HEAD_BUTTON_CELLS = 65_536  # all heads ride along in the head heatmap up to this many cells (~5 B each)
QUERY_WINDOW = 64  # score pipeline and masks: query rows shown at a time when the input is longer

KIND_TITLES = {"weights": N_("softmax weights"), "scores": "QKᵀ/√d_k", "mask": N_("mask (dark = blocked)")}
MAX_TITLE_TEXT = 60  # characters of the input sentence quoted in a figure's subtitle


# ---------------------------------------------------------------- small helpers


def arr(x) -> np.ndarray:
    """A captured tensor (or array) as float32 numpy (bool masks become 0/1)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if x.dtype.is_floating_point:
            x = x.float()
        x = x.numpy()
    a = np.asarray(x)
    return a.astype(np.float32) if a.dtype != np.float32 else a


def show_token(tok: str) -> str:
    """A token as a visible label: spaces, newlines and control characters made readable."""
    if tok == " ":
        return "␣"
    out = []
    for ch in tok:
        if ch == "\n":
            out.append("⏎")
        elif ch == "\t":
            out.append("⇥")
        elif ord(ch) < 32 or 0x7F <= ord(ch) < 0xA0:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def token_labels(tokens: Sequence[str] | None, n: int) -> list[str]:
    """Unique axis labels "i: tok" for n positions (tokens may repeat or be missing). The colon keeps
    position 10 with token "3" from reading as "103"."""
    toks = list(tokens or [])
    return [f"{i}: {show_token(toks[i])}" if i < len(toks) else str(i) for i in range(n)]


def step_labels(inputs: Sequence[str], predicted: Sequence[str], model: Sequence[str] | None = None) -> list[str]:
    """One label per decoder position, "i: input → predicted" (e.g. "0: [BOS] → i"): the token the
    decoder reads there and the token it predicts from there. Every decoder-query axis uses these, so
    a row of cross-attention is never read as belonging to the wrong token.

    Under teacher forcing `predicted` is the reference (what the position should predict) and `model`
    the model's own prediction there (argmax of its logits): where the two differ the label says both,
    "9: 0 → 4 (model: 3)"."""
    pred, own = list(predicted), list(model or [])
    out = []
    for i, tok in enumerate(inputs):
        label = f"{i}: {show_token(tok)}"
        if i < len(pred):
            label += f" → {show_token(pred[i])}"
            if i < len(own) and own[i] != pred[i]:
                label += " " + t("(model: {tok})", tok=show_token(own[i]))
        out.append(label)
    return out


def teacher_forced(meta: Mapping) -> bool:
    """Whether the decoder read a given target (teacher forcing), not the model's own output."""
    return meta.get("generated") is False


MAX_TICKS = 40  # a category axis names every position up to this many (plotly would skip every other one)


def every_tick(labels: Sequence[str], limit: int = MAX_TICKS) -> dict:
    """Axis settings that label every category of `labels` when there are at most `limit` of them (plotly's
    automatic ticks drop every second label of a crowded axis); more are left to plotly's choice."""
    if len(labels) > limit:
        return {}
    return {"tickmode": "array", "tickvals": list(labels), "ticktext": list(labels)}


def num(v: float, digits: int = 3) -> str:
    """A number as every table and chart label prints it: `digits` significant digits, exact zero as "0"
    (not "0.00e+00"), tiny values in e-notation (1.58e-09, not 0.000000001)."""
    v = float(v)
    if v == 0:
        return "0"
    if not math.isfinite(v):
        return "−∞" if v < 0 else ("∞" if v > 0 else "NaN")
    return f"{v:.{digits}g}"


def symmetric_range(*arrays: np.ndarray) -> float:
    m = max((float(np.nanmax(np.abs(a))) for a in arrays if a.size and np.isfinite(a).any()), default=1.0)
    return m if m > 0 else 1.0


def _axis_title(name: str, meta: Mapping | None = None) -> tuple[str, str]:
    """(query axis, key axis) titles for an attention capture name."""
    kind = (attention_of(meta, name) or {}).get("kind")
    if kind == "encoder_self":
        return t("query (source)"), t("key (source)")
    desc = (meta or {}).get("model") or {}
    if desc.get("family") == "decoder_lm":  # one stack, one sequence: no source/target words (issue 26)
        return t("query (input → predicted)"), t("key")
    query = (t("query (decoder: input → reference)") if teacher_forced(meta or {})
             else t("query (decoder: input → predicted)"))
    if kind == "cross":
        return query, t("key (source, encoder output)")
    return query, t("key (target)")


def _what(kind: str) -> str:
    return t(KIND_TITLES.get(kind, kind))


def about(meta: Mapping) -> str:
    """The model and the sentence a figure shows, for its subtitle (so an exported image says so)."""
    name, text = meta.get("checkpoint"), meta.get("text")
    if not name and not text:
        return ""
    text = str(text or "")
    if len(text) > MAX_TITLE_TEXT:
        text = t("{start}… ({n} characters)", start=text[:MAX_TITLE_TEXT], n=len(text))
    return t("model {name} · “{text}”", name=name or "?", text=show_token(text))


def _titled(title: str, meta: Mapping, module: str | None = None) -> str:
    """`title` over a subtitle: the attention module's capture name (`module`: what a notebook or a snapshot test
    reads, the title saying it in words) and the model and sentence (`about`)."""
    sub = " · ".join(x for x in (module, about(meta)) if x)
    return f"{title}<br><sup>{sub}</sup>" if sub else title


_MODULE = re.compile(r"(encoder|decoder)\.layers\.(\d+)\.(self_attn|cross_attn)")
MODULE_KINDS = {"self_attn": N_("self-attention"), "cross_attn": N_("cross-attention")}


def module_title(name: str, meta: Mapping | None = None) -> str:
    """An attention module's capture name in words, for a figure's title (issue 38 §5: a class read
    `decoder.layers.5.self_attn · 头 1`): "layer 5 · self-attention" (zh 第 5 层 · 自注意力); the stack is named only
    where the model has two (the 2017 Transformer: "decoder layer 1 · cross-attention"). Any other name as it is."""
    m = _MODULE.fullmatch(name)
    if m is None:
        return name
    stack, layer, kind = m.groups()
    stacks = described(meta).get("stacks", {})  # from the config for a trace saved before descriptions existed
    two = sum(1 for s in stacks.values() if isinstance(s, Mapping) and s.get("layers")) > 1
    where = (t("encoder layer {l}", l=layer) if stack == "encoder" else t("decoder layer {l}", l=layer)) if two \
        else t("layer {l}", l=layer)
    return f"{where} · {t(MODULE_KINDS[kind])}"


def attention_tokens(meta: Mapping, name: str) -> tuple[list[str], list[str]]:
    """(query tokens, key tokens) of an attention capture, from trace metadata."""
    q_side, k_side = token_sides(meta, name)  # the model's description says which tokens label each axis
    return _side(meta, q_side), _side(meta, k_side)


def _side(meta: Mapping, key: str) -> list[str]:
    toks = meta.get(key) or []
    return [str(x) for x in (toks[0] if toks and isinstance(toks[0], list) else toks)]


def axis_labels(meta: Mapping, name: str, n_q: int, n_k: int) -> tuple[list[str], list[str]]:
    """(query labels, key labels) of an attention capture: decoder queries as `step_labels`
    (input → predicted), everything else as `token_labels`."""
    q_tok, k_tok = attention_tokens(meta, name)
    if token_sides(meta, name)[0] == "tgt_tokens":
        y = (step_labels(q_tok[:n_q], _side(meta, "next_tokens"), meta.get("model_tokens")) if q_tok
             else token_labels(None, n_q))
        y += token_labels(None, n_q)[len(y):]
    else:
        y = token_labels(q_tok, n_q)
    return y, token_labels(k_tok, n_k)


# ---------------------------------------------------------------- query heads and K/V heads


def kv_group(trace: Mapping, name: str) -> tuple[int, int]:
    """(H, H_kv) of attention module `name`: its query heads and its K/V heads, as the model describes itself
    (trace.meta["model"]). Grouped-query attention has H_kv < H (SmolLM2: 9 and 3), multi-query H_kv = 1, the
    2017 Transformer H_kv = H. A trace without a description (a dict of arrays) falls back to the captured
    shapes: `.q` (or the weights) has H heads, `.k` (or `.v`) H_kv."""
    info = attention_of(_description(trace), name) or {}
    H, H_kv = info.get("n_heads"), info.get("n_kv_heads")
    if not H:
        def heads(*roles):
            return next((int(trace[f"{name}.{r}"].shape[1]) for r in roles if f"{name}.{r}" in trace), None)

        H, H_kv = heads("q", "weights", "scores", "z"), heads("k", "v")
    if not H:
        raise ValueError(f"{name}: the trace says nothing about this module's heads (no description, no .q)")
    H, H_kv = int(H), int(H_kv or H)
    if H_kv < 1 or H % H_kv:
        raise ValueError(f"{name}: {H} query heads cannot share {H_kv} K/V heads (not a divisor)")
    return H, H_kv


def _description(trace: Mapping) -> dict | None:
    """The part of a trace's metadata that describes the model, without copying the rest (`Trace.meta` is a deep
    copy, and a long prompt's meta holds its token lists several times over)."""
    item = getattr(trace, "meta_item", None)
    if item is not None:
        return {"model": item("model"), "config": item("config")}
    return getattr(trace, "meta", None)


def kv_head(trace: Mapping, name: str, head: int) -> int:
    """The K/V head query head `head` reads: head // (H / H_kv) (= head without grouping)."""
    H, H_kv = kv_group(trace, name)
    if not 0 <= head < H:
        raise ValueError(f"head {head} is out of range: {name} has query heads 0..{H - 1}")
    return head // (H // H_kv)


def kv_readers(H: int, H_kv: int, g: int) -> range:
    """The query heads that read K/V head g."""
    r = H // H_kv
    return range(g * r, (g + 1) * r)


def kv_label(H: int, H_kv: int, head: int) -> str:
    """Which K/V head query head `head` reads, said for a caption or title ("K/V head 0, shared by query heads
    0–2"); "" when every query head has its own (H_kv = H)."""
    if H_kv == H:
        return ""
    g = head // (H // H_kv)
    if H_kv == 1:
        return t("K/V head 0, shared by all {h} query heads", h=H)
    heads = kv_readers(H, H_kv, g)
    return t("K/V head {g}, shared by query heads {a}–{b}", g=g, a=heads[0], b=heads[-1])


def heatmap_trace(z: np.ndarray, kind: str, x: list[str] | None = None, y: list[str] | None = None,
                  value_name: str | None = None, zrange: float | None = None, showscale: bool = True,
                  hover_x: str | None = None, hover_y: str | None = None) -> go.Heatmap:
    """One heatmap with the project's colour scale for `kind`: weights, scores, values, diff or mask."""
    z = arr(z)
    value_name, hover_x, hover_y = value_name or t("value"), hover_x or t("key"), hover_y or t("query")
    kw: dict = {}
    if kind == "weights":
        kw = {"colorscale": WEIGHTS_SCALE, "zmin": 0.0, "zmax": 1.0}
    elif kind in ("scores", "values", "diff"):
        r = zrange if zrange is not None else symmetric_range(z)
        scale = {"scores": SCORES_SCALE, "values": VALUES_SCALE, "diff": DIFF_SCALE}[kind]
        kw = {"colorscale": scale, "zmin": -r, "zmax": r, "zmid": 0.0}
    elif kind == "mask":
        kw = {"colorscale": MASK_SCALE, "zmin": 0.0, "zmax": 1.0,
              "colorbar": {"tickvals": [0.25, 0.75], "ticktext": [t("allowed"), t("blocked")]}}
    else:
        raise ValueError(f"unknown heatmap kind {kind!r}")
    fmt = ".4g" if kind != "mask" else ""
    value = f"%{{z:{fmt}}}" if fmt else "%{z}"
    return go.Heatmap(
        z=z, x=x, y=y, showscale=showscale,
        hovertemplate=f"{hover_y} %{{y}}<br>{hover_x} %{{x}}<br>{value_name} = {value}<extra></extra>",
        **kw,
    )


# ---------------------------------------------------------------- fonts and titles for the room


_CJK = re.compile(r"[\u3000-\u9fff\uff00-\uffef]")


def text_width(s: str, size: float = 12) -> float:
    """Rough pixel width of `s` in a `size` px font: CJK and full-width characters are square, others ~0.6."""
    return sum(size if _CJK.match(ch) else 0.6 * size for ch in re.sub(r"<[^>]+>", "", s))


def scale_fonts(fig: go.Figure, size: int = 18) -> go.Figure:
    """Every text of `fig` at about `size` px, in place (presentation mode on a projector). Streamlit's chart
    theme sets tick, axis-title and legend fonts itself, so `layout.font` alone left tick labels at 12 px."""
    fig.update_layout(font={"size": size}, legend={"font": {"size": size}}, hoverlabel={"font": {"size": size}})
    if fig.layout.title and fig.layout.title.text:
        fig.update_layout(title={"font": {"size": round(size * 1.2)}})
    fig.update_xaxes(tickfont={"size": size}, title={"font": {"size": size}})
    fig.update_yaxes(tickfont={"size": size}, title={"font": {"size": size}})
    for ann in fig.layout.annotations or ():  # subplot titles, notes
        ann.font.size = size
    for menu in fig.layout.updatemenus or ():  # head buttons
        menu.font.size = size
    for tr in fig.data:
        if "colorbar" in tr:
            tr.colorbar.tickfont.size = size
            tr.colorbar.title.font.size = size
        if "textfont" in tr:
            tr.textfont.size = size
    return fig


def upright_y_titles(fig: go.Figure, copy: bool = False) -> go.Figure:
    """Chinese y-axis titles written horizontally: plotly turns a y title 90°, which leaves Chinese lying on
    its side; each such title moves above the top of its axis, over the tick labels, as Chinese charts put
    it. Other titles stay as they are. In place, or on a copy (made only when a title moves) if `copy`."""
    def chinese(name: str) -> bool:
        axis = fig.layout[name]
        text = axis.title.text if axis.title else None
        return bool(text and _CJK.search(text) and axis.side != "right")

    names = [k for k in fig.layout.to_plotly_json() if k.startswith("yaxis") and chinese(k)]
    if names and copy:
        fig = go.Figure(fig)
    layout = fig.layout
    size = (layout.font.size if layout.font and layout.font.size else 12)
    lift = 40 if layout.updatemenus else 4  # above a row of buttons over the plot (the head heatmap's)
    moved = 0
    for ax in names:
        axis = layout[ax]
        text = axis.title.text
        yref = "y" + ax.removeprefix("yaxis")
        xref = axis.anchor if axis.anchor and axis.anchor != "free" else "x"
        width = text_width(text, axis.title.font.size or size)
        layout.annotations = (*(layout.annotations or ()), go.layout.Annotation(
            text=text, xref=f"{xref} domain", yref=f"{yref} domain", x=0, y=1, xanchor="right", yanchor="bottom",
            yshift=lift, showarrow=False, align="right", font={"size": axis.title.font.size or size}))
        axis.title.text = None
        margin = layout.margin
        # The plot starts at max(margin.l, the tick labels' width) (automargin), so the title, which ends where
        # the plot starts, fits when the margin alone is as wide as the title.
        need = int(width + 12)
        if need > (margin.l if margin.l is not None else 80):
            margin.l = need
        moved += 1
    if moved:
        layout.margin.t = (layout.margin.t if layout.margin.t is not None else 100) + 18 + lift
    return fig


def _layout(fig: go.Figure, title: str, height: int, **kw) -> go.Figure:
    kw.setdefault("margin", {"l": 10, "r": 10, "t": 60, "b": 10})
    if "<br>" in title:  # a second line (the capture name, model, sentence), centred in the top margin with the
        kw["margin"] = {**kw["margin"], "t": kw["margin"].get("t", 60) + 20}  # first: at 80 px it ran into "QKᵀ"
    fig.update_layout(title={"text": title, "x": 0.0}, height=height, **kw)
    return fig


def _size(n: int, base: int = 320, per: int = 14, cap: int = 900) -> int:
    return int(min(cap, max(base, 120 + per * n)))


# ---------------------------------------------------------------- attention: one head, all heads


def attention_heatmap(trace: Mapping, name: str, head: int, kind: str = "weights",
                      meta: Mapping | None = None, all_heads: bool = False) -> go.Figure:
    """One head of one attention module: `<name>.weights` (or .scores) [0, head], query × key.

    all_heads=True: the figure carries every head of the module (one trace each, only `head` visible)
    and a row of head buttons that switch heads in the browser, with no server round trip (issue 12),
    as long as all heads fit in HEAD_BUTTON_CELLS cells; a longer input gets the one head only."""
    w = arr(trace[f"{name}.{kind}"])[0]  # (H, Lq, Lk)
    meta = meta if meta is not None else getattr(trace, "meta", {})
    y, x = axis_labels(meta, name, *w.shape[1:])
    qa, ka = _axis_title(name, meta)
    hk, what = "scores" if kind == "scores" else kind, _what(kind)
    heads = list(range(w.shape[0])) if all_heads and w.size <= HEAD_BUTTON_CELLS else [head]
    titles = [_titled(t("{name} · head {head} · {what}", name=module_title(name, meta), head=h, what=what), meta,
                      name) for h in heads]
    fig = go.Figure([heatmap_trace(w[h], hk, x, y, value_name=what).update(visible=h == head) for h in heads])
    height = _size(w.shape[1], 380, 16)
    width = _square_width(w.shape[1:], height, x, y)
    if len(heads) > 1:  # room for the head buttons, which start where the heatmap does (after the y labels)
        width = max(width, 7 * max(map(len, y), default=2) + 90 + 30 * len(heads))
    _layout(fig, titles[heads.index(head)], height, width=width)
    if len(heads) > 1:  # each button shows its head's trace and title: plotly does it in the browser
        fig.update_layout(
            margin={"t": 100}, title={"y": 1.0, "yref": "container", "yanchor": "top", "pad": {"t": 12}},
            annotations=[{"text": t("head"), "xref": "paper", "yref": "paper", "x": 0.0, "y": 1.0, "xanchor": "left",
                          "yanchor": "bottom", "yshift": 10, "showarrow": False, "font": {"size": 12}}],
            updatemenus=[{"type": "buttons", "direction": "right", "active": head, "showactive": True, "x": 0.0,
                          "xanchor": "left", "y": 1.0, "yanchor": "bottom", "pad": {"b": 6, "l": 44},
                          "font": {"size": 11},
                          "buttons": [{"label": str(h), "method": "update",
                                       "args": [{"visible": [g == h for g in heads]}, {"title.text": title}]}
                                      for h, title in zip(heads, titles, strict=True)]}])
    fig.update_yaxes(autorange="reversed", title=qa, type="category", scaleanchor="x", constrain="domain",
                     **every_tick(y))
    fig.update_xaxes(title=ka, type="category", tickangle=-60, constrain="domain", **every_tick(x))
    return fig


def _square_width(shape: tuple[int, int], height: int, x: Sequence[str], y: Sequence[str]) -> int:
    """A figure width that fits square cells of a (rows × cols) heatmap `height` pixels tall, plus its
    tick labels and colour bar, so the figure (and an exported PNG) is the heatmap, not a wide margin."""
    label = 7 * max(map(len, y), default=2) + 40  # y tick labels and the axis title
    below = 6 * max(map(len, x), default=2) + 40  # x tick labels, rotated
    cell = max(4.0, (height - 70 - below) / max(1, shape[0]))
    return int(min(1400, max(420, cell * shape[1] + label + 130)))


def heads_grid(trace: Mapping, name: str, kind: str = "weights", meta: Mapping | None = None,
               cols: int = 4, max_cells: int = MAX_GRID) -> go.Figure:
    """Every head of one attention module side by side (same colour scale for all).

    Inputs longer than `max_cells` are max-pooled to at most `max_cells` a side (see `block_max`):
    the title says "downsampled b×", hover names the b positions a cell covers and their max."""
    w = arr(trace[f"{name}.{kind}"])[0]  # (H, Lq, Lk)
    H = w.shape[0]
    cols = min(cols, H)
    rows = math.ceil(H / cols)
    meta = meta if meta is not None else getattr(trace, "meta", {})
    b = pool_factor(w.shape[1:], max_cells)
    if b == 1:
        y, x = axis_labels(meta, name, *w.shape[1:])
    else:
        q_tok, k_tok = attention_tokens(meta, name)
        y, x = block_labels(q_tok, w.shape[1], b), block_labels(k_tok, w.shape[2], b)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[t("head {h}", h=h) for h in range(H)],
                        horizontal_spacing=0.03, vertical_spacing=0.08 if rows > 1 else 0.05)
    hk = "scores" if kind == "scores" else kind
    r = symmetric_range(w) if hk == "scores" else None
    what = _what(kind)
    pooled = {"hover_x": t("keys"), "hover_y": t("queries")} if b > 1 else {}
    for h in range(H):
        z = block_max(w[h], max_cells)[0]
        value = (t("head {h}: max of {b}×{b} {what}", h=h, b=b, what=what) if b > 1
                 else t("head {h} {what}", h=h, what=what))
        fig.add_trace(heatmap_trace(z, hk, x, y, value_name=value, zrange=r, showscale=(h == 0), **pooled),
                      row=h // cols + 1, col=h % cols + 1)
    fig.update_yaxes(autorange="reversed", type="category", showticklabels=False)
    for r in range(1, rows + 1):  # token labels on the first column only: they would overlap the next panel
        fig.update_yaxes(showticklabels=len(y) <= MAX_TICKS, row=r, col=1, **every_tick(y))
    fig.update_xaxes(type="category", tickangle=-60, showticklabels=False)
    for h in range(H):  # token labels only under a panel with none below it: they would cover the head titles
        if h + cols >= H:
            fig.update_xaxes(showticklabels=len(x) <= MAX_TICKS, row=h // cols + 1, col=h % cols + 1,
                             **every_tick(x))
    side = _size(len(y), 260, 8, 420)
    note = " · " + t("downsampled {b}×: each cell is the max of {b}×{b}", b=b) if b > 1 else ""
    return _layout(fig, _titled(t("{name} · all {n} heads · {what}", name=module_title(name, meta), n=H, what=what)
                                + note, meta, name),
                   60 + rows * side, margin={"l": 10, "r": 10, "t": 90, "b": 10})


# ---------------------------------------------------------------- model view


def pool_factor(shape: Sequence[int], max_cells: int) -> int:
    """The block side b that `block_max` uses so no side of `shape` exceeds max_cells (1 = no pooling)."""
    return max(1, math.ceil(max(shape) / max_cells))


def block_labels(tokens: Sequence[str] | None, n: int, b: int) -> list[str]:
    """Axis labels for n positions pooled in blocks of b: "a–e first…last" (the positions a..e a block
    covers, and their first and last tokens); plain `token_labels` when b == 1."""
    if b == 1:
        return token_labels(tokens, n)
    toks = list(tokens or [])
    out = []
    for a in range(0, n, b):
        e = min(a + b, n) - 1
        span = f"{a}–{e}" if e > a else f"{a}"
        if a < len(toks):
            span += " " + show_token(toks[a]) + (f"…{show_token(toks[e])}" if a < e < len(toks) else "")
        out.append(span)
    return out


def block_max(z: np.ndarray, max_cells: int = MAX_THUMB) -> tuple[np.ndarray, int]:
    """Max-pool a 2-D map into b×b blocks so no side exceeds max_cells. Returns (pooled, b).

    Max, not mean: attention is sparse, and a single sharp weight must stay visible in a thumbnail."""
    b = pool_factor(z.shape, max_cells)
    if b == 1:
        return z, 1
    ph, pw = (-z.shape[0]) % b, (-z.shape[1]) % b
    padded = np.pad(z.astype(np.float64), ((0, ph), (0, pw)), constant_values=np.nan)
    blocks = padded.reshape(padded.shape[0] // b, b, padded.shape[1] // b, b)
    return np.nanmax(blocks, axis=(1, 3)).astype(np.float32), b


def model_view(trace: Mapping, names: Sequence[str], kind: str = "weights", max_cells: int = MAX_THUMB,
               selected: tuple[int, int] | None = None) -> go.Figure:
    """Every layer (row) × head (column) of one attention kind as thumbnails.

    `names` are the attention modules, one per layer (e.g. encoder.layers.{i}.self_attn). Long
    inputs are max-pooled to at most `max_cells` a side (sharp weights stay visible). An
    invisible marker per thumbnail (customdata = [layer, head]) makes a click selectable.
    """
    maps = [arr(trace[f"{n}.{kind}"])[0] for n in names]
    L, H = len(maps), maps[0].shape[0]
    fig = make_subplots(rows=L, cols=H, horizontal_spacing=0.01, vertical_spacing=0.02,
                        row_titles=[t("layer {i}", i=i) for i in range(L)],
                        column_titles=[t("head {h}", h=h) for h in range(H)])
    block = 1
    hk = "scores" if kind == "scores" else kind
    r = symmetric_range(*maps) if hk == "scores" else None
    for i, m in enumerate(maps):
        for h in range(H):
            z, block = block_max(m[h], max_cells)
            n_q, n_k = z.shape
            if block > 1:  # pooled cells are labelled by the positions they cover ("8–15")
                xs, ys = block_labels(None, m.shape[2], block), block_labels(None, m.shape[1], block)
                axes = {"x": xs, "y": ys, "hover_x": t("keys"), "hover_y": t("queries")}
                cx, cy = xs[(n_k - 1) // 2], ys[(n_q - 1) // 2]
            else:
                axes, cx, cy = {}, (n_k - 1) / 2, (n_q - 1) / 2
            label = t("layer {i} head {h}", i=i, h=h) + (" " + t("(max of {b}×{b})", b=block) if block > 1 else "")
            first = i == 0 and h == 0
            fig.add_trace(heatmap_trace(z, hk, zrange=r, showscale=first, value_name=label, **axes),
                          row=i + 1, col=h + 1)
            fig.add_trace(go.Scatter(x=[cx], y=[cy], mode="markers", customdata=[[i, h]],
                                     marker={"size": 40, "opacity": 0.0}, showlegend=False,
                                     hovertemplate=t("layer {i}, head {h}: click to enlarge", i=i, h=h)
                                     + "<extra></extra>"),
                          row=i + 1, col=h + 1)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    if block > 1:  # labels like "512" (a last one-position block) must not turn an axis numeric
        fig.update_xaxes(type="category")
        fig.update_yaxes(type="category")
    note = " " + t("(max over {b}×{b} blocks)", b=block) if block > 1 else ""
    fig.layout.meta = {"heads": H}
    _layout(fig, t("model view · {what}", what=_what(kind)) + note, 80 + L * max(110, 600 // H))
    return select_thumbnail(fig, *selected) if selected else fig


def select_thumbnail(fig: go.Figure, layer: int, head: int) -> go.Figure:
    """Outline thumbnail (layer, head) of a `model_view` figure in red (in place; replaces any
    earlier outline, so a cached model view can follow the selected head cheaply)."""
    n = layer * fig.layout.meta["heads"] + head + 1
    ref = "" if n == 1 else str(n)
    fig.layout.shapes = [go.layout.Shape(type="rect", xref=f"x{ref} domain", yref=f"y{ref} domain", x0=0, x1=1,
                                         y0=0, y1=1, line={"color": "#ff4b4b", "width": 3})]
    return fig


# ---------------------------------------------------------------- score pipeline and masks


def raw_scores(trace: Mapping, name: str) -> np.ndarray:
    """QKᵀ (before the √d_k scaling), all heads: scores × √d_k, [H, Lq, Lk]."""
    d_k = arr(trace[f"{name}.q"]).shape[-1]
    return arr(trace[f"{name}.scores"])[0] * np.float32(math.sqrt(d_k))


def query_windows(n: int, size: int = QUERY_WINDOW) -> list[tuple[int, int]]:
    """Consecutive query-row windows [a, b) of at most `size` rows covering n rows."""
    return [(a, min(a + size, n)) for a in range(0, max(n, 1), size)]


def _window(n: int, rows: tuple[int, int] | None) -> tuple[slice, str]:
    """(row slice, title note) for an optional query window [a, b) of n rows."""
    if rows is None:
        return slice(None), ""
    a, b = max(0, int(rows[0])), min(n, int(rows[1]))
    if not a < b:
        raise ValueError(f"query rows {rows} are outside 0..{n - 1}")
    return slice(a, b), ("" if (a, b) == (0, n) else " · " + t("query rows {a}–{b} of {n}", a=a, b=b - 1, n=n))


def score_pipeline(trace: Mapping, name: str, head: int, meta: Mapping | None = None,
                   rows: tuple[int, int] | None = None) -> go.Figure:
    """softmax(QKᵀ/√d_k + M), one step per panel: QKᵀ | ÷√d_k | + M (−∞ where blocked) | softmax.

    The two score panels share one colour range (that of the whole head, so it does not change
    from one window to the next), so the shrinking by √d_k is visible. `rows` = (a, b): only
    query rows a..b-1 (every key, exact values), for long inputs.
    """
    meta = meta if meta is not None else getattr(trace, "meta", {})
    d_k = arr(trace[f"{name}.q"]).shape[-1]
    scaled = arr(trace[f"{name}.scores"])[0, head]
    qk = scaled * np.float32(math.sqrt(d_k))  # = raw_scores(trace, name)[head]
    r = symmetric_range(qk)
    blocked = _mask2d(trace, name, scaled.shape)
    y, x = axis_labels(meta, name, *qk.shape)
    sl, note = _window(qk.shape[0], rows)
    qk, scaled, blocked, y = qk[sl], scaled[sl], blocked[sl], y[sl]
    masked = np.where(blocked, np.nan, scaled).astype(np.float32)
    w = arr(trace[f"{name}.weights"])[0, head][sl]
    titles = ["QKᵀ", f"÷ √d_k  (√{d_k} = {math.sqrt(d_k):.3g})", t("+ M  (dark = −∞)"), t("softmax → weights")]
    fig = make_subplots(rows=1, cols=4, subplot_titles=titles, horizontal_spacing=0.04)
    fig.add_trace(heatmap_trace(qk, "scores", x, y, "QKᵀ", zrange=r, showscale=False), 1, 1)
    fig.add_trace(heatmap_trace(scaled, "scores", x, y, "QKᵀ/√d_k", zrange=r, showscale=False), 1, 2)
    # One colour bar for the three score panels (they share the range), under them and their x labels.
    below = 6 * max(map(len, x), default=2) if qk.shape[1] <= 40 else 0
    height = _size(qk.shape[0], 330, 10, 560) + below + 90
    bar_y = -(below + 20) / (height - 80 - (below + 90))  # paper units: below the tick labels
    score_bar = {"orientation": "h", "x": 0.37, "xanchor": "center", "y": bar_y, "yanchor": "top", "len": 0.7,
                 "thickness": 12, "title": {"text": t("QKᵀ, QKᵀ/√d_k (one scale)"), "side": "bottom"}}
    fig.add_trace(heatmap_trace(masked, "scores", x, y, "QKᵀ/√d_k + M", zrange=r).update(colorbar=score_bar),
                  1, 3)
    over = np.where(blocked, 1.0, np.nan).astype(np.float32)
    fig.add_trace(go.Heatmap(z=over, x=x, y=y, colorscale=[[0, BLOCKED], [1, BLOCKED]], showscale=False,
                             hovertemplate=t("query %{y}<br>key %{x}<br>M = −∞ (blocked)") + "<extra></extra>"),
                  1, 3)
    fig.add_trace(heatmap_trace(w, "weights", x, y, t("weight"), showscale=True), 1, 4)
    fig.update_yaxes(autorange="reversed", type="category", showticklabels=False)
    fig.update_xaxes(type="category", showticklabels=qk.shape[1] <= MAX_TICKS, tickangle=-60, **every_tick(x))
    fig.update_yaxes(showticklabels=qk.shape[0] <= MAX_TICKS, row=1, col=1, **every_tick(y))
    return _layout(fig, _titled(t("{name} · head {head}: softmax(QKᵀ/√d_k + M)", name=module_title(name, meta),
                                  head=head) + note, meta, name), height,
                   margin={"l": 10, "r": 10, "t": 80, "b": below + 90})


def _mask2d(trace: Mapping, name: str, shape: tuple[int, int]) -> np.ndarray:
    if f"{name}.mask" in trace:
        return arr(trace[f"{name}.mask"])[0, 0] > 0.5
    return np.zeros(shape, dtype=bool)


def mask_components(trace: Mapping, name: str) -> dict[str, np.ndarray]:
    """The masks behind one attention module, each [Lq, Lk] (1 = blocked): padding (keys),
    look-ahead (decoder self-attention only) and the combined mask the module used."""
    combined = arr(trace[f"{name}.mask"])[0, 0]
    n_q, n_k = combined.shape
    info = attention_of(getattr(trace, "meta", None), name) or {}
    pad_name = "masks.src_pad" if info.get("key_tokens") == "src_tokens" else "masks.tgt_pad"  # keys' padding
    out = {}
    if pad_name in trace:
        key_pad = arr(trace[pad_name])[0][:n_k]
        out[t("padding ({name})", name=pad_name)] = np.broadcast_to(key_pad[None, :], (n_q, n_k)).astype(np.float32)
    if info.get("causal") and "masks.causal" in trace:
        out[t("look-ahead (masks.causal)")] = arr(trace["masks.causal"])[:n_q, :n_k]
    out[t("combined (used)") if len(out) > 1 else f"{name}.mask"] = combined
    return out


def mask_figure(trace: Mapping, name: str, head: int, meta: Mapping | None = None,
                rows: tuple[int, int] | None = None) -> go.Figure:
    """The masks (padding, look-ahead, combined) beside the weights they produce; `rows` = (a, b):
    only query rows a..b-1, for long inputs."""
    meta = meta if meta is not None else getattr(trace, "meta", {})
    masks = mask_components(trace, name)
    w = arr(trace[f"{name}.weights"])[0, head]
    y, x = axis_labels(meta, name, *w.shape)
    sl, note = _window(w.shape[0], rows)
    masks, w, y = {k: m[sl] for k, m in masks.items()}, w[sl], y[sl]
    titles = [*masks, t("weights, head {head}", head=head)]
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.04)
    for c, (label, m) in enumerate(masks.items(), start=1):
        fig.add_trace(heatmap_trace(m, "mask", x, y, label, showscale=False), 1, c)
    fig.add_trace(heatmap_trace(w, "weights", x, y, t("weight")), 1, len(titles))
    fig.update_yaxes(autorange="reversed", type="category", showticklabels=False)
    fig.update_yaxes(showticklabels=w.shape[0] <= MAX_TICKS, row=1, col=1, **every_tick(y))
    fig.update_xaxes(type="category", showticklabels=w.shape[1] <= MAX_TICKS, tickangle=-60, **every_tick(x))
    return _layout(fig, _titled(t("{name}: mask M (1 = blocked → −∞) and the weights", name=module_title(name, meta))
                                + note, meta, name),
                   _size(w.shape[0], 320, 10, 520), margin={"l": 10, "r": 10, "t": 80, "b": 10})


# ---------------------------------------------------------------- Q, K, V, z


def qkvz_figure(trace: Mapping, name: str, head: int, meta: Mapping | None = None) -> go.Figure:
    """Q, K, V (position × d_k) of one head and its output z = weights · V, as a 2 × 2 grid: the query
    side on top (Q and z: one row per query), the key side below (K and V: one row per key). Each row of
    panels shares one token axis, labelled once on its left, so no labels fall on a neighbouring panel.

    With grouped K/V heads (H_kv < H, from the model's description) K and V are those of the K/V head this
    query head reads, head // (H / H_kv); the K and V panel titles and the figure's title say which."""
    meta = meta if meta is not None else getattr(trace, "meta", {})
    H, H_kv = kv_group(trace, name)
    if not 0 <= head < H:
        raise ValueError(f"head {head} is out of range: {name} has query heads 0..{H - 1}")
    g = head // (H // H_kv)  # the K/V head this query head reads
    parts = {r: arr(trace[f"{name}.{r}"])[0, g if r in ("k", "v") else head] for r in ("q", "k", "v", "z")}
    n_q, n_k = parts["q"].shape[0], parts["k"].shape[0]
    q_lab, k_lab = axis_labels(meta, name, n_q, n_k)
    qa, ka = _axis_title(name, meta)
    rng = symmetric_range(*parts.values())
    rows_px = [min(420, max(120, 14 * n)) for n in (n_q, n_k)]
    shared = kv_label(H, H_kv, head)
    k_title, v_title = t("K (keys)"), t("V (values)")
    if shared:
        k_title, v_title = (t("{what} · K/V head {g}", what=w, g=g) for w in (k_title, v_title))
    fig = make_subplots(rows=2, cols=2, horizontal_spacing=0.04, vertical_spacing=0.16, shared_yaxes=True,
                        row_heights=[p / sum(rows_px) for p in rows_px],
                        subplot_titles=[t("Q (queries)"), "z = softmax(QKᵀ/√d_k + M)·V", k_title, v_title])
    for (r, c), role in zip(((1, 1), (1, 2), (2, 1), (2, 2)), ("q", "z", "k", "v"), strict=True):
        m = parts[role]
        value = f"{role}[head {head}]" if role in ("q", "z") or not shared else f"{role}[K/V head {g}]"
        fig.add_trace(heatmap_trace(m, "values", [f"d{j}" for j in range(m.shape[1])],
                                    q_lab if role in ("q", "z") else k_lab, value, zrange=rng,
                                    showscale=role == "z", hover_x=t("dim"), hover_y=t("position")), r, c)
    fig.update_yaxes(autorange="reversed", type="category")
    for r, (labels, title) in enumerate(((q_lab, qa), (k_lab, ka)), start=1):
        fig.update_yaxes(title=title, row=r, col=1, **every_tick(labels))
        fig.update_yaxes(showticklabels=False, row=r, col=2)
    fig.update_xaxes(type="category", showticklabels=False)
    fig.update_xaxes(title=t("d_k dims"), row=2)  # under the grid only: above, it would run into K's and V's titles
    title = t("{name} · head {head}: per-head projections (d_k = {d_k})", name=module_title(name, meta), head=head,
              d_k=parts["q"].shape[1])
    if shared:  # the K and V panels are not this query head's own: say whose they are
        title += " · " + t("K, V: {which}", which=shared)
    return _layout(fig, _titled(title, meta, name),
                   sum(rows_px) + 230, margin={"l": 10, "r": 10, "t": 80, "b": 10})


# ---------------------------------------------------------------- the √d_k lesson


def softmax_rows(s: np.ndarray, blocked: np.ndarray | None = None) -> np.ndarray:
    s = s.astype(np.float64)
    if blocked is not None:
        s = np.where(blocked, -np.inf, s)
    s = s - np.max(s, axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def row_entropy(p: np.ndarray) -> np.ndarray:
    """Entropy (nats) of each softmax row; 0 = all weight on one key, log n = uniform."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=-1)


def scaling_stats(trace: Mapping, name: str) -> dict:
    """Everything the √d_k lesson plots, for all heads of one module (pure numpy)."""
    qk = raw_scores(trace, name).astype(np.float64)  # (H, Lq, Lk)
    d_k = arr(trace[f"{name}.q"]).shape[-1]
    blocked = np.broadcast_to(_mask2d(trace, name, qk.shape[1:]), qk.shape)
    allowed = ~blocked
    h_raw = row_entropy(softmax_rows(qk, blocked))
    h_scaled = row_entropy(softmax_rows(qk / math.sqrt(d_k), blocked))
    q, k = arr(trace[f"{name}.q"])[0].astype(np.float64), arr(trace[f"{name}.k"])[0].astype(np.float64)
    return {
        "d_k": d_k, "qk": qk[allowed], "scaled": (qk / math.sqrt(d_k))[allowed],
        "entropy_raw": h_raw.ravel(), "entropy_scaled": h_scaled.ravel(),
        "var_qk": float(np.var(qk[allowed])), "var_q": float(np.var(q)), "var_k": float(np.var(k)),
        "max_entropy": float(np.log(max(1, int(allowed[0].sum(-1).max())))),
    }


def _hist_bars(values: np.ndarray, bins: np.ndarray, name: str, color: str) -> go.Bar:
    counts, edges = np.histogram(values, bins=bins)
    centers = (edges[:-1] + edges[1:]) / 2
    return go.Bar(x=centers.astype(np.float32), y=counts.astype(np.int32), name=name, marker_color=color,
                  opacity=0.7, width=float(edges[1] - edges[0]),
                  hovertemplate=f"{name}<br>" + t("value ≈ %{x:.3g}<br>count %{y}") + "<extra></extra>")


def scaling_figure(trace: Mapping, name: str, bins: int = 60) -> go.Figure:
    """Why divide by √d_k: histograms of QKᵀ vs QKᵀ/√d_k entries, and of softmax row entropy
    with and without the scaling (pre-binned: a few hundred numbers, whatever the input length)."""
    s = scaling_stats(trace, name)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08, subplot_titles=[
        t("score entries (Var QKᵀ = {v}; Var of scaled = {vs})", v=f"{s['var_qk']:.3g}",
          vs=f"{s['var_qk'] / s['d_k']:.3g}"),
        t("softmax row entropy (nats; right = spread out, 0 = one-hot)")])
    lim = float(max(np.abs(s["qk"]).max(initial=0), 1e-6))
    edges = np.linspace(-lim, lim, bins + 1)
    fig.add_trace(_hist_bars(s["qk"], edges, t("QKᵀ (unscaled)"), "#d62728"), 1, 1)
    fig.add_trace(_hist_bars(s["scaled"], edges, f"QKᵀ/√{s['d_k']}", "#1f77b4"), 1, 1)
    hmax = max(s["max_entropy"], 1e-3)
    hedges = np.linspace(0, hmax * 1.0001, bins // 2 + 1)
    fig.add_trace(_hist_bars(s["entropy_raw"], hedges, "softmax(QKᵀ + M)", "#d62728"), 1, 2)
    fig.add_trace(_hist_bars(s["entropy_scaled"], hedges, "softmax(QKᵀ/√d_k + M)", "#1f77b4"), 1, 2)
    fig.update_layout(barmode="overlay", legend={"orientation": "h", "y": -0.15})
    fig.update_xaxes(title=t("score"), row=1, col=1)
    fig.update_xaxes(title=t("entropy (nats)"), row=1, col=2)
    fig.update_yaxes(title=t("count"))
    return _layout(fig, _titled(t("{name}: the √d_k lesson (all heads, allowed cells only)",
                                  name=module_title(name, getattr(trace, "meta", None))), {}, name), 400)


def variance_demo(d_k: int, n: int = 4000, seed: int = 0, bins: int = 60) -> go.Figure:
    """The seeds' derivation made visible: for q, k with i.i.d. N(0, 1) entries,
    Var(q·k) = d_k, and q·k/√d_k has variance 1 whatever d_k is."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((n, d_k)), rng.standard_normal((n, d_k))
    dots = (q * k).sum(-1)
    lim = max(4.0, 4 * math.sqrt(d_k))
    edges = np.linspace(-lim, lim, bins + 1)
    scaled = dots / math.sqrt(d_k)
    fig = go.Figure([_hist_bars(dots, edges, f"q·k (Var = {dots.var():.3g} ≈ d_k = {d_k})", "#d62728"),
                     _hist_bars(scaled, edges, f"q·k/√d_k (Var = {scaled.var():.3g})", "#1f77b4")])
    fig.update_layout(barmode="overlay", legend={"orientation": "h", "y": -0.2})
    fig.update_xaxes(title=t("dot product"))
    return _layout(fig, t("random q, k ~ N(0, 1), d_k = {d_k}: {n} samples", d_k=d_k, n=n), 340)


# ---------------------------------------------------------------- tokens and embeddings


def vectors_heatmap(m, tokens: Sequence[str] | None, title: str, value_name: str = "value",
                    zrange: float | None = None) -> go.Figure:
    """A (position × dimension) matrix: embeddings, positional encodings, layer outputs."""
    m = arr(m)
    y = token_labels(tokens, m.shape[0])
    fig = go.Figure(heatmap_trace(m, "values", list(range(m.shape[1])), y,
                                  value_name, zrange=zrange, hover_x=t("dim"), hover_y=t("position")))
    fig.update_yaxes(autorange="reversed", type="category", showticklabels=m.shape[0] <= 60,
                     title=t("position: token") if tokens else t("position"), **every_tick(y))
    fig.update_xaxes(title=t("dimension"))
    return _layout(fig, title, _size(m.shape[0], 300, 12, 700))


def embedding_sum_figure(tok, pos, out, tokens: Sequence[str] | None, scale_note: str = "") -> go.Figure:
    """token embedding ×√d  +  positional encoding  =  the input of layer 0, on one colour range."""
    tok, pos, out = arr(tok), arr(pos), arr(out)
    r = symmetric_range(tok, pos, out)
    y = token_labels(tokens, tok.shape[0])
    xs = list(range(tok.shape[1]))
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.04, subplot_titles=[
        t("token embedding") + scale_note, t("+ positional encoding"), t("= input to layer 0")])
    for c, (m, label) in enumerate([(tok, t("embedding")), (pos, "PE"), (out, t("sum"))], start=1):
        fig.add_trace(heatmap_trace(m, "values", xs, y, label, zrange=r, showscale=(c == 3),
                                    hover_x=t("dim"), hover_y=t("position")), 1, c)
    fig.update_yaxes(autorange="reversed", type="category", showticklabels=False)
    fig.update_yaxes(showticklabels=tok.shape[0] <= 60, row=1, col=1, **every_tick(y))
    fig.update_xaxes(title=t("dimension"))
    return _layout(fig, t("embedding + position"), _size(tok.shape[0], 300, 12, 700))


def pe_curves(pe, dims: Sequence[int]) -> go.Figure:
    """PE(pos, dim) against position for chosen dimensions: even dims are sines, odd cosines,
    the wavelength grows geometrically from 2π to 10000·2π across dimensions."""
    pe = arr(pe)
    d = pe.shape[1]
    fig = go.Figure()
    pos = np.arange(pe.shape[0])
    for j in dims:
        if not 0 <= j < d:
            continue
        fn = "sin" if j % 2 == 0 else "cos"
        wavelength = 2 * math.pi * 10000 ** ((j - j % 2) / d)
        label = t("dim {j}", j=j)
        fig.add_trace(go.Scatter(x=pos, y=pe[:, j], mode="lines", name=f"{label} ({fn}, λ≈{wavelength:.3g})",
                                 hovertemplate=f"{label}<br>pos %{{x}}<br>PE = %{{y:.4g}}<extra></extra>"))
    fig.update_xaxes(title=t("position"))
    fig.update_yaxes(title="PE(pos, dim)", range=[-1.1, 1.1])
    return _layout(fig, t("positional encoding curves"), 340, legend={"orientation": "h", "y": -0.25})


def pe_similarity(pe) -> go.Figure:
    """PE·PEᵀ: for sinusoidal PE, PE_pos·PE_pos+k = Σ cos(k ω_i) depends only on the offset k,
    so every diagonal is constant (relative-position structure)."""
    pe = arr(pe).astype(np.float64)
    sim = (pe @ pe.T).astype(np.float32)
    n = sim.shape[0]
    fig = go.Figure(go.Heatmap(z=sim, x=list(range(n)), y=list(range(n)), colorscale="Cividis",
                               hovertemplate="pos %{y} · pos %{x}<br>PE·PE = %{z:.4g}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title=t("position"))
    fig.update_xaxes(title=t("position"))
    return _layout(fig, t("PE · PEᵀ (dot product of position vectors)"), _size(n, 360, 6, 600))


# ---------------------------------------------------------------- learning-rate schedule


def noam_curve(steps: np.ndarray, d_model: int, warmup: int, factor: float = 1.0) -> np.ndarray:
    """Vectorised model.noam_lr: factor · d^-0.5 · min(step^-0.5, step · warmup^-1.5)."""
    s = np.asarray(steps, dtype=np.float64)
    return factor * d_model ** -0.5 * np.minimum(s ** -0.5, s * warmup ** -1.5)


def noam_figure(d_model: int, warmup: int, factor: float = 1.0, max_step: int | None = None,
                presets: Sequence[tuple[int, int]] = ((512, 4000), (512, 8000), (256, 4000)),
                log: Mapping | None = None, log_label: str | None = None,
                n_points: int = 600) -> go.Figure:
    """The Noam curve for the chosen (d_model, warmup, factor), the presets, the peak at step =
    warmup, and (optionally) the learning rate a checkpoint recorded while it trained."""
    max_step = max_step or max(20000, 4 * warmup)
    log_label = log_label or t("recorded while training")
    # Sample the chosen warmup exactly, so the drawn curve reaches the true peak.
    steps = np.union1d(np.linspace(1, max_step, n_points).round().astype(np.int64), [warmup])
    fig = go.Figure()
    for d, w in presets:
        fig.add_trace(go.Scatter(x=steps, y=noam_curve(steps, d, w).astype(np.float32), mode="lines",
                                 name=f"d={d}, warmup={w}", line={"dash": "dot", "width": 1.5},
                                 hovertemplate=f"d={d}, warmup={w}<br>step %{{x}}<br>lr "
                                               f"%{{y:.6g}}<extra></extra>"))
    fig.add_trace(go.Scatter(x=steps, y=noam_curve(steps, d_model, warmup, factor).astype(np.float32),
                             mode="lines", name=t("chosen: d={d}, warmup={w}, factor={f}", d=d_model, w=warmup,
                                                  f=f"{factor:g}"),
                             line={"width": 3},
                             hovertemplate=t("chosen<br>step %{x}<br>lr %{y:.6g}") + "<extra></extra>"))
    peak = float(noam_curve(np.array([warmup]), d_model, warmup, factor)[0])
    fig.add_trace(go.Scatter(x=[warmup], y=[peak], mode="markers", marker={"size": 10, "color": "#ff4b4b"},
                             name=t("peak"), hovertemplate=t("peak at step = warmup = %{x}<br>lr %{y:.6g}")
                             + "<extra></extra>"))
    fig.add_annotation(x=warmup, y=peak, text=t("peak: step = warmup = {w}<br>lr = {lr}", w=warmup, lr=f"{peak:.3g}"),
                       showarrow=True, arrowhead=2, ax=40, ay=-40)
    if log and log.get("step") and log.get("lr"):
        fig.add_trace(go.Scatter(x=np.asarray(log["step"]), y=np.asarray(log["lr"], dtype=np.float32),
                                 mode="lines", name=log_label, line={"color": "#2ca02c", "width": 2},
                                 hovertemplate=f"{log_label}<br>" + t("step %{x}<br>lr %{y:.6g}") + "<extra></extra>"))
    fig.update_xaxes(title=t("training step"))
    fig.update_yaxes(title=t("learning rate"))
    return _layout(fig, t("Noam schedule: lr = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)"), 460,
                   legend={"orientation": "h", "y": -0.2})


# ---------------------------------------------------------------- snapshots


def as_matrix(t, head: int = 0) -> np.ndarray:
    """A capture as a 2-D matrix for display: batch row 0, and one head of a 4-D capture."""
    a = arr(t)
    if a.ndim == 4:  # (B, H, L, X)
        a = a[0, min(head, a.shape[1] - 1)]
    elif a.ndim == 3:
        a = a[0]
    elif a.ndim == 1:
        a = a[None, :]
    elif a.ndim == 0:
        a = a.reshape(1, 1)
    return a


def diff_figure(reference, other, name: str, head: int = 0,
                labels: tuple[str, str] | None = None) -> go.Figure:
    """reference | other | other − reference for one capture (one head of a 4-D capture)."""
    labels = labels or (t("uploaded file"), t("current trace"))
    a, b = as_matrix(reference, head), as_matrix(other, head)
    d = b - a
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.05,
                        subplot_titles=[labels[0], labels[1], f"{labels[1]} − {labels[0]}"])
    r = symmetric_range(a, b)
    ya, xa = list(range(a.shape[0])), list(range(a.shape[1]))
    for c, (m, label) in enumerate([(a, labels[0]), (b, labels[1])], start=1):
        fig.add_trace(heatmap_trace(m, "values", xa, ya, label, zrange=r, showscale=False,
                                    hover_x=t("col"), hover_y=t("row")), 1, c)
    fig.add_trace(heatmap_trace(d, "diff", xa, ya, t("difference"), hover_x=t("col"), hover_y=t("row")), 1, 3)
    fig.update_yaxes(autorange="reversed")
    where = " · " + t("head {h}", h=head) if arr(reference).ndim == 4 else ""
    worst = float(np.nanmax(np.abs(d))) if d.size else 0.0
    title = name + where + t(": max |diff| = {value}", value=f"{worst:.3g}")
    return _layout(fig, title, _size(a.shape[0], 320, 4, 640))
