"""The Attention phenomena figures draw exactly the analyses' numbers, and the small LM measurements the page and
the Experiments page add (model/analysis/lessons_llm.py) hold against independent runs. Tiny seeded DecoderLMs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_lm_analysis import GPT2, LLAMA, make

from model import interventions as iv
from model.analysis import lessons_llm as LL
from model.analysis import phenomena as PH
from viz.figures import phenomena as FPH


@pytest.fixture(params=["llama", "gpt2"])
def lm(request):
    return make(LLAMA if request.param == "llama" else GPT2)


def outlined(fig) -> set[tuple[int, int]]:
    """The (layer, head) cells a head map outlines."""
    return {(round((s.y0 + s.y1) / 2), round((s.x0 + s.x1) / 2)) for s in fig.layout.shapes}


def test_head_map_draws_the_scores_and_outlines_the_found_heads(lm):
    res = PH.induction(lm, n=12)
    s = res.scores["previous_token"]
    th = float(np.median(s.scores))  # a random model: the upper half of its heads are "found"
    s = PH._scored("previous_token", s.scores, th)
    fig = FPH.head_map(s.scores, "score", [(a, b) for a, b, _ in s.heads], zmax=1.0)
    np.testing.assert_array_equal(np.asarray(fig.data[0].z), s.scores)
    assert outlined(fig) == {(a, b) for a, b, _ in s.heads} and s.heads
    assert all(s.scores[a, b] >= th for a, b in outlined(fig))
    custom = np.asarray(fig.data[0].customdata)
    assert custom[1, 2].tolist() == [1, 2]  # a click on a cell says which head it is


def test_diverging_head_map_is_centred_at_zero():
    z = np.array([[1.0, -3.0], [0.5, 2.0]])
    fig = FPH.head_map(z, "DLA", diverging=True)
    assert (fig.data[0].zmin, fig.data[0].zmax, fig.data[0].zmid) == (-3.0, 3.0, 0.0)


def test_repeat_loss_figure_draws_both_copies(lm):
    res = PH.induction(lm, n=10)
    fig = FPH.repeat_loss_figure(res.loss.per_token, res.n)
    first, first_mean, second, second_mean = fig.data
    np.testing.assert_array_equal(first.y, res.loss.per_token[:10])
    np.testing.assert_array_equal(second.y, res.loss.per_token[10:20])
    assert first_mean.y[0] == pytest.approx(res.loss.first) and second_mean.y[0] == pytest.approx(res.loss.second)


def test_ablation_bars_draw_the_ablation_result(lm):
    res = PH.induction(lm, n=10)
    ab = PH.ablate_top_induction(lm, res, k=2, n_controls=2)
    fig = FPH.ablation_bars(ab.base, ab.ablated, ab.control, "loss", "top 2")
    assert list(fig.data[0].y) == [ab.base, ab.ablated, *ab.control]


def test_patching_map_and_logit_diff_bars_draw_their_numbers():
    resid = np.arange(12, dtype=float).reshape(3, 4) / 10 - 0.3
    fig = FPH.patching_map(resid, ["a", "b", "c", "d"])
    np.testing.assert_array_equal(np.asarray(fig.data[0].z), resid)
    assert fig.data[0].zmid == 0 and list(fig.data[0].x)[1] == "1: b"
    bars = FPH.logit_diff_bars(["p0", "p1"], [2.5, -1.0])
    assert list(bars.data[0].x) == [2.5, -1.0]


def test_comparison_table_keeps_rows_in_columns():
    fig = FPH.comparison_table([("a", "b", "c"), ("d", "e", "f")], ("x", "y", "z"))
    assert [list(c) for c in fig.data[0].cells.values] == [["a", "d"], ["b", "e"], ["c", "f"]]


# ---------------------------------------------------------------- lessons_llm


def test_block_sink_hides_token_0_from_rows_1_on(lm):
    """With the hooks the page uses, every row 1.. puts exactly 0 on token 0 and still sums to 1; in one head
    only that head changes."""
    x = torch.randint(2, 61, (1, 9), generator=torch.Generator().manual_seed(3))
    names = PH.attention_names(lm)
    _, tr = lm.run_with_trace(x, names="*.self_attn.weights", hooks=LL.sink_hooks(lm))
    for n in names:
        w = tr[f"{n}.weights"][0]
        assert float(w[:, 1:, 0].abs().max()) == 0.0
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    _, intact = lm.run_with_trace(x, names="*.self_attn.weights")
    _, one = lm.run_with_trace(x, names="decoder.layers.0.self_attn.weights", hooks=LL.sink_hooks(lm, [(0, 1)]))
    w0, w1 = intact[f"{names[0]}.weights"][0], one[f"{names[0]}.weights"][0]
    assert float(w1[1, 1:, 0].abs().max()) == 0.0
    torch.testing.assert_close(w1[0], w0[0])  # another head of the same layer is untouched
    b = LL.block_sink(lm, x)
    logits = lm(x)[0, -1].double()
    assert b.top_before == int(logits.argmax()) and b.answer_logit_before == pytest.approx(float(logits[b.top_before]))
    after = lm.run_with_hooks(x, hooks=LL.sink_hooks(lm))[0, -1].double()
    assert b.top_after == int(after.argmax()) and b.kl > 0


def test_lm_head_importance_equals_one_ablation_at_a_time(lm):
    """The batched map (several heads per forward) gives each head's own single ablation."""
    x = torch.randint(2, 61, (1, 8), generator=torch.Generator().manual_seed(4))
    hi = LL.lm_head_importance(lm, x, batch=5)
    names = PH.attention_names(lm)
    base = lm(x)[0, -1].double().log_softmax(-1)
    answer = int(base.argmax())
    assert hi.base == pytest.approx(float(base[answer]))
    for layer, head in [(0, 0), (len(names) - 1, lm.cfg.n_heads - 1), (1, 2)]:
        lp = lm.run_with_hooks(x, hooks=iv.ablate_head(names[layer], head))[0, -1].double().log_softmax(-1)
        assert hi.delta[layer, head] == pytest.approx(float(lp[answer] - base[answer]), abs=1e-5)


def test_lm_hooks_kv_head_silences_its_query_heads_and_no_rope():
    m = make(LLAMA)  # 6 query heads, 2 K/V heads: K/V head 1 serves query heads 3, 4, 5
    x = torch.randint(2, 61, (1, 7), generator=torch.Generator().manual_seed(5))
    hooks = LL.lm_hooks(["ablate_kv_head:module=decoder.layers.1.self_attn,kv_head=1,mode=zero"], m)
    _, tr = m.run_with_trace(x, names="decoder.layers.1.self_attn.z", hooks=hooks)
    z = tr["decoder.layers.1.self_attn.z"][0]
    assert float(z[3:].abs().max()) == 0.0 and float(z[:3].abs().min()) >= 0 and float(z[:3].abs().max()) > 0
    _, tr = m.run_with_trace(x, names="decoder.layers.0.self_attn.q*", hooks=LL.lm_hooks(["no_positional"], m))
    torch.testing.assert_close(tr["decoder.layers.0.self_attn.q"], tr["decoder.layers.0.self_attn.q_unrot"])
    with pytest.raises(iv.SpecError, match="does not apply"):
        LL.lm_hooks(["shuffle_source:seed=1"], m)
    with pytest.raises(iv.SpecError, match="kv_head"):
        LL.lm_hooks(["ablate_kv_head:kv_head=x"], m)


def test_lm_before_after_measures_the_hooked_run(lm):
    x = torch.randint(2, 61, (1, 8), generator=torch.Generator().manual_seed(6))
    hooks = LL.lm_hooks(["no_scaling"], lm)
    ba = LL.lm_before_after(lm, x, hooks)
    a, b = lm(x)[0].double(), lm.run_with_hooks(x, hooks=hooks)[0].double()
    assert [i for i, _ in ba.top_after] == b[-1].topk(5).indices.tolist()
    first, second = a[-1].topk(2).indices.tolist()
    assert ba.logit_diff_after == pytest.approx(float(b[-1, first] - b[-1, second]))
    assert ba.loss_after == pytest.approx(float(torch.nn.functional.cross_entropy(b[:-1], x[0, 1:])))
    assert ba.kl > 0
