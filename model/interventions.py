"""Named interventions: small, documented functions over the model's hooks.

Every capture point is a hook point (see DESIGN.md, "Hooks"): a hook `fn(tensor, name)` returns the
tensor the model should continue with (same shape and dtype) or None. An intervention here is a
function that returns such a hooks dict, so the Experiments page, the tests and a user's script
share one mechanism:

    from model import load_checkpoint
    from model import interventions as iv

    ckpt = load_checkpoint("dates")
    hooks = iv.combine(iv.ablate_head("decoder.layers.1.cross_attn", 2), iv.no_scaling())
    out = ckpt.translate("3 november 2023", hooks=hooks)
    logits = ckpt.model.run_with_hooks(src, tgt, hooks=iv.build("no_positional"))

`build(spec)` makes the hooks from a spec string, the form the page keeps in its URL:
`"ablate_head:module=decoder.layers.1.cross_attn,head=2,mode=zero"`; a bad spec is a
`SpecError` that says what is valid. Hooks never write into the tensor they are given.

The seeds' own bugs are here too (`seed_qk_swap_concat`, `inverted_mask`, `pe_base_1000`, and
`seed_pad_loss`, which is a loss, not a hook), each with `BUGS[id]`: what went wrong, and why the
picture looks the way it does.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

Hook = Callable[[torch.Tensor, str], "torch.Tensor | None"]
Hooks = dict[str, Hook]

ATTN = "*_attn"  # glob over every attention module: encoder/decoder self_attn, decoder cross_attn
MODES = ("zero", "mean", "uniform")
SIDES = ("*", "encoder", "decoder")


def N_(msg: str) -> str:  # marks UI text for the translation catalog (viz.i18n translates it)
    return msg


class SpecError(ValueError):
    """An intervention spec that cannot be built (unknown name, argument or value)."""


# ---------------------------------------------------------------------- composing


def chain(*fns: Hook) -> Hook:
    """One hook that applies `fns` in order (each sees what the previous returned)."""

    def hook(t: torch.Tensor, name: str) -> torch.Tensor:
        for fn in fns:
            out = fn(t, name)
            t = t if out is None else out
        return t

    return hook


def combine(*hook_dicts: Hooks) -> Hooks:
    """Merge several interventions; two that hook the same glob are chained in the given order."""
    out: Hooks = {}
    for hooks in hook_dicts:
        for glob, fn in hooks.items():
            out[glob] = chain(out[glob], fn) if glob in out else fn
    return out


def _head_index(t: torch.Tensor, name: str, head: int) -> int:
    H = t.shape[1]
    if not -H <= head < H:
        raise ValueError(f"head {head} does not exist at {name}: it has {H} heads (0..{H - 1})")
    return head % H


# ---------------------------------------------------------------------- heads


def ablate_head(module: str, head: int, mode: str = "zero") -> Hooks:
    """Knock out one head of an attention module (a name or glob like "decoder.layers.1.cross_attn").
    Works on language models too: `head` is a query head (with grouped-query attention its K/V head
    stays, shared with the others; `ablate_kv_head` knocks that out, silencing all its query heads).

    - "zero": its output z = weights·V becomes 0, as if W^O's input columns for it were zero;
    - "mean": z of every position becomes z's mean over the positions of this pass (in
      step-by-step decoding a pass has one position, so use it teacher-forced);
    - "uniform": its scores become 0, so softmax spreads the weight evenly over the visible keys.
    """
    if mode not in MODES:
        raise SpecError(f"unknown ablation mode {mode!r}; choose one of {MODES}")
    if mode == "uniform":

        def flat(scores: torch.Tensor, name: str) -> torch.Tensor:  # (B, H, Lq, Lk)
            scores = scores.clone()
            scores[:, _head_index(scores, name, head)] = 0.0
            return scores

        return {f"{module}.scores": flat}

    def knock(z: torch.Tensor, name: str) -> torch.Tensor:  # (B, H, Lq, hs)
        h = _head_index(z, name, head)
        z = z.clone()
        z[:, h] = 0.0 if mode == "zero" else z[:, h].mean(dim=1, keepdim=True)
        return z

    return {f"{module}.z": knock}


def scale_head(module: str, head: int, factor: float = 2.0) -> Hooks:
    """Multiply one head's output z by `factor` (0 = zero ablation, 1 = unchanged)."""

    def scale(z: torch.Tensor, name: str) -> torch.Tensor:  # (B, H, Lq, hs)
        z = z.clone()
        z[:, _head_index(z, name, head)] *= factor
        return z

    return {f"{module}.z": scale}


def shared_query_heads(n_heads: int, n_kv_heads: int, kv_head: int) -> list[int]:
    """The query heads that read key/value head `kv_head` under grouped-query attention: query head h
    reads K/V head h // r (r = n_heads / n_kv_heads), so K/V head g serves g*r .. g*r + r - 1."""
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise SpecError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
    if not 0 <= kv_head < n_kv_heads:
        raise SpecError(f"K/V head {kv_head} does not exist: there are {n_kv_heads} (0..{n_kv_heads - 1})")
    r = n_heads // n_kv_heads
    return list(range(kv_head * r, kv_head * r + r))


def kv_head_note(n_heads: int, n_kv_heads: int, kv_head: int) -> str:
    """What ablating a shared K/V head does, in words (for a page or a log)."""
    heads = shared_query_heads(n_heads, n_kv_heads, kv_head)
    if len(heads) == 1:
        return f"K/V head {kv_head} belongs to query head {heads[0]} alone: ablating it silences that head."
    return (f"K/V head {kv_head} is shared by query heads {', '.join(map(str, heads))}: ablating it silences "
            f"all {len(heads)} of them at once (ablate_head silences one query head).")


def ablate_kv_head(module: str, kv_head: int, mode: str = "zero") -> Hooks:
    """Knock out one key/value head of a grouped-query attention module (Llama, SmolLM2: 9 query heads
    share 3 K/V heads). A K/V head is shared: ablating K/V head g silences query heads g*r .. g*r + r - 1
    (r = n_heads / n_kv_heads) all at once; `kv_head_note` says which. To silence one query head, use
    `ablate_head` (its z).

    - "zero": V of head g becomes 0, so z = weights·V of each of its query heads is exactly 0;
    - "mean": V of head g becomes its mean over the positions of this pass.
    """
    if mode not in ("zero", "mean"):
        raise SpecError(f"unknown K/V ablation mode {mode!r}; choose one of ('zero', 'mean')")

    def knock(v: torch.Tensor, name: str) -> torch.Tensor:  # (B, H_kv, Lk, hs)
        H = v.shape[1]
        if not -H <= kv_head < H:
            raise ValueError(f"K/V head {kv_head} does not exist at {name}: it has {H} K/V heads (0..{H - 1})")
        g = kv_head % H
        v = v.clone()
        v[:, g] = 0.0 if mode == "zero" else v[:, g].mean(dim=1, keepdim=True)
        return v

    return {f"{module}.v": knock}


def ablate_heads_by_row(table: dict[str, list[tuple[int, int]]], mode: str = "zero") -> Hooks:
    """One ablation per batch row, for batched head importance: `table[module]` lists the
    (row, head) pairs to knock out in that module. Modes as in `ablate_head`."""
    if mode not in MODES:
        raise SpecError(f"unknown ablation mode {mode!r}; choose one of {MODES}")
    point = "scores" if mode == "uniform" else "z"

    def make(pairs: list[tuple[int, int]]) -> Hook:
        rows = torch.tensor([r for r, _ in pairs])
        heads = torch.tensor([h for _, h in pairs])

        def knock(t: torch.Tensor, name: str) -> torch.Tensor:  # (B, H, Lq, ·)
            t = t.clone()
            if mode == "mean":
                t[rows, heads] = t[rows, heads].mean(dim=1, keepdim=True)
            else:
                t[rows, heads] = 0.0
            return t

        return knock

    return {f"{module}.{point}": make(pairs) for module, pairs in table.items() if pairs}


# ---------------------------------------------------------------------- tokens and positions


def block_source_token(position: int) -> Hooks:
    """Hide source token `position` as a key everywhere (encoder self-attention and cross-attention),
    exactly as if it were [PAD]: nothing can read it any more."""

    def block(mask: torch.Tensor, name: str) -> torch.Tensor:  # (B, 1, Lq, Lk) bool, True = blocked
        n = mask.shape[-1]
        if not -n <= position < n:
            raise ValueError(f"source position {position} does not exist at {name}: the source has {n} tokens")
        mask = mask.clone()
        mask[..., position] = True
        return mask

    return {"encoder.layers.*.self_attn.mask": block, "decoder.layers.*.cross_attn.mask": block}


def block_source_by_row(positions: list[int], first_row: int = 1) -> Hooks:
    """Row `first_row + i` hides source token `positions[i]` (batched blank-out attribution)."""
    rows = torch.arange(first_row, first_row + len(positions))
    cols = torch.tensor(positions)

    def block(mask: torch.Tensor, name: str) -> torch.Tensor:  # (B, 1, Lq, Lk)
        mask = mask.clone()
        mask[rows, :, :, cols] = True
        return mask

    return {"encoder.layers.*.self_attn.mask": block, "decoder.layers.*.cross_attn.mask": block}


def no_positional(side: str = "*") -> Hooks:
    """Add no positional encoding (side "encoder", "decoder" or "*"): the model sees a bag of
    tokens, and self-attention cannot tell their order."""
    if side not in SIDES:
        raise SpecError(f"unknown side {side!r}; choose one of {SIDES}")
    return {f"{side}.embed.pos": lambda pe, name: torch.zeros_like(pe)}


def shuffle_source(seed: int = 0) -> Hooks:
    """Give each source token the positional encoding of another position (a seeded permutation):
    the encoder reads the same tokens in a shuffled order."""

    def shuffle(pe: torch.Tensor, name: str) -> torch.Tensor:  # (S, D)
        g = torch.Generator().manual_seed(seed)
        return pe[torch.randperm(pe.shape[0], generator=g)]

    return {"encoder.embed.pos": shuffle}


def sinusoidal_positions(pe: torch.Tensor) -> torch.Tensor:
    """The positions whose sinusoidal encodings are the rows of `pe` (L, D), read off the slowest
    sin/cos pair: angle = atan2(sin, cos) mod 2π, position = angle / frequency (unambiguous below
    2π·10000^((D-2)/D) positions: 628 for D = 4). A decoding step gets only its own rows, no offset."""
    D = pe.shape[-1]
    freq = 10000.0 ** (-(D - 2) / D)
    angle = torch.atan2(pe[:, D - 2].double(), pe[:, D - 1].double()) % (2 * math.pi)
    return torch.round(angle / freq).long()


def sinusoidal_table(positions: torch.Tensor, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(...), for the given positions. (L, D)"""
    inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angle = positions.double()[:, None] * inv_freq
    pe = torch.zeros(len(positions), d_model, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return pe


# ---------------------------------------------------------------------- attention math


def no_scaling(d_k: int, module: str = ATTN) -> Hooks:
    """Skip the division by √d_k (d_k = d_model / n_heads, `cfg.d_head`): scores become QKᵀ instead
    of QKᵀ/√d_k, so their spread grows with √d_k and softmax saturates toward one-hot rows."""
    root = math.sqrt(d_k)
    return {f"{module}.scores": lambda scores, name: scores * root}


def no_lookahead_mask() -> Hooks:
    """Drop the look-ahead mask: every target position may read the later ones (what teacher forcing
    without the mask lets a model copy)."""
    return {"masks.causal": lambda m, name: torch.zeros_like(m)}


def no_padding_mask() -> Hooks:
    """Stop masking [PAD]: padded positions become keys like any other (matters in a padded batch)."""
    return {"masks.src_pad": lambda m, name: torch.zeros_like(m),
            "masks.tgt_pad": lambda m, name: torch.zeros_like(m)}


# ---------------------------------------------------------------------- the seeds' bugs


def _concat_without_transpose(z: torch.Tensor, name: str) -> torch.Tensor:
    """z (B, H, L, hs) such that the model's own "transpose back, then concat" yields what seed 001's
    `z.view(B, L, H * hs)` yields: the heads' memory read as if it were position-major."""
    B, H, L, hs = z.shape
    return z.reshape(B, L, H, hs).transpose(1, 2).contiguous()


def seed_qk_swap_concat() -> Hooks:
    """Seed 001's `MultiHeadAttention.forward`: it names its arguments (v, k, q) but is called as
    (q, k, v), so self-attention computes K·Qᵀ (the transposed scores), and it concatenates the heads
    with `view(B, L, H·hs)` without transposing (B, H, L, hs) back, which mixes positions and heads.
    The swap applies to self-attention (in seed 001's cross-attention the shapes do not even fit);
    the concat bug to every attention module. Needs full passes (no key/value cache)."""
    return {"*.self_attn.scores": lambda s, name: s.transpose(-2, -1).contiguous(),
            f"{ATTN}.z": _concat_without_transpose}


def inverted_mask() -> Hooks:
    """Seed 001 adds mask·(−1e9) (1 = blocked), seed 003 fills where mask == 0 (1 = keep): one's
    mask in the other's code blocks exactly what should be visible."""
    return {f"{ATTN}.mask": lambda m, name: ~m}


def pe_base_1000() -> Hooks:
    """Seed 004 writes the positional encoding's base as 1000 instead of 10000 (sinusoidal models)."""

    def rebase(pe: torch.Tensor, name: str) -> torch.Tensor:  # (L, D)
        return sinusoidal_table(sinusoidal_positions(pe), pe.shape[-1], base=1000.0).to(pe.dtype)

    return {"*.embed.pos": rebase}


def seed_pad_loss(logits: torch.Tensor, target: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Seed 001's loss: per-token cross-entropy with [PAD] positions zeroed, then `mean` over ALL
    positions, PAD included. logits (B, T, V), target (B, T)."""
    per_token = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")  # (B, T)
    return (per_token * (target != pad_id)).mean()


def pad_loss(logits: torch.Tensor, target: torch.Tensor, pad_id: int) -> torch.Tensor:
    """The right loss: mean cross-entropy over the non-[PAD] positions only."""
    return F.cross_entropy(logits.transpose(1, 2), target, ignore_index=pad_id)


# ---------------------------------------------------------------------- registry and specs


@dataclass(frozen=True)
class Intervention:
    id: str  # stable: used in URLs and specs, the same in every language
    label: str  # English; the UI translates it
    make: Callable[..., Hooks]
    bug: tuple[str, str] | None = None  # a seed bug: (what went wrong, why the picture looks so)

    def params(self) -> dict[str, inspect.Parameter]:
        """The spec arguments (config-derived ones such as d_k are filled by `build`)."""
        return {n: p for n, p in inspect.signature(self.make).parameters.items() if n not in _FROM_CONFIG}


_FROM_CONFIG = {"d_k": lambda cfg: cfg.d_head}  # TransformerConfig and LMConfig both have d_head

REGISTRY: dict[str, Intervention] = {iv.id: iv for iv in [
    Intervention("ablate_head", N_("Ablate a head"), ablate_head),
    Intervention("scale_head", N_("Scale a head"), scale_head),
    Intervention("block_source_token", N_("Block a source token"), block_source_token),
    Intervention("no_scaling", N_("No √d_k scaling"), no_scaling),
    Intervention("no_positional", N_("No positional encoding"), no_positional),
    Intervention("shuffle_source", N_("Shuffled source order"), shuffle_source),
    Intervention("no_lookahead_mask", N_("No look-ahead mask"), no_lookahead_mask),
    Intervention("no_padding_mask", N_("No padding mask"), no_padding_mask),
    Intervention("seed_qk_swap_concat", N_("Seed 001: Q/K swapped, heads concatenated without transpose"),
                 seed_qk_swap_concat, bug=(
        N_("Seed 001's attention takes its arguments as (v, k, q) but is called with (q, k, v), so "
           "self-attention scores are K·Qᵀ, and it concatenates the heads with view(B, L, H·d_k) "
           "without transposing (B, H, L, d_k) back first."),
        N_("The scores come out transposed before the softmax, so each token attends with its key instead of "
           "its query; and after the concatenation each position's vector is made of pieces of neighbouring "
           "positions of a single head, so the next layer reads scrambled features and the output falls apart."))),
    Intervention("inverted_mask", N_("Mask convention inverted (seed 001 vs 003)"), inverted_mask, bug=(
        N_("Seed 001 adds mask × (−1e9), so its masks mark blocked cells with 1; seed 003 fills where "
           "mask == 0, so its masks mark visible cells with 1. Passing one's mask to the other's code "
           "blocks exactly the cells that should be visible."),
        N_("Every token now sees only the padding (and the decoder only the future), and a sentence without "
           "padding has no visible key at all: those rows of attention become zero, so the maps go dark and "
           "the output no longer depends on the source."))),
    Intervention("pe_base_1000", N_("PE base 1000 (seed 004)"), pe_base_1000, bug=(
        N_("Seed 004 writes the positional encoding as sin(pos / 1000^(2i/d)) instead of "
           "sin(pos / 10000^(2i/d)): every dimension pair turns 10^(2i/d) times faster than the trained "
           "model expects."),
        N_("The fast dimensions are unchanged and the slow ones now spin, so nearby positions look "
           "farther apart than in training; attention that used position (the date fields, reversal) "
           "lands on the wrong tokens."))),
]}

SEED_LOSS_BUG = (
    N_("Seed 001's loss zeroes the cross-entropy at [PAD] targets but then takes the mean over all "
       "positions, [PAD] included, instead of dividing by the number of real tokens."),
    N_("So the loss is the right loss times the batch's share of real tokens: a batch with much padding "
       "looks better than it is, and its gradient (an effective learning rate) shrinks with the padding."))


def _cast(value: str, param: inspect.Parameter, spec: str):
    kind = param.annotation if isinstance(param.annotation, type) else {
        "int": int, "float": float, "str": str}.get(str(param.annotation), str)
    try:
        return kind(value)
    except ValueError:
        raise SpecError(f"{spec!r}: {param.name} must be {kind.__name__}, got {value!r}") from None


def parse(spec: str) -> tuple[str, dict]:
    """"id" or "id:arg=value,arg=value" -> (id, arguments cast to the function's types)."""
    ident, _, args = spec.strip().partition(":")
    ident = ident.strip()
    if ident not in REGISTRY:
        raise SpecError(f"unknown intervention {ident!r}; choose one of: {', '.join(REGISTRY)}")
    params = REGISTRY[ident].params()
    kwargs = {}
    for part in filter(None, (a.strip() for a in args.split(","))):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq:
            raise SpecError(f"{spec!r}: write arguments as name=value, got {part!r}")
        if key not in params:
            valid = ", ".join(f"{n}={p.default}" if p.default is not p.empty else n for n, p in params.items())
            raise SpecError(f"{spec!r}: {ident} has no argument {key!r}; its arguments: {valid or 'none'}")
        kwargs[key] = _cast(value.strip(), params[key], spec)
    missing = [n for n, p in params.items() if p.default is p.empty and n not in kwargs]
    if missing:
        raise SpecError(f"{spec!r}: {ident} needs {', '.join(missing)} (e.g. {ident}:{missing[0]}=...)")
    return ident, kwargs


def spec_of(ident: str, **kwargs) -> str:
    """The spec string of an intervention (inverse of `parse`)."""
    args = ",".join(f"{k}={v}" for k, v in kwargs.items())
    return f"{ident}:{args}" if args else ident


def build(specs: str | list[str], cfg=None) -> Hooks:
    """Hooks for one or more specs ("a;b" or a list); `cfg` (a TransformerConfig) fills the
    arguments the model fixes, such as d_k for no_scaling."""
    if isinstance(specs, str):
        specs = [s for s in specs.split(";") if s.strip()]
    out = []
    for spec in specs:
        ident, kwargs = parse(spec)
        make = REGISTRY[ident].make
        for name in inspect.signature(make).parameters:
            if name in _FROM_CONFIG:
                if cfg is None:
                    raise SpecError(f"{ident} needs the model's config (build(spec, cfg=model.cfg))")
                kwargs[name] = _FROM_CONFIG[name](cfg)
        try:
            out.append(make(**kwargs))
        except SpecError as e:
            raise SpecError(f"{spec!r}: {e}") from None
    return combine(*out)
