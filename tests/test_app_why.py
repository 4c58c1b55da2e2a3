"""'Why here?' in the app (issue 39 §3): the panel on /llm (AppTest; the builders: tests/test_figures_why.py).

- /llm on SmolLM2 with `?why=Q,K` in the URL opens the panel in en and zh: its heatmap's cells sum to the
  recorded score (the trace's own), the contrast's to s_ij − s_ij′ against the runner-up from the trace's weights,
  the sentence is there, the causal check's table holds the check's numbers, no exception, and in zh no English.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import plotly_array
from streamlit.testing.v1 import AppTest

from model.analysis import why
from viz.figures import why as FW
from viz.i18n import t

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PAGE = "viz/pages/llm.py"
IOI = "When Mary and John went to the store, John gave a drink to"


# ---------------------------------------------------------------- the panel on /llm (SmolLM2)


@pytest.fixture(scope="module")
def smol():
    """SmolLM2 and the trace /llm draws (lm_models' RealModel.trace, as the page's get_trace)."""
    from viz.ui import lm_models

    rm = lm_models.load("smollm2")
    return rm.obj, rm.trace(IOI)[1]


def _open(query: dict, page: str = PAGE) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=600)
    at.query_params.update(query)
    at.switch_page(page)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def _pairs(at: AppTest, lang: str) -> list[dict]:
    """The panel's query-source × key-source heatmaps (their colour bar is titled "term"; in zh the y title moves)."""
    title = t("term", lang=lang)
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    return [s for s in specs if s["data"][0].get("type") == "heatmap"
            and s["data"][0].get("colorbar", {}).get("title", {}).get("text") == title]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_llm_opens_why_from_the_url(smol, lang):
    lm, tr = smol
    q, k, layer, head = 13, 2, 17, 3
    name = f"decoder.layers.{layer}.self_attn"
    at = _open({"checkpoint": "smollm2", "lang": lang, "layer": str(layer), "head": str(head),
                "why": f"{q},{k}", "prompt": IOI})
    assert at.toggle(key="llm_why").value is True
    assert at.number_input(key="llm_why_q").value == q and at.number_input(key="llm_why_k").value == k
    ids, tokens = tr.meta["tgt_ids"], tr.meta["tgt_tokens"]
    e = why.explain_score(lm, ids, layer, head, q, k, trace=tr)
    pairs = _pairs(at, lang)
    assert len(pairs) == 2  # the cell, and the contrast with the runner-up
    z = plotly_array(pairs[0]["data"][0]["z"])
    recorded = float(tr[f"{name}.scores"][0, head, q, k])
    # the bins keep Σ (exactly: tests/test_figures_why.py) = the score the model computed (the page's trace and
    # this one are two runs of the same forward: they agree to float32 rounding)
    assert abs(z.sum() - e.total) <= e.tolerance() and abs(z.sum() - recorded) <= e.tolerance()
    # "why here and not there": the runner-up from the trace's weights, and s_ij − s_ij′
    w = tr[f"{name}.weights"][0, head, q].double().numpy()
    j2 = FW.runner_up(w, k)
    assert j2 == int(np.argmax(w)) != k  # key 2 is not this row's top key: the runner-up is the top one
    s = tr[f"{name}.scores"][0, head, q].double()
    zc = plotly_array(pairs[1]["data"][0]["z"])
    ev = why.explain_score(lm, ids, layer, head, q, k, against=j2, trace=tr)
    assert abs(zc.sum() - float(s[k] - s[j2])) <= ev.tolerance()
    # the sentences, computed from the same explanations, in the page's language
    md = "\n".join(m.value for m in at.markdown)
    assert FW.why_sentence(e, "L17H3", tokens, lang) in md
    assert FW.why_sentence(ev, "L17H3", tokens, lang) in md
    # the causal check's table holds the check's own numbers (of the contrast)
    chk = why.check_explanation(ev, top=3)
    table = next(d.value for d in at.dataframe if t("attributed", lang=lang) in d.value.columns)
    assert len(table) == len(chk.rows) == 6
    np.testing.assert_allclose(table[t("attributed", lang=lang)].to_numpy(), [r.attributed for r in chk.rows],
                               rtol=1e-9)
    np.testing.assert_allclose(table[t("actual (taken out, live norm)", lang=lang)].to_numpy(),
                               [r.actual for r in chk.rows], rtol=1e-6)
    assert at.query_params["why"] in ([f"{q},{k}"], f"{q},{k}")
    if lang == "zh":
        from test_i18n import english_in_zh

        assert not english_in_zh(at), english_in_zh(at)


def test_the_number_inputs_open_a_cell_and_write_it_to_the_url():
    at = _open({"checkpoint": "smollm2", "lang": "en", "layer": "5", "head": "0", "prompt": IOI})
    assert at.toggle(key="llm_why").value is False and not _pairs(at, "en")
    at.toggle(key="llm_why").set_value(True).run()
    at.number_input(key="llm_why_q").set_value(9).run()
    at.number_input(key="llm_why_k").set_value(4).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.query_params["why"] in (["9,4"], "9,4")
    pairs = _pairs(at, "en")
    assert pairs and pairs[0]["layout"]["title"]["text"].startswith("Query 9 ")
    # a user-picked contrast key goes to the URL too
    at.selectbox(key="llm_why_vs").set_value(0).run()
    assert at.query_params["why_vs"] in (["0"], "0")
    assert "over key 0 " in _pairs(at, "en")[1]["layout"]["title"]["text"]
    # a future key: explained, and said to be masked
    at.number_input(key="llm_why_k").set_value(11).run()
    assert not at.exception and any("mask blocks" in c.value for c in at.caption)


def test_a_bad_cell_in_the_url_is_a_sentence():
    """`?why=` that is not two positions of this input: the panel stays closed and the page says so once."""
    at = _open({"checkpoint": "smollm2", "lang": "en", "layer": "1", "head": "0", "why": "99,x", "prompt": IOI})
    assert at.toggle(key="llm_why").value is False
    assert any("why=99,x" in w.value for w in at.warning)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_attention_page_explains_the_translators_cross_attention(lang):
    """The toy translator's cross-attention: query from the decoder, key from the encoder; the panel's cells sum to
    the recorded score of that cell, and the sources are named by stack."""
    from viz.ui.models import get_trace, load_ckpt

    text = "3 november 2023"
    at = _open({"checkpoint": "dates", "lang": lang, "why": "3,4", "text": text, "attn_kind": "cross",
                "layer": "1", "head": "2"}, page="viz/pages/attention.py")
    tr = get_trace("dates", text)
    name = "decoder.layers.1.cross_attn"
    e = why.explain_score(load_ckpt("dates"), (tr.meta["src_ids"][0], tr.meta["tgt_ids"][0]), name, 2, 3, 4,
                          trace=tr)
    pairs = _pairs(at, lang)
    assert len(pairs) == 2
    z = plotly_array(pairs[0]["data"][0]["z"])
    assert abs(z.sum() - float(tr[f"{name}.scores"][0, 2, 3, 4])) <= e.tolerance()
    # query sources from the decoder, key sources from the encoder (named in the UI's language)
    other = t("other", lang=lang)
    assert all(y.startswith((t("decoder", lang=lang) + " ", other)) for y in pairs[0]["data"][0]["y"])
    assert all(x.startswith((t("encoder", lang=lang) + " ", other)) for x in pairs[0]["data"][0]["x"])
    md = "\n".join(m.value for m in at.markdown)
    assert "H2" in md and (t("Why here?", lang=lang) in md)
    if lang == "zh":
        from test_i18n import english_in_zh

        assert not english_in_zh(at), english_in_zh(at)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_inside_a_layer_explains_the_chosen_head(lang):
    """Inside a layer has no per-cell attention heatmap: the panel's number inputs choose the cell (here from the URL)
    on the chosen sublayer and head. The translator's cross-attention: the cells sum to the explanation's total, the
    recorded score of that cell."""
    from viz.ui.models import get_trace, load_ckpt

    text = "3 november 2023"
    at = _open({"checkpoint": "dates", "lang": lang, "text": text, "stack": "decoder", "layer": "1",
                "sub": "cross_attn", "head": "2", "why": "3,4"}, page="viz/pages/layer.py")
    assert at.toggle(key="ly_why").value is True
    assert at.number_input(key="ly_why_q").value == 3 and at.number_input(key="ly_why_k").value == 4
    tr = get_trace("dates", text)
    name = "decoder.layers.1.cross_attn"
    e = why.explain_score(load_ckpt("dates"), (tr.meta["src_ids"][0], tr.meta["tgt_ids"][0]), name, 2, 3, 4,
                          trace=tr)
    pairs = _pairs(at, lang)
    assert len(pairs) == 2  # the cell, and the contrast with the runner-up
    z = plotly_array(pairs[0]["data"][0]["z"])
    assert abs(z.sum() - e.total) <= e.tolerance()
    assert abs(e.total - float(tr[f"{name}.scores"][0, 2, 3, 4])) <= e.tolerance()
    assert at.query_params["why"] in (["3,4"], "3,4")
    md = "\n".join(m.value for m in at.markdown)
    assert "H2" in md and t("Why here?", lang=lang) in md
    if lang == "zh":
        from test_i18n import english_in_zh

        assert not english_in_zh(at), english_in_zh(at)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_learn_explains_a_cell_of_the_head_map(lang):
    """/learn's head map at a checkpoint: `?why=Q,K` opens the panel on that cell of the chosen head; its cells sum
    to the score of that checkpoint's own forward on the probe (explain_score on the checkpoint, a lab family)."""
    from model.toy import learn as LR

    step, q, k = 1015, 30, 11
    at = _open({"lang": lang, "step": str(step), "lmodel": "attn2", "lhead": "1.0", "why": f"{q},{k}"},
               page="viz/pages/learn.py")
    assert at.toggle(key="learn_why").value is True
    run = LR.load_run(score=False)["attn2"]
    model = run.model_at(run.steps.index(step))
    probe = LR.probe_ids(run.settings)[:1]
    _, tr = model.run_with_trace(probe)
    name = "decoder.layers.1.self_attn"
    e = why.explain_score(model, probe, name, 0, q, k, trace=tr)
    assert abs(e.total - float(tr[f"{name}.scores"][0, 0, q, k])) <= e.tolerance()
    pairs = _pairs(at, lang)
    assert len(pairs) == 2
    z = plotly_array(pairs[0]["data"][0]["z"])
    assert abs(z.sum() - e.total) <= e.tolerance()
    assert FW.why_sentence(e, "L1H0", [str(x) for x in probe[0].tolist()], lang) in "\n".join(
        m.value for m in at.markdown)
    if lang == "zh":
        from test_i18n import english_in_zh

        assert not english_in_zh(at), english_in_zh(at)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_flow_attention_edges_open_why_on_their_cell(lang):
    """/flow's attention edges (the links to the strongest, as a click on one) open the head with "Why here?" on the
    edge's cell: query = the edge's destination position, key = its source. The translator: a cross-attention edge
    from a source token; on the opened Attention page the panel's cells sum to that cell's recorded score."""
    from urllib.parse import parse_qsl

    from model.analysis import flow as FL
    from viz.ui.models import get_trace, load_ckpt

    text = "3 november 2023"
    at = _open({"checkpoint": "dates", "lang": lang, "text": text}, page="viz/pages/flow.py")
    ck = load_ckpt("dates")
    fs = FL.prepare(ck, text)
    heads = [e for e in FL.routes(fs).edges(at.select_slider(key="flow_tau").value) if e["kind"] == "head"]
    best = max(heads, key=lambda e: e["weight"])
    link = at.get("page_link")[0]
    query = dict(parse_qsl(link.proto.query_string))
    assert query["why"] == f"{best['dst'][2]},{best['src'][2]}" and int(query["head"]) == best["head"]
    assert query["attn_kind"] == "cross"  # the Attention page's link (an LM's goes to /llm)
    at2 = _open(query, page="viz/pages/attention.py")
    q, k = (int(v) for v in query["why"].split(","))
    assert at2.toggle(key="attn_why").value is True
    tr = get_trace("dates", text)
    name, h = best["module"], best["head"]
    ids = (tr.meta["src_ids"][0], tr.meta["tgt_ids"][0]) if "cross" in name else tr.meta["tgt_ids"][0]
    e = why.explain_score(ck, ids, name, h, q, k, trace=tr)
    z = plotly_array(_pairs(at2, lang)[0]["data"][0]["z"])
    assert abs(z.sum() - e.total) <= e.tolerance()
    assert abs(e.total - float(tr[f"{name}.scores"][0, h, q, k])) <= e.tolerance()
    assert query.get("lang") == lang  # the link keeps the page's language
    if lang == "zh":
        from test_i18n import english_in_zh

        assert not english_in_zh(at2), english_in_zh(at2)


# ---------------------------------------------------------------- /phenomena: the circuits (§4)


@pytest.fixture(scope="module")
def circuits():
    """The circuits /phenomena's "Why do these heads look there?" shows on SmolLM2, on small inputs: computed with
    why_circuits' own functions and stored where the page reads them (why_circuits.circuits' per-process cache), so
    the page runs in seconds; the defaults' numbers are tests/test_why_circuits.py's (the same functions)."""
    from model.analysis import shared
    from model.analysis import why_circuits as W
    from viz.ui.models import load_ckpt

    lm = load_ckpt("smollm2").obj  # the very object the page keys the cache on
    small = W.Circuits(W.induction_composition(lm, n=12, top_heads=2, queries=3),
                       W.ioi_query_sources(lm, n_prompts=2, movers=2), W.sink_sources(lm, top_heads=2, queries=3))
    return shared.cached("why_circuits", lm, (), lambda: small)  # a result already stored (a warm-up's) wins


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_phenomena_shows_why_the_found_heads_look_there(circuits, lang):
    """Each circuit's heads: its claim's sentence (the analysis's own, in the page's language) labelled by its test,
    its group bars (the Lead's groups and lead), its table row (the claim's numbers) and a link to /llm on the same
    input with "Why here?" open on its first explained cell."""
    from urllib.parse import parse_qsl

    from model.analysis import why_circuits as W

    at = _open({"checkpoint": "smollm2", "lang": lang, "phen": "why"}, page="viz/pages/phenomena.py")
    tr, label = (lambda s: t(s, lang=lang)), (lambda s: FW.source_label(s, lang))
    sections = [("Induction heads: the key-side lead over the runner-up, by group", circuits.induction.heads,
                 {"rep": f"{circuits.induction.n}:{circuits.induction.seed}"}),
                ("Name movers: the query-side lead of IO over the subject, by group", circuits.ioi.movers,
                 {"prompt": circuits.ioi.prompts[0]}),
                ("Sink heads: token 0's key-side lead over the runner-up, by group", circuits.sinks.heads,
                 {"prompt": circuits.sinks.text})]
    boxes = {True: [s.value for s in at.success], False: [w.value for w in at.warning]}
    links = [dict(parse_qsl(x.proto.query_string)) for x in at.get("page_link")]
    bars = {json.loads(c.proto.spec)["layout"]["title"]["text"]: json.loads(c.proto.spec)
            for c in at.get("plotly_chart")}
    assert all(heads for _, heads, _ in sections)  # on SmolLM2 every circuit finds heads
    for title, heads, input_query in sections:
        for h in heads:
            text = h.render(tr, label)
            if lang == "en":
                assert text == h.sentence  # the analysis's own sentence, word for word
            verdict = t("**Passes its test.** {sentence}" if h.claim.passes else "**Fails its test.** {sentence}",
                        lang=lang, sentence=text)
            assert verdict in boxes[h.claim.passes]
            assert {"layer": str(h.layer), "head": str(h.head), "why": f"{h.lead.queries[0]},{h.lead.keys[0]}",
                    **input_query}.items() <= next(q for q in links if q.get("head") == str(h.head)
                                                   and q.get("layer") == str(h.layer) and all(
                                                       q.get(a) == b for a, b in input_query.items())).items()
        spec = bars[t(title, lang=lang)]
        assert list(spec["data"][-1]["x"]) == [W.head_name(h.layer, h.head) for h in heads]
        np.testing.assert_allclose(plotly_array(spec["data"][-1]["y"]), [h.lead.total for h in heads])
        for trace in spec["data"][:-1]:  # one bar trace per group: the Lead's group terms
            g = next(g for g in W.GROUPS + (W.S_INHIBITION_GROUP,) if t(g, lang=lang) == trace["name"])
            np.testing.assert_allclose(plotly_array(trace["y"]), [h.lead.groups.get(g, 0.0) for h in heads])
    # the claims' table: the removal's actual change against the attributed one, as the claims computed them
    col = t("actual (taken out, live norm)", lang=lang)
    table = next(d.value for d in at.dataframe if t("summed lead", lang=lang) in d.value.columns)
    np.testing.assert_allclose(table[col].to_numpy(), [h.claim.removal.actual for h in circuits.induction.heads])
    if lang == "zh":
        from test_i18n import english_in_zh

        assert not english_in_zh(at), english_in_zh(at)


# ---------------------------------------------------------------- lesson 19 (§5)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_lesson_19_answers_from_the_models_own_numbers(smol, lang):
    """Lesson 19 on SmolLM2's induction circuit: the answer is the key-side source with the largest share of the
    induction head's lead over the runner-up key, computed by explain_score; the drawn heatmap sums to that lead;
    a wrong option is refused and the right one accepted with the model's numbers."""
    from test_app_lessons import open_lessons, question_radio
    from test_i18n import english_sentences, english_words, figure_texts, shown_texts

    from viz import lessons as LS

    lm, _ = smol
    n = next(i for i, les in enumerate(LS.LESSONS, 1) if les.slug == "why-here")
    w = LS.lm_compute("why-here", lm, "")
    e = w.expl
    assert e.error <= e.tolerance()
    # the answer, independently: the key source whose side total helps the lead most
    best = max(e.key_side, key=lambda s: e.key_side[s] * (1 if e.total >= 0 else -1))
    live = LS.live_why_here(w)
    assert live.correct == (best,)
    at = open_lessons(lang, lesson=n)
    assert not at.exception, [x.value for x in at.exception]
    z = plotly_array(json.loads(at.get("plotly_chart")[0].proto.spec)["data"][0]["z"])
    assert abs(z.sum() - e.total) <= e.tolerance()
    question_radio(at).set_value(next(o for o in live.options if o != best)).run()
    assert at.warning and not at.success
    question_radio(at).set_value(best).run()
    assert at.success and not at.exception
    if lang == "zh":
        english = [(k, hit) for k, text in shown_texts(at, at.main) for hit in english_sentences(text)]
        english += [(k, hit) for k, text in figure_texts(at) for hit in english_sentences(text) + english_words(text)]
        assert not english, english
