"""One number per claim (issue 26 §1), on tiny random DecoderLMs and SmolLM2's tokenizer (no SmolLM2 weights):

- blocking token 0: the lesson's KL and the page's KL are one function's number on the same input, measured at
  one stated place (the last position);
- head detector scores: ours (divided by the rows that hold a pattern cell) beside TransformerLens's detect_head
  "mul" (divided by all T rows), TL's written out here from its source on one head;
- the induction pattern follows its definition, back-to-back repeats included ("ha ha ha ha");
- the logit lens's "appears and stays" is computed from the lens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tolerance import kl_tol

from model.analysis import lessons_llm, logit_lens, phenomena
from model.families.lm import DecoderLM, LMConfig

LLAMA = dict(vocab_size=61, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, d_ff=80, max_len=128,
             positional="rotary", rope_base=500.0, norm="rmsnorm", norm_eps=1e-6, ffn="gated",
             activation="silu", qkv_bias=False, out_bias=False, ffn_bias=False, tie_embeddings=True, bos_id=1)
LAUGH = "She laughed: ha ha ha ha, and he said no no no."


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    return DecoderLM(LMConfig(**LLAMA)).eval()


@pytest.fixture(scope="module")
def laugh_ids():
    """SmolLM2's own tokens for LAUGH (its tokenizer from the GGUF's metadata; no weights loaded)."""
    from model.loaders.bpe import tokenizer_from_gguf
    from model.loaders.gguf import read_gguf
    from model.loaders.smollm2 import smollm2_path

    tok = tokenizer_from_gguf(read_gguf(smollm2_path()).metadata)
    enc = tok.encode(LAUGH)
    assert enc.tokens[3:7] == ["Ġha"] * 4 and enc.tokens[11:14] == ["Ġno"] * 3  # back-to-back repeats
    return torch.tensor(enc.ids)


def ids(T=12, seed=1, V=61):
    return torch.randint(2, V, (1, T), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------- one KL


def test_sink_effect_kl_is_block_sinks_kl_at_the_last_position(lm):
    """sink_effect (the lesson) and block_sink (the page) give the same number, and it is KL(intact || blocked)
    of the next-token distribution at the last position, by hand."""
    x = ids(10)
    eff = phenomena.sink_effect(lm, x)
    b = phenomena.block_sink(lm, x)
    assert eff.kl_everywhere == b.kl and eff.block == b
    assert lessons_llm.block_sink is phenomena.block_sink  # the old import path is the same function
    with torch.no_grad():
        p = lm(x)[0, -1].double().log_softmax(-1)
        q = lm.run_with_hooks(x, hooks=phenomena.block_first_key(names=phenomena.attention_names(lm)))[0, -1]
        q = q.double().log_softmax(-1)
    assert b.kl == pytest.approx(float((p.exp() * (p - q)).sum()), rel=1e-9)
    assert "last position" in phenomena.KL_WHERE
    # the per-head map (batched, 4 heads a forward) is measured at the same place as one head blocked alone
    per = phenomena.sink_effect(lm, x, per_head=True, batch=4).kl_per_head
    one = phenomena.block_sink(lm, x, [(2, 3)])
    # float32 batch noise only: the batch of 4 and the single run round their logits differently (kl_tol)
    blocked = lm.run_with_hooks(x, hooks=phenomena.block_first_key(layer_heads={phenomena.attention_names(lm)[2]: [3]}))
    assert per[2, 3] == pytest.approx(one.kl, rel=0, abs=kl_tol(lm(x)[0, -1], blocked[0, -1], n=lm.cfg.d_model))


# ---------------------------------------------------------------------- head detector scores: ours and TL's


def tl_previous(T):  # transformer_lens/head_detector.py, written out
    p = torch.zeros(T, T)
    p[1:, :-1] = torch.eye(T - 1)
    return torch.tril(p)


def tl_duplicate(tokens):
    tp = tokens.repeat(tokens.shape[-1], 1).numpy()
    eq = np.equal(tp, tp.T).astype(int)
    np.fill_diagonal(eq, 0)
    return torch.tril(torch.as_tensor(eq).float())


def tl_induction(tokens):
    dup = tl_duplicate(tokens)
    shifted = torch.roll(dup, shifts=1, dims=1)
    return torch.tril(torch.cat((torch.zeros(dup.shape[0], 1), shifted[:, 1:]), dim=1))


def tl_mul(attention, detection):  # compute_head_attention_similarity_score, "mul", no exclusions
    return float((attention * detection).sum() / attention.sum())


@torch.no_grad()
def test_head_statistics_give_ours_and_transformer_lens_mul_side_by_side(lm, laugh_ids):
    x = laugh_ids[None] % 61  # SmolLM2's repeats, in the tiny model's vocabulary
    T = x.shape[1]
    _, tr = lm.run_with_trace(x, names="*.self_attn.weights")
    stats = phenomena.head_statistics(tr)
    layer, head = 1, 4
    a = tr[f"decoder.layers.{layer}.self_attn.weights"][0, head].double()
    for k, pat in (("previous_token", tl_previous(T)), ("duplicate_token", tl_duplicate(x[0])),
                   ("induction", tl_induction(x[0]))):
        s = stats[k]
        assert s.tl_scores.shape == s.scores.shape == (3, 6)
        assert s.tl_scores[layer, head] == pytest.approx(tl_mul(a, pat.double()), rel=1e-9)  # TL's number
        rows = int((pat.sum(-1) > 0).sum())
        assert s.scores[layer, head] == pytest.approx(s.tl_scores[layer, head] * T / rows, rel=1e-6)  # ours
        assert "ours" in s.recipe and "TransformerLens" in s.recipe
    assert stats["sink"].tl_scores is None


@torch.no_grad()
def test_olssons_induction_input_also_carries_tls_number(lm):
    n = 8
    x = phenomena.induction_sequence(lm, n=n, seed=2)
    _, tr = lm.run_with_trace(x, names="*.self_attn.weights")
    s = phenomena.head_statistics(tr, period=n)["induction"]
    a = tr["decoder.layers.0.self_attn.weights"][0, 2].double()
    assert s.tl_scores[0, 2] == pytest.approx(tl_mul(a, tl_induction(x[0]).double()), rel=1e-9)
    assert s.scores[0, 2] == pytest.approx(float(phenomena.induction_score(tr["decoder.layers.0.self_attn.weights"],
                                                                           n)[2]), rel=1e-9)


# ---------------------------------------------------------------------- the induction pattern, by its definition


def definition(tokens):
    """The token after every earlier copy of token i: cells (i, j + 1) for j < i with tokens[j] == tokens[i]."""
    T = len(tokens)
    p = torch.zeros(T, T)
    for i in range(T):
        for j in range(i):
            if tokens[j] == tokens[i]:
                p[i, j + 1] = 1
    return p


def test_induction_pattern_keeps_the_query_itself_after_a_back_to_back_copy(laugh_ids):
    pat = phenomena.induction_pattern(laugh_ids)
    assert torch.equal(pat, definition(laugh_ids.tolist()))
    assert torch.equal(pat, tl_induction(laugh_ids))  # TransformerLens's tril keeps the diagonal too
    # the second "ha" (position 4) follows the first (3): its only cell is itself; the fourth has 3 cells
    assert pat[4].nonzero().flatten().tolist() == [4]
    assert pat[6].nonzero().flatten().tolist() == [4, 5, 6]
    assert int(pat.diagonal().sum()) == 3 + 2  # ha x 3 repeats, no x 2


@torch.no_grad()
def test_induction_score_on_typed_text_follows_the_definition(lm, laugh_ids):
    """On the laugh prompt, the induction map equals a from-definition computation head by head (Pearson 1),
    and a head made to attend to the token after the previous copy (itself, for "ha ha") scores 1."""
    x = laugh_ids[None] % 61
    T = x.shape[1]
    cells = definition(x[0].tolist())
    last_copy = {i: int(cells[i].nonzero().max()) for i in range(T) if cells[i].any()}

    def hook(s, name):
        s = s.clone()
        s[:, 0] = -1e4
        for i in range(T):
            s[:, 0, i, last_copy.get(i, 0)] = 1e4
        return s

    _, tr = lm.run_with_trace(x, names="*.self_attn.weights", hooks={"decoder.layers.2.self_attn.scores": hook})
    got = phenomena.head_statistics(tr)["induction"].scores
    want = np.zeros_like(got)
    rows = cells.sum(-1) > 0
    for layer in range(3):
        w = tr[f"decoder.layers.{layer}.self_attn.weights"][0].double()
        for h in range(6):
            want[layer, h] = float((w[h] * cells).sum() / w[h][rows].sum())
    assert got == pytest.approx(want, rel=1e-9)
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] == pytest.approx(1.0)
    assert got[2, 0] == pytest.approx(1.0, abs=1e-6)


# ---------------------------------------------------------------------- the logit lens: appears and stays


def lens_of(column):
    top = np.array([[0, v] for v in [99] + column])  # row 0 reads the embeddings
    return logit_lens.LogitLens(["embed"] + [str(i) for i in range(len(column))], None, top,
                                np.zeros(top.shape), None, None, None)


def test_settles_is_the_first_layer_from_which_the_answer_stays_on_top():
    s = logit_lens.settles(lens_of([5, 7, 7, 3, 7, 7]))
    assert (s.token, s.layer, s.first_top, s.n_layers, s.only_last) == (7, 4, 1, 6, False)
    late = logit_lens.settles(lens_of([5, 5, 3, 3, 3, 7]))  # only the last layer: no "appears and stays"
    assert (late.layer, late.only_last) == (5, True)


# ---------------------------------------------------------------------- labels from the model itself


@torch.no_grad()
def test_a_sampled_token_carries_the_probability_it_was_drawn_with(lm):
    """At T = 0.8 the step says softmax(logits / 0.8)[chosen] (was: the T = 1 probability), and the chosen token
    is always among the shown bars."""
    from model.loaders.lm import LanguageModel

    wrapped = LanguageModel(lm, stop_ids=[])
    x = ids(6)
    steps = wrapped.generate(x, max_new_tokens=8, temperature=0.8, seed=1).steps
    prefix = x[0].tolist()
    for s in steps:
        logits = lm(torch.tensor([prefix]))[0, -1].float()
        assert s.sampled_prob == pytest.approx(float(torch.softmax(logits / 0.8, -1)[s.id]), rel=1e-4)
        assert s.prob == pytest.approx(float(torch.softmax(logits, -1)[s.id]), rel=1e-4)
        assert s.token in [tok for tok, _ in s.drawn_top] and len(s.drawn_top) == 10
        prefix.append(s.id)
    greedy = wrapped.generate(x, max_new_tokens=2).steps[0]
    assert greedy.sampled_prob == greedy.prob and greedy.drawn_top is None


def test_smollm2s_card_comes_from_its_gguf(lm):
    """The label's facts (Instruct, Q4_1, float32, English) from the file: general.file_type, general.languages."""
    from model.loaders.card import model_card
    from model.loaders.smollm2 import MODEL_NAME, smollm2_path

    class Stub:  # the card reads lm.name, lm.source and the parameters' dtype: no need to load 135M weights
        name, source = MODEL_NAME, smollm2_path()
        model = torch.nn.Linear(2, 2)

    card = model_card(Stub())
    assert (card.name, card.file_format, card.quantization, card.compute_dtype, card.languages) == (
        "SmolLM2-135M-Instruct", "GGUF", "Q4_1", "float32", ("en",))
    assert card.speaks("zh") is False and card.speaks("en-US") is True
    bare = model_card(lm)  # a DecoderLM built in memory: no file, nothing claimed
    assert bare.quantization is None and bare.languages == () and bare.speaks("zh") is None


def test_streamed_text_never_ends_in_a_broken_character():
    """SmolLM2's tokenizer splits 北京的天气很好 into byte pieces; every prefix shows whole characters only,
    holding the tokens whose bytes are still incomplete (at most 3)."""
    from model.loaders.bpe import tokenizer_from_gguf
    from model.loaders.gguf import read_gguf
    from model.loaders.smollm2 import smollm2_path
    from model.loaders.utf8 import complete_text

    tok = tokenizer_from_gguf(read_gguf(smollm2_path()).metadata)
    text = "北京的天气很好"
    x = tok.encode(text).ids
    decode = tok.decode
    broken = 0
    for n in range(1, len(x) + 1):
        shown, held = complete_text(decode, x[:n])
        broken += decode(x[:n]).endswith("\ufffd")
        assert "\ufffd" not in shown and text.startswith(shown) and 0 <= held <= 3
    assert broken >= 3 and complete_text(decode, x) == (text, 0)
