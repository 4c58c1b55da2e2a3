"""What a vision transformer's attention does over an image (issue 40), computed from a trace of
model/families/vit.py's VisionTransformer. No streamlit or plotly here; arrays in, numpy arrays out.

    attention_rollout(trace, index=0) -> (L, T, T)
        Abnar & Zuidema 2020: per layer Â_l = rownorm(0.5·mean_h A_l + 0.5·I) (the residual stream as the identity),
        R_l = Â_l · R_{l-1}, R_0 = Â_0. Row i of R_l: how much of each input token flowed into token i after layer l.
        Rows sum to 1. The [CLS] row over the patches (R[-1][0, n_prefix:]) is the usual rollout map.
    mean_attention_distance(trace, renormalise=True) -> (L, H), pixels
        The ViT paper's Figure 7 (right): per head, Σ_j a_ij · ||centre_i − centre_j|| over patch queries i and patch
        keys j (centres p·(r + ½, c + ½)), averaged over the patch queries and the images in the trace. With
        renormalise=True (default) a query's weights on the patches are divided by their sum, so the number is the
        distance of the attention it gives to patches; False counts attention on [CLS]/registers as distance 0 (Keras's
        "ViT mean attention distance" example, which slices the patch block without renormalising).
    position_similarity(model) -> (P, rows, cols)
        Figure 7 (centre): cosine similarity of patch p's position embedding with every patch's, as a grid.
    deciding_share(trace, decide_mask) -> dict
        Per (layer, head): the share of [CLS]'s attention on the patches that decide the answer (model/toy/shapes.py's
        decide_mask), averaged over the images, beside the share of the patches they cover (what a head spreading its
        attention evenly over the patches would give them).
    blank_patch_effect(model, image, target=None) -> (rows, cols)
        The causal effect of blanking each patch (its pixels set to 0, the task's background): the drop in the target
        class's probability (default: the model's answer). The /flow comparison's ground truth on images.
    head_ablation_effect(model, images, labels) -> dict
        Per (layer, head): accuracy and mean probability of the right class with that head's output zeroed (the lab's
        interventions.ablate_head), beside the unablated ones.

Every number reads the model's own captured tensors (`<attn>.weights`, the position table), never a re-run with other
settings, except blank_patch_effect and head_ablation_effect, which run the model on the changed inputs / hooks.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from model import interventions as iv


def _meta(trace) -> Mapping:
    meta = trace.meta
    if meta.get("family") != "vit":
        raise ValueError("this analysis needs a trace of a vision transformer (meta family 'vit')")
    return meta


def _weights(trace) -> list[np.ndarray]:
    """Every layer's `.weights` (B, H, T, T), as float64."""
    meta = _meta(trace)
    L = meta["config"]["n_layers"]
    names = [f"encoder.layers.{i}.self_attn.weights" for i in range(L)]
    missing = [n for n in names if n not in trace]
    if missing:
        raise ValueError(f"the trace lacks {missing[0]} (run_with_trace(..., names='*.weights') records them)")
    return [trace[n].double().numpy() for n in names]


def attention_rollout(trace, index: int = 0, residual: float = 0.5) -> np.ndarray:
    """(L, T, T): the rollout after each layer for image `index` of the trace (see the module docstring)."""
    out = []
    R = None
    for W in _weights(trace):
        A = W[index].mean(0)  # head mean (T, T)
        A = residual * np.eye(A.shape[0]) + (1 - residual) * A
        A = A / A.sum(-1, keepdims=True)
        R = A if R is None else A @ R
        out.append(R)
    return np.stack(out)


def patch_centres(meta: Mapping) -> np.ndarray:
    """(N, 2) pixel (y, x) of each patch's centre, row-major."""
    rows, cols = meta["grid"]
    p = meta["patch_size"]
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return np.stack([(r.reshape(-1) + 0.5) * p, (c.reshape(-1) + 0.5) * p], axis=1).astype(np.float64)


def patch_distances(meta: Mapping) -> np.ndarray:
    """(N, N) pixel distances between patch centres."""
    xy = patch_centres(meta)
    return np.sqrt(((xy[:, None] - xy[None]) ** 2).sum(-1))


def mean_attention_distance(trace, renormalise: bool = True) -> np.ndarray:
    """(L, H) in pixels: see the module docstring."""
    meta = _meta(trace)
    k = meta["n_prefix"]
    dist = patch_distances(meta)
    out = []
    for W in _weights(trace):
        A = W[:, :, k:, k:]  # (B, H, N, N): patch queries, patch keys
        if renormalise:
            A = A / np.clip(A.sum(-1, keepdims=True), 1e-30, None)
        out.append((A * dist).sum(-1).mean(axis=(0, 2)))  # over keys, then over images and queries
    return np.stack(out)


def position_table(model) -> np.ndarray:
    """(N, D) the position each patch gets (learned or fixed), without [CLS]."""
    return model.embed.positions().detach().double().numpy()[model.cfg.n_prefix:]


def position_similarity(model) -> np.ndarray:
    """(P, rows, cols): cosine similarity of patch p's position embedding with every patch's."""
    P = position_table(model)
    n = np.linalg.norm(P, axis=1, keepdims=True)
    S = (P / np.clip(n, 1e-30, None)) @ (P / np.clip(n, 1e-30, None)).T
    rows, cols = model.cfg.grid
    return S.reshape(len(P), rows, cols)


def deciding_share(trace, decide_mask) -> dict:
    """Per (layer, head) share of [CLS]'s attention on the deciding patches (see the module docstring).

    Returns {"share": (L, H) mean over images, "per_image": (B, L, H), "coverage": mean share of patches the
    deciding ones are, "coverage_per_image": (B,), "on_patches": (L, H) [CLS]'s attention on any patch (the rest
    is on [CLS] itself and the registers), "ratio": share / coverage (1 = no preference), "n_images": B}."""
    meta = _meta(trace)
    k = meta["n_prefix"]
    rows, cols = meta["grid"]
    mask = np.asarray(decide_mask, dtype=bool)
    Ws = _weights(trace)
    B = Ws[0].shape[0]
    if mask.shape != (B, rows, cols):
        raise ValueError(f"decide_mask must be (images, rows, cols) = {(B, rows, cols)}, got {mask.shape}")
    if not mask.reshape(B, -1).any(1).all():
        raise ValueError("every image needs at least one deciding patch in decide_mask")
    m = mask.reshape(B, 1, rows * cols).astype(np.float64)
    per = np.stack([(W[:, :, 0, k:] * m).sum(-1) for W in Ws], axis=1)  # (B, L, H)
    on = np.stack([W[:, :, 0, k:].sum(-1).mean(0) for W in Ws])  # (L, H)
    cover = mask.reshape(B, -1).mean(1)
    share = per.mean(0)
    return {"share": share, "per_image": per, "coverage": float(cover.mean()), "coverage_per_image": cover,
            "on_patches": on, "ratio": share / cover.mean(), "n_images": B}


@torch.no_grad()
def blank_patch_effect(model, image: torch.Tensor, target: int | None = None, fill: float = 0.0) -> np.ndarray:
    """(rows, cols): p(target | image) − p(target | image with that patch's pixels = fill), one batched forward."""
    cfg = model.cfg
    rows, cols = cfg.grid
    p = cfg.patch_size
    base = model(image).softmax(-1)[0]
    t = int(base.argmax()) if target is None else int(target)
    batch = image.repeat(rows * cols, 1, 1, 1).clone()
    for i in range(rows * cols):
        r, c = divmod(i, cols)
        batch[i, :, r * p:(r + 1) * p, c * p:(c + 1) * p] = fill
    probs = model(batch).softmax(-1)[:, t]
    return (float(base[t]) - probs).double().numpy().reshape(rows, cols)


@torch.no_grad()
def head_ablation_effect(model, images: torch.Tensor, labels) -> dict:
    """Per (layer, head): accuracy and mean p(right class) with that head's z zeroed. {"accuracy": (L, H),
    "p_right": (L, H), "base_accuracy": float, "base_p_right": float}."""
    y = torch.as_tensor(np.asarray(labels))
    cfg = model.cfg

    def score(hooks) -> tuple[float, float]:
        p = model.run_with_hooks(images, hooks=hooks).softmax(-1)
        return float((p.argmax(-1) == y).double().mean()), float(p.gather(1, y[:, None]).mean())

    acc = np.zeros((cfg.n_layers, cfg.n_heads))
    pr = np.zeros_like(acc)
    for layer in range(cfg.n_layers):
        for h in range(cfg.n_heads):
            acc[layer, h], pr[layer, h] = score(iv.ablate_head(f"encoder.layers.{layer}.self_attn", h))
    a0, p0 = score(None)
    return {"accuracy": acc, "p_right": pr, "base_accuracy": a0, "base_p_right": p0}
