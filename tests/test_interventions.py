"""Named interventions (model.interventions): each equals an independent computation.

Independent = a modified copy of the model (zeroed W^O columns, a zero or base-1000 PE table, a pad id
that never occurs), torch's own nn.MultiheadAttention on the captured layer input, or the attention
formula recomputed by hand from captured Q/K/V.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import threading

import pytest
import torch
from tolerance import f32_tol

from model import Transformer
from model import interventions as iv
from model.testing.reference import to_torch_mha
from model.toy import decode as dec

# two float32 paths to the same logits (hooks vs a rebuilt reference, another mask, another batch): a few ulps
# of the largest logit (below 4 on small_config's model, measured 3.8) x sqrt(d_model = 32) (tests/tolerance.py)
ATOL = f32_tol(4.0, n=32)


def logits(model, batch, hooks=None):
    with torch.no_grad():
        return model.run_with_hooks(*batch, hooks=hooks)


def traced(model, batch, hooks, names):
    with torch.no_grad():
        return model.run_with_trace(*batch, names=names, hooks=hooks)[1]


def manual_out(attn, z: torch.Tensor) -> torch.Tensor:
    """W^O applied to per-head outputs z (B, H, L, hs): concat heads (transpose back first), then W^O."""
    B, H, L, hs = z.shape
    return attn.w_o(z.transpose(1, 2).reshape(B, L, H * hs))


MODULES = ["encoder.layers.1.self_attn", "decoder.layers.0.self_attn", "decoder.layers.1.cross_attn"]


# ---------------------------------------------------------------- heads


@pytest.mark.parametrize("module", MODULES)
def test_zero_head_equals_zeroed_wo_columns(small_model, batch, module):
    h, hs = 2, small_model.cfg.d_head
    ref = copy.deepcopy(small_model)
    with torch.no_grad():
        ref.get_submodule(module).w_o.weight[:, h * hs:(h + 1) * hs] = 0.0
    got = logits(small_model, batch, iv.ablate_head(module, h))
    torch.testing.assert_close(got, logits(ref, batch), atol=ATOL, rtol=0)
    assert not torch.allclose(got, logits(small_model, batch), atol=1e-3)  # the head mattered


def test_mean_and_scale_head_match_w_o_on_modified_z(small_model, batch):
    m, h = "encoder.layers.0.self_attn", 1
    attn = small_model.get_submodule(m)
    z = traced(small_model, batch, None, f"{m}.z")[f"{m}.z"]
    for hooks, edit in [(iv.ablate_head(m, h, "mean"), lambda z: z[:, h].mean(1, keepdim=True)),
                        (iv.scale_head(m, h, 2.5), lambda z: z[:, h] * 2.5)]:
        want = z.clone()
        want[:, h] = edit(z)
        tr = traced(small_model, batch, hooks, [f"{m}.z", f"{m}.out"])
        torch.testing.assert_close(tr[f"{m}.z"], want, atol=ATOL, rtol=0)
        with torch.no_grad():
            torch.testing.assert_close(tr[f"{m}.out"], manual_out(attn, want), atol=ATOL, rtol=0)


def test_scale_zero_equals_zero_ablation(small_model, batch):
    m = "decoder.layers.1.self_attn"
    torch.testing.assert_close(logits(small_model, batch, iv.scale_head(m, 3, 0.0)),
                               logits(small_model, batch, iv.ablate_head(m, 3)), atol=ATOL, rtol=0)


def test_uniform_head_spreads_over_visible_keys(small_model, batch):
    m, h = "decoder.layers.0.self_attn", 0
    tr = traced(small_model, batch, iv.ablate_head(m, h, "uniform"), [f"{m}.weights", f"{m}.mask"])
    visible = (~tr[f"{m}.mask"][:, 0]).float()  # (B, T, T)
    want = visible / visible.sum(-1, keepdim=True)
    torch.testing.assert_close(tr[f"{m}.weights"][:, h], want, atol=f32_tol(1, n=want.shape[-1]), rtol=0)  # 1/n


def test_batched_ablation_rows_equal_single_runs(small_model, batch):
    src, tgt = batch[0][:1], batch[1][:1]
    table = {"encoder.layers.0.self_attn": [(1, 2)], "decoder.layers.1.cross_attn": [(2, 0)]}
    got = logits(small_model, (src.repeat(3, 1), tgt.repeat(3, 1)), iv.ablate_heads_by_row(table))
    torch.testing.assert_close(got[0], logits(small_model, (src, tgt))[0], atol=ATOL, rtol=0)
    for row, (m, h) in [(1, ("encoder.layers.0.self_attn", 2)), (2, ("decoder.layers.1.cross_attn", 0))]:
        torch.testing.assert_close(got[row], logits(small_model, (src, tgt), iv.ablate_head(m, h))[0],
                                   atol=ATOL, rtol=0)


# ---------------------------------------------------------------- tokens and positions


def test_block_source_token_equals_padding_it(small_model, batch):
    src, tgt = batch
    padded = src.clone()
    padded[:, 3] = small_model.cfg.pad_id
    torch.testing.assert_close(logits(small_model, batch, iv.block_source_token(3)),
                               logits(small_model, (padded, tgt)), atol=ATOL, rtol=0)


def test_no_positional_equals_zero_pe_table(small_model, batch):
    ref = copy.deepcopy(small_model)
    ref.src_embed.pe.zero_()
    ref.tgt_embed.pe.zero_()
    torch.testing.assert_close(logits(small_model, batch, iv.no_positional()), logits(ref, batch), atol=ATOL, rtol=0)
    only_enc = copy.deepcopy(small_model)
    only_enc.src_embed.pe.zero_()
    torch.testing.assert_close(logits(small_model, batch, iv.no_positional("encoder")), logits(only_enc, batch),
                               atol=ATOL, rtol=0)


def test_shuffle_source_equals_shuffled_ids(small_model, batch):
    src, tgt = batch
    perm = torch.randperm(src.shape[1], generator=torch.Generator().manual_seed(5))
    moved = torch.empty_like(src)
    moved[:, perm] = src  # token i now sits at position perm[i]: it gets that position's encoding
    torch.testing.assert_close(logits(small_model, batch, iv.shuffle_source(5)), logits(small_model, (moved, tgt)),
                               atol=ATOL, rtol=0)


def test_sinusoidal_positions_read_back():
    for d in (4, 32, 128, 384):
        pos = torch.arange(0, 512)
        table = iv.sinusoidal_table(pos, d).float()
        assert torch.equal(iv.sinusoidal_positions(table), pos)


@pytest.mark.slow
def test_pe_base_1000_equals_rebased_table_also_when_decoding_with_cache(small_model, batch):
    ref = copy.deepcopy(small_model)
    table = iv.sinusoidal_table(torch.arange(ref.cfg.max_len), ref.cfg.d_model, base=1000.0).float()
    ref.src_embed.pe.copy_(table)
    ref.tgt_embed.pe.copy_(table)
    hooks = iv.pe_base_1000()
    torch.testing.assert_close(logits(small_model, batch, hooks), logits(ref, batch), atol=ATOL, rtol=0)
    with small_model.hooks(hooks):  # step by step, each step sees only its own PE row (offset unknown)
        got = dec.greedy_batch(small_model, batch[0], 1, 2, max_new_tokens=12)
    assert got == dec.greedy_batch(ref, batch[0], 1, 2, max_new_tokens=12)


# ---------------------------------------------------------------- attention math


def test_no_scaling_scores_are_qk_without_division(small_model, batch):
    m = "decoder.layers.1.cross_attn"
    tr = traced(small_model, batch, iv.no_scaling(small_model.cfg.d_head), [f"{m}.{r}" for r in
                                                                            ("q", "k", "mask", "scores", "weights")])
    q, k, mask = tr[f"{m}.q"], tr[f"{m}.k"], tr[f"{m}.mask"]
    qk = q @ k.transpose(-2, -1)
    torch.testing.assert_close(tr[f"{m}.scores"], qk, atol=1e-5, rtol=1e-5)
    want = torch.softmax(qk.masked_fill(mask, float("-inf")), -1)
    # scores off by their float32 rounding (|q||k| x sqrt(d_head)) move a weight by at most twice that
    s_tol = f32_tol(q.abs().amax() * k.abs().amax(), n=q.shape[-1])
    torch.testing.assert_close(tr[f"{m}.weights"], want, atol=2 * s_tol + f32_tol(1, n=want.shape[-1]), rtol=0)
    assert iv.build("no_scaling", small_model.cfg).keys() == iv.no_scaling(8).keys()


def test_no_lookahead_mask_equals_torch_attention_without_attn_mask(small_model, batch):
    m = "decoder.layers.0.self_attn"
    tr = traced(small_model, batch, iv.no_lookahead_mask(), ["decoder.embed.out", "masks.tgt_pad", f"{m}.out"])
    x = tr["decoder.embed.out"]
    with torch.no_grad():
        want, _ = to_torch_mha(small_model.get_submodule(m))(x, x, x, key_padding_mask=tr["masks.tgt_pad"])
    torch.testing.assert_close(tr[f"{m}.out"], want, atol=ATOL, rtol=0)


def test_no_padding_mask_equals_a_pad_id_that_never_occurs(small_model, batch):
    src, tgt = batch
    unused = sorted(set(range(1, 19)) - set(src.flatten().tolist()) - set(tgt.flatten().tolist()))
    assert unused, "the fixture batch uses every id"
    ref = Transformer(dataclasses.replace(small_model.cfg, pad_id=unused[0])).eval()
    ref.load_state_dict(small_model.state_dict())
    torch.testing.assert_close(logits(small_model, batch, iv.no_padding_mask()), logits(ref, batch), atol=ATOL, rtol=0)


def test_inverted_mask_blocks_what_was_visible(small_model, batch):
    m = "encoder.layers.0.self_attn"
    tr = traced(small_model, batch, iv.inverted_mask(), [f"{m}.scores", f"{m}.mask", f"{m}.weights"])
    mask = tr[f"{m}.mask"]
    intact = traced(small_model, batch, None, f"{m}.mask")[f"{m}.mask"]
    assert torch.equal(mask, ~intact)
    # Row 1 is padded: its queries now see only the [PAD] keys; row 0 has no padding: nothing is visible.
    want = torch.softmax(tr[f"{m}.scores"].masked_fill(mask, float("-inf")), -1).nan_to_num(0.0)
    torch.testing.assert_close(tr[f"{m}.weights"], want, atol=f32_tol(1, n=want.shape[-1]), rtol=0)  # same scores
    assert tr[f"{m}.weights"][0].abs().sum() == 0


def seed001_self_attention(attn, x: torch.Tensor) -> torch.Tensor:
    """Seed 001's MultiHeadAttention, literally (forward(v, k, q) called as (x, x, x); split; attention(k, q, v);
    concat by view without transposing back), with our module's weights."""
    n_head = attn.n_heads

    def split(t):
        a, b, c = t.size()
        return t.view(a, b, n_head, c // n_head).permute(0, 2, 1, 3)

    def concat(t):
        a, b, c, d = t.size()
        return t.reshape(a, c, b * d)  # the seed's .view, on a contiguous tensor

    def attention(q, k, v):
        d = k.size(-1)
        s = (q @ k.transpose(2, 3)) / math.sqrt(d)
        return torch.softmax(s, dim=3) @ v

    k, q, v = attn.w_k(x), attn.w_q(x), attn.w_v(x)
    k, q, v = split(k), split(q), split(v)
    return attn.w_o(concat(attention(k, q, v)))


def test_seed_001_bug_equals_the_seed_code(small_model):
    src = torch.randint(1, 23, (2, 7), generator=torch.Generator().manual_seed(3))  # no padding: seed 001 has no mask
    m = "encoder.layers.0.self_attn"
    tr = traced(small_model, (src, src[:, :5] % 19), iv.seed_qk_swap_concat(), ["encoder.embed.out", f"{m}.out"])
    with torch.no_grad():
        want = seed001_self_attention(small_model.get_submodule(m), tr["encoder.embed.out"])
    torch.testing.assert_close(tr[f"{m}.out"], want, atol=ATOL, rtol=0)


def test_seed_pad_loss_is_the_right_loss_times_the_real_share():
    g = torch.Generator().manual_seed(0)
    logits_, target = torch.randn(3, 5, 11, generator=g), torch.randint(1, 11, (3, 5), generator=g)
    target[1, 3:] = 0
    target[2, 1:] = 0
    share = (target != 0).float().mean()
    torch.testing.assert_close(iv.seed_pad_loss(logits_, target, 0), iv.pad_loss(logits_, target, 0) * share)


# ---------------------------------------------------------------- the mechanism and its errors


def test_no_hooks_is_bit_identical(small_model, batch):
    with torch.no_grad():
        plain = small_model(*batch)
    assert torch.equal(logits(small_model, batch, None), plain)
    assert torch.equal(logits(small_model, batch, iv.build([])), plain)


def test_hooks_in_8_threads_are_isolated(small_model, batch):
    jobs = [iv.ablate_head(MODULES[i % 3], i % 4) for i in range(8)]
    expected = [logits(small_model, batch, h) for h in jobs]
    got: list = [None] * 8
    barrier = threading.Barrier(8)

    def work(i):
        barrier.wait()
        for _ in range(5):
            got[i] = logits(small_model, batch, jobs[i])
            assert torch.equal(got[i], expected[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(g is not None and torch.equal(g, e) for g, e in zip(got, expected, strict=True))


def test_combine_chains_hooks_on_the_same_point(small_model, batch):
    m = "encoder.layers.0.self_attn"
    both = iv.combine(iv.scale_head(m, 1, 2.0), iv.scale_head(m, 1, 3.0))
    torch.testing.assert_close(logits(small_model, batch, both), logits(small_model, batch, iv.scale_head(m, 1, 6.0)),
                               atol=ATOL, rtol=0)


def test_spec_round_trip_and_config_arguments(small_model):
    spec = iv.spec_of("ablate_head", module="decoder.layers.1.cross_attn", head=2, mode="mean")
    assert iv.parse(spec) == ("ablate_head", {"module": "decoder.layers.1.cross_attn", "head": 2, "mode": "mean"})
    assert iv.parse("scale_head:module=*_attn,head=0,factor=0.5")[1]["factor"] == 0.5
    assert set(iv.build("no_scaling;no_lookahead_mask", small_model.cfg)) == {"*_attn.scores", "masks.causal"}


@pytest.mark.parametrize("spec, message", [
    ("nope", "unknown intervention 'nope'; choose one of: ablate_head"),
    ("ablate_head:module=x", "needs head"),
    ("ablate_head:module=x,head=two", "head must be int, got 'two'"),
    ("ablate_head:module=x,head=1,color=red", "has no argument 'color'; its arguments: module, head, mode=zero"),
    ("ablate_head:module=x,head=1,mode=loud", "unknown ablation mode 'loud'"),
    ("no_scaling:oops", "write arguments as name=value"),
])
def test_bad_specs_say_what_is_valid(spec, message):
    with pytest.raises(iv.SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        iv.build(spec, cfg=None if spec.startswith("no_scaling:oops") else object())


def test_bad_targets_fail_clearly_when_run(small_model, batch):
    with pytest.raises(ValueError, match="(?s)matches no name.*decoder.layers.1.cross_attn.z"):
        logits(small_model, batch, iv.ablate_head("decoder.layers.7.cross_attn", 0))
    with pytest.raises(ValueError, match="head 9 does not exist at encoder.layers.0.self_attn.z: it has 4 heads"):
        logits(small_model, batch, iv.ablate_head("encoder.layers.0.self_attn", 9))
    with pytest.raises(ValueError, match="(?s)encoder.layers.0.self_attn.z.*shape"):
        logits(small_model, batch, {"encoder.layers.0.self_attn.z": lambda z, name: z[:, :1]})
    with pytest.raises(iv.SpecError, match="needs the model's config"):
        iv.build("no_scaling")
