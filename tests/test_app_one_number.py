"""One number per claim across pages (issue 26 §1), in the app (AppTest):

- lesson 12's KL and /phenomena?phen=sinks's KL for the same prompt are the same number, and both say where it is
  measured (the last position);
- a head's score on /phenomena (Patterns and Induction, repeated random tokens) is the score /llm shows when the
  head's link is followed: the link carries what regenerates the same ids (`rep=n:seed`), not text;
- /llm's labels: the decoder-only axes, the model card (Instruct, quantized, from the GGUF), the Layer/Head
  selects hidden in the lens view, the lens sentence computed from the lens.

The tiny random Llama of test_app_llm (a server model) for the links; SmolLM2 where the claim is about it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from conftest import assert_clean
from streamlit.testing.v1 import AppTest
from test_app_llm import decode, tiny  # noqa: F401  (tiny: the fixture)

from model import load_model
from model.analysis import phenomena as PH

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parents[1] / "app.py")
TIMEOUT = 900
IOI_TEXT = "When Mary and John went to the store, John gave a drink to"
KL = re.compile(r"KL = ([0-9.eE+−-]+) (?:nats|奈特)")


def run(query: dict, page: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(query)
    at.switch_page(page)
    at.run()
    assert_clean(at)
    return at


def texts(at: AppTest) -> str:
    return "\n".join([m.value for m in at.markdown] + [c.value for c in at.caption] + [s.value for s in at.success]
                     + [w.value for w in at.warning] + [i.value for i in at.info])


def follow(link) -> dict:
    """A page_link's query parameters, as the browser would open them."""
    return dict(parse_qsl(link.proto.query_string))


def figures(at: AppTest) -> dict[str, dict]:
    out = {}
    for c in at.get("plotly_chart"):
        spec = json.loads(c.proto.spec)
        out[spec["layout"].get("title", {}).get("text", "").split("<br>")[0]] = spec
    return out


# ---------------------------------------------------------------- one KL


def test_lesson_12_kl_is_the_phenomena_pages_kl(lang="en"):
    smol = load_model("smollm2")
    at = run({"lesson": "12", "lang": lang}, "viz/pages/lessons.py")
    radio = next(r for r in at.radio if r.key and r.key.startswith("lesson_q_"))
    from viz import lessons as LS

    right = LS.live_sinks(PH.sink_effect(smol, IOI_TEXT)).correct[0]
    radio.set_value(right).run()  # the right answer shows the lesson's feedback, with its KL (an option's id)
    lesson_kl = KL.findall(texts(at))
    page = run({"checkpoint": "smollm2", "text": IOI_TEXT, "phen": "sinks", "lang": lang}, "viz/pages/phenomena.py")
    page_kl = KL.findall(texts(page))
    assert lesson_kl and page_kl and lesson_kl[0] == page_kl[0], (lesson_kl, page_kl)
    want = PH.block_sink(smol, IOI_TEXT).kl
    assert float(page_kl[0]) == pytest.approx(want, rel=5e-3) and want == pytest.approx(2.33, abs=0.02)
    where = "last position" if lang == "en" else "最后一个位置"
    assert where in texts(at) and where in texts(page)


# ---------------------------------------------------------------- the same head score through the link


def score_in_caption(at: AppTest) -> float:
    m = re.search(r"layer (\d+) head (\d+): ([0-9.eE+-]+)\. Hover", texts(at))
    assert m, texts(at)
    return float(m.group(3))


@pytest.mark.parametrize("view,stat", [("patterns", "previous_token"), ("patterns", "duplicate_token"),
                                       ("induction", "induction")])
def test_a_head_link_carries_the_ids_and_llm_shows_the_same_score(tiny, view, stat):  # noqa: F811
    query = {"checkpoint": tiny, "phen": view}
    if view == "induction":
        query |= {"ind_n": "12", "ind_seed": "3"}
    at = run(query, "viz/pages/phenomena.py")
    links = [ln for ln in at.get("page_link") if "llm" in ln.proto.page]
    wanted = {"previous_token": "prev", "duplicate_token": "dup", "induction": "induction"}[stat]
    chosen = [ln for ln in links if follow(ln).get("stat") == wanted]
    assert chosen, [follow(ln) for ln in links]
    for link in chosen[:2]:
        q = follow(link)
        assert "prompt" not in q and re.fullmatch(r"\d+:\d+", q["rep"])  # ids by seed, never re-typed text
        shown = float(re.search(r": ([0-9.eE+-]+)$", link.proto.label).group(1))
        llm = run(q, "viz/pages/llm.py")
        # the number /phenomena showed for this head is the number /llm shows for it
        assert score_in_caption(llm) == pytest.approx(shown, abs=5e-4)
        n, seed = (int(x) for x in q["rep"].split(":"))
        lm = load_model_label(tiny)
        res = PH.induction(lm, n=n, seed=seed)
        z = decode(next(f for k, f in figures(llm).items() if "per head" in k)["data"][0]["z"])
        layer, head = int(q["layer"]), int(q["head"])
        assert z[layer][head] == pytest.approx(res.scores[stat].scores[layer, head], rel=1e-5)


def load_model_label(label: str):
    from viz.ui import lm_models

    return lm_models.load(label).obj


# ---------------------------------------------------------------- labels on /llm


def test_llm_labels_say_what_they_show(tiny):  # noqa: F811
    at = run({"checkpoint": tiny, "view": "heads"}, "viz/pages/llm.py")
    spec = next(f for k, f in figures(at).items() if "softmax weights" in k)
    titles = json.dumps(spec["layout"], ensure_ascii=False)
    assert "query (input → predicted)" in titles and "decoder:" not in titles and "key (target)" not in titles
    assert {"Layer", "Head"} <= {s.label for s in at.selectbox}
    lens = run({"checkpoint": tiny, "view": "lens"}, "viz/pages/llm.py")
    assert not any(s.label in ("Layer", "Head") for s in lens.selectbox)  # they would do nothing there


def test_smollm2_card_lens_sentence_and_language_note():
    at = run({"checkpoint": "smollm2", "view": "lens", "prompt": "The capital of France is"}, "viz/pages/llm.py")
    text = texts(at)
    assert "SmolLM2-135M-Instruct, quantized (Q4_1 GGUF, dequantized to float32" in text
    assert "only at the last layer (29)" in text  # ' Paris' tops the lens at layer 29 only: no "appears and stays"
    zh = run({"checkpoint": "smollm2", "view": "heads", "prompt": "北京的天气很好"}, "viz/pages/llm.py")
    text = texts(zh)
    assert "trained on English" in text and "general.languages = en" in text
    assert "a Chinese character is 3 bytes" in text


def test_zh_llm_lessons_say_why_their_prompts_are_english():
    at = run({"lesson": "12", "lang": "zh"}, "viz/pages/lessons.py")
    assert "这里的提示词保持英文" in texts(at) and "general.languages = en" in texts(at)
    en = run({"lesson": "12", "lang": "en"}, "viz/pages/lessons.py")
    assert "stay in English" not in texts(en)  # the model speaks the page's language: nothing to explain


def test_one_prompt_per_session_llm_to_phenomena_and_back(tiny):  # noqa: F811
    """A prompt typed on /llm is the one /phenomena runs (it used to stay on /llm), and the sidebar's reaches /llm."""
    at = run({"checkpoint": tiny, "view": "heads"}, "viz/pages/llm.py")
    at.text_area(key="llm_prompt").set_value("the cat sat on the mat and the cat sat").run()
    assert at.session_state["source_text"] == "the cat sat on the mat and the cat sat"
    at.switch_page("viz/pages/phenomena.py").run()
    assert_clean(at)
    sink_links = [follow(ln) for ln in at.get("page_link") if follow(ln).get("stat") == "sink"]
    assert sink_links and all(q["prompt"] == "the cat sat on the mat and the cat sat" for q in sink_links)
    at.switch_page("viz/pages/llm.py").run()
    at.sidebar.text_area(key="source_text").set_value("a dog ran in the park").run()
    assert at.text_area(key="llm_prompt").value == "a dog ran in the park"


@pytest.mark.parametrize("model", ["dates", "tiny"])
def test_qk_offers_the_sidebar_prompt(model, tiny):  # noqa: F811
    name = tiny if model == "tiny" else model
    text = "3 november 2023" if model == "dates" else "the cat sat on the mat"
    at = run({"checkpoint": name, "text": text, "batch": "prompt"}, "viz/pages/qk.py")
    assert "the sidebar's text" in at.segmented_control(key="qk_batch").options
    assert at.session_state["qk_batch"] == "prompt"
    assert text in texts(at)  # "Inputs: the sidebar's text, “...”"
    fig = next(json.loads(c.proto.spec) for c in at.get("plotly_chart"))
    hover = json.dumps(fig["data"], ensure_ascii=False)
    assert text.split()[1] in hover  # the map's points are the prompt's tokens


def test_lesson_progress_survives_a_reload_through_the_url():
    """Progress lives in the browser's URL (?done=1.3), never on the server: a reload (a new session) and a
    ?present=1 link keep it; a right answer adds its lesson number."""
    from viz import lessons as LS

    at = run({"lesson": "2", "done": "1.3", "present": "1"}, "viz/pages/lessons.py")
    bar = at.get("progress")[0]
    assert "· 2 of" in bar.proto.text and at.query_params["done"] in ("1.3", ["1.3"])
    at.session_state["lessons_done"] = {LS.LESSONS[0].slug, LS.LESSONS[2].slug, LS.LESSONS[1].slug}
    at.run()  # as a right answer on lesson 2 does
    assert at.query_params["done"] in ("1.2.3", ["1.2.3"])
    fresh = run({"lesson": "2", "done": "1.2.3", "present": "1"}, "viz/pages/lessons.py")  # the reload
    assert "· 3 of" in fresh.get("progress")[0].proto.text


def test_generate_at_temperature_shows_the_drawn_probability_and_the_chosen_token(tiny):  # noqa: F811
    """T = 0.8: "Chosen: x (probability p ...)" says p from softmax(logits / 0.8) (was the T = 1 number), and the
    bars are that distribution's top 10 with the chosen token always among them."""
    from viz.ui import lm_models

    lm = lm_models.load(tiny).obj
    at = run({"checkpoint": tiny, "prompt": IOI_TEXT, "view": "generate", "max_new": "6", "temperature": "0.8",
              "seed": "4"}, "viz/pages/llm.py")
    next(b for b in at.button if b.label == "Generate").click().run()
    assert_clean(at)
    want = lm.generate(IOI_TEXT, max_new_tokens=6, temperature=0.8, seed=4).steps[0]
    chosen = [c.value for c in at.caption if c.value.startswith("Chosen:")][0]
    from viz.figures.attention import num

    assert f"probability {num(want.sampled_prob)} in the distribution it was drawn from" in chosen
    assert f"temperature 1: {num(want.prob)}" in chosen
    bars = next(f for k, f in figures(at).items() if "drawn from" in k)["data"][0]
    assert list(decode(bars["x"])) == pytest.approx([p for _, p in want.drawn_top])
