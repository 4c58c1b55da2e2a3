"""Analyses over decoder LMs (model/analysis: phenomena, patching, ioi, logit_lens, qk) on tiny random
DecoderLMs (seeded): the detectors find heads that hooks made to order, patching/DLA/lens satisfy their
exact identities, the Q/K normalisation keeps every softmax row, and the capture CLI's LM form."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from tolerance import f32_tol, kl_tol, tol

from model import interventions as iv
from model.analysis import ioi, logit_lens, patching, phenomena, qk
from model.families.lm import DecoderLM, LMConfig

LLAMA = dict(vocab_size=61, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, d_ff=80, max_len=128,
             positional="rotary", rope_base=500.0, norm="rmsnorm", norm_eps=1e-6, ffn="gated",
             activation="silu", qkv_bias=False, out_bias=False, ffn_bias=False, tie_embeddings=True, bos_id=1)
GPT2 = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=128, positional="learned",
            norm="layernorm", ffn="plain", activation="gelu_tanh", tie_embeddings=False, bos_id=1)


def make(kind: dict, seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    return DecoderLM(LMConfig(**kind)).eval()


@pytest.fixture(params=["llama", "gpt2"])
def lm(request):
    return make(LLAMA if request.param == "llama" else GPT2)


def ids(T=12, seed=1, V=61):
    return torch.randint(2, V, (1, T), generator=torch.Generator().manual_seed(seed))


def force(pattern_of_row):
    """A scores hook making head `h` attend exactly to pattern_of_row(i) (a key index) from row i."""

    def make_hook(h):
        def hook(s, name):
            s = s.clone()
            T = s.shape[-1]
            s[:, h] = -1e4
            for i in range(T):
                s[:, h, i, pattern_of_row(i)] = 1e4
            return s

        return hook

    return make_hook


# ---------------------------------------------------------------------- detectors


def test_pattern_score_is_transformer_lens_mul_rescaled():
    """TransformerLens's detect_head 'mul' score (written out here from its source) divides by every
    row; ours by the rows that have a pattern cell: ours = TL x T / rows."""
    torch.manual_seed(0)
    T = 9
    w = torch.softmax(torch.randn(1, 3, T, T).masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1),
                                                          float("-inf")), -1)
    x = torch.tensor([5, 7, 5, 8, 7, 5, 9, 9, 3])
    for pattern in (phenomena.previous_token_pattern(T), phenomena.duplicate_token_pattern(x)):
        ours = phenomena.pattern_score(w, pattern)
        for h in range(3):
            a = w[0, h].clone()
            tl = float((a * pattern).sum() / a.sum())
            rows = int((pattern.sum(-1) > 0).sum())
            assert float(ours[h]) == pytest.approx(tl * T / rows, rel=1e-6)
    # TL's duplicate pattern: position 2 duplicates 0, 5 duplicates 0 and 2, 7 duplicates 6
    dup = phenomena.duplicate_token_pattern(x)
    assert dup[5].nonzero().flatten().tolist() == [0, 2] and dup[7].nonzero().flatten().tolist() == [6]
    assert phenomena.induction_pattern(x)[5].nonzero().flatten().tolist() == [1, 3]


@torch.no_grad()
def test_detectors_find_the_heads_hooks_made_to_order(lm):
    """Layer 0 head 1 made a sink (all on token 0), layer 1 head 2 a previous-token head, layer 1 head 0
    a duplicate-token head: each detector finds exactly its head, with score 1 and its threshold."""
    n = 10
    x = phenomena.induction_sequence(lm, n=n, seed=3)
    T = x.shape[1]
    first = {int(t): i for i, t in reversed(list(enumerate(x[0].tolist())))}
    hooks = {"decoder.layers.0.self_attn.scores": force(lambda i: 0)(1),
             "decoder.layers.1.self_attn.scores": iv.chain(
                 force(lambda i: max(i - 1, 0))(2),
                 force(lambda i: first[int(x[0, i])] if first[int(x[0, i])] < i else i)(0))}
    _, tr = lm.run_with_trace(x, names="*.self_attn.weights", hooks=hooks)
    stats = phenomena.head_statistics(tr, thresholds={"sink": 0.99, "previous_token": 0.99,
                                                      "duplicate_token": 0.99})
    assert [(la, h) for la, h, _ in stats["sink"].heads] == [(0, 1)]
    assert [(la, h) for la, h, _ in stats["previous_token"].heads] == [(1, 2)]
    assert [(la, h) for la, h, _ in stats["duplicate_token"].heads] == [(1, 0)]
    for k in ("sink", "previous_token", "duplicate_token"):
        assert stats[k].heads[0][2] == pytest.approx(1.0, abs=1e-6) and stats[k].threshold == 0.99
        assert stats[k].scores.shape == (lm.cfg.n_layers, lm.cfg.n_heads) and stats[k].recipe
    # a one-key head: entropy 0; the previous-token head's mean distance is (T-1)/T (row 0 looks at itself)
    assert stats["entropy"].scores[0, 1] == pytest.approx(0.0, abs=1e-6)
    assert stats["distance"].scores[1, 2] == pytest.approx((T - 1) / T, abs=1e-6)
    # uniform attention over i + 1 keys: entropy mean log(i + 1)
    _, tr = lm.run_with_trace(x, names="*.self_attn.weights",
                              hooks={"decoder.layers.0.self_attn.scores": lambda s, n: torch.zeros_like(s)})
    ent = phenomena.head_statistics(tr)["entropy"].scores[0]
    assert ent == pytest.approx(np.full(lm.cfg.n_heads, np.mean(np.log(np.arange(1, T + 1)))), abs=1e-6)


@torch.no_grad()
def test_induction_sequence_score_and_losses(lm):
    n = 20
    x = phenomena.induction_sequence(lm, n=n, batch=2, seed=5)
    assert x.shape == (2, 2 * n + 1) and (x[:, 0] == lm.cfg.bos_id).all()
    assert torch.equal(x[:, 1:n + 1], x[:, n + 1:]) and not torch.equal(x[0], x[1])
    assert torch.equal(x, phenomena.induction_sequence(lm, n=n, batch=2, seed=5))  # seeded
    # a head made to attend from i to i - (n - 1) in the second copy: induction score 1, the others lower
    hook = force(lambda i: i - (n - 1) if i > n else 0)(4 % lm.cfg.n_heads)
    _, tr = lm.run_with_trace(x, names="*.self_attn.weights", hooks={"decoder.layers.1.self_attn.scores": hook})
    s = phenomena.head_statistics(tr, period=n)["induction"]
    assert s.heads[0][:2] == (1, 4 % lm.cfg.n_heads) and s.heads[0][2] == pytest.approx(1.0, abs=1e-6)
    assert len(s.heads) == 1
    # per-token losses: -log softmax at the next token, split into the two copies
    logits = lm(x)
    per = phenomena.token_losses(logits, x)
    want = -torch.log_softmax(logits[1, 6], -1)[x[1, 7]]
    assert float(per[1, 6]) == pytest.approx(float(want), rel=1e-5)
    rl = phenomena.repeat_loss(logits, x, n)
    assert rl.first == pytest.approx(float(per[:, :n].mean()), rel=1e-6)
    assert rl.second == pytest.approx(float(per[:, n:].mean()), rel=1e-6)


@torch.no_grad()
def test_top_induction_ablation_and_its_seeded_random_control(lm):
    res = phenomena.induction(lm, n=12, seed=1)
    a = phenomena.ablate_top_induction(lm, res, k=2, mode="zero", n_controls=2, seed=7)
    assert a.heads == [(la, h) for la, h, _ in res.scores["induction"].top(2)]
    assert all(len(c) == 2 and not set(c) & set(a.heads) for c in a.controls)
    assert a.controls == phenomena.ablate_top_induction(lm, res, k=2, n_controls=2, seed=7).controls
    # the ablated loss is the second copy's loss under model.interventions.ablate_head for those heads
    hooks = iv.combine(*(iv.ablate_head(f"decoder.layers.{la}.self_attn", h) for la, h in a.heads))
    want = phenomena.repeat_loss(lm.run_with_hooks(res.ids, hooks=hooks), res.ids, 12).second
    assert a.ablated == pytest.approx(want, rel=1e-9) and a.base == pytest.approx(res.loss.second)
    assert a.ablated != a.base


# ---------------------------------------------------------------------- sinks


@torch.no_grad()
def test_blocking_token_0_everywhere_and_in_one_head(lm):
    x = ids(10)
    names = phenomena.attention_names(lm)
    _, tr = lm.run_with_trace(x, names="*.self_attn.weights", hooks=phenomena.block_first_key(names=names))
    for n in names:
        w = tr[f"{n}.weights"][0]
        assert (w[:, 1:, 0] == 0).all() and (w[:, 0, 0] == 1).all()  # row 0 sees only token 0: left alone
        assert torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)))
    one = phenomena.block_first_key(layer_heads={names[1]: [2]})
    _, tr1 = lm.run_with_trace(x, names="*.self_attn.weights", hooks=one)
    w1 = tr1[f"{names[1]}.weights"][0]
    assert (w1[2, 1:, 0] == 0).all() and (w1[[0, 1, 3], 1:, 0] > 0).all()
    eff = phenomena.sink_effect(lm, x, per_head=True, batch=5)
    assert eff.kl_everywhere > 0 and eff.kl_per_head.shape == (lm.cfg.n_layers, lm.cfg.n_heads)
    # the batched per-head KL (5 heads per forward) equals the head blocked alone
    logits = lm(x)
    alone = lm.run_with_hooks(x, hooks=one)
    # the last position's KL is ~1e-5 on a random model; the batch of 5 and the single run round their float32
    # logits differently, which moves a KL by at most (||p - q||_1 + 2 max|log p/q|) x their rounding (kl_tol)
    assert eff.kl_per_head[1, 2] == pytest.approx(float(phenomena.next_token_kl(logits, alone)[0]), rel=0,
                                                  abs=kl_tol(logits[0, -1], alone[0, -1], n=lm.cfg.d_model))
    assert eff.mean_share == pytest.approx(float(np.mean(eff.share.scores)))


# ---------------------------------------------------------------------- patching


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_activation_patching_identities(lm, dtype):
    """Clean and corrupted differ at one position p. Layer 0's input is the embedding, so patching it at p
    restores exactly everything (1) and at any other position nothing (0); before p nothing differs at any
    layer (0). Batched rows equal single runs.

    Every identity is exact in real arithmetic and checked in logit units (a fraction of GPT-2's 4e-4-logit
    span would magnify rounding 2,500 times). In float64 it holds to float64 rounding; in float32 (the pages'
    dtype) the two sides reduce in different orders (the residual map runs each patch from position p on, over
    the corrupted run's cached keys and values of positions < p (issue 26 section 3), not one full forward per
    patch; the rows run in batches of 7 or 1; the thread count splits each matmul), so they agree to a few ulps
    of the largest logit times sqrt(d_model) (tests/tolerance.py), 3e-6 logits here, not to the 1e-7 one
    machine met (issue 34: 1.06e-7 at 2 threads on an AMD EPYC). A broken identity is off by the span itself:
    7e-2 (llama), 4e-4 (GPT-2) logits."""
    lm = lm.to(dtype)
    clean = ids(9)
    corrupted = clean.clone()
    p = 4
    corrupted[0, p] = (clean[0, p] + 7) % 61
    good, bad = 3, 5
    res = patching.activation_patching(lm, clean, corrupted, good, bad, batch=7)
    L, H = lm.cfg.n_layers, lm.cfg.n_heads
    assert res.resid.shape == (L, 9) and res.heads.shape == (L, H)
    span = abs(res.clean - res.corrupted)
    logits = lm(torch.cat([clean, corrupted]))[:, -1]
    bound = tol(logits, n=lm.cfg.d_model, dtype=dtype)  # logits
    assert bound < span / 100  # the bound is far below the effect a broken identity shows
    assert abs(res.resid[0, p] - 1) * span <= bound  # 1: the whole difference restored
    assert np.abs(np.delete(res.resid[0], p)).max() * span <= bound  # 0: the embedding elsewhere changes nothing
    assert np.abs(res.resid[:, :p]).max() * span <= bound  # 0: before p nothing differs at any layer
    # one head, by hand: layer 1 head 2's z from the clean run into the corrupted one
    _, tr = lm.run_with_trace(clean, names="decoder.layers.1.self_attn.z")
    zc = tr["decoder.layers.1.self_attn.z"]

    def put(z, name):
        z = z.clone()
        z[:, 2] = zc[:, 2]
        return z

    ld = float(patching.logit_diff(lm.run_with_hooks(corrupted, hooks={"decoder.layers.1.self_attn.z": put}),
                                   good, bad)[0])
    assert abs(res.heads[1, 2] * (res.clean - res.corrupted) - (ld - res.corrupted)) <= bound  # logits
    one = patching.activation_patching(lm, clean, corrupted, good, bad, batch=1, heads=False)
    # batch size 1 against 7: rounding only
    assert np.abs(one.resid - res.resid).max() * span <= bound and one.heads is None
    with pytest.raises(ValueError, match="same number of tokens"):
        patching.activation_patching(lm, clean, corrupted[:, :-1], good, bad)
    with pytest.raises(ValueError, match="nothing to restore"):
        patching.activation_patching(lm, clean, clean, good, bad)


# ---------------------------------------------------------------------- DLA, IOI


@torch.no_grad()
def test_direct_logit_attribution_pieces_add_up_to_the_logit_difference(lm):
    """With the final norm's scale frozen, embeddings + every head + W^O biases + FFNs + the norm's bias
    add up to the model's logit(good) - logit(bad): the decomposition DLA reads per head."""
    x = ids(11, seed=4)
    for mod in lm.modules():  # norms away from their init (weight 1, bias 0), so freezing their scale matters
        if hasattr(mod, "eps") and hasattr(mod, "weight"):
            torch.nn.init.normal_(mod.weight, 1.0, 0.3)
            if getattr(mod, "bias", None) is not None:
                torch.nn.init.normal_(mod.bias, 0.0, 0.3)
    d = ioi.direct_logit_attribution(lm, x, 7, 9)
    assert d.heads.shape == (lm.cfg.n_layers, lm.cfg.n_heads)
    assert d.total() == pytest.approx(d.logit_diff, abs=1e-4)
    assert d.logit_diff == pytest.approx(float(lm(x)[0, -1, 7] - lm(x)[0, -1, 9]), abs=1e-5)
    assert (d.norm_bias != 0) == (lm.cfg.norm == "layernorm") and np.any(d.heads != 0)
    # a head zeroed by a hook contributes nothing
    hooks = iv.ablate_head("decoder.layers.1.self_attn", 1)
    with lm.hooks(hooks):
        d0 = ioi.direct_logit_attribution(lm, x, 7, 9)
    assert d0.heads[1, 1] == 0 and d0.total() == pytest.approx(d0.logit_diff, abs=1e-4)


class _WordTokenizer:
    """The piece of tokenizers.Tokenizer's API ioi_prompts uses: one token per word."""

    def __init__(self, words):
        self.vocab = {w: i for i, w in enumerate(words)}

    def encode(self, text, add_special_tokens=True):
        return type("Encoding", (), {"ids": [self.vocab.get(w, 0) for w in text.split()]})()


def test_ioi_prompts_flip_the_answer_and_keep_the_length():
    class Fake:
        tokenizer = _WordTokenizer(["<unk>", "Mary", "John", "Anna"])

    prompts = ioi.ioi_prompts(Fake(), n=4, names=("Mary", "Zed Zed", "John", "Anna"))
    assert len(prompts) == 4 and len({p.text for p in prompts}) == 4
    p0, p1 = prompts[0], prompts[1]
    assert p0.text == "When Mary and John went to the store, John gave a drink to"
    assert p0.corrupted == "When Mary and John went to the store, Mary gave a drink to"
    assert (p0.io, p0.s, p0.io_id, p0.s_id) == ("Mary", "John", 1, 2)
    assert p1.text == "When Mary and Anna went to the park, Mary gave a ball to"  # BABA: S first
    assert (p1.io, p1.s, p1.corrupted) == ("Anna", "Mary", "When Mary and Anna went to the park, Anna gave a ball to")
    assert all(len(p.text.split()) == len(p.corrupted.split()) for p in prompts)


# ---------------------------------------------------------------------- logit lens


@torch.no_grad()
def test_logit_lens_last_row_is_the_model_and_each_row_is_the_model_cut_there(lm):
    x = ids(10, seed=2)
    lens = logit_lens.logit_lens(lm, x, target=5)
    L = lm.cfg.n_layers
    assert lens.layers == ["embed"] + [str(i) for i in range(L)] and lens.top_ids.shape == (L + 1, 10)
    probs = lm(x)[0].softmax(-1)
    assert np.array_equal(lens.top_ids[-1], probs.argmax(-1).numpy())
    assert np.array_equal(lens.top_probs[-1], probs.max(-1).values.double().numpy())
    assert np.allclose(lens.target_probs[-1], probs[:, 5].double().numpy(), atol=0)
    # row i = the same model with only layers 0..i (the final norm with THIS residual's statistics)
    for i in range(L - 1):
        cut = DecoderLM(LMConfig(**(lm.cfg.to_dict() | {"n_layers": i + 1}))).eval()
        cut.load_state_dict({k: v for k, v in lm.state_dict().items()
                             if not k.startswith("decoder.layers.") or int(k.split(".")[2]) <= i})
        p = cut(x)[0].softmax(-1)
        # two float32 paths to the same probabilities: logits off by d move a probability by at most 2d
        d = f32_tol(cut(x), n=lm.cfg.d_model)
        assert np.allclose(lens.top_probs[i + 1], p.max(-1).values.double().numpy(), rtol=0, atol=2 * d)
        assert np.array_equal(lens.top_ids[i + 1], p.argmax(-1).numpy())
        assert np.array_equal(lens.target_ranks[i + 1], (p > p[:, 5:6]).sum(-1).numpy())


# ---------------------------------------------------------------------- Q/K map


def _softmax_rows(q, k, d):
    s = q @ k.T / math.sqrt(d)
    s = np.where(np.triu(np.ones_like(s, dtype=bool), 1), -np.inf, s)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@torch.no_grad()
def test_qk_normalisation_keeps_every_softmax_row(lm):
    inputs = [ids(8, seed=s)[0] for s in range(3)] + [ids(11, seed=9)[0]]
    head = lm.cfg.n_heads - 1
    m = qk.qk_map(lm, inputs, "decoder.layers.1.self_attn", head)
    hs = lm.cfg.head_dim
    assert m.kv_head == head // (lm.cfg.n_heads // lm.cfg.kv_heads)
    tr = qk.gather(lm, inputs, ["decoder.layers.1.self_attn"])
    for s, t in enumerate(tr):
        q = t["decoder.layers.1.self_attn.q"][head].double().numpy()
        k = t["decoder.layers.1.self_attn.k"][m.kv_head].double().numpy()
        real = m.weights[s]
        # real: the model's float32 softmax; here float64 from the same q, k. The model's scores carry float32
        # rounding (a few ulps of max|q| max|k| / sqrt(hs) x sqrt(hs)), which moves a weight by at most twice
        # that, plus the softmax's own rounding over a row
        s_tol = f32_tol(np.abs(q).max() * np.abs(k).max() / math.sqrt(hs), n=hs)
        w_tol = 2 * s_tol + f32_tol(1, n=q.shape[0])
        assert np.allclose(_softmax_rows(q, k, hs), real, rtol=0, atol=w_tol)  # the head's own weights from q, k
        assert np.allclose(_softmax_rows(q, k + m.shift, hs), real, rtol=0, atol=w_tol)  # translation alone
        assert np.allclose(_softmax_rows(q * m.scale, k / m.scale, hs), real, rtol=0, atol=w_tol)  # scaling alone
        assert np.allclose(_softmax_rows(m.q[s], m.k[s], hs), real, rtol=0, atol=w_tol)  # both, as drawn
    qn, kn = np.concatenate(m.q), np.concatenate(m.k)
    assert np.allclose(qn.mean(0), kn.mean(0))  # centroids meet
    centre = qn.mean(0)
    assert np.isclose(np.linalg.norm(qn - centre, axis=1).mean(), np.linalg.norm(kn - centre, axis=1).mean())
    assert m.scale != 1.0 and np.abs(m.shift).max() > 0  # both changes did something
    n = sum(len(x) for x in inputs)
    assert m.xy.shape == (2 * n, 2) and (m.kind == "query").sum() == n and 0 < m.explained.sum() <= 1
    # top-5 keys of a query come from the real weights, within its own sentence and causal
    qi = m.index("query", 3, 9)
    top = m.top_keys(qi)
    assert [int(m.position[i]) for i, _ in top] == list(np.argsort(-m.weights[3][9], kind="stable")[:5])
    assert all(m.sentence[i] == 3 and m.kind[i] == "key" and m.position[i] <= 9 for i, _ in top)
    c, chance = m.clarity()
    assert 0 <= c <= 1 and 0 < chance < 1
    clear, ch = qk.head_clarity(lm, inputs)
    assert clear.shape == (lm.cfg.n_layers, lm.cfg.n_heads) and clear[1, head] == pytest.approx(c) and ch == chance
    with pytest.raises(ValueError, match="does not exist"):
        qk.qk_map(lm, inputs, "decoder.layers.1.self_attn", lm.cfg.n_heads)


def test_clarity_is_1_when_2d_nearness_ranks_keys_as_the_weights_do():
    # 2-D points, d_head 2: identical q and k per position, far apart: every query's top key is itself
    T = 8
    xy = np.stack([np.arange(T) * 10.0, np.zeros(T)], 1)
    w = np.tril(np.exp(-np.abs(np.arange(T)[:, None] - np.arange(T)[None]) * 3.0))
    w /= w.sum(-1, keepdims=True)
    m = qk.QKMap("m", 0, 0, np.concatenate([xy, xy]), np.array(["query"] * T + ["key"] * T), ["t"] * 2 * T,
                 np.concatenate([np.arange(T)] * 2), np.zeros(2 * T, int), np.array([1.0, 0.0]), [w],
                 [xy], [xy], 1.0, np.zeros(2))
    assert m.clarity(k=2)[0] == 1.0 and m.clarity(k=2)[1] == pytest.approx(np.mean([2 / (p + 1) for p in range(2, T)]))


# ---------------------------------------------------------------------- head ablation on an LM


@torch.no_grad()
def test_ablating_a_shared_kv_head_silences_its_query_heads():
    m = make(LLAMA)
    x = ids(9)
    r = m.cfg.n_heads // m.cfg.kv_heads
    shared = iv.shared_query_heads(m.cfg.n_heads, m.cfg.kv_heads, 1)
    assert shared == list(range(r, 2 * r))
    kv = m.run_with_hooks(x, hooks=iv.ablate_kv_head("decoder.layers.0.self_attn", 1))
    each = m.run_with_hooks(x, hooks=phenomena.heads_hooks(m, [(0, h) for h in shared]))
    assert torch.equal(kv, each)
    _, tr = m.run_with_trace(x, names="decoder.layers.0.self_attn.z",
                             hooks=iv.ablate_kv_head("decoder.layers.0.self_attn", 1))
    z = tr["decoder.layers.0.self_attn.z"][0]
    assert not z[shared].any() and z[[h for h in range(m.cfg.n_heads) if h not in shared]].abs().sum() > 0
    assert f"{r}" in iv.kv_head_note(m.cfg.n_heads, m.cfg.kv_heads, 1)


# ---------------------------------------------------------------------- the capture CLI's LM form


@pytest.fixture(scope="module")
def hf_llama_dir(tmp_path_factory):
    """A tiny random Llama in a Hugging Face directory (transformers' save_pretrained) with a word-level
    tokenizer.json."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    d = tmp_path_factory.mktemp("tiny-llama")
    words = ["<unk>", "<s>", "</s>", "the", "cat", "sat", "on", "mat"]
    cfg = transformers.LlamaConfig(vocab_size=len(words), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(d / "tokenizer.json"))
    return d


def test_capture_cli_model_text_form(hf_llama_dir, tmp_path):
    from model import Trace

    out = tmp_path / "x.safetensors"
    r = subprocess.run([sys.executable, "-m", "model.capture", str(hf_llama_dir), "the cat sat on the mat",
                        "--names", "*.self_attn.weights", "-o", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    tr = Trace.load(out)
    assert tr.names() == ["decoder.layers.0.self_attn.weights", "decoder.layers.1.self_attn.weights"]
    assert tuple(tr["decoder.layers.1.self_attn.weights"].shape) == (1, 4, 6, 6)
    assert tr.meta["tgt_tokens"] == ["the", "cat", "sat", "on", "the", "mat"]
    assert json.dumps(tr.meta["model"])  # the model's description travels with the file
    # the same in-process equals what the CLI wrote
    from model.capture import main

    assert main([str(hf_llama_dir), "the cat sat", "-o", str(tmp_path / "y.safetensors"), "--names", "logits"]) == 0


def test_capture_cli_refusals_are_one_line(tmp_path, capsys):
    from model.capture import main

    assert main([str(tmp_path / "nope"), "hello", "-o", str(tmp_path / "x.safetensors")]) == 2
    err = capsys.readouterr().err
    # the loader's sentence for a path that is not there (model/loaders/__init__.py, issue 38 §5): one line
    assert err.startswith("error: ") and "file not found" in err and err.count("\n") == 1 and "Traceback" not in err
    with pytest.raises(SystemExit):  # both forms at once: argparse's usage error
        main(["smollm2", "hello", "--checkpoint", "dates", "--text", "x", "-o", str(tmp_path / "x.safetensors")])
    with pytest.raises(SystemExit):
        main(["-o", str(tmp_path / "x.safetensors")])


def test_patching_rows_per_forward_keep_the_logits_under_budget():
    assert patching.fit_batch(32, 14, 61) == 32
    rows = patching.fit_batch(32, 100, 49152)  # SmolLM2 at 100 tokens: 32 rows would be 629 MiB of logits
    assert 1 <= rows < 32 and rows * 100 * 49152 * 4 <= patching.LOGITS_BUDGET_BYTES
    assert patching.fit_batch(32, 8192, 49152) == 1
