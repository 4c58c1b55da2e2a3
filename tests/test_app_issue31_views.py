"""Issue 31 §3, the views: /llm's document view and zoom window follow the end of an edited prompt, as a fresh
page would (a tiny random Llama with every prompt "long": the lazy views)."""

from __future__ import annotations

import pytest
from conftest import APP, tiny_hf_lm
from streamlit.testing.v1 import AppTest

from viz.ui import long_views

pytestmark = pytest.mark.slow
TEXT = "The cat sat on the mat. The dog ran in the park. Attention relates every token to every other one. " * 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return tiny_hf_lm(tmp_path_factory.mktemp("tiny-i31"), "llama")


@pytest.fixture(autouse=True)
def long_everything(monkeypatch):
    monkeypatch.setattr(long_views, "FULL_BUDGET", 1)


def test_llm_document_view_and_zoom_follow_the_end_after_the_prompt_grows(tiny):
    at = AppTest.from_file(APP, default_timeout=600)
    at.query_params.update({"checkpoint": tiny, "prompt": TEXT, "view": "heads"})
    at.switch_page("viz/pages/llm.py")
    at.run()
    assert not at.exception and not at.error
    pos = at.number_input(key="llm_long_pos")
    T = pos.value + 1
    q0 = at.number_input(key="llm_long_q0").value
    assert q0 == max(0, T - 32)
    at.text_area(key="llm_prompt").set_value(TEXT + " Where did the dog run?").run()
    assert not at.exception and not at.error
    T2 = at.number_input(key="llm_long_pos").value + 1
    assert T2 > T, "the position stayed on the old last token"
    assert at.number_input(key="llm_long_q0").value == q0 + (T2 - T)
    pos_q = at.query_params["pos"]
    assert (pos_q[-1] if isinstance(pos_q, list) else pos_q) == str(T2 - 1)
    # a position the reader chose elsewhere stays
    at.number_input(key="llm_long_pos").set_value(5).run()
    at.text_area(key="llm_prompt").set_value(TEXT + " Where did the dog run? In the park.").run()
    assert at.number_input(key="llm_long_pos").value == 5


def test_needle_caption_on_another_model_cites_no_readme_measurement(tiny):
    """The README's needle measurements are SmolLM2's: beside another model's grid the caption cites none of them
    (issue 38 §5; the SmolLM2 caption's numbers are checked against the README in tests/test_issue38_class.py)."""
    import re

    at = AppTest.from_file(APP, default_timeout=600)
    at.query_params.update({"checkpoint": tiny, "phen": "needle"})
    at.switch_page("viz/pages/phenomena.py")
    at.run()
    assert not at.exception
    (cap,) = [c.value for c in at.caption if c.value.startswith("An easy haystack")]
    assert "README" not in cap and not re.findall(r"\b\d[\d,]*\d\b", cap), cap


def test_flow_prints_each_rho_once_as_one_string():
    """dates: the table, the figure's titles and the sentence show each rho as the same string, and the sentence
    claims no lead over methods on one prompt (issue 31 §1: 0.768 / 0.685 in the table, "by 0.082" before)."""
    import json
    import re

    at = AppTest.from_file(APP, default_timeout=600)
    at.query_params.update({"checkpoint": "dates", "text": "3 november 2023", "pos": 2})
    at.switch_page("viz/pages/flow.py")
    at.run()
    assert not at.exception and not at.error
    table = {r["method"]: r["ρ"] for r in at.dataframe[0].value.to_dict("records")}
    (sentence,) = [m.value for m in at.markdown if m.value.startswith("On this prompt")]
    assert "agrees best" not in sentence and " by " not in sentence
    for name, rho in re.findall(r"\*\*(.+?)\*\* has the highest ρ with the causal effect \((.+?)\)", sentence):
        assert table[name] == rho
    shown = re.findall(r"then (.+?) \((.+?)\)", sentence)
    assert shown and all(table[n] == r for n, r in shown)
    titles = [a["text"] for c in at.get("plotly_chart") for a in json.loads(c.proto.spec)["layout"].get(
        "annotations", []) if "ρ = " in a.get("text", "")]
    assert titles and all(any(f"ρ = {r}" in x for x in titles) for r in table.values() if r != "NaN")
