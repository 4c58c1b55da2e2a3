"""/class: a live class (issue 41). The teacher starts a room (a code, a join link and its QR code, large enough
for a projector), asks questions and shows the room's answers; a student joins with `?room=CODE` and follows the
teacher (the strip in the sidebar, viz/ui/classroom.py, on every page). The room lives in the store
(viz/classroom/store.py), never in this process."""

from __future__ import annotations

import io

import segno
import streamlit as st

from viz.classroom.store import MAX_NICK, MAX_OPTIONS, ClassError
from viz.figures.classroom import results_figure
from viz.i18n import option_labels, t
from viz.ui import classroom as C
from viz.ui.state import forget_view
from viz.ui.text import md_escape


def qr_png(link: str) -> bytes:
    buf = io.BytesIO()
    segno.make(link, error="m").save(buf, kind="png", scale=12, border=2)  # ~ 400 px: readable across a room
    return buf.getvalue()


def landing() -> None:
    start, join = st.columns(2, gap="large")
    with start:
        st.subheader(t("Teach"))
        st.caption(t("Start a room: students join with its code or QR code, and their screens follow yours."))
        if st.button(t("Start a room"), key="class_start", type="primary", icon=":material/co_present:"):
            try:
                C.start_room()
            except ClassError as e:
                C.error(e)
                return
            st.rerun()
    with join:
        join_form(st.query_params.get("room", ""))


def join_form(code: str) -> None:
    st.subheader(t("Join a room"))
    with st.form("class_join"):
        raw = st.text_input(t("Room code"), value=code, max_chars=16, key="class_code")
        nick = st.text_input(t("Nickname (optional; the teacher sees it only if names are turned on)"),
                             max_chars=MAX_NICK, key="class_nick")
        if st.form_submit_button(t("Join"), type="primary"):
            try:
                C.join(raw, nick)
            except ClassError as e:
                C.error(e)
                return
            st.rerun()


def teacher() -> None:
    m = C.member()
    code, token = m["room"], m["token"]
    link = C.room_link(code)
    left, right = st.columns(2, gap="large")
    with left:
        st.html(f"<div style='font-size:7rem;font-weight:700;letter-spacing:.3rem;line-height:1.1'>{code}</div>")
        st.markdown(t("Join at **{link}**, or scan the code.", link=md_escape(link)))
        with st.expander(t("Your teacher link (keep it private: it gives the teacher's controls)")):
            st.code(C.room_link(code, teacher=token), language=None)
        st.toggle(t("Show names"), key="class_names", value=C.store().show_names(code),
                  on_change=lambda: C.store().set_show_names(code, token, st.session_state["class_names"]))
    with right:
        st.image(qr_png(link), width=420)
    lesson_plan(code)
    ask(code, token)
    results(code, token)
    if st.button(t("Leave the room"), key="class_leave_t"):
        C.leave()
        st.rerun()


def lesson_plan(code: str) -> None:
    """The teacher picks lessons in order; "Start the plan" opens the first in presentation mode, and the lessons
    page's Previous / Next (← / →) then move the room through them (viz/pages/lessons.py, `?plan=`)."""
    from viz.lessons import LESSONS

    with st.container(border=True):
        st.markdown(t("**A lesson plan**"))
        numbers = list(range(1, len(LESSONS) + 1))
        picked = st.multiselect(t("Lessons for the room, in the order you pick them"), numbers, key="class_plan",
                                format_func=option_labels(numbers, lambda i: f"{i}. {t(LESSONS[i - 1].title)}"))
        if st.button(t("Start the plan"), key="class_plan_start", type="primary", disabled=not picked,
                     icon=":material/slideshow:"):
            forget_view()  # the first lesson's own state, not what this session last had on the lessons page
            st.session_state["lesson_n"] = picked[0]
            query = {"lesson": picked[0], "present": 1, C.PLAN_PARAM: ".".join(map(str, picked)), "room": code}
            if lang := st.query_params.get("lang"):
                query["lang"] = lang
            st.switch_page(C.LESSONS_PAGE, query_params=query)


def ask(code: str, token: str) -> None:
    with st.form("class_ask", clear_on_submit=True):
        st.markdown(t("**Ask the room a question**"))
        text = st.text_input(t("Question"), key="class_q_text")
        opts = st.text_area(t("Options, one per line (2 to {n})", n=MAX_OPTIONS), key="class_q_opts", height=120)
        right = st.number_input(t("The right option's number (0: none, a poll)"), 0, MAX_OPTIONS, 0,
                                key="class_q_right")
        if st.form_submit_button(t("Ask"), type="primary"):
            try:
                C.store().open_question(code, token, text, opts.splitlines(), int(right) - 1 if right else None)
            except ClassError as e:
                C.error(e)


@st.fragment
def results(code: str, token: str) -> None:
    """The projector's live results. Redrawn when the tab's poll sees the answers move (C.results_poller: an HTTP
    read every 0.25 s, no script run while nothing changes), not on a timer: an answer is on the projector within
    one poll and one run of this fragment."""
    C.results_poller(code)  # first: the digest it draws is never newer than the counts read below
    s = C.store()
    if (e := st.session_state.pop("_class_error", None)) is not None:
        C.error(e)
    try:
        q = s.current_question(code)
        joined = s.joiners(code)
    except ClassError as e:
        C.error(e)
        return
    if q is None:
        st.caption(t("{n} joined. No question yet.", n=joined))
        return
    counts = s.results(code, q.qid)
    st.markdown(t("**Question {n}:** {text}", n=q.qid, text=md_escape(q.text)))
    st.caption(t("{a} of {n} joined have answered.", a=sum(counts), n=joined))
    st.plotly_chart(results_figure(q.options, counts, q.answer, q.revealed), key=f"class_results_{q.qid}",
                    config={"displayModeBar": False})
    if s.show_names(code):
        for opt, names in sorted(s.names(code, q.qid).items()):
            st.text(f"{opt + 1}. " + ", ".join(names))  # plain text: a nickname is never markdown or HTML
    cols = st.columns(2)
    if not q.revealed:  # a callback: the click's own rerun then draws the frozen counts
        cols[0].button(t("Reveal the answer") if q.answer is not None else t("Close the question"),
                       key=f"class_reveal_{q.qid}", type="primary", on_click=reveal, args=(code, token, q.qid))
    else:
        cols[0].success(t("Revealed: {option}.", option=q.options[q.answer]) if q.answer is not None
                        else t("Closed."), icon="✅")
        if q.extra.get("feedback"):
            st.caption(q.extra["feedback"])
    cols[1].download_button(t("Download the results (CSV)"), s.export_csv(code, token), f"class-{code}.csv",
                            "text/csv", key="class_csv")


def reveal(code: str, token: str, qid: int) -> None:
    try:
        C.store().reveal(code, token, qid)
    except ClassError as e:
        st.session_state["_class_error"] = e  # shown by the run this click starts


def student() -> None:
    m = C.member()
    st.markdown(t("You are in room **{code}**.", code=m["room"]))
    if m.get("nick"):
        st.text(t("Your nickname: {nick}", nick=m["nick"]))  # plain text, as every nickname
    strip()


@st.fragment
def strip() -> None:  # the student's poll, here in the page: follow the teacher, the current question
    C.student_strip()


def main() -> None:
    st.title(t("Live class"))
    m = C.member()
    if m and m["role"] == "teacher":
        teacher()
    elif m:
        student()
    elif st.query_params.get("room"):
        join_form(st.query_params.get("room"))
    else:
        landing()


main()
