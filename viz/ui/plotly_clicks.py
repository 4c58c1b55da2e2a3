"""A listener for plotly's own click event on a chart drawn by Streamlit (draws nothing).

Streamlit's on_select reports box/lasso selections of a heatmap, not a click on one cell, so the pages that open
something on a cell click (/llm's overview, the "Why here?" panel) listen to plotly_click themselves. The chart is
found by its Streamlit key (`data.figure`); only what a click reports differs between them (`on_click`).
"""

from __future__ import annotations

import streamlit as st

_JS = """
export default function ({ data, setTriggerValue }) {
  let gd = null;
  const onClick = (ev) => {
__ON_CLICK__
  };
  const attach = () => {
    const el = document.querySelector(".st-key-" + data.figure + " .js-plotly-plot");
    if (el && el !== gd && el.on) { gd = el; gd.on("plotly_click", onClick); }
  };
  attach();
  const timer = setInterval(attach, 250);  // the chart is redrawn (a new element) on reruns
  return () => clearInterval(timer);
}
"""


def plotly_click_component(name: str, on_click: str):
    """A Streamlit component `name` whose `on_click` (JavaScript, the body of `(ev) => {...}`) calls
    setTriggerValue on a click of the chart keyed `data["figure"]`."""
    return st.components.v2.component(name, js=_JS.replace("__ON_CLICK__", on_click))
