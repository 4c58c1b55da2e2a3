"""`python -m model.capture --checkpoint NAME_OR_PATH --text "..." [--names GLOB] --out FILE`

The command line only: the recorder itself is `model.core.recorder`.
Nothing in the package imports this module, so `python -m` runs it without runpy's warning.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from model.testing.repro import deterministic, open_model

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
