"""The live class's room store (viz/classroom/store.py, issue 41): the SAME tests on SQLite and on a real
redis-server that this module starts on a free port (Debian's redis-server; .ci/browser-setup.sh installs it; a
missing one fails the run, it does not skip). A fake clock drives idle expiry and the answer rate: no sleeping."""

import csv
import io
import shutil
import socket
import subprocess
import time

import pytest

from viz.classroom import store as cs
from viz.classroom.store import ClassError, open_store


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server; .ci/browser-setup.sh does)")
    port = _free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path_factory.mktemp("redis"))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    for _ in range(200):  # until it accepts connections (a fresh server: milliseconds; a loaded machine: more)
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path):
    clock = Clock()
    url = str(tmp_path / "rooms.sqlite3") if request.param == "sqlite" else request.getfixturevalue("redis_url")
    s = open_store(url, clock=clock)
    assert type(s) is {"sqlite": cs.SQLiteStore, "redis": cs.RedisStore}[request.param]  # the URL chose it
    s.test_clock = clock
    yield s
    s.close()


def test_room_follow_and_teacher_only(store):
    code, token = store.create_room()
    assert cs.CODE_RE.fullmatch(code) and len(token) >= 32
    assert store.is_teacher(code, token) and not store.is_teacher(code, token[:-1] + "x")
    assert store.is_teacher(code.lower(), token)  # a code typed in lower case is the same room
    v0, state = store.get_state(code)
    assert state == {}
    v1 = store.set_state(code, token, {"page": "llm", "params": {"layer": "3", "head": "2"}})
    assert v1 > v0 and store.version(code) == v1
    assert store.get_state(code) == (v1, {"page": "llm", "params": {"layer": "3", "head": "2"}})
    assert store.set_state(code, token, {"page": "llm", "params": {"head": "2", "layer": "3"}}) == v1  # unchanged
    with pytest.raises(ClassError, match="Only the teacher"):
        store.set_state(code, "not-the-token", {"page": "qk"})
    with pytest.raises(ClassError, match="Only the teacher"):
        store.open_question(code, "", "Q?", ["a", "b"])
    with pytest.raises(ClassError, match="too large"):
        store.set_state(code, token, {"page": "x" * (cs.MAX_STATE_BYTES + 1)})
    assert store.get_state(code)[1]["page"] == "llm"


def test_question_answers_reveal_and_csv(store):
    code, token = store.create_room()
    a, b, c = (store.join(code, n) for n in ("Ann", "<b>Bo</b>\x07", ""))
    assert store.joiners(code) == 3 and store.seat_ok(code, a) and not store.seat_ok(code, "forged")
    qid = store.open_question(code, token, "Which head?", ["head 1", "head 3", "=cmd()"], answer=1, lesson="12")
    assert store.current_question(code).qid == qid and store.current_question(code).lesson == "12"
    store.answer(code, a, qid, 0)
    store.answer(code, a, qid, 1)  # changed: still one answer
    store.answer(code, b, qid, 1)
    assert store.results(code, qid) == [0, 2, 0] and store.my_answer(code, a, qid) == 1
    with pytest.raises(ClassError, match="Join room"):
        store.answer(code, "forged-seat", qid, 0)  # nobody answers for a seat they do not hold
    with pytest.raises(ClassError, match="not one of"):
        store.answer(code, c, qid, 3)
    store.reveal(code, token, qid)
    with pytest.raises(ClassError, match="revealed"):
        store.answer(code, c, qid, 2)
    assert store.results(code, qid) == [0, 2, 0]
    assert store.names(code, qid) == {1: ["<b>Bo</b>", "Ann"]}  # kept as text; control characters dropped
    q2 = store.open_question(code, token, "Free one", ["yes", "no"])  # the teacher's own, no right answer
    store.answer(code, c, q2, 0)
    rows = list(csv.DictReader(io.StringIO(store.export_csv(code, token))))
    assert [(r["question"], r["option_text"], r["count"], r["right"]) for r in rows] == [
        ("1", "head 1", "0", "0"), ("1", "head 3", "2", "1"), ("1", "'=cmd()", "0", "0"),  # no formula in a sheet
        ("2", "yes", "1", ""), ("2", "no", "0", "")]
    assert "names" not in rows[0]  # names only when the teacher turned them on
    store.set_show_names(code, token, True)
    rows = list(csv.DictReader(io.StringIO(store.export_csv(code, token))))
    assert rows[1]["names"] == "<b>Bo</b>; Ann" and store.show_names(code)
    with pytest.raises(ClassError, match="Only the teacher"):
        store.export_csv(code, "")


def test_limits_and_bad_input(store):
    for garbage in ("", "abc", "K7QX2M0", "'; DROP TABLE rooms;--", "ÄÖÜ123", None):
        with pytest.raises(ClassError, match="is not a room code"):
            store.join(garbage)
    with pytest.raises(ClassError, match="no room"):
        store.join("ABCDEF")  # well formed, but no such room
    code, token = store.create_room()
    assert len(cs.clean_nick("x" * 100)) == cs.MAX_NICK
    with pytest.raises(ClassError, match="between 2"):
        store.open_question(code, token, "Q", ["only one"])
    with pytest.raises(ClassError, match="right answer"):
        store.open_question(code, token, "Q", ["a", "b"], answer=2)
    qid = store.open_question(code, token, "Q", ["a", "b"])
    seat = store.join(code)
    for i in range(cs.MAX_ANSWERS):
        store.answer(code, seat, qid, i % 2)
    with pytest.raises(ClassError, match="Too many answers"):
        store.answer(code, seat, qid, 0)
    assert store.results(code, qid) == [0, 1]  # the flood changed one answer, never added one
    store.test_clock.now += cs.RATE_WINDOW_S  # the next minute: answering works again
    store.answer(code, seat, qid, 0)


def test_full_room(store, monkeypatch):
    monkeypatch.setattr(cs, "MAX_SEATS", 3)
    code, _ = store.create_room()
    for _ in range(3):
        store.join(code)
    with pytest.raises(ClassError, match="is full"):
        store.join(code)
    assert store.joiners(code) == 3


def test_idle_expiry(store):
    code, token = store.create_room()
    store.test_clock.now += cs.IDLE_S - 1
    store.join(code)  # in time: renews the room
    store.test_clock.now += cs.IDLE_S - 1
    assert store.version(code) == 0
    store.test_clock.now += 2
    with pytest.raises(ClassError, match="has ended"):
        store.version(code)
    with pytest.raises(ClassError, match="no room"):  # and it is gone, not only refused
        store.join(code)


def test_two_stores_one_room(store, tmp_path):
    """Two replicas (two store objects on one file / one Redis) see one room: nothing lives in the process."""
    other = open_store(str(getattr(store, "path", "")) or store.url, clock=store.test_clock)
    code, token = store.create_room()
    seat = other.join(code, "Cy")
    qid = store.open_question(code, token, "Q", ["a", "b"])
    other.answer(code, seat, other.current_question(code).qid, 1)
    assert store.results(code, qid) == [0, 1]
    other.close()
