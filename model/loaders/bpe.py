"""A `tokenizers.Tokenizer` built from a GGUF file's metadata (no tokenizer.json needed).

llama.cpp keeps the tokenizer as metadata: `tokenizer.ggml.model`, the tokens, each token's type
(3 = control, e.g. <|im_end|>; 4 = user-defined; 6 = byte), the special ids and BOS/EOS flags, and
- for "gpt2" (byte-level BPE: GPT-2, Llama 3, Qwen, SmolLM): the merges ("Ġ t", tokens already spelled in
  GPT-2's byte alphabet: Ġ is a space, Ċ a newline) and `tokenizer.ggml.pre`, the name of the pre-tokenizer
  (the regex that cuts text into words before BPE). The regexes below are llama.cpp's (llama-vocab.cpp,
  `regex_exprs` per pre-type), so ids match llama.cpp and the model's original tokenizer.json;
- for "llama" (SentencePiece BPE: Llama 2, Mistral, Gemma, Phi-3): a score per piece instead of merges
  (the merges are rebuilt from the scores), <0x..> byte tokens for characters outside the vocabulary, and
  ▁ for a space. Built as transformers builds it from a GGUF, so ids equal its tokenizer's.
Other tokenizer models (t5's unigram, BERT's WordPiece, RWKV...) are refused by name.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

from model.loaders.errors import GGUFError

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_DIGITS = r"\p{N}"

# tokenizer.ggml.pre -> the regexes llama.cpp applies in turn
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "default": (_GPT2,), "gpt2": (_GPT2,), "gpt-2": (_GPT2,),
    "smollm": (_DIGITS, _GPT2), "starcoder": (_DIGITS, _GPT2), "refact": (_DIGITS, _GPT2),
    "codeshell": (_DIGITS, _GPT2), "command-r": (_DIGITS, _GPT2),
    "llama3": (_LLAMA3,), "llama-v3": (_LLAMA3,), "llama-bpe": (_LLAMA3,), "smaug-bpe": (_LLAMA3,),
    "falcon3": (_LLAMA3,), "qwen2": (_QWEN2,), "deepseek-r1-qwen": (_QWEN2,),
}
CONTROL, USER_DEFINED = 3, 4


def tokenizer_from_gguf(metadata: dict, name: str = "GGUF") -> Tokenizer:
    """The file's tokenizer: byte-level BPE ("gpt2") or SentencePiece BPE ("llama"), with the file's special
    tokens and BOS rule. Any other tokenizer model is refused by name."""
    kind = metadata.get("tokenizer.ggml.model")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if kind not in ("gpt2", "llama"):
        raise GGUFError(f"{name}: tokenizer {kind!r} is not supported (byte-level BPE, 'gpt2', and "
                        "SentencePiece BPE, 'llama', are).")
    if not isinstance(tokens, list) or not tokens:
        raise GGUFError(f"{name}: the tokenizer metadata (tokens) is missing.")
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise GGUFError(f"{name}: {len(types)} token types for {len(tokens)} tokens.")
    tok = _byte_level(metadata, tokens, name) if kind == "gpt2" else _sentencepiece(metadata, tokens, name)
    special = [AddedToken(t, special=True, normalized=False)
               for t, k in zip(tokens, types, strict=True) if k == CONTROL]
    # A user-defined token is matched whole in the text, as spelled in the vocabulary the model reads: Gemma's
    # runs of spaces (user-defined, stored as "  ") are respelled "▁▁" in that vocabulary, so their raw
    # spelling is no token of it and is not added (it would get a new id past the embedding; transformers
    # skips them the same way). Text "  two" reaches them through the normalizer: ▁▁two -> ▁▁ two.
    vocab = tok.get_vocab()
    user = [AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, types, strict=True) if k == USER_DEFINED and t in vocab]
    tok.add_special_tokens(special)
    tok.add_tokens(user)
    # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise (transformers follows it)
    add_bos = metadata.get("tokenizer.ggml.add_bos_token", kind == "llama")
    add_eos = metadata.get("tokenizer.ggml.add_eos_token", False)
    ends = {}
    for key, wanted in (("bos", add_bos), ("eos", add_eos)):
        i = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if wanted is True and isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(tokens):
            ends[key] = (tokens[i], i)
    if ends:
        bos = f"{ends['bos'][0]} " if "bos" in ends else ""
        eos = f" {ends['eos'][0]}" if "eos" in ends else ""
        tok.post_processor = processors.TemplateProcessing(single=f"{bos}$A{eos}", pair=f"{bos}$A{eos} $B{eos}",
                                                           special_tokens=list(ends.values()))
    return tok


def _byte_level(metadata: dict, tokens: list[str], name: str) -> Tokenizer:
    """Byte-level BPE from tokens + merges, with the file's pre-tokenizer (GPT-2, Llama 3, Qwen2, SmolLM...)."""
    merges = metadata.get("tokenizer.ggml.merges")
    if not isinstance(merges, list):
        raise GGUFError(f"{name}: the tokenizer metadata (tokens, merges) is missing.")
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        supported = ", ".join(sorted(PRE_TOKENIZERS))
        raise GGUFError(f"{name}: pre-tokenizer {pre!r} is not supported; supported: {supported}.")
    try:
        tok = Tokenizer(BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=_pairs(merges, name), fuse_unk=False))
    except Exception as e:  # tokenizers raises plain Exception on a merge naming an unknown token
        raise GGUFError(f"{name}: the tokenizer's merges do not fit its tokens ({e}).") from e
    splits = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in PRE_TOKENIZERS[pre]]
    tok.pre_tokenizer = pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                   use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _pairs(merges: list[str], name: str) -> list[tuple[str, str]]:
    pairs = []
    for m in merges:
        left, sep, right = m.partition(" ")
        if not sep:
            raise GGUFError(f"{name}: merge {m!r} is not two tokens separated by a space.")
        pairs.append((left, right))
    return pairs


def _scored_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE keeps no merges, only each piece's score: every way to cut a piece into two
    pieces of the vocabulary is a merge, and the higher the piece's score, the earlier the merge applies
    (transformers' generate_merges, which its GGUF tokenizers use: same order, same ties)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece, score in zip(tokens, scores, strict=True):
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)  # stable: ties keep vocab order
    return [(left, right) for left, right, _ in merges]


def _sentencepiece(metadata: dict, tokens: list[str], name: str) -> Tokenizer:
    """SentencePiece BPE (Llama 2, Mistral, Gemma, Phi-3): spaces become ▁, pieces merge by score, and a
    character outside the vocabulary falls back to its UTF-8 bytes (<0x..> tokens). Built as transformers
    builds it from a GGUF (LlamaTokenizer, GemmaTokenizer, its Phi-3 variant), so ids match its tokenizer."""
    arch = metadata.get("general.architecture")
    gemma = arch in ("gemma", "gemma2", "gemma3")
    if gemma:  # Gemma stores its runs of spaces as spaces; the model's pieces spell them ▁▁...
        tokens = ["\u2581" * len(t) if t and not t.strip(" ") else t for t in tokens]
    merges = metadata.get("tokenizer.ggml.merges")
    if isinstance(merges, list) and merges:
        pairs = _pairs(merges, name)
    else:
        scores = metadata.get("tokenizer.ggml.scores")
        if gemma:  # Gemma's scores do not follow its merge order; the order of its tokens does
            scores = [-float(i) for i in range(len(tokens))]
        if not isinstance(scores, list) or len(scores) != len(tokens):
            raise GGUFError(f"{name}: a SentencePiece tokenizer needs one score per token (tokenizer.ggml.scores).")
        pairs = _scored_merges(tokens, scores)
    unk = metadata.get("tokenizer.ggml.unknown_token_id")
    unk_token = tokens[unk] if gemma and isinstance(unk, int) and 0 <= unk < len(tokens) else None
    try:
        tok = Tokenizer(BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs, fuse_unk=True,
                            byte_fallback=True, unk_token=unk_token))
    except Exception as e:  # tokenizers raises plain Exception on a merge naming an unknown token
        raise GGUFError(f"{name}: the tokenizer's merges do not fit its tokens ({e}).") from e
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:  # no space in front of the text; every space is a ▁
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    elif arch == "phi3":  # a ▁ in front of the text and for every space, even a leading one
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        steps.append(decoders.Strip(content=" ", left=1))
    else:  # Llama 2, Mistral: a ▁ in front of the first piece only
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        steps.append(decoders.Strip(content=" ", left=1))
    tok.decoder = decoders.Sequence(steps)
    return tok
