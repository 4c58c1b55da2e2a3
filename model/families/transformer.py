"""The Transformer of "Attention Is All You Need", instrumented.

Module tree mirrors torch.nn.Transformer (weights map one to one): src_embed, tgt_embed,
encoder.layers[i].{self_attn, ffn.linear1, ffn.linear2, norm1, norm2},
decoder.layers[i].{self_attn, cross_attn, ffn.*, norm1, norm2, norm3}, optional
encoder.norm / decoder.norm (pre-LN), generator. Every tensor a teacher points at goes
through `record(name, tensor)`; names are module path + role (see DESIGN.md).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from model.core import recorder
from model.core.attention import MultiHeadAttention, attention_mask, causal_mask, padding_mask
from model.core.config import TransformerConfig
from model.core.describe import describe_transformer
from model.core.layers import FeedForward, LayerNorm, sinusoidal_encoding
from model.core.recorder import Hook, record
from model.core.trace import Trace


class Embeddings(nn.Module):
    """Token embedding x √d_model + positional encoding (+ token type, + LayerNorm for BERT), then dropout."""

    def __init__(self, vocab_size: int, cfg: TransformerConfig, side: str):
        super().__init__()
        self.side, self.max_len = side, cfg.max_len  # side: "encoder" or "decoder" (capture names)
        self.tok = nn.Embedding(vocab_size, cfg.d_model)
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        if cfg.positional == "learned":
            self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        else:
            self.register_buffer("pe", sinusoidal_encoding(cfg.max_len, cfg.d_model), persistent=False)
        self.token_type = nn.Embedding(cfg.n_token_types, cfg.d_model) if cfg.n_token_types else None
        self.norm = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.embed_norm else None
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, ids: torch.Tensor, offset: int = 0, token_type_ids: torch.Tensor | None = None):
        L = ids.shape[1]
        if offset + L > self.max_len:
            raise ValueError(f"sequence of {offset + L} tokens is longer than max_len={self.max_len}")
        s = self.side
        tok = record(f"{s}.embed.tok", self.tok(ids) * self.scale)  # (B, L, D)
        pos = self.pos.weight[offset:offset + L] if hasattr(self, "pos") else self.pe[offset:offset + L]
        x = tok + record(f"{s}.embed.pos", pos)  # (L, D), broadcast over the batch
        if self.token_type is not None:
            types = self.token_type(torch.zeros_like(ids) if token_type_ids is None else token_type_ids)
            x = x + record(f"{s}.embed.type", types)
        if self.norm is not None:
            x = self.norm(x)
        return record(f"{s}.embed.out", self.dropout(x))

    def capture_points(self, B: int, L: int) -> dict[str, tuple[int, ...]]:
        s, D = self.side, self.tok.embedding_dim
        pts = {f"{s}.embed.tok": (B, L, D), f"{s}.embed.pos": (L, D)}
        if self.token_type is not None:
            pts[f"{s}.embed.type"] = (B, L, D)
        if self.norm is not None:
            pts |= self.norm.capture_points(B, L)
        return pts | {f"{s}.embed.out": (B, L, D)}


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.dropout)
        self.norm1 = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm2 = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout1, self.dropout2 = nn.Dropout(cfg.dropout), nn.Dropout(cfg.dropout)
        self.name = "encoder.layers.?"

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.norm_first:  # pre-LN: x + Sublayer(LayerNorm(x))
            h = self.norm1(x)
            x = x + self.dropout1(self.self_attn(h, h, mask))
            x = x + self.dropout2(self.ffn(self.norm2(x)))
        else:  # post-LN (paper): LayerNorm(x + Sublayer(x))
            x = self.norm1(x + self.dropout1(self.self_attn(x, x, mask)))
            x = self.norm2(x + self.dropout2(self.ffn(x)))
        return record(f"{self.name}.out", x)

    def capture_points(self, B: int, S: int) -> dict[str, tuple[int, ...]]:
        attn, ffn = self.self_attn.capture_points(B, S, S), self.ffn.capture_points(B, S)
        n1, n2 = self.norm1.capture_points(B, S), self.norm2.capture_points(B, S)
        order = (n1, attn, n2, ffn) if self.norm_first else (attn, n1, ffn, n2)
        return _merge(*order) | {f"{self.name}.out": (B, S, self.ffn.linear2.out_features)}


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.dropout)
        self.norm1 = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm2 = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.norm3 = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.dropout1, self.dropout2, self.dropout3 = (nn.Dropout(cfg.dropout) for _ in range(3))
        self.name = "decoder.layers.?"

    def forward(self, y, memory, self_mask, cross_mask, cache: dict | None = None) -> torch.Tensor:
        sc = cc = None
        if cache is not None:
            sc, cc = cache.setdefault("self", {}), cache.setdefault("cross", {})
        # Encoder-decoder attention: Q from the decoder, K and V from the encoder output (memory).
        if self.norm_first:
            h = self.norm1(y)
            y = y + self.dropout1(self.self_attn(h, h, self_mask, sc))
            y = y + self.dropout2(self.cross_attn(self.norm2(y), memory, cross_mask, cc, static_kv=True))
            y = y + self.dropout3(self.ffn(self.norm3(y)))
        else:
            y = self.norm1(y + self.dropout1(self.self_attn(y, y, self_mask, sc)))
            y = self.norm2(y + self.dropout2(self.cross_attn(y, memory, cross_mask, cc, static_kv=True)))
            y = self.norm3(y + self.dropout3(self.ffn(y)))
        return record(f"{self.name}.out", y)

    def capture_points(self, B: int, T: int, S: int) -> dict[str, tuple[int, ...]]:
        sa, ca = self.self_attn.capture_points(B, T, T), self.cross_attn.capture_points(B, T, S)
        ffn = self.ffn.capture_points(B, T)
        n1, n2, n3 = (n.capture_points(B, T) for n in (self.norm1, self.norm2, self.norm3))
        order = (n1, sa, n2, ca, n3, ffn) if self.norm_first else (sa, n1, ca, n2, ffn, n3)
        return _merge(*order) | {f"{self.name}.out": (B, T, self.ffn.linear2.out_features)}


class Encoder(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        # Pre-LN leaves the residual stream un-normalised: one final LayerNorm before the next stage.
        self.norm = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        if self.norm is not None:
            x = self.norm(x)
        return record("encoder.out", x)

    def capture_points(self, B: int, S: int) -> dict[str, tuple[int, ...]]:
        pts = _merge(*(layer.capture_points(B, S) for layer in self.layers))
        if self.norm is not None:
            pts |= self.norm.capture_points(B, S)
        return pts | {"encoder.out": (B, S, _width(self))}


class Decoder(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        self.norm = LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else None

    def forward(self, y, memory, self_mask, cross_mask, cache: list[dict] | None = None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            y = layer(y, memory, self_mask, cross_mask, None if cache is None else cache[i])
        if self.norm is not None:
            y = self.norm(y)
        return record("decoder.out", y)

    def capture_points(self, B: int, T: int, S: int) -> dict[str, tuple[int, ...]]:
        pts = _merge(*(layer.capture_points(B, T, S) for layer in self.layers))
        if self.norm is not None:
            pts |= self.norm.capture_points(B, T)
        return pts | {"decoder.out": (B, T, _width(self))}


def _merge(*dicts: dict) -> dict:
    out: dict = {}
    for d in dicts:
        out |= d
    return out


def _width(stack: nn.Module) -> int:
    """d_model of an encoder/decoder stack (read from its first LayerNorm)."""
    return next(m for m in stack.modules() if isinstance(m, nn.LayerNorm)).normalized_shape[0]


class Transformer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.src_embed = Embeddings(cfg.src_vocab_size, cfg, "encoder")
        self.encoder = Encoder(cfg)
        if not cfg.encoder_only:
            self.tgt_embed = Embeddings(cfg.tgt_vocab_size, cfg, "decoder")
            self.decoder = Decoder(cfg)
            self.generator = nn.Linear(cfg.d_model, cfg.tgt_vocab_size)
        self._init_weights()
        if not cfg.encoder_only:
            if cfg.share_embeddings:
                self.tgt_embed.tok = self.src_embed.tok
            if cfg.tie_generator:  # the paper shares the target embedding and the pre-softmax matrix
                self.generator.weight = self.tgt_embed.tok.weight
        for path, module in self.named_modules():  # capture names = module path + role
            if isinstance(module, MultiHeadAttention | FeedForward | EncoderLayer | DecoderLayer | LayerNorm):
                # the embeddings record as "encoder.embed.*" / "decoder.embed.*" (see Embeddings)
                module.name = path.replace("src_embed", "encoder.embed").replace("tgt_embed", "decoder.embed")

    def _init_weights(self) -> None:
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    # ------------------------------------------------------------------ stages

    def encode(self, src: torch.Tensor, token_type_ids: torch.Tensor | None = None):
        """(B, S) ids -> memory (B, S, D) and the source padding mask (B, S)."""
        src_pad = record("masks.src_pad", padding_mask(src, self.cfg.pad_id))
        x = self.src_embed(src, token_type_ids=token_type_ids)
        return self.encoder(x, attention_mask(src_pad, src.shape[1])), src_pad

    def decode(self, tgt, memory, src_pad, cache: list[dict] | None = None, offset: int = 0) -> torch.Tensor:
        """(B, T) target ids -> logits (B, T, V). Teacher forcing: all positions in one parallel pass,
        the look-ahead mask keeps position t from seeing t+1... With `cache`, `tgt` holds only the new
        tokens, at absolute positions offset.. (their keys and values are appended to the cache)."""
        T = tgt.shape[1]
        tgt_pad = record("masks.tgt_pad", padding_mask(tgt, self.cfg.pad_id))
        future = record("masks.causal", causal_mask(T, offset=offset, device=tgt.device))  # (T, offset + T)
        if cache is not None and offset:
            tgt_pad = torch.cat([cache[0]["pad"], tgt_pad], dim=1)  # padding of every key so far
        if cache is not None:
            cache[0]["pad"] = tgt_pad
        y = self.tgt_embed(tgt, offset=offset)
        self_mask = attention_mask(tgt_pad, T, future)
        cross_mask = attention_mask(src_pad, T)
        y = self.decoder(y, memory, self_mask, cross_mask, cache)
        return record("logits", self.generator(y))  # (B, T, V)

    def new_cache(self) -> list[dict]:
        return [{} for _ in range(self.cfg.n_decoder_layers)]

    def forward(self, src, tgt=None, token_type_ids=None) -> torch.Tensor:
        """Logits (B, T, tgt_vocab); for an encoder-only model, the encoder output (B, S, D)."""
        self._check_ids(src, self.cfg.src_vocab_size, "source")
        memory, src_pad = self.encode(src, token_type_ids)
        if self.cfg.encoder_only:
            return memory
        if tgt is None:
            raise ValueError("an encoder-decoder model needs target ids (tgt) too")
        self._check_ids(tgt, self.cfg.tgt_vocab_size, "target")
        return self.decode(tgt, memory, src_pad)

    def _check_ids(self, ids: torch.Tensor, vocab: int, side: str) -> None:
        if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{side} ids must be an integer tensor of shape (batch, length), got "
                             f"{tuple(ids.shape)} {ids.dtype}")
        if ids.shape[1] == 0:
            raise ValueError(f"{side} sequence is empty")
        if ids.shape[1] > self.cfg.max_len:
            raise ValueError(f"{side} sequence has {ids.shape[1]} tokens; this model's limit is "
                             f"max_len={self.cfg.max_len}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise ValueError(f"{side} ids must be in [0, {vocab}); got ids in "
                             f"[{int(ids.min())}, {int(ids.max())}] (does the tokenizer match the model?)")

    # ------------------------------------------------------------------ capture

    def capture_names(self, B: int = 1, S: int = 1, T: int = 1) -> dict[str, tuple[int, ...]]:
        """Every capture (and hook) point of a forward pass on (B, S) source and (B, T) target ids, in
        computation order, with its shape: walked from the module tree, each module listing its own."""
        pts = {"masks.src_pad": (B, S)} | self.src_embed.capture_points(B, S) | self.encoder.capture_points(B, S)
        if self.cfg.encoder_only or not T:
            return pts
        pts |= {"masks.tgt_pad": (B, T), "masks.causal": (T, T)}
        pts |= self.tgt_embed.capture_points(B, T) | self.decoder.capture_points(B, T, S)
        return pts | {"logits": (B, T, self.cfg.tgt_vocab_size)}

    def resolve_hooks(self, hooks: Mapping[str, Hook | list[Hook]] | None) -> dict[str, list[Hook]]:
        """{glob: fn} -> {capture name: [fn]}; a glob that matches no point is an error listing them."""
        return recorder.resolve_hooks(list(self.capture_names()), hooks)

    def hooks(self, hooks: Mapping[str, Hook | list[Hook]] | None) -> recorder.hooking:
        """`with model.hooks({"decoder.layers.1.cross_attn.z": fn}):` every forward pass inside it
        (of any model, in this thread/context only) runs under the hooks; see DESIGN.md "Hooks"."""
        return recorder.hooking(self.resolve_hooks(hooks))

    def run_with_hooks(self, src, tgt=None, hooks=None, token_type_ids=None) -> torch.Tensor:
        """forward(src, tgt) with `hooks` ({glob: fn(tensor, name) -> tensor | None}) in effect."""
        with self.hooks(hooks):
            return self(src, tgt, token_type_ids=token_type_ids)

    def run_with_trace(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor | None = None,
        names: str | Sequence[str] | None = None,
        budget_bytes: int | None = recorder.DEFAULT_BUDGET_BYTES,
        token_type_ids: torch.Tensor | None = None,
        meta: dict | None = None,
        hooks: Mapping[str, Hook | list[Hook]] | None = None,
    ) -> tuple[torch.Tensor, Trace]:
        """Forward pass recording the named tensors (None = all; fnmatch globs). Same math path as
        forward, so the logits are bit-identical. Refuses, before running, a capture over budget_bytes.
        With `hooks`, the model continues with what they return and the trace records that."""
        B, S = src.shape
        T = 0 if tgt is None or self.cfg.encoder_only else tgt.shape[1]
        shapes = self.capture_names(B, S, T)
        wanted = recorder.select_names(list(shapes), names)
        itemsize = next(self.parameters()).element_size()
        n_bytes = recorder.estimate_bytes(shapes, wanted, itemsize)
        recorder.check_budget(n_bytes, budget_bytes)
        # The trace is copied into one reusable block of that size (+ 64-byte alignment per name):
        # see recorder._Block for why.
        with self.hooks(hooks), recorder.capturing(set(wanted), n_bytes + 64 * len(wanted)) as rec:
            out = self(src, tgt, token_type_ids=token_type_ids)
        info = {
            "config": self.cfg.to_dict(),
            "model": self.describe(),
            "src_ids": src.tolist(),
            "tgt_ids": None if tgt is None else tgt.tolist(),
            "mask_convention": "True = blocked (attention not allowed)",
            "training": self.training,
            "dtype": str(out.dtype).removeprefix("torch."),
            "versions": _versions(),
        }
        if hooks:
            info["hooks"] = {pattern: getattr(fn, "__name__", repr(fn)) if callable(fn) else repr(fn)
                             for pattern, fn in hooks.items()}
        info.update(meta or {})
        return out, Trace({n: rec.tensors[n] for n in wanted if n in rec.tensors}, info)

    def describe(self) -> dict:
        """Stacks and attention modules (kind, query/key token sides): see model/core/describe.py."""
        return describe_transformer(self.cfg.to_dict())

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


@functools.lru_cache(maxsize=32)
def _skeleton(cfg: TransformerConfig) -> Transformer:
    """The module tree of `cfg` on the meta device: no weights, no memory, built once per config."""
    with torch.device("meta"):
        return Transformer(cfg)


def capture_shapes(cfg: TransformerConfig, B: int, S: int, T: int = 0) -> dict[str, tuple[int, ...]]:
    """Every capture name of one forward pass on (B, S) source and (B, T) target ids, in computation
    order, with its shape, walked from the module tree (so it cannot disagree with the `record` calls)."""
    return _skeleton(cfg).capture_names(B, S, T)


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    try:
        lab = version("attention-lab")
    except PackageNotFoundError:
        lab = "unknown"
    return {"torch": torch.__version__.split("+")[0], "attention_lab": lab}


def label_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, pad_id: int, smoothing: float = 0.1):
    """Cross-entropy over non-PAD positions, with label smoothing (paper: ε_ls = 0.1).

    logits (B, T, V), target (B, T). PAD positions contribute nothing to the loss or its mean.
    """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                           ignore_index=pad_id, label_smoothing=smoothing)
