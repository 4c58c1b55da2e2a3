"""Invariants of the math, checked on captured tensors, plus closed forms."""

import math

import pytest
import torch
from conftest import small_config
from tolerance import f32_tol

from model import (
    Transformer,
    TransformerConfig,
    attention_mask,
    causal_mask,
    label_smoothed_loss,
    noam_lr,
    padding_mask,
    sinusoidal_encoding,
)


def attn_names(trace):
    return sorted({n.rsplit(".", 1)[0] for n in trace.names() if n.endswith(".weights")})


@torch.no_grad()
def test_weights_rows_sum_to_one_and_masked_cells_are_zero(small_model, batch):
    _, trace = small_model.run_with_trace(*batch)
    prefixes = attn_names(trace)
    assert len(prefixes) == 2 + 2 * 2
    for p in prefixes:
        w, mask = trace[f"{p}.weights"], trace[f"{p}.mask"].expand_as(trace[f"{p}.weights"])
        # a float32 softmax row of S weights <= 1 sums to 1 up to a few ulps x sqrt(S)
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), atol=f32_tol(1, n=w.shape[-1]), rtol=0)
        assert (w[mask] == 0).all(), p  # exactly 0, not merely small
        assert torch.isfinite(trace[f"{p}.scores"]).all()


@torch.no_grad()
def test_decoder_self_attention_upper_triangle_is_zero(small_model, batch):
    _, trace = small_model.run_with_trace(*batch, names="decoder.layers.*.self_attn.weights")
    T = batch[1].shape[1]
    upper = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for w in trace.values():
        assert (w[..., upper] == 0).all()


@torch.no_grad()
def test_future_target_tokens_do_not_change_the_past(small_model, batch):
    src, tgt = batch
    before = small_model(src, tgt)
    changed = tgt.clone()
    changed[:, 3:] = (changed[:, 3:] % 17) + 1  # new tokens from position 3 on
    after = small_model(src, changed)
    # equal in real arithmetic; float32 rounding of the largest logit x sqrt(d_model) (tests/tolerance.py)
    torch.testing.assert_close(before[:, :3], after[:, :3], atol=f32_tol(before, n=small_model.cfg.d_model), rtol=0)
    assert not torch.allclose(before[:, 3:], after[:, 3:])


@torch.no_grad()
def test_appending_source_padding_changes_nothing(small_model, batch):
    src, tgt = batch
    padded = torch.cat([src, torch.zeros(2, 5, dtype=src.dtype)], dim=1)
    a, b = small_model(src, tgt), small_model(padded, tgt)  # 5 more keys, each with weight exactly 0
    torch.testing.assert_close(a, b, atol=f32_tol(a, b, n=small_model.cfg.d_model), rtol=0)  # other sums' order


@torch.no_grad()
def test_captured_tensors_agree_with_recomputation(small_model, batch):
    _, trace = small_model.run_with_trace(*batch)
    for p in attn_names(trace):
        q, k, v = trace[f"{p}.q"], trace[f"{p}.k"], trace[f"{p}.v"]
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        # each step recomputed from the captured inputs of that step: float32 rounding of the terms summed
        # (a few ulps of the largest |term| x sqrt(terms), tests/tolerance.py), not a fixed 1e-6
        d_k = q.shape[-1]
        s_tol = f32_tol(q.abs().amax() * k.abs().amax() / math.sqrt(d_k), n=d_k)
        torch.testing.assert_close(trace[f"{p}.scores"], scores, atol=s_tol, rtol=0)
        mask = trace[f"{p}.mask"]
        weights = torch.softmax(scores.masked_fill(mask, -math.inf), -1).masked_fill(mask, 0)
        # softmax: dw <= 2 x max|d score| (w <= 1), plus its own rounding over the row
        torch.testing.assert_close(trace[f"{p}.weights"], weights, atol=2 * s_tol + f32_tol(1, n=scores.shape[-1]),
                                   rtol=0)
        z = weights @ v
        torch.testing.assert_close(trace[f"{p}.z"], z, atol=f32_tol(v, n=v.shape[-2]), rtol=0)
        module = small_model.get_submodule(p)
        B, H, L, hs = z.shape
        out = module.w_o(z.transpose(1, 2).reshape(B, L, H * hs))
        torch.testing.assert_close(trace[f"{p}.out"], out, rtol=0,
                                   atol=f32_tol(z.abs().amax() * module.w_o.weight.abs().amax(), out, n=H * hs))


@torch.no_grad()
def test_embedding_captures(small_model, batch):
    src, tgt = batch
    _, trace = small_model.run_with_trace(src, tgt, names="*embed*")
    tok = small_model.src_embed.tok(src) * math.sqrt(32)
    torch.testing.assert_close(trace["encoder.embed.tok"], tok)
    torch.testing.assert_close(trace["encoder.embed.pos"], sinusoidal_encoding(64, 32)[: src.shape[1]])
    torch.testing.assert_close(trace["encoder.embed.out"], tok + trace["encoder.embed.pos"])


def test_positional_encoding_closed_form():
    pe = sinusoidal_encoding(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)  # base 10000 (seed 004 writes 1000: a bug)
            # computed in float64, stored in float32: one rounding of a value <= 1 (angles rounded to float32
            # first would be off by eps x angle, 6e-6 at position 49, and fail)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=f32_tol(1, ulps=1))
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=f32_tol(1, ulps=1))


def test_masks_do_not_mutate_their_inputs():
    ids = torch.tensor([[5, 3, 0, 0]])
    before = ids.clone()
    pad = padding_mask(ids, 0)
    attention_mask(pad, 4, causal_mask(4))
    assert torch.equal(ids, before)
    assert pad.tolist() == [[False, False, True, True]]
    assert causal_mask(3).tolist() == [[False, True, True], [False, False, True], [False, False, False]]


@torch.no_grad()
def test_fully_masked_row_gives_zeros_not_nan(small_model):
    mha = small_model.encoder.layers[0].self_attn
    x = torch.randn(1, 3, 32)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    mask[0, 0, 1, 0] = False  # row 1 sees one key; rows 0 and 2 see nothing
    from model.core.recorder import capturing

    with capturing({"encoder.layers.0.self_attn.weights"}) as rec:
        out = mha(x, x, mask)
    w = rec.tensors["encoder.layers.0.self_attn.weights"]
    assert torch.isfinite(out).all()
    assert (w[0, :, 0] == 0).all() and (w[0, :, 2] == 0).all()
    assert (w[0, :, 1, 0] == 1).all()


@torch.no_grad()
def test_kv_cache_decoding_equals_full_pass(small_model, batch):
    src, tgt = batch
    src, tgt = src[:1], tgt[:1]
    full = small_model(src, tgt)
    memory, src_pad = small_model.encode(src)
    cache = small_model.new_cache()
    steps = [small_model.decode(tgt[:, t:t + 1], memory, src_pad, cache=cache, offset=t) for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_loss_ignores_pad():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 7)
    target = torch.tensor([[3, 4, 0, 0], [1, 2, 5, 0]])
    base = label_smoothed_loss(logits, target, pad_id=0, smoothing=0.1)
    noisy = logits.clone()
    noisy[target == 0] += 100 * torch.randn_like(noisy[target == 0])
    assert label_smoothed_loss(noisy, target, pad_id=0, smoothing=0.1).item() == pytest.approx(base.item())
    plain = label_smoothed_loss(logits, target, pad_id=0, smoothing=0.0)
    keep = target != 0
    manual = torch.nn.functional.cross_entropy(logits[keep], target[keep])
    # the same mean cross-entropy by two float32 paths: a few ulps of it x sqrt(the 7 log-softmax terms)
    assert plain.item() == pytest.approx(manual.item(), abs=f32_tol(manual, logits, n=logits.shape[-1]))


def test_noam_schedule_closed_form_and_peak():
    d, w = 512, 4000
    assert noam_lr(1, d, w) == pytest.approx(d**-0.5 * w**-1.5)
    assert noam_lr(w, d, w) == pytest.approx(d**-0.5 * w**-0.5)
    lrs = [noam_lr(s, d, w) for s in range(1, 3 * w)]
    assert max(range(len(lrs)), key=lrs.__getitem__) + 1 == w
    assert noam_lr(100, d, w, factor=2.0) == pytest.approx(2 * noam_lr(100, d, w))
    with pytest.raises(ValueError, match="step"):
        noam_lr(0, d, w)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(d_model=30, n_heads=4), "divisible by n_heads"),
        (dict(d_model=0), "d_model must be a positive"),
        (dict(n_heads=-1), "n_heads must be a positive"),
        (dict(activation="swish"), "activation must be one of"),
        (dict(positional="rotary"), "positional must be one of"),
        (dict(dropout=1.5), "dropout"),
        (dict(share_embeddings=True), "share_embeddings"),
    ],
)
def test_config_validation_says_what_to_change(kw, match):
    with pytest.raises(ValueError, match=match):
        small_config(**kw)


def test_tied_and_shared_embeddings():
    m = Transformer(small_config(tgt_vocab_size=23, tie_generator=True, share_embeddings=True))
    assert m.generator.weight is m.tgt_embed.tok.weight is m.src_embed.tok.weight
    n_unique = len({id(p) for p in m.parameters()})
    assert n_unique == len(list(m.parameters()))


@torch.no_grad()
def test_pre_ln_final_norm_feeds_the_decoder(batch):
    torch.manual_seed(0)
    m = Transformer(small_config(norm_first=True)).eval()
    _, trace = m.run_with_trace(*batch, names=["encoder.out", "encoder.layers.1.out"])
    torch.testing.assert_close(trace["encoder.out"], m.encoder.norm(trace["encoder.layers.1.out"]))


@torch.no_grad()
def test_encoder_only_configuration():
    cfg = TransformerConfig(src_vocab_size=30, n_decoder_layers=0, d_model=16, n_heads=2, n_encoder_layers=2,
                            d_ff=32, positional="learned", n_token_types=2, embed_norm=True,
                            scale_embedding=False, activation="gelu", layer_norm_eps=1e-12, dropout=0.0)
    m = Transformer(cfg).eval()
    src = torch.randint(1, 30, (1, 5))
    out, trace = m.run_with_trace(src)
    assert out.shape == (1, 5, 16)
    assert "encoder.embed.type" in trace and "logits" not in trace
    assert torch.equal(out, trace["encoder.out"])


def test_bad_ids_give_clear_messages(small_model):
    with pytest.raises(ValueError, match="does the tokenizer match"):
        small_model(torch.tensor([[1, 99]]), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="max_len=64"):
        small_model(torch.ones(1, 65, dtype=torch.long), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="empty"):
        small_model(torch.ones(1, 0, dtype=torch.long), torch.tensor([[1]]))
