"""Tokens & embeddings: text -> tokens -> ids -> token embedding ×√d_model + positional encoding."""

import numpy as np
import streamlit as st

from model import sinusoidal_encoding
from viz.figures import attention as F
from viz.figures import layer as FL
from viz.i18n import N_, current_lang, t
from viz.ui.models import capabilities, is_real_model
from viz.ui.render import show_figure, tokens_of
from viz.ui.sidebar import require, require_trace, selection
from viz.ui.state import clamp_state, int_in, seed_from_query, write_query
from viz.ui.text import shorten

st.title(t("Tokens & embeddings"))
st.caption(t("Text → tokens → ids → vectors. The tokenizer cuts the text into tokens from a fixed vocabulary "
             "(each token has an integer id); the embedding table maps each id to a d_model-dimensional "
             "vector; a positional encoding is added so the model knows the order."))


def lm_window(n_tok: int, widths: list[int]) -> int:
    """A long prompt: the first token of the window the per-token heatmaps show (URL `first`); 0 when every
    figure fits whole (at most FL.ROWS_UP_TO rows and FL.FIGURE_CELLS cells each)."""
    if min(FL.window_size(n_tok, w) for w in widths) >= n_tok:
        return 0
    seed_from_query("tok_first", "first", 0, int, int_in(0, n_tok - 1))
    clamp_state("tok_first", 0, n_tok - 1)
    first = st.number_input(t("First token"), 0, n_tok - 1, key="tok_first",
                            help=t("The heatmaps with one row per token show a window of the prompt starting here."))
    write_query(first=first)
    st.caption(t("This prompt has {n} tokens: a heatmap with one row per token shows a window of them, at most {k} "
                 "tokens (fewer where each token has many values), from token {first}.", n=f"{n_tok:,}",
                 k=FL.ROWS_UP_TO, first=first))
    return int(first)


def windowed(m, tokens: list[str], first: int, title: str, value_name: str, key: str, filename: str) -> None:
    """F.vectors_heatmap of a (position × dimension) matrix, on the window of a long prompt that fits a figure."""
    m = F.arr(m)
    rows = FL.token_window(m.shape[0], first, FL.window_size(m.shape[0], m.shape[1]))
    show_window(F.vectors_heatmap(m[rows], tokens[rows], title, value_name), rows, m.shape[0],
                FL.window_labels(tokens, rows), key, filename)


def show_window(fig, rows: slice, n_tok: int, labels: list[str], key: str, filename: str) -> None:
    """A figure drawn from a window's rows, its rows labelled with their positions in the prompt; when it is a
    window of a longer prompt, some labels on its first y axis (plotly picks a readable subset) and a caption
    that says which tokens it shows."""
    fig = FL.relabel_rows(fig, labels)
    cut = rows.stop - rows.start < n_tok
    if cut:
        fig.update_layout(yaxis_showticklabels=True)
    show_figure(fig, key=key, filename=filename)
    if cut:
        st.caption(t("Tokens {a}–{b} of {n}: the window set by “First token” above.", a=rows.start,
                     b=rows.stop - 1, n=f"{n_tok:,}"))


def lm_tokens() -> None:
    """A decoder-only language model: its (byte-level BPE) pieces, ids, token embedding and how positions enter."""
    from pathlib import Path

    from viz.ui import lm_models

    sel, trace = require_trace()
    rm, meta = sel.ckpt, trace.meta
    blocks = meta["model"]["blocks"]
    ids = (meta.get("tgt_ids") or [[]])[0]
    shown = tokens_of(trace, "tgt")  # readable: ␣ for a space, ↵ for a newline
    pieces = meta.get("tgt_pieces") or shown
    if isinstance(pieces[0] if pieces else None, list):
        pieces = pieces[0]
    st.subheader(t("Tokenization"))
    vocab = blocks.get("vocab_size")
    if lm_models._byte_level(rm.obj):
        st.markdown(t("**Byte-level BPE** (GPT-2's scheme, vocabulary {n}): the text is read as UTF-8 bytes, each "
                      "byte written as one printable letter (a space is Ġ, a newline Ċ), and merges learned from "
                      "data join frequent byte sequences into pieces. Any text can be tokenized: there is no [UNK]. "
                      "The token column shows each piece's text, with ␣ for a space and ↵ for a newline; the piece "
                      "column shows it as stored in the vocabulary.", n=f"{vocab:,}"))
    elif lm_models.tokenizer_kind(rm.obj) == "sentencepiece":
        st.markdown(t("**SentencePiece BPE** (vocabulary {n}): the text is read as characters, a space written ▁ and "
                      "kept with the piece after it, and pieces merge by learned rank. A character the vocabulary has "
                      "no piece for falls back to its UTF-8 bytes, one piece each (`<0xE4>`, shown `\\xe4`): there "
                      "is no [UNK]. The token column shows each piece's text, with ␣ for a space (▁) and ↵ for a "
                      "newline; the piece column shows it as stored in the vocabulary.", n=f"{vocab:,}"))
    else:
        st.markdown(t("**Subword pieces** (vocabulary {n}); ␣ marks a space.", n=f"{vocab:,}"))
    st.dataframe([{t("position"): i, t("token"): tok, t("piece"): piece, t("id"): int(i_)}
                  for i, (tok, piece, i_) in enumerate(zip(shown, pieces, ids, strict=False))], hide_index=True)

    st.subheader(t("Token embedding"))
    D = blocks["d_model"]
    T = trace["decoder.embed.tok"].shape[1]
    rotary = blocks.get("positional") == "rotary"
    widths = [D] + ([] if rotary else [3 * D])  # the embedding (and learned positions: embedding + position)
    if rotary and "decoder.rope.angles" in trace:
        widths.append(trace["decoder.rope.angles"].shape[-1])
    first = lm_window(T, widths)
    st.caption(t("Each token id selects one row of the embedding matrix (vocabulary × d_model = {v} × {d}). Unlike "
                 "the 2017 Transformer, a language model like this one does not multiply the row by √d_model.",
                 v=f"{vocab:,}", d=D)
               + (" " + t("The same matrix, transposed, is the unembedding that turns the last layer's vectors into "
                          "next-token logits (tied embeddings).") if blocks.get("tied_embeddings") else ""))
    windowed(trace["decoder.embed.tok"][0], shown, first, "decoder.embed.tok: " + t("token embedding (no ×√d)"),
             t("embedding"), key="tok_embed", filename="decoder-token-embedding")

    st.subheader(t("Positions"))
    if rotary:
        since = Path(__file__).resolve().parents[2] / "viz/pages/since2017.py"
        st.info(t("This model adds no position vector to its embedding: the input of layer 0 is the token "
                  "embedding itself. Positions enter inside every attention layer as rotations (RoPE): q and k are "
                  "rotated by an angle that grows with the position, so q·k depends on how far apart two tokens "
                  "are."), icon="🔄")
        page, label = (("viz/pages/since2017.py", t("RoPE vs sinusoidal positions, live: What changed since 2017"))
                       if since.is_file() else ("viz/pages/attention.py", t("See the rotated q and k on the "
                                                                            "Attention page")))
        st.page_link(page, label=label, icon=":material/open_in_new:")
        if "decoder.rope.angles" in trace:
            ang = trace["decoder.rope.angles"]
            st.caption(t("The rotation angles: position p turns dimension pair i of q and k by p·θ_i, θ_i = "
                         "base^(−2i/d_head), base = {base}. Pair 0 turns fastest; the last pairs barely move.",
                         base=f"{blocks.get('rope_base', 10000):g}"))
            windowed(ang, shown, first, "decoder.rope.angles: " + t("rotation angle p·θ_i (radians)"), "θ",
                     key="tok_rope", filename="rope-angles")
        return
    pe = F.arr(trace["decoder.embed.pos"])
    st.caption(t("This model learns its positional embeddings; only the input's positions are shown."))
    rows = FL.token_window(pe.shape[0], first, FL.window_size(pe.shape[0], pe.shape[1]))
    fig = F.vectors_heatmap(pe[rows], None, t("positional encoding ({n} positions × {d} dims)", n=pe.shape[0], d=D),
                            "PE")
    show_window(fig, rows, pe.shape[0], [str(i) for i in range(rows.start, rows.stop)], "tok_pe",
                "positional-encoding")
    show_figure(F.pe_similarity(pe[:256]), key="tok_pe_sim", filename="pe-similarity")
    st.subheader(t("Embedding + position = the input of layer 0"))
    rows = FL.token_window(T, first, FL.window_size(T, 3 * D))  # three heatmaps side by side
    fig = F.embedding_sum_figure(trace["decoder.embed.tok"][0, rows], F.arr(trace["decoder.embed.pos"])[rows],
                                 trace["decoder.embed.out"][0, rows], shown[rows])
    show_window(fig, rows, T, FL.window_labels(shown, rows), "tok_sum", "decoder-embedding-plus-position")


_sel = selection()
if _sel is not None and is_real_model(_sel) and "lm" in capabilities(_sel.name):
    lm_tokens()
    st.stop()
require("toy", lm_view="tokens")  # the toy tokenizers and tables; an encoder like MiniLM says what it lacks
sel, trace = require_trace()
ckpt, cfg, meta = sel.ckpt, sel.ckpt.cfg, trace.meta


# ---------------------------------------------------------------- tokenization

KIND_NOTE = {
    "char": N_("**character** tokenizer: one token per character (Chinese is best tokenized by character: "
               "every character carries meaning and the vocabulary stays small)."),
    "wordpiece": N_("**WordPiece** (BERT's subword scheme): words are split into known pieces, `##` marks a "
                    "piece that continues a word (eat + ##ing), so rare words need no vocabulary entry of "
                    "their own."),
}


def source_table(text: str) -> list[dict]:
    pieces = ckpt.src_tokenizer.pieces(text.strip())
    col = {k: t(k) for k in ("position", "token", "id", "covers", "subword")}
    rows = [{col["position"]: i, col["token"]: F.show_token(p.token), col["id"]: p.id,
             col["covers"]: shorten(text.strip()[p.span[0]:p.span[1]]),
             col["subword"]: t("continues a word") if p.token.startswith("##") else "",
             "[UNK]": t("⚠ unknown") if p.is_unk else ""} for i, p in enumerate(pieces)]
    # Tokens the model reads beyond the text (a trailing [EOS] marks the end of the source).
    ids, toks = (meta.get("src_ids") or [[]])[0], tokens_of(trace, "src")
    rows += [{col["position"]: i, col["token"]: toks[i], col["id"]: ids[i], col["covers"]: t("(added)"),
              col["subword"]: "", "[UNK]": ""} for i in range(len(rows), len(ids))]
    return rows


def target_table() -> list[dict]:
    ids = (meta.get("tgt_ids") or [[]])[0]
    toks = tokens_of(trace, "tgt")
    nxt = meta.get("next_tokens") or []
    return [{t("position"): i, t("decoder input"): F.show_token(tok), t("id"): i_,
             t("subword"): t("continues a word") if tok.startswith("##") else "",
             t("should predict next"): F.show_token(nxt[i]) if i < len(nxt) else ""}
            for i, (tok, i_) in enumerate(zip(toks, ids, strict=False))]


st.subheader(t("Tokenization"))
left, right = st.columns(2)
with left:
    st.markdown(t("**Source** ({kind}, vocabulary {n}): ", kind=ckpt.src_tokenizer.kind,
                  n=ckpt.src_tokenizer.vocab_size) + t(KIND_NOTE.get(ckpt.src_tokenizer.kind, "")))
    st.dataframe(source_table(sel.text), hide_index=True)
with right:
    how = t("the teacher-forced target you typed") if sel.target else t("the model's own greedy translation")
    st.markdown(t("**Target** ({kind}, vocabulary {n}): {how}, `{target}`. The decoder reads [BOS] + target "
                  "(shifted right) and learns to predict the next token at every position, [EOS] last.",
                  kind=ckpt.tgt_tokenizer.kind, n=ckpt.tgt_tokenizer.vocab_size, how=how,
                  target=meta.get("target", "")))
    st.dataframe(target_table(), hide_index=True)

# ---------------------------------------------------------------- embeddings

st.subheader(t("Token embedding × √d_model"))
SIDES = {"encoder": N_("Encoder (source)"), "decoder": N_("Decoder (target)")}
lang = current_lang()
seed_from_query("tok_side", "side", "encoder", valid=lambda v: v in SIDES)
side = st.radio(t("Side"), list(SIDES), horizontal=True, key="tok_side", format_func=lambda v: t(SIDES[v], lang=lang))
write_query(side=side)
tokens = tokens_of(trace, "src" if side == "encoder" else "tgt")
scaled = cfg.scale_embedding
st.caption(
    t("Each token id selects one row of the embedding matrix (vocabulary × d_model, d_model = {d}).", d=cfg.d_model)
    + (" " + t("The row is multiplied by √d_model = {s} so that the embedding is not drowned by the positional "
               "encoding, whose entries lie in [−1, 1].", s=f"{np.sqrt(cfg.d_model):.3g}") if scaled else "")
    + (" " + t("The target embedding is shared with the pre-softmax (output) matrix.") if cfg.tie_generator else ""))
show_figure(F.vectors_heatmap(trace[f"{side}.embed.tok"][0], tokens,
                                     f"{side}.embed.tok: " + t("token embedding") + (" × √d_model" if scaled else ""),
                                     t("embedding")), key="tok_embed", filename=f"{side}-token-embedding")

st.subheader(t("Positional encoding"))
st.caption(t("Attention itself ignores order (shuffle the tokens and every weight moves with them), so a "
             "position signal is added: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / "
             "10000^(2i/d_model)). The base is 10000 (not 1000). Low dimensions oscillate fast, high "
             "dimensions slowly: the wavelengths grow geometrically from 2π to 10000·2π."))
sinusoidal = cfg.positional == "sinusoidal"
n_input = trace[f"{side}.embed.pos"].shape[0]
if sinusoidal:
    # PE is a closed-form function of (pos, dim): it can be drawn past this model's max_len too.
    top = max(cfg.max_len, 256)
    seed_from_query("tok_npos", "positions", max(64, n_input), int, int_in(2, top))
    clamp_state("tok_npos", 2, top)
    n_pos = st.slider(t("Positions to show"), 2, top, key="tok_npos",
                      help=t("The table is a fixed function of (position, dimension); the input uses its "
                             "first rows, and this model never uses rows past max_len = {n}.", n=cfg.max_len))
    write_query(positions=n_pos)
    pe = sinusoidal_encoding(n_pos, cfg.d_model).numpy()
else:
    st.info(t("This model learns its positional embeddings; only the input's positions are shown."))
    pe = F.arr(trace[f"{side}.embed.pos"])
    n_pos = pe.shape[0]
pe_title = t("positional encoding ({n} positions × {d} dims)", n=n_pos, d=cfg.d_model)
show_figure(F.vectors_heatmap(pe, None, pe_title, "PE", zrange=1.0), key="tok_pe",
                   filename="positional-encoding")
c1, c2 = st.columns(2)
with c1:
    d = cfg.d_model
    default_dims = sorted({0, 1, 4, min(d - 2, d // 2), d - 2})
    dims = st.multiselect(t("Dimensions"), list(range(d)), default=default_dims, key="tok_dims")
    show_figure(F.pe_curves(pe, dims), key="tok_pe_curves", filename="pe-curves")
with c2:
    st.caption(t("PE·PEᵀ: PE_pos · PE_(pos+k) = Σ_i cos(k·ω_i) depends only on the offset k, so each diagonal "
                 "is constant. PE_(pos+k) is a fixed rotation of PE_pos, which lets attention pick up relative "
                 "positions.") if sinusoidal else t("PE·PEᵀ of the learned position vectors."))
    show_figure(F.pe_similarity(pe[: min(n_pos, 256)]), key="tok_pe_sim", filename="pe-similarity")

st.subheader(t("Embedding + position = the input of layer 0"))
extra = []
if cfg.n_token_types:
    extra.append(t("token-type (segment) embeddings"))
if cfg.embed_norm:
    extra.append(t("a LayerNorm"))
st.caption(t("x = Embedding(token) × √d_model + PE(pos), then dropout (off at inference). Each row is one "
             "token at its position; the same token at two positions gets two different vectors.")
           + (" " + t("This model also adds {what}, so the right panel is not the plain sum.",
                      what=t(" and ").join(extra)) if extra else ""))
show_figure(F.embedding_sum_figure(trace[f"{side}.embed.tok"][0], trace[f"{side}.embed.pos"],
                                          trace[f"{side}.embed.out"][0], tokens,
                                          " × √d_model" if scaled else ""),
                   key="tok_sum", filename=f"{side}-embedding-plus-position")
