"""Every analysis on every family the lab opens (issue 30 §2): each is exact by its invariant, never a traceback.

The residual decomposition's own invariants (DLA, lens, routes, norm-based) are in tests/test_residual.py; here
the other analyses run on the same tiny random models of every wiring (pre-norm, sandwich, post-norm, parallel,
mixtures of experts, attention-only) and each is checked by a property that holds exactly:

- head statistics: every row of every attention map sums to 1 (gpt-oss's learned sinks: weights + sink = 1), so the
  sink share and pattern scores lie in [0, 1];
- induction: the repeated sequence's second half is the first; top-k ablation knocks out exactly k heads and the
  control as many others;
- blocking token 0 everywhere: KL >= 0, and 0 when no head is blocked (an empty set of heads);
- activation patching: clean and corrupted differ at one position, so patching layer 0's input there restores
  all of the logit difference (1.0), and patching anywhere else at layer 0 restores none (0.0);
- /flow: every method gives one importance per source token, the causal effect of a token equals zeroing its
  values by hand, and the comparison carries a rho per method.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_residual
import torch
from test_residual import FAMS, V, ids
from tolerance import f32_tol

from model.analysis import flow, patching, phenomena

T = 20
models = test_residual.models  # the shared fixture: the tiny model of each family, built once


@pytest.mark.parametrize("family", FAMS)
@torch.no_grad()
def test_head_statistics_induction_and_ablation(family, models):
    m = models(family)
    res = phenomena.induction(m, n=8, seed=0)
    assert torch.equal(res.ids[0, 1:9], res.ids[0, 9:17])
    for name, sc in res.scores.items():
        if name in ("entropy", "distance"):
            continue
        assert np.all((sc.scores >= -1e-6) & (sc.scores <= 1 + 1e-6)), (family, name)
    ab = phenomena.ablate_top_induction(m, res, k=2, n_controls=2)
    assert len(ab.heads) == 2 and all(len(c) == 2 and not set(c) & set(ab.heads) for c in ab.controls)
    assert np.isfinite(ab.ablated) and np.isfinite(ab.control).all()


@pytest.mark.parametrize("family", FAMS)
@torch.no_grad()
def test_rows_sum_to_one_or_to_one_with_the_learned_sink(family, models):
    """Every row of every attention map is a softmax over the keys (sum 1), or, where the model has learned sinks
    (gpt-oss), over the keys and the sink: then weights + sink = 1 and the weights alone sum to less."""
    m = models(family)
    sinks = bool(m.describe()["blocks"].get("attn_sinks"))
    _, tr = m.run_with_trace(ids(), names=["*.self_attn.weights"] + (["*.self_attn.sink"] if sinks else []))
    for name, info in m.describe()["attention"].items():
        w = tr[f"{name}.weights"].double().sum(-1)
        sink = tr[f"{name}.sink"].double() if info.get("sinks") else torch.zeros_like(w)
        assert (f"{name}.sink" in tr) is bool(info.get("sinks"))
        torch.testing.assert_close(w + sink, torch.ones_like(w), atol=f32_tol(1, n=T + 1), rtol=0)


@pytest.mark.parametrize("family", FAMS)
@torch.no_grad()
def test_blocking_token_0(family, models):
    m = models(family)
    everywhere = phenomena.block_sink(m, ids())
    none = phenomena.block_sink(m, ids(), heads=[])
    assert everywhere.kl >= 0 and none.kl == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("family", FAMS)
@torch.no_grad()
def test_activation_patching_restores_exactly_where_the_inputs_differ(family, models):
    m = models(family)
    clean = ids(8)  # one patched run per (layer, position): a short input keeps the mixtures quick
    corrupted = clean.clone()
    corrupted[0, 5] = (clean[0, 5] + 1) % V
    good, bad = int(m(clean)[0, -1].argmax()), int(m(corrupted)[0, -1].argmax())
    if good == bad:
        bad = (good + 1) % V
    res = patching.activation_patching(m, clean, corrupted, good, bad, heads=False)
    # the patched runs go through the KV-cache path, the references through one forward: they agree to float32
    # rounding of logits of size |LD|, which the normalisation divides by the span (clean - corrupted)
    tol = 1e-5 * max(1.0, abs(res.clean), abs(res.corrupted)) / abs(res.clean - res.corrupted)
    assert res.resid[0, 5] == pytest.approx(1.0, abs=tol)
    others = np.delete(res.resid[0], 5)
    assert np.abs(others).max() <= tol


@pytest.mark.parametrize("family", FAMS)
@torch.no_grad()
def test_flow_compares_every_method_with_the_causal_effect(family, models):
    m = models(family)
    s = flow.prepare(m, ids(12))
    cmp = flow.compare(s)
    assert set(flow.METHODS) <= set(cmp.methods)
    assert all(len(v) == len(s.sources) for v in cmp.methods.values())
    # the causal effect of token 3 is its value vectors zeroed in every attention layer, by hand
    clean = s.measure(s.forward())
    hooked = s.measure(s.forward(flow.value_hooks(s, m.describe(), [3])))
    assert cmp.effect[3] == pytest.approx(abs(float((hooked - clean)[0])), abs=1e-5)
    assert set(cmp.rho) == set(cmp.methods)
