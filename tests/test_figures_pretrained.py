"""Pure helpers of the Pretrained encoder page: WordPiece merging, head ranking, figures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model import Trace
from viz.figures import pretrained as FP

# "[CLS] token ##ization is fun [SEP]": word ids as the tokenizer reports them.
WORD_IDS = [None, 0, 0, 1, 2, None]
TOKENS = ["[CLS]", "token", "##ization", "is", "fun", "[SEP]"]
TEXT = "tokenization is fun"
OFFSETS = [(0, 0), (0, 5), (5, 12), (13, 15), (16, 19), (0, 0)]


def random_attention(*shape: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=shape)
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def test_word_groups_join_a_words_pieces_and_keep_specials_apart():
    assert FP.word_groups(WORD_IDS) == [[0], [1, 2], [3], [4], [5]]
    assert FP.word_groups([None, None]) == [[0], [1]]  # [CLS] [SEP] never merge with each other


def test_group_labels_show_the_whole_word():
    groups = FP.word_groups(WORD_IDS)
    assert FP.group_labels(TOKENS, groups, TEXT, OFFSETS) == ["[CLS]", "tokenization", "is", "fun", "[SEP]"]
    assert FP.group_labels(TOKENS, groups) == ["[CLS]", "tokenization", "is", "fun", "[SEP]"]


def test_merge_pieces_sums_key_pieces_and_averages_query_pieces():
    w = random_attention(6, 6)
    m = FP.merge_pieces(w, FP.word_groups(WORD_IDS))
    assert m.shape == (5, 5)
    # to the split word: sum of its two key columns; from it: mean of its two query rows
    np.testing.assert_allclose(m[0, 1], w[0, 1] + w[0, 2], rtol=1e-6)
    np.testing.assert_allclose(m[1, 2], (w[1, 3] + w[2, 3]) / 2, rtol=1e-6)  # tokenization → is
    np.testing.assert_allclose(m[1, 1], (w[1, 1] + w[1, 2] + w[2, 1] + w[2, 2]) / 2, rtol=1e-6)
    np.testing.assert_allclose(m[4, 4], w[5, 5], rtol=1e-6)  # single-piece words are unchanged
    np.testing.assert_allclose(m.sum(-1), 1.0, rtol=1e-5)  # rows are still distributions


def test_merge_pieces_keeps_leading_axes_and_is_identity_without_pieces():
    w = random_attention(2, 3, 4, 4)
    np.testing.assert_allclose(FP.merge_pieces(w, [[0], [1], [2], [3]]), w, rtol=1e-6)
    assert FP.merge_pieces(torch.from_numpy(w), [[0, 1], [2], [3]]).shape == (2, 3, 3, 3)


def fake_trace(L: int = 3, H: int = 4, n: int = 6) -> Trace:
    w = {f"encoder.layers.{i}.self_attn.weights": torch.from_numpy(random_attention(1, H, n, n, seed=i))
         for i in range(L)}
    return Trace(w, {"src_tokens": TOKENS[:n]})


def test_attention_from_reads_rows_and_merges_like_merge_pieces():
    tr = fake_trace()
    rows = FP.attention_from(tr, [3])
    assert rows.shape == (3, 4, 6)
    np.testing.assert_allclose(rows[2, 1], tr["encoder.layers.2.self_attn.weights"][0, 1, 3].numpy())
    groups = FP.word_groups(WORD_IDS)
    merged = FP.attention_from(tr, groups[1], groups)  # from "tokenization" (two query pieces)
    full = FP.merge_pieces(tr["encoder.layers.1.self_attn.weights"][0], groups)  # [H, G, G]
    np.testing.assert_allclose(merged[1], full[:, 1, :], rtol=1e-5)


def test_rank_heads_orders_every_head_by_the_first_weight():
    w1 = np.array([[0.1, 0.7], [0.7, 0.2]])
    w2 = np.array([[0.5, 0.0], [0.1, 0.3]])
    r = FP.rank_heads(w1, w2)
    assert [(x["layer"], x["head"]) for x in r] == [(0, 1), (1, 0), (1, 1), (0, 0)]  # ties: lower layer
    assert r[0] == {"rank": 1, "layer": 0, "head": 1, "to1": 0.7, "to2": 0.0, "difference": 0.7}


@pytest.mark.parametrize("metric", ["weight", "difference"])
def test_head_finder_figure_carries_exact_values_per_cell(metric):
    w1, w2 = random_attention(3, 4, seed=1), random_attention(3, 4, seed=2)
    fig = FP.head_finder_figure(w1, w2, "it", "animal", "street", metric, selected=(2, 3))
    heat, marks = fig.data
    np.testing.assert_allclose(np.asarray(heat.z), w1 - w2 if metric == "difference" else w1, rtol=1e-6)
    cd = np.asarray(marks.customdata)
    assert cd.shape == (12, 4)
    np.testing.assert_allclose(cd[:, 2], w1.ravel(), rtol=1e-6)
    assert [tuple(map(int, c[:2])) for c in cd[:2]] == [(0, 0), (0, 1)]
    assert len(fig.layout.shapes) == 1
    assert (fig.layout.xaxis.title.text, fig.layout.yaxis.title.text) == ("head", "layer")  # not the selection
    with pytest.raises(ValueError):
        FP.head_finder_figure(w1, w2, "a", "b", "c", "entropy")


def test_merged_heatmap_and_similarity_figure_label_their_axes():
    m = FP.merge_pieces(random_attention(6, 6), FP.word_groups(WORD_IDS))
    fig = FP.merged_heatmap(m, ["[CLS]", "tokenization", "is", "fun", "[SEP]"], "t")
    assert "merged" in fig.layout.xaxis.title.text and "merged" in fig.layout.yaxis.title.text
    assert list(fig.data[0].x)[1] == "1 tokenization"
    sim = FP.similarity_figure(np.eye(2), ["a", "b" * 60])
    assert sim.data[0].zmin == -1 and sim.data[0].zmax == 1 and sim.data[0].y[1].endswith("…")
