"""Per-head q, k, v of a model opened via transformers (model/loaders/adapter.py), from its own linear modules.

transformers' attention modules compute q, k and v with linear layers the adapter can hook: separate ones
(q_proj, k_proj, v_proj) or one fused layer whose output each model type splits into heads its own way. This
module finds those layers in one attention module (`taps`) and splits their outputs into heads exactly as that
model type does (`split`), and applies a model's rotary embedding to the split q and k (`rotate`).

Nothing here is trusted by itself: the adapter's probe at load (AdapterModel._probe_heads) checks each claim
against transformers' own attention weights (z = weights·v; softmax(q·kᵀ·scale + mask) = weights) and gives
only what passes; `describe()["lacks"]` says what does not.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field

import torch

SEPARATE = ("q_proj", "k_proj", "v_proj")  # OLMo, OPT, XGLM, BioGPT, GPT-J, ...
FUSED = ("query_key_value", "c_attn", "Wqkv", "qkv_proj")  # Falcon/BLOOM/Persimmon, GPTBigCode, MPT, CodeGen
OUT = ("o_proj", "out_proj", "dense", "c_proj")  # the output projection W^O: its input is the heads' z side by side
QK_NORMS = (("q_layernorm", "k_layernorm"), ("q_norm", "k_norm"))  # applied to q and k before the rotary


@dataclass
class Taps:
    """The hookable modules of one attention module and how its heads are laid out."""
    attn: torch.nn.Module
    model_type: str
    n_heads: int
    head_dim: int
    proj: dict[str, torch.nn.Module]  # "q"/"k"/"v" -> its linear layer, or "qkv" -> the fused one
    out: torch.nn.Module  # W^O
    norms: dict[str, torch.nn.Module] = field(default_factory=dict)  # "q"/"k" -> its q/k norm


def _child(mod: torch.nn.Module, names) -> tuple[str, torch.nn.Module] | None:
    for n in names:
        m = getattr(mod, n, None)
        if isinstance(m, torch.nn.Module):
            return n, m
    return None


def taps(attn: torch.nn.Module, model_type: str, n_heads: int, d_model: int) -> Taps | None:
    """The taps of attention module `attn` (with n_heads query heads), or None where it has no linear layers the
    adapter knows how to split."""
    out = _child(attn, OUT)
    if out is None:
        return None
    head_dim = getattr(attn, "head_dim", None)
    head_dim = head_dim if isinstance(head_dim, int) and head_dim > 0 else d_model // n_heads
    if all(isinstance(getattr(attn, n, None), torch.nn.Module) for n in SEPARATE):
        proj = {r: getattr(attn, n) for r, n in zip("qkv", SEPARATE, strict=True)}
    elif (fused := _child(attn, FUSED)) is not None and model_type in SPLITS:
        proj = {"qkv": fused[1]}
    else:
        return None
    norms = {}
    for qn, kn in QK_NORMS:
        qm, km = getattr(attn, qn, None), getattr(attn, kn, None)
        if isinstance(qm, torch.nn.Module) and isinstance(km, torch.nn.Module):
            norms = {"q": qm, "k": km}
            break
    return Taps(attn, model_type, n_heads, head_dim, proj, out[1], norms)


def heads(x: torch.Tensor, hs: int) -> torch.Tensor:
    """(B, T, n * hs) or (B, T, n, hs) -> (B, n, T, hs)."""
    B, T = x.shape[:2]
    return x.reshape(B, T, -1, hs).transpose(1, 2)


# ---------------------------------------------------------------- fused layouts, one per model type


def _falcon(t: Taps, x: torch.Tensor):
    q, k, v = t.attn._split_heads(x)  # the model's own split: (B, T, h, hs) each
    if getattr(t.attn, "new_decoder_architecture", False):  # k, v broadcast to every query head of their group
        group = t.n_heads // t.attn.num_kv_heads
        k, v = k[:, :, ::group], v[:, :, ::group]
    return q, k, v


def _bloom(t: Taps, x: torch.Tensor):
    return tuple(y.transpose(1, 2) for y in t.attn._reshape(x))  # the model's own split, back to (B, T, H, hs)


def _persimmon(t: Taps, x: torch.Tensor):
    return t.attn._split_heads(x)  # (B, T, H, hs) each


def _gpt_bigcode(t: Taps, x: torch.Tensor):
    B, T, _ = x.shape
    hs = t.head_dim
    if t.attn.multi_query:  # [q of every head | one k | one v]
        q, k, v = x.split((t.n_heads * hs, hs, hs), dim=-1)
        return q.reshape(B, T, -1, hs), k.reshape(B, T, 1, hs), v.reshape(B, T, 1, hs)
    q, k, v = x.view(B, T, t.n_heads, 3 * hs).split(hs, dim=-1)  # per head [q | k | v]
    return q, k, v


def _mpt(t: Taps, x: torch.Tensor):
    return x.chunk(3, dim=-1)  # [all q | all k | all v]


def _codegen(t: Taps, x: torch.Tensor):
    B, T, _ = x.shape
    local = x.shape[-1] // 3 // t.attn.mp_num  # 4 model-parallel shards, each [q | v | k]
    q, v, k = x.view(B, T, -1, 3 * local).split(local, dim=-1)
    return tuple(y.reshape(B, T, t.n_heads, t.head_dim) for y in (q, k, v))


SPLITS = {"falcon": _falcon, "bloom": _bloom, "persimmon": _persimmon, "gpt_bigcode": _gpt_bigcode, "mpt": _mpt,
          "codegen": _codegen}


def split(t: Taps, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The projections' outputs ({"q", "k", "v"} or {"qkv"}) -> {"q": (B, H, T, hs), "k", "v": (B, H_kv, T, hs)}."""
    if "qkv" in outputs:
        q, k, v = SPLITS[t.model_type](t, outputs["qkv"])
        return {"q": heads(q, t.head_dim), "k": heads(k, t.head_dim), "v": heads(v, t.head_dim)}
    return {r: heads(x, t.head_dim) for r, x in outputs.items()}


# ---------------------------------------------------------------- rotary


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate(attn: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, rot: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k (B, H, T, hs) rotated by the model's rotary, from what its rotary module returned (`rot`), with the
    model module's own apply_rotary_pos_emb:
    - (q, k, cos, sin, ...) (Llama-style rotate-half; OLMo, Falcon, Persimmon): rot = (cos, sin), (B, T, r);
    - (tensor, sin, cos) (GPT-J-style rotate-every-two; GPT-J, CodeGen): rot = (sin, cos), (B, T, r / 2);
    else the rotate-half formula. The first r dims rotate, the rest pass (partial rotary). Whether this is what
    the model did is checked against its weights (the probe), never assumed."""
    fn = getattr(sys.modules.get(type(attn).__module__), "apply_rotary_pos_emb", None)
    try:
        params = list(inspect.signature(fn).parameters) if fn is not None else []
    except (TypeError, ValueError):
        params = []
    if params[:3] == ["tensor", "sin", "cos"]:
        sin, cos = rot[0], rot[1]
        r = 2 * sin.shape[-1]
        qr, kr = (fn(x[..., :r].transpose(1, 2), sin, cos).transpose(1, 2) for x in (q, k))  # it reads (B, T, H, r)
    else:
        cos, sin = rot[0], rot[1]
        r = cos.shape[-1]
        qr, kr = q[..., :r], k[..., :r]
        if params[:4] == ["q", "k", "cos", "sin"]:
            qr, kr = fn(qr, kr, cos, sin)
        else:
            c, s = cos.unsqueeze(1), sin.unsqueeze(1)
            qr, kr = qr * c + _rotate_half(qr) * s, kr * c + _rotate_half(kr) * s
    if r == q.shape[-1]:
        return qr, kr
    return torch.cat((qr, q[..., r:]), dim=-1), torch.cat((kr, k[..., r:]), dim=-1)


def repeat_kv(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, H_kv, T, hs) -> (B, H, T, hs): query head h reads K/V head h // (H / H_kv)."""
    return x.repeat_interleave(n_heads // x.shape[1], dim=1) if x.shape[1] != n_heads else x
