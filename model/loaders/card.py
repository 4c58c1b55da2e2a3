"""What a loaded language model IS, from its own file: the facts a page's label and its warnings need.

    card = model_card(lm)   # ModelCard(name='SmolLM2-135M-Instruct', file_format='GGUF', quantization='Q4_1',
                            #           compute_dtype='float32', languages=('en',), licence='apache-2.0', ...)
    rule = bos_rule(lm)     # BosRule(prepended=False, token='<|im_start|>', source='gguf')

A GGUF file says how its weights were stored (`general.file_type`, else the tensors' own types: the type
that holds most of the weights) and, often, which languages the model was trained on (`general.languages`).
We dequantize every tensor to float32 on load, so a quantized model runs here with its rounded weights in
full precision. A Hugging Face directory says neither: `quantization` None, `languages` () (unknown, not
"none").

The licence is the file's `general.license` (Gemma's "gemma" is named: the Gemma Terms of Use, with its address).
The BOS rule is the model's own: a GGUF's `tokenizer.ggml.add_bos_token` (a SentencePiece file that does not
say gets BOS, as llama.cpp and transformers give it), a Hugging Face directory's tokenizer post-processor.
`bos_rule` reads what the loaded tokenizer does, and says where that rule came from.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# llama.cpp's general.file_type (enum llama_ftype): the type that holds most weights.
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
              18: "Q6_K", 32: "BF16"}
FULL_PRECISION = ("F32", "F16", "BF16")
# general.license values with a name and an address of their own
LICENCES = {"gemma": ("Gemma Terms of Use", "https://ai.google.dev/gemma/terms")}


@dataclass(frozen=True)
class ModelCard:
    name: str  # the model's name as loaded ("SmolLM2-135M-Instruct")
    file_format: str | None  # "GGUF", "Hugging Face" or None (built in memory)
    quantization: str | None  # the weights' storage type when quantized ("Q4_1"); None when full precision
    compute_dtype: str  # what the weights are in while we run them ("float32")
    languages: tuple[str, ...]  # general.languages (ISO 639-1 codes); () when the file does not say
    licence: str | None = None  # general.license as named ("Gemma Terms of Use", "apache-2.0"); None: unsaid
    licence_url: str | None = None  # where a named licence lives (LICENCES)
    add_bos: bool | None = None  # GGUF tokenizer.ggml.add_bos_token; None when the file does not say
    tokenizer_model: str | None = None  # GGUF tokenizer.ggml.model: "gpt2" (byte-level BPE), "llama" (SentencePiece)

    @property
    def quantized(self) -> bool:
        return self.quantization is not None

    def speaks(self, lang: str) -> bool | None:
        """Whether the model was trained on language `lang` ("zh"); None when its file does not say."""
        if not self.languages:
            return None
        return lang.split("-")[0].lower() in {x.split("-")[0].lower() for x in self.languages}


@lru_cache(maxsize=16)
def _gguf_facts(path: str, mtime: float) -> dict:
    from model.loaders.gguf import read_gguf

    g = read_gguf(path)
    try:
        meta = g.metadata
        ftype = meta.get("general.file_type")
        kind = FILE_TYPES.get(ftype) if isinstance(ftype, int) else None
        if kind is None:  # no or unknown file_type: the type holding the most weights
            by_type: Counter[str] = Counter()
            for info in g.tensors.values():
                by_type[info.type_name] += info.n_elements
            kind = by_type.most_common(1)[0][0] if by_type else None
        langs = meta.get("general.languages")
        langs = tuple(str(x) for x in langs) if isinstance(langs, list) else ()
        lic = meta.get("general.license")
        licence, url = LICENCES.get(lic, (lic, None)) if isinstance(lic, str) and lic.strip() else (None, None)
        bos = meta.get("tokenizer.ggml.add_bos_token")
        tok = meta.get("tokenizer.ggml.model")
    finally:
        g.data = None  # drop the memory map
    return dict(quantization=None if kind in FULL_PRECISION else kind, languages=langs, licence=licence,
                licence_url=url, add_bos=bos if isinstance(bos, bool) else None,
                tokenizer_model=tok if isinstance(tok, str) else None)


def model_card(lm) -> ModelCard:
    """The card of a LanguageModel (its `source` file, when it has one, is read once per path and mtime)."""
    model = getattr(lm, "model", lm)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    name = getattr(lm, "name", type(model).__name__)
    source = getattr(lm, "source", None)
    if source is None:
        return ModelCard(name, None, None, dtype, ())
    path = Path(source)
    if path.suffix.lower() == ".gguf" and path.is_file():
        return ModelCard(name, "GGUF", compute_dtype=dtype, **_gguf_facts(str(path), path.stat().st_mtime))
    return ModelCard(name, "Hugging Face", None, dtype, ())


@dataclass(frozen=True)
class BosRule:
    """Whether this model's tokenizer puts a BOS token in front of a text, and whose rule that is."""

    prepended: bool  # encode(text) starts with the BOS token
    token: str | None  # the BOS token's text ("<bos>"); None when the model names none
    source: str  # "gguf": the file's add_bos_token; "gguf-default": the file does not say (SentencePiece: BOS,
                 # byte-level: none); "post-processor": the tokenizer's own (a Hugging Face directory); "none": no
                 # tokenizer
    flag: bool | None = None  # the GGUF flag as written, when source == "gguf"


def bos_rule(lm) -> BosRule:
    """The BOS rule of a LanguageModel as its tokenizer applies it (read by encoding a letter), with its source."""
    tok = getattr(lm, "tokenizer", None)
    bos = (getattr(lm, "special_tokens", None) or {}).get("bos_token")
    if tok is None:
        return BosRule(False, bos, "none")
    bos_id = tok.token_to_id(bos) if bos else None
    ids = tok.encode("a").ids
    prepended = bos_id is not None and len(ids) > 1 and ids[0] == bos_id
    card = model_card(lm)
    if card.file_format == "GGUF":
        if card.add_bos is not None:
            return BosRule(prepended, bos, "gguf", card.add_bos)
        return BosRule(prepended, bos, "gguf-default")
    return BosRule(prepended, bos, "post-processor")
