"""A live class's room, behind one small interface: `open_store(url)` gives a `ClassStore` that pages read and
write through (issue 41). No Streamlit here, and no room in process memory: every call goes to the store, so any
replica (or a replica that replaced a killed one) sees the same room.

- SQLite (the default): one file, `$ATTENTION_LAB_CACHE/class/rooms.sqlite3` else `~/.cache/attention-lab/class/`
  (the lab's cache folder, as the GGUF and Gemma 3 caches use), shared by every replica on this machine (WAL mode).
- Redis (`redis://HOST:PORT/N`): a room that spans machines. Keys are `al:class:{CODE}:...`, each with a TTL that
  every write renews, so an idle room is also collected by Redis itself.

`open_store(None)` reads `$ATTENTION_LAB_CLASS_STORE` (a path, a sqlite:///path or a redis:// URL), else the default.

What a room holds: the teacher's secret (compared in constant time), its joiners (a seat token each, an optional
nickname), the teacher's state (the page and its URL parameters: a few hundred bytes, never a figure) with a version
number that followers poll, and its questions with one answer per seat. A question's counts are frozen at the
reveal: an answer racing the reveal is refused or not counted, never half of each.

Limits, stated: a room code is 6 characters from `ALPHABET` (a garbage code is refused before any lookup); at most
`MAX_SEATS` joiners; at most `MAX_ANSWERS` answer writes per seat per `RATE_WINDOW_S` seconds; a nickname of at most
`MAX_NICK` characters; a question of at most `MAX_OPTIONS` options; a room idle for `IDLE_S` seconds is gone.
Every refusal is a `ClassError` whose message is an English sentence (a msgid: pages show `t(e.msg, **e.fmt)`).
"""

from __future__ import annotations

import csv
import hmac
import io
import json
import os
import re
import secrets
import sqlite3
import threading
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from viz.i18n import N_

ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I/L: read off a projector and typed on a phone
CODE_LEN = 6  # 31**6 ~ 887 million codes: a guessed code finds no room
CODE_RE = re.compile(f"[{ALPHABET}]{{{CODE_LEN}}}")
IDLE_S = 3 * 3600.0  # a room nobody has touched for 3 hours is gone (a lecture, with a break)
MAX_SEATS = 200
MAX_NICK = 24
MAX_OPTIONS = 8
MAX_OPTION_CHARS = 120
MAX_QUESTION_CHARS = 400
MAX_QUESTIONS = 200  # per room
MAX_STATE_BYTES = 4096  # the teacher's page state: a page and its URL parameters
RATE_WINDOW_S = 60.0
MAX_ANSWERS = 20  # answer writes per seat per window: changing one's mind is fine, a flood is not
ENV = "ATTENTION_LAB_CLASS_STORE"


class ClassError(Exception):
    """A refusal in UI words: `msg` is the English sentence (a msgid), `fmt` fills its placeholders."""

    def __init__(self, msg: str, **fmt: Any):
        super().__init__(msg.format(**fmt) if fmt else msg)
        self.msg, self.fmt = msg, fmt


def normalize_code(raw: Any) -> str:
    """A typed room code as the store keeps it (upper case, spaces and dashes dropped); a ClassError if it cannot be
    one. Checked before any lookup, so a garbage code never reaches SQL or Redis."""
    code = re.sub(r"[\s-]", "", str(raw or ""))[:32].upper()
    if not CODE_RE.fullmatch(code):
        raise ClassError(N_("`{code}` is not a room code: a room code is {n} letters and digits, like `{example}`."),
                         code=str(raw or "")[:20].replace("`", "'"), n=CODE_LEN, example="K7QX2M")
    return code


def clean_nick(raw: Any) -> str:
    """A nickname as shown: control characters dropped, whitespace collapsed, at most MAX_NICK characters. Pages show
    it as plain text (never markdown or HTML)."""
    text = "".join(c for c in str(raw or "") if unicodedata.category(c)[0] != "C")
    return " ".join(text.split())[:MAX_NICK]


def new_code() -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(CODE_LEN))


def check_question(text: str, options: list[str], answer: int | None) -> tuple[str, list[str]]:
    text = " ".join(str(text or "").split())[:MAX_QUESTION_CHARS]
    opts = [" ".join(str(o).split())[:MAX_OPTION_CHARS] for o in options if str(o).strip()]
    if not text:
        raise ClassError(N_("A question needs a text."))
    if not 2 <= len(opts) <= MAX_OPTIONS:
        raise ClassError(N_("A question needs between 2 and {n} options."), n=MAX_OPTIONS)
    if len(set(opts)) != len(opts):
        raise ClassError(N_("Two options of this question are the same."))
    if answer is not None and not 0 <= answer < len(opts):
        raise ClassError(N_("The right answer must be one of the options."))
    return text, opts


@dataclass
class Question:
    qid: int
    text: str
    options: list[str]
    answer: int | None = None  # the right option's index (None: a poll with no right answer)
    lesson: str | None = None  # the lesson it comes from (None: the teacher's own question)
    revealed: bool = False
    frozen: list[int] | None = None  # the counts at the reveal
    extra: dict = field(default_factory=dict)  # e.g. the model's numbers behind the answer, shown at the reveal

    def to_json(self) -> str:
        return json.dumps(self.__dict__, ensure_ascii=False)

    @classmethod
    def from_json(cls, s: str) -> Question:
        return cls(**json.loads(s))


def to_csv(questions: list[Question], results: dict[int, list[int]], names: dict[int, dict[int, list[str]]] | None
           ) -> str:
    """One row per (question, option): its count, whether it is the right one, and the names (when names are on)."""
    def cell(v: Any) -> str:  # a cell a spreadsheet would run as a formula is written as text
        s = str(v)
        return "'" + s if s[:1] in ("=", "+", "-", "@", "\t", "\r") else s

    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["question", "lesson", "text", "option", "option_text", "right", "count", "revealed"]
               + (["names"] if names is not None else []))
    for q in questions:
        counts = results.get(q.qid, [0] * len(q.options))
        for i, o in enumerate(q.options):
            row = [q.qid, q.lesson or "", q.text, i + 1, o, "" if q.answer is None else int(i == q.answer),
                   counts[i], int(q.revealed)]
            if names is not None:
                row.append("; ".join(names.get(q.qid, {}).get(i, [])))
            w.writerow([cell(c) for c in row])
    return out.getvalue()


class ClassStore:
    """The interface pages use. `code` arguments are normalized and checked here (normalize_code); the teacher's
    actions take the room's `token` and are refused without it; a student's take their `seat`."""

    idle_s: float
    clock: Callable[[], float]

    # ---- implemented by a backend
    def _create(self, code: str, token: str, now: float) -> bool: ...  # False: the code is taken
    def _room(self, code: str) -> dict | None: ...  # token, touched, version, state, show_names, current, nseats
    def _touch(self, code: str, now: float) -> None: ...
    def _drop(self, code: str) -> None: ...
    def _join(self, code: str, seat: str, nick: str) -> bool: ...  # False: full
    def _nick(self, code: str, seat: str) -> str | None: ...  # None: no such seat
    def _set(self, code: str, **fields: Any) -> None: ...  # room fields; `state` bumps the version
    def _add_question(self, code: str, q: Question) -> int: ...  # returns the qid
    def _question(self, code: str, qid: int) -> Question | None: ...
    def _save_question(self, code: str, q: Question) -> None: ...
    def _questions(self, code: str) -> list[Question]: ...
    def _rate(self, code: str, seat: str, window: int) -> int: ...  # this window's count, after adding one
    def _put_answer(self, code: str, qid: int, seat: str, option: int) -> None: ...
    def _answers(self, code: str, qid: int) -> dict[str, int]: ...  # seat -> option
    def _seats(self, code: str) -> dict[str, str]: ...  # seat -> nickname
    def close(self) -> None: ...

    # ---- shared logic (the same for every backend, so one test suite checks both)
    def _live(self, code: str) -> dict:
        room = self._room(code)
        if room is None:
            raise ClassError(N_("There is no room {code}: it has ended, or the code is mistyped."), code=code)
        if self.clock() - room["touched"] > self.idle_s:
            self._drop(code)
            raise ClassError(N_("Room {code} has ended: nobody used it for {hours} hours."), code=code,
                             hours=f"{self.idle_s / 3600:g}")
        return room

    def _teacher(self, code: str, token: str) -> tuple[str, dict]:
        code = normalize_code(code)
        room = self._live(code)
        if not hmac.compare_digest(str(token or "").encode(), room["token"].encode()):
            raise ClassError(N_("Only the teacher of room {code} can do this."), code=code)
        return code, room

    def create_room(self) -> tuple[str, str]:
        """A new room: (code, teacher token). Both from `secrets`."""
        token = secrets.token_urlsafe(24)
        for _ in range(20):
            code = new_code()
            if self._create(code, token, self.clock()):
                return code, token
        raise ClassError(N_("No free room code was found; try again."))

    def is_teacher(self, code: str, token: str) -> bool:
        try:
            self._teacher(code, token)
            return True
        except ClassError:
            return False

    def join(self, code: str, nickname: str = "") -> str:
        """A seat token for a new joiner (kept by the student's session and link)."""
        code = normalize_code(code)
        self._live(code)
        seat = secrets.token_urlsafe(12)
        if not self._join(code, seat, clean_nick(nickname)):
            raise ClassError(N_("Room {code} is full: it has {n} joiners already."), code=code, n=MAX_SEATS)
        self._touch(code, self.clock())
        return seat

    def seat_ok(self, code: str, seat: str) -> bool:
        try:
            code = normalize_code(code)
            self._live(code)
        except ClassError:
            return False
        return bool(seat) and self._nick(code, str(seat)) is not None

    def joiners(self, code: str) -> int:
        return self._live(normalize_code(code))["nseats"]

    def set_state(self, code: str, token: str, state: dict) -> int:
        """The teacher's view (page + URL parameters), and its new version. Unchanged state keeps the version."""
        code, room = self._teacher(code, token)
        blob = json.dumps(state, sort_keys=True, ensure_ascii=False)
        if len(blob.encode()) > MAX_STATE_BYTES:
            raise ClassError(N_("This view is too large to share with the room (over {n} bytes)."), n=MAX_STATE_BYTES)
        if blob != room["state"]:
            self._set(code, state=blob)
        self._touch(code, self.clock())
        return self.version(code)

    def version(self, code: str) -> int:
        """What a follower polls: one small read. A ClassError once the room has gone."""
        return int(self._live(normalize_code(code))["version"])

    def get_state(self, code: str) -> tuple[int, dict]:
        room = self._live(normalize_code(code))
        return int(room["version"]), json.loads(room["state"] or "{}")

    def show_names(self, code: str) -> bool:
        return bool(int(self._live(normalize_code(code))["show_names"]))

    def set_show_names(self, code: str, token: str, on: bool) -> None:
        code, _ = self._teacher(code, token)
        self._set(code, show_names=int(bool(on)))
        self._touch(code, self.clock())

    def open_question(self, code: str, token: str, text: str, options: list[str], answer: int | None = None,
                      lesson: str | None = None, extra: dict | None = None) -> int:
        """Ask the room: a lesson's question (`lesson` names it) or the teacher's own. It becomes the current one."""
        code, _ = self._teacher(code, token)
        text, options = check_question(text, options, answer)
        if len(self._questions(code)) >= MAX_QUESTIONS:
            raise ClassError(N_("This room has asked {n} questions, the most one room keeps."), n=MAX_QUESTIONS)
        qid = self._add_question(code, Question(0, text, options, answer, lesson, extra=extra or {}))
        self._set(code, current=qid)
        self._touch(code, self.clock())
        return qid

    def current_question(self, code: str) -> Question | None:
        room = self._live(normalize_code(code))
        return self._question(room["code"], int(room["current"])) if room["current"] else None

    def questions(self, code: str) -> list[Question]:
        code = normalize_code(code)
        self._live(code)
        return self._questions(code)

    def answer(self, code: str, seat: str, qid: int, option: int) -> None:
        """One answer per seat per question; a later one replaces it until the reveal."""
        code = normalize_code(code)
        room = self._live(code)
        if not seat or self._nick(code, str(seat)) is None:
            raise ClassError(N_("Join room {code} before answering."), code=code)
        q = self._question(code, int(qid))
        if q is None:
            raise ClassError(N_("This question is not open in room {code}."), code=code)
        if q.revealed:
            raise ClassError(N_("The answer has been revealed: answers are closed."))
        if not (isinstance(option, int) and 0 <= option < len(q.options)):
            raise ClassError(N_("That is not one of this question's options."))
        now = self.clock()
        if self._rate(code, str(seat), int(now // RATE_WINDOW_S)) > MAX_ANSWERS:
            raise ClassError(N_("Too many answers from this screen: wait a minute, then answer again."))
        self._put_answer(code, q.qid, str(seat), option)
        self._touch(room["code"], now)

    def my_answer(self, code: str, seat: str, qid: int) -> int | None:
        return self._answers(normalize_code(code), int(qid)).get(str(seat))

    def reveal(self, code: str, token: str, qid: int) -> Question:
        """Close answers to `qid` and freeze its counts (what the results show from now on)."""
        code, _ = self._teacher(code, token)
        q = self._question(code, int(qid))
        if q is None:
            raise ClassError(N_("This question is not open in room {code}."), code=code)
        if not q.revealed:
            q.frozen, q.revealed = self._count(code, q), True
            self._save_question(code, q)
            self._set(code)  # a new version: the students' screens redraw the question with its answer
        self._touch(code, self.clock())
        return q

    def _count(self, code: str, q: Question) -> list[int]:
        counts = [0] * len(q.options)
        for opt in self._answers(code, q.qid).values():
            if 0 <= opt < len(counts):
                counts[opt] += 1
        return counts

    def results(self, code: str, qid: int) -> list[int]:
        """Answers per option: live until the reveal, then frozen."""
        code = normalize_code(code)
        self._live(code)
        q = self._question(code, int(qid))
        if q is None:
            return []
        return list(q.frozen) if q.frozen is not None else self._count(code, q)

    def names(self, code: str, qid: int) -> dict[int, list[str]]:
        """Option -> the nicknames that chose it (for the teacher, when names are on)."""
        code = normalize_code(code)
        seats = self._seats(code)
        out: dict[int, list[str]] = {}
        for seat, opt in self._answers(code, int(qid)).items():
            out.setdefault(opt, []).append(seats.get(seat) or "—")
        return {k: sorted(v) for k, v in out.items()}

    def export_csv(self, code: str, token: str) -> str:
        code, room = self._teacher(code, token)
        qs = self._questions(code)
        names = {q.qid: self.names(code, q.qid) for q in qs} if int(room["show_names"]) else None
        return to_csv(qs, {q.qid: self.results(code, q.qid) for q in qs}, names)


# ------------------------------------------------------------------------------------------------ SQLite

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rooms (code TEXT PRIMARY KEY, token TEXT NOT NULL, touched REAL NOT NULL,
    version INTEGER NOT NULL DEFAULT 0, state TEXT NOT NULL DEFAULT '', show_names INTEGER NOT NULL DEFAULT 0,
    current INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS seats (code TEXT NOT NULL, seat TEXT NOT NULL, nick TEXT NOT NULL,
    rate_window INTEGER NOT NULL DEFAULT 0, rate_count INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (code, seat));
CREATE TABLE IF NOT EXISTS questions (code TEXT NOT NULL, qid INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (code, qid));
CREATE TABLE IF NOT EXISTS answers (code TEXT NOT NULL, qid INTEGER NOT NULL, seat TEXT NOT NULL,
    option INTEGER NOT NULL, PRIMARY KEY (code, qid, seat));
"""


class SQLiteStore(ClassStore):
    """One file; one connection per store object, used under a lock (Streamlit starts a thread per script run, so a
    connection per thread would be a new connection per poll); WAL, so replicas on one machine share the file; each
    write is one transaction (BEGIN IMMEDIATE: a join's seat count and its insert cannot interleave, across
    processes too). Each statement takes microseconds: the lock is never held long."""

    def __init__(self, path: str | Path, idle_s: float = IDLE_S, clock: Callable[[], float] = time.time):
        self.path, self.idle_s, self.clock = Path(path), idle_s, clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(self.path, timeout=10, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a committed answer survives a killed process
        self._conn.executescript(_SCHEMA)  # its own transaction (executescript commits first)

    class _Locked:
        def __init__(self, store: SQLiteStore, tx: bool):
            self.store, self.tx = store, tx

        def __enter__(self) -> sqlite3.Connection:
            self.store._lock.acquire()
            if self.tx:
                self.store._conn.execute("BEGIN IMMEDIATE")
            return self.store._conn

        def __exit__(self, exc_type, *_):
            try:
                if self.tx:
                    self.store._conn.execute("ROLLBACK" if exc_type else "COMMIT")
            finally:
                self.store._lock.release()

    def _tx(self) -> SQLiteStore._Locked:
        return self._Locked(self, True)

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._Locked(self, False) as db:
            return db.execute(sql, args).fetchall()

    def _create(self, code, token, now):
        with self._tx() as db:
            # Rooms idle past their time go here (the one moment every server passes through), with their rows.
            old = [r[0] for r in db.execute("SELECT code FROM rooms WHERE touched < ?", (now - self.idle_s,))]
            for c in old:
                for table in ("rooms", "seats", "questions", "answers"):
                    db.execute(f"DELETE FROM {table} WHERE code = ?", (c,))
            try:
                db.execute("INSERT INTO rooms (code, token, touched) VALUES (?, ?, ?)", (code, token, now))
            except sqlite3.IntegrityError:
                return False
        return True

    def _room(self, code):
        rows = self._read(
            "SELECT token, touched, version, state, show_names, current, "
            "(SELECT COUNT(*) FROM seats WHERE seats.code = rooms.code) FROM rooms WHERE code = ?", (code,))
        if not rows:
            return None
        row = rows[0]
        keys = ("token", "touched", "version", "state", "show_names", "current", "nseats")
        return dict(zip(keys, row, strict=True)) | {"code": code}

    def _touch(self, code, now):
        self._read("UPDATE rooms SET touched = MAX(touched, ?) WHERE code = ?", (now, code))  # one autocommit write

    def _drop(self, code):
        with self._tx() as db:
            for table in ("rooms", "seats", "questions", "answers"):
                db.execute(f"DELETE FROM {table} WHERE code = ?", (code,))

    def _join(self, code, seat, nick):
        with self._tx() as db:
            (n,) = db.execute("SELECT COUNT(*) FROM seats WHERE code = ?", (code,)).fetchone()
            if n >= MAX_SEATS:
                return False
            db.execute("INSERT INTO seats (code, seat, nick) VALUES (?, ?, ?)", (code, seat, nick))
        return True

    def _nick(self, code, seat):
        rows = self._read("SELECT nick FROM seats WHERE code = ? AND seat = ?", (code, seat))
        return rows[0][0] if rows else None

    def _set(self, code, **fields):
        with self._tx() as db:
            for k, v in fields.items():
                assert k in ("state", "show_names", "current")  # column names are ours, never a caller's
                db.execute(f"UPDATE rooms SET {k} = ? WHERE code = ?", (v, code))
            db.execute("UPDATE rooms SET version = version + 1 WHERE code = ?", (code,))

    def _add_question(self, code, q):
        with self._tx() as db:
            (n,) = db.execute("SELECT COALESCE(MAX(qid), 0) FROM questions WHERE code = ?", (code,)).fetchone()
            q.qid = n + 1
            db.execute("INSERT INTO questions (code, qid, body) VALUES (?, ?, ?)", (code, q.qid, q.to_json()))
        return q.qid

    def _question(self, code, qid):
        rows = self._read("SELECT body FROM questions WHERE code = ? AND qid = ?", (code, qid))
        return Question.from_json(rows[0][0]) if rows else None

    def _save_question(self, code, q):
        self._read("UPDATE questions SET body = ? WHERE code = ? AND qid = ?", (q.to_json(), code, q.qid))

    def _questions(self, code):
        rows = self._read("SELECT body FROM questions WHERE code = ? ORDER BY qid", (code,))
        return [Question.from_json(r[0]) for r in rows]

    def _rate(self, code, seat, window):
        with self._tx() as db:
            db.execute("UPDATE seats SET rate_count = CASE WHEN rate_window = ? THEN rate_count + 1 ELSE 1 END, "
                       "rate_window = ? WHERE code = ? AND seat = ?", (window, window, code, seat))
            row = db.execute("SELECT rate_count FROM seats WHERE code = ? AND seat = ?", (code, seat)).fetchone()
        return row[0] if row else MAX_ANSWERS + 1

    def _put_answer(self, code, qid, seat, option):
        with self._tx() as db:  # not after the reveal: the reveal and this write are serialized by the lock
            body = db.execute("SELECT body FROM questions WHERE code = ? AND qid = ?", (code, qid)).fetchone()
            if body is None or Question.from_json(body[0]).revealed:
                raise ClassError(N_("The answer has been revealed: answers are closed."))
            db.execute("INSERT OR REPLACE INTO answers (code, qid, seat, option) VALUES (?, ?, ?, ?)",
                       (code, qid, seat, option))

    def _answers(self, code, qid):
        return dict(self._read("SELECT seat, option FROM answers WHERE code = ? AND qid = ?", (code, qid)))

    def _seats(self, code):
        return dict(self._read("SELECT seat, nick FROM seats WHERE code = ?", (code,)))

    def close(self):
        with self._lock:
            self._conn.close()


# ------------------------------------------------------------------------------------------------ Redis

_JOIN_LUA = """
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""
_ANSWER_LUA = """
local q = redis.call('HGET', KEYS[1], ARGV[1])
if not q then return -1 end
if cjson.decode(q)['revealed'] then return 0 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1
"""


class RedisStore(ClassStore):
    """Keys per room: `al:class:{CODE}` (a hash: token, touched, version, state, show_names, current),
    `...:seats` (seat -> nickname), `...:qs` (qid -> question JSON), `...:a:{qid}` (seat -> option),
    `...:rate:{seat}` (a counter per window). Each gets a TTL of the idle time (+ a margin) at every write. A join
    (the seat limit) and an answer (not after the reveal) are Lua scripts: atomic across replicas."""

    def __init__(self, url: str, idle_s: float = IDLE_S, clock: Callable[[], float] = time.time):
        import redis  # only a Redis-backed class needs the client

        self.url, self.idle_s, self.clock = url, idle_s, clock
        self.r = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5, socket_connect_timeout=5)
        self.r.ping()  # a wrong address fails here, at start-up, not in a student's answer
        self._join_lua = self.r.register_script(_JOIN_LUA)
        self._answer_lua = self.r.register_script(_ANSWER_LUA)

    def _k(self, code: str, *parts: Any) -> str:
        return ":".join(["al:class", code, *map(str, parts)])

    @property
    def _ttl(self) -> int:
        return int(self.idle_s + 3600)

    def _create(self, code, token, now):
        ok = self.r.hsetnx(self._k(code), "token", token)
        if ok:
            self.r.hset(self._k(code), mapping={"touched": now, "version": 0, "state": "", "show_names": 0,
                                                "current": 0})
            self.r.expire(self._k(code), self._ttl)
        return bool(ok)

    def _room(self, code):
        p = self.r.pipeline(transaction=False)
        p.hgetall(self._k(code))
        p.hlen(self._k(code, "seats"))
        room, n = p.execute()
        if not room or "touched" not in room:
            return None
        return {"code": code, "token": room["token"], "touched": float(room["touched"]),
                "version": int(room["version"]), "state": room["state"], "show_names": int(room["show_names"]),
                "current": int(room["current"]), "nseats": n}

    def _touch(self, code, now):
        p = self.r.pipeline(transaction=False)
        p.hset(self._k(code), "touched", now)
        current = self.r.hget(self._k(code), "current") or 0
        for k in (self._k(code), self._k(code, "seats"), self._k(code, "qs"), self._k(code, "a", current)):
            p.expire(k, self._ttl)
        p.execute()

    def _drop(self, code):
        keys = list(self.r.scan_iter(match=self._k(code) + "*", count=500))
        if keys:
            self.r.delete(*keys)

    def _join(self, code, seat, nick):
        ok = self._join_lua(keys=[self._k(code, "seats"), self._k(code)], args=[seat, nick, MAX_SEATS])
        self.r.expire(self._k(code, "seats"), self._ttl)
        return ok == 1

    def _nick(self, code, seat):
        return self.r.hget(self._k(code, "seats"), seat)

    def _set(self, code, **fields):
        p = self.r.pipeline(transaction=True)
        if fields:
            p.hset(self._k(code), mapping=fields)
        p.hincrby(self._k(code), "version", 1)
        p.execute()

    def _add_question(self, code, q):
        q.qid = int(self.r.hincrby(self._k(code), "qseq", 1))
        self.r.hset(self._k(code, "qs"), str(q.qid), q.to_json())
        # Every question's answers live as long as the room: renew them all when a new question opens.
        p = self.r.pipeline(transaction=False)
        for k in [self._k(code, "qs")] + [self._k(code, "a", i) for i in range(1, q.qid + 1)]:
            p.expire(k, self._ttl)
        p.execute()
        return q.qid

    def _question(self, code, qid):
        body = self.r.hget(self._k(code, "qs"), str(qid))
        return None if body is None else Question.from_json(body)

    def _save_question(self, code, q):
        self.r.hset(self._k(code, "qs"), str(q.qid), q.to_json())

    def _questions(self, code):
        qs = [Question.from_json(b) for b in self.r.hvals(self._k(code, "qs"))]
        return sorted(qs, key=lambda q: q.qid)

    def _rate(self, code, seat, window):
        k = self._k(code, "rate", seat, window)
        p = self.r.pipeline(transaction=True)
        p.incr(k)
        p.expire(k, int(RATE_WINDOW_S) * 2)
        n, _ = p.execute()
        return int(n)

    def _put_answer(self, code, qid, seat, option):
        ok = self._answer_lua(keys=[self._k(code, "qs"), self._k(code, "a", qid)], args=[str(qid), seat, option])
        if ok != 1:
            raise ClassError(N_("The answer has been revealed: answers are closed."))
        self.r.expire(self._k(code, "a", qid), self._ttl)

    def _answers(self, code, qid):
        return {s: int(o) for s, o in self.r.hgetall(self._k(code, "a", qid)).items()}

    def _seats(self, code):
        return self.r.hgetall(self._k(code, "seats"))

    def close(self):
        self.r.close()


def default_path() -> Path:
    """The SQLite file: the lab's cache folder (model/loaders/gguf.py's lab_cache: $ATTENTION_LAB_CACHE, XDG)."""
    from model.loaders.gguf import lab_cache

    return lab_cache("class") / "rooms.sqlite3"


def open_store(url: str | None = None, **kw: Any) -> ClassStore:
    """`redis://HOST:PORT/N` -> Redis; `sqlite:///path`, a plain path -> SQLite; None -> $ATTENTION_LAB_CLASS_STORE,
    else SQLite in the lab's cache folder."""
    url = url or os.environ.get(ENV) or ""
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(url, **kw)
    if url.startswith("sqlite:///"):
        url = url[len("sqlite:///"):]
    return SQLiteStore(Path(url) if url else default_path(), **kw)
