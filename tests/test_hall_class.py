"""A live class in the hall (issue 41 §4): `deploy/hall.sh up 2 --redis` starts a redis-server beside the replicas
and hands every replica its address, so a room is one room whichever replica a student's cookie pins them to.
HTTP through HAProxy: the version route (/_al/class/version) that following tabs poll, on each replica; then the
Done-when's failover case in Chromium: a replica killed between two students' answers loses neither."""

from __future__ import annotations

import os
import re
import sys
import urllib.request
from pathlib import Path

import pytest
from browser_support import PAGE_TIMEOUT_MS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import load  # noqa: E402  (bench/load.py: the hall helpers)

from viz.classroom.store import open_store  # noqa: E402

pytestmark = pytest.mark.slow
PORT = 8750  # the proxy; replicas on 8761, 8762, the redis-server on 8759 (test_hall.py's hall is on 8700)
BASE = f"http://127.0.0.1:{PORT}"
REDIS = f"redis://127.0.0.1:{PORT + 9}/0"


def get(path: str, replica: str) -> tuple[int, str]:
    """GET `path` through the proxy, pinned to `replica` (r1, r2) by the affinity cookie."""
    req = urllib.request.Request(BASE + path, headers={"Cookie": f"ATTNLAB={replica}"})
    with urllib.request.urlopen(req, timeout=20) as r:
        return r.status, r.read().decode()


@pytest.fixture(scope="module")
def hall():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTENTION_LAB_WARM_ANALYSES", "0")  # no lessons warmed, no language model: only routes are read
        mp.setenv("ATTENTION_LAB_WARM_LM", "0")
        mp.delenv("ATTENTION_LAB_CLASS_STORE", raising=False)  # hall.sh must give the replicas redis by itself
        load.hall("up", PORT, "2", "--redis")
    try:
        yield load.replica_pids(PORT)
    finally:
        load.hall("down", PORT)


def test_replicas_share_a_redis_store(hall):
    for pid in hall.values():  # each replica was started with the hall's redis-server as its class store
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"ATTENTION_LAB_CLASS_STORE={REDIS}".encode() in env
    store = open_store(REDIS)
    code, token = store.create_room()  # a room made in redis is seen by both replicas, at the same version
    assert {get(f"/_al/class/version?room={code}", r)[1] for r in ("r1", "r2")} == {str(store.version(code))}
    v = store.set_state(code, token, {"page": "lessons", "params": {"lesson": "4"}})  # the teacher moves
    assert [get(f"/_al/class/version?room={code}", r)[1] for r in ("r1", "r2")] == [str(v), str(v)]
    assert get("/_al/class/version?room=NOPE", "r1")[1] == "gone"
    # The projector's poll (&answers=1): one digest on both replicas, moved by an answer, and no counts in it.
    qid = store.open_question(code, token, "Which head?", ["head 1", "head 3"], answer=1)
    digest = f"/_al/class/version?room={code}&answers=1"
    before = {get(digest, r)[1] for r in ("r1", "r2")}
    assert len(before) == 1 and re.fullmatch(r"[0-9a-f]{16}", next(iter(before)))
    store.answer(code, store.join(code, "a"), qid, 0)
    assert {get(digest, r)[1] for r in ("r1", "r2")} - before
    status, body = get("/class?room=" + code, "r2")  # the page itself is served (the app's HTML) through the proxy
    assert status == 200 and "<html" in body.lower()


@pytest.mark.browser
def test_a_replica_killed_between_the_answers_loses_none(hall, browser):
    """The Done-when's failover case: two students (Chromium contexts) pinned to r1 and r2 answer one question; r2 is
    killed (SIGKILL) between the answers; the second student's tab comes back on r1 with the same seat (its cookie) and
    answers there. Both answers are in the room (no replica held any of them), and the teacher's screen (on r1)
    counts both."""
    store = open_store(REDIS)
    code, token = store.create_room()
    qid = store.open_question(code, token, "Which head looks back one token?", ["head 1", "head 3"], answer=1)
    pages = {}

    def pinned(replica: str):
        ctx = browser.new_context(viewport={"width": 1400, "height": 1400})
        ctx.add_cookies([{"name": "ATTNLAB", "value": replica, "url": BASE}])  # HAProxy's affinity cookie
        return ctx.new_page()

    teacher = pinned("r1")  # the projector: its count comes from the store, whichever replica took an answer
    teacher.goto(f"{BASE}/class?room={code}&teacher={token}&lang=en", timeout=PAGE_TIMEOUT_MS)
    teacher.get_by_text("0 of 0 joined have answered.").wait_for(timeout=60_000)
    for replica in ("r1", "r2"):
        pg = pages[replica] = pinned(replica)
        pg.goto(f"{BASE}/class?room={code}&lang=en", timeout=PAGE_TIMEOUT_MS)
        pg.get_by_role("button", name="Join").click(timeout=PAGE_TIMEOUT_MS)
        pg.get_by_text("Which head looks back one token?").wait_for(timeout=60_000)
    pages["r1"].get_by_text("head 3", exact=True).click()
    pages["r1"].get_by_text("Your answer is in:").wait_for(timeout=60_000)
    assert "seat=" not in pages["r2"].url  # the seat is the browser's (a cookie), never in a URL one could share
    seat_r2 = next(c["value"] for c in pages["r2"].context.cookies() if c["name"] == "al_class_seat").split(":")[1]
    pages["r2"].evaluate("window.__beforeKill = true")  # gone once the tab reloads: the dead page's DOM stays up
    load.kill_replica(PORT, "r2")
    pages["r2"].wait_for_function("!window.__beforeKill", timeout=60_000)
    # The tab's failover script reloads its URL (the room) on the live replica: its cookie, the same seat.
    pages["r2"].get_by_text("Which head looks back one token?").wait_for(timeout=60_000)
    pages["r2"].get_by_text("head 1", exact=True).click(timeout=60_000)
    pages["r2"].get_by_text("Your answer is in:").wait_for(timeout=60_000)
    assert store.results(code, qid) == [1, 1]
    assert store.my_answer(code, seat_r2, qid) == 0  # the answer went to the seat the student had on r2
    teacher.get_by_text("2 of 2 joined have answered.").wait_for(timeout=60_000)  # the teacher's screen: both
    for pg in [teacher, *pages.values()]:
        pg.context.close()


def test_down_stops_the_redis_server(hall):
    import socket

    pid = int((load.hall_run_dir(PORT) / "redis.pid").read_text())
    load.hall("down", PORT)
    with socket.socket() as s:
        s.settimeout(1)
        assert s.connect_ex(("127.0.0.1", PORT + 9)) != 0
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert not os.path.exists(load.hall_run_dir(PORT) / "redis.pid")
