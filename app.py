"""Attention Lab: type a sentence, watch a Transformer think.  `streamlit run app.py`

A thin entry point, in two roles:
- `streamlit run app.py` imports it once as a module and serves the `st.App` at the bottom; that
  import starts warming the server (torch, the default models and traces: viz/ui/warmup.py) while the first
  browser is still loading the frontend;
- every session runs it as its script (`__name__ == "__main__"`): `main()`, the language switch and
  the shared sidebar (model + input, chosen once for every page), then `st.navigation` over file pages
  (AppTest.switch_page reaches file pages only). Every page has an explicit `url_path`, the same in
  every language, so a shared link opens the same page for everyone.
"""

import sys
from pathlib import Path

import streamlit as st

from viz import i18n
from viz.i18n import N_, t
from viz.ui import classroom, failover, lm_models, warmup
from viz.ui.chrome import install_chrome_words, install_still_skeletons
from viz.ui.sidebar import sidebar
from viz.ui.state import install_history_patch
from viz.ui.task_help import task_help

ROOT = Path(__file__).parent
# `streamlit run app.py -- --model PATH [--model PATH2] [--dtype bfloat16] [--device cuda]`: real models this
# server offers beside the shipped ones (HF directories, .gguf files), loaded in that dtype / on that device.
# Only these paths: a browser names a model by its label, never a path.
lm_models.add_server_models(lm_models.parse_model_args(sys.argv[1:]), lm_models.parse_precision_args(sys.argv[1:]))
classroom.configure(sys.argv[1:])  # `-- --class-store redis://HOST:PORT/N`: a live class across machines (issue 41)
DEFAULT = "viz/pages/attention.py"  # opens at "/": the view that shows a Transformer thinking
SECTIONS = {  # section -> [(file, title, icon)]; url_path = the file's stem. A page appears once its file exists.
    N_("Learn"): [
        ("viz/pages/lessons.py", N_("Lessons"), ":material/school:"),
        ("viz/pages/architecture.py", N_("Architecture map"), ":material/account_tree:"),
        ("viz/pages/class.py", N_("Live class"), ":material/groups:"),
    ],
    N_("Look inside"): [
        ("viz/pages/tokens.py", N_("Tokens & embeddings"), ":material/text_fields:"),
        ("viz/pages/tokenizers.py", N_("Tokenizer playground"), ":material/content_cut:"),
        ("viz/pages/attention.py", N_("Attention"), ":material/grid_view:"),
        ("viz/pages/layer.py", N_("Inside a layer"), ":material/layers:"),
        ("viz/pages/padding.py", N_("A batch with padding"), ":material/view_week:"),
        ("viz/pages/decoder.py", N_("Step-by-step decoder"), ":material/step:"),
        ("viz/pages/pretrained.py", N_("Pretrained encoder"), ":material/psychology:"),
        ("viz/pages/llm.py", N_("Language model"), ":material/chat:"),
        ("viz/pages/phenomena.py", N_("Attention phenomena"), ":material/insights:"),
        ("viz/pages/flow.py", N_("Why this token?"), ":material/route:"),
        ("viz/pages/qk.py", N_("Q/K map"), ":material/scatter_plot:"),
        ("viz/pages/vision.py", N_("Attention over an image"), ":material/image:"),
        ("viz/pages/since2017.py", N_("What changed since 2017"), ":material/history:"),
    ],
    N_("Experiment"): [
        ("viz/pages/experiments.py", N_("Experiments"), ":material/science:"),
        ("viz/pages/schedule.py", N_("Learning-rate schedule"), ":material/show_chart:"),
        ("viz/pages/training.py", N_("Training, live"), ":material/model_training:"),
        ("viz/pages/learn.py", N_("Watch attention learn"), ":material/trending_down:"),
        ("viz/pages/snapshots.py", N_("Snapshots"), ":material/photo_camera:"),
    ],
}


_LOST = "_al_lost_path"  # st.session_state: the unknown address this run was redirected from


def requested_path() -> str:
    """The page address a freshly opened URL asks for ("" at the root, or when the run names its page by
    its hash: a sidebar click, st.switch_page)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    pages_manager = getattr(get_script_run_ctx(), "pages_manager", None)
    if pages_manager is None or pages_manager.intended_page_script_hash:
        return ""
    return (pages_manager.intended_page_name or "").strip("/")


def lost_note(path: str, default_title: str) -> str:
    shown = path.replace("`", "'")[:80]  # in a code span: the address as typed, never formatted
    if path == Path(DEFAULT).stem:  # links made before the Attention page moved to the root
        return t("The {page} page is the app's start page: its address is the app's root (/), not `/{path}`.",
                 page=default_title, path=shown)
    return t("There is no page at `/{path}`, so the app opened the {page} page. Every page is in the sidebar.",
             page=default_title, path=shown)


def main() -> None:
    # A local favicon: a :material/...: page icon is fetched from fonts.gstatic.com, and the app must work offline.
    st.set_page_config(page_title="Attention Lab", page_icon=str(ROOT / "viz/static/icon.png"), layout="wide")
    install_still_skeletons()  # before any element the browser must load: no skeleton shimmers (viz/ui/chrome.py)
    install_history_patch()  # before the first ?lang= write, so that write replaces the history entry
    failover.install()  # a tab whose replica died reloads its URL on the live one (viz/ui/failover.py)
    lang = i18n.language_switch()
    install_chrome_words(lang)  # Streamlit's own "Stop", "Running...", "Help for ..." in zh (viz/ui/chrome.py)
    classroom.enter_from_url()  # ?room=CODE&teacher=TOKEN / &seat=S: this session's place in a live class
    pages = {  # the default page's address is the root ("/"), so its stem is free for the alias below
        t(section): [st.Page(f, title=t(title), icon=icon, url_path="" if f == DEFAULT else Path(f).stem,
                             default=(f == DEFAULT)) for f, title, icon in entries if (ROOT / f).is_file()]
        for section, entries in SECTIONS.items()
    }
    # An address that names no page (an old /attention link, a typo) would get Streamlit's English "Page not
    # found" dialog: serve it a hidden page instead, which opens the default page with a note in the UI language.
    lost = requested_path()
    if lost and "/" not in lost and lost not in {p.url_path for ps in pages.values() for p in ps}:
        default_title = next(p.title for ps in pages.values() for p in ps if p.url_path == "")
        pages[next(iter(pages))].append(st.Page(lambda: None, title=default_title, url_path=lost,
                                                visibility="hidden"))
    else:
        lost = ""
    page = st.navigation({s: ps for s, ps in pages.items() if ps}, expanded=True)  # every page in view
    if lost and page.url_path == lost:
        st.session_state[_LOST] = lost
        st.switch_page(DEFAULT, query_params=st.query_params.to_dict())
    if st.session_state.get(_LOST):
        st.warning(lost_note(st.session_state.pop(_LOST), page.title), icon="🧭")
    if st.query_params.get("room") and not classroom.member() and page.url_path != "class":
        st.switch_page(classroom.CLASS_PAGE, query_params={k: st.query_params[k] for k in ("room", "lang")
                                                           if k in st.query_params})  # any page's &room= joins
    # A class member's strip (teacher: publish the view; student: follow it, answer), url path -> page file.
    files = {"" if f == DEFAULT else Path(f).stem: f for entries in SECTIONS.values() for f, _, _ in entries}
    classroom.bar(page.url_path, files)
    task_help(sidebar())  # the model's grammar, example sentences, out-of-grammar warnings
    try:
        page.run()
    finally:  # the view as this run left it (its URL parameters), for the room's followers
        classroom.publish(page.url_path)


if __name__ == "__main__":  # a session's script run
    with warmup.script_run():  # the server's warm-up pauses while a session's run is active (viz/ui/warmup.py)
        main()
else:  # `streamlit run app.py` imports this module once, to find the app to serve
    warmup.start()  # in the background, while the server starts and the first browser loads the frontend
    # + the replica boot id (viz/ui/failover.py) and a live class's version, which following tabs poll (classroom.py)
    app = st.App(__file__, routes=failover.routes() + classroom.routes())
