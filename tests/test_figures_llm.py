"""Figures of the Language model page. The per-head statistics and the logit lens come from model.analysis
(phenomena.head_statistics, logit_lens.logit_lens): the page draws them, it does not recompute them. Here:
those numbers mean what the page's labels (FL.STATS) say, by a plain loop written here, and the figures draw
exactly their inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from model.analysis import logit_lens as LL
from model.analysis import phenomena as PH
from model.families.lm import DecoderLM, LMConfig
from viz.figures import llm as FL

IDS = [5, 7, 9, 11, 5, 7, 9, 11, 5, 3]  # a repeated sequence: duplicate and induction patterns exist


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=16, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=32, max_len=32,
                   positional="rotary", norm="rmsnorm", ffn="gated", activation="silu")
    return DecoderLM(cfg).eval()


@pytest.fixture(scope="module")
def trace(model):
    with torch.no_grad():
        return model.run_with_trace(torch.tensor([IDS]), names="*.weights")[1]


def loop_score(w, stat: str) -> float:
    """w: [T, T] one head (row = query)."""
    T = len(w)
    rows = []
    for i in range(T):
        if stat == "sink" and i >= 1:
            rows.append(w[i][0])
        elif stat == "previous_token" and i >= 1:
            rows.append(w[i][i - 1])
        elif stat == "entropy":
            rows.append(-sum(p * math.log(p) for p in w[i] if p > 0))
        elif stat == "distance":
            rows.append(sum(w[i][j] * (i - j) for j in range(T)))
        elif stat == "duplicate_token":
            earlier = [j for j in range(i) if IDS[j] == IDS[i]]
            if earlier:
                rows.append(sum(w[i][j] for j in earlier))
        elif stat == "induction":
            after = [j + 1 for j in range(i) if IDS[j] == IDS[i] and j + 1 < i]
            if after:
                rows.append(sum(w[i][k] for k in after))
    return sum(rows) / len(rows)


@pytest.mark.parametrize("stat", list(FL.STATS))
def test_the_statistics_drawn_mean_what_their_labels_say(trace, stat):
    got = PH.head_statistics(trace)[stat].scores  # what the page draws for `stat`
    assert got.shape == (2, 4)
    for layer in range(2):
        w = trace[f"decoder.layers.{layer}.self_attn.weights"][0].double().tolist()
        for h in range(4):
            # pattern scores divide by the rows' float32 weight sums (TransformerLens's), not by 1
            assert got[layer, h] == pytest.approx(loop_score(w[h], stat), abs=1e-7)


def test_overview_draws_the_scores_with_clickable_cells(trace):
    scores = PH.head_statistics(trace)["induction"].scores
    fig = FL.head_overview(scores, "induction", layer=1, head=2)
    hm = fig.data[0]
    assert np.array_equal(np.asarray(hm.z), scores)
    assert tuple(np.asarray(hm.customdata)[1, 2]) == (1, 2)  # a click on (layer 1, head 2) opens it
    assert fig.layout.shapes[0].x0 == 1.5 and fig.layout.shapes[0].y0 == 0.5  # the chosen cell outlined


def test_no_repeat_means_nan_not_zero(model):
    with torch.no_grad():
        stats = PH.head_statistics(model.run_with_trace(torch.tensor([[1, 2, 3, 4]]), names="*.weights")[1])
    assert np.isnan(stats["induction"].scores).all() and np.isnan(stats["duplicate_token"].scores).all()


def test_old_links_short_stat_ids_still_name_a_statistic():
    assert all(v in FL.STATS for v in FL.STAT_ALIASES.values())


def test_logit_lens_of_some_positions_is_those_columns_of_the_whole_table(model):
    full = LL.logit_lens(model, torch.tensor([IDS]))
    part = LL.logit_lens(model, torch.tensor([IDS]), positions=[7, 8, 9])
    assert np.array_equal(part.top_ids, full.top_ids[:, 7:]) and np.allclose(part.top_probs, full.top_probs[:, 7:])
    fig = FL.logit_lens_figure([[str(i) for i in row] for row in part.top_ids], part.top_probs, [7, 8, 9],
                               [str(i) for i in IDS], rows=part.layers)
    assert list(fig.data[0].y) == ["embed", "0", "1"] and fig.layout.yaxis.type == "category"
    assert np.array_equal(np.asarray(fig.data[0].z), part.top_probs)


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
