"""A `tokenizers.Tokenizer` built from a GGUF file's metadata (no tokenizer.json needed).

llama.cpp keeps the tokenizer as metadata: `tokenizer.ggml.model` ("gpt2" = byte-level BPE), the
tokens (already spelled in GPT-2's byte alphabet: Ġ is a space, Ċ a newline), the merges ("Ġ t"),
each token's type (3 = control, e.g. <|im_end|>; 4 = user-defined), the special ids, and
`tokenizer.ggml.pre`, the name of the pre-tokenizer (the regex that cuts text into words before
BPE). The regexes below are llama.cpp's (llama-vocab.cpp, `regex_exprs` per pre-type), so ids
match llama.cpp and the model's original tokenizer.json.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
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
    """Byte-level BPE from tokens + merges, with the file's pre-tokenizer, special tokens and BOS rule."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"{name}: tokenizer {kind!r} is not supported (byte-level BPE, 'gpt2', is).")
    tokens = metadata.get("tokenizer.ggml.tokens")
    merges = metadata.get("tokenizer.ggml.merges")
    if not isinstance(tokens, list) or not tokens or not isinstance(merges, list):
        raise GGUFError(f"{name}: the tokenizer metadata (tokens, merges) is missing.")
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        supported = ", ".join(sorted(PRE_TOKENIZERS))
        raise GGUFError(f"{name}: pre-tokenizer {pre!r} is not supported; supported: {supported}.")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = []
    for m in merges:
        left, sep, right = m.partition(" ")
        if not sep:
            raise GGUFError(f"{name}: merge {m!r} is not two tokens separated by a space.")
        pairs.append((left, right))
    try:
        tok = Tokenizer(BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    except Exception as e:  # tokenizers raises plain Exception on a merge naming an unknown token
        raise GGUFError(f"{name}: the tokenizer's merges do not fit its tokens ({e}).") from e
    splits = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in PRE_TOKENIZERS[pre]]
    tok.pre_tokenizer = pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                   use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise GGUFError(f"{name}: {len(types)} token types for {len(tokens)} tokens.")
    special = [AddedToken(t, special=True, normalized=False)
               for t, k in zip(tokens, types, strict=True) if k == CONTROL]
    user = [AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, types, strict=True) if k == USER_DEFINED]
    tok.add_special_tokens(special)
    tok.add_tokens(user)
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    if metadata.get("tokenizer.ggml.add_bos_token") and isinstance(bos, int) and 0 <= bos < len(tokens):
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B", special_tokens=[(tokens[bos], bos)])
    return tok
