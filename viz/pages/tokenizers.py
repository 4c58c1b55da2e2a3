"""Tokenizer playground: the same text cut by word, by character and by a WordPiece trained here.

URL parameters: tkp_text (the text, up to MAX_URL_TEXT characters), corpus (e.g. zh-en:tgt), vocab
(WordPiece vocabulary size).
"""

import streamlit as st

from model.toy.tasks import TASKS
from model.toy.tokenizer import SPECIALS, Tokenizer
from viz.figures import tokenizers as FT
from viz.i18n import N_, option_labels, t
from viz.ui.render import show_error, show_figure
from viz.ui.state import int_in, long_text_note, seed_from_query, write_query

EXAMPLES = {  # the seeds' examples (seed 002: "eating" -> eat + ing; Chinese is best cut by character)
    "I like eating ice cream.": N_("seed 002: a subword tokenizer cuts “eating” into eat + ##ing"),
    "eat eating drink drinking": N_("seed 002: four words, three subwords (eat, drink, ##ing)"),
    "我爱机器学习": N_("Chinese: every character carries meaning, so cut by character"),
    "The animal didn't cross the street because it was too tired": N_("the seeds' self-attention sentence"),
}
CORPORA = {  # id -> (task, side, label)
    "zh-en:tgt": ("zh-en", 1, N_("zh-en task, English targets")),
    "zh-en:src": ("zh-en", 0, N_("zh-en task, Chinese sources")),
    "dates:src": ("dates", 0, N_("dates task, sources")),
    "reverse:src": ("reverse", 0, N_("reverse task, sources")),
}
N_TEXTS = 2000

st.title(t("Tokenizer playground"))
st.caption(t("Before a Transformer sees text, a tokenizer cuts it into tokens from a fixed vocabulary. Cut by word "
             "and the vocabulary explodes (cat, cats, eat, eating… each its own entry, and any new word is unknown); "
             "cut by character and sequences get long and each token means little; subwords (WordPiece, BPE) sit "
             "in between: frequent words stay whole, rare ones are built from pieces, “##” marks a piece that "
             "continues a word."))


@st.cache_resource(show_spinner=False, max_entries=16)
def corpus(corpus_id: str) -> list[str]:
    task, side, _ = CORPORA[corpus_id]
    return [pair[side] for pair in TASKS[task].sample(N_TEXTS, seed=0, split="train")]


@st.cache_resource(show_spinner=False, max_entries=32)
def wordpiece(corpus_id: str, vocab_size: int) -> Tokenizer:
    return Tokenizer.train_wordpiece(corpus(corpus_id), vocab_size)


texts = list(EXAMPLES)
seed_from_query("tkp_text", "tkp_text", texts[0])
choice = st.pills(t("Examples"), texts, key="tkp_example", format_func=lambda x: x[:32] + ("…" if len(x) > 32 else ""))
if choice and st.session_state.get("tkp_last_example") != choice:  # a new pill fills the text box once
    st.session_state["tkp_text"] = st.session_state["tkp_last_example"] = choice
text = st.text_input(t("Text"), key="tkp_text")
if choice in EXAMPLES:
    st.caption(t(EXAMPLES[choice]))

c1, c2 = st.columns(2)
seed_from_query("tkp_corpus", "corpus", "zh-en:tgt", valid=lambda v: v in CORPORA)
corpus_id = c1.selectbox(t("WordPiece trained on"), list(CORPORA), key="tkp_corpus",
                         format_func=option_labels(CORPORA, lambda c: t(CORPORA[c][2])))
seed_from_query("tkp_vocab", "vocab", 120, int, int_in(len(SPECIALS) + 1, 1000))
vocab = c2.slider(t("WordPiece vocabulary size"), len(SPECIALS) + 1, 1000, key="tkp_vocab", step=1,
                  help=t("Training starts from single characters and keeps merging the most frequent adjacent pair "
                         "until the vocabulary has this many entries (or nothing is left to merge)."))
write_query(corpus=corpus_id, vocab=vocab, tkp_text=text)  # a long text goes as a reference, as the sidebar's
if note := long_text_note(text):
    st.caption(note)

if not text.strip():
    show_error(t("Type some text to cut."))
    st.stop()
tok = wordpiece(corpus_id, vocab)
pieces = tok.pieces(text)
cuts = {"word": FT.word_cut(text), "char": FT.char_cut(text), "wordpiece": [p.token for p in pieces]}
sizes = {"word": len({w.lower() for c in corpus(corpus_id) for w in FT.word_cut(c)}),
         "char": len({ch for c in corpus(corpus_id) for ch in FT.char_cut(c)}), "wordpiece": tok.vocab_size}
end = FT.drawn_end(text)
show_figure(FT.strips_figure(FT.cuts_upto(text, pieces, end), sizes, {m: len(c) for m, c in cuts.items()}),
                   key="tkp_strips", filename="tokenizer-cuts")
if end < len(text):
    st.caption(t("A long text: the strips draw its first {k} characters (of {n}), so the boxes stay readable; the "
                 "token counts are for the whole text.", k=end, n=f"{len(text):,}"))
st.caption(t("Vocabulary sizes on this corpus ({n} texts): distinct words, distinct characters, and the trained "
             "WordPiece (including the {k} special tokens).", n=N_TEXTS, k=len(SPECIALS)))
if tok.vocab_size < vocab:
    st.info(t("The corpus ran out of pairs to merge at {n} entries: every word is already one token.",
              n=tok.vocab_size))
unk = [p.token for p in pieces if p.is_unk]
if unk:
    st.warning(t("{n} WordPiece token(s) are [UNK]: a word with a character never seen in the training corpus "
                 "becomes one [UNK] (e.g. Chinese text against an English corpus).", n=len(unk)))

st.subheader(t("What the WordPiece learned"))
learned = tok.tokens(range(len(SPECIALS), tok.vocab_size))
alphabet = [p for p in learned if len(p.removeprefix("##")) == 1]
merged = [p for p in learned if len(p.removeprefix("##")) > 1]
st.caption(t("{a} single characters (the starting alphabet), then {m} merged pieces, in the order they were "
             "learned (most frequent pair first):", a=len(alphabet), m=len(merged)))
st.code(" ".join(merged) or "—", language=None, wrap_lines=True)
