"""Text that never ends in a broken character, while tokens stream in.

Byte-level BPE (GPT-2, Llama 3, SmolLM2) may split one character over several tokens: a Chinese character
is 3 bytes in UTF-8, and a token can hold 1 or 2 of them. Decoding the tokens so far then ends in U+FFFD
("�") until the next token brings the missing bytes. `complete_text` holds those last tokens back instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"
MAX_HELD = 3  # a UTF-8 character is at most 4 bytes: at most 3 of them wait for the next token


def complete_text(decode: Callable[[list[int]], str], ids: Sequence[int]) -> tuple[str, int]:
    """(text, held): `decode(ids)` without the last `held` tokens, the fewest that make the text end in a
    whole character. held = 0 when the text is whole, or when no cut of up to MAX_HELD tokens mends its end
    (a genuinely invalid byte, not one that waits for the next token: nothing to wait for)."""
    ids = [int(i) for i in ids]
    text = decode(ids)
    if not text.endswith(REPLACEMENT):
        return text, 0
    for held in range(1, min(MAX_HELD, len(ids)) + 1):
        head = decode(ids[:-held])
        if not head.endswith(REPLACEMENT):
            return head, held
    return text, 0
