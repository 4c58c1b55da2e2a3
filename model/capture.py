"""The capture recorder: which tensors a forward pass records, and how much memory that costs.

The recorder lives in a `contextvars.ContextVar`, not in module hooks or globals, so
Streamlit's threads (one per browser session) can trace at once without seeing each
other. With no recorder set, `record` is one ContextVar lookup: capture off costs nothing.
"""

from __future__ import annotations

import fnmatch
from contextvars import ContextVar

import torch

from .config import TransformerConfig

DEFAULT_BUDGET_BYTES = 512 * 2**20

_RECORDER: ContextVar[Recorder | None] = ContextVar("attention_lab_recorder", default=None)


class CaptureError(ValueError):
    """A capture request that cannot be served (unknown name pattern, over the memory budget)."""


class Recorder:
    def __init__(self, wanted: set[str]):
        self.wanted = wanted
        self.tensors: dict[str, torch.Tensor] = {}

    def put(self, name: str, tensor: torch.Tensor) -> None:
        if name in self.wanted:
            # No copy: the model never writes into a tensor after recording it.
            self.tensors[name] = tensor.detach().cpu()


def record(name: str, tensor: torch.Tensor) -> None:
    rec = _RECORDER.get()
    if rec is not None:
        rec.put(name, tensor)


def recording() -> bool:
    return _RECORDER.get() is not None


class capturing:
    """Context manager: record the named tensors of every forward pass inside it."""

    def __init__(self, wanted: set[str]):
        self.recorder = Recorder(wanted)

    def __enter__(self) -> Recorder:
        self._token = _RECORDER.set(self.recorder)
        return self.recorder

    def __exit__(self, *exc) -> None:
        _RECORDER.reset(self._token)


def _attn_shapes(prefix: str, B: int, H: int, Lq: int, Lk: int, hs: int, D: int) -> dict:
    return {
        f"{prefix}.q": (B, H, Lq, hs),
        f"{prefix}.k": (B, H, Lk, hs),
        f"{prefix}.v": (B, H, Lk, hs),
        f"{prefix}.scores": (B, H, Lq, Lk),
        f"{prefix}.mask": (B, 1, Lq, Lk),
        f"{prefix}.weights": (B, H, Lq, Lk),
        f"{prefix}.z": (B, H, Lq, hs),
        f"{prefix}.out": (B, Lq, D),
    }


def capture_shapes(cfg: TransformerConfig, B: int, S: int, T: int = 0) -> dict[str, tuple[int, ...]]:
    """Every capture name of one forward pass, in computation order, with its shape.

    B: batch, S: source length, T: target length (0 for encoder-only).
    """
    D, H, hs, F = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_ff
    shapes: dict[str, tuple[int, ...]] = {"masks.src_pad": (B, S)}
    if not cfg.encoder_only:
        shapes |= {"masks.tgt_pad": (B, T), "masks.causal": (T, T)}
    shapes |= {"encoder.embed.tok": (B, S, D), "encoder.embed.pos": (S, D)}
    if cfg.n_token_types:
        shapes["encoder.embed.type"] = (B, S, D)
    shapes["encoder.embed.out"] = (B, S, D)
    for i in range(cfg.n_encoder_layers):
        p = f"encoder.layers.{i}"
        shapes |= _attn_shapes(f"{p}.self_attn", B, H, S, S, hs, D)
        shapes |= {f"{p}.ffn.hidden": (B, S, F), f"{p}.out": (B, S, D)}
    shapes["encoder.out"] = (B, S, D)
    if cfg.encoder_only:
        return shapes
    shapes |= {"decoder.embed.tok": (B, T, D), "decoder.embed.pos": (T, D), "decoder.embed.out": (B, T, D)}
    for i in range(cfg.n_decoder_layers):
        p = f"decoder.layers.{i}"
        shapes |= _attn_shapes(f"{p}.self_attn", B, H, T, T, hs, D)
        shapes |= _attn_shapes(f"{p}.cross_attn", B, H, T, S, hs, D)
        shapes |= {f"{p}.ffn.hidden": (B, T, F), f"{p}.out": (B, T, D)}
    shapes |= {"decoder.out": (B, T, D), "logits": (B, T, cfg.tgt_vocab_size)}
    return shapes


def select_names(available: list[str], names: str | list[str] | None) -> list[str]:
    """Resolve fnmatch globs (`*` crosses dots) against the available names.

    A pattern that matches nothing is an error: a typo must not silently capture nothing.
    """
    if names is None:
        return list(available)
    patterns = [names] if isinstance(names, str) else list(names)
    chosen: set[str] = set()
    for pattern in patterns:
        hits = fnmatch.filter(available, pattern)
        if not hits:
            raise CaptureError(
                f"capture pattern {pattern!r} matches no name. Valid names (globs like '*.weights' "
                f"or 'decoder.layers.*.cross_attn.*' work):\n  " + "\n  ".join(available)
            )
        chosen.update(hits)
    return [n for n in available if n in chosen]


def estimate_bytes(shapes: dict[str, tuple[int, ...]], names: list[str], itemsize: int = 4) -> int:
    total = 0
    for n in names:
        numel = 1
        for s in shapes[n]:
            numel *= s
        total += numel * (1 if n.endswith("mask") or n.startswith("masks.") else itemsize)
    return total


def check_budget(n_bytes: int, budget: int | None) -> None:
    if budget is not None and n_bytes > budget:
        raise CaptureError(
            f"capturing these tensors needs about {n_bytes / 2**20:.1f} MiB, over the budget of "
            f"{budget / 2**20:.1f} MiB. Capture fewer names (e.g. names='*.weights' or "
            f"'encoder.layers.0.*'), use shorter inputs or a smaller batch, or raise budget_bytes."
        )


def main(argv: list[str] | None = None) -> int:
    """`python -m model.capture --checkpoint NAME_OR_PATH --text "..." [--names GLOB] --out FILE`."""
    import argparse
    import sys

    from .repro import deterministic, open_model  # lazy: the recorder itself stays import-light

    p = argparse.ArgumentParser(prog="python -m model.capture", description="Capture a trace to a file.")
    p.add_argument("--checkpoint", required=True,
                   help="a shipped checkpoint name, a checkpoint path, or a model directory")
    p.add_argument("--text", required=True, help="the source text")
    p.add_argument("--target", help="teacher-force this target (default: the model's greedy output)")
    p.add_argument("--names", action="append", help="glob of capture names (repeatable; default: all)")
    p.add_argument("--out", required=True, help="the .safetensors file to write")
    args = p.parse_args(argv)
    try:
        with deterministic():
            _, trace = open_model(args.checkpoint).trace(args.text, target=args.target, names=args.names)
        trace.save(args.out)
    except (ValueError, KeyError, OSError) as e:  # CaptureError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(trace)} tensors ({trace.nbytes() / 2**10:.1f} KiB) to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
