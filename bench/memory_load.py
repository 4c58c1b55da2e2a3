"""Resident memory of loading a ~0.5B-parameter random Qwen3-shaped model (Qwen3-0.6B's sizes), in float32
and bfloat16: does loading hold the weights once?

    .venv/bin/python bench/memory_load.py [--dir /tmp/qwen3-0.6b-random] [--layers 28]

Writes the random checkpoints once (sharded safetensors, one file per dtype, as transformers saves them),
then loads each in a fresh process and prints the growth of the process's resident memory, split into
anonymous memory (a private copy) and file-backed pages (the memory-mapped safetensors, shared with the
page cache, dropped under pressure), after load_model and after one forward pass.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

CONFIG = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 1024,
          "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
          "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
          "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "hidden_act": "silu",
          "attention_bias": False, "layer_types": None, "bos_token_id": None, "eos_token_id": 151645}


def write(d: Path, dtype: torch.dtype, layers: int) -> None:
    from safetensors.torch import save_file

    if (d / "model.safetensors.index.json").is_file():
        return
    d.mkdir(parents=True, exist_ok=True)
    cfg = CONFIG | {"num_hidden_layers": layers, "layer_types": ["full_attention"] * layers,
                    "dtype": str(dtype).removeprefix("torch.")}
    (d / "config.json").write_text(json.dumps(cfg))
    D, F, H, Hkv, hs, V = 1024, 3072, 16, 8, 128, 151936
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return (0.02 * torch.randn(*shape, generator=g)).to(dtype)

    weight_map = {}
    shards = [{"model.embed_tokens.weight": rnd(V, D), "model.norm.weight": torch.ones(D, dtype=dtype)}]
    for i in range(layers):
        if i % 4 == 0:
            shards.append({})
        p = f"model.layers.{i}."
        norms = (("self_attn.q_norm", hs), ("self_attn.k_norm", hs), ("input_layernorm", D),
                 ("post_attention_layernorm", D))
        ones = {f"{p}{n}.weight": torch.ones(k, dtype=dtype) for n, k in norms}
        shards[-1].update(ones | {
            p + "self_attn.q_proj.weight": rnd(H * hs, D), p + "self_attn.k_proj.weight": rnd(Hkv * hs, D),
            p + "self_attn.v_proj.weight": rnd(Hkv * hs, D), p + "self_attn.o_proj.weight": rnd(D, H * hs),
            p + "mlp.gate_proj.weight": rnd(F, D), p + "mlp.up_proj.weight": rnd(F, D),
            p + "mlp.down_proj.weight": rnd(D, F)})
    for n, shard in enumerate(shards):
        name = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(d / name), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(shard, name)
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def rss() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def measure(d: str, dtype: str) -> None:
    """In a fresh process: the resident growth of load_model and of a first forward pass."""
    import gc

    from model import load_model

    before = rss()
    lm = load_model(d, dtype=dtype)
    gc.collect()
    loaded = rss()
    n = lm.model.num_parameters()
    size = next(lm.model.parameters()).element_size()
    with torch.no_grad():
        lm.model(torch.randint(0, 1000, (1, 16)))
    ran = rss()
    mib = 2 ** 20
    print(json.dumps({"dtype": dtype, "params": n, "weights_MiB": round(n * size / mib),
                      "load_anon_MiB": round((loaded["RssAnon"] - before["RssAnon"]) / mib),
                      "load_file_MiB": round((loaded["RssFile"] - before["RssFile"]) / mib),
                      "after_forward_anon_MiB": round((ran["RssAnon"] - before["RssAnon"]) / mib),
                      "after_forward_file_MiB": round((ran["RssFile"] - before["RssFile"]) / mib)}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/qwen3-0.6b-random")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--measure", nargs=2, metavar=("DIR", "DTYPE"))
    a = ap.parse_args()
    if a.measure:
        return measure(*a.measure)
    root = Path(a.dir)
    for file_dtype, load_dtype in (("float32", "float32"), ("bfloat16", "bfloat16"), ("float32", "bfloat16")):
        d = root / file_dtype
        write(d, getattr(torch, file_dtype), a.layers)
        print(f"file {file_dtype}, load as {load_dtype}:", flush=True)
        subprocess.run([sys.executable, __file__, "--measure", str(d), load_dtype], check=True)


if __name__ == "__main__":
    main()
