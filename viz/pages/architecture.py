"""Architecture map: the live model as a block diagram with tensor shapes; clicking a block opens its view.

Each block opens a page with the URL parameters that page reads: Attention (attn_kind, layer, head),
Inside a layer (stack, layer, sub, head), Tokens & embeddings, A batch with padding, Step-by-step decoder.
"""

import streamlit as st

from viz import common
from viz import figures_arch as FA
from viz.i18n import t

PAGE_FILES = {"attention": "viz/pages/attention.py", "layer": "viz/pages/layer.py", "tokens": "viz/pages/tokens.py",
              "padding": "viz/pages/padding.py", "decoder": "viz/pages/decoder.py"}
# Widget keys of the target pages that seed from the URL once per session: dropped before opening the
# page, so the parameters of the click win over what the session remembered.
PAGE_KEYS = {"attention": ("attn_kind", "attn_layer", "attn_head"),
             "layer": ("ly_stack", "ly_layer", "ly_sub", "ly_head"), "tokens": ("tok_side",)}

st.title(t("Architecture map"))
st.caption(t("The Transformer of “Attention Is All You Need” as this model builds it: the encoder (left) reads the "
             "source, the decoder (right) reads [BOS] + target and, in every layer, looks at the encoder output "
             "through cross-attention. Edges carry the tensor shapes of your input (B = batch, S / T = source / "
             "target length). Click a block (its red dot) to open its view."))
common.require("cross_attention")  # the 2017 encoder-decoder map; a decoder-only or encoder-only model says so
sel, trace = common.require_trace()
cfg = trace.meta["config"]
S, T = trace["masks.src_pad"].shape[1], trace["masks.tgt_pad"].shape[1]

c1, c2 = st.columns(2)
n_layers = max(cfg["n_encoder_layers"], cfg["n_decoder_layers"])
common.seed_from_query("arch_layer", "layer", 0, int, common.int_in(0, n_layers - 1))
common.seed_from_query("arch_head", "head", 0, int, common.int_in(0, cfg["n_heads"] - 1))
common.clamp_state("arch_layer", 0, n_layers - 1)
common.clamp_state("arch_head", 0, cfg["n_heads"] - 1)
layer = c1.selectbox(t("Layer a click opens"), range(n_layers), key="arch_layer")
head = c2.selectbox(t("Head a click opens"), range(cfg["n_heads"]), key="arch_head")
common.write_query(layer=layer, head=head)


def open_block(block_id: str) -> None:
    block = FA.BY_ID[block_id]
    for k in PAGE_KEYS.get(block.page, ()):
        st.session_state.pop(k, None)
    params = {**FA.block_params(block_id, layer, head), "lang": st.query_params.get("lang", "en")}
    st.switch_page(PAGE_FILES[block.page], query_params=params)


# Presentation mode (?present=1, as on the Lessons page): labels big enough for a projector.
common.seed_from_query("arch_present", "present", False, lambda v: v in ("1", "true"), None)
present = st.toggle(t("Presentation mode"), key="arch_present", help=t("For a projector: bigger labels."))
common.write_query(present=1 if present else None)
size = FA.LABEL_SIZE + 4 if present else FA.LABEL_SIZE
event = common.show_figure(FA.architecture_figure(cfg, 1, S, T, size=size), key="arch_map", filename="architecture",
                           on_select="rerun", selection_mode="points")
points = (event or {}).get("selection", {}).get("points", []) if event else []
clicked = next((p["customdata"][0] for p in points if p.get("customdata")), None)
if clicked in FA.BY_ID:
    open_block(clicked)

st.caption(t("Or open a block from this list (layer {layer}, head {head}):", layer=layer, head=head))
# Streamlit cuts a page link's label to one line with an ellipsis: here labels wrap, so each reads whole.
st.html("<style>.st-key-arch_links [data-testid='stPageLink'] * {white-space: normal !important; "
        "overflow: visible !important; text-overflow: clip !important; height: auto !important;}</style>")
cols = st.container(key="arch_links").columns(3)
for i, block in enumerate(FA.BLOCKS):
    params = FA.block_params(block.id, layer, head)
    side = t("Encoder") if block.id.startswith(("enc", "src")) else t("Decoder") if block.id != "masks" else ""
    name = t(FA.LIST_LABELS.get(block.id, block.label))
    label = t("{side}: {block}", side=side, block=name) if side else name
    cols[i % 3].page_link(PAGE_FILES[block.page], label=label,
                          query_params=params or None,
                          icon=":material/open_in_new:")
