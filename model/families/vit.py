"""A vision transformer (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words"), instrumented like the rest of
the lab (issue 40): an image is a sequence of patches.

    image (B, C, H, W) -> patches (B, N, C·p·p), N = (H/p)·(W/p), row-major
    tokens = [CLS, reg0.., W_E·patch_1 + b, ...]      (+ positions: learned, or fixed 2-D sin/cos)
    pre-norm encoder blocks: x + Attn(LN1(x)), then x + FFN(LN2(x))   (the lab's own EncoderLayer, norm_first)
    logits = head(LN_final(x)[CLS])

The blocks are model/families/transformer.py's Encoder (pre-LN) with no padding, so every capture name, hook,
head ablation, snapshot and the residual decomposition work as on the text encoder. Register tokens (Darcet et al.
2024, "Vision Transformers Need Registers") are one switch: `ViTConfig(n_registers=4)`; they join after the
positions are added (they have none), between [CLS] and the patches.

Public API (the /vision page and lesson 20 rely on it):

    cfg = ViTConfig(image_size=32, patch_size=8, channels=3, d_model=64, n_heads=4, n_layers=4, d_ff=128,
                    n_classes=4, positional="learned" | "sinusoidal2d", n_registers=0, class_names=(...))
    model = VisionTransformer(cfg)
    logits = model(images)                                  # images (B, C, H, W) float in [0, 1] -> (B, n_classes)
    logits, trace = model.run_with_trace(images, names=None, hooks=None)
    trace["encoder.layers.0.self_attn.weights"]             # (B, H, T, T), T = 1 + n_registers + N
    model.run_with_hooks(images, hooks={...}); model.capture_names(B)   # every capture/hook point with its shape
    model = load_vit("shapes")                              # the shipped, trained model (eval mode); model.meta
    x = image_to_input(array, image_size=32)                # HxW, HxWx{1,3,4} uint8 or float -> (1, 3, H, W)
    token_labels(cfg) -> ["[CLS]", "reg0", ..., "p(0,0)", "p(0,1)", ...]   # token order of every capture

Capture names (the lab's, module path + role; B images, T tokens, N patches, D = d_model):

    masks.src_pad            (B, T) bool    all False (no padding: every token is real)
    encoder.embed.patches    (B, N, C·p·p)  the flattened pixels of each patch (channel, row, column inside it)
    encoder.embed.tok        (B, T, D)      [CLS], registers, W_E·patch + b: what each token is before positions
    encoder.embed.pos        (T, D)         positions added ([CLS] learned or 0 with sin/cos; registers 0)
    encoder.embed.out        (B, T, D)      the input of layer 0
    encoder.layers.{l}.{norm1, self_attn.*, norm2, ffn.*, out}   as the text encoder (DESIGN.md's table)
    encoder.norm.in/.out, encoder.out (B, T, D)
    logits                   (B, n_classes)

trace.meta: "family": "vit", "grid": [rows, cols], "patch_size", "image_size", "n_prefix" (1 + registers),
"n_registers", "class_names", "tokens" and "src_tokens" (the token labels; src_tokens is what the text views read),
"task", "question" (a loaded checkpoint's), "config", "model" (describe(): family "vit", one "encoder" stack),
"training", "dtype", "versions".
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
from torch import nn

from model.core import recorder
from model.core.attention import MultiHeadAttention, attention_mask
from model.core.config import TransformerConfig
from model.core.describe import attention_entry
from model.core.layers import FeedForward, LayerNorm
from model.core.recorder import Hook, record
from model.core.trace import Trace
from model.families.transformer import Encoder, EncoderLayer, _versions

POSITIONALS = ("learned", "sinusoidal2d")
VIT_DIR = Path(__file__).resolve().parent.parent / "toy" / "checkpoints" / "vision"
FORMAT, FORMAT_VERSION = "attention-lab-vit", "1"


@dataclass(frozen=True)
class ViTConfig:
    """Every size and switch of the vision transformer."""

    image_size: int = 32
    patch_size: int = 8
    channels: int = 3
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 128
    n_classes: int = 4
    positional: str = "learned"  # or "sinusoidal2d" (MAE's fixed 2-D sin/cos: half the dims row, half column)
    n_registers: int = 0  # Darcet et al. 2024: extra learned tokens with no position and no loss
    class_names: tuple[str, ...] = ()
    dropout: float = 0.0
    activation: str = "gelu"
    layer_norm_eps: float = 1e-6  # as the ViT paper's code (1e-6)

    def __post_init__(self) -> None:
        for f in ("image_size", "patch_size", "channels", "d_model", "n_heads", "n_layers", "d_ff", "n_classes"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{f} must be a positive integer, got {v!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size ({self.image_size}) must be a multiple of patch_size ({self.patch_size}): "
                             "the patches tile the image")
        if self.positional not in POSITIONALS:
            raise ValueError(f"positional must be one of {POSITIONALS}, got {self.positional!r}")
        if self.positional == "sinusoidal2d" and self.d_model % 4:
            raise ValueError(f"2-D sin/cos positions need d_model divisible by 4, got {self.d_model}")
        if not isinstance(self.n_registers, int) or self.n_registers < 0:
            raise ValueError(f"n_registers must be a non-negative integer, got {self.n_registers!r}")
        if self.class_names and len(self.class_names) != self.n_classes:
            raise ValueError(f"{len(self.class_names)} class names for {self.n_classes} classes")
        object.__setattr__(self, "class_names", tuple(self.class_names))

    @property
    def grid(self) -> tuple[int, int]:
        g = self.image_size // self.patch_size
        return g, g

    @property
    def n_patches(self) -> int:
        r, c = self.grid
        return r * c

    @property
    def n_prefix(self) -> int:
        """Tokens before the patches: [CLS] and the registers."""
        return 1 + self.n_registers

    @property
    def n_tokens(self) -> int:
        return self.n_prefix + self.n_patches

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def names(self) -> tuple[str, ...]:
        return self.class_names or tuple(f"class {i}" for i in range(self.n_classes))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["class_names"] = list(self.class_names)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> ViTConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)} for ViTConfig; known keys: {sorted(known)}")
        return cls(**d)

    def encoder_config(self) -> TransformerConfig:
        """The text encoder's config for the blocks (pre-LN, no decoder): the same EncoderLayer code."""
        return TransformerConfig(src_vocab_size=1, tgt_vocab_size=0, d_model=self.d_model, n_heads=self.n_heads,
                                 n_encoder_layers=self.n_layers, n_decoder_layers=0, d_ff=self.d_ff,
                                 dropout=self.dropout, max_len=self.n_tokens, norm_first=True,
                                 activation=self.activation, layer_norm_eps=self.layer_norm_eps)


def token_labels(cfg: ViTConfig) -> list[str]:
    """Labels in token order: "[CLS]", "reg0".., then "p(r,c)" row-major."""
    rows, cols = cfg.grid
    return (["[CLS]"] + [f"reg{i}" for i in range(cfg.n_registers)]
            + [f"p({r},{c})" for r in range(rows) for c in range(cols)])


def sincos_2d(rows: int, cols: int, d_model: int) -> torch.Tensor:
    """(rows·cols, D) fixed 2-D positions (MAE): the first D/2 dims are the 1-D sin/cos code of the row, the last
    D/2 of the column, each PE(p, 2i) = sin(p / 10000^(2i/(D/2))), PE(p, 2i+1) = cos(...)."""
    half = d_model // 2
    inv = 10000.0 ** (-torch.arange(0, half, 2, dtype=torch.float64) / half)

    def code(p: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(len(p), half, dtype=torch.float64)
        out[:, 0::2] = torch.sin(p[:, None] * inv)
        out[:, 1::2] = torch.cos(p[:, None] * inv)
        return out

    r, c = torch.meshgrid(torch.arange(rows, dtype=torch.float64), torch.arange(cols, dtype=torch.float64),
                          indexing="ij")
    return torch.cat([code(r.reshape(-1)), code(c.reshape(-1))], dim=1).float()


def patchify(images: torch.Tensor, p: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, C·p·p), patches row-major, each flattened (channel, row, column): the input of a
    stride-p convolution with kernel p, written as reshapes so W_E is one nn.Linear."""
    B, C, H, W = images.shape
    x = images.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(B, (H // p) * (W // p), C * p * p)


class PatchEmbedding(nn.Module):
    """Patches -> tokens: W_E·patch + b, [CLS] and registers in front, positions added."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        D, p = cfg.d_model, cfg.patch_size
        self.proj = nn.Linear(cfg.channels * p * p, D)
        self.cls = nn.Parameter(torch.zeros(1, 1, D))
        self.registers = nn.Parameter(torch.zeros(1, cfg.n_registers, D)) if cfg.n_registers else None
        if cfg.positional == "learned":
            self.pos = nn.Parameter(torch.zeros(1 + cfg.n_patches, D))  # [CLS] and the patches
        else:
            pe = torch.cat([torch.zeros(1, D), sincos_2d(*cfg.grid, D)])  # [CLS] gets 0 (as MAE)
            self.register_buffer("pe", pe, persistent=False)
        self.dropout = nn.Dropout(cfg.dropout)

    def positions(self) -> torch.Tensor:
        """(T, D): the positions added to each token, 0 on the registers (they have none)."""
        table = self.pos if hasattr(self, "pos") else self.pe
        if not self.cfg.n_registers:
            return table
        zeros = table.new_zeros(self.cfg.n_registers, table.shape[1])
        return torch.cat([table[:1], zeros, table[1:]])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        B = images.shape[0]
        patches = record("encoder.embed.patches", patchify(images, self.cfg.patch_size))
        prefix = [self.cls.expand(B, -1, -1)]
        if self.registers is not None:
            prefix.append(self.registers.expand(B, -1, -1))
        tok = record("encoder.embed.tok", torch.cat(prefix + [self.proj(patches)], dim=1))  # (B, T, D)
        x = tok + record("encoder.embed.pos", self.positions())
        return record("encoder.embed.out", self.dropout(x))

    def capture_points(self, B: int) -> dict[str, tuple[int, ...]]:
        c = self.cfg
        T, D = c.n_tokens, c.d_model
        return {"encoder.embed.patches": (B, c.n_patches, c.channels * c.patch_size ** 2),
                "encoder.embed.tok": (B, T, D), "encoder.embed.pos": (T, D), "encoder.embed.out": (B, T, D)}


class VisionTransformer(nn.Module):
    """Module tree: embed (proj, cls, registers, pos), encoder.layers[i].{norm1, self_attn, norm2, ffn},
    encoder.norm, head. Module paths are the capture names' prefixes ("encoder.layers.0.self_attn")."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        self.enc_cfg = cfg.encoder_config()
        self.embed = PatchEmbedding(cfg)
        self.encoder = Encoder(self.enc_cfg)
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)
        self.meta: dict = {}  # a loaded checkpoint's meta.json
        self._init_weights()
        for path, module in self.named_modules():
            if isinstance(module, MultiHeadAttention | FeedForward | EncoderLayer | LayerNorm):
                module.name = path

    def _init_weights(self) -> None:
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        e = self.embed
        for p in (e.cls, e.registers, getattr(e, "pos", None)):
            if p is not None:
                nn.init.trunc_normal_(p, std=0.02)
        nn.init.zeros_(self.head.weight)  # as the ViT paper's head: starts at uniform predictions

    # ------------------------------------------------------------------ forward

    def check_images(self, images: torch.Tensor) -> None:
        c = self.cfg
        want = (c.channels, c.image_size, c.image_size)
        if not isinstance(images, torch.Tensor) or images.dim() != 4 or tuple(images.shape[1:]) != want:
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise ValueError(f"images must be a float tensor (batch, {c.channels}, {c.image_size}, {c.image_size}) "
                             f"with values in [0, 1], got {shape}; image_to_input() resizes a picture")
        if not images.is_floating_point():
            raise ValueError(f"images must be floats in [0, 1], got {images.dtype}")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) in [0, 1] -> logits (B, n_classes)."""
        self.check_images(images)
        x = self.embed(images.to(self.head.weight.dtype))
        B, T = x.shape[:2]
        pad = record("masks.src_pad", torch.zeros(B, T, dtype=torch.bool, device=x.device))
        h = self.encoder(x, attention_mask(pad, T))  # nothing blocked: the same softmax as with no mask
        return record("logits", self.head(h[:, 0]))  # [CLS] after the final norm

    def predict(self, images: torch.Tensor) -> torch.Tensor:
        """Class probabilities (B, n_classes)."""
        with torch.no_grad():
            return self(images).softmax(-1)

    # ------------------------------------------------------------------ capture

    def capture_names(self, B: int = 1) -> dict[str, tuple[int, ...]]:
        """Every capture (and hook) point of a forward pass on B images, in computation order, with its shape."""
        T = self.cfg.n_tokens
        pts = self.embed.capture_points(B) | {"masks.src_pad": (B, T)} | self.encoder.capture_points(B, T)
        return pts | {"logits": (B, self.cfg.n_classes)}

    def resolve_hooks(self, hooks: Mapping[str, Hook | list[Hook]] | None) -> dict[str, list[Hook]]:
        return recorder.resolve_hooks(list(self.capture_names()), hooks)

    def hooks(self, hooks: Mapping[str, Hook | list[Hook]] | None) -> recorder.hooking:
        return recorder.hooking(self.resolve_hooks(hooks))

    def run_with_hooks(self, images: torch.Tensor, hooks=None) -> torch.Tensor:
        with self.hooks(hooks):
            return self(images)

    def run_with_trace(self, images: torch.Tensor, names: str | Sequence[str] | None = None,
                       hooks: Mapping[str, Hook | list[Hook]] | None = None,
                       budget_bytes: int | None = recorder.DEFAULT_BUDGET_BYTES,
                       meta: dict | None = None) -> tuple[torch.Tensor, Trace]:
        """Forward pass recording the named tensors (None = all; fnmatch globs); same math as forward, so the
        logits are bit-identical. With `hooks`, the model continues with what they return."""
        self.check_images(images)
        shapes = self.capture_names(images.shape[0])
        wanted = recorder.select_names(list(shapes), names)
        itemsize = next(self.parameters()).element_size()
        n_bytes = recorder.estimate_bytes(shapes, wanted, itemsize)
        recorder.check_budget(n_bytes, budget_bytes)
        with self.hooks(hooks), recorder.capturing(set(wanted), n_bytes + 64 * len(wanted)) as rec:
            out = self(images)
        info = self.trace_meta() | {"training": self.training, "dtype": str(out.dtype).removeprefix("torch."),
                                    "versions": _versions()}
        if hooks:
            info["hooks"] = {p: getattr(fn, "__name__", repr(fn)) if callable(fn) else repr(fn)
                             for p, fn in hooks.items()}
        info.update(meta or {})
        return out, Trace({n: rec.tensors[n] for n in wanted if n in rec.tensors}, info)

    def trace_meta(self) -> dict:
        c = self.cfg
        labels = token_labels(c)
        m = {"family": "vit", "grid": list(c.grid), "patch_size": c.patch_size, "image_size": c.image_size,
             "n_prefix": c.n_prefix, "n_registers": c.n_registers, "class_names": list(c.names()),
             "tokens": labels, "src_tokens": labels, "config": c.to_dict(), "model": self.describe(),
             "mask_convention": "True = blocked (attention not allowed)"}
        for k in ("task", "question", "name"):
            if k in self.meta:
                m[k] = self.meta[k]
        return m

    def describe(self) -> dict:
        return describe_vit(self.cfg)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def describe_vit(cfg: ViTConfig) -> dict:
    """model/core/describe.py's dict: one encoder stack of pre-LN blocks, family "vit"."""
    att = {f"encoder.layers.{i}.self_attn": attention_entry("encoder_self", "encoder", i, cfg.n_heads, cfg.d_head)
           for i in range(cfg.n_layers)}
    blocks = {"positional": cfg.positional, "norm": "layernorm", "norm_first": True, "norm_position": "pre",
              "ffn": "plain", "activation": cfg.activation, "d_model": cfg.d_model, "d_ff": cfg.d_ff,
              "patch_size": cfg.patch_size, "grid": list(cfg.grid), "n_registers": cfg.n_registers,
              "readout": "cls"}
    return {"family": "vit", "stacks": {"encoder": {"layers": cfg.n_layers, "tokens": "src_tokens"}},
            "attention": att, "blocks": blocks}


# ---------------------------------------------------------------------- input


def image_to_input(array, image_size: int = 32) -> torch.Tensor:
    """A picture -> the model's input (1, 3, image_size, image_size) float32 in [0, 1].

    array: H x W (grey), H x W x 1, x 3 (RGB) or x 4 (RGBA); uint8 (0..255) or float (0..1). Alpha is composited
    over black (the task's background: a transparent pixel is empty canvas), grey is repeated to 3 channels, and the
    picture is resized: averaged over areas when shrinking, nearest pixel when growing (an 8x8 digit stays sharp)."""
    a = np.asarray(array)
    if a.dtype == object or a.size == 0:
        raise ValueError("the image is empty: draw something or upload a picture")
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[..., 0]
    if a.ndim == 2:
        a = np.repeat(a[..., None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise ValueError(f"the image must be height x width with 1, 3 or 4 colour channels, got shape {a.shape}")
    if min(a.shape[:2]) < 1:
        raise ValueError("the image is empty: draw something or upload a picture")
    if a.dtype == np.uint8:
        x = a.astype(np.float32) / 255.0
    elif np.issubdtype(a.dtype, np.floating) or a.dtype == bool:
        x = a.astype(np.float32)
        if not np.isfinite(x).all():
            raise ValueError("the image has missing (NaN or infinite) pixel values")
        if x.min() < 0 or x.max() > 1:
            raise ValueError(f"float pixel values must be in 0..1 (uint8 pictures in 0..255), got "
                             f"{x.min():.3g}..{x.max():.3g}")
    elif np.issubdtype(a.dtype, np.integer):
        if a.min() < 0 or a.max() > 255:
            raise ValueError(f"integer pixel values must be in 0..255, got {a.min()}..{a.max()}")
        x = a.astype(np.float32) / 255.0
    else:
        raise ValueError(f"the image's pixels must be numbers, got {a.dtype}")
    if x.shape[2] == 4:
        x = x[..., :3] * x[..., 3:4]
    t = torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1)[None]  # (1, 3, H, W)
    H, W = t.shape[-2:]
    if (H, W) != (image_size, image_size):
        shrink = H >= image_size and W >= image_size
        t = nn.functional.interpolate(t, size=(image_size, image_size), mode="area" if shrink else "nearest")
    return t.clamp(0.0, 1.0).contiguous()


# ---------------------------------------------------------------------- checkpoints


def list_vits(root: str | Path = VIT_DIR) -> list[str]:
    """Names of the shipped vision transformers."""
    root = Path(root)
    return sorted(p.name for p in root.iterdir() if (p / "meta.json").is_file()) if root.is_dir() else []


def save_vit(model: VisionTransformer, out: str | Path, meta: Mapping | None = None,
             log: Mapping | None = None) -> Path:
    """config.json + model.safetensors + meta.json (+ log.json): safetensors and JSON only, never a pickle."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(model.cfg.to_dict(), indent=1))
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": FORMAT, "version": FORMAT_VERSION})
    (out / "model.safetensors").chmod(0o644)  # safetensors writes 0600; package data is read by everyone
    (out / "meta.json").write_text(json.dumps(dict(meta or {}), indent=1))
    if log is not None:
        (out / "log.json").write_text(json.dumps(dict(log)))
    return out


def load_vit(name: str | Path = "shapes") -> VisionTransformer:
    """A shipped vision transformer by name ("shapes"), or a directory save_vit wrote; in eval mode, with its
    meta.json as `model.meta` (task, held-out accuracy, the training command...)."""
    path = Path(name)
    if not (path / "meta.json").is_file():
        if str(name) not in list_vits():
            raise ValueError(f"no vision transformer named {str(name)!r}; shipped: {list_vits()}")
        path = VIT_DIR / str(name)
    return _load(str(path.resolve()))


@functools.lru_cache(maxsize=4)
def _load_cached(path: str) -> tuple[dict, dict, dict]:
    from safetensors import safe_open

    cfg = json.loads((Path(path) / "config.json").read_text())
    meta = json.loads((Path(path) / "meta.json").read_text())
    with safe_open(str(Path(path) / "model.safetensors"), framework="pt") as f:
        if (f.metadata() or {}).get("format") != FORMAT:
            raise ValueError(f"{path}/model.safetensors is not a vision transformer of the lab")
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
    return cfg, meta, state


def _load(path: str) -> VisionTransformer:
    cfg, meta, state = _load_cached(path)
    model = VisionTransformer(ViTConfig.from_dict(cfg))
    model.load_state_dict(state)
    model.meta = dict(meta)
    return model.eval()


@dataclass
class Prediction:
    label: int
    name: str
    probs: list[float] = field(default_factory=list)


def predict_one(model: VisionTransformer, image: torch.Tensor) -> Prediction:
    """The model's answer on one image (1, C, H, W)."""
    p = model.predict(image)[0]
    k = int(p.argmax())
    return Prediction(k, model.cfg.names()[k], [float(v) for v in p])


def sinusoidal_positions(cfg: ViTConfig) -> torch.Tensor:
    """The fixed table of a "sinusoidal2d" model, (N, D), for figures."""
    return sincos_2d(*cfg.grid, cfg.d_model)

