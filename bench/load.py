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

    .venv/bin/python bench/load.py --llm-soak [--sessions 20] [--long-sessions 5] [--long-tokens 2048] [--clicks 4]
        [--idle 60]  (then memory once the class's traces went unused for 60 s)

Issue 24 §6: the class on /llm with SmolLM2, some sessions with long prompts (the longest /llm takes, when it
refuses the length asked for: said in the output). Memory after the class / before, exceptions, sessions that
showed another session's prompt (each prompt names its own marker word), head-switch redraw p50/p95.

    .venv/bin/python bench/load.py --warm-lm-ratio [--clicks 12]

Issue 26 §3: server CPU per toy head switch on a server that warmed SmolLM2 and on one that did not.

    .venv/bin/python bench/load.py --class-start [--class-pages default,needle,floor] [--class-sizes 1,6,20]

Issue 43: a class that opens together. For each page and size, a fresh `streamlit run`; as soon as it answers its
health check, N sessions (contexts of one headless Chromium, made before the start) open the page at once: the
default page (/, the toy Attention page) or the needle view (/phenomena?phen=needle on SmolLM2, its grid and its
retrieval map drawn: the ablation runs when its toggle is turned on). Each session's first view (from its own goto
to drawn: script finished, figure there; timed in the page), p50 / p95, the server's CPU seconds until the last
(/proc/<pid>/stat, warm-up included) and the load average before and after; with 6 sessions on the default page,
then the server CPU of a head switch once warm. `floor`: the same sessions on a Streamlit app that draws one tiny
chart and nothing else (FLOOR_APP): what the browsers and Streamlit alone cost on this machine.

    .venv/bin/python bench/load.py --class-follow [--followers 40] [--follow-idle 20] [--follow-changes 6]

Issue 41: a live class's followers. One `streamlit run` with a SQLite room store of its own, a room and N seats
(made in the store, as joins would), and N headless followers (class Follower: one asyncio websocket session each,
doing what a following tab does to follow: the HTTP poll of /_al/class/version once a second and, when it moved,
the hidden button's fragment rerun that follows the teacher; not the browser's drawing). The server's CPU
(/proc/<pid>/stat) over --follow-idle seconds with nobody following (the reference, same server, same run) and with
N following an idle room gives the CPU per follower per second; then the teacher switches heads on the default page
--follow-changes times (the room's state written as the teacher's run writes it), and for each follower and change
the time until its address showed the change and until the run that drew it ended (p50 / p95), with the server CPU
per change and the load average.

    .venv/bin/python bench/load.py --first-view-cost [--class-pages default,needle] [--shimmer-reference]

Issue 43: where one first view's time goes, robust under load (CPU, not wall time): a fresh server, one session
(its tab up on a blank page before the server starts) opens the page; the tab's main-thread time (CDP
Performance.getMetrics), the CPU of Chromium's processes by type, the server's CPU, the script runs, websocket
frames and figures. --shimmer-reference: the same with Streamlit's animated skeletons put back (what the app's
still-skeleton style saves: viz/ui/chrome.py).

    .venv/bin/python bench/load.py --warm-order

Issue 43 §1: the entry points (lessons, sidebar, links) that open each warm-up piece's views, and the order they
give (viz/ui/warmup.py ORDER must be it: tests/test_warmup_yield.py).

    .venv/bin/python bench/load.py --hall 2 --sessions 40 [--hall-port 8700] [--via select]

A lecture hall (issue 20 §2): `deploy/hall.sh up N` (N replicas behind HAProxy, cookie affinity) and
the same class driven through the proxy. It prints sessions per replica, server CPU per click per
replica, redraw p50/p95, exceptions and sessions that saw another's input (both must be 0); then it
kills one replica (SIGKILL, its sessions open) and counts the sessions that came back on a live
replica with the same view (URL and head) within 10 s. `--via select` clicks the Head select (a
server round trip) instead of the heatmap's head buttons (drawn in the browser): use it to measure
what a replica can serve (`--hall 1`, growing --sessions).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import app as bench  # noqa: E402  (bench/app.py: servers, the browser, the head-switch probe)

TARGET_CPU_CLICK_S = 0.050  # server CPU per head switch
TARGET_CPU_CLICK_LM_S = 0.030  # the same with SmolLM2 warm in the server (issue 26 §3)
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
HALL = ROOT / "deploy" / "hall.sh"
HALL_COOKIE = "ATTNLAB"  # deploy/haproxy.cfg: the cookie that names a browser's replica
RECOVER_S = 10.0  # a killed replica's sessions must be back (same view, live replica) within this
# Every change of the app's script state, with the browser's clock (ms since the epoch), kept in the tab's
# sessionStorage: it survives the reload viz/ui/failover.py does when a tab finds its replica gone, and it
# tells when a session's script ran again after a kill without the benchmark having to poll at the right
# moment (the DOM keeps the old picture while disconnected). An init script of every context; it only
# watches once the drill has armed it (no observer during the measured clicks).
WATCH_RUNS = """(() => {
    const arm = () => {
        if (window.__alWatching || sessionStorage.getItem('__al_watch') !== '1') return;
        window.__alWatching = true;
        let last = null;
        new MutationObserver(() => {
            const app = document.querySelector('[data-testid="stApp"]');
            const state = app && app.getAttribute('data-test-script-state');
            if (state === last) return;
            last = state;
            const runs = JSON.parse(sessionStorage.getItem('__al_runs') || '[]');
            runs.push([state, Date.now()]);
            sessionStorage.setItem('__al_runs', JSON.stringify(runs));
        }).observe(document, {attributes: true, childList: true, subtree: true});  // no <html> yet at init
    };
    window.__alArm = () => { sessionStorage.setItem('__al_watch', '1'); sessionStorage.setItem('__al_runs', '[]');
                             arm(); };
    arm();
})()"""
RUNS = "() => JSON.parse(sessionStorage.getItem('__al_runs') || '[]')"


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


def warm_lm_ratio(browser, clicks: int) -> dict:
    """Server CPU per head switch on the Attention page (the default toy model) on two fresh servers: one that
    warms SmolLM2 at start (the default) and one started with ATTENTION_LAB_WARM_LM=0 (issue 26 §3: a warm
    language model must not make every toy click dearer). Each server is idle (warm-up done) before the clicks."""
    out = {}
    for label, env in (("no LM", {"ATTENTION_LAB_WARM_LM": "0"}), ("SmolLM2 warm", {})):
        port = bench.free_port()
        proc = bench.start_server(ROOT / "app.py", port, env=env)
        try:
            bench.wait_health(port)
            quiet_cpu(proc.pid, 2.0)  # the warm-up thread has finished (SmolLM2 loaded and traced)
            res = one_session(browser, f"http://127.0.0.1:{port}", proc.pid, clicks)
            res["rss"] = rss_mb(proc.pid)
            out[label] = res
        finally:
            bench.stop_server(proc)
    return out


def report_warm_lm_ratio(out: dict, clicks: int) -> None:
    base = out["no LM"]["cpu_click"]
    for label, res in out.items():
        print(f"head switch, default toy model, {label:13s} server CPU {res['cpu_click'] * 1000:6.1f} ms/click "
              f"({clicks} clicks), redraw p50 {statistics.median(res['redraw']) * 1000:.0f} ms, RSS {res['rss']:.0f} MB"
              f"   ratio to no LM {res['cpu_click'] / max(base, 1e-4):.2f}")
    warm = out["SmolLM2 warm"]["cpu_click"]
    print(f"target: <= {TARGET_CPU_CLICK_LM_S * 1000:.0f} ms/click with SmolLM2 warm   "
          f"[{verdict(warm <= TARGET_CPU_CLICK_LM_S)}]")


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

    def __init__(self, base: str, students: list[int], clicks: int, results: list, start: threading.Barrier,
                 via: str = "auto", drill: Drill | None = None, tour: bool = True, think: float = 0.0,
                 query: str = "", offset: float = 0.0):
        super().__init__(daemon=True)
        self.base, self.students, self.clicks, self.results, self.start_line = base, students, clicks, results, start
        self.via, self.drill, self.pages_tour = via, drill, tour
        self.think, self.query, self.offset = think, query, offset  # pacing; extra URL query ("&checkpoint=x")

    @staticmethod
    def sentence(i: int) -> str:
        return DATES[i] if i < len(DATES) else f"{1 + i % 28} may {1950 + i}"

    def run(self) -> None:
        from playwright.sync_api import sync_playwright

        # sessions: per page, its replica (hall), clicks and redraws, and after a drill its recovery
        self.out = out = {"redraw": [], "clicks": 0, "errors": [], "foreign": [],
               "sessions": [{"replica": None, "clicks": 0, "redraw": [], "recovered": None} for _ in self.students]}
        try:
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=bench.CHROMIUM, args=bench.ARGS)
                try:
                    pages = []
                    for _ in self.students:
                        ctx = b.new_context(viewport={"width": 1200, "height": 1600})
                        ctx.add_init_script(WATCH_RUNS)  # idle until a drill arms it
                        pages.append(ctx.new_page())
                    for page in pages:
                        page.set_default_timeout(300_000)  # 2 cores for the server, the class and the browsers
                    self.start_line.wait()
                    self.tour(pages, out)
                    if self.drill is not None:
                        self.drill.watch(pages, [self.sentence(i) for i in self.students], out)
                finally:
                    b.close()
        except Exception as e:  # a failed group is a result, not a crash of the benchmark
            out["errors"].append(f"{type(e).__name__}: {str(e)[:200]}")
            if self.drill is not None:
                self.drill.abandon(out)  # the others must not wait for this group at the kill line
        self.results.append(out)

    def tour(self, pages: list, out: dict) -> None:
        texts = [self.sentence(i) for i in self.students]
        for page, text in zip(pages, texts, strict=True):
            page.goto(f"{self.base}/?text={text.replace(' ', '+')}{self.query}", wait_until="commit")
        sessions = out["sessions"]
        for page, text, me in zip(pages, texts, sessions, strict=True):
            settled(page)
            me["replica"] = replica_of(page)
            self.check(page, text, out)
        time.sleep(self.offset if self.think else 0)  # paced groups start apart, not all at once
        last_round = time.perf_counter()
        for k in range(self.clicks):
            if k and self.think:  # a student clicks once every `think` s (if the round left time)
                time.sleep(max(0.0, self.think - (time.perf_counter() - last_round)))
            last_round = time.perf_counter()
            for page, text, me in zip(pages, texts, sessions, strict=True):
                took = self.guarded(out, bench.pick_head, page, (k + 1) % 4, self.via)
                if took is not None:
                    out["redraw"].append(took)
                    me["redraw"].append(took)
                out["clicks"] += 1
                me["clicks"] += 1
                self.check(page, text, out)
        for link, path in (("Tokens & embeddings", "/tokens"), ("Attention", "/")) if self.pages_tour else ():
            for page in pages:
                self.guarded(out, page.locator('[data-testid="stSidebarNav"]').get_by_role(
                    "link", name=link, exact=True).click)
            for page, text, me in zip(pages, texts, sessions, strict=True):
                self.guarded(out, page.wait_for_function, f"() => location.pathname === {path!r}")
                self.guarded(out, settled, page)
                out["clicks"] += 1
                me["clicks"] += 1
                self.check(page, text, out)

    @staticmethod
    def guarded(out: dict, fn, *args):
        """fn(*args), or None with the error recorded: one page's failure is counted, and the group's other
        sessions carry on (and stay open for a drill)."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - an exception on a page is a result to count
            out["errors"].append(f"{type(e).__name__}: {str(e)[:300]}")
            return None

    @staticmethod
    def check(page, text: str, out: dict) -> None:
        if page.locator('[data-testid="stException"]').count():
            out["errors"].append(page.locator('[data-testid="stException"]').first.inner_text()[:200])
        for title in page.evaluate(TITLES):
            if "“" in title and f"“{text}”" not in title:
                out["foreign"].append(title)


LLM_HEATMAP = ".st-key-llm_head_fig .js-plotly-plot"  # /llm's head heatmap (head buttons switch in the browser)
MARKERS = ["otter", "zebra", "falcon", "walnut", "violin", "harbor", "pepper", "candle", "meadow", "rocket",
           "saddle", "turnip", "glacier", "lantern", "mango", "beetle", "anchor", "tulip", "cobalt", "pebble",
           "marble", "lizard", "orchid", "bucket"]  # one per session: its prompt names it, no other does
FILLER = ("The river runs past the old mill, where the miller counts his sacks of grain each morning before the "
          "market opens and the carts roll in from the villages along the valley road. ")
PLOT_TEXT = """() => [...document.querySelectorAll('.js-plotly-plot')].map(el => [el.layout?.title?.text || '',
    ...(el.data || []).flatMap(d => [...(d.x || []), ...(d.y || [])].map(String))].join(' ')).join(' ')"""


def soak_prompt(i: int, tokens: int, lm) -> str:
    """Session i's prompt: its marker word, then filler cut to `tokens` tokens (short: a sentence), then the marker
    again: a long prompt's document view shows the text before the chosen (last) position, not its start."""
    head = f"A note about the {MARKERS[i]}: the {MARKERS[i]} came back today."
    if tokens <= 0:
        return head
    tail = f" So the {MARKERS[i]} came back."
    n_tail = lm.encode(tail).shape[1]
    ids = lm.encode(head + " " + FILLER * (tokens // 20 + 2))[0, :tokens - n_tail]
    return lm.decode(ids.tolist()) + tail


def llm_pick_head(page, h: int) -> float:
    """/llm: click head h's button in the head heatmap (or, where the heatmap carries one head only, choose it
    in the Head select: a server round trip); seconds until it is redrawn with that head."""
    buttons = page.locator(f"{LLM_HEATMAP} .updatemenu-button")
    if buttons.count() > h:
        target = buttons.nth(h)
        target.scroll_into_view_if_needed()
    else:
        page.get_by_test_id("stMainBlockContainer").get_by_role("combobox", name="Head", exact=True).first.click()
        target = page.get_by_role("option", name=str(h), exact=True)
        target.wait_for(timeout=60_000)
    t0 = time.perf_counter()
    target.click()
    # redrawn: a figure titled with head h (the full view), or, for a long prompt's lazy views (titled
    # otherwise), the URL naming head h and the script run finished
    page.wait_for_function(
        "h => [...document.querySelectorAll('.js-plotly-plot')].some("
        "el => (el.layout?.title?.text || '').includes('· head ' + h + ' ·')) || ("
        "new URLSearchParams(location.search).get('head') === String(h) && document.querySelector("
        "'[data-testid=\"stApp\"][data-test-script-state=\"notRunning\"]') && "
        "!document.querySelector('[data-testid=\"stStatusWidget\"]'))", arg=h, polling="raf", timeout=300_000)
    took = time.perf_counter() - t0
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=300_000)
    page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached", timeout=300_000)
    return took


def set_llm_prompt(page, text: str) -> None:
    """Type (paste) a prompt into /llm's prompt box and submit it (Ctrl+Enter), then wait for the page."""
    box = page.get_by_test_id("stMainBlockContainer").get_by_label("Prompt", exact=True)  # not the sidebar's
    box.fill(text)
    box.press("Control+Enter")
    page.wait_for_timeout(300)
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=600_000)
    page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached", timeout=600_000)


def llm_page_problem(page) -> str | None:
    """None when /llm shows a figure (the head heatmap, or a long prompt's views) and no error or refusal;
    else what it shows."""
    for sel in ('[data-testid="stException"]', '[data-testid="stAlertContentError"]'):
        if page.locator(sel).count():
            return page.locator(sel).first.inner_text()[:300]
    if not page.locator(".js-plotly-plot .main-svg").count():
        return "no figure"
    return None


class LLMGroup(threading.Thread):
    """Some students of the soak in one Chromium: each opens /llm on SmolLM2 with its own prompt (typed into
    the prompt box), then switches heads `clicks` times. Every page is checked for exceptions and for
    another session's marker word (in the page's text or any figure's labels)."""

    def __init__(self, base: str, students: list[int], prompts: dict[int, str], clicks: int, results: list,
                 start: threading.Barrier, long: frozenset = frozenset()):
        super().__init__(daemon=True)
        self.base, self.students, self.prompts, self.clicks, self.long = base, students, prompts, clicks, long
        self.results, self.start_line = results, start

    def run(self) -> None:
        from playwright.sync_api import sync_playwright

        out = {"redraw": [], "long_redraw": [], "errors": [], "foreign": [], "own_missing": [], "clicks": 0}
        try:
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=bench.CHROMIUM, args=bench.ARGS)
                try:
                    pages = [b.new_context(viewport={"width": 1400, "height": 2000}).new_page() for _ in self.students]
                    for page in pages:
                        page.set_default_timeout(600_000)
                    self.start_line.wait()
                    for page in pages:
                        page.goto(f"{self.base}/llm?checkpoint=smollm2&view=heads", wait_until="commit")
                    for page, i in zip(pages, self.students, strict=True):
                        Group.guarded(out, settled, page, 600_000)
                        Group.guarded(out, set_llm_prompt, page, self.prompts[i])
                        self.check(page, i, out)
                    for k in range(self.clicks):
                        for page, i in zip(pages, self.students, strict=True):
                            took = Group.guarded(out, llm_pick_head, page, (k + 1) % 9)
                            if took is not None:
                                out["long_redraw" if i in self.long else "redraw"].append(took)
                            out["clicks"] += 1
                            self.check(page, i, out)
                finally:
                    b.close()
        except Exception as e:  # noqa: BLE001 - a failed group is a result
            out["errors"].append(f"{type(e).__name__}: {str(e)[:200]}")
        self.results.append(out)

    def check(self, page, i: int, out: dict) -> None:
        try:
            problem = llm_page_problem(page)
            if problem:
                out["errors"].append(f"session {i}: {problem}")
            seen = page.evaluate(PLOT_TEXT) + " " + page.locator("body").inner_text()
        except Exception as e:  # noqa: BLE001
            out["errors"].append(f"session {i}: {type(e).__name__}: {str(e)[:200]}")
            return
        others = [m for j, m in enumerate(MARKERS) if j != i and j in self.prompts and m in seen]
        if others:
            out["foreign"].append(f"session {i} ({MARKERS[i]}) shows {others}")
        if MARKERS[i] not in seen:
            out["own_missing"].append(i)


def longest_llm_prompt(browser, base: str, lm, want: int) -> tuple[int, str | None]:
    """The longest prompt (tokens) /llm shows without an error, trying want, then 1024, 512, 276, 256, 128;
    with the message the page gave at `want` when it refused it."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 2000})
    page = ctx.new_page()
    page.set_default_timeout(600_000)
    first_problem = None
    try:
        page.goto(f"{base}/llm?checkpoint=smollm2&view=heads")
        settled(page, 600_000)
        for n in sorted({want, *(x for x in (1024, 512, 276, 256, 128) if x < want)}, reverse=True):
            set_llm_prompt(page, soak_prompt(len(MARKERS) - 1, n, lm))
            problem = llm_page_problem(page)
            if problem is None:
                return n, first_problem
            first_problem = first_problem or problem
        return 0, first_problem
    finally:
        ctx.close()


def llm_soak(args) -> None:
    """Issue 24 §6: `args.sessions` browsers on /llm (SmolLM2), `args.long_sessions` of them with
    `args.long_tokens`-token prompts (or the longest /llm takes), `args.clicks` head switches each."""
    from playwright.sync_api import sync_playwright

    from model import load_model

    lm = load_model("smollm2")  # its tokenizer cuts the long prompts to an exact length
    port = bench.free_port()
    env = {"ATTENTION_LAB_TRACE_IDLE_S": str(args.idle)} if args.idle else None
    proc = bench.start_server(ROOT / "app.py", port, env=env, extra=["--server.disconnectedSessionTTL", "2"])
    base = f"http://127.0.0.1:{port}"
    mem_idle = None
    try:
        bench.wait_health(port)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=bench.CHROMIUM, args=bench.ARGS)
            try:
                long_n, refused = longest_llm_prompt(browser, base, lm, args.long_tokens)
            finally:
                browser.close()
        time.sleep(3)  # > disconnectedSessionTTL: the probe's session is dropped
        quiet_cpu(proc.pid, 2.0)
        mem_before = rss_mb(proc.pid)
        n_long = min(args.long_sessions, args.sessions) if long_n else 0
        prompts = {i: soak_prompt(i, long_n if i < n_long else 0, lm) for i in range(args.sessions)}
        results: list = []
        n_groups = min(args.browsers, args.sessions)
        line = threading.Barrier(n_groups)
        groups = [LLMGroup(base, list(range(g, args.sessions, n_groups)), prompts, args.clicks, results, line,
                           frozenset(range(n_long))) for g in range(n_groups)]
        c0, t0, peak = cpu_seconds(proc.pid), time.perf_counter(), mem_before
        for g in groups:
            g.start()
        while any(g.is_alive() for g in groups):
            peak = max(peak, rss_mb(proc.pid))
            time.sleep(0.2)
        wall, cpu = time.perf_counter() - t0, cpu_seconds(proc.pid) - c0
        time.sleep(6)  # > disconnectedSessionTTL: closed sessions are dropped
        quiet_cpu(proc.pid, 1.0)
        mem_after = rss_mb(proc.pid)
        if args.idle:  # the traces' idle time, then the sweeper's next look (every idle/4 s, at most 60 s)
            time.sleep(args.idle + min(60.0, args.idle / 4) + 2)
            mem_idle = rss_mb(proc.pid)
    finally:
        bench.stop_server(proc)
    red = [x for r in results for x in r["redraw"]]
    long_red = [x for r in results for x in r["long_redraw"]]
    errors = [e for r in results for e in r["errors"]]
    foreign = [f for r in results for f in r["foreign"]]
    missing = sorted({i for r in results for i in r["own_missing"]})
    clicks = sum(r["clicks"] for r in results)
    print(f"soak (issue 24 §6): {args.sessions} browser sessions on /llm (SmolLM2), {n_long} of them with "
          f"{long_n}-token prompts" + (f" (asked for {args.long_tokens}; /llm refused it: {refused[:160]!r})"
                                       if long_n != args.long_tokens else "")
          + f", the others with one sentence; {args.clicks} head switches each, {args.browsers} Chromium processes;"
          f" {wall:.0f} s, server CPU {cpu:.0f} s; load average {os.getloadavg()[0]:.1f} at the end (2 cores)")
    print(f"memory (RSS): before the class {mem_before:.0f} MB, peak {peak:.0f} MB, after every session closed "
          f"{mem_after:.0f} MB   after / before {mem_after / mem_before:.2f}")
    if mem_idle is not None:
        print(f"memory (RSS) once the class's traces went unused for {args.idle:.0f} s "
              f"(ATTENTION_LAB_TRACE_IDLE_S): {mem_idle:.0f} MB   after / before {mem_idle / mem_before:.2f}")
    print(f"exceptions or error messages {len(errors)}   sessions that showed another's prompt {len(foreign)}   "
          f"[{verdict(not errors and not foreign)}]")
    for e in (errors + foreign)[:6]:
        print("   ", e)
    if missing:
        print(f"  sessions whose own marker word was not on the page at some check: {missing}")
    for label, xs in (("short prompts", red), (f"{long_n}-token prompts", long_red)):
        if xs:
            print(f"head switch redraw, {label}: p50 {statistics.median(xs) * 1000:.0f} ms, p95 "
                  f"{percentile(xs, .95) * 1000:.0f} ms ({len(xs)} of {clicks} clicks)")


def replica_of(page) -> str | None:
    """The replica HAProxy pinned this browser context to (its affinity cookie), None without a hall."""
    return next((c["value"] for c in page.context.cookies() if c["name"] == HALL_COOKIE), None)


def same_view(page, url: str, text: str) -> str | None:
    """None when the page shows the view `url` names (same query, its sentence, its head); else what differs."""
    from urllib.parse import parse_qs, urlsplit

    if parse_qs(urlsplit(page.url).query) != parse_qs(urlsplit(url).query):
        return f"URL changed: {url} -> {page.url}"
    head = parse_qs(urlsplit(url).query).get("head", ["0"])[0]
    titles = page.evaluate(TITLES)
    if not any(f"“{text}”" in x and f"· head {head} ·" in x for x in titles):
        return f"no heatmap of “{text}”, head {head}: {[x[:80] for x in titles[:3]]}"
    return None


class Drill:
    """A replica dies mid-class: every group holds its pages open at the kill line; the main thread kills
    one replica (SIGKILL); each group then watches its pages on that replica come back (the Streamlit
    frontend reconnects by itself, HAProxy redispatches the dead replica's cookie to a live one, and the
    new session runs the script from the URL). A session counts as recovered when its script ran again
    after the kill and it shows the view its URL held before, from a live replica."""

    def __init__(self, groups: int, wait: float = 30.0):
        self.ready = threading.Barrier(groups + 1, timeout=900)
        self.killed = threading.Event()
        self.victim: str | None = None
        self.t_kill = 0.0  # time.time() of the kill: the browsers' Date.now() shares this clock
        self.wait = wait  # how long to watch (longer than RECOVER_S, to report late recoveries too)

    def abandon(self, out: dict) -> None:
        """A group that failed before the kill line still arrives there (once), so no one waits for it."""
        if not out.get("at_kill_line"):
            out["at_kill_line"] = True
            self.ready.wait()

    def watch(self, pages: list, texts: list[str], out: dict) -> None:
        views = []
        for page in pages:
            page.evaluate("() => window.__alArm()")
            views.append(page.url)
        out["at_kill_line"] = True
        self.ready.wait()
        if not self.killed.wait(timeout=900):
            return
        sessions = out["sessions"]
        pending = [i for i, me in enumerate(sessions) if me["replica"] == self.victim]
        kill_ms = self.t_kill * 1000
        deadline = time.monotonic() + self.wait
        while pending and time.monotonic() < deadline:
            for i in list(pending):
                try:
                    runs = pages[i].evaluate(RUNS)
                except Exception:  # noqa: BLE001 - the page is reloading: ask again next round
                    continue
                ran = [ms for state, ms in runs if state == "running" and ms >= kill_ms]
                done = [ms for state, ms in runs if state == "notRunning" and ran and ms > ran[0]]
                if not done:
                    continue
                pending.remove(i)
                settled(pages[i], timeout=60_000)
                problem = same_view(pages[i], views[i], texts[i])
                now = replica_of(pages[i])
                if problem is None and now == self.victim:
                    problem = f"its cookie still names the dead replica {now}"
                sessions[i]["recovered"] = (done[0] - kill_ms) / 1000
                sessions[i]["problem"] = problem
                sessions[i]["now_on"] = now
            time.sleep(0.1)
        for page, text in zip(pages, texts, strict=True):
            self.check_after(page, text, out)

    @staticmethod
    def check_after(page, text: str, out: dict) -> None:
        Group.check(page, text, out)


def hall(cmd: str, port: int, *args: str, extra: str = "") -> None:
    """deploy/hall.sh <cmd> [args] with HALL_PORT=port (HALL_ARGS=extra: more `streamlit run` options)."""
    env = {**os.environ, "HALL_PORT": str(port), "HALL_RUN": str(hall_run_dir(port)), "HALL_ARGS": extra,
           "HALL_PYTHON": os.environ.get("HALL_PYTHON", sys.executable)}  # replicas run this interpreter
    subprocess.run(["bash", str(HALL), cmd, *args], env=env, check=True, timeout=400)


def hall_run_dir(port: int) -> Path:
    return Path(f"/tmp/attention-lab-hall-{port}")


def replica_pids(port: int) -> dict[str, int]:
    """Replica name (HAProxy's server name and cookie value, r1..rN) -> pid of its process group leader."""
    files = sorted(hall_run_dir(port).glob("replica-*.pid"), key=lambda f: int(f.stem.split("-")[1]))
    return {f"r{f.stem.split('-')[1]}": int(f.read_text()) for f in files}


def kill_replica(port: int, name: str) -> float:
    """SIGKILL replica `name` (its whole process group, which hall.sh made it lead); returns time.time()."""
    os.killpg(replica_pids(port)[name], signal.SIGKILL)
    return time.time()


def run_class(base: str, sessions: int, clicks: int, browsers: int, via: str = "auto",
              drill: bool = False, port: int | None = None, on_kill_line=None, tour: bool = True,
              think: float = 0.0, query: str = "") -> dict:
    """The class through `base`; with drill (a hall on `port`), the replica holding the most sessions is
    killed once every session has toured. on_kill_line(): called just before the kill (e.g. stop training).
    Returns the groups' results, per-replica CPU during the class, the class wall time and the drill."""
    n_groups = min(browsers, sessions)
    results: list = []
    d = Drill(n_groups) if drill else None
    pids = replica_pids(port) if port is not None else {}
    line = threading.Barrier(n_groups)
    groups = [Group(base, list(range(g, sessions, n_groups)), clicks, results, line, via, d, tour, think, query,
                    offset=think * g / n_groups)
              for g in range(n_groups)]
    c0 = {r: cpu_seconds(pid) for r, pid in pids.items()}
    t0 = time.perf_counter()
    for g in groups:
        g.start()
    out = {"results": results, "drill": d}
    if d is not None:
        d.ready.wait()  # every group toured and holds its pages open
        out["wall"] = time.perf_counter() - t0
        out["cpu"] = {r: cpu_seconds(pid) - c0[r] for r, pid in pids.items()}
        if on_kill_line is not None:
            on_kill_line()
        counts: dict[str, int] = {}
        for r in results_sessions(groups_partial(groups)):
            counts[r["replica"]] = counts.get(r["replica"], 0) + 1
        d.victim = max((r for r in counts if r in pids), key=counts.get, default="r1")
        d.t_kill = kill_replica(port, d.victim)
        d.killed.set()
    for g in groups:
        g.join(timeout=1800)
    if d is None:
        out["wall"] = time.perf_counter() - t0
        out["cpu"] = {r: cpu_seconds(pid) - c0[r] for r, pid in pids.items()}
    return out


def groups_partial(groups: list[Group]) -> list[dict]:
    """The groups' results so far (at the kill line every group's `out` is complete up to the drill)."""
    return [g.out for g in groups if getattr(g, "out", None) is not None]


def results_sessions(outs: list[dict]) -> list[dict]:
    return [s for o in outs for s in o["sessions"]]


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
    stop = page.get_by_role("button", name="⏹ Stop")
    if stop.count():  # else the run already ended (a slow class outlasts its 500 steps)
        stop.click()
        stop.wait_for(state="detached", timeout=120_000)
    page.context.close()


# ---------------------------------------------------------------- issue 43 §1: the warm-up's measured order

# Each piece the warm-up computes after the default page -> the views that show it on their defaults (read from the
# pages: lm_compute and why_induction in viz/lessons, the sections of viz/pages/phenomena.py). SmolLM2 (its load and
# /llm's trace) is every language-model view: the lessons on it, /llm, every /phenomena section.
SHOWN_ON = {
    "sink_effect": [("lesson", "sinks"), ("phen", "sinks")],
    "induction": [("lesson", "induction"), ("lesson", "why-here"), ("phen", "patterns"), ("phen", "induction")],
    "induction_ablation": [("phen", "induction")],
    "ioi": [("lesson", "ioi"), ("phen", "ioi")],
    "logit_lens": [("lesson", "lens")],
    "needle_grid": [("phen", "needle")],
    "needle_ablation": [("phen", "needle")],  # behind a toggle on that view (the warm-up makes it instant)
    "learn": [("lesson", "induction-forms"), ("page", "learn")],
}
PHEN_LINK = r"phen(?:=|[\"']\s*:\s*[\"'])(sinks|patterns|induction|ioi|needle)\b"


def view_entry_points() -> dict:
    """view -> how many entry points of the app open it: each lesson (its own view, and its link to the full page),
    the sidebar (each page on its default view: /phenomena opens on sinks), and every `?phen=` link in the pages and
    the README before its Performance section (the Lesson list and /phenomena's own menu aside: counted above, or the
    page itself)."""
    import re
    from collections import Counter

    sys.path.insert(0, str(ROOT))
    from viz import lessons as LS

    views: Counter = Counter()
    for lesson in LS.LESSONS:
        views[("lesson", lesson.slug)] += 1
        page = Path(lesson.page).stem
        views[("phen", lesson.page_query.get("phen", "sinks")) if page == "phenomena" else ("page", page)] += 1
    for view in (("page", "llm"), ("page", "learn"), ("phen", "sinks")):  # the sidebar's links
        views[view] += 1
    skip = {ROOT / "viz" / "lessons" / "__init__.py", ROOT / "viz" / "pages" / "phenomena.py"}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    texts = [readme.split("\n## Performance\n")[0]]  # what a reader opens; the benchmarks' own addresses are not
    texts += [f.read_text(encoding="utf-8") for f in sorted((ROOT / "viz").rglob("*.py")) if f not in skip]
    for text in texts:
        for m in re.finditer(PHEN_LINK, text):
            views[("phen", m[1])] += 1
    return dict(views)


def warm_order_counts() -> dict[str, int]:
    """piece -> entry points that open a view showing it (`view_entry_points`)."""
    from viz import lessons as LS

    views = view_entry_points()
    counts = {piece: sum(views.get(v, 0) for v in shown) for piece, shown in SHOWN_ON.items()}
    lm_views = {("lesson", x.slug) for x in LS.LESSONS if x.checkpoint == LS.LM_NAME} | {("page", "llm")}
    counts["smollm2"] = sum(n for v, n in views.items() if v in lm_views or v[0] == "phen")
    return counts


NEEDS = {"induction_ablation": "induction", "needle_ablation": "needle_grid"}  # computed from the other's result


def measured_order(cost: dict[str, float]) -> list[str]:
    """The pieces, most entry points first; a tie, the cheaper first, where a piece that needs another's result
    costs both (so it never comes before the one it needs)."""
    counts = warm_order_counts()
    return sorted(counts, key=lambda p: (-counts[p], cost[p] + cost.get(NEEDS.get(p, ""), 0.0)))


# ---------------------------------------------------------------- issue 43: a class that opens together

TARGET_CLASS_P50_S, TARGET_CLASS_P95_S = 10.0, 20.0  # 6 sessions on the default page right after the start
TARGET_NEEDLE_COLD_S = 30.0  # the needle view, one browser, right after the start
TARGET_SWITCH_WARM_S = 0.080  # a head switch once the server is warm (server CPU)
CLASS_PAGES = {  # page -> (address, what must be drawn for its first view)
    "default": ("/", ".js-plotly-plot .main-svg"),
    "needle": ("/phenomena?checkpoint=smollm2&phen=needle", ".st-key-phen_needle_map .js-plotly-plot .main-svg"),
    "floor": ("/", ".js-plotly-plot .main-svg"),  # FLOOR_APP, not the lab: what any Streamlit page with a chart costs
}
# The floor under the class-start target: a Streamlit app that only draws one tiny plotly chart, opened by the same N
# sessions in the same way. What its first views take here is what the browsers and Streamlit cost with no work of
# the lab's at all (no model, no warm-up): on a machine where the tabs share the server's cores, no server-side
# change can bring the lab's first views below it.
FLOOR_APP = """import plotly.graph_objects as go
import streamlit as st
st.title("Floor")
st.plotly_chart(go.Figure(go.Heatmap(z=[[0, 1], [1, 0]])))
"""
# When the first view is drawn, with the browser's clock: the script run finished, no status widget, the page's
# figure drawn (or an error shown). Kept in the page, so that waiting for one session never delays the time
# another records (Playwright's sync API waits on one page at a time).
FIRST_VIEW = """(() => {
    const tick = setInterval(() => {
        const app = document.querySelector('[data-testid="stApp"]');
        if (!app || window.__alFirst) return;
        const failed = document.querySelector('[data-testid="stException"], [data-testid="stAlertContentError"]');
        const idle = app.getAttribute('data-test-script-state') === 'notRunning'
            && !document.querySelector('[data-testid="stStatusWidget"]');
        if (failed || (idle && document.querySelector(%r))) {
            window.__alFirst = {at: Date.now(), error: failed ? failed.innerText.slice(0, 200) : null};
            clearInterval(tick);
        }
    }, 100);
})()"""


def class_start(browser, page: str, n: int, env: dict | None = None, switch_clicks: int = 0) -> dict:
    """A fresh server; as soon as it answers its health check, `n` sessions (contexts of one browser, made
    before the start) open `page` at once. Each session's first view (s, from its own goto), the server's CPU
    seconds until the last one (warm-up included), the load average; with switch_clicks, then the server CPU of a
    head switch once the server is idle (the warm-up done)."""
    path, drawn = CLASS_PAGES[page]
    ctxs = []
    for _ in range(n):
        ctx = browser.new_context(viewport={"width": 1200, "height": 1600})
        ctx.add_init_script(FIRST_VIEW % drawn)
        ctxs.append(ctx)
    pages = [c.new_page() for c in ctxs]
    port = bench.free_port()
    app = ROOT / "app.py"
    if page == "floor":
        app = Path(tempfile.mkdtemp(prefix="al-floor-")) / "floor_app.py"
        app.write_text(FLOOR_APP, encoding="utf-8")
    load_before = os.getloadavg()
    trace = Path(tempfile.mkstemp(prefix="warm-trace-", suffix=".txt")[1])
    trace.write_text("", encoding="utf-8")  # the floor app writes no warm-up trace
    t_start = time.time()
    proc = bench.start_server(app, port, env={**(env or {}), "ATTENTION_LAB_WARM_TRACE": str(trace)})
    out: dict = {"page": page, "n": n, "load_before": load_before}
    try:
        bench.wait_health(port, timeout=120)
        out["health_s"] = time.time() - t_start
        opened = []
        for p in pages:
            opened.append(time.time() * 1000)
            p.goto(f"http://127.0.0.1:{port}{path}", wait_until="commit", timeout=300_000)
        deadline = time.monotonic() + 600
        firsts: list = [None] * n
        while any(f is None for f in firsts) and time.monotonic() < deadline:
            for i, p in enumerate(pages):
                if firsts[i] is None:
                    firsts[i] = p.evaluate("() => window.__alFirst || null")
            time.sleep(0.25)
        out["cpu_s"] = cpu_seconds(proc.pid)  # from the process's start: the warm-up's share included
        out["load_after"] = os.getloadavg()
        out["rss_mb"] = rss_mb(proc.pid)
        out["views"] = [(f["at"] - o) / 1000 if f else None for f, o in zip(firsts, opened, strict=True)]
        out["warm"] = warm_timeline(trace, t_start, max((f["at"] for f in firsts if f), default=0) / 1000)
        out["errors"] = [f["error"] for f in firsts if f and f["error"]]
        for c in ctxs:
            c.close()
        if switch_clicks:
            quiet_cpu(proc.pid, 3.0)  # the warm-up has finished: the steady state
            out["switch_cpu"] = one_session(browser, f"http://127.0.0.1:{port}", proc.pid, switch_clicks)["cpu_click"]
            out["load_switch"] = os.getloadavg()
    finally:
        bench.stop_server(proc)
        trace.unlink(missing_ok=True)
    return out


def warm_timeline(path: Path, t_start: float, t_last: float) -> str:
    """The warm-up until the last first view, from its trace (viz/ui/warmup.py, $ATTENTION_LAB_WARM_TRACE): when
    each piece began (s after the start) and how often and how long it paused for script runs."""
    pieces, paused, pauses, since, runs, last_run = [], 0.0, 0, None, 0, 0.0
    began: dict[str, float] = {}
    took: list[float] = []  # each script run, on the server: begin -> end
    for line in path.read_text(encoding="utf-8").splitlines():
        at, event = float(line.split()[0]), line.split(" ", 1)[1].rsplit(" active=", 1)[0]
        if at > t_last:
            break
        if event.startswith("start ") or event in ("default page warm", "done"):
            pieces.append(f"{event.removeprefix('start ')} {at - t_start:.0f}")
        elif event == "pause":
            pauses, since = pauses + 1, at
        elif event == "resume" and since is not None:
            paused, since = paused + at - since, None
        elif event.startswith("run begins"):
            runs += 1
            began[event.split()[-1]] = at
        elif event.startswith("run ends"):
            last_run = at - t_start
            took.append(at - began.pop(event.split()[-1], at))
    if since is not None:
        paused += t_last - since
    return (f"warm-up until the last view: {', '.join(pieces)}; paused {pauses}x, {paused:.0f} s; the sessions' "
            f"{runs} script runs (each on the server: p50 {statistics.median(took) if took else 0:.1f} s, max "
            f"{max(took, default=0):.1f} s), the last ended {last_run:.0f} s after the start; the last view drawn at "
            f"{t_last - t_start:.0f} s")


def report_class_start(res: dict) -> None:
    views = [v for v in res["views"] if v is not None]
    missing = len(res["views"]) - len(views)
    la = " / ".join(f"{x:.1f}" for x in res["load_before"][:1] + res["load_after"][:1])
    p50, p95 = (statistics.median(views), percentile(views, .95)) if views else (float("nan"),) * 2
    line = (f"class start: {res['n']:2d} sessions on {res['page']:7s} first view p50 {p50:5.1f} s, p95 {p95:5.1f} s "
            f"(max {max(views, default=float('nan')):.1f}); server CPU {res['cpu_s']:5.1f} s until the last "
            f"(health after {res['health_s']:.1f} s), RSS {res['rss_mb']:.0f} MB; load {la} (before / after)")
    if missing or res["errors"]:
        line += f"; {missing} not drawn in 10 min, {len(res['errors'])} errors: {res['errors'][:2]}"
    print(line)
    print("  ", res["warm"])
    if res["page"] in ("default", "floor") and res["n"] == 6:
        print(f"   target p50 <= {TARGET_CLASS_P50_S:.0f} s, p95 <= {TARGET_CLASS_P95_S:.0f} s   "
              f"[{verdict(p50 <= TARGET_CLASS_P50_S and p95 <= TARGET_CLASS_P95_S and not missing)}]")
    if res["page"] == "needle" and res["n"] == 1:
        print(f"   target <= {TARGET_NEEDLE_COLD_S:.0f} s   [{verdict(p50 <= TARGET_NEEDLE_COLD_S and not missing)}]")
    if "switch_cpu" in res:
        print(f"   then, warm: head switch server CPU {res['switch_cpu'] * 1000:.1f} ms/click (load "
              f"{res['load_switch'][0]:.1f})   target <= {TARGET_SWITCH_WARM_S * 1000:.0f} ms   "
              f"[{verdict(res['switch_cpu'] <= TARGET_SWITCH_WARM_S)}]")


def browser_cpu() -> dict[str, float]:
    """CPU seconds (utime + stime) of the Chromium processes this benchmark started, by process type (renderer,
    gpu-process: where headless Chromium composites and rasterizes in software, browser, utilities)."""
    parents: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents.setdefault(int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    out: dict[str, float] = {}
    todo = list(parents.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        todo += parents.get(pid, [])
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").strip("\0").split("\0")
            if len(argv) == 1:  # a zygote's child rewrites its command line as one space-separated string
                argv = argv[0].split(" ")
            if "chrom" not in Path(argv[0]).name:
                continue
            kind = next((a.split("=", 1)[1] for a in argv if a.startswith("--type=")), "browser")
            out[kind] = out.get(kind, 0.0) + cpu_seconds(pid)
        except (OSError, IndexError):
            pass
    return out


# Streamlit's skeleton shimmer put back for the reference run (--first-view-cost): the app's still-skeleton style
# (viz/ui/chrome.py STILL_SKELETONS) is taken out of the page as soon as it arrives.
SHIMMER_BACK = """new MutationObserver(ms => ms.forEach(m => m.addedNodes.forEach(n => {
    if (n.nodeType !== 1) return;
    for (const s of n.tagName === 'STYLE' ? [n] : n.querySelectorAll ? n.querySelectorAll('style') : [])
        if (s.textContent.includes("stSkeleton'] { animation: none")) s.remove();
}))).observe(document, {childList: true, subtree: true})"""
TAB_METRICS = ("TaskDuration", "ScriptDuration", "LayoutDuration", "RecalcStyleDuration")


def first_view_cost(browser, page: str, shimmer: bool = False) -> dict:
    """One session's first view of `page` right after a fresh `streamlit run` (its warm-up running, as a class
    meets it): the tab's main-thread time (CDP Performance.getMetrics: TaskDuration, ScriptDuration, ...), the
    CPU of every Chromium process by type, the server's CPU, the script runs the first view took, the websocket
    frames and figures it got. The browser and the tab (on a blank page) are started before the server, so none of
    their start-up is counted. shimmer: Streamlit's animated skeletons put back (the reference)."""
    path, drawn = CLASS_PAGES[page]
    ctx = browser.new_context(viewport={"width": 1200, "height": 1600})
    ctx.add_init_script(FIRST_VIEW % drawn)
    ctx.add_init_script("""(() => { window.__alRuns = 0; let last = null; new MutationObserver(() => {
        const s = document.querySelector('[data-testid="stApp"]')?.getAttribute('data-test-script-state');
        if (s !== last) { if (s === 'running') window.__alRuns++; last = s; } })
        .observe(document, {attributes: true, childList: true, subtree: true}); })()""")
    if shimmer:
        ctx.add_init_script(SHIMMER_BACK)
    tab = ctx.new_page()
    tab.goto("data:text/html,<p>ready</p>")  # the tab's renderer is up before the clock starts
    cdp = ctx.new_cdp_session(tab)
    cdp.send("Performance.enable")
    frames = [0, 0]
    tab.on("websocket", lambda ws: ws.on("framereceived", lambda f: frames.__setitem__(0, frames[0] + 1)
                                         or frames.__setitem__(1, frames[1] + len(f))))
    port = bench.free_port()
    load_before = os.getloadavg()
    proc = bench.start_server(ROOT / "app.py", port)
    try:
        bench.wait_health(port, timeout=120)
        m0 = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        b0, s0 = browser_cpu(), cpu_seconds(proc.pid)
        opened = time.time() * 1000
        tab.goto(f"http://127.0.0.1:{port}{path}", wait_until="commit", timeout=600_000)
        deadline, first = time.monotonic() + 600, None
        while first is None and time.monotonic() < deadline:
            first = tab.evaluate("() => window.__alFirst || null")
            time.sleep(0.1)
        m1 = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        b1, s1 = browser_cpu(), cpu_seconds(proc.pid)
        out = {"page": page, "shimmer": shimmer, "load": (load_before[0], os.getloadavg()[0]),
               "view_s": (first["at"] - opened) / 1000 if first else None, "error": first and first["error"],
               "tab": {k: m1.get(k, 0.0) - m0.get(k, 0.0) for k in TAB_METRICS},
               "browser": {k: v - b0.get(k, 0.0) for k, v in b1.items() if v - b0.get(k, 0.0) >= 0.005},
               "server_s": s1 - s0, "runs": tab.evaluate("() => window.__alRuns"), "frames": tuple(frames),
               "figures": tab.evaluate("() => document.querySelectorAll('.js-plotly-plot').length")}
    finally:
        bench.stop_server(proc)
        ctx.close()
    return out


def report_first_view_cost(res: dict) -> None:
    tab = ", ".join(f"{k.removesuffix('Duration')} {v:.2f}" for k, v in res["tab"].items())
    procs = ", ".join(f"{k} {v:.2f}" for k, v in sorted(res["browser"].items(), key=lambda kv: -kv[1]))
    view = f"{res['view_s']:.1f} s" if res["view_s"] is not None else "not drawn in 10 min"
    print(f"first view of {res['page']}{' (skeletons shimmering: the reference)' if res['shimmer'] else ''}: {view}"
          f"{' ERROR ' + res['error'] if res['error'] else ''}; load {res['load'][0]:.1f} / {res['load'][1]:.1f}")
    print(f"   tab main thread (s): {tab}; Chromium CPU {sum(res['browser'].values()):.2f} s ({procs}); server CPU "
          f"{res['server_s']:.2f} s; {res['runs']} script run(s), {res['frames'][0]} websocket frames "
          f"({res['frames'][1] / 1e3:.0f} kB), {res['figures']} figures")


def first_view_cost_main(args) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=bench.CHROMIUM, args=bench.ARGS)
        try:
            for page in args.class_pages.split(","):
                ours = first_view_cost(browser, page)
                report_first_view_cost(ours)
                if args.shimmer_reference:
                    ref = first_view_cost(browser, page, shimmer=True)
                    report_first_view_cost(ref)
                    cpu, cpu_ref = sum(ours["browser"].values()), sum(ref["browser"].values())
                    print(f"   Chromium CPU, still / shimmering skeletons: {cpu:.2f} / {cpu_ref:.2f} s = "
                          f"{cpu / cpu_ref:.2f}")
        finally:
            browser.close()


def class_start_main(args) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=bench.CHROMIUM, args=bench.ARGS)
        try:
            for page in args.class_pages.split(","):
                for n in (int(x) for x in args.class_sizes.split(",")):
                    switch = args.clicks if (page, n) == ("default", 6) else 0
                    report_class_start(class_start(browser, page, n, switch_clicks=switch))
        finally:
            browser.close()


# ---------------------------------------------------------------- issue 41: a class that follows the teacher
# Headless followers. Each one is what a following student's tab does to follow, over the same wire:
# - the tab's poller (viz/ui/classroom.py _POLLER): GET /_al/class/version?room=CODE every POLL_S on one kept-alive
#   connection, and when the answer differs from the version the strip last drew (and was not asked already), the
#   hidden button's click: a fragment rerun over the websocket (BackMsg rerun_script, the strip's fragment id and
#   the button's trigger), which follows the teacher (st.switch_page: a full run of the teacher's page);
# - the Streamlit session itself: a websocket (/_stcore/stream) that asks for the first run with the student's link
#   (?room=CODE; the seat in its cookie, as a browser sends it), reads every ForwardMsg (the address from
#   page_info_changed, the strip's version from its html, the button's id, the end of each run) and does the reruns
#   the server asks for (auto_rerun fragments).
# Not emulated: the browser's own work (parsing, layout, plotly drawing: the screen is "updated" here when the run
# that draws the teacher's view has sent its last message), the widget values a browser sends back with each rerun
# (only the button's trigger: the follow resets the page's widgets anyway), static files, and the message cache.
FOLLOW_HEADS = 8  # the teacher switches heads on the default page (/?head=h): the commonest change in a lecture


async def _http_get(conn: dict, port: int, path: str) -> str:
    """GET on one kept-alive HTTP/1.1 connection (reopened if the server closed it), as a tab's fetch does."""
    import asyncio

    for _ in range(2):
        if conn.get("w") is None:
            conn["r"], conn["w"] = await asyncio.open_connection("127.0.0.1", port)
        r, w = conn["r"], conn["w"]
        try:
            w.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nCache-Control: no-store\r\n\r\n".encode())
            await w.drain()
            head = (await r.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
            size = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
            return (await r.readexactly(size)).decode().strip()
        except (OSError, asyncio.IncompleteReadError, IndexError):
            conn["w"] = None
    raise OSError(f"GET {path}: no answer")


class Follower:
    """One headless following student (see above): `address`, `drawn` the times (monotonic) at which each query
    string reached it, and at which the run that drew it ended."""

    def __init__(self, port: int, code: str, seat: str):
        self.port, self.code = port, code
        self.query = f"room={code}&lang=en"
        self.cookie = f"al_class_seat={code}:{seat}"  # the student's seat: the browser's cookie, never the URL
        self.page_hash = ""
        self.v: str | None = None  # the version the strip last drew (its html: `c.seen = "N";`)
        self.asked: str | None = None
        self.button = self.fragment = None  # the hidden button's widget id, the strip's fragment id
        self.seen: list[tuple[float, str]] = []  # (time, query string) from page_info_changed
        self.finished: list[float] = []  # script_finished times
        self.clicks = self.polls = 0
        self.errors: list[str] = []

    async def run(self, stop) -> None:
        import asyncio
        import re

        import websockets
        from streamlit.proto.BackMsg_pb2 import BackMsg
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        version = re.compile(rb'c\.seen = "(\d+)";')

        def rerun(fragment: str = "", trigger: str | None = None, auto: bool = False) -> bytes:
            msg = BackMsg()
            cs = msg.rerun_script
            cs.query_string, cs.page_script_hash, cs.fragment_id, cs.is_auto_rerun = \
                self.query, self.page_hash, fragment, auto
            if trigger:
                w = cs.widget_states.widgets.add()
                w.id, w.trigger_value = trigger, True
            return msg.SerializeToString()

        async with websockets.connect(f"ws://127.0.0.1:{self.port}/_stcore/stream", subprotocols=["streamlit"],
                                      additional_headers={"Cookie": self.cookie}, max_size=None, open_timeout=120,
                                      ping_interval=None) as ws:
            autos: dict[str, asyncio.Task] = {}

            async def auto(fragment: str, every: float) -> None:  # what the browser does for st.fragment(run_every)
                while True:
                    await asyncio.sleep(every)
                    await ws.send(rerun(fragment, auto=True))

            async def read() -> None:
                async for raw in ws:
                    m = ForwardMsg()
                    m.ParseFromString(raw)
                    kind = m.WhichOneof("type")
                    now = time.monotonic()
                    if kind == "page_info_changed":
                        self.query = m.page_info_changed.query_string
                        self.seen.append((now, self.query))
                    elif kind == "new_session":
                        self.page_hash = m.new_session.page_script_hash
                    elif kind == "script_finished":
                        self.finished.append(now)
                    elif kind == "auto_rerun":
                        a = m.auto_rerun
                        if a.fragment_id not in autos:
                            autos[a.fragment_id] = asyncio.create_task(auto(a.fragment_id, a.interval))
                    elif kind == "stop_auto_rerun":
                        for task in autos.values():
                            task.cancel()
                        autos.clear()
                    elif kind == "delta" and (b"class_sync" in raw or b"c.seen = " in raw):
                        if hit := version.search(raw):
                            self.v = hit.group(1).decode()
                        el = m.delta.new_element
                        if el.WhichOneof("type") == "button" and el.button.id.endswith("class_sync"):
                            self.button, self.fragment = el.button.id, m.delta.fragment_id

            async def poll() -> None:
                conn: dict = {}
                while not stop.is_set():
                    await asyncio.sleep(bench_poll_s())
                    try:
                        v = await _http_get(conn, self.port, f"/_al/class/version?room={self.code}")
                    except OSError as e:
                        self.errors.append(str(e))
                        continue
                    self.polls += 1
                    if self.button and v != self.v and v != self.asked:
                        self.asked = v
                        self.clicks += 1
                        await ws.send(rerun(self.fragment, self.button))

            await ws.send(rerun())  # the first run: the student's link
            reader = asyncio.create_task(read())
            await poll()
            for task in [reader, *autos.values()]:
                task.cancel()


def bench_poll_s() -> float:
    from viz.ui.classroom import POLL_S

    return POLL_S


def follower_lags(followers: list[Follower], changes: list[tuple[float, str]]) -> tuple[list, list, int]:
    """For each change (its time, the `head=h` it set) and follower: the time until the follower's address showed
    it, and until the run that drew it had ended; and the count of (follower, change) pairs never reached."""
    address, drawn, missed = [], [], 0
    for i, (t0, marker) in enumerate(changes):
        t1 = changes[i + 1][0] if i + 1 < len(changes) else float("inf")
        for f in followers:
            at = next((t for t, q in f.seen if t0 <= t < t1 and marker in q.split("&")), None)
            if at is None:
                missed += 1
                continue
            address.append(at - t0)
            end = next((t for t in f.finished if t >= at), None)
            if end is not None:
                drawn.append(end - t0)
    return address, drawn, missed


def class_follow_main(args) -> None:
    """`--class-follow`: N headless followers on one server (SQLite room store), the teacher's head switches."""
    import asyncio

    from viz.classroom.store import open_store

    n = args.followers
    tmp = Path(tempfile.mkdtemp(prefix="al-follow-"))
    store = open_store(str(tmp / "rooms.sqlite3"))
    code, token = store.create_room()
    seats = [store.join(code, f"s{i}") for i in range(n)]
    store.set_state(code, token, {"page": "", "params": {"head": "0"}})
    port = bench.free_port()
    proc = bench.start_server(ROOT / "app.py", port, env={"ATTENTION_LAB_CLASS_STORE": str(tmp / "rooms.sqlite3"),
                                                          "ATTENTION_LAB_WARM_ANALYSES": "0"})
    pid = proc.pid

    def cpu_rate(seconds: float) -> float:
        c0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(seconds)
        return (cpu_seconds(pid) - c0) / (time.monotonic() - t0)

    def settle(below: float, most: float = 240) -> None:
        end = time.monotonic() + most
        while time.monotonic() < end and cpu_rate(2) > below:
            pass

    followers = [Follower(port, code, s) for s in seats]
    stop = threading.Event()
    loop = asyncio.new_event_loop()

    async def everyone() -> list:
        return await asyncio.gather(*(f.run(stop) for f in followers), return_exceptions=True)

    try:
        bench.wait_health(port, timeout=120)
        # The first visitor loads the default page's model and trace: one follower first, then settle.
        one = Follower(port, code, store.join(code, "warm"))
        warm = threading.Thread(target=lambda: asyncio.run(asyncio.wait_for(one.run(stop), 240)), daemon=True)
        warm.start()
        end = time.monotonic() + 240
        while time.monotonic() < end and not one.finished:
            time.sleep(0.5)
        stop.set()
        warm.join(30)
        stop.clear()
        settle(0.05)
        load0 = os.getloadavg()[0]
        idle = cpu_rate(args.follow_idle)
        runner = threading.Thread(target=lambda: loop.run_until_complete(everyone()), daemon=True)
        t_join = time.monotonic()
        runner.start()
        end = time.monotonic() + 600
        while time.monotonic() < end and not all(any("head=0" in q for _, q in f.seen) and f.button
                                                  for f in followers):
            time.sleep(0.5)
        joined = sum(1 for f in followers if f.button)
        print(f"class follow: {joined}/{n} headless followers on the teacher's view (/?head=0) "
              f"{time.monotonic() - t_join:.1f} s after they connected")
        settle(0.05 + 0.01 * n)
        polls0 = sum(f.polls for f in followers)
        following = cpu_rate(args.follow_idle)
        load1 = os.getloadavg()[0]
        polls = (sum(f.polls for f in followers) - polls0) / args.follow_idle
        per = (following - idle) / n
        changes = []
        c0 = cpu_seconds(pid)
        for k in range(1, args.follow_changes + 1):
            head = str(k % FOLLOW_HEADS)
            changes.append((time.monotonic(), f"head={head}"))
            store.set_state(code, token, {"page": "", "params": {"head": head}})  # what the teacher's run writes
            t0 = changes[-1][0]
            while time.monotonic() - t0 < 60:  # until every follower drew it (or 60 s)
                time.sleep(0.1)
                if all(any(t >= t0 and f"head={head}" in q.split("&") for t, q in f.seen) and
                       f.finished and f.finished[-1] > max(t for t, _ in f.seen) for f in followers):
                    break
            time.sleep(args.follow_gap)
        change_cpu = cpu_seconds(pid) - c0
        stop.set()
        runner.join(30)
        address, drawn, missed = follower_lags(followers, changes)
        errors = [e for f in followers for e in f.errors]
        print(f"class follow: server CPU, nobody following {idle * 1000:.1f} ms/s; {n} following (idle room) "
              f"{following * 1000:.1f} ms/s ({polls:.1f} polls/s) -> {per * 1000:.2f} ms of server CPU per follower "
              f"per second ({per * 100:.3f} % of a core); load average {load0:.1f} before, {load1:.1f} during")
        if address:
            print(f"class follow: teacher's change -> follower's address p50 {statistics.median(address):.2f} s, "
                  f"p95 {percentile(address, .95):.2f} s; -> follower's view drawn (its run ended) p50 "
                  f"{statistics.median(drawn):.2f} s, p95 {percentile(drawn, .95):.2f} s over {len(address)} "
                  f"(followers x {len(changes)} changes, {missed} missed); server CPU per change "
                  f"{change_cpu / len(changes):.2f} s = {change_cpu / len(changes) / n * 1000:.0f} ms per follower; "
                  f"load average {os.getloadavg()[0]:.1f}")
        print(f"class follow: clicks {sum(f.clicks for f in followers)}, poll errors {len(errors)}"
              + (f" (first: {errors[0]})" if errors else ""))
    finally:
        stop.set()
        bench.stop_server(proc)


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
    ap.add_argument("--hall", type=int, default=0, help="N replicas behind HAProxy (deploy/hall.sh); 0: one server")
    ap.add_argument("--hall-port", type=int, default=8700, help="the hall's proxy port (replica i: +10+i)")
    ap.add_argument("--via", choices=["auto", "button", "select"], default="auto",
                    help="head switch: the heatmap's buttons (browser), the Head select (server round trip)")
    ap.add_argument("--no-drill", action="store_true", help="hall: do not kill a replica after the class")
    ap.add_argument("--think", type=float, default=0.0,
                    help="hall: each student clicks once every THINK s (0: back to back, taking turns)")
    ap.add_argument("--checkpoint", default="", help="hall: the model every session opens (?checkpoint=)")
    ap.add_argument("--warm-lm-ratio", action="store_true",
                    help="only: server CPU per toy head switch with SmolLM2 warm vs ATTENTION_LAB_WARM_LM=0")
    ap.add_argument("--llm-soak", action="store_true",
                    help="only: issue 24 §6, --sessions browsers on /llm (SmolLM2), --long-sessions of them long")
    ap.add_argument("--long-sessions", type=int, default=5, help="--llm-soak: sessions with a long prompt")
    ap.add_argument("--long-tokens", type=int, default=2048, help="--llm-soak: the long prompts' length")
    ap.add_argument("--idle", type=float, default=0.0,
                    help="--llm-soak: the server's trace idle time (s); memory is measured again once it has passed")
    ap.add_argument("--class-start", action="store_true",
                    help="only: issue 43, sessions opening at once right after `streamlit run` (fresh server each)")
    ap.add_argument("--class-pages", default="default,needle",
                    help="--class-start: pages (default, needle; floor: a Streamlit app with one tiny chart)")
    ap.add_argument("--class-sizes", default="1,6,20", help="--class-start: sessions at once, one server each")
    ap.add_argument("--class-follow", action="store_true",
                    help="only: issue 41, --followers headless students following a teacher's head switches")
    ap.add_argument("--followers", type=int, default=40, help="--class-follow: following sessions")
    ap.add_argument("--follow-idle", type=float, default=20.0, help="--class-follow: seconds of each CPU reading")
    ap.add_argument("--follow-changes", type=int, default=6, help="--class-follow: the teacher's changes")
    ap.add_argument("--follow-gap", type=float, default=2.0, help="--class-follow: seconds between changes")
    ap.add_argument("--first-view-cost", action="store_true",
                    help="only: one session's first view right after the start (--class-pages), its cost: the tab's "
                         "main thread, Chromium's processes, the server")
    ap.add_argument("--shimmer-reference", action="store_true",
                    help="--first-view-cost: also with Streamlit's skeleton shimmer put back, and the ratio")
    ap.add_argument("--warm-order", action="store_true",
                    help="only: the entry points that open each warm-up piece's views, and the order they give")
    args = ap.parse_args()
    if args.warm_order:
        from viz.ui import warmup

        counts = warm_order_counts()
        for piece in measured_order(warmup.COST_S):
            print(f"{piece:20s} {counts[piece]:3d} entry points")
        print("viz/ui/warmup.py ORDER:", ", ".join(warmup.ORDER))
        return
    if args.class_follow:
        class_follow_main(args)
        return
    if args.class_start:
        class_start_main(args)
        return
    if args.first_view_cost:
        first_view_cost_main(args)
        return
    if args.llm_soak:
        llm_soak(args)
        return
    if args.warm_lm_ratio:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=bench.CHROMIUM, args=bench.ARGS)
            try:
                report_warm_lm_ratio(warm_lm_ratio(browser, args.clicks), args.clicks)
            finally:
                browser.close()
        return
    if args.hall:
        hall_main(args)
        return
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


def hall_main(args) -> None:
    """The class through a hall of args.hall replicas, then a replica killed mid-class."""
    from playwright.sync_api import sync_playwright

    port = args.hall_port
    hall("up", port, str(args.hall), extra="--server.disconnectedSessionTTL 2")
    try:
        pids = replica_pids(port)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=bench.CHROMIUM, args=bench.ARGS)
            try:
                for name, pid in pids.items():  # warm each replica directly (not through the proxy)
                    first_view(browser, f"http://127.0.0.1:{port + 10 + int(name[1:])}", pid, DATES[0])
                base = f"http://127.0.0.1:{port}"
                trainer = None if args.no_training else start_training(browser, base)

                def stop() -> None:
                    if trainer is not None:
                        stop_training(trainer)

                query = f"&checkpoint={args.checkpoint}" if args.checkpoint else ""
                out = run_class(base, args.sessions, args.clicks, args.browsers, args.via,
                                drill=not args.no_drill, port=port, on_kill_line=stop, think=args.think, query=query)
                if args.no_drill:
                    stop()
            finally:
                browser.close()
    finally:
        hall("down", port)
    report_hall(args, out, list(pids))


def report_hall(args, out: dict, replicas: list[str]) -> None:
    results, d = out["results"], out["drill"]
    sessions = results_sessions(results)
    training = "" if args.no_training else " + 1 training run"
    pace = f", one click per student every {args.think:g} s" if args.think else ""
    model = f", model {args.checkpoint}" if args.checkpoint else ""
    print(f"hall: {args.hall} replica(s) behind HAProxy (cookie affinity), {args.sessions} sessions{training}, "
          f"head switch via {args.via}{pace}{model}; class took {out['wall']:.1f} s; load average "
          f"{os.getloadavg()[0]:.1f} at the end (2 cores)")
    for r in replicas:
        mine = [s for s in sessions if s["replica"] == r]
        clicks = sum(s["clicks"] for s in mine)
        red = [x for s in mine for x in s["redraw"]]
        cpu = out["cpu"].get(r, float("nan"))
        per = f"{cpu / clicks * 1000:.0f} ms/click" if clicks else "no clicks"
        red_s = f"redraw p50 {statistics.median(red) * 1000:.0f} ms, p95 {percentile(red, .95) * 1000:.0f} ms" \
            if red else ""
        print(f"  {r}: {len(mine):3d} sessions, {clicks:4d} clicks, server CPU {cpu:6.1f} s = {per} "
              f"(page loads{' and training' if training else ''} included)   {red_s}")
    lost = [s for s in sessions if s["replica"] not in replicas]
    if lost:
        print(f"  {len(lost)} session(s) never reached a replica (no affinity cookie)")
    red = [x for r in results for x in r["redraw"]]
    if red:
        print(f"class: head switch redraw p50 {statistics.median(red) * 1000:.0f} ms, p95 "
              f"{percentile(red, .95) * 1000:.0f} ms (2 CPU cores shared by the replicas, the proxy and the browsers)")
    errors = [e for r in results for e in r["errors"]]
    foreign = [f for r in results for f in r["foreign"]]
    print(f"class: exceptions {len(errors)}   sessions that saw another's input {len(foreign)}   "
          f"[{verdict(not errors and not foreign)}]")
    for e in (errors + foreign)[:5]:
        print("   ", e)
    if d is None:
        return
    hit = [s for s in sessions if s["replica"] == d.victim]
    back = [s for s in hit if s["recovered"] is not None and s["recovered"] <= RECOVER_S and not s.get("problem")]
    times = sorted(s["recovered"] for s in hit if s["recovered"] is not None)
    spread = f" (p50 {statistics.median(times):.1f} s, max {times[-1]:.1f} s)" if times else ""
    print(f"failover: killed {d.victim} with {len(hit)} session(s) open: {len(back)}/{len(hit)} back on a live "
          f"replica with the same view within {RECOVER_S:.0f} s{spread}   [{verdict(len(back) == len(hit))}]")
    late = [s for s in hit if s not in back]
    for s in late[:10]:
        if s["recovered"] is None:
            print(f"    not back: no new script run within {d.wait:.0f} s of the kill")
        else:
            print(f"    not back in time: ran again after {s['recovered']:.1f} s"
                  + (f", but {s['problem']}" if s.get("problem") else ""))
    if len(late) > 10:
        print(f"    ... and {len(late) - 10} more")


if __name__ == "__main__":
    main()
