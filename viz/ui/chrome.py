"""Streamlit's own words in Chinese, where the app can reach them (issue 26 §4).

Streamlit's frontend has no language setting: its status widget ("Running...", "Stop", "Rerun"), and the
"Help for <label>" name of every help icon are English strings inside its JavaScript. What the app can
reach is the page itself: a small script (drawn once per run, like the history patch in viz/ui/state.py; st.html
is not iframed) rewrites those texts and labels while the session's language is zh, and again whenever
Streamlit redraws them (a MutationObserver). Only text nodes and attributes change, never elements, so
React's own updates keep working.

What stays English is listed in the README (Chinese UI): the ⋮ menu (Settings, Print, Record a screencast,
About...), the connection and error screens, and the hints inside inputs ("Press Enter to apply").
"""

from __future__ import annotations

import json

import streamlit as st

# Streamlit's English -> ours. Texts of buttons and labels; "Help for X" is handled apart (it carries X).
ZH = {"Stop": "停止", "Stopping...": "正在停止…", "Rerun": "重新运行", "Always rerun": "总是重新运行",
      "Running...": "运行中…", "Help": "帮助"}  # "Stopping...": the same button once clicked (issue 38 §5)
HELP_FOR = "“{label}”的帮助"

_SCRIPT = """<script>
(() => {
  window.__alChromeLang = %(lang)s;
  if (window.__alChrome) { window.__alChrome(); return; }
  const words = %(words)s, helpFor = %(help_for)s;
  const attrs = ["aria-label", "title"];
  const fix = (root) => {
    if (window.__alChromeLang !== "zh") return;
    const scope = root && root.querySelectorAll ? root : document;
    scope.querySelectorAll('[data-testid="stStatusWidget"] button, [data-testid="stStatusWidget"] *')
      .forEach((el) => el.childNodes.forEach((n) => {
        if (n.nodeType === 3 && words[n.nodeValue.trim()]) n.nodeValue = words[n.nodeValue.trim()];
      }));
    scope.querySelectorAll("[aria-label], [title]").forEach((el) => attrs.forEach((a) => {
      const v = el.getAttribute(a);
      if (!v) return;
      if (words[v]) el.setAttribute(a, words[v]);
      else if (v.startsWith("Help for ")) el.setAttribute(a, helpFor.replace("{label}", v.slice(9)));
    }));
  };
  window.__alChrome = () => fix(document);
  let queued = false;  // one pass per frame, however many mutations came
  new MutationObserver(() => {
    if (window.__alChromeLang !== "zh" || queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; fix(document); });
  })
    .observe(document.body, {subtree: true, childList: true, attributes: true, attributeFilter: attrs,
                             characterData: true});
  fix(document);
})();
</script>"""


def script(lang: str) -> str:
    return _SCRIPT % {"lang": json.dumps(lang), "words": json.dumps(ZH, ensure_ascii=False),
                      "help_for": json.dumps(HELP_FOR, ensure_ascii=False)}


def install_chrome_words(lang: str) -> None:
    """Draw the script (invisible, in the sidebar). app.py calls it once per run with the session's language."""
    st.sidebar.html(script(lang), unsafe_allow_javascript=True)


# Streamlit's loading indicators animate every frame, and where the browser rasterizes and composites in software
# (no GPU: many classroom laptops, and headless Chromium) every frame is drawn on the CPU, on the cores the page
# itself (and, on a shared machine, the server) needs. Measured (bench/load.py --first-view-cost):
# - the skeleton shimmer Streamlit draws in place of each element whose code the browser is still loading (on a
#   fresh tab, every widget and chart of the first view, for as long as the tab's main thread is busy): one first
#   view of the default page spent ~6 s of compositor CPU on it, ~0.5 s with the skeletons still; six tabs opening
#   together pay it six times. A still grey block says "loading" as well;
# - st.spinner's icon (the needle view waits on it for its analyses): a smooth turn cost ~0.15 s of CPU per second
#   shown, 8 steps a turn ~0.09 s; it still turns.
STILL_SKELETONS = ("<style>[data-testid='stSkeleton'] { animation: none !important; } "
                   "[data-testid='stSpinnerIcon'] { animation-timing-function: steps(8, end) !important; }</style>")


def install_still_skeletons() -> None:
    """Draw the style (style-only st.html: Streamlit's event container, no space taken). app.py calls it first
    in every run, so that it is in the page before the first skeleton."""
    st.html(STILL_SKELETONS)
