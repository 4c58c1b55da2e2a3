"""Issue 26 §4, the catalog side (fast, no app run):

- bold renders in every translation: a `**` that closes must be right-flanking (CommonMark). "**试一试：**{task}"
  is not: the closing ** follows the full-width colon (punctuation) and precedes a letter, so the page showed the
  asterisks. The check below applies CommonMark's flanking rules to every msgstr;
- lesson 11's comparison table in Chinese: 位置编码 (not 位置数), and the stack names translated."""

from __future__ import annotations

import re
import unicodedata

import pytest
from babel.messages.pofile import read_po

from viz import i18n

PO_FILES = sorted((i18n.LOCALE_DIR / "zh").glob("*.po"))


def _punct(ch: str) -> bool:  # CommonMark 0.31: Unicode P* and S* are punctuation
    return unicodedata.category(ch)[0] in "PS"


def _space(ch: str) -> bool:
    return ch == "" or ch.isspace()


def unmatched_bold(text: str) -> list[int]:
    """Positions of `**` runs that cannot pair up under CommonMark's flanking rules (code spans skipped;
    placeholders read as letters, which is what most of them become)."""
    text = re.sub(r"\{[a-z_0-9]*\}", "x", text)
    text = re.sub(r"`[^`]*`", lambda m: "c" * len(m.group()), text)
    stack, bad = [], []
    for m in re.finditer(r"(?<!\*)\*\*(?!\*)", text):
        i, j = m.start(), m.end()
        before, after = (text[i - 1] if i else ""), (text[j] if j < len(text) else "")
        left = not _space(after) and (not _punct(after) or _space(before) or _punct(before))
        right = not _space(before) and (not _punct(before) or _space(after) or _punct(after))
        if right and stack:
            stack.pop()
        elif left:
            stack.append(i)
        else:
            bad.append(i)
    return bad + stack


def test_the_checker_knows_the_reported_case():
    assert unmatched_bold("**试一试：**{task}")
    assert not unmatched_bold("**试一试**：{task}") and not unmatched_bold("**Try it:** {task}")
    assert not unmatched_bold("全部注意力的 **{p}**（所有头）") and not unmatched_bold("：**`{output}`**（期望）")


@pytest.mark.parametrize("po", PO_FILES, ids=lambda p: p.name)
def test_bold_renders_in_every_chinese_string(po):
    with open(po, "rb") as f:
        cat = read_po(f)
    broken = [(m.id, m.string) for m in cat if m.id and isinstance(m.string, str) and unmatched_bold(m.string)]
    assert not broken, broken[:3]


def test_lesson_11_table_in_chinese(monkeypatch):
    from viz import lessons as LS

    monkeypatch.setattr(i18n, "current_lang", lambda: "zh")  # t() asks it for the session's language
    desc = {"blocks": {"positional": "rotary", "rope_base": 1e5, "norm": "rmsnorm", "norm_first": True,
                       "ffn": "gated", "activation": "silu", "d_model": 576, "d_ff": 1536, "tied_embeddings": True},
            "attention": {"decoder.layers.0.self_attn": {"n_heads": 9, "n_kv_heads": 3}},
            "stacks": {"decoder": {"layers": 30}}}
    cells = [str(c) for col in LS.live_llm_2017(desc).figure.data[0].cells.values for c in col]
    assert "位置编码" in cells and "位置数" not in cells
    assert "解码器" in cells and "decoder" not in cells
