"""Issue 24 §3 on the real model: every language-model page with SmolLM2 and a 2,048-token prompt in the
sidebar draws (or, for an analysis that costs a forward pass per token or per head, says so and offers
the prompt's end), with no exception and no figure a browser would choke on. One lazy trace serves every
page (viz.ui.models.get_trace): it is computed once for the module."""

from __future__ import annotations

import json
import time

import pytest
from conftest import APP
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.slow
N = 2048
PAGES = ("tokens", "layer", "architecture", "since2017", "phenomena", "qk", "decoder", "experiments", "snapshots",
         "flow", "phenomena?phen=patterns&pat_src=prompt", "qk?batch=prompt")  # (the views on the sidebar's prompt)
COSTLY = {"flow": "runs on the text's last 128 tokens"}  # one forward pass per token: said, then run on the end
MAX_FIGURE_BYTES = 2_000_000  # a plotly figure's JSON: a browser on a classroom laptop takes this in well under 1 s


@pytest.fixture(scope="module")
def prompt() -> str:
    from viz.ui import lm_models

    lm = lm_models.load("smollm2").obj
    text = open(APP.replace("app.py", "README.md"), encoding="utf-8").read()[:20000]
    cut = lm.decode(lm.encode(text)[0, :N])
    assert lm.encode(cut).shape[1] == N
    return cut


def run(page: str, text: str, **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=900)
    at.query_params.update({"checkpoint": "smollm2", "lang": "en", **query})
    at.session_state["source_text"] = text
    at.switch_page(f"viz/pages/{page}.py")
    return at.run()


@pytest.mark.parametrize("page", PAGES)
def test_page_draws_a_2048_token_prompt(prompt, page):
    page, _, query = page.partition("?")
    t0 = time.perf_counter()
    at = run(page, prompt, **dict(kv.split("=") for kv in query.split("&") if kv))
    took = time.perf_counter() - t0
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert not [b for b in at.button if b.label.startswith("Keep the last")]
    if page in COSTLY:
        assert any(COSTLY[page] in w.value for w in at.warning), [w.value for w in at.warning]
    figs = at.get("plotly_chart")
    tables = at.dataframe or at.table or any("|---|" in m.value for m in at.markdown)
    assert figs or tables or at.get("download_button"), page
    sizes = [len(f.proto.spec) for f in figs]
    assert max(sizes, default=0) <= MAX_FIGURE_BYTES, (page, sizes)
    assert all(json.loads(f.proto.spec)["data"] for f in figs), page
    if page == "decoder":  # the new position's attention: the last 256 keys, the rest's weight said
        assert any("the last 256" in c.value for c in at.caption), [c.value for c in at.caption]
        assert all(len(json.loads(f.proto.spec)["data"][0].get("x") or []) <= 256 for f in figs[-2:])
    print(f"{page}: {took:.1f} s, {len(figs)} figures, largest {max(sizes, default=0) / 1e6:.2f} MB")
