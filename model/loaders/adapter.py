"""Any other decoder-only model transformers runs, through transformers' own modules (issue 32 §2).

    lm = load_hf_dir("path/to/falcon-dir")      # a model_type the lab has no family for -> AdapterLanguageModel
    logits, trace = lm.run_with_trace("The capital of France is")
    trace["decoder.layers.3.self_attn.weights"]  # [1, H, T, T]: transformers' own output_attentions
    lm.model.describe()["lacks"]                 # what this path does not give

The lab's own families (model/families/lm.py) are hand-written and exact in every tensor. For the long tail,
this adapter loads the directory with `transformers.AutoModelForCausalLM` (eager attention, safetensors only,
never remote code) and gives, under the lab's capture names, only what it can measure exactly:

| name | shape | from |
|---|---|---|
| `decoder.embed.tok` | [B, T, D] | the input embedding module's output (a forward hook) |
| `decoder.embed.out` | [B, T, D] | layer 0's input (a forward pre-hook): transformers' hidden_states[0] |
| `<attn>.q_unrot`, `<attn>.k_unrot` | [B, H, T, hs], [B, H_kv, T, hs] | rotary models: q, k before the rotary |
| `<attn>.q`, `<attn>.k`, `<attn>.v` | [B, H, T, hs], [B, H_kv, T, hs] | the q/k/v linear layers' outputs, in heads |
| `<attn>.scores`, `<attn>.mask` | [B, H, T, T], [B, 1, T, T] | q·kᵀ·scale, the causal (+ window) mask |
| `<attn>.weights` | [B, H, T, T] | transformers' output_attentions (eager) |
| `<attn>.z`, `<attn>.out` | [B, H, T, hs], [B, T, D] | W^O's input in heads (a forward pre-hook), its output |
| `decoder.layers.{i}.out` | [B, T, D] | the decoder layer module's output (a forward hook) |
| `decoder.out` | [B, T, D] | the final norm's output, where lm_head(final norm(x)) gives the logits exactly |
| `logits` | [B, T, V] | the model's logits |

q/k/v are split into heads as each model type does (adapter_heads.py); q and k are after the model's own rotary
(q_unrot, k_unrot before it). Each head's names are given only where a probe at load reproduces transformers' own
weights from them (z = weights·v; softmax(q·kᵀ·scale + mask) = weights after the model's rotary; for ALiBi, a bias
linear in the key position): tested on OLMo, Falcon (with and without grouped K/V), OPT, BLOOM, Persimmon,
GPTBigCode, MPT, GPT-J, CodeGen, XGLM, BioGPT. Hooks (interventions) work exactly at the module boundaries: the
embeddings, layer 0's input, each head's z at W^O's input (head ablation), the attention output, each layer's
output (residual patching), the final norm and the logits; q, k, v, the scores and the weights live inside
transformers' attention and cannot be changed. It lacks the norms inside a layer, the FFN's internals and lazy
traces; `describe()["lacks"]` says what each model lacks and the pages that need them say it in one sentence. A
model that is not a plain causal attention LM (state-space or recurrent layers, hybrids, encoder-decoders,
multimodal wrappers) is refused in one sentence naming the mechanism, before any weight is read.

transformers is imported here only, lazily: the lab's own families never import it (pip extra `.[any-model]`).
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch

from model.core import recorder
from model.core.describe import SIDES, attention_entry
from model.core.trace import Trace
from model.loaders import adapter_heads as AH
from model.loaders.hf_common import ModelLoadError, available_bytes
from model.loaders.lm import LanguageModel, Step

FAMILY = "decoder_lm_adapter"
INSTALL = "pip install -e '.[any-model]'"
# Mechanisms that are not causal self-attention, by transformers' model_type: refused by name.
MECHANISMS = {
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba"), "its layers are state-space (Mamba) layers, not attention"),
    **dict.fromkeys(("jamba", "zamba", "zamba2", "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h", "plamo2"),
                    "it is a hybrid of state-space (Mamba) and attention layers"),
    **dict.fromkeys(("rwkv", "rwkv5", "rwkv6", "rwkv7"), "its layers are RWKV recurrences, not attention"),
    "recurrent_gemma": "its layers are mostly RG-LRU recurrences, not attention",
    "xlstm": "its layers are xLSTM recurrences, not attention",
    **dict.fromkeys(("lfm2", "lfm2_moe"), "it mixes short convolutions with attention layers"),
    **dict.fromkeys(("qwen3_next", "minimax", "kimi_linear"), "it mixes linear-attention layers with attention layers"),
}
LAYER_KINDS = ("full_attention", "sliding_attention", "chunked_attention", "attention", "global", "local")
NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "norm_f", "final_norm", "layer_norm")
LACKS = ("the norms inside a layer", "the feed-forward network's internals",
         "hooks on q, k, v, the scores and the weights (they live inside transformers' attention)",
         "lazy traces for long inputs")
POSITIONS = {"raw": "none", "rotated": "rotary", "unrot": "rotary", "alibi": "alibi"}  # describe()'s "positions"
HEAD_ROLES = ("q_unrot", "q", "k_unrot", "k", "v", "scores", "mask")  # recorded at W^O's input, from the stash
ATTN_NAMES = ("self_attn", "attn", "attention", "self_attention")
# One forward's stash (the rotary's cos/sin, each layer's projection outputs until its W^O): per call, per thread.
_CALL: ContextVar[dict | None] = ContextVar("attention_lab_adapter_call", default=None)


def refusal(hf: Mapping) -> str | None:
    """One sentence when the config is not a plain causal attention LM (named by its mechanism), else None.
    Read from config.json alone, before transformers or any weight is touched."""
    kind = hf.get("model_type")
    arch = hf.get("architectures")
    arch = arch[0] if isinstance(arch, list) and arch and isinstance(arch[0], str) else None
    why = MECHANISMS.get(kind) if isinstance(kind, str) else None
    if why is None and hf.get("is_encoder_decoder"):
        why = "it is an encoder-decoder model, not decoder-only"
    if why is None and any(isinstance(hf.get(k), dict) for k in ("vision_config", "audio_config", "encoder")):
        why = "it is a multimodal or encoder-decoder wrapper, not a text decoder"
    types = hf.get("layer_types")
    if why is None and isinstance(types, list) and any(t not in LAYER_KINDS for t in types):
        odd = next(t for t in types if t not in LAYER_KINDS)
        why = f"some of its layers are {odd!r} layers, not attention"
    if why is None and arch and not arch.endswith(("ForCausalLM", "LMHeadModel", "Model")):
        why = f"its architecture {arch} is not a causal language model"
    if why is None:
        return None
    return f"model type {kind or arch!r} is not supported: {why}; {_supported_text()}"


def _supported_text() -> str:
    from model.loaders.hf_common import ENCODER_TYPES, LM_TYPES

    return (f"this lab opens these decoder-only types: {', '.join(LM_TYPES)} (and the encoders "
            f"{', '.join(ENCODER_TYPES)}), and through transformers any other causal attention language model")


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ModelLoadError(f"opening a model type the lab has no family for needs transformers; install it with "
                             f"`{INSTALL}`") from None
    return transformers


def _layers_of(hf_model, n_layers: int) -> tuple[str, torch.nn.ModuleList]:
    """The decoder's list of layers: the first ModuleList with one module per layer."""
    for name, mod in hf_model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n_layers and name:
            return name, mod
    raise ModelLoadError(f"transformers' {type(hf_model).__name__} has no list of {n_layers} decoder layers the lab "
                         "can find, so its residual stream cannot be read exactly. Refused.")


def _final_norm(hf_model, layers_name: str):
    """The final norm: a module named like one (NORM_NAMES) beside the layer list."""
    parent = layers_name.rsplit(".", 1)[0] if "." in layers_name else ""
    base = hf_model.get_submodule(parent) if parent else hf_model
    for n in NORM_NAMES:
        mod = getattr(base, n, None)
        if isinstance(mod, torch.nn.Module):
            return mod
    return None


def _attention_of(layer: torch.nn.Module) -> torch.nn.Module | None:
    return next((m for n in ATTN_NAMES if isinstance(m := getattr(layer, n, None), torch.nn.Module)), None)


def _clips_qkv(conf) -> bool:
    """q, k, v clamped after their projection (OLMo's clip_qkv, MPT's attn_config.clip_qkv): the projections'
    outputs are then not what the model uses."""
    attn = getattr(conf, "attn_config", None)
    attn = attn if isinstance(attn, dict) else getattr(attn, "__dict__", {}) if attn is not None else {}
    return getattr(conf, "clip_qkv", None) is not None or attn.get("clip_qkv") is not None


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, n: int) -> bool:
    """a == b up to the rounding of a sum of n terms in `dtype` (two evaluation orders of one quantity)."""
    a, b = a.double(), b.double()
    scale = max(float(a.abs().max()), float(b.abs().max()), 1e-30)
    return a.shape == b.shape and float((a - b).abs().max()) <= 16 * torch.finfo(dtype).eps * scale * math.sqrt(n)


def _scale_candidates(attn, hs: int) -> list[float]:
    found = [getattr(attn, a, None) for a in ("scaling", "inv_norm_factor", "softmax_scale", "scale")]
    return [float(x) for x in found if isinstance(x, int | float) and not isinstance(x, bool)] + [hs ** -0.5]


def _causal(T: int, device) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool, device=device).triu(1)  # True = blocked (the future)


def _scale_of(attn, hs: int, q, k, w) -> float | None:
    """The scale s with softmax(q·kᵀ·s + causal mask) == w (transformers' weights), or None."""
    qk = q.double() @ AH.repeat_kv(k, q.shape[1]).double().transpose(-1, -2)  # (B, H, T, T)
    blocked = _causal(qk.shape[-1], qk.device)
    for s in _scale_candidates(attn, hs):
        p = torch.softmax((qk * s).masked_fill(blocked, -math.inf), dim=-1)
        if _close(p, w, w.dtype, hs) and bool((w.masked_select(blocked.expand_as(w)) == 0).all()):
            return s
    return None


def _alibi_like(attn, hs: int, q, k, w) -> bool:
    """True when w = softmax(q·kᵀ·s + b + mask) with a bias b linear in the key's position for each head, the same
    in every row (ALiBi: BLOOM, MPT): log w - q·kᵀ·s, minus its value at key 0, must not depend on the query."""
    qk = q.double() @ AH.repeat_kv(k, q.shape[1]).double().transpose(-1, -2)
    T = qk.shape[-1]
    if T < 3 or bool((w[..., :, 0] <= 0).any()):
        return False
    for s in _scale_candidates(attn, hs):
        r = w.double().log() - qk * s
        d = r - r[..., :1]  # (B, H, T, T): per row, relative to key 0
        last = d[..., -1:, :].expand_as(d)
        seen = ~_causal(T, d.device)
        err = float((d - last).masked_select(seen.expand_as(d)).abs().max())
        if err <= 64 * torch.finfo(w.dtype).eps * (1 + float(qk.abs().max()) * s) * math.sqrt(hs):
            return True
    return False


def _first(out):
    return out[0] if isinstance(out, tuple | list) else out


class AdapterModel(torch.nn.Module):
    """transformers' causal LM behind the lab's model API (run_with_trace, capture_names, hooks, describe, unembed).

    Forward hooks on transformers' own modules are registered once, at load; each reads the lab's recorder and
    hooks (ContextVars, per call: Streamlit's sessions share this model from several threads) and does nothing
    when neither asks for its point. Which points exist is decided by the probe at load (`_probe`)."""

    def __init__(self, hf_model, model_type: str):
        super().__init__()
        self.hf = hf_model.eval()
        self.model_type = model_type
        conf = hf_model.config.get_text_config() if hasattr(hf_model.config, "get_text_config") else hf_model.config
        self.hf_config = conf
        n_layers = getattr(conf, "num_hidden_layers", None) or getattr(conf, "n_layer", None) or getattr(
            conf, "num_layers", None)
        if not isinstance(n_layers, int) or n_layers <= 0:
            raise ModelLoadError(f"transformers' {model_type} config names no number of layers. Refused.")
        self.layers_name, self.layers = _layers_of(hf_model, n_layers)
        self.norm = _final_norm(hf_model, self.layers_name)
        self.head = hf_model.get_output_embeddings()
        self.embed = hf_model.get_input_embeddings()
        self.rotary = next((m for n, m in hf_model.named_modules() if type(m).__name__.endswith("RotaryEmbedding")
                            and not n.startswith(self.layers_name + ".")), None)  # the model's one, for every layer
        max_len = next((v for k in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
                        if isinstance(v := getattr(conf, k, None), int) and v > 0), 2048)
        special = {k: v if isinstance(v := getattr(conf, f"{k}_token_id", None), int) else None
                   for k in ("bos", "eos", "pad")}  # as LMConfig's: the Q/K map's batches pad and start with them
        self.cfg = SimpleNamespace(n_layers=n_layers, max_len=max_len, vocab_size=None, d_model=None, n_heads=None,
                                   kv_heads=None, head_dim=None, d_embed=None, model_type=model_type,
                                   **{f"{k}_id": v for k, v in special.items()})
        self.exact_unembed = False
        self.taps: list[AH.Taps | None] = [None] * n_layers
        self.heads = {"qk": None, "v": False, "scores": False, "scale": [], "why": []}  # set by _probe_heads
        self.embed_out_hooked = False  # layer 0's input is hooked (not only read from hidden_states[0])
        self._head_names = [tuple(f"decoder.layers.{i}.self_attn.{r}" for r in HEAD_ROLES) for i in range(n_layers)]
        self._kv = [0] * n_layers  # each layer's K/V heads (the probe)
        self._probing = False
        self._probe()

    # ---------------------------------------------------------------- the probe at load

    def _probe(self) -> None:
        """Six tokens through the model at load: the shapes, and the checks that make each name exact (the
        hooked layer outputs are transformers' hidden states; lm_head(final norm) gives the logits; each head's
        q, k, v, z reproduce transformers' attention weights)."""
        c = self.cfg
        L = c.n_layers
        H0 = getattr(self.hf_config, "num_attention_heads", None) or getattr(self.hf_config, "n_head", None)
        d0 = getattr(self.hf_config, "hidden_size", None)
        for i, layer in enumerate(self.layers):
            attn = _attention_of(layer)
            if attn is not None and isinstance(H0, int) and isinstance(d0, int) and not _clips_qkv(self.hf_config):
                self.taps[i] = AH.taps(attn, self.model_type, H0, d0)
        self._install_hooks()
        ids = torch.arange(6, device=self._device()).unsqueeze(0) % max(self.embed.num_embeddings, 1) if isinstance(
            self.embed, torch.nn.Embedding) else torch.tensor([[0, 1, 2, 3, 4, 5]], device=self._device())
        every = {"decoder.embed.tok", "decoder.embed.out", "decoder.out", "logits",
                 *(f"decoder.layers.{i}.out" for i in range(L))}
        self._probing = True
        try:
            logits, got, out, call = self._forward(ids, every, probe=True)
        finally:
            self._probing = False
        atts = out.attentions
        if atts is None or len(atts) != L or any(a is None or a.dim() != 4 for a in atts):
            raise ModelLoadError(f"transformers' {self.model_type} does not return every layer's attention weights "
                                 "with eager attention, so the lab cannot show them exactly. Refused.")
        hs = out.hidden_states
        if hs is None or len(hs) != L + 1 or any(f"decoder.layers.{i}.out" not in got for i in range(L)):
            raise ModelLoadError(f"transformers' {self.model_type} does not return its residual stream after each "
                                 "layer. Refused.")
        for i in range(L - 1):  # our hooked layer i output is what layer i + 1 reads
            if not torch.equal(got[f"decoder.layers.{i}.out"], hs[i + 1]):
                raise ModelLoadError(f"transformers' {self.model_type}: the lab cannot tell which module's output is "
                                     "the residual stream after each layer. Refused.")
        self.embed_out_hooked = "decoder.embed.out" in got and torch.equal(got["decoder.embed.out"], hs[0])
        c.vocab_size = logits.shape[-1]
        c.d_model = hs[0].shape[-1]
        c.d_embed = got["decoder.embed.tok"].shape[-1]
        c.n_heads = atts[0].shape[1]
        c.kv_heads = getattr(self.hf_config, "num_key_value_heads", None) or c.n_heads
        c.head_dim = getattr(self.hf_config, "head_dim", None) or c.d_model // c.n_heads
        c.heads = [a.shape[1] for a in atts]
        if self.norm is not None and self.head is not None:
            with torch.no_grad():
                lens = self.head(self.norm(got[f"decoder.layers.{L - 1}.out"]))
            self.exact_unembed = lens.shape == logits.shape and torch.equal(lens, logits)
        self._probe_heads(call, atts)

    def _probe_heads(self, call: dict, atts) -> None:
        """Decide, for the whole model, which of q, k, v, the scores and z it gives: only what reproduces
        transformers' own weights on the probe's tokens (see adapter_heads)."""
        h = self.heads
        why = h["why"]
        L = self.cfg.n_layers
        if _clips_qkv(self.hf_config):
            why.append("q, k and v (it clips them inside transformers' attention)")
        parts = [call.get(("parts", i)) for i in range(L)]
        zs = [call.get(("z", i)) for i in range(L)]
        if any(t is None for t in self.taps) or any(p is None for p in parts) or any(z is None for z in zs):
            if not why:
                why.append(f"q, k and v (transformers' {self.model_type} attention has no q, k, v layers the lab "
                           "can split into heads)")
            why.append("each head's output z")
            self.taps = [None] * L
            return
        raw, rotated, alibi, kv = [], [], [], []
        try:
            for i, (t, p, z, w) in enumerate(zip(self.taps, parts, zs, atts, strict=True)):
                s = self._split(i, p)
                q, k, v = s["q"], s["k"], s["v"]
                H = w.shape[1]
                if q.shape[1] != H or H % k.shape[1] or k.shape != v.shape or q.shape[-1] != k.shape[-1]:
                    raise ValueError("heads")
                zz = AH.heads(z, t.head_dim)
                if zz.shape != q.shape or not _close(zz, w @ AH.repeat_kv(v, H), w.dtype, v.shape[2]):
                    raise ValueError("z")
                kv.append(k.shape[1])
                raw.append(_scale_of(t.attn, t.head_dim, q, k, w))
                rot = call.get("rot")
                if self.rotary is not None and rot is not None:
                    qr, kr = AH.rotate(t.attn, q, k, rot)
                    rotated.append(_scale_of(t.attn, t.head_dim, qr, kr, w))
                else:
                    rotated.append(None)
                alibi.append(_alibi_like(t.attn, t.head_dim, q, k, w))
        except (ValueError, RuntimeError, TypeError, IndexError, AttributeError):
            why += [f"q, k and v (transformers' {self.model_type} attention splits them in a way the lab does not "
                    "reproduce exactly)", "each head's output z"]
            self.taps = [None] * L
            return
        h["v"], self._kv, self.cfg.kv_heads = True, kv, kv[0]
        if all(s is not None for s in raw):
            h["qk"], h["scores"], h["scale"] = "raw", True, raw
        elif self.rotary is not None and all(s is not None for s in rotated):
            h["qk"], h["scores"], h["scale"] = "rotated", True, rotated
        elif all(alibi):  # before the rotary guess: Falcon with alibi=True has a rotary module it never applies
            h["qk"] = "alibi"
            why.append("the scores (its ALiBi position bias is added inside transformers' attention; q and k are "
                       "exact)")
        elif self.rotary is not None:
            h["qk"] = "unrot"
            why.append("q and k after its rotary embedding, and the scores (transformers applies a rotary the lab "
                       "does not reproduce exactly; q_unrot and k_unrot are before it)")
        else:
            why.append("q, k and the scores (its attention adds something to q·kᵀ the lab does not reproduce)")

    def _device(self):
        return next(self.hf.parameters()).device

    # ---------------------------------------------------------------- hooks on transformers' modules

    def _install_hooks(self) -> None:
        self.embed.register_forward_hook(partial(self._on_point, "decoder.embed.tok"))
        self.layers[0].register_forward_pre_hook(self._on_first_layer, with_kwargs=True)
        for i, layer in enumerate(self.layers):
            layer.register_forward_hook(partial(self._on_point, f"decoder.layers.{i}.out"))
        if self.norm is not None:
            self.norm.register_forward_hook(partial(self._on_point, "decoder.out"))
        if self.rotary is not None:
            self.rotary.register_forward_hook(self._on_rotary)
        for i, t in enumerate(self.taps):
            if t is None:
                continue
            for role, mod in t.proj.items():
                mod.register_forward_hook(partial(self._on_proj, i, role))
            for role, mod in t.norms.items():  # q/k norms: q and k are their outputs
                mod.register_forward_hook(partial(self._on_proj, i, "norm_" + role))
            t.out.register_forward_pre_hook(partial(self._on_z, i))
            t.out.register_forward_hook(partial(self._on_point, f"decoder.layers.{i}.self_attn.out"))

    @staticmethod
    def _on_point(name: str, mod, args, out):
        """A module's output is capture and hook point `name`: recorded, replaced by what the hooks return."""
        if not recorder.wanted(name):
            return None
        x = _first(out)
        y = recorder.record(name, x)
        return None if y is x else (y, *out[1:]) if isinstance(out, tuple) else y

    @staticmethod
    def _on_first_layer(mod, args, kwargs):
        """Layer 0's input is decoder.embed.out (what transformers returns as hidden_states[0])."""
        name = "decoder.embed.out"
        if not recorder.wanted(name):
            return None
        if args:
            y = recorder.record(name, args[0])
            return None if y is args[0] else ((y, *args[1:]), kwargs)
        if isinstance(kwargs.get("hidden_states"), torch.Tensor):
            x = kwargs["hidden_states"]
            y = recorder.record(name, x)
            return None if y is x else (args, {**kwargs, "hidden_states": y})
        return None

    @staticmethod
    def _on_rotary(mod, args, out):
        call = _CALL.get()
        if call is not None and isinstance(out, tuple | list) and len(out) >= 2:
            call["rot"] = out

    def _on_proj(self, i: int, role: str, mod, args, out):
        """Keep a q/k/v projection's (or q/k norm's) output for this call, when layer i's heads are asked for."""
        call = _CALL.get()
        if call is not None and (self._probing or any(map(recorder.wanted, self._head_names[i]))):
            call.setdefault(i, {})[role] = _first(out)

    def _on_z(self, i: int, mod, args):
        """W^O's input is the heads' z side by side: record q, k, v, scores, mask and z; apply hooks on z."""
        call = _CALL.get()
        parts = call.pop(i, None) if call is not None else None
        if self._probing:
            call[("parts", i)], call[("z", i)] = parts, args[0]
            return None
        if parts is not None:
            self._record_heads(i, parts, call)
        name = f"decoder.layers.{i}.self_attn.z"
        if not self.heads["v"] or not recorder.wanted(name):
            return None
        x = args[0]  # (B, T, H * hs)
        z = AH.heads(x, self.taps[i].head_dim)  # (B, H, T, hs)
        y = recorder.record(name, z)
        return None if y is z else (y.transpose(1, 2).reshape(x.shape), *args[1:])

    def _split(self, i: int, parts: dict) -> dict[str, torch.Tensor]:
        t = self.taps[i]
        s = AH.split(t, {r: parts[r] for r in ("q", "k", "v", "qkv") if r in parts})
        for r in ("q", "k"):
            if "norm_" + r in parts:  # q and k after their norms (Persimmon's q/k layernorm)
                s[r] = AH.heads(parts["norm_" + r], t.head_dim)
        return s

    def _record_heads(self, i: int, parts: dict, call: dict) -> None:
        h, n = self.heads, f"decoder.layers.{i}.self_attn"
        s = self._split(i, parts)
        q, k = s["q"], s["k"]  # (B, H, T, hs), (B, H_kv, T, hs)
        if h["qk"] in ("rotated", "unrot"):
            recorder.record(f"{n}.q_unrot", q)
            recorder.record(f"{n}.k_unrot", k)
        if h["qk"] == "rotated" and any(map(recorder.wanted, (f"{n}.q", f"{n}.k", f"{n}.scores"))):
            q, k = AH.rotate(self.taps[i].attn, q, k, call["rot"])
        if h["qk"] in ("raw", "rotated", "alibi"):
            recorder.record(f"{n}.q", q)
            recorder.record(f"{n}.k", k)
        recorder.record(f"{n}.v", s["v"])
        if h["scores"] and recorder.wanted(f"{n}.scores"):
            recorder.record(f"{n}.scores", (q @ AH.repeat_kv(k, q.shape[1]).transpose(-1, -2)) * h["scale"][i])
        if h["scores"] and recorder.wanted(f"{n}.mask"):
            T, window = q.shape[2], self._window(i)[1]
            blocked = _causal(T, q.device)
            if window is not None:  # a sliding window blocks keys `window` or more positions back
                blocked = blocked | torch.ones(T, T, dtype=torch.bool, device=q.device).tril(-window)
            recorder.record(f"{n}.mask", blocked.expand(q.shape[0], 1, T, T))

    # ---------------------------------------------------------------- forward

    def _forward(self, ids: torch.Tensor, wanted: set[str], reserve: int = 0, probe: bool = False):
        """transformers' forward under the recorder: -> (logits, {name: tensor}, transformers' output, the call's
        stash). Attention weights and hidden states are asked of transformers only when wanted."""
        weights = probe or any(n.endswith(".weights") for n in wanted)
        states = probe or ("decoder.embed.out" in wanted and not self.embed_out_hooked)
        call: dict = {}
        token = _CALL.set(call)
        try:
            with recorder.capturing(wanted, reserve) as rec, torch.no_grad():
                out = self.hf(input_ids=ids.to(self._device()), output_attentions=weights,
                              output_hidden_states=states, use_cache=False)
                if states and "decoder.embed.out" not in rec.tensors:
                    recorder.keep("decoder.embed.out", out.hidden_states[0])
                for i, a in enumerate(out.attentions or () if weights else ()):
                    recorder.keep(f"decoder.layers.{i}.self_attn.weights", a)
                logits = recorder.record("logits", out.logits)
        finally:
            _CALL.reset(token)
        return logits, rec.tensors, out, call

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V], transformers' own (under the hooks active in this call, if any)."""
        self._check_ids(ids)
        with torch.no_grad():
            return recorder.record("logits", self.hf(input_ids=ids.to(self._device()), use_cache=False).logits)

    def _check_ids(self, ids: torch.Tensor) -> None:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            raise ValueError("ids must be an integer tensor of shape (batch, length)")
        if ids.shape[1] == 0:
            raise ValueError("the token sequence is empty")
        if ids.shape[1] > self.cfg.max_len:
            raise recorder.ContextLengthError(
                f"sequence of {ids.shape[1]} tokens is longer than this model's limit max_len={self.cfg.max_len}",
                n_tokens=ids.shape[1], context_length=self.cfg.max_len)
        if int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size:
            raise ValueError(f"ids must be in [0, {self.cfg.vocab_size}); got ids in [{int(ids.min())}, "
                             f"{int(ids.max())}] (does the tokenizer match the model?)")

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        """A residual stream (B, T, D) -> logits through transformers' own final norm and lm_head; only where
        that is exactly how the model computes its logits (checked at load), else a sentence."""
        if not self.exact_unembed:
            raise ValueError(f"{self.model_type} via transformers: its logits are not lm_head(final norm(x)) "
                             "exactly, so the lab does not read layers through them")
        with torch.no_grad():
            return self.head(self.norm(x.to(self._device())))

    # ---------------------------------------------------------------- capture and hooks

    def capture_names(self, B: int = 1, T: int = 1) -> dict[str, tuple[int, ...]]:
        c, h = self.cfg, self.heads
        pts = {"decoder.embed.tok": (B, T, c.d_embed), "decoder.embed.out": (B, T, c.d_model)}
        for i in range(c.n_layers):
            n, t, H = f"decoder.layers.{i}.self_attn", self.taps[i], c.heads[i]
            if t is not None and h["v"]:
                hs, Hkv = t.head_dim, self._kv_heads(i)
                if h["qk"] in ("rotated", "unrot"):
                    pts |= {f"{n}.q_unrot": (B, H, T, hs), f"{n}.k_unrot": (B, Hkv, T, hs)}
                if h["qk"] in ("raw", "rotated", "alibi"):
                    pts |= {f"{n}.q": (B, H, T, hs), f"{n}.k": (B, Hkv, T, hs)}
                pts[f"{n}.v"] = (B, Hkv, T, hs)
                if h["scores"]:
                    pts |= {f"{n}.scores": (B, H, T, T), f"{n}.mask": (B, 1, T, T)}
            pts[f"{n}.weights"] = (B, H, T, T)
            if t is not None and h["v"]:
                pts |= {f"{n}.z": (B, H, T, t.head_dim), f"{n}.out": (B, T, c.d_model)}
            pts[f"decoder.layers.{i}.out"] = (B, T, c.d_model)
        if self.exact_unembed:
            pts["decoder.out"] = (B, T, c.d_model)
        return pts | {"logits": (B, T, c.vocab_size)}

    def _kv_heads(self, i: int) -> int:
        return self._kv[i]

    def hook_names(self) -> list[str]:
        """The points a hook can change exactly: transformers' module inputs and outputs (the embeddings, each
        head's z at W^O's input, the attention output, each layer's output, the final norm, the logits); not q, k,
        v, the scores or the weights, which live inside transformers' attention."""
        inside = tuple(f".self_attn.{r}" for r in (*HEAD_ROLES, "weights"))
        return [n for n in self.capture_names() if not n.endswith(inside)
                and (n != "decoder.embed.out" or self.embed_out_hooked)]

    def resolve_hooks(self, hooks) -> dict[str, list]:
        """{glob: fn} -> {point: [fn]}; a glob that names only points inside transformers' attention is refused in
        one sentence, one that matches nothing lists the hook points."""
        points = self.hook_names()
        inside = [n for n in self.capture_names() if n not in points]
        for pattern in hooks or {}:
            if not fnmatch.filter(points, pattern) and fnmatch.filter(inside, pattern):
                raise recorder.CaptureError(
                    f"{self.model_type} via transformers cannot change {pattern!r}: it is computed inside "
                    f"transformers' attention (hook points: each head's z, the attention output, the embeddings, "
                    f"each layer's output, the logits)")
        return recorder.resolve_hooks(points, hooks)

    def hooks(self, hooks) -> recorder.hooking:
        """`with m.hooks({"decoder.layers.1.self_attn.z": fn}):` every forward pass inside it runs under them."""
        return recorder.hooking(self.resolve_hooks(hooks))

    def run_with_hooks(self, ids: torch.Tensor, hooks=None) -> torch.Tensor:
        with self.hooks(hooks):
            return self(ids)

    def run_with_trace(self, ids: torch.Tensor, names: str | Sequence[str] | None = None, hooks=None,
                       budget_bytes: int | None = recorder.DEFAULT_BUDGET_BYTES, meta: dict | None = None,
                       lazy: bool = False, fast: bool = False, last_only: bool = False,
                       layers: bool = False) -> tuple[torch.Tensor, Trace]:
        """Logits and the trace of the named tensors (None: all), under `hooks` (hook_names). lazy/fast/last_only/
        layers are the lab's long-input paths, which this adapter has not: it always runs the full capture, within
        `budget_bytes`."""
        self._check_ids(ids)
        resolved = self.resolve_hooks(hooks)
        B, T = ids.shape
        shapes = self.capture_names(B, T)
        wanted = recorder.select_names(list(shapes), names)
        itemsize = next(self.hf.parameters()).element_size()
        n_bytes = recorder.estimate_bytes(shapes, wanted, itemsize)
        if budget_bytes is not None and n_bytes > budget_bytes:
            fits = self.max_tokens_within(budget_bytes, names)
            raise recorder.CaptureBudgetError(
                f"capturing {names!r} at {T} tokens needs about {n_bytes / 2**20:.1f} MiB, over the budget of "
                f"{budget_bytes / 2**20:.1f} MiB; the same names fit up to {fits} tokens", needed_bytes=n_bytes,
                budget=budget_bytes, n_tokens=T, max_tokens=fits, context_length=self.cfg.max_len)
        with recorder.hooking(resolved):
            logits, got, _, _ = self._forward(ids, set(wanted), n_bytes + 64 * len(wanted))
        info = {"config": self.config_dict(), "model": self.describe(), "tgt_ids": ids.tolist(),
                "mask_convention": "True = blocked (attention not allowed)", "training": False,
                "dtype": str(logits.dtype).removeprefix("torch."), "device": logits.device.type,
                "via": "transformers"}
        if hooks:
            info["hooks"] = {p: getattr(fn, "__name__", repr(fn)) if callable(fn) else repr(fn)
                             for p, fn in hooks.items()}
        info.update(meta or {})
        return logits, Trace({n: got[n] for n in wanted if n in got}, info)

    def trace_bytes(self, n_tokens: int, names=None) -> int:
        shapes = self.capture_names(1, n_tokens)
        itemsize = next(self.hf.parameters()).element_size()
        return recorder.estimate_bytes(shapes, recorder.select_names(list(shapes), names), itemsize)

    def max_tokens_within(self, budget_bytes: int, names=None) -> int:
        lo, hi = 0, self.cfg.max_len
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.trace_bytes(mid, names) <= budget_bytes else (lo, mid - 1)
        return lo

    def config_dict(self) -> dict:
        try:
            return json.loads(self.hf.config.to_json_string())
        except (TypeError, ValueError):
            return {"model_type": self.model_type}

    # ---------------------------------------------------------------- description

    def _window(self, i: int) -> tuple[str | None, int | None]:
        """Layer i's type (layer_types) and its sliding window, if any (keys i - j >= window are blocked)."""
        window = getattr(self.hf_config, "sliding_window", None)
        types = getattr(self.hf_config, "layer_types", None)
        kind = types[i] if isinstance(types, list | tuple) and len(types) == self.cfg.n_layers else None
        sliding = isinstance(window, int) and window > 0 and kind in (None, "sliding_attention") and (
            kind == "sliding_attention" or getattr(self.hf_config, "use_sliding_window", True) is not False)
        return kind, window if sliding else None

    def describe(self) -> dict:
        c, h = self.cfg, self.heads
        attention = {}
        for i in range(c.n_layers):
            kind, window = self._window(i)
            hs = self.taps[i].head_dim if self.taps[i] is not None else c.head_dim
            attention[f"decoder.layers.{i}.self_attn"] = attention_entry(
                "decoder_self", "decoder", i, c.heads[i], hs, self._kv[i] or c.kv_heads,
                window=window, layer_type=kind or "full_attention", via="transformers")
        blocks = {"d_model": c.d_model, "vocab_size": c.vocab_size, "model_type": self.model_type,
                  "architecture": type(self.hf).__name__, "exact_unembed": self.exact_unembed,
                  "q_k": h["qk"], "v_z": h["v"], "scores": h["scores"], "hooks": self.hook_names(),
                  "positions": POSITIONS.get(h["qk"])}
        # positions: what the probe found the attention does with positions: "rotary" (q and k turned), "alibi" (a
        # bias linear in the key's position), "none" (softmax(q·kᵀ·scale + mask) is its weights: positions, if
        # any, were added to the embeddings) or None (its q and k are not given, so not measured)
        # q_k: "raw" (no rotary), "rotated" (after its rotary; q_unrot, k_unrot before), "unrot" (before its rotary
        # only), "alibi" (exact; ALiBi adds its bias inside transformers' attention) or None (not given)
        lacks = list(h["why"]) + list(LACKS) + ([] if self.exact_unembed else [
            "the logit lens (its logits are not lm_head(final norm(x)) exactly)"])
        return {"family": FAMILY, "via": "transformers", "model_type": self.model_type,
                "stacks": {"decoder": {"layers": c.n_layers, "tokens": SIDES["decoder"]}},
                "attention": attention, "blocks": blocks,
                "gives": list(self.capture_names(1, 1)), "lacks": lacks}

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.hf.parameters())


class AdapterLanguageModel(LanguageModel):
    """A LanguageModel whose model is transformers' (AdapterModel): tokens, traces, hooks at the points transformers'
    modules expose and greedy generation as the lab's own; lazy traces are not given (describe()["lacks"])."""

    def __repr__(self) -> str:
        c = self.model.cfg
        return (f"LanguageModel({self.name} via transformers ({c.model_type}): {c.n_layers} layers, "
                f"d_model={c.d_model}, {c.n_heads} heads, {self.model.num_parameters() / 1e6:.0f}M parameters)")

    def run_with_trace(self, text_or_ids, names=None, hooks=None, budget_bytes=recorder.DEFAULT_BUDGET_BYTES,
                       chat: bool = False, lazy: bool = False, fast: bool = False, last_only: bool = False,
                       layers: bool = False) -> tuple[torch.Tensor, Trace]:
        ids = self._ids(text_or_ids, chat)
        meta = {"checkpoint": self.name, "text": text_or_ids if isinstance(text_or_ids, str) else None}
        if self.tokenizer is not None and ids.shape[0] == 1:
            meta["tgt_tokens"] = self.tokens(ids[0])
        return self.model.run_with_trace(ids, names=names, hooks=hooks, budget_bytes=budget_bytes, meta=meta)

    def trace_bytes(self, n_tokens: int, lazy: bool = False, names=None, layers: bool = False) -> int:
        return self.model.trace_bytes(n_tokens, names)  # no lazy trace here: always the full capture

    def run_with_hooks(self, text_or_ids, hooks=None, chat: bool = False) -> torch.Tensor:
        return self.model.run_with_hooks(self._ids(text_or_ids, chat), hooks=hooks)

    def stream(self, prompt_or_ids, max_new_tokens: int = 32, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int = 0, chat: bool = False, hooks=None, record: bool = True,
               on_step: Callable[[Step], None] | None = None, fast: bool = False) -> Iterator[Step]:
        """LanguageModel.stream through transformers' own KV cache; each step's attention row is transformers'
        output_attentions for the new position, over every position so far ([L, H, T_so_far]: a sliding-window layer's
        keys outside its window are 0, see _whole_rows). `hooks` (AdapterModel.hook_names) run in every
        step: a hook over positions (a mean) sees the step's positions only, as in the lab's own stream."""
        ids, room = self._prompt_and_room(prompt_or_ids, chat, max_new_tokens, temperature, top_k, top_p)
        m = self.model
        m._check_ids(ids)
        import inspect  # transformers 5.x names the KV cache `cache` (4.x: past_key_values, deprecated in 5)

        kw = "cache" if "cache" in inspect.signature(m.hf.forward).parameters else "past_key_values"
        past = None

        def forward(x: torch.Tensor, offset: int):
            nonlocal past
            out = m.hf(input_ids=x.to(m._device()), **{kw: past}, use_cache=True, output_attentions=record)
            past = getattr(out, kw)
            logits = recorder.hook("logits", out.logits)[0, -1].cpu()
            return logits, _whole_rows(out.attentions, offset + x.shape[1]) if record else None

        with torch.no_grad(), m.hooks(hooks):
            yield from self._sample(ids, min(max_new_tokens, room), forward, temperature, top_k, top_p, seed,
                                    on_step, self.stop_set(chat))


def _whole_rows(attentions, n_keys: int) -> torch.Tensor:
    """Each layer's attention row for the newest position, over all `n_keys` positions so far: [L, H, n_keys].

    A sliding-window layer's cache in transformers keeps only the last keys its window can still see, so its
    output_attentions cover the last `window` positions, not all of them (a full layer's cover all). The row the lab
    records is the whole causal row, as its own families record it: those keys sit at the end, and the keys the
    window dropped are blocked by the mask, so their weight is exactly 0 (issue 42)."""
    rows = []
    for a in attentions:
        r = a[0, :, -1].to("cpu", copy=True)  # (H, keys the layer's cache holds: the last ones)
        if r.shape[-1] > n_keys:
            raise RuntimeError(f"transformers returned attention over {r.shape[-1]} keys at a position that has "
                               f"{n_keys}")
        rows.append(torch.nn.functional.pad(r, (n_keys - r.shape[-1], 0)))
    return torch.stack(rows)


def _numel(files: list[Path]) -> int:
    """The number of weights the safetensors files hold, from their headers (already checked by the caller)."""
    n = 0
    for f in files:
        with open(f, "rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        for k, v in header.items():
            if k != "__metadata__" and isinstance(v, dict):
                numel = 1
                for s in v.get("shape", []):
                    numel *= int(s)
                n += numel
    return n


def load_adapter_dir(d: Path, hf: dict, files: list[Path], dtype: torch.dtype, device: torch.device,
                     tokenizer=None, **lm_kwargs) -> AdapterLanguageModel:
    """A checked directory (config.json read, safetensors headers checked) of a type the lab has no family for ->
    AdapterLanguageModel. Refused in one sentence: a mechanism that is not causal attention, a type transformers does
    not know as a causal LM, weights over the memory available."""
    why = refusal(hf)
    if why:
        raise ModelLoadError(why)
    tf = _transformers()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    kind = hf["model_type"]
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelLoadError(f"model type {kind!r} is not supported: transformers {tf.__version__} has no causal "
                             f"language model of that type; {_supported_text()}")
    size = _numel(files) * torch.empty(0, dtype=dtype).element_size()  # in the dtype they will be held in
    if size > available_bytes():
        name = str(dtype).removeprefix("torch.")
        raise ModelLoadError(f"{d.name}: its weights are {size / 2**30:.1f} GiB in {name}, more than this machine has "
                             f"available ({available_bytes() / 2**30:.1f} GiB). Refused before loading.")
    try:
        model, info = tf.AutoModelForCausalLM.from_pretrained(
            str(d), attn_implementation="eager", use_safetensors=True, local_files_only=True, trust_remote_code=False,
            dtype=dtype, output_loading_info=True)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError, ImportError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ModelLoadError(f"{d.name}: transformers could not open this {kind} model ({first})") from None
    missing = sorted(info.get("missing_keys") or ())
    mismatched = list(info.get("mismatched_keys") or ())
    from model.loaders.hf_common import IGNORED_SUFFIXES

    unexpected = sorted(k for k in info.get("unexpected_keys") or () if not k.endswith(IGNORED_SUFFIXES))
    if missing or mismatched or unexpected:  # transformers would fill or drop them silently: never half a model
        what = (f"lacks {len(missing)} tensors the config describes, e.g. {missing[:3]}" if missing else
                f"has {len(mismatched)} tensors whose shapes disagree with config.json, e.g. {mismatched[:2]}"
                if mismatched else f"has {len(unexpected)} tensors the config does not describe, e.g. {unexpected[:3]}")
        raise ModelLoadError(f"{d.name}: the checkpoint {what}: config.json and the weights do not match")
    if device.type != "cpu":
        model = model.to(device)
    try:
        adapted = AdapterModel(model, kind)
    except ModelLoadError as e:
        raise ModelLoadError(f"{d.name}: {e}") from None
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ModelLoadError(f"{d.name}: transformers' {kind} does not run with eager attention and every output "
                             f"this lab reads ({first}). Refused.") from None
    stop = lm_kwargs.pop("stop_ids", ())
    return AdapterLanguageModel(adapted, tokenizer, stop_ids=[i for i in stop if i < adapted.cfg.vocab_size],
                                **lm_kwargs)
