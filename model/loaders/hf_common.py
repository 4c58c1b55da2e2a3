"""What model/loaders/hf.py (the lab's own families) and model/loaders/adapter.py (any other causal LM, via
transformers) share, in a module of its own so that neither imports the other at the top: the model types the
lab's families open, the error type, the memory check's reading and the tensors a checkpoint may carry besides
its parameters."""

from __future__ import annotations

# Decoder-only model types, each tested against transformers (tests/test_families.py, test_hf_fidelity.py).
LM_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "olmo2", "gpt_neox",
            "qwen2_moe", "olmoe", "mixtral", "gpt2", "phi", "starcoder2", "qwen3_moe", "cohere",
            "granite", "glm4", "smollm3", "gpt_oss")
ENCODER_TYPES = ("bert", "roberta", "distilbert")  # -> model.loaders.minilm.PretrainedEncoder

# Tensors a checkpoint may hold that are not parameters of ours (buffers HF used to save).
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq", ".attention.bias",
                    ".attention.masked_bias")


class ModelLoadError(ValueError):
    """A model directory or file this lab cannot load; the message says why and what to do."""


def available_bytes() -> int:
    """Memory this process may still allocate (MemAvailable), or 64 GiB where /proc is absent."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 64 << 30
