"""A live class in a real browser (Chromium, issue 41): a teacher and three students, each in a browser context of
its own, one streamlit server with a SQLite room store of this module's own. The students join, two answer the
teacher's question and the teacher's screen counts them; the teacher reveals; the students follow the teacher to a
lesson; one explores on their own, stays put while the teacher moves on, and rejoins.

Run: pytest -m browser tests/test_browser_class.py
"""

from __future__ import annotations

import re

import pytest
from browser_support import PAGE_TIMEOUT_MS, ROOT, VIEWPORT, free_port, start_server, stop_server

pytestmark = pytest.mark.browser
WAIT = 60_000  # a poll is 1 s; a follow is one page run, on a shared, loaded 2-core machine


@pytest.fixture(scope="module")
def class_server(tmp_path_factory):
    proc = start_server(ROOT / "app.py", free_port(),
                        env={"ATTENTION_LAB_CLASS_STORE": str(tmp_path_factory.mktemp("class") / "rooms.sqlite3")})
    port = proc.args[proc.args.index("--server.port") + 1]
    yield f"http://127.0.0.1:{port}"
    stop_server(proc)


def new_page(browser):
    return browser.new_context(viewport={**VIEWPORT, "height": 1400}).new_page()


def test_teacher_and_three_students(class_server, browser):
    base = class_server
    teacher = new_page(browser)
    teacher.goto(base + "/class?lang=en", timeout=PAGE_TIMEOUT_MS)
    teacher.get_by_role("button", name="Start a room").click(timeout=PAGE_TIMEOUT_MS)
    big = teacher.locator("div[style*='font-size:7rem']")
    big.wait_for(timeout=PAGE_TIMEOUT_MS)
    code = big.inner_text().strip()
    assert re.fullmatch(r"[A-Z2-9]{6}", code)
    assert teacher.locator('[data-testid="stImage"] img').first.bounding_box()["width"] >= 400  # the QR code
    teacher.get_by_text("Your teacher link").click()
    teacher_link = teacher.locator('[data-testid="stCode"]').first.inner_text().strip()
    token = re.search(r"teacher=([\w-]+)", teacher_link).group(1)

    students = []
    for i in range(3):
        s = new_page(browser)
        s.goto(f"{base}/class?room={code}&lang=en", timeout=PAGE_TIMEOUT_MS)
        s.get_by_label("Nickname").fill(f"student {i}", timeout=PAGE_TIMEOUT_MS)
        s.get_by_role("button", name="Join").click()
        s.get_by_text("Your screen follows the teacher's.").wait_for(timeout=WAIT)
        assert s.get_by_role("button", name="Reveal the answer").count() == 0  # no teacher control
        students.append(s)
    teacher.get_by_text("3 joined. No question yet.").wait_for(timeout=WAIT)

    teacher.get_by_label("Question", exact=True).fill("Which head looks back one token?")
    teacher.get_by_label("Options, one per line").fill("head 1\nhead 3\nnone")
    teacher.get_by_label("The right option's number").fill("2")
    teacher.get_by_role("button", name="Ask", exact=True).click()
    for s, option in zip(students[:2], ("head 3", "head 1"), strict=True):
        s.get_by_text(option, exact=True).click(timeout=WAIT)
        s.get_by_text("Your answer is in:").wait_for(timeout=WAIT)
    teacher.get_by_text("2 of 3 joined have answered.").wait_for(timeout=WAIT)
    teacher.get_by_role("button", name="Reveal the answer").click()
    students[0].get_by_text("Right: head 3.").wait_for(timeout=WAIT)
    students[1].get_by_text("The right answer: head 3.").wait_for(timeout=WAIT)

    # The teacher opens lesson 4 (the teacher link works on any page): every student's screen follows.
    teacher.goto(f"{base}/lessons?lesson=4&lang=en&room={code}&teacher={token}", timeout=PAGE_TIMEOUT_MS)
    for s in students:
        s.wait_for_url(re.compile(r"/lessons\?.*lesson=4"), timeout=WAIT)
    assert "teacher=" not in teacher.url  # the token left the projected address bar
    explorer = students[2]
    explorer.get_by_role("button", name="Explore on my own").click(timeout=WAIT)
    explorer.get_by_role("button", name="Rejoin the teacher").wait_for(timeout=WAIT)
    teacher.get_by_role("button", name="Next →").click()
    for s in students[:2]:
        s.wait_for_url(re.compile(r"lesson=5"), timeout=WAIT)
    assert "lesson=4" in explorer.url  # exploring: not moved
    explorer.get_by_role("button", name="Rejoin the teacher").click()
    explorer.wait_for_url(re.compile(r"lesson=5"), timeout=WAIT)

    # The teacher asks the room this lesson's question: a following student answers it on the lesson page, under
    # the figure (the strip's poll reruns the page to draw it), into the room.
    teacher.get_by_role("button", name="Ask the room this question").click()
    s = students[0]
    main = s.locator('[data-testid="stMain"]')
    main.get_by_text("your answer goes to the room").wait_for(timeout=WAIT)
    main.locator('[role="radiogroup"] label').first.click()
    main.get_by_text("Your answer is in:").wait_for(timeout=WAIT)
