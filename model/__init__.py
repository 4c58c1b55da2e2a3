"""Attention Lab's instrumented Transformer ("Attention Is All You Need"). No UI imports here."""

from .attention import MultiHeadAttention, attention_mask, causal_mask, padding_mask
from .checkpoint import list_checkpoints, load_checkpoint
from .config import TransformerConfig
from .recorder import CaptureError
from .schedule import noam_lr
from .trace import Trace, TraceDiff, TraceFileError, compare_traces
from .transformer import Transformer, label_smoothed_loss, sinusoidal_encoding

__all__ = [
    "CaptureError", "MultiHeadAttention", "Trace", "TraceDiff", "TraceFileError", "Transformer",
    "TransformerConfig", "attention_mask", "causal_mask", "compare_traces", "label_smoothed_loss",
    "list_checkpoints", "load_checkpoint", "noam_lr", "padding_mask", "sinusoidal_encoding",
]
