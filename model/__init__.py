"""Attention Lab's instrumented Transformer ("Attention Is All You Need"). No UI imports here.

The names below load on first use (PEP 562), so importing a light submodule (the pytest plugin
`model.testing.snapshot`, auto-loaded into every pytest run) does not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "MultiHeadAttention": "core.attention", "attention_mask": "core.attention", "causal_mask": "core.attention",
    "padding_mask": "core.attention", "list_checkpoints": "toy.checkpoint", "load_checkpoint": "toy.checkpoint",
    "TransformerConfig": "core.config", "CaptureError": "core.recorder", "noam_lr": "toy.schedule",
    "Trace": "core.trace", "TraceDiff": "core.trace", "TraceFileError": "core.trace", "compare_traces": "core.trace",
    "Transformer": "families.transformer", "label_smoothed_loss": "families.transformer",
    "sinusoidal_encoding": "families.transformer", "capture_shapes": "families.transformer",
    "load_model": "loaders", "LMConfig": "families.lm", "DecoderLM": "families.lm",
    "LanguageModel": "loaders.lm",
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
