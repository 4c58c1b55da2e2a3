"""Input checks and escaping: why a text cannot run, tokens shortened for a message, Markdown escaping,
the model's English errors said again in the UI language, and notes on [UNK] tokens and unfinished output."""

from __future__ import annotations

import re
import unicodedata

from viz.i18n import N_, t

# C0/C1 controls (tab, newline and carriage return allowed) and invisible direction/format marks.
# ZWJ/ZWNJ (U+200C/D) are allowed: emoji sequences and some scripts need them.
_CONTROL = re.compile(
    r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
MAX_SHOWN = 24  # characters of one token shown in a message (a 5,000-character word is cut)


def text_problems(text: str) -> str | None:
    """Why `text` cannot be run, in words a student understands; None when it can."""
    if not text:
        return t("The input is empty: type a sentence in the sidebar.")
    if not text.strip():
        return t("The input is only whitespace: type a sentence in the sidebar.")
    bad = _CONTROL.search(text)
    if bad:
        ch = bad.group()
        name = unicodedata.name(ch, "control character")
        return t("The input contains an invisible control character U+{code} ({name}) at position {pos}. "
                 "Remove it (it was probably pasted) and try again.",
                 code=f"{ord(ch):04X}", name=name, pos=bad.start())
    return None


def shorten(s: str, limit: int = MAX_SHOWN, markdown: bool = False) -> str:
    """`s` for a message: at most `limit` characters, the rest counted, never silently dropped.
    markdown=True: the characters of `s` are escaped for a Markdown message (see `md_escape`)."""
    from viz.figures.attention import show_token

    shown = md_escape if markdown else (lambda x: x)
    if len(s) <= limit:
        return shown(show_token(s))
    return t("{start}… ({n} characters)", start=shown(show_token(s[:limit])), n=len(s))


def unk_note(pieces, text: str | None = None) -> str | None:
    """A warning listing what the tokenizer could not represent (e.g. emoji -> [UNK]), by the
    original characters of `text` (the text `pieces` were cut from), at most 8 of them."""
    unk = [p for p in pieces if p.is_unk]
    if not unk:
        return None
    shown = ", ".join(f"'{shorten(_original(p, text), markdown=True)}'" for p in unk[:8])
    shown += ", …" if len(unk) > 8 else ""
    return t("{n} token(s) are not in this model's vocabulary and became [UNK]: {shown}. "
             "The model still runs, but it sees only the [UNK] embedding there.", n=len(unk), shown=shown)


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~<>$:])")  # ":" too: Streamlit's :emoji: and :red[…]


def md_escape(s: str) -> str:
    """`s` shown literally in a Markdown message (st.warning, st.error): "*", "_", "`", "<"… would
    otherwise format the message or vanish."""
    return _MARKDOWN.sub(r"\\\1", s)


def md_text_lines(s: str) -> str:
    """`s` shown literally in Markdown with its line breaks kept and visible: each newline is drawn as ↵ (the token
    lists' mark) and breaks the line there. Markdown alone joins lines ("↵↵" generated at step 0 showed as nothing)."""
    lines = [md_escape(line) for line in s.replace("\r\n", "\n").split("\n")]
    return "↵  \n".join(lines)  # two spaces before the newline: a Markdown line break


def _original(piece, text: str | None) -> str:
    a, b = piece.span
    if text is not None and 0 <= a < b <= len(text):
        return text[a:b]
    return piece.token if piece.token != "[UNK]" else f"[UNK]@{a}"


# /learn's checkpoints in the model list (viz/ui/learn_run.model_name): their names stay stable keys in every language
# (a process-wide cache is keyed by them); shown, they are said in the UI's language.
_LEARN_NAME = re.compile(r"learn: (?:(2 layers|1 layer)|run (\d+) \((.+), seed (\d+)\)), step (\d+)")
_LEARN_CHANGES = {"none": N_("no change (the shipped setup)"), "one layer": N_("1 layer"),
                  "no positions": N_("no positional information"), "freeze layer0": N_("layer 0 frozen"),
                  "one head": N_("fewer heads (1 per layer)")}


def model_name_text(name: str) -> str:
    """A model's name as the UI shows it: a /learn checkpoint's ("learn: 2 layers, step 675") in the UI's language
    (zh 看注意力学习：2 层，第 675 步); any other name as it is."""
    from viz.i18n import DEFAULT_LANG, current_lang

    m = _LEARN_NAME.fullmatch(name)
    if m is None or current_lang() == DEFAULT_LANG:  # in English the name is the one the code gives
        return name
    shipped, run, change, seed, step = m.groups()
    if shipped:
        return t("learn: {what}, step {step}", what=t(shipped), step=step)
    return t("learn: run {n} ({what}, seed {seed}), step {step}", n=run, seed=seed, step=step,
             what=t(_LEARN_CHANGES[change]) if change in _LEARN_CHANGES else change)


# Input errors the model raises in English, said again in the UI language (one sentence, no repeated advice).
_TOO_LONG = re.compile(r"the (input|target) is (\d+) tokens long; (?:with \[BOS\] )?this model's limit is (\d+) tokens")


def error_text(err: BaseException | str) -> tuple[str, bool]:
    """(message, whether it already says what to do) for a bad input or file."""
    if isinstance(err, str):
        return err, False
    word, tokens = getattr(err, "word", None), getattr(err, "tokens", None)
    if word is not None and tokens is not None:  # model.analysis.compare.NotATokenError
        listed = " ".join(shorten(x, markdown=True) for x in tokens[:40]) + (" …" if len(tokens) > 40 else "")
        if not word.strip():
            return t("The token box is empty: type one of the sentence's tokens ({tokens}).", tokens=listed), True
        return t("“{word}” is not a token of this sentence; its tokens: {tokens}.",
                 word=shorten(word.strip(), markdown=True), tokens=listed), True
    if (run_word := getattr(err, "run_word", None)) is not None:  # model.toy.learn.NotARunTokenError
        return t("“{word}” is not a token of this model: its tokens are the numbers 1 to {top}, separated by spaces.",
                 word=shorten(run_word, markdown=True), top=err.run_top), False
    # str(KeyError) wraps its message in quotes; other messages keep theirs ("'street' is not…").
    msg = (str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)).strip() or type(err).__name__
    m = _TOO_LONG.search(msg)
    if m:
        which = t("The input") if m.group(1) == "input" else t("The target")
        return t("{which} is {n} tokens long; this model's limit is {limit} tokens. Shorten it: it is never "
                 "silently truncated.", which=which, n=m.group(2), limit=m.group(3)), True
    first = msg.split(None, 1)[0]  # a sentence's first word is capitalised; a file name (garbage.gguf) is kept
    return (msg[:1].upper() + msg[1:] if first.isalpha() else msg), False


def target_unk_note(ckpt, target: str | None) -> str | None:
    """`unk_note` for a teacher-forced target (its characters outside the target vocabulary), or None."""
    note = unk_note(ckpt.tgt_tokenizer.pieces(target), target) if target else None
    return note and t("Target: ") + note


def stop_note(meta) -> str | None:
    """Why the model's own output ended without [EOS] (a loop, or the shared length limit); None if it ended."""
    if not meta.get("generated") or meta.get("finished", True):
        return None
    loop = meta.get("looped")
    if loop:
        return t("The model did not stop: its output ends with “{ngram}” repeated {n} times, more often than the "
                 "source repeats it, so decoding stopped there (a loop).", ngram=" ".join(loop["ngram"]),
                 n=loop["repeats"])
    return t("The model did not stop: it produced no [EOS] and was stopped at the {limit}-token limit (the model's "
             "max_len − 1 positions; the same limit on every page).", limit=meta.get("max_new_tokens"))
