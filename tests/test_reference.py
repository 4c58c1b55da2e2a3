"""Our explicit math against PyTorch's own modules with the same weights (tolerance 1e-5, float32)."""

import pytest
import torch
from conftest import small_config
from tolerance import f32_tol

from model import Transformer, attention_mask, causal_mask
from model.core.recorder import capturing
from model.testing.reference import (
    to_torch_decoder_layer,
    to_torch_encoder_layer,
    to_torch_mha,
    to_torch_transformer,
)

# ours against torch.nn's modules: float32 rounding of the largest output (below 4 on these small models)
# x sqrt(d_model = 32), a few ulps each (tests/tolerance.py)
ATOL = f32_tol(4.0, n=32)
VARIANTS = [(nf, act) for nf in (False, True) for act in ("relu", "gelu")]


def _close(a, b):
    assert (a - b).abs().max().item() < ATOL


@torch.no_grad()
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_torch_mha_per_head(small_model, batch, causal):
    src, _ = batch
    mha = small_model.encoder.layers[0].self_attn
    x = torch.randn(2, src.shape[1], 32)
    pad = src == 0
    future = causal_mask(src.shape[1]) if causal else None
    with capturing({"encoder.layers.0.self_attn.weights"}) as rec:
        out = mha(x, x, attention_mask(pad, src.shape[1], future))
    ref_out, ref_w = to_torch_mha(mha)(x, x, x, key_padding_mask=pad, attn_mask=future,
                                       need_weights=True, average_attn_weights=False)
    _close(out, ref_out)
    _close(rec.tensors["encoder.layers.0.self_attn.weights"], ref_w)  # (B, H, L, L), head by head


@torch.no_grad()
def test_cross_attention_matches_torch_mha(small_model, batch):
    src, tgt = batch
    mha = small_model.decoder.layers[0].cross_attn
    y, mem = torch.randn(2, tgt.shape[1], 32), torch.randn(2, src.shape[1], 32)
    out = mha(y, mem, attention_mask(src == 0, tgt.shape[1]))
    ref_out, _ = to_torch_mha(mha)(y, mem, mem, key_padding_mask=src == 0)
    _close(out, ref_out)


@torch.no_grad()
@pytest.mark.parametrize("norm_first,activation", VARIANTS)
def test_encoder_layer_matches_torch(batch, norm_first, activation):
    torch.manual_seed(0)
    cfg = small_config(norm_first=norm_first, activation=activation)
    layer = Transformer(cfg).eval().encoder.layers[0]
    src, _ = batch
    x = torch.randn(2, src.shape[1], 32)
    ours = layer(x, attention_mask(src == 0, src.shape[1]))
    ref = to_torch_encoder_layer(layer, cfg)(x, src_key_padding_mask=src == 0)
    keep = src != 0  # torch's fast path may zero padded rows; compare the real tokens
    _close(ours[keep], ref[keep])


@torch.no_grad()
@pytest.mark.parametrize("norm_first,activation", VARIANTS)
def test_decoder_layer_matches_torch(batch, norm_first, activation):
    torch.manual_seed(0)
    cfg = small_config(norm_first=norm_first, activation=activation)
    layer = Transformer(cfg).eval().decoder.layers[0]
    src, tgt = batch
    T = tgt.shape[1]
    y, mem = torch.randn(2, T, 32), torch.randn(2, src.shape[1], 32)
    future = causal_mask(T)
    ours = layer(y, mem, attention_mask(tgt == 0, T, future), attention_mask(src == 0, T))
    ref = to_torch_decoder_layer(layer, cfg)(y, mem, tgt_mask=future, tgt_key_padding_mask=tgt == 0,
                                             memory_key_padding_mask=src == 0)
    _close(ours, ref)


@torch.no_grad()
@pytest.mark.parametrize("norm_first,activation", VARIANTS)
def test_full_model_matches_nn_transformer(batch, norm_first, activation):
    torch.manual_seed(0)
    model = Transformer(small_config(norm_first=norm_first, activation=activation)).eval()
    src, tgt = batch
    ref = to_torch_transformer(model)
    y = ref(model.src_embed(src), model.tgt_embed(tgt), tgt_mask=causal_mask(tgt.shape[1]),
            src_key_padding_mask=src == 0, tgt_key_padding_mask=tgt == 0, memory_key_padding_mask=src == 0)
    _close(model(src, tgt), model.generator(y))
