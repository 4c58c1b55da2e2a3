"""Attention: every head of every layer, the score pipeline, the masks, Q/K/V, and why √d_k."""

import streamlit as st

from viz.i18n import t
from viz.ui.attention_views import render_attention
from viz.ui.long_views import long_trace, render_long_attention
from viz.ui.models import capabilities, is_real_model
from viz.ui.render import model_tokens, show_error
from viz.ui.sidebar import require_trace, selection
from viz.ui.text import text_problems

st.title(t("Attention"))
st.caption(t("Scaled dot-product attention, Attention(Q, K, V) = softmax(QKᵀ/√d_k + M)·V, computed by every "
             "head of every layer. Choose the attention kind, layer and head; hover a cell for the exact "
             "weight and the two tokens."))
sel = selection()
if sel is None:
    st.stop()
if is_real_model(sel) and "lm" in capabilities(sel.name):  # a long prompt: the lazy views (viz/ui/long_views.py)
    if problem := text_problems(sel.text):  # an empty prompt: said in the UI's language, before any encoding
        show_error(problem)
        st.stop()
    long = long_trace(sel, key="attn")
    if long is not None:
        render_long_attention(long, long.meta_item("tgt_tokens"), key="attn")  # (not .meta: a copy of it all)
        st.stop()
sel, trace = require_trace(sel, via_transformers=True)  # via transformers: the weights' views, a sentence for the rest
out = trace.meta.get("target", "")
if is_real_model(sel) and trace.meta.get("next_tokens"):  # a language model: its next token after the prompt
    line = t("**Next token (greedy):** {out}", out=trace.meta["next_tokens"][-1])
else:
    line = (t("**Decoder input (teacher-forced target):** {out}", out=out) if sel.target
            else t("**Model output (greedy):** {out}", out=out or t("(empty)")))
# the toy translator (and the lab's own LMs): "Why here?" on a cell; a model via transformers has no decomposition
# (the panel says so in one sentence)
render_attention(trace, key="attn", output=line, model_tokens=model_tokens(sel.ckpt, trace),
                 model=getattr(sel.ckpt, "obj", sel.ckpt))
