"""The Experiments page, headless (streamlit.testing AppTest), in English and Chinese.

The figures must be the numbers the analysis computed: the token diff against an independent
decode under the same hooks, the importance map against `head_importance`, the attribution bars
against `attribute`, the flip map against `compare_inputs`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import assert_clean, open_page
from streamlit.testing.v1 import AppTest

from model import interventions as iv
from model import load_checkpoint
from model.analysis import attribution_for, compare, heads, runs
from model.loaders import minilm

PAGE = "viz/pages/experiments.py"
TIMEOUT = 300
TEXT = "3 november 2023"
SPEC = "ablate_head:module=decoder.layers.1.cross_attn,head=2;no_positional:side=encoder"


@pytest.fixture(scope="module")
def dates():
    return load_checkpoint("dates")


def run_page(query: dict | None = None, state: dict | None = None) -> AppTest:
    return open_page(PAGE, query={"checkpoint": "dates", "text": TEXT, **(query or {})}, state=state,
                     timeout=TIMEOUT)


def figure(at: AppTest, title_start: str) -> dict:
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    found = [f for f in specs if f["layout"].get("title", {}).get("text", "").startswith(title_start)]
    assert found, f"no figure titled {title_start!r}: {[f['layout'].get('title') for f in specs]}"
    return found[0]


def z_of(trace_json: dict) -> np.ndarray:
    z = trace_json["z"]
    if isinstance(z, dict):  # plotly's typed-array encoding
        import base64

        shape = [int(n) for n in str(z.get("shape", "-1")).split(",")]
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(shape)
    return np.array(z, dtype=float)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_before_after_from_the_url(dates, lang):
    at = run_page({"exp": SPEC, "lang": lang})
    assert_clean(at)
    assert at.multiselect(key="exp_iv").value == ["ablate_head", "no_positional"]
    hooks = iv.build(SPEC, dates.cfg)
    after = runs.decode_text(dates, TEXT, hooks)
    codes = [c.value for c in at.code]
    assert codes[:2] == ["2023-11-03", after.text or "∅"]
    tokens = figure(at, "Output tokens" if lang == "en" else "输出词元")["data"][0]
    z = z_of(tokens)
    np.testing.assert_allclose(z[1, :len(after.logprobs)], after.logprobs, atol=1e-5)
    canonical = SPEC.replace("head=2", "head=2,mode=zero")  # the page writes every argument
    assert at.query_params["exp"] in ([canonical], canonical)
    if lang == "en":
        assert any("Teacher-forced loss" in m.label for m in at.metric)


def test_choosing_an_intervention_in_the_widget_shows_its_bug_note():
    at = run_page()
    assert_clean(at)
    assert at.multiselect(key="exp_iv").value == ["no_positional"]  # the default experiment
    at.multiselect(key="exp_iv").set_value([]).run()
    assert any("Choose an intervention" in i.value for i in at.info)
    at.multiselect(key="exp_iv").set_value(["seed_qk_swap_concat"]).run()
    assert_clean(at)
    bug = iv.REGISTRY["seed_qk_swap_concat"].bug
    assert any(bug[0] in i.value and bug[1] in i.value for i in at.info)
    assert at.query_params["exp"] in (["seed_qk_swap_concat"], "seed_qk_swap_concat")
    diff = figure(at, "decoder.layers.1.cross_attn: attention after − before")
    assert len(diff["data"]) == 4  # one panel per head


def test_exact_match_button_runs_with_progress(dates):
    at = run_page({"exp": "no_positional:side=encoder"})
    at.button(key="exp_em_button").click().run()
    assert_clean(at)
    pairs = runs.held_out(dates, 100)
    want = runs.exact_match(dates, pairs, iv.no_positional("encoder"))
    shown = [m for m in at.metric if m.label.startswith("Exact match")]
    assert shown and shown[0].value == f"100% → {want:.0%}"


@pytest.mark.parametrize("spec, message", [
    ("ablate_head:module=decoder.layers.1.cross_attn,head=two", "head must be int"),
    ("ablate_head:module=decoder.layers.1.cross_attn,head=1,mode=loud", "unknown ablation mode 'loud'"),
    ("no_positional:side=left", "unknown side 'left'"),
])
def test_bad_spec_in_the_url_says_why(spec, message):
    at = run_page({"exp": spec})
    assert not at.exception
    assert any(message in e.value for e in at.error)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_head_importance_view(dates, lang):
    at = run_page({"exp_view": "heads", "lang": lang})
    assert_clean(at)
    trace = dates.trace(TEXT)[1]
    hi = heads.importance_for(dates, trace)
    fig = figure(at, "Head importance" if lang == "en" else "头的重要性")
    maps = hi.by_kind()
    for panel, kind in zip(fig["data"], heads.KINDS, strict=True):
        np.testing.assert_allclose(z_of(panel), maps[kind], atol=1e-4)
    links = [m.value for m in at.markdown if "/attention?" in m.value]
    module, head, _ = hi.top(1)[0]
    kind, layer = heads.kind_of(module, dates.model.describe())
    assert f"attn_kind={dict(zip(heads.KINDS, ['enc', 'dec', 'cross'], strict=True))[kind]}" in links[0]
    assert f"layer={layer}&head={head}" in links[0]


def test_attribution_view(dates):
    at = run_page({"exp_view": "attribution"}, state={"exp_attr_pos": 5})
    assert_clean(at)
    attr = attribution_for(dates, dates.trace(TEXT)[1], 5)
    fig = figure(at, "Which source token drove output 5")
    for bar, method in zip(fig["data"], attr.scores, strict=True):
        np.testing.assert_allclose(z_of({"z": bar["x"]}), attr.scores[method], atol=1e-5)
    assert len(at.dataframe) == 2


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_two_inputs_on_minilm(lang):
    assert minilm.is_available()
    at = run_page({"exp_view": "compare", "lang": lang})
    assert_clean(at)
    hf = compare.compare_inputs(minilm.load_minilm(), at.text_input(key="exp_cmp_a").value,
                                at.text_input(key="exp_cmp_b").value)
    fig = figure(at, "Preference" if lang == "en" else "每个头")
    np.testing.assert_allclose(z_of(fig["data"][2]), hf.flip, atol=1e-5)
    at.text_input(key="exp_cmp_k1").set_value("zebra").run()
    assert not at.exception and any("zebra" in e.value for e in at.error)


def test_no_lookahead_mask_offers_the_cheating_experiment():
    at = run_page({"exp": "no_lookahead_mask"})
    assert_clean(at)
    assert at.button(key="exp_cheat_button").label.startswith("Fine-tune a copy for 60 steps without the mask")
    assert any("Why the mask exists" in m.value for m in at.markdown)


# ---------------------------------------------------------------- figure builders draw the computed numbers


def test_figures_draw_the_traced_numbers(dates):
    from viz import figures_experiments as FX

    ba = runs.before_after(dates, TEXT, iv.no_scaling(dates.cfg.d_head))
    m = "decoder.layers.0.cross_attn"
    fig = FX.attention_diff(ba.trace_before, ba.trace_same, m, ba.trace_before.meta)
    want = (ba.trace_same[f"{m}.weights"] - ba.trace_before[f"{m}.weights"])[0].numpy()
    for h, panel in enumerate(fig.data):
        np.testing.assert_allclose(np.asarray(panel.z), want[h], atol=1e-6)
    fig = FX.alignment_pair(ba.trace_before, ba.trace_after, m)
    for panel, tr in zip(fig.data, (ba.trace_before, ba.trace_after), strict=True):
        np.testing.assert_allclose(np.asarray(panel.z), tr[f"{m}.weights"][0].mean(0).numpy(), atol=1e-6)
    summary = heads.head_summary(ba.trace_before)
    fig = FX.summary_maps(summary, "entropy")
    for panel, kind in zip(fig.data, heads.KINDS, strict=True):
        rows = [i for i, mod in enumerate(summary["modules"]) if summary["kinds"][i] == kind]
        np.testing.assert_allclose(np.asarray(panel.z), summary["entropy"][rows], atol=1e-5)
    assert len(FX.summary_maps(summary, "distance").data) == 2  # cross-attention has no distance
