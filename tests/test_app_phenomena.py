"""The Attention phenomena page, lessons 11–15 and the Experiments page on a language model (AppTest, en and zh).

A tiny random Llama (test_app_llm's fixture, offered like `--model PATH`) and SmolLM2 itself (slow, never
skipped). Every number the page prints or draws is checked against model/analysis or an independent loop here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_clean
from streamlit.testing.v1 import AppTest
from test_app_llm import decode, tiny  # noqa: F401  (tiny: the fixture)
from test_i18n import english_in_zh

from model import load_model
from model.analysis import ioi as IOI
from model.analysis import lessons_llm as LL
from model.analysis import phenomena as PH
from viz import lessons as LS
from viz.figures import attention as FIG
from viz.ui import lm_models

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parents[1] / "app.py")
PAGE = "viz/pages/phenomena.py"
TIMEOUT = 900
IOI_TEXT = "When Mary and John went to the store, John gave a drink to"


def run(query: dict, page: str = PAGE) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(query)
    at.switch_page(page)
    at.run()
    return at


def figs(at: AppTest) -> dict[str, dict]:
    out = {}
    for c in at.get("plotly_chart"):
        spec = json.loads(c.proto.spec)
        out[spec["layout"].get("title", {}).get("text", "")] = spec
    return out


def outlined(fig: dict) -> set[tuple[int, int]]:
    return {(round((s["y0"] + s["y1"]) / 2), round((s["x0"] + s["x1"]) / 2)) for s in fig["layout"].get("shapes", [])}


def links(at: AppTest) -> list:
    return list(at.get("page_link"))


def markdown(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown)


@pytest.fixture(scope="module")
def smol():
    return load_model("smollm2")


# ---------------------------------------------------------------- any decoder-only model (a tiny Llama)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_tiny_model_sinks_map_is_the_analysis(tiny, lang):  # noqa: F811
    at = run({"checkpoint": tiny, "text": IOI_TEXT, "lang": lang})
    assert_clean(at)
    eff = PH.sink_effect(lm_models.load(tiny).obj, IOI_TEXT)
    (fig,) = [f for f in figs(at).values() if f["data"][0]["type"] == "heatmap"]
    np.testing.assert_allclose(decode(fig["data"][0]["z"]), eff.share.scores, rtol=1e-6)
    assert outlined(fig) == {(a, b) for a, b, _ in eff.share.heads}
    assert len(links(at)) == min(8, eff.share.scores.size)  # the strongest sinks, each a link to /llm
    for link in links(at):  # each opens its head on /llm and prints that head's share
        layer, head = re.search(r"layer=(\d+)&head=(\d+)&", str(link.proto)).groups()
        value = re.split(r"[:：]\s*", link.proto.label)[-1]
        assert link.proto.page == "llm"
        assert value == FIG.num(float(eff.share.scores[int(layer), int(head)]))
    if lang == "zh":
        assert not english_in_zh(at)


@pytest.mark.parametrize("view", ["patterns", "induction", "ioi"])
def test_tiny_model_every_view_draws_or_says_why(tiny, view):  # noqa: F811
    at = run({"checkpoint": tiny, "text": IOI_TEXT, "phen": view})
    assert not at.exception, [e.value for e in at.exception]
    assert at.get("plotly_chart") or at.error  # a figure, or a sentence (e.g. no single-token names for IOI)


def test_a_model_without_an_lm_says_so_and_offers_smollm2():
    at = run({"checkpoint": "dates", "lang": "en"})
    assert_clean(at)
    assert any("not a language model" in i.value for i in at.info)
    assert any("SmolLM2" in b.label for b in at.button)
    at.button(key="_al_require_switch").click().run()
    assert at.session_state["checkpoint"] == "smollm2"


# ---------------------------------------------------------------- SmolLM2


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_smollm2_sinks_numbers_and_blocking(smol, lang):
    at = run({"checkpoint": "smollm2", "text": IOI_TEXT, "lang": lang})
    assert_clean(at)
    eff = PH.sink_effect(smol, IOI_TEXT)
    w = smol.run_with_trace(IOI_TEXT, names="*.self_attn.weights")[1]
    independent = np.mean([float(w[f"decoder.layers.{i}.self_attn.weights"][0, :, 1:, 0].double().mean())
                           for i in range(30)])
    assert eff.mean_share == pytest.approx(independent, rel=1e-9)
    assert f"{eff.mean_share:.0%}" in markdown(at)
    b = LL.block_sink(smol, IOI_TEXT)
    values = [m.value for m in at.metric]
    assert lm_models.readable(smol.tokens([b.top_before])[0]) in values[0]
    assert lm_models.readable(smol.tokens([b.top_after])[0]) in values[1]
    # issue 26: the logit metric says both numbers and which is which (2.41 was shown beside "intact")
    assert values[2] == f"{FIG.num(b.answer_logit_before)} → {FIG.num(b.answer_logit_after)}"
    if lang == "en":
        assert "intact → token 0 blocked" in at.metric[2].label
    if lang == "zh":
        assert not english_in_zh(at)


def test_smollm2_induction_view_measures_and_ablates(smol):
    at = run({"checkpoint": "smollm2", "phen": "induction", "ind_k": "5", "ind_mode": "zero"})
    assert_clean(at)
    res = PH.induction(smol, n=50, seed=0)
    ids = res.ids
    with torch.no_grad():
        loss = F.cross_entropy(smol.model(ids)[0, :-1].float(), ids[0, 1:], reduction="none").double()
    # float32 logits of a separate forward (CPU threads sum in their own order): far below the 3 digits shown
    assert res.loss.first == pytest.approx(float(loss[:50].mean()), rel=1e-4)
    assert res.loss.second == pytest.approx(float(loss[50:].mean()), rel=1e-4)
    text = markdown(at)
    assert FIG.num(res.loss.first) in text and FIG.num(res.loss.second) in text
    ab = PH.ablate_top_induction(smol, res, k=5, mode="zero")
    assert FIG.num(ab.ablated) in text and ab.ablated > max(ab.control)  # the found heads matter, random ones not
    fig = figs(at)[next(k for k in figs(at) if k.startswith("Induction score"))]
    assert outlined(fig) == {(a, b) for a, b, _ in res.scores["induction"].heads}
    assert sorted(link.proto.label.split(":")[0] for link in links(at)) == sorted(  # laid out in 4 columns
        f"layer {a} · head {b}" for a, b, _ in res.scores["induction"].heads[:8])


def test_smollm2_needle_ablation_runs_on_request_and_draws_the_analysis():
    """The needle's "Knock them out" runs when asked (issue 43: its 8 forwards of 512 tokens made a cold first view
    wait 41 s): off, no bars and a caption that says what it would run; on, the bars and the sentence are
    shared.needle_ablation's numbers, its intact p(answer) that of a plain forward here, and the URL says so, so
    a copied link opens with it on."""
    from model.analysis import long as LG
    from model.analysis import shared as AN

    at = run({"checkpoint": "smollm2", "phen": "needle", "needle_k": "3"})
    assert_clean(at)
    assert "mean p(answer)" not in figs(at) and "needle_run" not in at.query_params
    assert any("Turn on “Knock out the top heads”" in c.value and "8 forward passes of 512 tokens" in c.value
               for c in at.caption)
    at.toggle(key="phen_needle_run").set_value(True).run()
    assert_clean(at)
    assert at.query_params["needle_run"] == ["1"] or at.query_params["needle_run"] == "1"
    lm = lm_models.load("smollm2").obj
    lengths = AN.needle_lengths(lm)
    grid, ab = AN.needle_grid(lm, lengths), AN.needle_ablation(lm, lengths, k=3)
    assert ab.heads == [(a, b) for a, b, _ in grid.retrieval.top(3)]
    want = [ab.base, ab.ablated, *ab.control]
    assert figs(at)["mean p(answer)"]["data"][0]["y"] == pytest.approx(want, rel=1e-12)
    text = markdown(at)
    assert all(FIG.num(v) in text for v in want), text[-800:]
    probs = []  # intact p(answer), teacher-forced, by a plain forward of each new prompt
    for d in AN.NEEDLE_ABLATE_DEPTHS:
        p = LG.needle_prompt(lm, max(lengths), d, AN.NEEDLE_ABLATE_KEY)
        ids = LG.teacher_forced_ids(lm, p)
        P = p.ids.shape[1]
        with torch.no_grad():
            logp = lm.model(ids)[0, P - 1:P - 1 + len(p.answer)].float().log_softmax(-1)
        probs.append(float(np.exp(sum(float(logp[j, a]) for j, a in enumerate(p.answer)))))
    assert ab.base == pytest.approx(float(np.mean(probs)), rel=1e-3)  # a separate forward: float32 sums differ
    copied = run({"checkpoint": "smollm2", "phen": "needle", "needle_k": "3", "needle_run": "1"})
    assert_clean(copied)
    assert figs(copied)["mean p(answer)"]["data"][0]["y"] == pytest.approx(want, rel=1e-12)
    zh = run({"checkpoint": "smollm2", "phen": "needle", "needle_k": "3", "needle_run": "1", "lang": "zh"})
    assert_clean(zh)  # the toggle, its help and the sentence in Chinese; the same bars
    assert zh.toggle(key="phen_needle_run").label == "敲掉得分最高的头" and not english_in_zh(zh)
    assert [f["data"][0]["y"] for f in figs(zh).values() if f["data"][0]["type"] == "bar"] == [
        pytest.approx(want, rel=1e-12)]


def test_smollm2_patterns_and_ioi_views(smol):
    at = run({"checkpoint": "smollm2", "phen": "patterns"})
    assert_clean(at)
    prev = PH.induction(smol, n=50).scores["previous_token"]
    assert (16, 0) in {(a, b) for a, b, _ in prev.heads}  # the previous-token head, > 0.8
    assert "L16 H0" in markdown(at)
    at = run({"checkpoint": "smollm2", "phen": "ioi"})
    assert_clean(at)
    res = IOI.ioi(smol)
    assert f"**{FIG.num(res.mean_logit_diff)}**" in markdown(at)
    bars = figs(at)["Logit difference IO − S per prompt"]
    np.testing.assert_allclose(decode(bars["data"][0]["x"]), res.logit_diffs)


# ---------------------------------------------------------------- lessons 11–15 on SmolLM2


def lesson(n: int, lang: str = "en") -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"lesson": str(n), "lang": lang})
    at.switch_page("viz/pages/lessons.py")
    at.run()
    assert_clean(at)
    return at


def answer(at: AppTest, value: str) -> AppTest:
    radio = next(r for r in at.radio if r.key and r.key.startswith("lesson_q_"))
    radio.set_value(value).run()  # the option's id (the radio shows its label)
    return at


def expect_checked(at: AppTest, right: str, wrong: str) -> None:
    answer(at, wrong)
    assert at.warning and not at.success
    answer(at, right)
    assert at.success and not at.warning


def test_lesson_11_gqa_sharing_from_the_config(smol):
    cfg = smol.model.cfg
    live = LS.live_llm_2017(smol.model.describe())
    right = str(cfg.n_heads // cfg.n_kv_heads)
    assert live.correct == (right,)
    expect_checked(lesson(11), right, next(o for o in live.options if o != right))


def test_lesson_12_sink_share_bin(smol):
    w = smol.run_with_trace(IOI_TEXT, names="*.self_attn.weights")[1]
    share = np.mean([w[f"decoder.layers.{i}.self_attn.weights"][0, :, 1:, 0].double().mean().item() for i in range(30)])
    right = next(k for k, hi in LS.SINK_BINS.items() if share < hi)
    live = LS.live_sinks(PH.sink_effect(smol, IOI_TEXT))
    assert live.correct == (right,)
    expect_checked(lesson(12), right, next(o for o in live.options if o != right))


def test_lesson_13_repeat_loss_ratio(smol):
    ids = PH.induction_sequence(smol, 50, seed=0)
    loss = F.cross_entropy(smol.model(ids)[0, :-1].float(), ids[0, 1:], reduction="none").double()
    ratio = float(loss[50:].mean() / loss[:50].mean())
    right = min(LS.REPEAT_RATIOS, key=lambda k: abs(np.log(LS.REPEAT_RATIOS[k]) - np.log(ratio)))
    assert LS.live_induction(PH.induction(smol, n=50, seed=0)).correct == (right,)
    expect_checked(lesson(13), right, next(k for k in LS.REPEAT_RATIOS if k != right))


def test_lesson_14_top_dla_head_by_an_independent_projection(smol):
    """Each head's z at the last position through its W^O slice, 1/rms of the final residual, the norm's weight
    and u(IO) − u(S), written out here, averaged over the twelve prompts."""
    m = smol.model
    prompts = IOI.ioi_prompts(smol)
    total = np.zeros((m.cfg.n_layers, m.cfg.n_heads))
    for p in prompts:
        names = ["decoder.norm.in"] + [f"decoder.layers.{i}.self_attn.z" for i in range(m.cfg.n_layers)]
        _, tr = m.run_with_trace(smol.encode(p.text), names=names)
        x = tr["decoder.norm.in"][0, -1].double()
        scale = 1 / torch.sqrt(x.pow(2).mean() + m.decoder.norm.eps)
        u = (m.generator.weight[p.io_id] - m.generator.weight[p.s_id]).double() * m.decoder.norm.weight.double()
        for i, layer in enumerate(m.decoder.layers):
            w_o = layer.self_attn.w_o.weight.double()  # [D, H * hs]
            z = tr[f"decoder.layers.{i}.self_attn.z"][0, :, -1].double()  # [H, hs]
            for h in range(m.cfg.n_heads):
                part = w_o[:, h * z.shape[1]:(h + 1) * z.shape[1]] @ z[h]
                total[i, h] += float((part * scale) @ u) / len(prompts)
    best = np.unravel_index(int(np.argmax(total)), total.shape)
    right = f"{best[0]}-{best[1]}"
    live = LS.live_ioi(IOI.ioi(smol))
    assert right in live.correct
    expect_checked(lesson(14), right, next(o for o in live.options if o not in live.correct))


def test_lesson_15_first_lens_layer(smol):
    m = smol.model
    names = [f"decoder.layers.{i}.out" for i in range(m.cfg.n_layers)]
    _, tr = m.run_with_trace(smol.encode(LS.LENS_TEXT), names=names)
    with torch.no_grad():
        tops = [int(m.generator(m.decoder.norm(tr[n][0, -1:]))[0].argmax()) for n in names]
    first = next(i for i in range(len(tops)) if all(v == tops[-1] for v in tops[i:]))
    assert tops[-1] == int(m(smol.encode(LS.LENS_TEXT))[0, -1].argmax())
    live = LS.live_lens(__import__("model.analysis.logit_lens", fromlist=["x"]).logit_lens(smol, LS.LENS_TEXT))
    assert live.correct == (str(first),)
    expect_checked(lesson(15), str(first), next(o for o in live.options if o != str(first)))


@pytest.mark.parametrize("n", [11, 12, 13, 14, 15])
def test_llm_lessons_in_zh_have_no_english(n):
    at = lesson(n, "zh")
    assert at.get("plotly_chart")
    found = [f for f in english_in_zh(at) if not re.search(r"text_input|Sentence", f)]
    assert not found, found


# ---------------------------------------------------------------- Experiments on SmolLM2


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_experiments_ablate_a_shared_kv_head_on_smollm2(smol, lang):
    spec = "ablate_kv_head:module=decoder.layers.17.self_attn,kv_head=1,mode=zero"
    at = run({"checkpoint": "smollm2", "text": IOI_TEXT, "exp": spec, "lang": lang}, "viz/pages/experiments.py")
    assert_clean(at)
    assert at.query_params["exp"] == spec
    assert any("3, 4, 5" in c.value for c in at.caption)  # the query heads it silences
    ba = LL.lm_before_after(smol, IOI_TEXT, LL.lm_hooks([spec], smol))
    metrics = {m.label: m for m in at.metric}
    assert any(m.value == f"{ba.logit_diff_after:.3f}" for m in metrics.values())
    assert any(m.value == f"{ba.loss_after:.3f}" for m in metrics.values())
    if lang == "zh":
        assert not english_in_zh(at)


def test_experiments_on_smollm2_offers_lm_interventions_and_names_the_rest():
    at = run({"checkpoint": "smollm2", "text": IOI_TEXT, "exp": "shuffle_source:seed=1"}, "viz/pages/experiments.py")
    assert not at.exception
    assert any("does not apply to a decoder-only model" in e.value for e in at.error)
    assert at.multiselect(key="exp_lm_iv").options == [
        "Ablate a head", "Ablate a shared K/V head", "Scale a head", "No √d_k scaling", "No positions (RoPE off)",
        "No look-ahead mask"]
    assert any("Not offered for a decoder-only model" in c.value for c in at.caption)
    at = run({"checkpoint": "smollm2", "text": IOI_TEXT, "exp_view": "attribution"}, "viz/pages/experiments.py")
    assert_clean(at)
    assert any("decoder-only model has no source sentence" in i.value for i in at.info)
