"""The Experiments page, headless (streamlit.testing AppTest), in English and Chinese.

The figures must be the numbers the analysis computed: the token diff against an independent
decode under the same hooks, the importance map against `head_importance`, the attribution bars
against `attribute`, the flip map against `compare_inputs`.
"""

from __future__ import annotations

import json
import math
from urllib.parse import parse_qs

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
    # Top heads open the Attention page (served at the app's root; "/attention" names no page): page links
    # to its file, with the head in the query.
    links = [e.proto for e in at.get("page_link")]
    assert len(links) == 5 and all(link.page_script_hash and not link.external for link in links)
    assert {link.page for link in links} == {""}  # the page at the root: Attention (app.DEFAULT)
    module, head, _ = hi.top(1)[0]
    kind, layer = heads.kind_of(module, dates.model.describe())
    query = parse_qs(links[0].query_string)
    assert query["attn_kind"] == [dict(zip(heads.KINDS, ["enc", "dec", "cross"], strict=True))[kind]]
    assert query["layer"] == [str(layer)] and query["head"] == [str(head)] and query["lang"] == [lang]
    assert query["checkpoint"] == ["dates"] and query["text"] == [TEXT]
    assert module in links[0].label
    # The summary map drawn (entropy) has its Quantity button highlighted.
    assert at.segmented_control(key="exp_summary_q").value == "entropy"


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


def test_no_lookahead_mask_offers_the_cheating_experiment(dates):
    at = run_page({"exp": "no_lookahead_mask"})
    assert_clean(at)
    assert at.button(key="exp_cheat_button").label.startswith("Fine-tune a copy for 60 steps without the mask")
    assert any("Why the mask exists" in m.value for m in at.markdown)
    # Why the teacher-forced loss rises while greedy decoding keeps its output: said, with this text's numbers.
    assert any("newest position, which has no later token to see" in m.value for m in at.markdown)
    before, after = runs.decode_text(dates, TEXT), runs.decode_text(dates, TEXT, iv.no_lookahead_mask())
    assert after.tokens == before.tokens
    shift = max(abs(a - b) for a, b in zip(before.logprobs, after.logprobs, strict=True))
    assert 0 < shift < 0.1  # the earlier positions' states do change, a little
    assert any(f"moved by at most {shift:.4f}" in c.value for c in at.caption)
    # Date targets all have one length: seed 001's loss equals the right one, and the page says why.
    loss = runs.teacher_forced_loss(dates, runs.held_out(dates, 100), iv.no_lookahead_mask())
    assert loss["real_share"] == 1.0 and math.isclose(loss["loss"], loss["seed_loss"], rel_tol=1e-6)
    assert any("need no padding" in i.value for i in at.info)


# ---------------------------------------------------------------- link values the widgets cannot show (issue 17)

FACTOR5 = "scale_head:module=decoder.layers.0.self_attn,head=1,factor=5"


def exp_param(at: AppTest) -> str:
    value = at.query_params["exp"]
    return value[0] if isinstance(value, list) else value


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_factor_beyond_the_slider_is_clamped_with_a_note(lang):
    at = run_page({"exp": FACTOR5, "lang": lang})
    assert_clean(at)  # was StreamlitValueAboveMaxError: the slider allows -2..4
    assert at.slider(key="exp_scale_head_factor").value == 4.0
    notes = [w.value for w in at.warning if "scale_head:factor=5" in w.value]
    assert len(notes) == 1 and "4.0" in notes[0]
    assert ("outside the range -2.0 to 4.0" if lang == "en" else "超出了 -2.0 到 4.0 的范围") in notes[0]
    assert exp_param(at) == FACTOR5.replace("factor=5", "factor=4.0")
    at.run()
    assert not [w for w in at.warning if "factor=5" in w.value]  # said once


def test_a_factor_that_is_no_number_is_refused_like_a_bad_spec():
    at = run_page({"exp": FACTOR5.replace("factor=5", "factor=nan")})
    assert not at.exception
    assert [e.value for e in at.error] == [
        "This link's intervention could not be read: scale_head:factor must be a number, got nan"]
    assert at.multiselect(key="exp_iv").value == []
    assert not at.code and not at.metric  # no "∅" output, no "nan" loss


def test_unknown_module_and_head_are_replaced_with_a_note():
    at = run_page({"exp": "ablate_head:module=foo,head=99"})
    assert_clean(at)
    assert at.selectbox(key="exp_ablate_head_module").value == "decoder.layers.1.cross_attn"
    assert at.selectbox(key="exp_ablate_head_head").value == 3
    notes = [w.value for w in at.warning]
    assert any("`ablate_head:module=foo`" in n and "decoder.layers.1.cross_attn" in n for n in notes)
    assert any("`ablate_head:head=99` is outside the range 0 to 3, so the page uses 3" in n for n in notes)


@pytest.mark.parametrize("spec, key", [("block_source_token:position=999", "exp_block_source_token_position"),
                                       ("shuffle_source:seed=-5", "exp_shuffle_source_seed")])
def test_position_and_seed_out_of_range_are_replaced_with_a_note(dates, spec, key):
    at = run_page({"exp": spec})
    assert_clean(at)
    n_src = len(dates.trace(TEXT)[1].meta["src_tokens"])
    used = n_src - 1 if "position" in spec else 0
    widget = at.selectbox(key=key) if "position" in spec else at.number_input(key=key)
    assert widget.value == used
    given = spec.partition(":")[2]
    assert any(f"`{spec.partition(':')[0]}:{given}`" in w.value and f"uses {used}." in w.value for w in at.warning)


def test_zh_opens_on_an_experiment_that_changes_the_output():
    at = open_page(PAGE, query={"lang": "zh"}, timeout=TIMEOUT)  # zh: the zh-en model and its example
    assert_clean(at)
    zh_en = load_checkpoint("zh-en")
    chosen = at.multiselect(key="exp_iv").value
    assert chosen, "the page opens on an experiment"
    before, after = [c.value for c in at.code][:2]
    assert before == runs.decode_text(zh_en, zh_en.example).text
    assert after != before  # "no positional encoding (encoder)" left zh-en's output unchanged
    assert not any("不需要填充" in i.value for i in at.info)  # zh-en targets do have padding


def test_two_inputs_are_kept_in_the_url():
    q = {"exp_view": "compare", "cmp_a": "The dog didn't cross the road because it was too tired",
         "cmp_b": "The dog didn't cross the road because it was too wide", "cmp_q": "it", "cmp_k1": "dog",
         "cmp_k2": "road"}
    at = run_page(q)
    assert_clean(at)
    for key, param in (("exp_cmp_a", "cmp_a"), ("exp_cmp_b", "cmp_b"), ("exp_cmp_q", "cmp_q"),
                       ("exp_cmp_k1", "cmp_k1"), ("exp_cmp_k2", "cmp_k2")):
        assert at.text_input(key=key).value == q[param]
    at.text_input(key="exp_cmp_k1").set_value("road").run()
    at.text_input(key="exp_cmp_k2").set_value("dog").run()
    assert at.query_params["cmp_k1"] in (["road"], "road") and at.query_params["cmp_k2"] in (["dog"], "dog")
    long = "x" * 1001  # over MAX_URL_TEXT: the link names this server's copy, and the page says so
    at.text_input(key="exp_cmp_k2").set_value(long).run()
    assert not at.exception and "cmp_k2" not in at.query_params and "cmp_k2_ref" in at.query_params
    assert any("Over 1,000 characters" in c.value for c in at.caption)


# ---------------------------------------------------------------- figure builders draw the computed numbers


def test_figures_draw_the_traced_numbers(dates):
    from viz.figures import experiments as FX

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
