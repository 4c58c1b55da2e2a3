"""The lab's views in a notebook: a `Trace` in, a plotly figure out (`fig.show()` in Jupyter, VS Code,
Colab), and a standalone offline HTML file of several views with plotly.js inlined once.

    from model import load_model
    from viz import notebook as nb
    lm = load_model("smollm2")
    _, trace = lm.run_with_trace("When Mary and John went to the store, John gave a drink to")
    nb.head(trace, layer=17, head=3).show()
    nb.export_html([nb.head(trace, 17, 3), nb.model_view(trace)], "attention.html")

Modules are chosen by layer and kind, as the model describes itself (trace.meta["model"]): kind is
"encoder_self", "decoder_self" or "cross" (default: cross-attention when the model has it, else its
only self-attention), so the same call works for the toy Transformers, MiniLM and a language model.
No streamlit here; strings are in English unless `viz.i18n` is told otherwise.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from model.core.describe import attention_of, described
from viz.figures import attention as F
from viz.figures import modern as FM


def modules(trace: Mapping, kind: str | None = None) -> list[str]:
    """The attention modules of one kind in the trace, by layer (default kind: see the module doc)."""
    attention = described(getattr(trace, "meta", {})).get("attention", {})
    present = {m: info for m, info in attention.items() if f"{m}.weights" in trace}
    if not present:
        raise ValueError("this trace holds no attention weights: capture names='*.weights' (or all names)")
    kinds = [info["kind"] for info in present.values()]
    kind = kind or ("cross" if "cross" in kinds else kinds[-1])
    chosen = [m for m, info in present.items() if info["kind"] == kind]
    if not chosen:
        raise ValueError(f"this model has no {kind!r} attention; it has {sorted(set(kinds))}")
    return chosen


def module(trace: Mapping, layer: int, kind: str | None = None) -> str:
    mods = modules(trace, kind)
    if not 0 <= layer < len(mods):
        raise ValueError(f"layer {layer} is out of range: this stack has layers 0..{len(mods) - 1}")
    return mods[layer]


def head(trace: Mapping, layer: int, head: int, kind: str | None = None, scores: bool = False) -> go.Figure:
    """One head's softmax weights (or its scaled scores QKᵀ/√d_k), with the in-figure head buttons."""
    name = module(trace, layer, kind)
    return F.attention_heatmap(trace, name, _head(trace, name, head), "scores" if scores else "weights",
                               all_heads=True)


def heads(trace: Mapping, layer: int, kind: str | None = None) -> go.Figure:
    """Every head of one layer side by side."""
    return F.heads_grid(trace, module(trace, layer, kind))


def model_view(trace: Mapping, kind: str | None = None) -> go.Figure:
    """Every layer × head of one attention kind as thumbnails (BertViz's model view)."""
    return F.model_view(trace, modules(trace, kind))


def _head(trace: Mapping, name: str, head: int) -> int:
    """`head` checked against the module's query heads (a clear sentence, not an IndexError deep in numpy)."""
    H = F.kv_group(trace, name)[0]
    if not 0 <= head < H:
        raise ValueError(f"head {head} is out of range: {name} has query heads 0..{H - 1}")
    return head


def pipeline(trace: Mapping, layer: int, head: int, kind: str | None = None) -> go.Figure:
    """QKᵀ → ÷√d_k → + M → softmax for one head (needs the trace's .scores and .mask). A module that computes
    something else (its own query scale, a soft-cap, a sliding window, q/k norm, a learned sink) gets the pipeline
    as it describes itself, as on the Attention page."""
    name = module(trace, layer, kind)
    head = _head(trace, name, head)
    info = attention_of(getattr(trace, "meta", {}), name) or {}
    if FM.is_modern(info):
        w = trace[f"{name}.weights"]
        labels = F.axis_labels(getattr(trace, "meta", {}), name, w.shape[2], w.shape[3])
        return FM.described_pipeline(trace, name, head, info, labels=labels)
    return F.score_pipeline(trace, name, head)


def masks(trace: Mapping, layer: int, head: int, kind: str | None = None) -> go.Figure:
    """The padding / look-ahead / combined masks beside the weights they produce (on a sliding-window layer: the
    look-ahead mask, the window's and the one used, as on the Attention page)."""
    name = module(trace, layer, kind)
    head = _head(trace, name, head)
    info = attention_of(getattr(trace, "meta", {}), name) or {}
    if info.get("window") and f"{name}.mask" in trace:
        w = F.arr(trace[f"{name}.weights"])[0, head]
        return FM.window_mask_figure(FM.window_masks(trace, name, info), w, info["window"],
                                     F.axis_labels(getattr(trace, "meta", {}), name, *w.shape))
    return F.mask_figure(trace, name, head)


def qkvz(trace: Mapping, layer: int, head: int, kind: str | None = None) -> go.Figure:
    """One head's Q, K, V and z = softmax(QKᵀ/√d_k + M)·V. With grouped K/V heads, K and V are those of the K/V
    head this query head reads (head // (H / H_kv)), and the figure says which."""
    name = module(trace, layer, kind)
    return F.qkvz_figure(trace, name, _head(trace, name, head))


def export_html(figures: Sequence[go.Figure], path: str | Path | None = None, title: str = "Attention Lab") -> str:
    """One standalone HTML page holding `figures`, with plotly.js inlined once (it works offline, e.g.
    attached to a bug report). Returns the HTML; writes it to `path` when given."""
    divs = [pio.to_html(fig, full_html=False, include_plotlyjs=False) for fig in figures]
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
            + "".join(divs) + "</body></html>")
    if path is not None:
        Path(path).write_text(page, encoding="utf-8")
    return page


def flow_view(model, text=None, tau: float = 0.04, position: int | None = None, **kw) -> go.Figure:
    """The information-flow routes graph of one prediction (model.analysis.flow): `model` is a language model,
    MiniLM or a toy translator checkpoint (text: its prompt / sentence; position: default the next-token
    prediction), or an already prepared `flow.Subject`. Edges with contribution > tau that reach the
    prediction are drawn; `export_html([flow_view(...)], "routes.html")` saves it offline.

        nb.flow_view(load_model("smollm2"), "When Mary and John went to the store, John gave a drink to").show()
    """
    from model.analysis import flow
    from viz.figures import flow as FF

    s = model if isinstance(model, flow.Subject) else flow.prepare(model, text, position=position, **kw)
    routes = flow.routes(s)
    return FF.routes_figure(routes, routes.edges(tau), s.tokens,
                            title=f"Routes to “{s.target_token}” (τ = {tau})" if s.target_token else None)


def flow_compare(model, text=None, position: int | None = None, **kw) -> go.Figure:
    """Raw weights, norm-based attention, rollout and routes beside the causal effect, each with its Spearman ρ."""
    from model.analysis import flow
    from viz.figures import flow as FF

    s = model if isinstance(model, flow.Subject) else flow.prepare(model, text, position=position, **kw)
    return FF.methods_figure(flow.compare(s))


def learn_view(view: str = "curves", run=None, step: int | None = None, head: tuple[int, int] | None = None,
               score: str = "induction") -> go.Figure:
    """Watch attention learn (issue 33), the /learn page's figures from the recorded run (or `run`: the
    {"attn2": Run, "attn1": Run} of model.toy.learn.load_run(path) or of your own training):
    view="curves" (training and in-context loss, the phase change marked), "heads" (the 2-layer model's `score`
    over steps: "induction", "previous" or "prefix"), "map" (head (layer, head)'s attention on the repeated
    probe at `step`, default the phase change), "kcomp" (K-composition over steps).

        nb.learn_view("map", step=675).show()
    """
    import numpy as np

    from model.toy import learn as LR
    from viz.figures import learn as FL

    runs = run if run is not None else LR.load_run()
    two = runs["attn2"]
    sm = LR.summary(two, runs.get("attn1"))
    if view == "curves":
        return FL.curves_figure({k: {"label": k, "loss": r.loss, "steps": r.steps, "icl": r.series("icl")}
                                 for k, r in runs.items()}, sm.step, total_steps=two.steps[-1])
    if view == "heads":
        return FL.head_steps_figure(two.steps, np.stack([getattr(s, score) for s in two.scores]), score, sm.step)
    if view == "map":
        step = step if step is not None else (sm.step or two.steps[-1])
        if step not in two.steps:
            raise ValueError(f"step {step} is not a checkpoint; the checkpoints are {two.steps}")
        layer, h = head if head is not None else (sm.layer, sm.head)
        probe = LR.probe_ids(two.settings)[:1]
        _, trace = two.model_at(two.steps.index(step)).run_with_trace(probe, names="*.self_attn.weights")
        w = trace[f"decoder.layers.{layer}.self_attn.weights"][0, h].numpy()
        return FL.attention_step_figure(w, [str(x) for x in probe[0].tolist()], two.settings.n,
                                        f"Head {layer}.{h} at step {step}: attention on the repeated probe")
    if view == "kcomp":
        kc = np.stack([s.kcomp for s in two.scores])
        mask = np.ones(kc.shape[1:], dtype=bool)
        mask[sm.prev_head, sm.head] = False
        return FL.kcomp_figure(two.steps, kc[:, sm.prev_head, sm.head], kc[:, mask].mean(axis=1),
                               f"head 0.{sm.prev_head} → head 1.{sm.head}", sm.step)
    raise ValueError(f"view must be 'curves', 'heads', 'map' or 'kcomp', got {view!r}")
