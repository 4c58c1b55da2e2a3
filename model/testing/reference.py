"""Copy our weights into PyTorch's own modules: the independent references for tests and benchmarks."""

from __future__ import annotations

import torch
from torch import nn

from model.core.attention import MultiHeadAttention
from model.families.transformer import DecoderLayer, EncoderLayer, Transformer


@torch.no_grad()
def to_torch_mha(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    d = ours.w_q.in_features
    ref = nn.MultiheadAttention(d, ours.n_heads, dropout=0.0, batch_first=True)
    ref.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
    ref.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
    ref.out_proj.weight.copy_(ours.w_o.weight)
    ref.out_proj.bias.copy_(ours.w_o.bias)
    return ref.eval()


def _layer_kwargs(model_cfg) -> dict:
    c = model_cfg
    return dict(d_model=c.d_model, nhead=c.n_heads, dim_feedforward=c.d_ff, dropout=0.0,
                activation=c.activation, layer_norm_eps=c.layer_norm_eps, batch_first=True,
                norm_first=c.norm_first)


@torch.no_grad()
def _copy_common(ref, ours) -> None:
    ref.linear1.load_state_dict(ours.ffn.linear1.state_dict())
    ref.linear2.load_state_dict(ours.ffn.linear2.state_dict())
    for i in (1, 2, 3):
        if hasattr(ours, f"norm{i}"):
            getattr(ref, f"norm{i}").load_state_dict(getattr(ours, f"norm{i}").state_dict())


def to_torch_encoder_layer(ours: EncoderLayer, cfg) -> nn.TransformerEncoderLayer:
    ref = nn.TransformerEncoderLayer(**_layer_kwargs(cfg))
    ref.self_attn = to_torch_mha(ours.self_attn)
    _copy_common(ref, ours)
    return ref.eval()


def to_torch_decoder_layer(ours: DecoderLayer, cfg) -> nn.TransformerDecoderLayer:
    ref = nn.TransformerDecoderLayer(**_layer_kwargs(cfg))
    ref.self_attn = to_torch_mha(ours.self_attn)
    ref.multihead_attn = to_torch_mha(ours.cross_attn)
    _copy_common(ref, ours)
    return ref.eval()


def to_torch_transformer(model: Transformer) -> nn.Transformer:
    """An nn.Transformer computing the same stacks (embeddings and generator stay ours).

    nn.Transformer always has final norms; post-LN (ours has none there) gets identities.
    """
    cfg = model.cfg
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(**_layer_kwargs(cfg)), cfg.n_encoder_layers,
                                norm=None, enable_nested_tensor=False)
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(**_layer_kwargs(cfg)), cfg.n_decoder_layers, norm=None)
    for i, layer in enumerate(model.encoder.layers):
        enc.layers[i] = to_torch_encoder_layer(layer, cfg)
    for i, layer in enumerate(model.decoder.layers):
        dec.layers[i] = to_torch_decoder_layer(layer, cfg)
    enc.norm = model.encoder.norm if model.encoder.norm is not None else nn.Identity()
    dec.norm = model.decoder.norm if model.decoder.norm is not None else nn.Identity()
    # Assign after construction: nn.Transformer.__init__ re-initialises every parameter it is given.
    ref = nn.Transformer(d_model=cfg.d_model, nhead=cfg.n_heads, custom_encoder=nn.Identity(),
                         custom_decoder=nn.Identity(), batch_first=True)
    ref.encoder, ref.decoder = enc, dec
    return ref.eval()
