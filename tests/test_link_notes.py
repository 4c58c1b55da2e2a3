"""A link value a page cannot use is replaced, and the page says so once, in the UI language
(viz.ui.state.seed_from_query / note_replaced; issue 17 item 6). Before, ?factor=99 became 1.0 silently."""

from __future__ import annotations

import pytest
from conftest import assert_clean, open_page
from streamlit.testing.v1 import AppTest  # noqa: F401  (marks this module as an app test: slow)

PAGE = "viz/pages/schedule.py"  # a light page whose controls are seeded from the URL


@pytest.mark.parametrize("lang, words", [("en", "is not possible here, so the page uses 1.0"),
                                         ("zh", "在这里无法使用，因此页面改用 1.0")])
def test_a_rejected_link_value_is_said_once(lang, words):
    at = open_page(PAGE, query={"factor": "99", "warmup": "4000", "lang": lang})
    assert_clean(at)
    assert at.slider(key="sch_f").value == 1.0
    notes = [w.value for w in at.warning if "`factor=99`" in w.value]
    assert len(notes) == 1 and words in notes[0]
    assert not [w for w in at.warning if "warmup" in w.value]  # a usable value is not mentioned
    at.run()
    assert not [w for w in at.warning if "`factor=99`" in w.value]  # once


def test_an_unknown_checkpoint_in_the_link_is_named():
    at = open_page(None, query={"checkpoint": "no-such-model"})  # the sidebar reads it on the first run
    assert_clean(at)
    assert any("`checkpoint=no-such-model`" in w.value and "dates" in w.value for w in at.warning)
