"""Attention: every head of every layer, the score pipeline, the masks, Q/K/V, and why √d_k."""

import streamlit as st

from viz import common
from viz.attention_views import render_attention
from viz.i18n import t

st.title(t("Attention"))
st.caption(t("Scaled dot-product attention, Attention(Q, K, V) = softmax(QKᵀ/√d_k + M)·V, computed by every "
             "head of every layer. Choose the attention kind, layer and head; hover a cell for the exact "
             "weight and the two tokens."))
sel, trace = common.require_trace()
out = trace.meta.get("target", "")
line = (t("**Decoder input (teacher-forced target):** {out}", out=out) if sel.target
        else t("**Model output (greedy):** {out}", out=out or t("(empty)")))
render_attention(trace, key="attn", output=line, model_tokens=common.model_tokens(sel.ckpt, trace))
