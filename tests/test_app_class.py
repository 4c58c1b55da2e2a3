"""/class (AppTest, issue 41): a teacher starts a room and asks a question, a student session joins, follows the
teacher's page and answers, and the teacher's results count the answer. Sessions share nothing but the store
(a SQLite file of this module's own, via $ATTENTION_LAB_CLASS_STORE)."""

from __future__ import annotations

import pytest
from conftest import assert_clean, open_page

from viz.classroom.store import open_store
from viz.ui.classroom import KEY

PAGE = "viz/pages/class.py"
LESSONS = "viz/pages/lessons.py"


@pytest.fixture(scope="module")
def room_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("class") / "rooms.sqlite3"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTENTION_LAB_CLASS_STORE", str(path))
        yield open_store(str(path))


def button(at, label: str):
    return next(b for b in at.button if b.label == label)


def test_teacher_student_question_and_follow(room_store):
    teacher = open_page(PAGE, query={"lang": "en"})
    assert_clean(teacher)
    button(teacher, "Start a room").click().run()
    assert_clean(teacher)
    me = teacher.session_state[KEY]
    code, token = me["room"], me["token"]
    assert room_store.is_teacher(code, token) and any(code in h.proto.body for h in teacher.get("html"))
    assert teacher.get("image"), "the QR code"

    # A student opens the join link on any page: the app takes them to /class's join form.
    student = open_page(None, query={"lang": "en", "room": code.lower()})
    assert_clean(student)
    student.text_input(key="class_nick").input("<b>Ann</b>")
    button(student, "Join").click().run()
    assert_clean(student)
    seat = student.session_state[KEY]["seat"]
    assert room_store.seat_ok(code, seat) and student.query_params["room"] == code
    assert "seat" not in student.query_params  # the seat stays in the browser (a cookie): a shared URL is no seat
    assert not [b for b in student.button if b.label in ("Reveal the answer", "Start a room")], "no teacher control"

    # The teacher asks a free question; the student's screen shows it and takes an answer.
    teacher.text_input(key="class_q_text").input("Which head looks back one token?")
    teacher.text_area(key="class_q_opts").input("head 1\nhead 3\nnone")
    teacher.number_input(key="class_q_right").set_value(2)
    button(teacher, "Ask").click().run()
    assert_clean(teacher)
    q = room_store.current_question(code)
    assert q.options == ["head 1", "head 3", "none"] and q.answer == 1
    student.run()
    radio = next(r for r in student.radio if r.key.startswith("class_q_"))
    radio.set_value(1).run()
    assert_clean(student)
    assert room_store.results(code, q.qid) == [0, 1, 0]
    teacher.run()
    assert any("1 of 1 joined have answered." in c.value for c in teacher.caption)
    chart = teacher.get("plotly_chart")[0].proto.spec
    assert '"x":[0,1,0]' in chart.replace(" ", "")
    button(teacher, "Reveal the answer").click().run()
    student.run()
    assert any("Right: head 3." in s.value for s in student.success)

    # The teacher opens lesson 4 (its URL state): the student's screen follows, over the lesson the student had.
    student.switch_page("viz/pages/lessons.py")
    student.query_params["lesson"] = "1"
    student.run()
    assert student.session_state["lesson_n"] == 1  # the student's own choice: it must not win over the teacher's
    teacher.switch_page("viz/pages/lessons.py")
    teacher.query_params["lesson"] = "4"
    teacher.run()
    assert_clean(teacher)
    version, state = room_store.get_state(code)
    assert state["page"] == "lessons" and state["params"]["lesson"] == "4" and "teacher" not in state["params"]
    student.run()
    assert_clean(student)
    assert student.session_state["lesson_n"] == 4 and student.query_params["lesson"] == "4"
    assert student.query_params["room"] == code and student.session_state[KEY]["seen"] == version
    # The teacher asks the lesson's own question: options and right answer as the lesson computed them.
    button(teacher, "Ask the room this question").click().run()
    q2 = room_store.current_question(code)
    assert q2.lesson == "sqrt-dk" and q2.answer is not None and q2.extra["feedback"]
    # A student who explores stays put while the teacher moves on, and rejoining brings the teacher's view back.
    student.run()
    button(student, "Explore on my own").click().run()
    assert not student.session_state[KEY]["following"]
    teacher.selectbox(key="lesson_n").set_value(6).run()  # the teacher picks lesson 6
    assert room_store.get_state(code)[1]["params"]["lesson"] == "6"
    student.run()
    assert student.session_state["lesson_n"] == 4
    button(student, "Rejoin the teacher").click().run()
    assert_clean(student)
    assert student.session_state[KEY]["following"] and student.session_state["lesson_n"] == 6


def test_leaving_makes_the_browser_forget_the_room(room_store):
    """Leave the room: the next run expires both class cookies (max-age 0) once, so this browser's next ?room=CODE
    is no longer the teacher (or a seat) for the room's idle time."""
    teacher = open_page(PAGE, query={"lang": "en"})
    button(teacher, "Start a room").click().run()
    code = teacher.session_state[KEY]["room"]
    button(teacher, "Leave the room").click().run()
    assert_clean(teacher)
    assert KEY not in teacher.session_state and "room" not in teacher.query_params
    expired = [h.proto.body for h in teacher.get("html") if "max-age=0" in h.proto.body]
    assert any("al_class_teacher" in b for b in expired) and any("al_class_seat" in b for b in expired), expired
    assert code in teacher.session_state["_al_class_left"]  # this session read its cookies when it connected
    teacher.run()  # written once
    assert not [h for h in teacher.get("html") if "max-age=0" in h.proto.body]


def test_forged_teacher_link_and_garbage_code(room_store):
    code, _ = room_store.create_room()
    at = open_page(None, query={"lang": "en", "room": code, "teacher": "forged"})
    assert not at.exception and any("Only the teacher of room" in w.value for w in at.warning)
    at.switch_page(PAGE).run()
    assert KEY not in at.session_state and not [b for b in at.button if b.label == "Ask"]
    assert "teacher" not in at.query_params  # the refused token is not kept in the address
    at = open_page(None, query={"lang": "en", "room": "<script>"})
    assert not at.exception and any("is not a room code" in w.value for w in at.warning)


def test_room_in_chinese(room_store):
    """The teacher's and a student's views in zh: no English sentence (the question is the teacher's own text)."""
    from test_i18n import english_in_zh

    teacher = open_page(PAGE, query={"lang": "zh"})
    button(teacher, "开一个房间").click().run()
    code, token = teacher.session_state[KEY]["room"], teacher.session_state[KEY]["token"]
    room_store.open_question(code, token, "哪个头看向前一个词？", ["头 1", "头 3"], answer=1)
    student = open_page(None, query={"lang": "zh", "room": code})
    button(student, "加入").click().run()
    teacher.run()
    for at in (teacher, student):
        assert_clean(at)
        assert not english_in_zh(at), english_in_zh(at)
    # The lesson plan in zh: the teacher's presented lesson with the plan's line and its buttons.
    teacher.multiselect(key="class_plan").select(4).select(9).run()
    button(teacher, "开始计划").click().run()
    teacher.switch_page(LESSONS).run()
    assert_clean(teacher)
    assert teacher.session_state["lesson_n"] == 4 and any("全班的课程计划" in c.value for c in teacher.caption)
    assert not english_in_zh(teacher), english_in_zh(teacher)


def test_lesson_plan_moves_the_room(room_store):
    """§6: the teacher picks a plan of two lessons on /class and starts it (presentation mode); the student follows
    to the first, the teacher's Next moves the room to the second, and the question the teacher asks there is
    answered on the student's lesson page, into the room."""
    teacher = open_page(PAGE, query={"lang": "en"})
    button(teacher, "Start a room").click().run()
    code = teacher.session_state[KEY]["room"]
    student = open_page(None, query={"lang": "en", "room": code})
    button(student, "Join").click().run()
    teacher.multiselect(key="class_plan").select(4).select(9).run()
    button(teacher, "Start the plan").click().run()
    assert_clean(teacher)
    assert teacher.session_state["lesson_n"] == 4 and teacher.session_state["lesson_present"]
    assert teacher.query_params["plan"] == "4.9" and any("1 of 2" in c.value for c in teacher.caption)
    # AppTest runs its own page on the next run (a browser stays where st.switch_page took it): go there too.
    teacher.switch_page(LESSONS)
    student.run()
    assert_clean(student)
    assert student.session_state["lesson_n"] == 4 and "present" not in student.query_params
    assert "plan" not in room_store.get_state(code)[1]["params"]  # the plan is the teacher's, not the room's view
    teacher.button(key="lesson_next").click().run()  # Next: the plan's next lesson (9), not lesson 5
    assert_clean(teacher)
    assert teacher.session_state["lesson_n"] == 9 and teacher.button(key="lesson_next").disabled
    button(teacher, "Ask the room this question").click().run()
    q = room_store.current_question(code)
    assert q.lesson == "noam" and q.answer is not None
    student.run()
    assert_clean(student)
    assert student.session_state["lesson_n"] == 9 and student.query_params["lesson"] == "9"
    student.switch_page(LESSONS).run()
    assert any("your answer goes to the room" in c.value for c in student.caption)
    radio = student.radio(key=f"class_q_{code}_{q.qid}p")  # on the page, and the lesson's own radio is not drawn
    assert radio.options == q.options and not [r for r in student.radio if r.key.startswith("lesson_q_")]
    radio.set_value(q.answer).run()
    assert room_store.results(code, q.qid)[q.answer] == 1
    teacher.button(key="lesson_prev").click().run()  # Previous: back to lesson 4
    assert teacher.session_state["lesson_n"] == 4
