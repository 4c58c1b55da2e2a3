"""model.analysis: decoding under hooks, head importance and summary, attribution, two-input compare.

Math against hand-computed examples and closed forms; batched results against one-at-a-time runs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tolerance import f32_tol

from model import Trace, load_checkpoint
from model import interventions as iv
from model.analysis import attribution, cheating, compare, heads, runs
from model.core.describe import attention_entry
from model.loaders import minilm as pretrained
from model.toy import decode as dec

PAIR_A = "The animal didn't cross the street because it was too tired"
PAIR_B = "The animal didn't cross the street because it was too wide"


@pytest.fixture(scope="module")
def dates():
    return load_checkpoint("dates")


@pytest.fixture(scope="module")
def minilm():
    return pretrained.load_minilm()


# ---------------------------------------------------------------- attribution math


def test_rollout_hand_example():
    A1 = np.array([[[1.0, 0.0], [0.5, 0.5]]])  # (H=1, L, L)
    A2 = np.array([[[0.5, 0.5], [0.0, 1.0]]])
    # Â1 = [[1, 0], [.25, .75]], Â2 = [[.75, .25], [0, 1]];  R = Â2 Â1
    np.testing.assert_allclose(attribution.rollout([A1, A2]), [[0.8125, 0.1875], [0.25, 0.75]])


def test_rollout_averages_heads():
    A = np.array([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]])  # two heads, mean = 0.5 everywhere
    np.testing.assert_allclose(attribution.rollout([A]), [[0.75, 0.25], [0.25, 0.75]])


def test_rollout_seq2seq_hand_example():
    enc = [np.eye(2)[None]]  # encoder attends to itself: R_src = I
    dec_self = [np.array([[[1.0, 0.0], [0.5, 0.5]]]), np.eye(2)[None]]
    cross = [np.eye(2)[None], np.array([[[0.0, 1.0], [1.0, 0.0]]])]
    # layer 1: flow = [[.5, 0, .5, 0], [0, .5, .125, .375]]; layer 2: [[.25, .5, ...], [.5, .25, ...]]
    np.testing.assert_allclose(attribution.rollout_seq2seq(enc, dec_self, cross), [[1 / 3, 2 / 3], [2 / 3, 1 / 3]])


def test_spearman_matches_the_closed_form_without_ties():
    rng = np.random.default_rng(0)
    for n in (5, 12, 40):
        a, b = rng.normal(size=n), rng.normal(size=n)
        d = np.argsort(np.argsort(a)) - np.argsort(np.argsort(b))
        closed = 1 - 6 * (d ** 2).sum() / (n * (n * n - 1))
        assert attribution.spearman(a, b) == pytest.approx(closed, abs=1e-12)


def test_spearman_ties_and_constants():
    assert attribution.spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)
    assert attribution.spearman([1, 2, 2, 3], [3, 2, 2, 1]) == pytest.approx(-1.0)
    # average ranks [1, 2.5, 2.5, 4] vs [1, 2, 3, 4]: Pearson = 4.5 / sqrt(4.5 * 5)
    assert attribution.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert math.isnan(attribution.spearman([1, 1, 1], [1, 2, 3]))


@pytest.mark.slow
def test_attribution_methods_against_direct_computations(small_model, batch):
    model = small_model.double()
    src, tgt = batch[0][:1], batch[1][:1]
    labels = torch.roll(tgt, -1, 1)
    pos = 3
    attr = attribution.attribute(model, src, tgt, labels, pos, {"src_tokens": [str(i) for i in src[0].tolist()]})
    S = src.shape[1]
    with torch.no_grad():
        _, tr = model.run_with_trace(src, tgt, names="decoder.layers.1.cross_attn.weights")
    np.testing.assert_allclose(attr.scores["raw"], tr["decoder.layers.1.cross_attn.weights"][0].mean(0)[pos])

    def logp(hooks=None):
        with torch.no_grad():
            return float(model.run_with_hooks(src, tgt, hooks=hooks)[0, pos].log_softmax(-1)[labels[0, pos]])

    base = logp()
    blank = [base - logp(iv.block_source_token(j)) for j in range(S)]
    np.testing.assert_allclose(attr.scores["blank_out"], blank, atol=1e-10)

    def scaled(j, eps):  # token j's embedding × (1 + eps): d log p / d eps at 0 = grad_j · x_j
        def hook(x, name):
            x = x.clone()
            x[:, j] *= 1 + eps
            return x
        return {"encoder.embed.tok": hook}

    eps = 1e-5
    fd = [(logp(scaled(j, eps)) - logp(scaled(j, -eps))) / (2 * eps) for j in range(S)]
    np.testing.assert_allclose(attr.scores["grad_x_input"], fd, atol=1e-7)
    assert attr.spearman["raw"] == pytest.approx(attribution.spearman(attr.scores["raw"], blank))
    last = attr.by_layer[-1]  # the last layer's raw attention and the rollout through every layer
    assert (last["raw"], last["rollout"]) == pytest.approx((attr.spearman["raw"], attr.spearman["rollout"]))
    assert [r["layer"] for r in attr.by_layer] == [0, 1]
    assert all(p.grad is None for p in model.parameters())  # nothing accumulated in the model


# ---------------------------------------------------------------- heads


@pytest.mark.slow
def test_head_importance_batched_equals_one_at_a_time(small_model, batch):
    src, tgt = batch[0][:1], batch[1][:1]
    labels = torch.roll(tgt, -1, 1)
    hi = heads.head_importance(small_model, src, tgt, labels)

    def score(hooks=None):
        with torch.no_grad():
            lp = small_model.run_with_hooks(src, tgt, hooks=hooks).log_softmax(-1)
        return float(lp.gather(-1, labels[..., None]).sum())

    assert hi.base == pytest.approx(score(), abs=1e-4)
    assert hi.modules == heads.attention_modules(small_model) and hi.delta.shape == (6, 4)
    for i, m in enumerate(hi.modules):
        for h in range(4):
            assert hi.delta[i, h] == pytest.approx(score(iv.ablate_head(m, h)) - score(), abs=1e-4)
    maps = hi.by_kind()
    assert list(maps) == list(heads.KINDS) and all(v.shape == (2, 4) for v in maps.values())
    top = hi.top(3)
    assert abs(top[0][2]) == pytest.approx(np.abs(hi.delta).max())


@pytest.mark.slow
def test_exact_match_importance_matches_single_ablations(dates):
    pairs = runs.held_out(dates, 4)
    em = heads.exact_match_importance(dates, pairs)
    assert em.base == runs.exact_match(dates, pairs)
    (m, h, d), = em.top(1)
    assert em.base + d == runs.exact_match(dates, pairs, iv.ablate_head(m, h))


def test_head_summary_hand_example():
    w = torch.tensor([[[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]],  # head 0
                       [[0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]]])  # head 1: always the last key
    model = {"attention": {"encoder.layers.0.self_attn": attention_entry("encoder_self", "encoder", 0, 2, 4)}}
    tr = Trace({"encoder.layers.0.self_attn.weights": w}, {"src_tokens": ["a", "b", "[EOS]"], "model": model})
    s = heads.head_summary(tr)
    # the weights are float32 (1/3 rounded): the closed forms hold to one rounding of values <= log 3 < 2
    np.testing.assert_allclose(s["entropy"][0], [(0 + math.log(2) + math.log(3)) / 3, 0.0], rtol=0,
                               atol=f32_tol(2, ulps=1))
    np.testing.assert_allclose(s["distance"][0], [(0 + 0.5 + (2 + 1 + 0) / 3) / 3, (2 + 1 + 0) / 3], rtol=0,
                               atol=f32_tol(2, ulps=1))
    np.testing.assert_allclose(s["special"][0], [(0 + 0 + 1 / 3) / 3, 1.0], rtol=0, atol=f32_tol(2, ulps=1))


# ---------------------------------------------------------------- decoding under hooks


@pytest.mark.slow
def test_greedy_without_hooks_equals_the_cached_decoder(dates):
    t = dates.tgt_tokenizer
    pairs = runs.held_out(dates, 6)
    rows = [dates.encode_source(s)[0] for s, _ in pairs]
    src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    ids, lps, fin = runs.greedy(dates.model, src, t.bos_id, t.eos_id)
    assert ids == dec.greedy_batch(dates.model, src, t.bos_id, t.eos_id) and all(fin)
    one = runs.decode_text(dates, pairs[0][0])
    tgt = torch.tensor([[t.bos_id, *one.ids]])
    with torch.no_grad():
        lp = dates.model(dates.encode_source(pairs[0][0]), tgt).log_softmax(-1)[0]
    want = lp.gather(-1, torch.tensor([*one.ids, t.eos_id])[:, None])[:, 0]
    np.testing.assert_allclose(one.logprobs, want.numpy(), atol=1e-5)


@pytest.mark.slow
def test_before_after_traces(dates):
    ba = runs.before_after(dates, "3 november 2023", iv.no_positional("encoder"))
    assert ba.before.text == "2023-11-03" and ba.after.text != ba.before.text
    assert ba.trace_same.meta["tgt_tokens"] == ba.trace_before.meta["tgt_tokens"]
    assert ba.trace_after.meta["next_tokens"][:-1] == ba.after.tokens


@pytest.mark.slow
def test_teacher_forced_loss_and_the_seed_loss(dates):
    zh = load_checkpoint("zh-en")  # targets of different lengths: a padded batch
    got = runs.teacher_forced_loss(zh, runs.held_out(zh, 20))
    assert 0 < got["real_share"] < 1
    assert got["seed_loss"] == pytest.approx(got["loss"] * got["real_share"], rel=1e-5)
    cut = runs.teacher_forced_loss(dates, runs.held_out(dates, 20), iv.no_lookahead_mask())
    assert cut["loss"] > runs.teacher_forced_loss(dates, runs.held_out(dates, 20))["loss"]


@pytest.mark.slow
def test_training_without_the_mask_leaves_the_checkpoint_alone(dates):
    before = {k: v.clone() for k, v in dates.model.state_dict().items()}
    c = cheating.train_without_mask(dates, steps=2, batch_size=8, n_eval=4)
    assert len(c.loss_curve) == 2 and 0 <= c.exact_match <= 1
    assert all(torch.equal(v, dates.model.state_dict()[k]) for k, v in before.items())
    assert not dates.model.training


# ---------------------------------------------------------------- two inputs on MiniLM


def test_compare_inputs_on_minilm(minilm):
    hf = compare.compare_inputs(minilm, PAIR_A, PAIR_B)
    assert hf.aligned and hf.tokens_a[hf.query[0]] == "it"
    _, tr = minilm.run_with_trace(PAIR_A, names="encoder.layers.5.self_attn.weights")
    np.testing.assert_allclose(hf.rows_a[5], tr["encoder.layers.5.self_attn.weights"][0, :, hf.query[0]].numpy())
    np.testing.assert_allclose(hf.flip, hf.pref_a - hf.pref_b)
    ranking = hf.ranking()
    assert len(ranking) == 72 and abs(ranking[0]["flip"]) == pytest.approx(np.abs(hf.flip).max())
    # the head that keeps pointing "it" at "animal" in both sentences (about 0.65 and 0.50)
    steady = max(ranking, key=lambda r: min(r["to1_a"], r["to1_b"]))
    assert (steady["layer"], steady["head"]) == (5, 11) and steady["to1_a"] > 0.6 and steady["to1_b"] > 0.45
    with pytest.raises(ValueError, match="'zebra' is not a token"):
        compare.compare_inputs(minilm, PAIR_A, PAIR_B, to1="zebra")


@pytest.mark.slow
def test_preference_importance_equals_a_single_ablation(minilm):
    hi = compare.preference_importance(minilm, PAIR_A)
    assert hi.delta.shape == (6, 12)
    enc = minilm.encode(PAIR_A)
    q, a, b = (enc.tokens.index(w) for w in ("it", "animal", "street"))

    def pref(hooks=None):
        with torch.no_grad():
            h = minilm.model.run_with_hooks(torch.tensor([enc.ids]), hooks=hooks)[0]
        cos = torch.nn.functional.cosine_similarity
        return float(cos(h[q], h[a], 0) - cos(h[q], h[b], 0))

    m, head, d = hi.top(1)[0]
    assert hi.base == pytest.approx(pref(), abs=1e-5)
    assert d == pytest.approx(pref(iv.ablate_head(m, head)) - pref(), abs=1e-5)
