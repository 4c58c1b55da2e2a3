"""/vision: attention over an image (issue 40 §3). The lab's own vision transformer (model/families/vit.py, trained
on the synthetic shapes of model/toy/shapes.py) reads an image as a sequence of patches: [CLS], the register tokens
(if any), then the patches row-major. The page draws what it computed on one image:

- the image with its patch grid, and the prediction with every class's probability;
- per layer and head (or the heads' mean), the attention of [CLS] or of a clicked patch over the image, every head of
  that layer beside it, and the attention rollout (Abnar & Zuidema 2020) beside the raw weights;
- mean attention distance per head and layer (the ViT paper's Figure 7), recomputed from this image's trace;
- the position embeddings' similarity grid (Figure 7's centre panel);
- on a sample of the synthetic set, the share of [CLS] attention on the patches that decide the answer, per head,
  against the share of the image those patches cover;
- what knocking out the chosen head does to the prediction.

The image: a sample of the synthetic set by seed, an uploaded file, or a drawing (streamlit-drawable-canvas). URL:
`?img=sample|upload|draw&seed=N&layer=L&head=H|mean&q=cls|R,C&ablate=1`. The trace of an image is computed once
and cached for every session (`_view`), so a layer, head or query switch only slices it; the controls and the views
that depend on them are a fragment (`explore`), so a switch reruns only them, not the app's sidebar.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass

import numpy as np
import streamlit as st

from viz.figures import arch as FA
from viz.figures import vision as FV
from viz.i18n import N_, current_lang, option_labels, t
from viz.ui.figure_cache import cached_figure
from viz.ui.plotly_clicks import plotly_click_component
from viz.ui.render import show_error, show_figure
from viz.ui.state import clamp_state, int_in, seed_from_query, write_query

MODEL = "shapes"  # the shipped ViT (model.families.vit.load_vit)
SOURCES = {"sample": N_("a sample of the synthetic set"), "upload": N_("upload an image"),
           "draw": N_("draw one")}
MAX_SEED = 1_000_000
MAX_UPLOAD_MB = 10  # a larger file is refused with a sentence before it is decoded
MAX_UPLOAD_PIXELS = 25_000_000  # and an image that would decode to more pixels than this (a decompression bomb)
CANVAS_PX = 256  # the drawing canvas, resized to the model's input
CLASS_WORDS = {"red": N_("red"), "green": N_("green"), "blue": N_("blue"), "yellow": N_("yellow")}  # the shapes
# set's class names (model.toy.shapes.CLASS_NAMES), translated where they are shown
CANVAS_TOOLS = {"rect": N_("square"), "circle": N_("disk"), "freedraw": N_("free hand")}
MEAN = "mean"
OTHER_PAGES = N_("The Attention page, the Q/K map, Experiments' head ablation, /flow and Snapshots read the text "
                 "models' traces and do not open this vision transformer yet; this page asks their questions of it: "
                 "every head, a head knocked out and what the answer does, and attention against the effect of "
                 "blanking a patch.")


class ImageProblem(ValueError):
    """An image the page cannot use, said in the UI's words."""


@dataclass
class View:
    """What one image costs once: the trace and everything computed from it that does not depend on the head."""

    key: str
    image: np.ndarray  # (3, S, S) in [0, 1]: what the model read
    trace: object
    probs: np.ndarray  # (C,)
    rollout: np.ndarray  # (L, T, T)
    distance: np.ndarray  # (L, H) pixels
    decide: np.ndarray | None  # (rows, cols) bool: a synthetic sample's deciding patches
    label: int | None  # a synthetic sample's true class
    blank: np.ndarray  # (rows, cols): the drop in the answer's probability when that patch is blanked


# ---------------------------------------------------------------- model, images and their traces


@st.cache_resource(show_spinner=False)
def vit():
    from model.families.vit import load_vit

    return load_vit(MODEL)


def _meta(model) -> dict:
    return dict(getattr(model, "meta", None) or {})


def image_size(model) -> int:
    return int(model.cfg.image_size)


def read_image(data: bytes) -> np.ndarray:
    """An uploaded file's bytes -> (H, W, 3) floats in [0, 1], or ImageProblem with the sentence to show."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > MAX_UPLOAD_MB * 1024 * 1024:
        raise ImageProblem(t("The file is {mb:.1f} MB: this page takes images up to {max} MB. A small image (a few "
                             "hundred pixels a side) is plenty: the model reads {s} × {s} pixels.",
                             mb=len(data) / 2**20, max=MAX_UPLOAD_MB, s=image_size(vit())))
    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            if w * h > MAX_UPLOAD_PIXELS:
                raise ImageProblem(t("The image is {w} × {h} pixels: this page takes at most {m} million pixels. "
                                     "Shrink it first: the model reads {s} × {s} pixels.", w=w, h=h,
                                     m=MAX_UPLOAD_PIXELS // 1_000_000, s=image_size(vit())))
            rgb = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
    except ImageProblem:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError, SyntaxError) as e:
        # the reader's exception name is no word of the UI's: the sentence says what to do instead
        raise ImageProblem(t("This file is not an image the page can read: it may be damaged, or in another format. "
                             "Save it as PNG, JPEG, GIF, BMP or WebP and upload it again.")) from e
    return rgb


def to_input(model, rgb: np.ndarray):
    """(H, W, 3) in [0, 1] -> the model's (1, 3, S, S) input, or ImageProblem with the sentence to show."""
    from model.families.vit import image_to_input

    try:
        return image_to_input(rgb, image_size(model))
    except ValueError as e:  # the model's sentence is English and names array shapes: say it in the UI's words
        raise ImageProblem(t("The model cannot read this picture: it needs at least one pixel, in colour or grey. "
                             "Draw something, or upload another image.")) from e


@st.cache_resource(show_spinner=False, max_entries=64)
def _view(key: str, _x, decide: np.ndarray | None = None, label: int | None = None) -> View:
    """The trace of one image and its head-independent analyses (keyed by `key`: the sample's seed or the image's
    digest), shared by every session."""
    import torch

    from model.analysis import vision as AV

    model = vit()
    with torch.no_grad():
        logits, trace = model.run_with_trace(_x, names="*.weights")
    probs = torch.softmax(logits[0].double(), -1).numpy()
    image = np.asarray(_x[0].detach().cpu(), dtype=np.float64)
    return View(key, image, trace, probs, np.asarray(AV.attention_rollout(trace)),
                np.asarray(AV.mean_attention_distance(trace)), decide, label,
                np.asarray(AV.blank_patch_effect(model, _x.float())))


@st.cache_resource(show_spinner=False, max_entries=256)
def sample_view(seed: int) -> View:
    import torch

    from model.toy.shapes import make_batch

    model = vit()
    images, labels, decide = make_batch(1, seed, image_size=image_size(model), patch_size=model.cfg.patch_size)
    return _view(f"sample:{seed}", torch.from_numpy(images), np.asarray(decide[0], dtype=bool), int(labels[0]))


def image_view(model, rgb: np.ndarray) -> View:
    x = to_input(model, rgb)
    digest = hashlib.sha1(np.ascontiguousarray(np.asarray(x, dtype=np.float32)).tobytes()).hexdigest()[:16]
    return _view(f"image:{digest}", x)


@st.cache_resource(show_spinner=False)
def position_similarity() -> np.ndarray:
    from model.analysis import vision as AV

    return np.asarray(AV.position_similarity(vit()))


def deciding(view: View) -> dict | None:
    """The per-head share of [CLS] attention on the deciding patches (model.analysis.vision.deciding_share)."""
    if view.decide is None:
        return None
    from model.analysis import vision as AV

    return AV.deciding_share(view.trace, view.decide[None])


def ablated_probs(view: View, layer: int, head: int) -> np.ndarray:
    """The class probabilities with head `head` of layer `layer` knocked out: its output z set to 0 (the lab's
    interventions.ablate_head, as Experiments' head ablation does on the text models)."""
    import torch

    from model import interventions as iv

    x = torch.as_tensor(view.image, dtype=torch.float32)[None]
    with torch.no_grad():
        logits = vit().run_with_hooks(x, hooks=iv.ablate_head(f"encoder.layers.{layer}.self_attn", head))
    return torch.softmax(logits[0].double(), -1).numpy()


# ---------------------------------------------------------------- controls


def image_source(model) -> View | None:
    seed_from_query("vis_img", "img", "sample", valid=SOURCES.__contains__)
    src = st.segmented_control(t("Image"), list(SOURCES), key="vis_img", required=True,
                               format_func=option_labels(SOURCES, lambda s: t(SOURCES[s])))
    write_query(img=src)
    if src == "sample":
        seed_from_query("vis_seed", "seed", 0, int, int_in(0, MAX_SEED))
        seed = st.number_input(t("Sample (seed)"), 0, MAX_SEED, step=1, key="vis_seed",
                               help=t("Each seed draws one image of the synthetic shapes set, with its label and "
                                      "the patches that decide it."))
        write_query(seed=seed)
        return sample_view(int(seed))
    write_query(seed=None)
    if src == "upload":
        up = st.file_uploader(t("An image file (PNG, JPEG, GIF, BMP or WebP, up to {mb} MB)", mb=MAX_UPLOAD_MB),
                              type=["png", "jpg", "jpeg", "gif", "bmp", "webp"], key="vis_upload")
        if up is None:
            st.info(t("Upload an image: it is resized to the model's {s} × {s} pixels.", s=image_size(model)),
                    icon="🖼️")
            return None
        try:
            return image_view(model, read_image(up.getvalue()))
        except ImageProblem as e:
            show_error(str(e))
            return None
    return drawn_view(model)


def canvas_colours() -> dict[str, str]:
    """hex -> class name: the shapes set's own colours (model.toy.shapes.COLOURS), so a drawing uses what the model
    was trained on."""
    from model.toy.shapes import CLASS_NAMES, COLOURS

    return {"#" + "".join(f"{int(round(float(v) * 255)):02x}" for v in rgb): name
            for rgb, name in zip(COLOURS, CLASS_NAMES, strict=True)}


@st.cache_resource(show_spinner=False)
def canvas_grid(px: int, rows: int, cols: int):
    """The canvas' background: black (the set's background) with the patch grid, so a shape can be drawn inside
    one patch as in training. A background image is not part of what the canvas returns."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (px, px), (0, 0, 0))
    draw = ImageDraw.Draw(im)
    for i in range(1, cols):
        draw.line([(i * px // cols, 0), (i * px // cols, px)], fill=(70, 70, 70), width=1)
    for i in range(1, rows):
        draw.line([(0, i * px // rows), (px, i * px // rows)], fill=(70, 70, 70), width=1)
    return im


def drawn_view(model) -> View | None:
    try:
        from streamlit_drawable_canvas import st_canvas
    except ImportError:
        st.info(t("Drawing needs the streamlit-drawable-canvas package (`pip install streamlit-drawable-canvas`); "
                  "upload an image instead."), icon="📦")
        return None
    colours = canvas_colours()
    c1, c2 = st.columns(2)
    color = c1.selectbox(t("Colour"), list(colours), key="vis_color",
                         format_func=option_labels(colours, lambda c: class_label(colours[c])))
    tool = c2.selectbox(t("Tool"), list(CANVAS_TOOLS), key="vis_tool",
                        format_func=option_labels(CANVAS_TOOLS, lambda c: t(CANVAS_TOOLS[c])))
    rows, cols = model.cfg.grid
    st.caption(t("Draw a square inside one cell of the grid, and other shapes in other cells; the drawing is "
                 "resized to the model's {s} × {s} pixels.", s=image_size(model)))
    res = st_canvas(fill_color=color, stroke_color=color, stroke_width=12, background_image=canvas_grid(
        CANVAS_PX, rows, cols), drawing_mode=tool, height=CANVAS_PX, width=CANVAS_PX, return_image_data=True,
        key="vis_canvas")
    try:
        data = res.image_data if res is not None else None
    except Exception:  # the canvas has not sent a drawing yet (its first run)
        data = None
    if data is None or not np.asarray(data)[..., 3].any():
        st.info(t("The canvas is empty: draw something."), icon="✏️")
        return None
    rgba = np.asarray(data, dtype=np.float32) / 255.0
    rgb = rgba[..., :3] * rgba[..., 3:]  # over black, the set's background, where nothing was drawn
    try:
        return image_view(model, rgb)
    except ImageProblem as e:
        show_error(str(e))
        return None


def parse_query(raw: str, rows: int, cols: int) -> tuple[int, int] | None:
    """`q=R,C` -> (R, C) inside the grid; `cls` (or anything else) -> None: the [CLS] token."""
    try:
        r, c = (int(v) for v in str(raw).split(","))
    except (TypeError, ValueError):
        return None
    return (r, c) if 0 <= r < rows and 0 <= c < cols else None


# A click on a cell of the attention map picks that patch as the query (customdata [col, row]). Draws nothing.
_patch_clicks = plotly_click_component("attention_lab.vision_patch_clicks", """\
    const cd = ev && ev.points && ev.points[0] && ev.points[0].customdata;
    if (cd && cd.length === 2) setTriggerValue("cell", [Number(cd[0]), Number(cd[1])]);""")


def _on_patch_click() -> None:
    cell = getattr(st.session_state.get("vis_patch_clicks"), "cell", None)
    if isinstance(cell, list) and len(cell) == 2 and all(isinstance(v, int) for v in cell):
        st.session_state["vis_q"] = f"{cell[1]},{cell[0]}"


# ---------------------------------------------------------------- the page


def prediction(view: View, names: list[str]) -> None:
    best = int(np.argmax(view.probs))
    text = t("The model says **{name}** with probability {p}.", name=class_label(names[best]),
             p=f"{view.probs[best]:.1%}")
    if view.label is not None:
        text += ("" if current_lang() == "zh" else " ") + (t("That is the sample's label.") if best == view.label else
                       t("The sample's label is **{name}**.", name=class_label(names[view.label])))
    st.markdown(text)
    show_figure(FV.prediction_figure(view.probs, [class_label(n) for n in names], view.label), key="vis_pred")


def class_label(name: str) -> str:
    return t(CLASS_WORDS[name]) if name in CLASS_WORDS else name


def main() -> None:
    st.title(t("Attention over an image"))
    st.caption(t("A vision transformer cuts the image into square patches and reads them as a sequence of tokens, "
                 "with a [CLS] token in front whose last state decides the class (Dosovitskiy et al. 2021). This "
                 "one was trained in the lab on synthetic shapes, where the patches that decide the answer are "
                 "known."))
    try:
        with st.spinner(t("Loading the vision transformer…")):
            model = vit()
    except (OSError, ValueError, KeyError, ImportError) as e:
        show_error(t("The vision transformer cannot be loaded: {error}", error=e))
        return
    left, right = st.columns([2, 3])
    with left:
        view = image_source(model)
    if view is None:
        return
    meta = view.trace.meta
    rows, cols = (int(v) for v in meta["grid"])
    p = int(meta["patch_size"])
    names = list(meta.get("class_names") or _meta(model).get("class_names") or [])
    L, H = view.distance.shape
    with right:
        prediction(view, names)
    with left:
        show_figure(FV.image_figure(view.image, (rows, cols), p, height=300), key="vis_image")
    explore(view, names)

    st.subheader(t("Local and global heads"))
    show_figure(cached_figure(view.trace, _distance_fig, view.key, shared=True, distance=view.distance,
                              size=int(meta["image_size"])), key="vis_distance")
    st.caption(t("Each point is one head: the mean distance, in pixels, between a query patch and the patches it "
                 "attends to, weighted by the attention (over every patch query of this image; the ViT paper's "
                 "Figure 7 averages many images). From layer 0 to layer {last}, each layer's range: {ranges}.",
                 last=L - 1, ranges=" · ".join(f"{d.min():.1f}–{d.max():.1f} px" for d in view.distance)))
    share = deciding(view)
    if share is not None:
        st.subheader(t("Does [CLS] look at the patches that decide the answer?"))
        s = np.asarray(share["share"], dtype=np.float64)
        covered = float(share["coverage"])
        show_figure(FV.deciding_share_figure(s, covered), key="vis_decide")
        best = np.unravel_index(int(np.argmax(s)), s.shape)
        st.caption(t("The deciding patches cover {c} of the image; layer {l} head {h} puts the most of [CLS]'s "
                     "attention there: {v} ({x:.1f} times what attending evenly would give).", c=f"{covered:.1%}",
                     l=int(best[0]), h=int(best[1]), v=f"{s[best]:.1%}", x=float(s[best]) / max(covered, 1e-12)))

    st.subheader(t("Positions"))
    show_figure(_position_fig(), key="vis_positions")
    near, far = neighbour_similarity(position_similarity())
    if model.cfg.positional == "learned":
        st.caption(t("The model learned one embedding per patch position, from a list with no notion of rows or "
                     "columns; each tile is one position's cosine similarity with every other. Where nearby "
                     "positions come out similar, and rows and columns show, training found the 2-D layout. Here "
                     "side-by-side patches have a mean cosine of {near}, all other pairs {far}.",
                     near=f"{near:+.2f}", far=f"{far:+.2f}"))
    else:
        st.caption(t("This model's positions are fixed 2-D sines and cosines (half the dimensions code the row, "
                     "half the column); each tile is one position's cosine similarity with every other."))
    with st.expander(t("How this vision transformer is built"), icon=":material/account_tree:"):
        show_figure(FA.vit_architecture_figure(meta["config"]), key="vis_arch")
        card = _meta(model)
        if isinstance(card.get("accuracy"), int | float):
            st.caption(t("Held-out accuracy on fresh samples the training never drew: {a}.",
                         a=f"{card['accuracy']:.1%}")
                       + (" " + t("Trained with `{cmd}`.", cmd=card["command"]) if card.get("command") else ""))
    st.info(t(OTHER_PAGES), icon="ℹ️")




@st.fragment
def explore(view: View, names: list[str]) -> None:
    """The layer, head and query controls and every view that depends on them: a fragment, so a switch reruns
    only this part (not the app's sidebar nor the head-independent figures below)."""
    meta = view.trace.meta
    rows, cols = (int(v) for v in meta["grid"])
    p, n_prefix = int(meta["patch_size"]), int(meta["n_prefix"])
    L, H = view.distance.shape
    c1, c2, c3, c4 = st.columns([3, 4, 3, 2])
    seed_from_query("vis_layer", "layer", L - 1, int, int_in(0, L - 1))
    clamp_state("vis_layer", 0, L - 1, "layer")
    layer = c1.segmented_control(t("Layer"), list(range(L)), key="vis_layer", required=True)
    heads = [*range(H), MEAN]
    seed_from_query("vis_head", "head", MEAN, lambda v: v if v == MEAN else int(v), heads.__contains__)
    head = c2.segmented_control(t("Head"), heads, key="vis_head", required=True,
                                format_func=option_labels(heads, lambda h: t("mean") if h == MEAN else str(h)))
    seed_from_query("vis_q", "q", "cls", str, lambda v: v == "cls" or parse_query(v, rows, cols) is not None)
    patches = ["cls"] + [f"{r},{c}" for r in range(rows) for c in range(cols)]
    q = c3.selectbox(t("Query"), patches, key="vis_q",
                     format_func=option_labels(patches, lambda v: "[CLS]" if v == "cls"
                                               else t("patch (row {r}, col {c})", r=v.split(",")[0],
                                                      c=v.split(",")[1])),
                     help=t("Whose attention is drawn: the [CLS] token's, or a patch's. Click a patch on the map "
                            "to pick it."))
    seed_from_query("vis_ablate", "ablate", False, lambda v: v == "1", lambda v: isinstance(v, bool))
    ablate = c4.toggle(t("Knock out this head"), key="vis_ablate", disabled=head == MEAN,
                       help=t("Run the model again with this head's output set to zero, and compare the answer."))
    write_query(layer=layer, head=head, q=q, ablate=1 if ablate and head != MEAN else None)
    picked = parse_query(q, rows, cols)
    qi = 0 if picked is None else n_prefix + picked[0] * cols + picked[1]
    who = "[CLS]" if picked is None else t("patch (row {r}, col {c})", r=picked[0], c=picked[1])

    w = view.trace[f"encoder.layers.{layer}.self_attn.weights"]
    w = np.asarray(w[0].detach().cpu() if hasattr(w, "detach") else w[0], dtype=np.float64)  # (H, T, T)
    row = w.mean(0)[qi] if head == MEAN else w[head, qi]
    z, prefix = FV.patch_map(row, n_prefix, (rows, cols))
    which = t("heads' mean") if head == MEAN else t("head {h}", h=head)
    roll, _ = FV.patch_map(view.rollout[layer, qi], n_prefix, (rows, cols))

    st.subheader(t("Where {who} looks", who=who))
    fig = FV.rollout_beside_raw(view.image, z, roll, p,
                                t("raw weights: layer {l}, {which}", l=layer, which=which),
                                t("rollout through layers 0–{l}", l=layer),
                                t("Attention of {who} over the image", who=who), picked)
    show_figure(fig, key="vis_map", filename=f"vit-{view.key}-L{layer}")
    _patch_clicks(key="vis_patch_clicks", data={"figure": "vis_map"}, height=0, on_cell_change=_on_patch_click)
    top = np.unravel_index(int(np.argmax(z)), z.shape)
    st.caption(t("Layer {l}, {which}: {who} gives {share} of its attention to the patches (the most, {top}, to "
                 "patch (row {r}, col {c})) and {prefix} to {rest}. The rollout multiplies the layers' head-averaged "
                 "weights, each with the residual added (0.5·A + 0.5·I): where information from each patch can "
                 "have reached {who} by layer {l}. Click a patch to draw its attention.",
                 l=layer, which=which, who=who, share=f"{z.sum():.1%}", top=f"{z.max():.1%}", r=int(top[0]),
                 c=int(top[1]), prefix=f"{prefix:.1%}",
                 rest=t("[CLS] and the registers") if n_prefix > 1 else "[CLS]"))
    maps = np.stack([FV.patch_map(w[h, qi], n_prefix, (rows, cols))[0] for h in range(H)])
    show_figure(FV.heads_over_image(view.image, maps, p, t("Every head of layer {l}, {who} as the query", l=layer,
                                                                                                      who=who),
                                    picked, None if head == MEAN else head), key="vis_heads")
    if ablate and head != MEAN:
        knocked = ablated_probs(view, layer, int(head))
        a, b = int(np.argmax(view.probs)), int(np.argmax(knocked))
        st.markdown(t("With layer {l} head {h} knocked out the model says **{name}** ({p}); with it, **{was}** "
                      "({q}). The probability of {was} moves from {q} to {p2}.", l=layer, h=head,
                      name=class_label(names[b]), p=f"{knocked[b]:.1%}", was=class_label(names[a]),
                      q=f"{view.probs[a]:.1%}", p2=f"{knocked[a]:.1%}"))

    blank_section(view, layer, n_prefix, rows, cols, p, names)


def blank_section(view: View, layer: int, n_prefix: int, rows: int, cols: int, p: int, names) -> None:
    """The causal effect of blanking each patch beside what attention says ([CLS]'s raw weights and rollout at
    this layer), with Spearman's ρ over the patches: /flow's question, asked of an image."""
    from model.analysis.attribution import spearman

    st.subheader(t("Which patches the answer needs"))
    best = int(np.argmax(view.probs))
    show_figure(FV.blank_effect_figure(view.image, view.blank, p, t(
        "Blanking each patch: the drop in p({name})", name=class_label(names[best]))), key="vis_blank")
    raw, _ = FV.patch_map(view.trace[f"encoder.layers.{layer}.self_attn.weights"][0].double().mean(0)[0].numpy(),
                          n_prefix, (rows, cols))
    roll, _ = FV.patch_map(view.rollout[layer, 0], n_prefix, (rows, cols))
    r = int(np.argmax(view.blank))
    p0 = float(view.probs[best])
    st.caption(t("Each patch set to the background (black), one at a time, and the model run again: blanking patch "
                 "(row {r}, col {c}) lowers p({name}) the most, from {p0} to {p1}. Spearman's ρ over the {n} patches "
                 "between this effect and [CLS]'s attention at layer {l}: raw weights (heads' mean) {a}, rollout {b}.",
                 r=r // cols, c=r % cols, p0=f"{p0:.1%}", p1=f"{p0 - float(view.blank.ravel()[r]):.1%}",
                 name=class_label(names[best]),
                 n=rows * cols, l=layer, a=_rho(spearman(raw.ravel(), view.blank.ravel())),
                 b=_rho(spearman(roll.ravel(), view.blank.ravel()))))


def _rho(v: float) -> str:
    return f"{v:+.2f}" if np.isfinite(v) else t("undefined (one side is constant)")


def neighbour_similarity(sim: np.ndarray) -> tuple[float, float]:
    """Mean cosine similarity of the position embeddings of side-by-side patches (4-neighbours), and of all other
    pairs of distinct patches. sim: (P, rows, cols) from model.analysis.vision.position_similarity."""
    P, rows, cols = sim.shape
    s = sim.reshape(P, P)
    r, c = np.divmod(np.arange(P), cols)
    d = np.abs(r[:, None] - r[None]) + np.abs(c[:, None] - c[None])
    return float(s[d == 1].mean()), float(s[d > 1].mean())


def _distance_fig(trace, key, distance=None, size=None):
    return FV.distance_figure(distance, size)


def _position_fig():
    return FV.position_similarity_figure(position_similarity())


main()
