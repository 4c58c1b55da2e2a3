"""Issue 31 §1 and §3 (/flow): a lead is claimed only when it passes a stated test on the prompt set
(model/analysis/claims.py), one number is one string, the methods figure names every method it draws in
readable pieces, and every edge of the routes graph has a dot of its own."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from test_flow import IDS, tiny_llama

from model.analysis import claims
from model.analysis import flow as FL
from viz.figures import flow as FF

# ---------------------------------------------------------------------- the test itself


def test_sign_test_by_hand():
    # 10 wins of 12: P(X <= 2) = (1 + 12 + 66) / 4096, two-sided twice that
    a, b = np.r_[np.ones(10), 0, 0], np.r_[np.zeros(10), 1, 1]
    w, lo, p = claims.sign_test(a, b)
    assert (w, lo) == (10, 2) and p == pytest.approx(2 * 79 / 4096)
    w, lo, p = claims.sign_test([1, 2, np.nan, 3], [1, 1, 0, 4])  # a tie and a nan drop out
    assert (w, lo) == (1, 1) and p == 1.0


def test_t_quantiles_are_students():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 5, 11, 30, 31, 45, 100, 1000):
        assert claims.t975(df) == pytest.approx(float(stats.t.ppf(0.975, df)), abs=2e-4)


def test_paired_interval_by_hand():
    d = np.array([0.1, -0.2, 0.3, 0.05])
    mean, low, high, n = claims.paired_interval(d, np.zeros(4))
    half = 3.1824 * d.std(ddof=1) / 2
    assert n == 4 and mean == pytest.approx(d.mean())
    assert (low, high) == pytest.approx((d.mean() - half, d.mean() + half))


def test_a_lead_inside_the_noise_is_no_lead():
    """The issue's case: raw 0.446 ± 0.109 against routes 0.424 ± 0.255 over 12 prompts, raw ahead on 7."""
    rng = np.random.default_rng(0)
    raw = 0.446 + 0.109 * rng.standard_normal(12)
    routes = raw + np.r_[-0.2, -0.2, -0.2, -0.2, -0.2, -0.2, -0.2, 0.4, 0.3, 0.2, 0.1, 0.15] * 0.5
    lead = claims.lead({"raw": raw, "routes": routes, "rollout": raw - 0.3})
    assert lead.top == "raw" and not lead.clear
    assert lead.weakest.method == "routes" and (lead.weakest.wins, lead.weakest.losses) == (7, 5)
    text = FF.lead_sentence(lead, {m: FF.rho_text(v) for m, v in lead.means.items()})
    assert "no method clearly leads" in text and "agrees best" not in text
    assert "7 of 12" in text


def test_a_clear_lead_passes_against_every_method():
    base = np.linspace(0.1, 0.6, 12)
    lead = claims.lead({"routes": base + 0.3, "raw": base, "norm": base + 0.1, "rollout": base + 0.05})
    assert lead.top == "routes" and lead.clear
    assert lead.threshold == pytest.approx(0.05 / 3)
    text = FF.lead_sentence(lead, {m: FF.rho_text(v) for m, v in lead.means.items()})
    assert "leads" in text and "12 of 12" in text and "no method" not in text
    # one loss in twelve against one rival: p = 2 * 13/4096 = 0.0063 < 0.0167, still clear
    second = base + 0.1
    second[0] += 1
    assert claims.lead({"routes": base + 0.3, "raw": base, "norm": second}).clear
    # two losses: p = 0.039 > 0.025 (two comparisons): not clear
    second[1] += 1
    assert not claims.lead({"routes": base + 0.3, "raw": base, "norm": second}).clear


def test_nan_prompts_and_empty_sets():
    lead = claims.lead({"raw": [np.nan, np.nan], "routes": [np.nan, np.nan]})
    assert lead.top is None and not lead.clear
    assert "No method" in FF.lead_sentence(lead, {})


def test_agreement_table_lead_reads_its_rows():
    m = tiny_llama()
    table = FL.agreement_table(m, [FL.Prompt(IDS), FL.Prompt(IDS[:, :5], target=3), FL.Prompt(IDS[:, :6], target=9)])
    lead = table.lead()
    ref = claims.lead({mm: table.rhos(mm) for mm in table.methods})
    assert lead == ref and lead.n == 3
    assert not lead.clear  # three prompts can never pass: the smallest two-sided p is 0.25


# ---------------------------------------------------------------------- the figures: one string, every edge


def _routes():
    m = tiny_llama()
    s = FL.prepare(m, IDS)
    return s, FL.routes(s)


def test_every_routes_edge_has_its_own_dot():
    s, r = _routes()
    edges = r.edges(0.002)
    pairs = [(e["src"], e["dst"]) for e in edges]
    assert len(set(pairs)) < len(pairs)  # several heads join the same two tokens: the case of the issue
    toks = {k: [str(x) for x in v] for k, v in s.tokens.items()}
    fig = json.loads(FF.routes_figure(r, edges, toks).to_json())
    lay = fig["layout"]
    row_px = (lay["height"] - lay["margin"]["t"] - lay["margin"]["b"]) / (r.n_rows("decoder") - 1)
    (dots,) = [d for d in fig["data"] if d.get("customdata") and d["customdata"][0][0] == "edge"]
    from conftest import plotly_array

    xy = np.c_[plotly_array(dots["x"]), plotly_array(dots["y"])]
    assert len(xy) == len(edges)
    # in pixels as the figure is drawn (about 1000 px over the token columns)
    px = xy * [1000 / len(s.tokens["tgt_tokens"]), row_px]
    d = np.hypot(*(px[:, None] - px[None]).transpose(2, 0, 1)) + 1e9 * np.eye(len(px))
    assert d.min() >= 3, "two edges' dots on one spot: the lower one cannot be hovered or clicked"
    for (x, y), e in zip(xy, edges, strict=True):  # each dot on its own edge's line, inside it
        (_, r0, p0), (_, r1, p1) = e["src"], e["dst"]
        f = (y - r0) / (r1 - r0)
        assert 0.1 <= f <= 0.9 and x == pytest.approx(p0 + f * (p1 - p0))


def test_routes_legend_and_title_do_not_overlap():
    s, r = _routes()
    toks = {k: [str(x) for x in v] for k, v in s.tokens.items()}
    lay = FF.routes_figure(r, r.edges(0.04), toks).layout
    # the title hangs from the figure's top edge; the legend sits on the plot area's top edge, under it
    assert lay.title.yref == "container" and lay.title.yanchor == "top"
    assert lay.legend.yanchor == "bottom" and lay.margin.t >= 90


def test_methods_figure_reads_readable_pieces_and_counts_its_methods():
    m = tiny_llama()
    cmp = FL.compare(FL.prepare(m, IDS), flow=True)
    shown = [x for x in (*FL.METHODS, "flow") if x in cmp.methods]
    assert len(shown) == 5
    fig = FF.methods_figure(cmp, shown, tokens=[f"␣t{i}" for i in range(len(cmp.tokens))])
    assert "5 answers" in fig.layout.title.text and "Four" not in fig.layout.title.text
    assert all(y.split(": ", 1)[1].startswith("␣t") for y in fig.data[0].y)
    titles = [a.text for a in fig.layout.annotations]
    for x in shown:
        assert any(FF.rho_text(cmp.rho[x]) in tt for tt in titles)
    assert all(a.font.size >= 14 for a in fig.layout.annotations)  # ~8 px at 1080p before (11 px, scaled)


def test_agreement_figure_prints_the_tables_string():
    summ = {"raw": {"mean": 0.4456, "std": 0.109, "top_k": 0.5, "n": 12},
            "routes": {"mean": 0.4244, "std": 0.255, "top_k": 0.5, "n": 12}}
    fig = FF.agreement_figure({"IOI": summ})
    labels = fig.data[1].text  # the labels' own trace, past each error bar (issue 38 §5: they sat on the whiskers)
    assert list(labels) == [FF.rho_text(0.4456), FF.rho_text(0.4244)] == ["0.45", "0.42"]
    assert not math.isnan(float(labels[0]))
