"""model/analysis/long.py (issue 24 §3-§4): pooled overview, zoom, document view, per-head statistics
tile by tile (= phenomena.head_statistics), needle in a haystack. Tiny random models and a tiny BPE
tokenizer built in-test."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tolerance import f32_tol

from model.analysis import long as lg
from model.analysis import phenomena as ph
from model.families.lm import DecoderLM, LMConfig
from model.loaders.lm import LanguageModel

CORPUS = [lg.FILLER * 3, lg.INTRO, lg.QUESTION, "The pass key is 71432. Remember it. 71432 is the pass key.",
          "0123456789 digits one by one"]


@pytest.fixture(scope="module")
def lm():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=320, special_tokens=["<|end|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    torch.manual_seed(0)
    m = DecoderLM(LMConfig(vocab_size=tok.get_vocab_size(), d_model=32, n_layers=3, n_heads=4, n_kv_heads=2,
                           d_ff=64, max_len=1024, positional="rotary", norm="rmsnorm", ffn="gated",
                           activation="silu", qkv_bias=False, out_bias=False, ffn_bias=False, bos_id=0)).eval()
    return LanguageModel(m, tok, name="tiny")


@pytest.fixture(scope="module")
def traces(lm):
    ids = torch.randint(0, 40, (1, 150), generator=torch.Generator().manual_seed(2))  # repeats: dup/induction cells
    with torch.no_grad():
        _, full = lm.model.run_with_trace(ids)
        _, lazy = lm.model.run_with_trace(ids, lazy=True)
    return full, lazy


def test_tiled_statistics_equal_the_whole_matrix_ones(traces, monkeypatch):
    full, lazy = traces
    want = ph.head_statistics(full)
    monkeypatch.setattr(lg, "TILE_BYTES", 4 * 150 * 8 * 7)  # 7 rows a tile: many tiles, a ragged last one
    T = full["decoder.layers.0.self_attn.weights"].shape[-1]
    for trace in (full, lazy):  # float32 weights (the lazy trace's recomputed in tiles), float64 sums
        got = lg.head_statistics_tiled(trace)
        for k, hs in want.items():
            assert got[k].scores.shape == (3, 4)
            # a statistic sums T float32 weights x its values: a few ulps of its largest value x sqrt(T)
            np.testing.assert_allclose(got[k].scores, hs.scores, rtol=0, atol=f32_tol(1, hs.scores, n=T))
            if hs.tl_scores is not None:
                np.testing.assert_allclose(got[k].tl_scores, hs.tl_scores, rtol=0, atol=f32_tol(1, n=T))
            assert got[k].threshold == hs.threshold and got[k].recipe == hs.recipe


def test_tiled_induction_score_with_a_period(lm):
    ids = ph.induction_sequence(lm, n=30)
    with torch.no_grad():
        _, full = lm.model.run_with_trace(ids)
        _, lazy = lm.model.run_with_trace(ids, lazy=True, fast=True)
    want = ph.head_statistics(full, period=30)["induction"].scores
    np.testing.assert_allclose(lg.head_statistics_tiled(lazy, period=30, stats=("induction",))["induction"].scores,
                               want, rtol=0, atol=f32_tol(1, n=ids.shape[1]))  # float32 weights summed over a row


def test_pooled_overview_rows_sum_to_one_and_pool_as_defined(traces):
    full, lazy = traces
    W = full["decoder.layers.1.self_attn.weights"][0, 3].double().numpy()
    for n in (7, 32, 150):
        o = lg.pooled_overview(lazy, 1, 3, n=n)
        assert o.cells.shape == (n, n) and o.q_edges[0] == 0 and o.q_edges[-1] == 150
        row_tol = f32_tol(1, n=W.shape[-1])  # a float32 softmax row of T weights sums to 1 to a few ulps x sqrt(T)
        np.testing.assert_allclose(o.cells.sum(1), 1.0, rtol=0, atol=row_tol)
        e = o.q_edges
        manual = np.array([[W[e[a]:e[a + 1], e[b]:e[b + 1]].sum(1).mean() for b in range(n)] for a in range(n)])
        np.testing.assert_allclose(o.cells, manual, rtol=0, atol=row_tol)
    assert np.allclose(lg.pooled_overview(lazy, 1, 3, n=500).cells, W, rtol=0, atol=row_tol)  # n >= T: the exact map


def test_zoom_is_the_exact_window(traces):
    full, lazy = traces
    W = full["decoder.layers.2.self_attn.weights"][0, 1].numpy()
    # the lazy trace recomputes the weights in tiles: float32 rounding of weights <= 1 over rows of T keys
    np.testing.assert_allclose(lg.zoom(lazy, 2, 1, 40, 60, 10, 45), W[40:60, 10:45], rtol=0,
                               atol=f32_tol(1, n=W.shape[-1]))
    np.testing.assert_array_equal(lg.zoom(full, 2, 1, 40, 60, 10, 45), W[40:60, 10:45])
    assert lg.zoom(lazy, 2, 1, 140, 999, -5, 3).shape == (10, 3)  # clipped to the input


def test_document_view_head_layer_and_model_means(traces):
    full, lazy = traces
    pos = 90
    W = torch.stack([full[f"decoder.layers.{i}.self_attn.weights"][0, :, pos, :pos + 1] for i in range(3)]).double()
    for layer, head, want in ((2, 1, W[2, 1]), (0, None, W[0].mean(0)), (None, None, W.mean((0, 1)))):
        v = lg.document_view(lazy, pos, layer, head)
        assert v.position == pos and v.layer == layer and v.head == head and v.weights.shape == (pos + 1,)
        row_tol = f32_tol(1, n=pos + 1)  # float32 weights <= 1 over a row of pos + 1 keys
        np.testing.assert_allclose(v.weights, want.numpy(), rtol=0, atol=row_tol)
        assert abs(v.weights.sum() - 1) <= row_tol
        assert len(v.top) == 10 and [w for _, w in v.top] == sorted((w for _, w in v.top), reverse=True)
        assert v.top[0][0] == int(np.argmax(v.weights))
    last = lg.document_view(lazy)  # the last position: the one whose output is the next token
    assert last.position == 149 and last.weights.shape == (150,)


def test_document_view_of_a_generation_step(lm):
    gen = lm.generate(torch.randint(0, 40, (1, 60)), max_new_tokens=2, fast=True)
    step = gen.steps[-1]
    v = lg.focus(step.attention, layer=1, head=2)
    assert v.position == step.position and abs(v.weights.sum() - 1) < 1e-6


def test_needle_prompt_places_the_key(lm):
    for length, depth in ((200, 0.0), (300, 0.5), (300, 1.0)):
        p = lg.needle_prompt(lm, length, depth)
        assert p.length == length == p.ids.shape[1]
        s0, s1 = p.needle
        assert "The pass key is 71432" in lm.decode(p.ids[0, s0:s1])
        assert lm.decode(p.ids[0, -len(lm.encode(lg.QUESTION)[0]):]).endswith("The pass key is")
        assert "".join(lm.decode([a]) for a in p.answer).strip() == "71432"
    early, late = lg.needle_prompt(lm, 300, 0.1).needle[0], lg.needle_prompt(lm, 300, 0.9).needle[0]
    assert early < late
    with pytest.raises(ValueError):
        lg.needle_prompt(lm, 300, 1.5)


def test_needle_trial_probability_is_teacher_forced(lm):
    p = lg.needle_prompt(lm, 160, 0.5)
    t = lg.needle_trial(lm, p)
    ids = torch.cat([p.ids, torch.tensor([p.answer[:-1]])], dim=1)
    with torch.no_grad():
        logp = lm.model(ids)[0].log_softmax(-1)
    P = p.ids.shape[1]
    want = float(sum(logp[P - 1 + i, a] for i, a in enumerate(p.answer)).exp())
    assert abs(t.prob - want) <= 1e-5 * max(want, 1e-30) + 1e-12
    assert t.copy_hits.shape == (3, 4) and t.copy_hits.max() <= t.copied <= len(p.answer)


def test_copy_hits_and_retrieval_scores():
    ids = torch.tensor([5, 6, 7, 8, 9, 7])
    rows = torch.zeros(2, 2, 6)
    rows[0, 0, 2] = 1  # in the needle (2..4), holds 7: a hit when copying 7
    rows[0, 1, 5] = 1  # holds 7 but outside the needle
    rows[1, 0, 3] = 1  # in the needle, holds 8
    rows[1, 1, 0] = 1
    hits = lg.copy_hits(rows, ids, (2, 5), 7)
    assert hits.tolist() == [[True, False], [False, False]]
    t = lg.NeedleTrial(None, 0.5, 0.5, True, hits.numpy().astype(float), 1)
    s = lg.retrieval_scores([t, t])
    assert s.scores.tolist() == [[1.0, 0.0], [0.0, 0.0]] and s.heads == [(0, 0, 1.0)]


def test_ablate_retrieval_and_length_profile_run(lm):
    prompts = [lg.needle_prompt(lm, 120, d) for d in (0.2, 0.8)]
    scores = lg.retrieval_scores([lg.needle_trial(lm, p) for p in prompts])
    r = lg.ablate_retrieval(lm, prompts, scores, k=2, n_controls=1)
    assert len(r.heads) == 2 and len(r.controls) == 1 and not set(r.heads) & set(r.controls[0])
    assert all(0 <= x <= 1 for x in (r.base, r.ablated, *r.control, r.base_correct, r.ablated_correct))
    prof = lg.length_profile(lm, prompts[0].ids, [16, 64])
    assert prof.sink.shape == prof.entropy.shape == (2, 3)
    assert prof.uniform_entropy[1] > prof.uniform_entropy[0]


def test_sizes_for_pages_and_keeping_the_end(lm):
    ids = lm.encode(lg.FILLER * 4)
    T = ids.shape[1]
    assert torch.equal(lm.encode(lg.FILLER * 4, keep_last=10), ids[:, -10:])
    with torch.no_grad():
        _, lazy = lm.run_with_trace(ids, lazy=True)
        _, full = lm.run_with_trace(ids)
    assert lm.trace_bytes(T, lazy=True) == lazy.nbytes()
    assert lm.trace_bytes(T) >= full.nbytes() > lazy.nbytes()
    budget = lm.trace_bytes(T)
    assert lm.max_tokens_within(budget) >= T > 0
    assert lm.trace_bytes(lm.max_tokens_within(budget)) <= budget < lm.trace_bytes(lm.max_tokens_within(budget) + 1)
    assert lm.max_tokens_within(10**12, lazy=True) == lm.max_tokens  # the context length caps it
    from model.core.recorder import ContextLengthError
    with pytest.raises(ContextLengthError) as e:
        lm.encode("x " * 2000)
    assert e.value.context_length == lm.max_tokens and e.value.n_tokens > lm.max_tokens
    assert lm.encode("x " * 2000, keep_last=lm.max_tokens).shape[1] == lm.max_tokens


def test_long_figures(traces):
    from viz.figures import long as FL

    _, lazy = traces
    ov = lg.pooled_overview(lazy, 1, 3, n=16)
    toks = [f"t{i}" for i in range(149)] + ["<b>&\n"]
    fig = FL.overview_figure(ov, toks)
    # the window of cell (a, b): queries q_edges[a]..q_edges[a+1]-1, keys k_edges[b]..k_edges[b+1]-1 (the heatmap's
    # meta, not 4 integers a cell: issue 31 §2's payload)
    qe, ke = fig.data[0].meta["q_edges"], fig.data[0].meta["k_edges"]
    assert np.asarray(fig.data[0].z).shape == (16, 16) and len(qe) == len(ke) == 17 and fig.data[0].customdata is None
    assert [qe[0], qe[1], ke[0], ke[1]] == [0, ov.q_edges[1], 0, ov.k_edges[1]]
    assert qe[-1] == ke[-1] == 150
    w = FL.window_figure(lg.zoom(lazy, 1, 3, 140, 150, 0, 10), 140, 0, toks)
    assert list(w.data[0].y)[0].startswith("140: t140") and len(w.data[0].x) == 10
    view = lg.document_view(lazy, 149, layer=1, head=3)
    page = FL.document_html(toks, view)
    assert "&lt;b&gt;&amp;⏎<br>" in page and "<b>" not in page.replace("<br>", "")
    assert page.count("<span") == 150 and "outline:2px" in page
    rows = FL.top_sources(toks, view)
    assert len(rows) == 10 and rows[0][list(rows[0])[0]] == view.top[0][0]
