"""Tokenizers: text <-> ids, on top of Hugging Face `tokenizers`.

Two kinds, as the seeds teach:
- "char": every character is one token (Chinese is best tokenized by character; the toy
  tasks' sources are short strings where one symbol = one token makes attention readable).
- "wordpiece": BERT's subword scheme for English (NFD + lowercase + strip accents, split on
  whitespace and punctuation, "##" marks a piece that continues a word).

Special tokens have fixed ids in both kinds: [PAD]=0 (the model's pad_id), [UNK]=1,
[CLS]=2, [SEP]=3, [MASK]=4, [BOS]=5, [EOS]=6. They are *not* registered as HF "added
tokens": user text is always taken literally, so typing "[PAD]" can never inject id 0.

A tokenizer is saved as the plain HF tokenizer.json; its kind is recovered from the model
type inside it (WordLevel -> "char", WordPiece -> "wordpiece").
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal, NamedTuple

from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

Kind = Literal["char", "wordpiece"]

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[BOS]", "[EOS]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID, BOS_ID, EOS_ID = range(len(SPECIALS))
# Ids dropped by decode(). [UNK] is kept so that nothing is silently lost from the output.
_SKIP_ON_DECODE = frozenset({PAD_ID, CLS_ID, SEP_ID, MASK_ID, BOS_ID, EOS_ID})
_MODEL_KIND: dict[str, Kind] = {"WordLevel": "char", "WordPiece": "wordpiece"}


class Piece(NamedTuple):
    """One token of an encoded text, for display: `text[span[0]:span[1]]` is what it covers."""

    token: str
    id: int
    span: tuple[int, int]
    is_unk: bool


class Tokenizer:
    """A char or WordPiece tokenizer with the project's fixed special ids."""

    pad_id = PAD_ID
    unk_id = UNK_ID
    cls_id = CLS_ID
    sep_id = SEP_ID
    mask_id = MASK_ID
    bos_id = BOS_ID
    eos_id = EOS_ID

    def __init__(self, hf: HFTokenizer):
        self.kind: Kind = _check(hf)
        self._hf = hf

    # ---- builders -------------------------------------------------------------------

    @classmethod
    def train_char(cls, texts: Iterable[str]) -> Tokenizer:
        """One token per character seen in `texts` (space included), ids in code point order.

        No normalizer: encode/decode round-trip exactly, and characters never seen (emoji,
        control characters, newlines unless trained on) become [UNK] rather than vanishing.
        """
        chars = sorted({c for t in texts for c in t})
        vocab = {tok: i for i, tok in enumerate(SPECIALS)}
        for c in chars:
            vocab.setdefault(c, len(vocab))
        hf = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        # [\s\S] matches any single code point, newline included (onig's "." does not).
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        hf.decoder = decoders.Fuse()  # concatenate tokens with nothing in between
        return cls(hf)

    @classmethod
    def train_wordpiece(cls, texts: Iterable[str], vocab_size: int = 300) -> Tokenizer:
        """Learn a WordPiece vocabulary (lowercased, accents stripped) of at most `vocab_size`.

        Whitespace only separates words here: it is not a token, and decode() joins words
        with single spaces. Meant for English; use train_char for Chinese (StripAccents and
        whitespace splitting make no sense there). Deterministic: same texts, same vocab.
        Out-of-vocabulary input: emoji and control characters are split off as their own
        words and become [UNK]; a word with a character never seen in training becomes a
        single [UNK] (WordPiece's rule). Tabs and newlines are whitespace, i.e. separators.
        """
        if vocab_size <= len(SPECIALS):
            raise ValueError(f"vocab_size must exceed the {len(SPECIALS)} special tokens, got {vocab_size}")
        normalizer, pre_tokenizer = _wordpiece_normalizer(), pre_tokenizers.Whitespace()
        words: Counter[str] = Counter()
        for text, n in Counter(texts).items():
            for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)):
                words[word] += n
        vocab = _learn_wordpiece(words, vocab_size)
        hf = HFTokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
        hf.normalizer, hf.pre_tokenizer = normalizer, pre_tokenizer
        # cleanup=False: HF's cleanup rewrites English (" do not" -> " don't", " ." -> "."),
        # which would break the exact round-trip of the toy targets.
        hf.decoder = decoders.WordPiece(prefix="##", cleanup=False)
        return cls(hf)

    # ---- encode / decode ------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, without [BOS]/[EOS]. Unknown characters or words become [UNK]."""
        return self._encode(text).ids

    def encode_with_specials(self, text: str, bos: bool = True, eos: bool = True) -> list[int]:
        """Ids of `text` framed as the model sees them: [BOS] ... [EOS]."""
        return [BOS_ID] * bos + self.encode(text) + [EOS_ID] * eos

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, dropping [PAD]/[BOS]/[EOS]/[CLS]/[SEP]/[MASK] but showing [UNK]."""
        ids = [i for i in self._check_ids(ids) if i not in _SKIP_ON_DECODE]
        return self._hf.decode(ids, skip_special_tokens=False)

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """Token strings of `ids` for display (specials included, e.g. "[UNK]", "##ing")."""
        return [self._hf.id_to_token(i) for i in self._check_ids(ids)]

    def pieces(self, text: str) -> list[Piece]:
        """Per-token (token, id, (start, end) character span in `text`, is_unk) for the UI."""
        enc = self._encode(text)
        return [
            Piece(tok, i, (int(a), int(b)), i == UNK_ID)
            for tok, i, (a, b) in zip(enc.tokens, enc.ids, enc.offsets, strict=True)
        ]

    def id_to_token(self, i: int) -> str:
        return self.tokens([i])[0]

    def token_to_id(self, token: str) -> int | None:
        """Id of an exact vocabulary entry (e.g. "a", "##ing", "[EOS]"), or None."""
        return self._hf.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size})"

    # ---- persistence ----------------------------------------------------------------

    def to_str(self) -> str:
        """The HF tokenizer.json content (e.g. to embed in a checkpoint's metadata)."""
        return self._hf.to_str()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_str(), encoding="utf-8")

    @classmethod
    def from_str(cls, text: str, source: str = "tokenizer JSON") -> Tokenizer:
        """Parse tokenizer.json content; ValueError (never a Rust panic) if it is not ours."""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{source} is not valid JSON ({e}); expected a tokenizer.json") from None
        model = data.get("model") if isinstance(data, dict) else None
        model_type = model.get("type") if isinstance(model, dict) else None
        if not isinstance(model_type, str):
            raise ValueError(f"{source} is JSON but not a Hugging Face tokenizer.json (no model.type)")
        if model_type not in _MODEL_KIND:
            raise ValueError(
                f"{source} holds a {model_type} tokenizer; expected a char (WordLevel) "
                "or WordPiece tokenizer made by model.tokenizer"
            )
        try:
            hf = HFTokenizer.from_str(text)
        except Exception as e:  # the Rust side raises plain Exception with a serde message
            raise ValueError(f"{source} is a corrupt tokenizer.json: {e}") from None
        return cls(hf)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ValueError(f"tokenizer file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read tokenizer file {path}: {e}") from None
        return cls.from_str(text, source=f"tokenizer file {path}")

    # ---- internals ------------------------------------------------------------------

    def _encode(self, text: str):
        if not isinstance(text, str):
            raise TypeError(f"expected text as str, got {type(text).__name__}")
        return self._hf.encode(text, add_special_tokens=False)

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        ids = [int(i) for i in ids]  # accepts numpy / torch integer scalars too
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        return ids


def _wordpiece_normalizer() -> normalizers.Normalizer:
    return normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase(), normalizers.StripAccents()])


def _learn_wordpiece(words: Counter[str], vocab_size: int) -> list[str]:
    """Vocabulary by greedy merges of the most frequent adjacent pair, as HF's WordPieceTrainer.

    Reimplemented (the corpora here are tiny) because HF's trainer breaks ties between
    equally frequent pairs in hash-map order, so its vocabulary changes from run to run.
    Here ties go to the alphabetically first pair. "##" marks a piece inside a word.
    """
    splits = {w: [w[0]] + ["##" + c for c in w[1:]] for w in words}
    alphabet = sorted({p for ps in splits.values() for p in ps}, key=lambda p: (p.startswith("##"), p))
    vocab = list(SPECIALS) + alphabet
    known = set(vocab)
    while len(vocab) < vocab_size:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, ps in splits.items():
            for pair in zip(ps, ps[1:], strict=False):
                pairs[pair] += words[w]
        if not pairs:
            break  # every word is a single token
        a, b = min(pairs, key=lambda p: (-pairs[p], p))
        merged = a + b[2:]
        if merged not in known:
            vocab.append(merged)
            known.add(merged)
        for w, ps in splits.items():
            out, i = [], 0
            while i < len(ps):
                if i + 1 < len(ps) and ps[i] == a and ps[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(ps[i])
                    i += 1
            splits[w] = out
    return vocab


def _check(hf: HFTokenizer) -> Kind:
    """The kind of `hf`, after checking it carries our special tokens at their fixed ids."""
    model_type = type(hf.model).__name__
    if model_type not in _MODEL_KIND:
        raise ValueError(f"unsupported tokenizer model {model_type}; expected WordLevel (char) or WordPiece")
    for i, tok in enumerate(SPECIALS):
        found = hf.token_to_id(tok)
        if found != i:
            raise ValueError(
                f"not an Attention Lab tokenizer: special token {tok} should have id {i}, found {found}"
            )
    return _MODEL_KIND[model_type]
