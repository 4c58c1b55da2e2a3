"""Tokenizer playground: one text cut three ways (words, characters, WordPiece) as token strips.

Pure: strings in, plotly Figure out. The cut functions are what the strips draw.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from viz.figures import attention as F
from viz.i18n import N_, t

METHODS = {"word": N_("by word"), "char": N_("by character"), "wordpiece": N_("by WordPiece")}
_WORD = re.compile(r"\w+|[^\w\s]")  # runs of letters/digits, or one punctuation mark; spaces separate
PALETTE = ["#c9e7f8", "#fbe3b3", "#d5f0d1", "#f7cfd6", "#e3dcf5", "#f6f6b8"]
MAX_DRAWN = 80  # characters of the text drawn as strips: a 5,000-character text would draw an unreadable smear
MAX_BOX = 24  # characters of one token written in its box (a 5,000-character word gets one readable box)


def word_cut(text: str) -> list[str]:
    """Words and punctuation marks, split at whitespace (a run of Chinese characters stays one "word":
    Chinese has no spaces)."""
    return _WORD.findall(text)


def char_cut(text: str) -> list[str]:
    """One token per character, whitespace dropped."""
    return [c for c in text if not c.isspace()]


def drawn_end(text: str, limit: int = MAX_DRAWN) -> int:
    """Where the drawn part of `text` ends: all of it up to `limit` characters, else at the last space
    before `limit` (a word is not cut in two), or at `limit` when there is none in reach."""
    if len(text) <= limit:
        return len(text)
    space = text.rfind(" ", 0, limit + 1)
    return space if space > limit // 2 else limit


def cuts_upto(text: str, wordpiece: Sequence, end: int) -> dict[str, list[str]]:
    """The three cuts of `text`, keeping only the tokens that start before character `end` (the drawn part).
    `wordpiece`: the WordPiece pieces of the whole text (with character spans)."""
    return {"word": [m.group() for m in _WORD.finditer(text) if m.start() < end],
            "char": char_cut(text[:end]),
            "wordpiece": [p.token for p in wordpiece if p.span[0] < end]}


def _box(tok: str) -> str:
    return tok if len(tok) <= MAX_BOX else tok[: MAX_BOX - 1] + "…"


def strips_figure(cuts: Mapping[str, Sequence[str]], vocab: Mapping[str, int] | None = None,
                  totals: Mapping[str, int] | None = None) -> go.Figure:
    """One row per method; each token a box as wide as its text, labelled with it. `cuts` maps a method id
    (METHODS) to its tokens; `vocab` (optional) the vocabulary size of each method, shown in its row label;
    `totals` (optional) each method's token count over the whole text when `cuts` holds only the drawn part."""
    fig = go.Figure()
    rows = []
    for method, toks in cuts.items():
        size = f" · {t('vocabulary')} {vocab[method]}" if vocab and method in vocab else ""
        total = totals.get(method, len(toks)) if totals else len(toks)
        drawn = " " + t("(first {k} drawn)", k=len(toks)) if total > len(toks) else ""
        row = f"{t(METHODS.get(method, method))}: {total} {t('tokens')}{drawn}{size}"
        rows.append(row)
        toks = [_box(tok) for tok in toks]
        widths = [max(1, len(tok.removeprefix("##"))) + 0.6 for tok in toks]
        bases = [sum(widths[:i]) for i in range(len(widths))]
        fig.add_trace(go.Bar(
            y=[row] * len(toks), x=widths, base=bases, orientation="h", name=row, showlegend=False,
            text=[F.show_token(tok) for tok in toks], textposition="inside", insidetextanchor="middle",
            textfont={"size": 14}, marker={"color": [PALETTE[i % len(PALETTE)] for i in range(len(toks))],
                                           "line": {"color": "#555", "width": 1}},
            customdata=list(range(len(toks))),
            hovertemplate="%{y}<br>" + t("token") + " %{customdata}: %{text}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category", categoryorder="array", categoryarray=rows)
    fig.update_xaxes(visible=False)
    fig.update_layout(barmode="overlay", bargap=0.35, uniformtext={"minsize": 9, "mode": "show"})
    return F._layout(fig, t("the same text, cut three ways"), 120 + 70 * len(cuts))
