"""A live class's followers (issue 41 §2): server CPU per following student per second, and the time from the
teacher's change to each follower's screen.

    .venv/bin/python bench/class_follow.py [--followers 10] [--idle 20] [--changes 5]

Starts `streamlit run app.py` with a SQLite room store of its own, makes a room and N seats in it (through the
store, as the teacher's and students' joins would), then opens N real Chromium pages (contexts of one headless
browser) at `/class?room=CODE`, the seat in its cookie: each is a following student. It reads the server's CPU time
(/proc/<pid>/stat) over `--idle` seconds with nobody following (the reference, same server, same run), then over
the same time with N followers polling, and prints the difference per follower per second. Then the teacher's view
changes `--changes` times (the store's set_state, what the teacher's session does): for each change, the time until
each follower's address shows it (p50, p95 over followers and changes). The load average is printed beside.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from browser_support import CHROMIUM, CHROMIUM_ARGS, free_port, start_server, stop_server  # noqa: E402

from viz.classroom.store import open_store  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_over(pid: int, seconds: float) -> float:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def settle(pid: int, below: float = 0.05, most: float = 180) -> None:
    """Until the server's own work (warm-up, first runs) is done: CPU under `below` s/s over 2 s."""
    deadline = time.monotonic() + most
    while time.monotonic() < deadline and cpu_over(pid, 2) > below:
        pass


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--followers", type=int, default=10)
    ap.add_argument("--idle", type=float, default=20)
    ap.add_argument("--changes", type=int, default=5)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    db = Path(tempfile.mkdtemp(prefix="al-class-")) / "rooms.sqlite3"
    store = open_store(str(db))
    code, token = store.create_room()
    seats = [store.join(code, f"s{i}") for i in range(args.followers)]
    store.set_state(code, token, {"page": "class", "params": {"v": "0"}})
    port = free_port()
    proc = start_server(ROOT / "app.py", port, env={"ATTENTION_LAB_CLASS_STORE": str(db)})
    base = f"http://127.0.0.1:{port}"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            settle(proc.pid)
            print(f"load average before: {os.getloadavg()[0]:.2f}")
            idle = cpu_over(proc.pid, args.idle)
            pages = []
            for seat in seats:
                ctx = browser.new_context(viewport={"width": 1200, "height": 900})
                ctx.add_cookies([{"name": "al_class_seat", "value": f"{code}:{seat}", "url": base}])  # the seat
                page = ctx.new_page()
                page.goto(f"{base}/class?room={code}&lang=en")
                pages.append(page)
            for page in pages:
                page.wait_for_url("**v=0**", timeout=180_000)  # following: on the teacher's view
            settle(proc.pid, below=0.05 + 0.05 * args.followers)
            following = cpu_over(proc.pid, args.idle)
            per = (following - idle) / args.followers
            print(f"server CPU, nobody following: {idle * 1000:.1f} ms/s; {args.followers} following: "
                  f"{following * 1000:.1f} ms/s -> {per * 1000:.2f} ms of server CPU per follower per second "
                  f"({per * 100:.2f} % of a core); load average {os.getloadavg()[0]:.2f}")
            lags = []
            for v in range(1, args.changes + 1):
                t0 = time.monotonic()
                store.set_state(code, token, {"page": "class", "params": {"v": str(v)}})
                pending = set(range(len(pages)))
                while pending and time.monotonic() - t0 < 60:
                    pages[0].wait_for_timeout(20)  # lets Playwright process the pages' URL events
                    for i in list(pending):
                        if f"v={v}" in pages[i].url:
                            lags.append(time.monotonic() - t0)
                            pending.discard(i)
                if pending:
                    print(f"change {v}: {len(pending)} follower(s) did not follow within 60 s:",
                          [pages[i].url for i in pending])
                time.sleep(1.5)
            print(f"teacher's change -> follower's address: p50 {percentile(lags, 50) * 1000:.0f} ms, "
                  f"p95 {percentile(lags, 95) * 1000:.0f} ms over {len(lags)} (followers x changes); poll every "
                  f"{1.0:.1f} s; load average {os.getloadavg()[0]:.2f}")
            browser.close()
    finally:
        stop_server(proc)


if __name__ == "__main__":
    main()
