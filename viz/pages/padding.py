"""A batch with padding: sentences of different lengths in one forward pass, the padding masks, the
decoder's combined mask, and a loss that ignores [PAD] (next to seed 001's wrong average)."""

import numpy as np
import streamlit as st

from model.toy.checkpoint import list_checkpoints
from model.toy.padding import MAX_SENTENCES, batch_trace
from model.toy.tasks import TASKS
from viz.figures import padding as FP
from viz.i18n import t
from viz.ui.models import load_ckpt
from viz.ui.render import show_error, show_figure
from viz.ui.sidebar import require
from viz.ui.state import long_text_note, seed_from_query, write_query

SEP = "=>"

st.title(t("A batch with padding"))
st.caption(t("Training feeds many sentences at once. They have different lengths, so the shorter ones are padded "
             "with [PAD] (id 0) to the longest; masks keep attention away from the [PAD] keys and the loss ignores "
             "[PAD] labels. Here {n} sentences go through the sidebar's model as one batch.", n="2–4"))
sel = require("toy")  # a batch of the toy task's sentences
if sel is None:
    st.stop()


def default_pairs(name: str) -> list[tuple[str, str]]:
    """Three test pairs of the model's task, of distinct target (else source) lengths, so rows get padded."""
    ckpt = load_ckpt(name)
    task = TASKS.get(ckpt.meta.get("task", ""))
    if task is None:
        return [(ckpt.example, ckpt.translate(ckpt.example).text)] * 2
    by_len: dict[tuple[int, int], tuple[str, str]] = {}
    for s, tgt in task.sample(40, seed=0, split="test"):
        by_len.setdefault((len(ckpt.tgt_tokenizer.encode(tgt)), len(s)), (s, tgt))
    keys = sorted(by_len)
    return [by_len[k] for k in keys[:: max(1, len(keys) // 3)]][:3]


def pads_labels(name: str) -> bool:
    """Whether the model's default batch has targets of different lengths (dates always emits YYYY-MM-DD)."""
    tok = load_ckpt(name).tgt_tokenizer
    return len({len(tok.encode(tgt)) for _, tgt in default_pairs(name)}) > 1


# The batch runs through the sidebar's model, unless its targets all have one length (then no label is
# [PAD] and the loss lesson would show nothing): then through the first shipped model whose targets vary.
names = list_checkpoints()
fallback = next((n for n in names if pads_labels(n)), sel.name)
default = sel.name if sel.name not in names or pads_labels(sel.name) else fallback
options = [default] + [n for n in names if n != default]
# The link's batch model and sentences (pad_model, pad_lines) apply when a session opens the link, not after the
# sidebar's model changed (then the batch follows the sidebar, as before).
followed = st.session_state.get("_pad_default") in (None, default)
st.session_state["_pad_default"] = default
seed_from_query(f"pad_model_{default}", "pad_model" if followed else "", default, valid=lambda v: v in options)
name = st.selectbox(t("Model for this batch"), options, key=f"pad_model_{default}",
                    help=t("The sidebar's model, unless all its targets have one length (the dates task always "
                           "outputs YYYY-MM-DD, so no label would be [PAD])."))
if default != sel.name:
    st.caption(t("All targets of {sidebar} have one length, so no label would be [PAD]: this batch opens on {name}.",
                 sidebar=sel.name, name=default))
ckpt = load_ckpt(name)


def default_lines() -> str:
    return "\n".join(f"{s} {SEP} {tgt}" for s, tgt in default_pairs(name))


def parse(text: str) -> list[tuple[str, str | None]]:
    out = []
    for line in text.splitlines():
        if line.strip():
            src, _, tgt = line.partition(SEP)
            out.append((src.strip(), tgt.strip() or None))
    return out


key = f"pad_lines_{name}"  # one batch per model: another model has another vocabulary
# The link's sentences belong to the link's model: another model's box opens on its own default batch.
from_url = followed and st.query_params.get("pad_model", default) == name
seed_from_query(key, "pad_lines" if from_url else "", None if key in st.session_state else default_lines())
lines = st.text_area(t("Sentences, one per line: `source {sep} target` (without a target, the model's own greedy "
                       "translation is used)", sep=SEP), key=key, height=120)
write_query(pad_model=name, pad_lines=lines)  # a long batch goes as a reference, as the sidebar's texts
if note := long_text_note(lines):
    st.caption(note)
rows = parse(lines)
if not 2 <= len(rows) <= MAX_SENTENCES:
    show_error(t("Type 2 to {n} sentences, one per line (found {k}).", n=MAX_SENTENCES, k=len(rows)))
    st.stop()
try:
    pairs = [(s, tgt if tgt is not None else ckpt.translate(s).text) for s, tgt in rows]
    trace, losses = batch_trace(ckpt, pairs)
except ValueError as e:
    show_error(e, t("Change the sentences above."))
    st.stop()
meta = trace.meta

st.subheader(t("1. The batch and its padding masks"))
src_pad = FP.F.arr(trace["masks.src_pad"])
st.caption(t("Source shape (B, S) = ({b}, {s}), decoder input (B, T) = ({b}, {t_}). Every row is padded to the "
             "longest one; masks.src_pad / masks.tgt_pad are True (dark) at the [PAD] positions. Attention masks "
             "[PAD] *keys* only: a [PAD] query still attends to the real tokens, and its output is ignored.",
             b=src_pad.shape[0], s=src_pad.shape[1], t_=trace["masks.tgt_pad"].shape[1]))
show_figure(FP.padding_masks_figure(trace), key="pad_masks", filename="padding-masks")

st.subheader(t("2. The decoder's combined mask"))
st.caption(t("Decoder self-attention blocks a key if it is in the future (look-ahead) OR if it is [PAD]. Seed 001 "
             "combines them with torch.maximum(padding, look_ahead); it is the same OR on 0/1 masks. "
             "Encoder self-attention and cross-attention use the source padding mask alone."))
longest = int(np.argmax(FP.F.arr(trace["masks.tgt_pad"]).sum(-1)))  # the most padded target
b = st.selectbox(t("Sentence"), range(len(pairs)), index=longest, key="pad_row",
                 format_func=lambda i: f"{i}: {pairs[i][0]} → {pairs[i][1]}")
show_figure(FP.combined_mask_figure(trace, b), key="pad_combined", filename=f"combined-mask-{b}")

st.subheader(t("3. The loss ignores [PAD]"))
per_token = losses.per_token.numpy()
st.caption(t("Cross-entropy of every label (what the decoder should predict at each position; no label "
             "smoothing here). Multiplying by the mask sets the [PAD] positions to 0, but then the average must "
             "divide by the number of real tokens, not by every position."))
show_figure(FP.loss_figure(per_token, losses.real.numpy(), meta["next_tokens"]), key="pad_loss",
                   filename="per-token-loss")
n_real, n_all = int(losses.real.sum()), per_token.size
c1, c2 = st.columns(2)
c1.metric(t("Right: sum / real tokens"), f"{losses.right_mean:.4f}",
          help=t("{s} / {n} real tokens, what F.cross_entropy(ignore_index=pad_id) computes.",
                 s=f"{per_token.sum():.4f}", n=n_real))
c2.metric(t("Wrong (seed 001): torch.mean(loss * mask)"), f"{losses.wrong_mean:.4f}",
          delta=f"{losses.wrong_mean - losses.right_mean:+.4f}", delta_color="off",
          help=t("{s} / {n} positions: the [PAD] zeros are counted, so the loss shrinks as padding grows.",
                 s=f"{per_token.sum():.4f}", n=n_all))
st.dataframe([{t("sentence"): i, t("position"): j, t("label"): meta["next_tokens"][i][j],
               t("loss"): float(per_token[i, j]), t("counted"): bool(losses.real[i, j])}
              for i in range(per_token.shape[0]) for j in range(per_token.shape[1])], hide_index=True, height=300)
