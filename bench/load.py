"""A class at once: server CPU per click, redraw time, memory, isolation (issue 12 §1–2).

    .venv/bin/python bench/load.py [--sessions 20] [--clicks 6]

Starts `streamlit run app.py` (and a hello-world page for reference), then drives real Chromium
sessions (Playwright) and reads the server's CPU time (utime + stime) and resident memory from
/proc/<pid>. It prints every measure beside its target, as a ratio:

1. one session: server CPU per head switch on the Attention page, and the browser redraw (click
   -> heatmap redrawn) per switch, p50/p95;
2. first view of a new session (after a first session warmed the caches): server CPU and time;
3. N sessions at once while one session trains on the Training page: each has its own sentence,
   switches heads and goes Attention -> Tokens -> Attention (a few Chromium processes host them,
   taking turns); server CPU per click, redraw p50/p95, exceptions, and whether any session ever
   showed another session's sentence (every figure title names its sentence);
4. memory (RSS) after the first session (which toured the pages), at the peak, and after every
   session closed and the training run stopped (the server runs with a short disconnected-session
   TTL, so closed sessions are freed promptly instead of after Streamlit's default 120 s).

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
import app as bench  # noqa: E402  (bench/app.py: servers, the browser, the head-switch probe)

TARGET_CPU_CLICK_S = 0.050  # server CPU per head switch
TARGET_FIRST_VIEW_S = 0.300  # server CPU for a new session's first view (caches warm)
TARGET_REDRAW_S = 0.150  # head switch: click -> redrawn heatmap, median
TARGET_MEM_RETURN = 1.10  # RSS after the sessions close / RSS after the first session
TICKS = os.sysconf("SC_CLK_TCK")
HELLO_HEADS = '''import numpy as np
import plotly.graph_objects as go
import streamlit as st

st.title("Hello")
h = st.selectbox("Head", range(4))
st.query_params["head"] = h  # like the app: the URL names the head (pick_head waits for it)
z = np.random.default_rng(h).random((12, 16)).astype(np.float32)
st.plotly_chart(go.Figure(go.Heatmap(z=z), layout={"title": {"text": f"reference · head {h} · weights"}}))
'''  # the same interaction on the smallest app: a select that redraws one heatmap
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


def settled(page, timeout: int = 300_000) -> None:
    """The script run (or fragment run) has finished and no spinner is left."""
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout)
    page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached", timeout=timeout)
    page.wait_for_selector(".js-plotly-plot .main-svg", state="attached", timeout=timeout)


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
    ctx = browser.new_context(viewport=bench.VIEWPORT)
    page = ctx.new_page()
    try:
        page.goto(base + "/")
        settled(page)
        bench.pick_head(page, 1)  # warm this session's caches
        c0 = quiet_cpu(pid)
        redraws = [bench.pick_head(page, h) for h in ([2, 3, 0, 1] * clicks)[:clicks]]
        cpu = (quiet_cpu(pid) - c0) / clicks
        return {"cpu_click": cpu, "redraw": redraws}
    finally:
        ctx.close()


def reference_switches(browser, base: str, pid: int, clicks: int) -> dict:
    """The head-switch interaction on HELLO_HEADS: server CPU per click and redraw times."""
    return one_session(browser, base, pid, clicks)


def first_view(browser, base: str, pid: int, text: str) -> tuple[float, float]:
    """(server CPU, wall seconds) for a new session's first Attention view."""
    ctx = browser.new_context(viewport=bench.VIEWPORT)
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


class Group(threading.Thread):
    """Some students of the class in one Chromium (one thread each group): each page has its own
    sentence; they load at once, then take turns (a head switch each, round after round), then all go
    Attention -> Tokens -> Attention. Every page is checked for exceptions and foreign sentences."""

    def __init__(self, base: str, students: list[int], clicks: int, results: list, start: threading.Barrier):
        super().__init__(daemon=True)
        self.base, self.students, self.clicks, self.results, self.start_line = base, students, clicks, results, start

    @staticmethod
    def sentence(i: int) -> str:
        return DATES[i] if i < len(DATES) else f"{1 + i % 28} may {1950 + i}"

    def run(self) -> None:
        from playwright.sync_api import sync_playwright

        out = {"redraw": [], "clicks": 0, "errors": [], "foreign": []}
        try:
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=bench.CHROMIUM, args=bench.ARGS)
                try:
                    pages = [b.new_context(viewport={"width": 1200, "height": 1600}).new_page() for _ in self.students]
                    for page in pages:
                        page.set_default_timeout(300_000)  # 2 cores for the server, the class and the browsers
                    self.start_line.wait()
                    self.tour(pages, out)
                finally:
                    b.close()
        except Exception as e:  # a failed group is a result, not a crash of the benchmark
            out["errors"].append(f"{type(e).__name__}: {str(e)[:200]}")
        self.results.append(out)

    def tour(self, pages: list, out: dict) -> None:
        texts = [self.sentence(i) for i in self.students]
        for page, text in zip(pages, texts, strict=True):
            page.goto(f"{self.base}/?text={text.replace(' ', '+')}", wait_until="commit")
        for page, text in zip(pages, texts, strict=True):
            settled(page)
            self.check(page, text, out)
        for k in range(self.clicks):
            for page, text in zip(pages, texts, strict=True):
                out["redraw"].append(bench.pick_head(page, (k + 1) % 4))
                out["clicks"] += 1
                self.check(page, text, out)
        for link, path in (("Tokens & embeddings", "/tokens"), ("Attention", "/")):
            for page in pages:
                page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name=link, exact=True).click()
            for page, text in zip(pages, texts, strict=True):
                page.wait_for_function(f"() => location.pathname === {path!r}")
                settled(page)
                out["clicks"] += 1
                self.check(page, text, out)

    @staticmethod
    def check(page, text: str, out: dict) -> None:
        if page.locator('[data-testid="stException"]').count():
            out["errors"].append(page.locator('[data-testid="stException"]').first.inner_text()[:200])
        for title in page.evaluate(TITLES):
            if "“" in title and f"“{text}”" not in title:
                out["foreign"].append(title)


def start_training(browser, base: str):
    """A session that starts a training run on the Training page (left running); returns its page."""
    page = browser.new_context(viewport=bench.VIEWPORT).new_page()
    page.goto(base + "/training")
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=120_000)
    page.get_by_role("button", name="🏋️ Train").click()
    page.get_by_role("button", name="⏹ Stop").wait_for(timeout=60_000)
    return page


def stop_training(page) -> None:
    """Stop the run (its thread ends and frees the optimizer), then close the session."""
    page.get_by_role("button", name="⏹ Stop").click()
    page.get_by_role("button", name="⏹ Stop").wait_for(state="detached", timeout=120_000)
    page.context.close()


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=20, help="browser sessions at once")
    ap.add_argument("--clicks", type=int, default=6, help="head switches per session")
    ap.add_argument("--browsers", type=int, default=4, help="Chromium processes sharing the sessions")
    ap.add_argument("--no-training", action="store_true", help="no training run during the class")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        hello = Path(tmp) / "hello.py"
        hello.write_text(bench.HELLO, encoding="utf-8")
        hello_heads = Path(tmp) / "hello_heads.py"
        hello_heads.write_text(HELLO_HEADS, encoding="utf-8")
        browser = p.chromium.launch(executable_path=bench.CHROMIUM, args=bench.ARGS)
        port = bench.free_port()
        proc = bench.start_server(ROOT / "app.py", port, extra=["--server.disconnectedSessionTTL", "2"])
        base = f"http://127.0.0.1:{port}"
        try:
            bench.wait_health(port)
            pid = proc.pid
            # Reference: one hello-world view's server CPU on its own server, in this run.
            ref_port = bench.free_port()
            ref = bench.start_server(hello, ref_port)
            try:
                bench.wait_health(ref_port)
                first_view(browser, f"http://127.0.0.1:{ref_port}", ref.pid, "x")
                ref_cpu, _ = first_view(browser, f"http://127.0.0.1:{ref_port}", ref.pid, "x")
            finally:
                bench.stop_server(ref)
            ref = bench.start_server(hello_heads, ref_port)
            try:
                bench.wait_health(ref_port)
                ref_switch = reference_switches(browser, f"http://127.0.0.1:{ref_port}", ref.pid, args.clicks)
            finally:
                bench.stop_server(ref)

            cold_cpu, cold_wall = first_view(browser, base, pid, DATES[0])  # loads models, traces
            first = Group(base, [0], 2, [], threading.Barrier(1))  # the first session: the whole tour
            first.start()
            first.join()
            solo = one_session(browser, base, pid, args.clicks)
            fv_cpu, fv_wall = first_view(browser, base, pid, DATES[0])  # a shared link: trace cached
            fv_new_cpu, _ = first_view(browser, base, pid, DATES[1])  # a new sentence: the model runs
            time.sleep(3)  # > disconnectedSessionTTL
            quiet_cpu(pid, 1.0)
            mem_first = rss_mb(pid)

            trainer = None if args.no_training else start_training(browser, base)
            results: list = []
            n_groups = min(args.browsers, args.sessions)
            line = threading.Barrier(n_groups)
            c0 = quiet_cpu(pid, 0.5) if trainer is None else cpu_seconds(pid)
            students = [Group(base, list(range(g, args.sessions, n_groups)), args.clicks, results, line)
                        for g in range(n_groups)]
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
                stop_training(trainer)
            time.sleep(6)  # > disconnectedSessionTTL: closed sessions are dropped
            quiet_cpu(pid, 1.0)
            mem_after = rss_mb(pid)
        finally:
            bench.stop_server(proc)
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
    med, ref_med = statistics.median(redraw), statistics.median(ref_switch["redraw"])
    print(f"head switch, 1 session           redraw p50 {med * 1000:6.0f} ms, p95 {percentile(redraw, .95) * 1000:.0f} "
          f"ms   target p50 <= {TARGET_REDRAW_S * 1000:.0f} ms   ratio {med / TARGET_REDRAW_S:.2f}  "
          f"[{verdict(med <= TARGET_REDRAW_S)}]")
    print(f"  reference: a select redrawing one heatmap (hello world): redraw p50 {ref_med * 1000:.0f} ms, server "
          f"CPU {ref_switch['cpu_click'] * 1000:.1f} ms/click; app / reference: redraw {med / ref_med:.2f}x, "
          f"CPU {solo['cpu_click'] / max(ref_switch['cpu_click'], 1e-3):.2f}x")
    print(f"first view, new session (warm)   server CPU {fv_cpu * 1000:6.0f} ms ({fv_cpu / ref_cpu:.1f}x hello world)"
          f", {fv_wall:.2f} s wall   target <= {TARGET_FIRST_VIEW_S * 1000:.0f} ms   ratio "
          f"{fv_cpu / TARGET_FIRST_VIEW_S:.2f}  [{verdict(fv_cpu <= TARGET_FIRST_VIEW_S)}]")
    print(f"  the same with a sentence no session used yet (the model runs: greedy decode + traced pass): "
          f"{fv_new_cpu * 1000:.0f} ms")
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
