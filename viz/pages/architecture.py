"""Architecture map: the live model as a block diagram with tensor shapes; clicking a block opens its view.

Each block opens a page with the URL parameters that page reads: Attention (attn_kind, layer, head),
Inside a layer (stack, layer, sub, head), Tokens & embeddings, A batch with padding, Step-by-step decoder.
A decoder-only language model gets its own map, drawn from its description (viz.figures.arch.lm_blocks): its
RoPE block opens What changed since 2017, its final norm and unembedding the Language model page.
"""

from pathlib import Path

import streamlit as st

from viz.figures import arch as FA
from viz.i18n import t
from viz.ui.models import capabilities, is_real_model
from viz.ui.render import show_figure
from viz.ui.sidebar import model_label, require, require_own_family, require_trace, selection
from viz.ui.state import MAX_URL_TEXT, clamp_state, int_in, seed_from_query, write_query

PAGE_FILES = {"attention": "viz/pages/attention.py", "layer": "viz/pages/layer.py", "tokens": "viz/pages/tokens.py",
              "padding": "viz/pages/padding.py", "decoder": "viz/pages/decoder.py", "llm": "viz/pages/llm.py",
              "since2017": "viz/pages/since2017.py"}
ROOT = Path(__file__).resolve().parents[2]
# Widget keys of the target pages that seed from the URL once per session: dropped before opening the
# page, so the parameters of the click win over what the session remembered.
PAGE_KEYS = {"attention": ("attn_kind", "attn_layer", "attn_head"),
             "layer": ("ly_stack", "ly_layer", "ly_sub", "ly_head"), "tokens": ("tok_side",),
             "llm": ("llm_prompt", "llm_layer", "llm_head", "llm_view"), "since2017": ("s17_layer", "s17_head")}

st.title(t("Architecture map"))


def page_of(block) -> str:
    """The page a block opens: RoPE's own page (/since2017) when this app has it, else the Attention page."""
    page = block.page
    if page == "since2017" and not (ROOT / PAGE_FILES[page]).is_file():
        page = "attention"
    return page


def params_of(block, layer: int, head: int) -> dict[str, str]:
    """The URL parameters of the page a block opens; the Language model page also gets the layer, head and the
    sidebar's prompt (it keeps a prompt of its own)."""
    params = FA.block_params(block.id, layer, head)
    if block.page == "llm":
        sel = selection()
        params |= {"layer": str(layer), "head": str(head)}
        if sel is not None and len(sel.text) <= MAX_URL_TEXT:
            params["prompt"] = sel.text
    return params


def lm_map() -> None:
    """A decoder-only language model's map, from its own description and its trace on the sidebar's prompt."""
    sel, trace = require_trace()
    desc = trace.meta["model"]
    facts = FA.lm_facts(desc)
    st.caption(t("A decoder-only language model as it describes itself: the 2017 decoder stack without "
                 "cross-attention, pre-LN (the norm before each sublayer, the residual sum untouched), one final "
                 "norm, then the unembedding. Edges carry the tensor shapes of your prompt (B = batch, T = tokens); "
                 "one layer is drawn, the model stacks {n} of them. Click a block (its red dot) to open its view.",
                 n=facts["L"]))
    note = {"sandwich": t("This model wraps each sublayer in two norms (before and after it, a sandwich): the map "
                          "draws both."),
            "post": t("This model has no norm before its sublayers: one after each, inside the residual branch."),
            "parallel": t("This model runs attention and the feed-forward network side by side on the same input, "
                          "and one sum adds both to the stream (parallel residual).")}.get(facts["wiring"])
    extra = [t("a q/k norm before RoPE") if facts["qk_norm"] else "",
             t("a router that sends each token to {k} of {E} experts", k=facts["moe"]["top_k"],
               E=facts["moe"]["n_experts"]) if facts["moe"] else "",
             t("sliding-window layers ({types})", types=FA.layer_types(desc)) if FA.layer_types(desc) else ""]
    if any(extra):
        note = (note + " " if note else "") + t("Also drawn from its description: {what}.",
                                                what=t(", ").join(x for x in extra if x))
    if note:
        st.caption(note)
    B, T = trace["decoder.embed.out"].shape[:2]
    layer, head = choose(facts["L"], facts["H"])
    present = presentation()
    size = FA.LABEL_SIZE + 4 if present else FA.LABEL_SIZE
    fig = FA.lm_architecture_figure(desc, B, T, layer, size=size, title_name=model_label(sel.name))
    blocks = FA.lm_blocks(desc)
    event = show_figure(fig, key="arch_map", filename="architecture", on_select="rerun",
                               selection_mode="points")
    clicked = clicked_block(event)
    if clicked in FA.LM_BY_ID:
        open_block(FA.LM_BY_ID[clicked], layer, head)
    link_list([(b, FA.lm_list_label(b, desc, layer)) for b in blocks], layer, head)


def choose(n_layers: int, n_heads: int) -> tuple[int, int]:
    c1, c2 = st.columns(2)
    seed_from_query("arch_layer", "layer", 0, int, int_in(0, n_layers - 1))
    seed_from_query("arch_head", "head", 0, int, int_in(0, n_heads - 1))
    clamp_state("arch_layer", 0, n_layers - 1)
    clamp_state("arch_head", 0, n_heads - 1)
    layer = c1.selectbox(t("Layer a click opens"), range(n_layers), key="arch_layer")
    head = c2.selectbox(t("Head a click opens"), range(n_heads), key="arch_head")
    write_query(layer=layer, head=head)
    return layer, head


def presentation() -> bool:
    # Presentation mode (?present=1, as on the Lessons page): labels big enough for a projector.
    seed_from_query("arch_present", "present", False, lambda v: v in ("1", "true"), None)
    present = st.toggle(t("Presentation mode"), key="arch_present", help=t("For a projector: bigger labels."))
    write_query(present=1 if present else None)
    return present


def clicked_block(event) -> str | None:
    points = (event or {}).get("selection", {}).get("points", []) if event else []
    return next((p["customdata"][0] for p in points if p.get("customdata")), None)


def open_block(block, layer: int, head: int) -> None:
    page = page_of(block)
    for k in PAGE_KEYS.get(page, ()):
        st.session_state.pop(k, None)
    params = {**params_of(block, layer, head), "lang": st.query_params.get("lang", "en")}
    st.switch_page(PAGE_FILES[page], query_params=params)


def link_list(items, layer: int, head: int) -> None:
    """The blocks as page links under the map (a click on the map needs a steady hand)."""
    st.caption(t("Or open a block from this list (layer {layer}, head {head}):", layer=layer, head=head))
    # Streamlit cuts a page link's label to one line with an ellipsis: here labels wrap, so each reads whole.
    st.html("<style>.st-key-arch_links [data-testid='stPageLink'] * {white-space: normal !important; "
            "overflow: visible !important; text-overflow: clip !important; height: auto !important;}</style>")
    cols = st.container(key="arch_links").columns(3)
    for i, (block, label) in enumerate(items):
        cols[i % 3].page_link(PAGE_FILES[page_of(block)], label=label,
                              query_params=params_of(block, layer, head) or None, icon=":material/open_in_new:")


sel0 = require_own_family(selection())  # the map is drawn from the lab's own description: not via transformers
if sel0 is not None and is_real_model(sel0) and "lm" in capabilities(sel0.name):
    lm_map()
    st.stop()
st.caption(t("The Transformer of “Attention Is All You Need” as this model builds it: the encoder (left) reads the "
             "source, the decoder (right) reads [BOS] + target and, in every layer, looks at the encoder output "
             "through cross-attention. Edges carry the tensor shapes of your input (B = batch, S / T = source / "
             "target length). Click a block (its red dot) to open its view."))
require("cross_attention")  # the 2017 encoder-decoder map; a decoder-only or encoder-only model says so
sel, trace = require_trace()
cfg = trace.meta["config"]
S, T = trace["masks.src_pad"].shape[1], trace["masks.tgt_pad"].shape[1]

n_layers = max(cfg["n_encoder_layers"], cfg["n_decoder_layers"])
layer, head = choose(n_layers, cfg["n_heads"])
present = presentation()
size = FA.LABEL_SIZE + 4 if present else FA.LABEL_SIZE
event = show_figure(FA.architecture_figure(cfg, 1, S, T, size=size), key="arch_map", filename="architecture",
                           on_select="rerun", selection_mode="points")
clicked = clicked_block(event)
if clicked in FA.BY_ID:
    open_block(FA.BY_ID[clicked], layer, head)


def label_of(block) -> str:
    side = t("Encoder") if block.id.startswith(("enc", "src")) else t("Decoder") if block.id != "masks" else ""
    name = t(FA.LIST_LABELS.get(block.id, block.label))
    return t("{side}: {block}", side=side, block=name) if side else name


link_list([(b, label_of(b)) for b in FA.BLOCKS], layer, head)
