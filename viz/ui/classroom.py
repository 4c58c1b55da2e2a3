"""A live class's Streamlit glue (issue 41): who this session is in a room, the teacher publishing their view, a
student following it, and a question on a student's screen. The room itself is in the store
(viz/classroom/store.py): this module keeps only this session's membership in `st.session_state`.

Following is a poll: a fragment (`run_every=POLL_S`) on every page reads the room's version number, one small read;
when the teacher's view changed, it reads the state (the page and its URL parameters, a few hundred bytes), drops
this session's URL-seeded widget values (state.forget_view) and switches to that page with those parameters, so each
widget seeds from the teacher's URL. No figure travels: the follower's server session draws its own.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import streamlit as st

from viz.classroom.store import ENV, ClassError, ClassStore, Question, normalize_code, open_store
from viz.i18n import t
from viz.ui.state import forget_view, write_query

POLL_S = 1.0  # a follower's poll: the teacher's change reaches it within this (plus a run)
PUBLISH_S = 2.0  # the teacher's own poll, for URL changes a page's fragment made without a full run
KEY = "_al_class"  # st.session_state: {"room", "role": "teacher"|"student", "token" | "seat", "following", "seen"}
PRIVATE = ("room", "teacher", "seat", "lang", "present", "plan")  # URL parameters that are the session's own, not
# the view: a student's screen is not in presentation mode, and the lesson plan is the teacher's to move
PLAN_PARAM = "plan"  # the teacher's lessons page: `?plan=4.9.12`, the lessons the room goes through, in order
LESSONS_PAGE = "viz/pages/lessons.py"
CLASS_PAGE = "viz/pages/class.py"
PAGES = "_al_class_pages"  # st.session_state: url path -> page file (app.py's), for /class's own strip


TEACHER_COOKIE = "al_class_teacher"  # "CODE:TOKEN" in the teacher's browser: a reload (or a failover) keeps the role
# without the secret link, which leaves the address bar once opened. Set by the page's script (SameSite=Strict, this
# origin only, for the room's idle time); checked against the store like the link's token.
SEAT_COOKIE = "al_class_seat"  # "CODE:SEAT" in a student's browser: a reload or a failover takes the same seat back.
# Never in the URL: a student who shares their address shares the room's code, not their seat (their answers).
_SET_COOKIE = """<script>document.cookie = %s + "=" + %s + "; path=/; max-age=%d; SameSite=Strict";</script>"""
ROUTE = "/_al/class/version"  # ?room=CODE -> the room's version number, or "gone": what a follower's tab polls
SYNC = "class_sync"  # the hidden button the tab's poller clicks when the room's version moved (a fragment rerun)
# The follower's poll runs in the browser: one small HTTP read a second, no script run. Only when the room's version
# differs from the one this strip drew does it click the hidden button, which reruns the strip's fragment (follow the
# teacher, redraw the question). Installed once per tab (window.__alClass); each redraw updates the version it knows.
_POLLER = """<script>
(() => {
  const c = window[%(name)s] = window[%(name)s] || {};
  c.room = %(room)s; c.seen = %(seen)s; c.asked = null;
  if (c.timer) return;
  const button = () => document.querySelector(".st-key-%(key)s button");
  c.timer = setInterval(async () => {
    if (%(only_with_button)s && !button()) return;  // not on the page that draws it now (or mid-redraw): no read
    try {
      const url = %(route)s + "?%(query)sroom=" + encodeURIComponent(c.room);
      const r = await fetch(url, {cache: "no-store", credentials: "same-origin"});
      const v = (await r.text()).trim();
      const b = button();
      if (v !== String(c.seen) && v !== c.asked && b) { c.asked = v; b.click(); }
    } catch (e) { /* a replica going away: the failover script handles it */ }
  }, %(ms)d);
})();
</script>
<style>.st-key-%(key)s { display: none; }</style>"""


def poller(name: str, room: str, seen, key: str, every_s: float, query: str = "",
           only_with_button: bool = False) -> None:
    """The tab's poll (installed once per tab as window[name]; each redraw updates what it last drew, `seen`): an
    HTTP read of ROUTE every `every_s`, and a click on the hidden button `key` (a fragment rerun) only when the
    answer differs from `seen`."""
    st.html(_POLLER % {"name": json.dumps(name), "room": json.dumps(room), "seen": json.dumps(str(seen)),
                       "key": key, "route": json.dumps(ROUTE), "query": query, "ms": int(every_s * 1000),
                       "only_with_button": json.dumps(only_with_button)}, unsafe_allow_javascript=True)


RESULTS_SYNC = "class_results_sync"  # the projector's hidden button: a click reruns the results fragment
RESULTS_POLL_S = 0.25  # the projector's poll (one teacher's tab; an HTTP read, no script run unless it changed)
# The teacher's results: the same poll as a follower's (poller), on answers_digest; while the tab is not on /class
# (no button) it reads nothing.


def results_poller(code: str) -> None:
    """In the projector's results fragment: the hidden button and the poll that clicks it when the answers moved
    (the time from a student's answer to the projector: one poll, RESULTS_POLL_S, plus one fragment run)."""
    st.button("↻", key=RESULTS_SYNC)
    try:
        drawn = answers_digest(code)
    except ClassError:
        drawn = "gone"
    poller("__alResults", code, drawn, RESULTS_SYNC, RESULTS_POLL_S, query="answers=1&", only_with_button=True)


def answers_digest(room: str) -> str:
    """What the projector's results show, as an opaque digest: the version, the current question, its counts and
    the joiners. The teacher's tab polls it (`&answers=1`) and redraws the results only when it changed; a digest,
    so a student who polls it learns nothing of the room's answers before the reveal."""
    s = store()
    q = s.current_question(room)
    seen = [s.version(room), s.joiners(room), *((q.qid, q.revealed, *s.results(room, q.qid)) if q else ())]
    return hashlib.blake2b(repr(seen).encode(), digest_size=8).hexdigest()


def routes() -> list:
    """The version route for `st.App(routes=...)`: no session, no script run; the store read off the event loop.
    `?room=CODE`: the room's version (a follower's poll); `&answers=1`: answers_digest (the projector's poll)."""
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    def read(room: str, answers: bool) -> str:
        try:
            return answers_digest(room) if answers else str(store().version(room))
        except ClassError:
            return "gone"

    async def version(request) -> PlainTextResponse:
        q = request.query_params
        text = await run_in_threadpool(read, q.get("room", ""), q.get("answers") == "1")
        return PlainTextResponse(text, headers={"Cache-Control": "no-store"})

    return [Route(ROUTE, version)]


def configure(argv: list[str]) -> None:
    """`streamlit run app.py -- --class-store redis://HOST:PORT/N` (or `--class-store=...`): this server's rooms live
    there; else $ATTENTION_LAB_CLASS_STORE, else SQLite in the lab's cache folder."""
    it = iter(argv)
    for a in it:
        if a == "--class-store":
            url = next(it, None)
        elif a.startswith("--class-store="):
            url = a.split("=", 1)[1]
        else:
            continue
        if url:
            os.environ[ENV] = url


@st.cache_resource(show_spinner=False)
def _store(url: str) -> ClassStore:
    return open_store(url or None)  # a connection (pool) per process; the rooms are in the store, not here


def store() -> ClassStore:
    return _store(os.environ.get(ENV, ""))


def error(e: ClassError) -> None:
    st.warning(t(e.msg, **e.fmt), icon="🏫")


def member() -> dict | None:
    return st.session_state.get(KEY)


def is_teacher() -> bool:
    m = member()
    return bool(m and m["role"] == "teacher")


def enter_from_url() -> None:
    """A link with `?room=CODE&teacher=TOKEN` makes this session the room's teacher (the token then leaves the
    address bar, which a projector shows); on `?room=CODE` alone, this browser's cookies (TEACHER_COOKIE, SEAT_COOKIE)
    bring back its teacher role or its seat (a reload, a failover). A wrong token is said once and ignored; a seat
    in the URL (an old link, a shared one) is never taken."""
    forget_left()
    room, token = (st.query_params.get(k) for k in ("room", "teacher"))
    if "seat" in st.query_params:
        write_query(seat=None)
    if not room:
        return
    m = member()
    seat = None
    try:
        code = normalize_code(room)
        if not token and not (m and m["room"] == code) and code not in st.session_state.get(LEFT, ()):
            token = _cookie(TEACHER_COOKIE, code)  # this browser's own teacher cookie for this room, if any
            if token and not store().is_teacher(code, token):
                token = None  # a stale cookie (another room's token, an ended room): a student's way in
            seat = None if token else _cookie(SEAT_COOKIE, code)
        if token:
            if not store().is_teacher(code, token):
                raise ClassError("Only the teacher of room {code} can do this.", code=code)
            st.session_state[KEY] = {"room": code, "role": "teacher", "token": token}
            write_query(teacher=None, room=code)
        elif seat and store().seat_ok(code, seat):
            st.session_state[KEY] = {"room": code, "role": "student", "seat": seat, "following": True, "seen": -1}
    except ClassError as e:
        error(e)
        write_query(room=None, teacher=None, seat=None)


def _cookie(name: str, code: str) -> str | None:
    """This browser's secret for room `code` in cookie `name` ("CODE:SECRET"), or None."""
    try:
        raw = st.context.cookies.get(name)
    except Exception:  # no request behind this session: no cookie
        return None
    if not isinstance(raw, str):  # none, or AppTest's stand-in for a request it does not have
        return None
    room, _, token = raw.partition(":")
    return token if room == code and token else None


def _remember(m: dict) -> None:
    """This member's cookie (the teacher's token or the student's seat), written by the page's script in the room's
    strip (the same element every run: the browser runs it once, when it first appears)."""
    from viz.classroom.store import IDLE_S

    name, secret = (TEACHER_COOKIE, m["token"]) if m["role"] == "teacher" else (SEAT_COOKIE, m["seat"])
    st.html(_SET_COOKIE % (json.dumps(name), json.dumps(f"{m['room']}:{secret}"), int(IDLE_S)),
            unsafe_allow_javascript=True)


def start_room() -> str:
    code, token = store().create_room()
    st.session_state[KEY] = {"room": code, "role": "teacher", "token": token}
    return code


def join(code: str, nickname: str) -> None:
    code = normalize_code(code)
    seat = store().join(code, nickname)
    st.session_state[KEY] = {"room": code, "role": "student", "seat": seat, "following": True, "seen": -1,
                             "nick": nickname}


LEFT = "_al_class_left"  # st.session_state: rooms this session left; their cookies are expired on the next run


def leave() -> None:
    """Leave the room, and make this browser forget it: its cookie would otherwise make the next `?room=CODE` the
    teacher (or the seat) again for the room's idle time. The cookie is expired by the next run's script
    (forget_left); this session also ignores it, since it read its cookies when it connected."""
    m = st.session_state.pop(KEY, None)
    if m:
        st.session_state.setdefault(LEFT, set()).add(m["room"])
        st.session_state[LEFT + "_expire"] = True
    write_query(room=None, seat=None, teacher=None)


def forget_left() -> None:
    """After a leave, the script that expires both of this browser's class cookies (max-age 0), once."""
    if st.session_state.pop(LEFT + "_expire", False):
        for name in (TEACHER_COOKIE, SEAT_COOKIE):
            st.html(_SET_COOKIE % (json.dumps(name), json.dumps(""), 0), unsafe_allow_javascript=True)


def view_state(page: str) -> dict:
    """What the teacher's screen shows, as a follower needs it: the page's address and its URL parameters."""
    params = {k: st.query_params.get(k) for k in st.query_params if k not in PRIVATE}
    return {"page": page, "params": params}


def publish(page: str) -> None:
    """The teacher's view into the room (a write only when it changed). Called after every full run (app.py) and by
    the teacher's poll (a page's fragment can change the URL without a full run)."""
    m = member()
    if not m or m["role"] != "teacher":
        return
    state = view_state(page)
    if state == m.get("published"):
        return
    try:
        store().set_state(m["room"], m["token"], state)
        m["published"] = state
    except ClassError:
        pass  # the room has ended: the bar says so on its next run


def follow(pages: dict[str, str]) -> None:
    """A follower's step: when the room's version moved, switch to the teacher's page with the teacher's URL
    parameters (`pages`: url path -> page file; a page this app does not have is not followed)."""
    m = member()
    version, state = store().get_state(m["room"])
    m["seen"] = version
    target = pages.get(state.get("page"))
    if target is None or state == m.get("followed"):  # a question or a reveal moved the version, not the view
        return
    m["followed"] = state
    params = {str(k): str(v) for k, v in (state.get("params") or {}).items() if k not in PRIVATE}
    params["room"] = m["room"]
    if lang := st.query_params.get("lang"):
        params["lang"] = lang  # the student's own language
    forget_view()
    st.switch_page(target, query_params=params)


def bar(page: str, pages: dict[str, str]) -> None:
    """The room's strip in the sidebar, on every page, for a member: the teacher's poll (publishing) or the
    student's (following, the current question)."""
    m = member()
    if not m:
        return
    if m["role"] == "teacher":  # publishes after the page ran (app.py), not before: the URL is then final
        if st.query_params.get("room") != m["room"]:
            write_query(room=m["room"])  # the public code (the projector shows it): a reload finds the room, and
            # the teacher cookie (TEACHER_COOKIE) the role
        with st.sidebar:
            _teacher_bar(page)
    else:
        st.session_state[PAGES] = pages
        if not _fragment_rerun():  # the lesson the page is about to draw (its URL's), whose question it answers
            m["lesson_here"] = _url_lesson() if page == "lessons" else None
        if st.query_params.get("room") != m["room"]:
            # a reload (or a failover to another replica, which reloads this URL) finds the room here and the seat
            # in this browser's cookie (SEAT_COOKIE), never in the address
            write_query(room=m["room"])
        if page != "class":  # /class draws the strip itself, in the page (one poll per follower, not two)
            with st.sidebar:
                _student_bar(page, pages)


def _url_lesson() -> str | None:
    from viz.lessons import LESSONS

    raw = st.query_params.get("lesson", "")
    return LESSONS[int(raw) - 1].slug if raw.isdigit() and 1 <= int(raw) <= len(LESSONS) else None


def _fragment_rerun() -> bool:
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    return bool(getattr(get_script_run_ctx(), "fragment_ids_this_run", None))


@st.fragment(run_every=PUBLISH_S)
def _teacher_bar(page: str) -> None:
    m = member()
    _remember(m)
    if _fragment_rerun():  # in a full run the page has not run yet: its URL is the last one (app.py publishes after)
        publish(page)
    try:
        n = store().joiners(m["room"])
    except ClassError as e:
        error(e)
        return
    st.markdown(t("**Room {code}** · teacher · {n} joined", code=m["room"], n=n))
    if page != "class":
        st.page_link(CLASS_PAGE, label=t("Room, questions and results"), icon=":material/groups:")


@st.fragment
def _student_bar(page: str, pages: dict[str, str]) -> None:
    student_strip(pages)


def student_strip(pages: dict[str, str] | None = None) -> None:
    """A student's poll, run as a fragment every POLL_S: the room's version (follow the teacher when it moved), the
    follow / explore buttons, and the current question."""
    pages = pages if pages is not None else st.session_state.get(PAGES, {})
    m = member()
    try:
        version = store().version(m["room"])
    except ClassError as e:
        error(e)
        if st.button(t("Leave the room"), key="class_leave"):
            leave()
            st.rerun()
        return
    st.markdown(t("**Room {code}**", code=m["room"]))
    _remember(m)  # the seat, for a reload or a failover
    st.button("↻", key=SYNC)  # hidden (the poller's CSS); its click reruns this fragment
    poller("__alClass", m["room"], version, SYNC, POLL_S)
    if m["following"]:
        if version != m["seen"]:
            follow(pages)  # switches page (a full run) unless the teacher's page is not one this app has
        st.caption(t("Your screen follows the teacher's."))
        st.button(t("Explore on my own"), key="class_explore", icon=":material/explore:", on_click=_following,
                  args=(False,))
    else:
        st.caption(t("You are exploring on your own; the teacher's view goes on without you."))
        # Rejoin: the run after this click finds seen = -1 and switches to the teacher's view.
        st.button(t("Rejoin the teacher"), key="class_rejoin", icon=":material/groups:", type="primary",
                  on_click=_following, args=(True,))
    question_box()


def ask_lesson(slug: str, question: str, options: list[str], answer: int | None, feedback: str) -> None:
    """On a lesson, for a room's teacher: ask the room this question (the options and the right one as the lesson
    computed them from the model; the feedback, the model's numbers behind the answer, shown at the reveal)."""
    m = member()
    if not m or m["role"] != "teacher":
        return
    if st.button(t("Ask the room this question"), key=f"class_ask_{slug}", icon=":material/groups:"):
        try:
            qid = store().open_question(m["room"], m["token"], question, options, answer, lesson=slug,
                                        extra={"feedback": feedback})
            st.caption(t("Asked as question {n}: the answers come in on the Live class page.", n=qid))
        except ClassError as e:
            error(e)


def _following(on: bool) -> None:  # a button's callback: it runs before the (fragment's) rerun the click makes
    m = member()
    if m:
        m["following"], m["seen"], m["followed"] = on, -1, None  # rejoin: back to the teacher's view, whatever it is


def question_box() -> None:
    """The room's current question on a student's screen: options, their answer (changeable until the reveal), and
    after the reveal the right answer and the model's numbers behind it. A question the teacher asked from the
    lesson this student's page shows is answered on the page, under the lesson's figure (lesson_question); when it
    is new or revealed, this strip's poll reruns the whole page so the page draws it."""
    m = member()
    try:
        q = store().current_question(m["room"])
    except ClassError as e:
        error(e)
        return
    if q is None:
        return
    if q.lesson and q.lesson == m.get("lesson_here"):
        if _fragment_rerun() and m.get("page_q") != (q.qid, q.revealed):
            st.rerun()  # the page (drawn before this question or its reveal) draws it now
        st.caption(t("The teacher asked the room this lesson's question: answer it on the page."))
        return
    st.markdown(t("**Question {n}:** {text}", n=q.qid, text=q.text.replace("\n", " ")))
    answer_box(q)


def lesson_question(slug: str) -> bool:
    """On a lesson, for a student of a room: when the room's current question is this lesson's (the teacher asked
    it), draw it here, answered into the room, and say True (the page then draws no answer of its own)."""
    m = member()
    if not m or m["role"] != "student":
        return False
    m["lesson_here"] = slug
    try:
        q = store().current_question(m["room"])
    except ClassError:
        return False  # the strip says why
    if q is None or q.lesson != slug:
        return False
    m["page_q"] = (q.qid, q.revealed)
    st.caption(t("Your teacher asked the room this question ({n}): your answer goes to the room.", n=q.qid))
    answer_box(q, "p")
    return True


def answer_box(q: Question, where: str = "") -> None:
    """The answer buttons (`where`: a key suffix, so the page's and the strip's never clash in one run)."""
    m = member()
    mine = store().my_answer(m["room"], m["seat"], q.qid)
    if q.revealed:
        _revealed(q, mine)
        return
    choice = st.radio(t("Your answer"), range(len(q.options)), index=mine, format_func=lambda i: q.options[i],
                      key=f"class_q_{m['room']}_{q.qid}{where}", label_visibility="collapsed")
    if choice is not None and choice != mine:
        try:
            store().answer(m["room"], m["seat"], q.qid, int(choice))
            mine = choice
        except ClassError as e:
            error(e)
    if mine is not None:
        st.caption(t("Your answer is in: {option}. You can change it until the teacher reveals the answer.",
                     option=q.options[mine]))


def _revealed(q: Question, mine: int | None) -> None:
    if q.answer is None:
        st.caption(t("The teacher has closed this question."))
    elif mine == q.answer:
        st.success(t("Right: {option}.", option=q.options[q.answer]), icon="✅")
    else:
        st.info(t("The right answer: {option}.", option=q.options[q.answer]), icon="💡")
    if q.extra.get("feedback"):
        st.caption(q.extra["feedback"])


def room_link(code: str, **params: Any) -> str:
    """The address of /class for this room, on this server (st.context.url; a relative one in tests)."""
    base = (st.context.url or "").split("?")[0].rstrip("/")
    base = base.rsplit("/", 1)[0] if base.endswith("/class") else base
    query = "&".join(f"{k}={v}" for k, v in {"room": code, **params}.items())
    return f"{base}/class?{query}"
