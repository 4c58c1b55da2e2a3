"""Figures of the Language model page: every drawn number equals the one computed from the trace, by a
plain loop written here (not the vectorized code under test)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from model.families.lm import DecoderLM, LMConfig
from viz import figures_llm as FL

IDS = [5, 7, 9, 11, 5, 7, 9, 11, 5, 3]  # a repeated sequence: duplicate and induction patterns exist


@pytest.fixture(scope="module")
def trace():
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=16, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=32, max_len=32,
                   positional="rotary", norm="rmsnorm", ffn="gated", activation="silu")
    model = DecoderLM(cfg).eval()
    with torch.no_grad():
        return model.run_with_trace(torch.tensor([IDS]), names="*.weights", meta={"tgt_ids": IDS})[1]


def loop_score(w, stat: str) -> float:
    """w: [T, T] one head (row = query)."""
    T = len(w)
    rows = []
    for i in range(T):
        if stat == "sink" and i >= 1:
            rows.append(w[i][0])
        elif stat == "prev" and i >= 1:
            rows.append(w[i][i - 1])
        elif stat == "entropy":
            rows.append(-sum(p * math.log(p) for p in w[i] if p > 0))
        elif stat == "distance":
            rows.append(sum(w[i][j] * (i - j) for j in range(T)))
        elif stat == "dup":
            earlier = [j for j in range(i) if IDS[j] == IDS[i]]
            if earlier:
                rows.append(sum(w[i][j] for j in earlier))
        elif stat == "induction":
            after = [j + 1 for j in range(i) if IDS[j] == IDS[i] and j + 1 < i]
            if after:
                rows.append(sum(w[i][k] for k in after))
    return sum(rows) / len(rows)


@pytest.mark.parametrize("stat", list(FL.STATS))
def test_head_scores_equal_a_plain_loop(trace, stat):
    got = FL.head_scores(trace, stat)
    assert got.shape == (2, 4)
    for layer in range(2):
        w = trace[f"decoder.layers.{layer}.self_attn.weights"][0].double().tolist()
        for h in range(4):
            assert got[layer, h] == pytest.approx(loop_score(w[h], stat), abs=1e-9)


def test_overview_draws_the_scores_with_clickable_cells(trace):
    scores = FL.head_scores(trace, "induction")
    fig = FL.head_overview(scores, "induction", layer=1, head=2)
    hm = fig.data[0]
    assert np.array_equal(np.asarray(hm.z), scores)
    assert tuple(np.asarray(hm.customdata)[1, 2]) == (1, 2)  # a click on (layer 1, head 2) opens it
    assert fig.layout.shapes[0].x0 == 1.5 and fig.layout.shapes[0].y0 == 0.5  # the chosen cell outlined


def test_no_repeat_means_nan_not_zero():
    w = np.full((2, 4, 4), 0.25)
    assert np.isnan(FL._stat(w, np.array([1, 2, 3, 4]), "induction")).all()
    assert np.isnan(FL._stat(w, np.array([1, 2, 3, 4]), "dup")).all()


def test_top_tokens_and_step_attention_draw_their_inputs():
    top = [("␣Mary", 0.6), ("␣John", 0.3), ("↵", 0.1)]
    fig = FL.top_tokens_figure(top, "␣Mary")
    assert list(fig.data[0].x) == [0.6, 0.3, 0.1] and fig.data[0].y[0] == "1. ␣Mary"
    attn = torch.rand(3, 2, 5)
    fig = FL.step_attention_figure(attn, ["a", "b", "c", "d", "e"], head=1)
    assert np.allclose(np.asarray(fig.data[0].z), attn[:, 1].numpy())


def test_logit_lens_figure_cells():
    tops = [["a", "b"], ["c", "d"]]
    p = np.array([[0.1, 0.2], [0.3, 0.9]])
    fig = FL.logit_lens_figure(tops, p, [3, 4], ["w", "x", "y", "z", "␣q"])
    assert np.allclose(np.asarray(fig.data[0].z), p) and [list(r) for r in fig.data[0].text] == tops
    assert list(fig.data[0].x) == ["3: z", "4: ␣q"]
