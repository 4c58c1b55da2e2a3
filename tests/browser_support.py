"""Shared real-browser test support: `streamlit run app.py` on a free port + Playwright driving
Debian's Chromium. tests/conftest.py re-exports the fixtures (server, browser, page, paths), so a
browser test module only needs `from browser_support import wait_drawn` and `pytestmark = pytest.mark.browser`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 3400}  # Streamlit scrolls inside an inner container: be tall
PAGE_TIMEOUT_MS = 120_000  # first visits load the model and decode on a shared 2-core CPU
# pages that may legitimately draw no plotly chart up front (on the default toy model, /llm and /phenomena say in
# one sentence that they need a language model, with a button to open SmolLM2: tests/test_app_llm.py checks it;
# /class draws its room controls and, once a room is open, a QR code, and a chart only once a question is asked:
# tests/test_browser_class.py checks that chart)
NO_CHARTS = {"snapshots", "pretrained", "llm", "phenomena", "class"}
DEFAULT_PAGE = "attention"  # app.py's default page, served at "/"



SERVER_LOGS: dict[str, str] = {}  # port -> its server's log file (start_server): a timed-out wait shows its tail


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(app: Path, port: int, timeout: float = 90.0, env: dict | None = None) -> subprocess.Popen:
    """`streamlit run` in its own process group; returns once /_stcore/health answers ok.

    The server's output goes to a file, not a pipe nobody reads: a full pipe (64 kB of warnings) blocks every
    thread that logs, and a page then never finishes. Its tail is in the error if the server dies at start.
    The lessons' and /phenomena's analyses are not warmed at start (ATTENTION_LAB_WARM_ANALYSES=0, unless `env`
    says otherwise): a page that shows one computes it as a first visitor's would, and the ~1 min of CPU each
    server would spend on them does not run beside the tests (tests/test_warmup.py tests the warm-up itself)."""
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.headless", "true",
           "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
           "--server.fileWatcherType", "none"]
    log = tempfile.NamedTemporaryFile(prefix=f"streamlit-{port}-", suffix=".log", delete=False)
    full_env = {**os.environ, "ATTENTION_LAB_WARM_ANALYSES": "0", **(env or {})}
    proc = subprocess.Popen(cmd, cwd=app.parent, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=full_env)
    log.close()
    proc.log_path = log.name
    SERVER_LOGS[str(port)] = log.name
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = Path(log.name).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"streamlit exited with {proc.returncode}: {out}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return proc
        time.sleep(0.2)
    stop_server(proc)
    raise RuntimeError(f"streamlit did not answer /_stcore/health within {timeout:.0f} s")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # our own process group only
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with contextlib.suppress(AttributeError, OSError):
        os.unlink(proc.log_path)


SETTLE_MS = 250
IDLE_FOR = """(ms) => {
  const idle = document.querySelector('[data-testid="stApp"][data-test-script-state="notRunning"]')
      && !document.querySelector('[data-testid="stStatusWidget"]');
  const now = performance.now();
  if (!idle) { window.__alIdleSince = null; return false; }
  if (window.__alIdleSince == null) window.__alIdleSince = now;
  return now - window.__alIdleSince >= ms;
}"""


def wait_drawn(page, need_chart: bool = True, timeout: int = PAGE_TIMEOUT_MS) -> None:
    """The script run has finished (no "Running..." status) and, if wanted, plotly has drawn. On a timeout it fails
    with what a person would look at: the page's text, a screenshot, whether the server still answers, its log."""
    try:
        _wait_drawn(page, need_chart, timeout)
    except Exception as e:
        if type(e).__name__ != "TimeoutError":
            raise
        raise AssertionError(f"{e}\n{diagnose(page)}") from e


def diagnose(page) -> str:
    """Why a page did not draw (a CI failure happens once, on a machine we cannot look at): the URL, the script
    state, the text shown, a screenshot's path, the server's health and the tail of its log."""
    from urllib.parse import urlsplit

    lines = [f"url: {page.url}"]
    # only calls that time out themselves: a renderer that hangs must not hang the test run too
    with contextlib.suppress(Exception):
        lines.append("script state: " + str(page.get_attribute('[data-testid="stApp"]', "data-test-script-state",
                                                               timeout=5_000)))
    for where in ('[data-testid="stMain"]', "body"):
        with contextlib.suppress(Exception):
            lines.append("page text: " + page.inner_text(where, timeout=5_000)[:1500].replace("\n", " | "))
            break
    with contextlib.suppress(Exception):
        SHOTS.mkdir(parents=True, exist_ok=True)
        shot = SHOTS / f"timeout-{int(time.time())}.png"
        page.screenshot(path=str(shot), timeout=10_000)
        lines.append(f"screenshot: {shot}")
    url = urlsplit(page.url)
    try:
        with urllib.request.urlopen(f"{url.scheme}://{url.netloc}/_stcore/health", timeout=5) as r:
            lines.append(f"server health: {r.read().strip()!r}")
    except OSError as e:
        lines.append(f"server health: no answer ({e})")
    log = SERVER_LOGS.get(str(url.port))
    with contextlib.suppress(OSError, TypeError):
        lines.append("server log tail:\n" + Path(log).read_text(errors="replace")[-3000:])
    return "\n".join(lines)


def _wait_drawn(page, need_chart: bool, timeout: int) -> None:
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout)
    page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached", timeout=timeout)
    if need_chart:
        page.wait_for_selector(".js-plotly-plot .main-svg", state="attached", timeout=timeout)
    # A widget whose code the browser is still fetching is drawn as a skeleton (Streamlit loads each widget's
    # JS chunk on first use): after a finished run, on a loaded machine, for up to ~10 s. Read then, a copied
    # /padding link's text box looked empty (issue 31 §4): it is drawn only when no skeleton is left.
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stSkeleton\"]')", timeout=timeout)
    # Let plotly finish the last redraw before looking, and let a run that follows at once (a component's value)
    # start: the script must stay idle for SETTLE_MS in a row, counted from now. A fixed 500 ms sleep was a
    # quarter of the browser tests' time (90 calls in 184 s) and saw only one instant.
    page.evaluate("() => { window.__alIdleSince = null; }")
    page.wait_for_function(IDLE_FOR, arg=SETTLE_MS, timeout=timeout)


def charts_drawn(page) -> int:
    """Plotly charts with a laid-out, non-empty plot area."""
    return page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].filter(el => {
        const r = el.getBoundingClientRect();
        return r.width > 50 && r.height > 50 && el._fullLayout && el.data && el.data.length > 0;
    }).length""")


# A test module whose pages never show SmolLM2 sets `SERVER_ENV = NO_LM_WARM`: its server does not load SmolLM2
# at start (viz/ui/warmup.py), ~10 s of CPU each server that would run beside the tests on a 2-core machine.
# A page that does need SmolLM2 still loads it on its first visit, as on any server that did not warm it
# (tests/test_app_llm.py and tests/test_perf_ratio.py test the warm-up of SmolLM2 itself).
NO_LM_WARM = {"ATTENTION_LAB_WARM_LM": "0"}


@pytest.fixture(scope="module")
def server(request):
    proc = start_server(ROOT / "app.py", free_port(), env=getattr(request.module, "SERVER_ENV", None))
    port = proc.args[proc.args.index("--server.port") + 1]
    yield f"http://127.0.0.1:{port}"
    stop_server(proc)


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: install it with `bash .ci/browser-setup.sh`")
    from playwright import sync_api  # lazy: only browser tests pay for it

    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport=VIEWPORT)
    pg = context.new_page()
    yield pg
    context.close()


def nav_pages(page, base: str) -> dict[str, str]:
    """Page name (file stem = url_path, see app.py) -> URL path, for every page in the sidebar nav."""
    page.goto(base + "/")
    page.wait_for_selector('[data-testid="stSidebarNav"] a', timeout=PAGE_TIMEOUT_MS)
    links = page.eval_on_selector_all('[data-testid="stSidebarNav"] a', "els => els.map(a => new URL(a.href).pathname)")
    return {path.strip("/") or DEFAULT_PAGE: path for path in links}


@pytest.fixture(scope="module")
def paths(server, browser) -> dict[str, str]:
    context = browser.new_context(viewport=VIEWPORT)
    try:
        return nav_pages(context.new_page(), server)
    finally:
        context.close()


