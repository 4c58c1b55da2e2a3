"""'Why here?' figure builders (issue 39 §3, viz/figures/why.py), without a model: explanations with given terms.

- the binned query-source × key-source matrix keeps Σ = the explanation's total (the bins are sums of terms);
- the heatmap is signed and centred at 0; the bars are the largest terms, signed;
- the sentence names the leading sources by its stated test, or says that none clearly leads;
- the runner-up is the row's highest weight other than the key; the check figure marks disagreements.
"""

from __future__ import annotations

import numpy as np
import pytest

from model.analysis import why
from viz.figures import why as FW


def fake(matrix, q=None, k=None, total=None, against=None) -> why.ScoreExplanation:
    """An explanation with given terms (the builders read only its numbers and names)."""
    m = np.asarray(matrix, dtype=np.float64)
    q = q or [f"q{a}" for a in range(m.shape[0])]
    k = k or [f"k{b}" for b in range(m.shape[1])]
    s = float(m.sum()) if total is None else total
    return why.ScoreExplanation(module="decoder.layers.1.self_attn", layer=1, head=0, query=5, key=2,
                                against=against, total=s, score=s, uncapped=s, weight=0.5, blocked=False,
                                query_sources=q, key_sources=k, matrix=m)


def test_binned_keeps_the_top_sources_and_sums_the_rest():
    rng = np.random.default_rng(0)
    m = rng.normal(size=(12, 15))
    m[3] *= 10  # the largest query source
    m[:, 7] *= 10  # the largest key source
    e = fake(m)
    ql, kl, z = FW.binned(e, n=4)
    assert z.shape == (5, 5) and ql[-1] == "other (8)" and kl[-1] == "other (11)"
    assert "q3" in ql and "k7" in kl
    assert z.sum() == pytest.approx(m.sum(), abs=1e-12)
    # a kept (query, key) cell is the term itself; the bins are sums of the terms left out
    assert z[ql.index("q3"), kl.index("k7")] == m[3, 7]
    assert z[-1].sum() == pytest.approx(m[[a for a in range(12) if f"q{a}" not in ql]].sum(), abs=1e-12)
    # nothing left out: no "other" row or column
    ql, kl, z = FW.binned(e, n=20)
    assert "other" not in " ".join(ql + kl) and np.array_equal(z, m)


def test_heatmap_is_signed_centred_and_sums_to_the_total():
    e = fake([[3.0, -1.0, 0.5], [0.2, 0.1, -0.3]], against=0)
    fig = FW.pairs_heatmap(e, tokens=list("abcdef"), n=2)
    hm = fig.data[0]
    assert hm.zmid == 0 and hm.zmin == -hm.zmax == -3.0
    assert np.asarray(hm.z).sum() == pytest.approx(e.total)
    assert "over key 0" in fig.layout.title.text
    bars = FW.top_pairs_figure(e, k=3)
    assert list(bars.data[0].x) == [3.0, -1.0, 0.5]
    assert list(bars.data[0].y) == ["q0 × k0", "q0 × k1", "q0 × k2"]


def test_runner_up_is_the_rows_other_highest_weight():
    w = [0.1, 0.6, 0.3, 0.0]
    assert FW.runner_up(w, 1) == 2 and FW.runner_up(w, 2) == 1 and FW.runner_up(w, 3) == 1
    assert FW.runner_up([1.0, 0.0, 0.0], 0) is None  # no other key has weight
    assert FW.runner_up(w, 9) is None


def test_sentence_names_a_clear_leader_or_says_none_leads():
    # key side: L3 H4 gives 6 of 8, the next 1: one source clearly leads (6 ≥ 2 × 1); the query side is spread
    # over three sources (8/3 each), so the key side is the one read
    lead = fake(np.tile([[1 / 3, 2.0, 1 / 3]], (3, 1)), q=["embed", "L0 H0", "L1 H0"], k=["embed", "L3 H4", "L5 H1"])
    s = FW.why_sentence(lead, "L17H3", tokens=["A", "B", "C", "D", "E", "F"])
    assert "L3 H4" in s and "at the key position" in s and "75%" in s and "L17H3" in s
    # two sources near-equal, the third small: the two together lead
    two = fake(np.tile([[4 / 3, 3.5 / 3, 0.5 / 3]], (3, 1)), q=["embed", "L0 H1", "L1 H1"],
               k=["L0 H0", "L3 H4", "L5 H1"], against=1)
    s2 = FW.why_sentence(two, "L17H3")
    assert "L0 H0 and L3 H4" in s2 and "rather than" in s2 and "94%" in s2
    # four equal sources: neither the top one nor the top two lead by 2×
    flat = fake(np.full((4, 4), 0.25), q=["w", "x", "y", "z"], k=["a", "b", "c", "d"])
    assert "no source clearly leads" in FW.why_sentence(flat, "L1H0")
    assert FW.leaders(flat)["names"] == []
    # a negative lead: the head prefers the other key
    neg = fake([[-3.0, -0.2]], q=["embed"], k=["L2 H0", "L2 H1"], against=0)
    assert "prefers 0" in FW.why_sentence(neg, "L1H0")
    # a single query source built the whole query: it carries all of it, and the sentence says so
    assert "the token embedding wrote at the query position: 100%" in FW.why_sentence(
        fake([[1.0, 6.0, 1.0]], q=["embed"]), "L1H0")


def test_check_figure_marks_disagreements():
    chk = why.Check(rows=[why.CheckRow("key", "L3 H4", 2.0, 1.95, 0.1, True),
                          why.CheckRow("query", "L0 ffn", -1.0, -0.2, -0.01, False)],
                    frozen_norm=False, recompute_error=0.0, tolerance="", weight=0.5)
    fig = FW.check_figure(chk)
    assert list(fig.data[0].y) == [2.0, -1.0] and list(fig.data[1].y) == [1.95, -0.2]
    assert fig.data[0].x[1].startswith("✗") and not fig.data[0].x[0].startswith("✗")
    rows = FW.check_rows(chk)
    assert rows[1]["agrees"].startswith("✗") and rows[0]["actual (taken out, live norm)"] == 1.95


def test_circuit_groups_figure_draws_each_heads_group_terms_and_lead():
    """/phenomena's circuits: one signed bar per group and head (the Lead's groups), the lead a marker (Σ bars);
    groups a head lacks are 0, groups no head has are not drawn; names in the page's language."""
    groups = [{"previous-token heads": 80.3, "FFNs": -96.1, "other heads": 33.9, "embeddings": 0.4},
              {"FFNs": 2.9, "other heads": 2.3}]
    totals = [sum(g.values()) for g in groups]
    fig = FW.circuit_groups_figure(["L18 H6", "L28 H1"], groups, totals, "t", lang="zh")
    bars = {tr.name: list(tr.y) for tr in fig.data if tr.type == "bar"}
    assert bars == {FW.t("previous-token heads", lang="zh"): [80.3, 0.0], FW.t("FFNs", lang="zh"): [-96.1, 2.9],
                    FW.t("other heads", lang="zh"): [33.9, 2.3], FW.t("embeddings", lang="zh"): [0.4, 0.0]}
    (lead,) = [tr for tr in fig.data if tr.type == "scatter"]
    np.testing.assert_allclose(lead.y, totals)
    np.testing.assert_allclose(np.sum(list(bars.values()), axis=0), totals)  # every group drawn: Σ bars = the lead
