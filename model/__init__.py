"""Attention Lab's instrumented Transformer ("Attention Is All You Need"). No UI imports here.

The names below load on first use (PEP 562), so importing a light submodule (the pytest plugin
`model.snapshot`, auto-loaded into every pytest run) does not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "MultiHeadAttention": "attention", "attention_mask": "attention", "causal_mask": "attention",
    "padding_mask": "attention", "list_checkpoints": "checkpoint", "load_checkpoint": "checkpoint",
    "TransformerConfig": "config", "CaptureError": "recorder", "noam_lr": "schedule",
    "Trace": "trace", "TraceDiff": "trace", "TraceFileError": "trace", "compare_traces": "trace",
    "Transformer": "transformer", "label_smoothed_loss": "transformer", "sinusoidal_encoding": "transformer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
