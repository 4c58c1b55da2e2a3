"""Hugging Face models in our instrumented families: a config.json + safetensors directory.

    lm = load_hf_dir("path/to/model")        # llama, qwen2, gpt2 -> LanguageModel (DecoderLM inside)
                                             # bert -> the encoder wrapper of model.loaders.minilm
    model = lm_from_hf(config_dict, tensors) # HF config + HF-named tensors -> DecoderLM (GGUF uses it too)

Weights are read with safetensors only: pickles (pytorch_model.bin) can run code when loaded, so a
directory that has only those is refused with the command that converts it. Sizes in config.json
are checked before anything is allocated, and every checkpoint tensor must map onto a parameter of
the same shape (nothing missing, nothing left over).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from model.families.lm import DecoderLM, LMConfig

SUPPORTED = ("llama", "qwen2", "gpt2", "bert")
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few kB
LIMITS = {"vocab_size": 1 << 20, "d_model": 1 << 16, "n_layers": 1024, "n_heads": 1024, "d_ff": 1 << 18,
          "max_len": 1 << 21}
# Tensors a checkpoint may hold that are not parameters of ours (buffers HF used to save).
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")
CONVERT = ('python -c "from transformers import AutoModel; '
           "AutoModel.from_pretrained('{d}').save_pretrained('{d}', safe_serialization=True)\"")


class ModelLoadError(ValueError):
    """A model directory or file this lab cannot load; the message says why and what to do."""


# ---------------------------------------------------------------- config


def _int(hf: Mapping, key: str, default=None) -> int:
    v = hf.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ModelLoadError(f"config.json: {key} must be a positive integer, got {v!r}")
    return v


def _ids(v) -> list[int]:
    vals = v if isinstance(v, list) else [v]
    return [x for x in vals if isinstance(x, int) and not isinstance(x, bool) and x >= 0]


def config_from_hf(hf: Mapping) -> LMConfig:
    """A Hugging Face config (llama, qwen2 or gpt2) -> LMConfig. Absurd sizes are refused here,
    before any memory is spent: each size has a ceiling, and the whole model must fit in RAM."""
    kind = hf.get("model_type")
    if kind not in ("llama", "qwen2", "gpt2"):
        raise ModelLoadError(f"model_type {kind!r} is not supported; supported: {', '.join(SUPPORTED)}")
    if kind == "gpt2":
        act = hf.get("activation_function", "gelu_new")
        D = _int(hf, "n_embd")
        if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("scale_attn_weights", True) is not True:
            raise ModelLoadError("config.json: GPT-2 attention scaling other than 1/sqrt(d_head) is not supported")
        sizes = dict(vocab_size=_int(hf, "vocab_size"), d_model=D, n_layers=_int(hf, "n_layer"),
                     n_heads=_int(hf, "n_head"), d_ff=_int(hf, "n_inner", None) if hf.get("n_inner") else 4 * D,
                     max_len=_int(hf, "n_positions"))
        switches = dict(positional="learned", norm="layernorm", norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
                        ffn="plain", qkv_bias=True, out_bias=True, ffn_bias=True,
                        tie_embeddings=bool(hf.get("tie_word_embeddings", True)))
    else:
        act = hf.get("hidden_act", "silu")
        rope = hf.get("rope_parameters") or {}  # transformers 5; 4.x wrote rope_theta + rope_scaling
        scaling = hf.get("rope_scaling") or rope
        if not isinstance(rope, dict) or not isinstance(scaling, dict):
            raise ModelLoadError("config.json: rope_parameters / rope_scaling must be JSON objects")
        if (scaling.get("rope_type") or scaling.get("type") or "default") != "default":
            raise ModelLoadError(f"config.json: RoPE scaling {scaling!r} is not supported (plain RoPE only)")
        theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        if not isinstance(theta, int | float) or isinstance(theta, bool) or not 0 < theta < 1e12:
            raise ModelLoadError(f"config.json: rope_theta must be a positive number, got {theta!r}")
        if kind == "qwen2" and hf.get("use_sliding_window"):
            raise ModelLoadError("config.json: use_sliding_window=true is not supported (full causal attention only)")
        heads = _int(hf, "num_attention_heads")
        sizes = dict(vocab_size=_int(hf, "vocab_size"), d_model=_int(hf, "hidden_size"),
                     n_layers=_int(hf, "num_hidden_layers"), n_heads=heads,
                     d_ff=_int(hf, "intermediate_size"), max_len=_int(hf, "max_position_embeddings", 2048))
        bias = bool(hf.get("attention_bias", False))
        switches = dict(n_kv_heads=_int(hf, "num_key_value_heads", heads),
                        d_head=_int(hf, "head_dim") if hf.get("head_dim") else None,
                        positional="rotary", rope_base=float(theta), norm="rmsnorm",
                        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), ffn="gated",
                        qkv_bias=True if kind == "qwen2" else bias, out_bias=False if kind == "qwen2" else bias,
                        ffn_bias=bool(hf.get("mlp_bias", False)),
                        tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
    if act not in ACTIVATIONS:
        raise ModelLoadError(f"config.json: activation {act!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    for key, v in sizes.items():
        if v > LIMITS[key]:
            raise ModelLoadError(f"config.json: {key} = {v:,} is absurd for this lab (limit {LIMITS[key]:,}); "
                                 "the file is corrupt or forged")
    V = sizes["vocab_size"]
    tokens = {f"{k}_id": (_ids(hf.get(f"{k}_token_id")) or [None])[0] for k in ("bos", "eos", "pad")}
    tokens = {k: v if v is None or v < V else None for k, v in tokens.items()}
    try:
        cfg = LMConfig(**sizes, activation=ACTIVATIONS[act], **switches, **tokens)
    except ValueError as e:
        raise ModelLoadError(f"config.json: {e}") from None
    check_fits(cfg)
    return cfg


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


def check_fits(cfg: LMConfig) -> None:
    n = cfg.num_parameters()
    need = 4 * n  # float32
    have = available_bytes()
    if need > have:
        raise ModelLoadError(f"this config describes a model of {n:,} parameters ({need / 2**30:.1f} GiB in "
                             f"float32); this machine has {have / 2**30:.1f} GiB available. Refused before loading.")


# ---------------------------------------------------------------- tensor names


def key_map(kind: str, cfg: LMConfig) -> dict[str, str]:
    """Hugging Face tensor name (prefix 'model.' / 'transformer.' removed) -> our parameter name."""
    m: dict[str, str] = {}
    if kind == "gpt2":
        m |= {"wte.weight": "decoder.embed.tok.weight", "wpe.weight": "decoder.embed.pos.weight",
              "ln_f.weight": "decoder.norm.weight", "ln_f.bias": "decoder.norm.bias"}
        parts = {"ln_1": "norm1", "ln_2": "norm2", "attn.c_proj": "self_attn.w_o", "mlp.c_fc": "ffn.linear1",
                 "mlp.c_proj": "ffn.linear2"}  # attn.c_attn (q, k, v side by side) is split apart
        for i in range(cfg.n_layers):
            for p in ("weight", "bias"):
                m[f"h.{i}.attn.c_attn.{p}"] = f"decoder.layers.{i}.self_attn.w_qkv.{p}"
                for theirs, ours in parts.items():
                    m[f"h.{i}.{theirs}.{p}"] = f"decoder.layers.{i}.{ours}.{p}"
    else:
        m |= {"embed_tokens.weight": "decoder.embed.tok.weight", "norm.weight": "decoder.norm.weight"}
        parts = {"input_layernorm": "norm1", "post_attention_layernorm": "norm2", "self_attn.q_proj": "self_attn.w_q",
                 "self_attn.k_proj": "self_attn.w_k", "self_attn.v_proj": "self_attn.w_v",
                 "self_attn.o_proj": "self_attn.w_o", "mlp.gate_proj": "ffn.gate", "mlp.up_proj": "ffn.linear1",
                 "mlp.down_proj": "ffn.linear2"}
        for i in range(cfg.n_layers):
            for theirs, ours in parts.items():
                for p in ("weight", "bias"):
                    m[f"layers.{i}.{theirs}.{p}"] = f"decoder.layers.{i}.{ours}.{p}"
    m["lm_head.weight"] = "generator.weight"
    return m


def _strip(name: str) -> str:
    for prefix in ("model.", "transformer."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def lm_from_hf(config: Mapping, tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> DecoderLM:
    """A Hugging Face llama / qwen2 / gpt2 config (dict) and its tensors under HF names (a mapping, or
    (name, tensor) pairs streamed one at a time) -> DecoderLM in eval mode, float32.

    The module tree is built on the meta device and the tensors are assigned into it, so the weights
    are held once. Every parameter must be filled with a tensor of its shape; unknown tensors are an
    error naming them."""
    cfg = config_from_hf(config)
    kind = config["model_type"]
    names = key_map(kind, cfg)
    with torch.device("meta"):
        model = DecoderLM(cfg)
    wanted = {n: tuple(p.shape) for n, p in model.named_parameters()}  # tied: generator.weight is absent
    state: dict[str, torch.Tensor] = {}
    unknown: list[str] = []
    pairs = tensors.items() if isinstance(tensors, Mapping) else tensors
    for theirs, t in pairs:
        ours = names.get(_strip(theirs))
        if ours is None:
            if not theirs.endswith(IGNORED_SUFFIXES):
                unknown.append(theirs)
            continue
        if ours == "generator.weight" and cfg.tie_embeddings:
            continue  # tied: the token table is the output projection
        t = t.to(torch.float32)
        if kind == "gpt2" and t.dim() == 2 and ".c_" in theirs:
            t = t.t()  # GPT-2's Conv1D (c_attn, c_proj, c_fc) stores (in, out); nn.Linear wants (out, in)
        if ours.endswith(".w_qkv.weight") or ours.endswith(".w_qkv.bias"):
            base, p = ours.rsplit(".w_qkv.", 1)
            for part, chunk in zip(("w_q", "w_k", "w_v"), t.chunk(3, dim=0), strict=True):
                state[f"{base}.{part}.{p}"] = chunk.contiguous()
            continue
        state[ours] = t.contiguous()
    if unknown:
        raise ModelLoadError(f"the checkpoint has tensors this {kind} loader does not map: {unknown[:6]}"
                             f"{' ...' if len(unknown) > 6 else ''}")
    missing = sorted(set(wanted) - set(state))
    if missing:
        raise ModelLoadError(f"the checkpoint lacks {len(missing)} tensors, e.g. {missing[:4]} (our names)")
    extra = sorted(set(state) - set(wanted))
    if extra:
        raise ModelLoadError(f"the checkpoint has tensors the config does not describe (biases?): {extra[:4]}")
    bad = [(n, tuple(t.shape), wanted[n]) for n, t in state.items() if tuple(t.shape) != wanted[n]]
    if bad:
        n, got, want = bad[0]
        raise ModelLoadError(f"tensor for {n} has shape {got}, the config implies {want} "
                             f"({len(bad)} tensors disagree): config.json and the weights do not match")
    model.load_state_dict(state, strict=False, assign=True)  # strict by the checks above (tied key absent)
    model.tie()
    return model.eval()


# ---------------------------------------------------------------- directories


def read_config(d: Path) -> dict:
    path = d / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{d} has no config.json: a Hugging Face model directory holds config.json "
                             "and *.safetensors (and tokenizer.json)")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ModelLoadError(f"{path} is {path.stat().st_size:,} bytes; a config.json is a few kB")
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from None
    if not isinstance(hf, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    if hf.get("model_type") not in SUPPORTED:
        arch = hf.get("model_type") or hf.get("architectures")
        raise ModelLoadError(f"{d.name}: model type {arch!r} is not supported; supported: {', '.join(SUPPORTED)}")
    return hf


def safetensors_files(d: Path) -> list[Path]:
    """The directory's weight files, checked from their headers; pickles only -> refused."""
    from model.core.trace import TraceFileError, check_safetensors_header

    files = sorted(d.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in d.glob("*.bin")) + sorted(p.name for p in d.glob("*.pt*"))
        if pickles:
            raise ModelLoadError(
                f"{d} has only pickled weights ({', '.join(pickles[:3])}); this lab reads safetensors only "
                f"(pickles can run code when loaded). Convert once with:\n  {CONVERT.format(d=d)}")
        raise ModelLoadError(f"{d} has no *.safetensors weights")
    for f in files:
        try:
            check_safetensors_header(f, f.name, 1 << 16, what="model")
        except TraceFileError as e:
            raise ModelLoadError(str(e)) from None
    return files


def _read_tensors(files: list[Path]) -> Iterable[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError, safe_open

    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                    yield k, st.get_tensor(k)
        except SafetensorError as e:
            raise ModelLoadError(f"cannot read {f.name}: {e}") from None


def _json(path: Path) -> dict:
    try:
        if path.is_file() and path.stat().st_size <= 16 << 20:
            v = json.loads(path.read_text(encoding="utf-8"))
            return v if isinstance(v, dict) else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        pass
    return {}


def chat_template_of(d: Path) -> str | None:
    jinja = d / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    t = _json(d / "tokenizer_config.json").get("chat_template")
    if isinstance(t, list):  # [{"name": "default", "template": ...}, ...]
        t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == "default"), None)
    return t if isinstance(t, str) else None


def load_hf_dir(path: str | os.PathLike):
    """A Hugging Face directory -> LanguageModel (llama, qwen2, gpt2) or, for BERT, the existing
    encoder wrapper (model.loaders.minilm.PretrainedEncoder). Errors are ModelLoadError with a reason."""
    from model.loaders.lm import LanguageModel

    d = Path(path)
    if not d.is_dir():
        raise ModelLoadError(f"{d} is not a directory")
    hf = read_config(d)
    files = safetensors_files(d)
    if hf["model_type"] == "bert":
        return _load_bert(d, hf, files)
    cfg = config_from_hf(hf)  # sizes checked before any tensor is read
    model = lm_from_hf(hf, _read_tensors(files))
    tokenizer = None
    if (d / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(d / "tokenizer.json"))
        except Exception as e:  # tokenizers raises its own Exception type
            raise ModelLoadError(f"cannot read {d / 'tokenizer.json'}: {e}") from None
    gen = _json(d / "generation_config.json")
    stop = _ids(hf.get("eos_token_id")) + _ids(gen.get("eos_token_id"))
    return LanguageModel(model, tokenizer, name=d.name, chat_template=chat_template_of(d),
                         stop_ids=[i for i in dict.fromkeys(stop) if i < cfg.vocab_size], source=d,
                         special_tokens=_special_tokens(d))


def _special_tokens(d: Path) -> dict[str, str]:
    """bos_token / eos_token strings for chat templates, from tokenizer_config.json."""
    tc = _json(d / "tokenizer_config.json")
    out = {}
    for k in ("bos_token", "eos_token", "pad_token", "unk_token"):
        v = tc.get(k)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            out[k] = v
    return out


def _load_bert(d: Path, hf: dict, files: list[Path]):
    from model.families.transformer import Transformer
    from model.loaders import minilm

    if len(files) != 1:
        raise ModelLoadError(f"{d}: a BERT directory must hold one safetensors file, found {len(files)}")
    try:
        cfg = minilm.config_from_bert(hf)
    except (RuntimeError, KeyError, ValueError) as e:
        raise ModelLoadError(f"{d.name}: {e}") from None
    D, F, L = cfg.d_model, cfg.d_ff, cfg.n_encoder_layers
    n = (cfg.src_vocab_size + cfg.max_len + cfg.n_token_types) * D + L * (4 * D * D + 2 * D * F + F + 9 * D)
    if cfg.src_vocab_size > LIMITS["vocab_size"] or D > LIMITS["d_model"] or L > LIMITS["n_layers"] \
            or 4 * n > available_bytes():
        raise ModelLoadError(f"{d.name}: config.json describes a model of {n:,} parameters ({4 * n / 2**30:.1f} GiB "
                             "in float32), more than this lab loads or this machine holds. Refused before loading.")
    if not (d / "tokenizer.json").is_file():
        raise ModelLoadError(f"{d} has no tokenizer.json (the BERT encoder needs its WordPiece tokenizer)")
    from tokenizers import Tokenizer

    model = Transformer(cfg)
    try:
        minilm.load_bert_weights(model, files[0])
    except RuntimeError as e:
        raise ModelLoadError(f"{d.name}: {e}") from None
    tokenizer = Tokenizer.from_file(str(d / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return minilm.PretrainedEncoder(model, tokenizer, hf, name=d.name, source=d)
