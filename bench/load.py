"""A class at once: server CPU per click, redraw time, memory, isolation (issue 12 §1–2).

    .venv/bin/python bench/load.py [--sessions 20] [--clicks 6]

Starts `streamlit run app.py` (and a hello-world page for reference), then drives real Chromium
sessions (Playwright) and reads the server's CPU time (utime + stime) and resident memory from
/proc/<pid>. It prints every measure beside its target, as a ratio:

1. one session: server CPU per head switch on the Attention page, and the browser redraw (click
   -> heatmap redrawn) per switch, p50/p95;
2. first view of a new session (after a first session warmed the caches): server CPU and time;
3. N sessions at once while one session trains on the Training page: each has its own sentence,
   switches heads and goes Attention -> Tokens -> Attention; server CPU per click, redraw
   p50/p95, exceptions, and whether any session ever showed another session's sentence;
4. memory (RSS) after the first session, at the peak, and after every session closed (the
   server runs with a short disconnected-session TTL so closed sessions are freed promptly).

Absolute times are noise on a shared machine; compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from app import ARGS, CHROMIUM, HELLO, VIEWPORT, free_port, start_server, stop_server, wait_health  # noqa: E402

TARGET_CPU_CLICK_S = 0.050  # server CPU per head switch
TARGET_FIRST_VIEW_S = 0.300  # server CPU for a new session's first view (caches warm)
TARGET_REDRAW_S = 0.150  # head switch: click -> redrawn heatmap, median
TARGET_MEM_RETURN = 1.10  # RSS after the sessions close / RSS after the first session
TICKS = os.sysconf("SC_CLK_TCK")
DATES = ["3 november 2023", "5 may 2021", "17 june 1999", "28 february 2010", "1 january 2000",
         "9 august 1987", "30 april 2015", "12 december 2012", "21 march 1995", "14 july 2019"]
TITLES = "() => [...document.querySelectorAll('.js-plotly-plot')].map(el => el.layout?.title?.text || '')"


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid` (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def settled(page, timeout: int = 120_000) -> None:
    """The script run (or fragment run) has finished and no spinner is left."""
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout)
    page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached", timeout=timeout)
    page.wait_for_selector(".js-plotly-plot .main-svg", state="attached", timeout=timeout)


def pick_head(page, h: int) -> float:
    """Choose head `h`; seconds from the click to the heatmap redrawn with that head."""
    page.locator('[data-testid="stSelectbox"]').get_by_role("combobox", name="Head", exact=True).first.click()
    option = page.get_by_role("option", name=str(h), exact=True)
    option.wait_for()
    t0 = time.perf_counter()
    option.click()
    page.wait_for_function(
        "h => [...document.querySelectorAll('.js-plotly-plot')].some("
        "el => (el.layout?.title?.text || '').includes('· head ' + h + ' ·'))", arg=h, polling="raf",
        timeout=60_000)
    took = time.perf_counter() - t0
    settled(page)
    return took


def quiet_cpu(pid: int, settle: float = 0.3) -> float:
    """The server's CPU time once it has been idle for `settle` s (background work finished)."""
    last = cpu_seconds(pid)
    while True:
        time.sleep(settle)
        now = cpu_seconds(pid)
        if now - last < 0.01:
            return now
        last = now


def one_session(browser, base: str, pid: int, clicks: int) -> dict:
    ctx = browser.new_context(viewport=VIEWPORT)
    page = ctx.new_page()
    try:
        page.goto(base + "/")
        settled(page)
        pick_head(page, 1)  # warm this session's caches
        c0 = quiet_cpu(pid)
        redraws = [pick_head(page, h) for h in ([2, 3, 0, 1] * clicks)[:clicks]]
        cpu = (quiet_cpu(pid) - c0) / clicks
        return {"cpu_click": cpu, "redraw": redraws}
    finally:
        ctx.close()


def first_view(browser, base: str, pid: int, text: str) -> tuple[float, float]:
    """(server CPU, wall seconds) for a new session's first Attention view."""
    ctx = browser.new_context(viewport=VIEWPORT)
    page = ctx.new_page()
    try:
        c0 = quiet_cpu(pid)
        t0 = time.perf_counter()
        page.goto(f"{base}/?text={text.replace(' ', '+')}")
        settled(page)
        wall = time.perf_counter() - t0
        return quiet_cpu(pid) - c0, wall
    finally:
        ctx.close()


class Student(threading.Thread):
    """One browser session of the class: its own sentence, head switches, a page round trip."""

    def __init__(self, base: str, i: int, clicks: int, results: list, start: threading.Barrier):
        super().__init__(daemon=True)
        self.base, self.i, self.clicks, self.results, self.start_line = base, i, clicks, results, start
        self.text = DATES[i % len(DATES)] if i < len(DATES) else f"{1 + i % 28} may {1950 + i}"

    def run(self) -> None:
        from playwright.sync_api import sync_playwright

        out = {"i": self.i, "redraw": [], "clicks": 0, "errors": [], "foreign": []}
        try:
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                try:
                    page = b.new_context(viewport={"width": 1200, "height": 1600}).new_page()
                    self.start_line.wait()
                    page.goto(f"{self.base}/?text={self.text.replace(' ', '+')}")
                    settled(page)
                    self.check(page, out)
                    for k in range(self.clicks):
                        out["redraw"].append(pick_head(page, (k + 1) % 4))
                        out["clicks"] += 1
                        self.check(page, out)
                    nav = page.locator('[data-testid="stSidebarNav"]')
                    nav.get_by_role("link", name="Tokens & embeddings").click()
                    page.wait_for_function("() => location.pathname === '/tokens'")
                    settled(page)
                    nav.get_by_role("link", name="Attention", exact=True).click()
                    page.wait_for_function("() => location.pathname === '/'")
                    settled(page)
                    out["clicks"] += 2
                    self.check(page, out)
                finally:
                    b.close()
        except Exception as e:  # a failed session is a result, not a crash of the benchmark
            out["errors"].append(f"{type(e).__name__}: {str(e)[:200]}")
        self.results.append(out)

    def check(self, page, out: dict) -> None:
        if page.locator('[data-testid="stException"]').count():
            out["errors"].append(page.locator('[data-testid="stException"]').first.inner_text()[:200])
        for title in page.evaluate(TITLES):
            if "“" in title and f"“{self.text}”" not in title:
                out["foreign"].append(title)


def start_training(browser, base: str):
    """A session that starts a training run on the Training page (left running)."""
    ctx = browser.new_context(viewport=VIEWPORT)
    page = ctx.new_page()
    page.goto(base + "/training")
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=120_000)
    page.get_by_role("button", name="🏋️ Train").click()
    page.wait_for_selector('[data-testid="stProgress"], [role="progressbar"]', timeout=60_000)
    return ctx


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=20, help="browser sessions at once")
    ap.add_argument("--clicks", type=int, default=6, help="head switches per session")
    ap.add_argument("--no-training", action="store_true", help="no training run during the class")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        hello = Path(tmp) / "hello.py"
        hello.write_text(HELLO, encoding="utf-8")
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        port = free_port()
        proc = start_server(ROOT / "app.py", port, extra=["--server.disconnectedSessionTTL", "2"])
        base = f"http://127.0.0.1:{port}"
        try:
            wait_health(port)
            pid = proc.pid
            # Reference: one hello-world view's server CPU on its own server, in this run.
            ref_port = free_port()
            ref = start_server(hello, ref_port)
            try:
                wait_health(ref_port)
                first_view(browser, f"http://127.0.0.1:{ref_port}", ref.pid, "x")
                ref_cpu, _ = first_view(browser, f"http://127.0.0.1:{ref_port}", ref.pid, "x")
            finally:
                stop_server(ref)

            cold_cpu, cold_wall = first_view(browser, base, pid, DATES[0])  # loads models, traces
            mem_first = rss_mb(pid)
            solo = one_session(browser, base, pid, args.clicks)
            fv_cpu, fv_wall = first_view(browser, base, pid, DATES[1])

            trainer = None if args.no_training else start_training(browser, base)
            results: list = []
            line = threading.Barrier(args.sessions)
            c0 = quiet_cpu(pid, 0.5) if trainer is None else cpu_seconds(pid)
            students = [Student(base, i, args.clicks, results, line) for i in range(args.sessions)]
            t0 = time.perf_counter()
            peak = rss_mb(pid)
            for s in students:
                s.start()
            while any(s.is_alive() for s in students):
                peak = max(peak, rss_mb(pid))
                time.sleep(0.2)
            class_wall = time.perf_counter() - t0
            class_cpu = cpu_seconds(pid) - c0
            if trainer is not None:
                trainer.close()
            time.sleep(6)  # > disconnectedSessionTTL: closed sessions are dropped
            quiet_cpu(pid, 1.0)
            mem_after = rss_mb(pid)
        finally:
            stop_server(proc)
            browser.close()

    redraw = solo["redraw"]
    clicks = sum(r["clicks"] for r in results)
    class_redraw = [x for r in results for x in r["redraw"]]
    errors = [e for r in results for e in r["errors"]]
    foreign = [f for r in results for f in r["foreign"]]
    print(f"reference: hello-world first view, server CPU {ref_cpu * 1000:.0f} ms")
    print(f"first session (cold caches)      server CPU {cold_cpu * 1000:6.0f} ms, {cold_wall:.2f} s wall")
    print(f"head switch, 1 session           server CPU {solo['cpu_click'] * 1000:6.1f} ms/click   target <= "
          f"{TARGET_CPU_CLICK_S * 1000:.0f} ms   ratio {solo['cpu_click'] / TARGET_CPU_CLICK_S:.2f}  "
          f"[{verdict(solo['cpu_click'] <= TARGET_CPU_CLICK_S)}]")
    med = statistics.median(redraw)
    print(f"head switch, 1 session           redraw p50 {med * 1000:6.0f} ms, p95 {percentile(redraw, .95) * 1000:.0f} "
          f"ms   target p50 <= {TARGET_REDRAW_S * 1000:.0f} ms   ratio {med / TARGET_REDRAW_S:.2f}  "
          f"[{verdict(med <= TARGET_REDRAW_S)}]")
    print(f"first view, new session (warm)   server CPU {fv_cpu * 1000:6.0f} ms ({fv_cpu / ref_cpu:.1f}x hello world)"
          f", {fv_wall:.2f} s wall   target <= {TARGET_FIRST_VIEW_S * 1000:.0f} ms   ratio "
          f"{fv_cpu / TARGET_FIRST_VIEW_S:.2f}  [{verdict(fv_cpu <= TARGET_FIRST_VIEW_S)}]")
    training = "" if args.no_training else " + 1 training run"
    print(f"class: {args.sessions} sessions{training}   {clicks} clicks in {class_wall:.1f} s; server CPU "
          f"{class_cpu:.1f} s = {class_cpu / max(clicks, 1) * 1000:.0f} ms/click (page loads and training included)")
    if class_redraw:
        cm = statistics.median(class_redraw)
        p95 = percentile(class_redraw, .95)
        print(f"class: head switch redraw        p50 {cm * 1000:6.0f} ms, p95 {p95 * 1000:.0f} ms "
              "(2 CPU cores shared by every session and the browsers)")
    print(f"class: exceptions {len(errors)}   sessions showing another's sentence {len(foreign)}   "
          f"[{verdict(not errors and not foreign)}]")
    for e in (errors + foreign)[:5]:
        print("   ", e)
    ratio = mem_after / mem_first
    print(f"memory (RSS): after first session {mem_first:.0f} MB, peak {peak:.0f} MB, after all closed "
          f"{mem_after:.0f} MB   ratio {ratio:.2f}   target <= {TARGET_MEM_RETURN:.2f}  "
          f"[{verdict(ratio <= TARGET_MEM_RETURN)}]")


if __name__ == "__main__":
    main()
