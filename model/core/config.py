"""One dataclass holds every size and switch of the model (nanoGPT style)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

ACTIVATIONS = ("relu", "gelu")
POSITIONALS = ("sinusoidal", "learned")


class DictConfig:
    """to_dict / from_dict for a config dataclass (saved as JSON beside weights and in trace metadata)."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)} for {cls.__name__}; known keys: {sorted(known)}")
        return cls(**d)


@dataclass(frozen=True)
class TransformerConfig(DictConfig):
    src_vocab_size: int
    tgt_vocab_size: int = 0  # 0 with n_decoder_layers=0: an encoder-only model (BERT family)
    d_model: int = 512  # E = N x H: all heads side by side
    n_heads: int = 8
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    max_len: int = 512
    pad_id: int = 0
    norm_first: bool = False  # False = post-LN (paper), True = pre-LN
    activation: str = "relu"  # or "gelu" (exact, erf)
    positional: str = "sinusoidal"  # or "learned"
    layer_norm_eps: float = 1e-5
    tie_generator: bool = False  # generator.weight is tgt_embed.tok.weight (paper, section 3.4)
    share_embeddings: bool = False  # src_embed.tok is tgt_embed.tok (needs one shared vocabulary)
    scale_embedding: bool = True  # token embedding x sqrt(d_model); BERT does not scale
    n_token_types: int = 0  # BERT's segment embeddings; 0 = none
    embed_norm: bool = False  # LayerNorm after the embedding sum (BERT)

    def __post_init__(self) -> None:
        def positive(field: str) -> None:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{field} must be a positive integer, got {value!r}")

        for field in ("src_vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            positive(field)
        for field in ("n_encoder_layers", "n_decoder_layers", "tgt_vocab_size", "n_token_types"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{field} must be a non-negative integer, got {value!r}")
        if self.n_encoder_layers == 0:
            raise ValueError("n_encoder_layers must be at least 1")
        if self.n_decoder_layers > 0 and self.tgt_vocab_size == 0:
            raise ValueError("a decoder needs tgt_vocab_size > 0 (or set n_decoder_layers=0 for encoder-only)")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}): "
                f"each head gets d_model / n_heads dimensions; try n_heads in "
                f"{[h for h in range(1, 17) if self.d_model % h == 0]}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.positional not in POSITIONALS:
            raise ValueError(f"positional must be one of {POSITIONALS}, got {self.positional!r}")
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions pair sin/cos dimensions: d_model ({self.d_model}) must be even")
        if not 0 <= self.pad_id < self.src_vocab_size:
            raise ValueError(f"pad_id ({self.pad_id}) must be a valid source token id (< {self.src_vocab_size})")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError("share_embeddings needs src_vocab_size == tgt_vocab_size (one shared vocabulary)")
        if (self.tie_generator or self.share_embeddings) and self.n_decoder_layers == 0:
            raise ValueError("tie_generator/share_embeddings need a decoder (n_decoder_layers > 0)")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def encoder_only(self) -> bool:
        return self.n_decoder_layers == 0

