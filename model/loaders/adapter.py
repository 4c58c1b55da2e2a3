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
| `decoder.embed.out` | [B, T, D] | transformers' hidden_states[0]: what layer 0 reads |
| `decoder.layers.{i}.self_attn.weights` | [B, H, T, T] | transformers' output_attentions (eager) |
| `decoder.layers.{i}.out` | [B, T, D] | the decoder layer module's output (a forward hook) |
| `decoder.out` | [B, T, D] | the final norm's output, where lm_head(final norm(x)) gives the logits exactly |
| `logits` | [B, T, V] | the model's logits |

It lacks q, k, v and the scores, each head's output z, the norms inside a layer, the FFN's internals and hooks
(interventions); `describe()["lacks"]` says so and the pages that need them say it in one sentence. A model that
is not a plain causal attention LM (state-space or recurrent layers, hybrids, encoder-decoders, multimodal
wrappers) is refused in one sentence naming the mechanism, before any weight is read.

transformers is imported here only, lazily: the lab's own families never import it (pip extra `.[any-model]`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

import torch

from model.core import recorder
from model.core.describe import SIDES, attention_entry
from model.core.trace import Trace
from model.loaders.hf_common import ModelLoadError, available_bytes
from model.loaders.lm import LanguageModel, Step, _check_sampling, _choose, make_step

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
NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "norm_f", "final_norm")
LACKS = ("q, k and v (and the scores before the softmax)", "each head's output z", "the norms inside a layer",
         "the feed-forward network's internals", "hooks and interventions", "lazy traces for long inputs")


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


def _first(out):
    return out[0] if isinstance(out, tuple | list) else out


class AdapterModel(torch.nn.Module):
    """transformers' causal LM behind the lab's model API (run_with_trace, capture_names, describe, unembed)."""

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
        max_len = next((v for k in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
                        if isinstance(v := getattr(conf, k, None), int) and v > 0), 2048)
        self.cfg = SimpleNamespace(n_layers=n_layers, max_len=max_len, vocab_size=None, d_model=None, n_heads=None,
                                   kv_heads=None, head_dim=None, d_embed=None, model_type=model_type)
        self.exact_unembed = False
        self._probe()

    # ---------------------------------------------------------------- the probe at load

    def _probe(self) -> None:
        """Two tokens through the model at load: the shapes, and the checks that make each name exact (the
        hooked layer outputs are transformers' hidden states; lm_head(final norm) gives the logits)."""
        ids = torch.tensor([[0, 1]], device=self._device())
        logits, got, out = self._forward(ids, record=True)
        c = self.cfg
        L = c.n_layers
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

    def _device(self):
        return next(self.hf.parameters()).device

    def _forward(self, ids: torch.Tensor, record: bool):
        """transformers' forward with output_attentions and output_hidden_states; the layer outputs and the
        token embedding by forward hooks. -> (logits, {name: tensor}, transformers' output)."""
        got: dict[str, torch.Tensor] = {}
        handles = []
        if record:
            handles.append(self.embed.register_forward_hook(
                lambda m, a, o: got.__setitem__("decoder.embed.tok", _first(o))))
            for i, layer in enumerate(self.layers):
                handles.append(layer.register_forward_hook(
                    lambda m, a, o, i=i: got.__setitem__(f"decoder.layers.{i}.out", _first(o))))
            if self.norm is not None:
                handles.append(self.norm.register_forward_hook(
                    lambda m, a, o: got.__setitem__("decoder.out", _first(o))))
        try:
            with torch.no_grad():
                out = self.hf(input_ids=ids.to(self._device()), output_attentions=record,
                              output_hidden_states=record, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        if record:
            got["decoder.embed.out"] = out.hidden_states[0]
            for i, a in enumerate(out.attentions or ()):
                got[f"decoder.layers.{i}.self_attn.weights"] = a
        return out.logits, got, out

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V], transformers' own."""
        self._check_ids(ids)
        with torch.no_grad():
            return self.hf(input_ids=ids.to(self._device()), use_cache=False).logits

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

    # ---------------------------------------------------------------- capture

    def capture_names(self, B: int = 1, T: int = 1) -> dict[str, tuple[int, ...]]:
        c = self.cfg
        pts = {"decoder.embed.tok": (B, T, c.d_embed), "decoder.embed.out": (B, T, c.d_model)}
        for i in range(c.n_layers):
            pts[f"decoder.layers.{i}.self_attn.weights"] = (B, c.heads[i], T, T)
            pts[f"decoder.layers.{i}.out"] = (B, T, c.d_model)
        if self.exact_unembed:
            pts["decoder.out"] = (B, T, c.d_model)
        return pts | {"logits": (B, T, c.vocab_size)}

    def run_with_trace(self, ids: torch.Tensor, names: str | Sequence[str] | None = None, hooks=None,
                       budget_bytes: int | None = recorder.DEFAULT_BUDGET_BYTES, meta: dict | None = None,
                       lazy: bool = False, fast: bool = False, last_only: bool = False,
                       layers: bool = False) -> tuple[torch.Tensor, Trace]:
        """Logits and the trace of the named tensors (None: all). lazy/fast/last_only/layers are the lab's long-input
        paths, which this adapter has not: it always runs the full capture, within `budget_bytes`."""
        if hooks:
            raise ValueError(f"{self.model_type} via transformers takes no hooks: interventions need the lab's own "
                             "families")
        self._check_ids(ids)
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
        logits, got, _ = self._forward(ids, record=True)
        got["logits"] = logits
        info = {"config": self.config_dict(), "model": self.describe(), "tgt_ids": ids.tolist(),
                "mask_convention": "True = blocked (attention not allowed)", "training": False,
                "dtype": str(logits.dtype).removeprefix("torch."), "device": logits.device.type,
                "via": "transformers"}
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

    def describe(self) -> dict:
        c = self.cfg
        window = getattr(self.hf_config, "sliding_window", None)
        types = getattr(self.hf_config, "layer_types", None)
        attention = {}
        for i in range(c.n_layers):
            kind = types[i] if isinstance(types, list | tuple) and len(types) == c.n_layers else None
            sliding = isinstance(window, int) and window > 0 and kind in (None, "sliding_attention") and (
                kind == "sliding_attention" or getattr(self.hf_config, "use_sliding_window", True) is not False)
            attention[f"decoder.layers.{i}.self_attn"] = attention_entry(
                "decoder_self", "decoder", i, c.heads[i], c.head_dim, c.kv_heads,
                window=window if sliding else None, layer_type=kind or "full_attention", via="transformers")
        blocks = {"d_model": c.d_model, "vocab_size": c.vocab_size, "model_type": self.model_type,
                  "architecture": type(self.hf).__name__, "exact_unembed": self.exact_unembed}
        lacks = list(LACKS) + ([] if self.exact_unembed else ["the logit lens (its logits are not lm_head(final "
                                                              "norm(x)) exactly)"])
        return {"family": FAMILY, "via": "transformers", "model_type": self.model_type,
                "stacks": {"decoder": {"layers": c.n_layers, "tokens": SIDES["decoder"]}},
                "attention": attention, "blocks": blocks,
                "gives": list(self.capture_names(1, 1)), "lacks": lacks}

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.hf.parameters())


class AdapterLanguageModel(LanguageModel):
    """A LanguageModel whose model is transformers' (AdapterModel): tokens, traces and greedy generation as the lab's
    own; hooks, lazy traces and q/k/v are not given (describe()["lacks"])."""

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
        if hooks:
            raise ValueError(f"{self.name} runs via transformers and takes no hooks: interventions need the lab's "
                             "own families")
        return self.model(self._ids(text_or_ids, chat))

    def stream(self, prompt_or_ids, max_new_tokens: int = 32, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int = 0, chat: bool = False, hooks=None, record: bool = True,
               on_step: Callable[[Step], None] | None = None, fast: bool = False) -> Iterator[Step]:
        """LanguageModel.stream through transformers' own KV cache; each step's attention row is transformers'
        output_attentions for the new position ([L, H, T_so_far])."""
        _check_sampling(max_new_tokens, temperature, top_k, top_p)
        if hooks:
            raise ValueError(f"{self.name} runs via transformers and takes no hooks")
        ids = self._ids(prompt_or_ids, chat)
        if ids.shape[0] != 1:
            raise ValueError(f"generate takes one prompt (batch 1), got a batch of {ids.shape[0]}")
        m = self.model
        m._check_ids(ids)
        gen = torch.Generator().manual_seed(int(seed))
        room = m.cfg.max_len - ids.shape[1]
        if room <= 0:
            raise ValueError(f"the prompt has {ids.shape[1]} tokens, the model's limit is {m.cfg.max_len}: "
                             "no room to generate")
        past, x, offset = None, ids, 0
        import inspect  # transformers 5.x names the KV cache `cache` (4.x: past_key_values, deprecated in 5)

        kw = "cache" if "cache" in inspect.signature(m.hf.forward).parameters else "past_key_values"
        with torch.no_grad():
            for _ in range(min(max_new_tokens, room)):
                out = m.hf(input_ids=x.to(m._device()), **{kw: past}, use_cache=True, output_attentions=record)
                past = getattr(out, kw)
                logits = out.logits[0, -1].cpu()
                offset += x.shape[1]
                probs = torch.softmax(logits.float(), dim=-1)
                chosen, drawn = _choose(logits, probs, temperature, top_k, top_p, gen)
                attention = torch.stack([a[0, :, -1].to("cpu", copy=True) for a in out.attentions]) if record else None
                step = make_step(self._piece, chosen, probs, drawn, attention, offset - 1, temperature)
                if on_step is not None:
                    on_step(step)
                yield step
                if chosen in self.stop_ids:
                    return
                x = torch.tensor([[chosen]], dtype=torch.long)


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
