"""Attention Lab: type a sentence, watch a Transformer think.  `streamlit run app.py`

A thin entry point, in two roles:
- `streamlit run app.py` imports it once as a module and serves the `st.App` at the bottom; that
  import starts warming the server (torch, the default models and traces: viz/warmup.py) while the first
  browser is still loading the frontend;
- every session runs it as its script (`__name__ == "__main__"`): `main()`, the language switch and
  the shared sidebar (model + input, chosen once for every page), then `st.navigation` over file pages
  (AppTest.switch_page reaches file pages only). Every page has an explicit `url_path`, the same in
  every language, so a shared link opens the same page for everyone.
"""

from pathlib import Path

import streamlit as st

from viz import common, i18n, warmup
from viz.i18n import N_, t
from viz.task_help import task_help

ROOT = Path(__file__).parent
DEFAULT = "viz/pages/attention.py"  # opens at "/": the view that shows a Transformer thinking
SECTIONS = {  # section -> [(file, title, icon)]; url_path = the file's stem. A page appears once its file exists.
    N_("Learn"): [
        ("viz/pages/lessons.py", N_("Lessons"), ":material/school:"),
        ("viz/pages/architecture.py", N_("Architecture map"), ":material/account_tree:"),
    ],
    N_("Look inside"): [
        ("viz/pages/tokens.py", N_("Tokens & embeddings"), ":material/text_fields:"),
        ("viz/pages/tokenizers.py", N_("Tokenizer playground"), ":material/content_cut:"),
        ("viz/pages/attention.py", N_("Attention"), ":material/grid_view:"),
        ("viz/pages/layer.py", N_("Inside a layer"), ":material/layers:"),
        ("viz/pages/padding.py", N_("A batch with padding"), ":material/view_week:"),
        ("viz/pages/decoder.py", N_("Step-by-step decoder"), ":material/step:"),
        ("viz/pages/pretrained.py", N_("Pretrained encoder"), ":material/psychology:"),
    ],
    N_("Experiment"): [
        ("viz/pages/experiments.py", N_("Experiments"), ":material/science:"),
        ("viz/pages/schedule.py", N_("Learning-rate schedule"), ":material/show_chart:"),
        ("viz/pages/training.py", N_("Training, live"), ":material/model_training:"),
        ("viz/pages/snapshots.py", N_("Snapshots"), ":material/photo_camera:"),
    ],
}


def main() -> None:
    # A local favicon: a :material/...: page icon is fetched from fonts.gstatic.com, and the app must work offline.
    st.set_page_config(page_title="Attention Lab", page_icon=str(ROOT / "viz/static/icon.png"), layout="wide")
    common.install_history_patch()  # before the first ?lang= write, so that write replaces the history entry
    i18n.language_switch()
    pages = {
        t(section): [st.Page(f, title=t(title), icon=icon, url_path=Path(f).stem, default=(f == DEFAULT))
                     for f, title, icon in entries if (ROOT / f).is_file()]
        for section, entries in SECTIONS.items()
    }
    page = st.navigation({s: ps for s, ps in pages.items() if ps}, expanded=True)  # every page in view
    task_help(common.sidebar())  # the model's grammar, example sentences, out-of-grammar warnings
    page.run()


if __name__ == "__main__":  # a session's script run
    main()
else:  # `streamlit run app.py` imports this module once, to find the app to serve
    warmup.start()  # in the background, while the server starts and the first browser loads the frontend
    app = st.App(__file__)
