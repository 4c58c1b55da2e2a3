"""Every text and number input of every page survives a copied link: change it, take the page's URL
parameters, open them in a fresh session, and find the same value in the same widget.

The inputs are found on the page (AppTest's text_input, text_area, number_input, slider), not listed by
hand, so a new input is covered at once. CONTEXTS opens pages on views where more inputs are drawn.
"""

from __future__ import annotations

import pytest
from conftest import APP
from streamlit.testing.v1 import AppTest

PAGES = ["viz/pages/lessons.py", "viz/pages/architecture.py", "viz/pages/tokens.py", "viz/pages/tokenizers.py",
         "viz/pages/attention.py", "viz/pages/layer.py", "viz/pages/padding.py", "viz/pages/decoder.py",
         "viz/pages/pretrained.py", "viz/pages/experiments.py", "viz/pages/schedule.py", "viz/pages/training.py",
         "viz/pages/snapshots.py"]
KINDS = ("text_input", "text_area", "number_input", "slider")
CONTEXTS = {  # page -> extra views (URL parameters) whose inputs are not drawn by default
    "viz/pages/lessons.py": [{"lesson": "2"}, {"lesson": "4"}, {"lesson": "5"}, {"lesson": "9"}],
    "viz/pages/decoder.py": [{"dec_strategy": "beam"}, {"dec_strategy": "sample"}],
    "viz/pages/experiments.py": [{"exp_view": "compare"}, {"exp": "shuffle_source"},
                                 {"exp": "scale_head:module=decoder.layers.0.self_attn,head=1,factor=2"}],
}
# Inputs that do not belong in a link: key -> the reason.
NOT_IN_LINK: dict[str, str] = {}
SIDEBAR_KEYS = ("source_text", "target_text")
# Inputs whose owner has not put them in the URL yet: key prefix -> reason (listed in the report).
PENDING: dict[str, str] = {}



def open_link(page: str, query: dict, timeout: float = 300):
    """The app as a pasted link opens it: the URL's page and query, one run (no default page first)."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    at.query_params.update({k: str(v) for k, v in query.items()})
    at.switch_page(page)
    return at.run()

def changed(widget):
    """A different valid value for `widget`."""
    if widget.type in ("text_input", "text_area"):
        value = widget.value or ""
        if "\n" in value:  # one item per line (padding sentences, similarity lines): drop the last line
            return "\n".join(value.splitlines()[:-1]) if len(value.splitlines()) > 2 else value + "\n" + value
        return (value + " 2") if value else "3 november 2023"
    lo, hi = widget.min, widget.max
    value = widget.value
    if isinstance(value, (tuple, list)):
        return None  # range sliders: none on these pages
    step = widget.step or 1
    new = value + step if hi is None or value + step <= hi else value - step
    return new if lo is None or new >= lo else None


def inputs(at):
    return [w for kind in KINDS for w in at.get(kind) if getattr(w, "key", None) and not w.disabled]


def cases():
    for page in PAGES:
        yield pytest.param(page, {}, id=page.split("/")[-1][:-3])
        for ctx in CONTEXTS.get(page, []):
            yield pytest.param(page, ctx, id=page.split("/")[-1][:-3] + "-" + "-".join(ctx.values()))


@pytest.mark.slow
@pytest.mark.parametrize(("page", "context"), list(cases()))
def test_every_input_survives_a_copied_link(page, context):
    first = open_link(page, query={"lang": "en", **context})
    keys = [w.key for w in inputs(first) if w.key not in NOT_IN_LINK]
    if page != PAGES[0]:  # the sidebar's inputs (app.py draws them on every page): checked once
        keys = [k for k in keys if k not in SIDEBAR_KEYS]
    # Pages whose default view has no text or number input (their inputs come with a CONTEXT).
    assert keys or page.endswith(("snapshots.py", "architecture.py", "attention.py", "experiments.py")), page
    lost = []
    for key in keys:
        at = open_link(page, query={"lang": "en", **context})
        widget = at.get_by_key(key) if hasattr(at, "get_by_key") else None
        if widget is None:
            continue
        new = changed(widget)
        if new is None or new == widget.value:
            continue
        widget.set_value(new).run()
        assert not at.exception, [e.value for e in at.exception]
        shown = at.get_by_key(key).value
        if shown != new:  # the page itself replaced the value (e.g. clamped): compare what it kept
            new = shown
        link = {k: at.query_params[k] for k in at.query_params}
        fresh = open_link(page, query=link)
        assert not fresh.exception, [e.value for e in fresh.exception]
        try:
            again = fresh.get_by_key(key).value
        except KeyError:
            again = "<not drawn>"
        if again != new:
            lost.append(f"{key}: set {new!r}, the link {link} reopens {again!r}")
    pending = [x for x in lost if any(x.startswith(p) for p in PENDING)]
    lost = [x for x in lost if x not in pending]
    if pending and not lost:
        pytest.xfail("; ".join(f"{p}: {r}" for p, r in PENDING.items()))
    assert not lost, f"{page} {context}: {len(lost)} input(s) lost by a copied link:\n" + "\n".join(lost)
