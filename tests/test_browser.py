"""The app in a real browser: `streamlit run app.py` + Playwright driving Debian's Chromium.

Opens every page listed by st.navigation, waits until the script has finished and the
plotly charts are drawn, asserts no exception box, and saves artifacts/screenshots/<page>.png
(look at them). Interacts too: the attention page's head select redraws the heatmap, the
decoder's play button advances the step by itself (a fragment timer, invisible to AppTest).

Run: pytest -m browser tests/test_browser.py   (CI installs Chromium with .ci/browser-setup.sh)
"""

from __future__ import annotations

import ast
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 3400}  # Streamlit scrolls inside an inner container: be tall
PAGE_TIMEOUT_MS = 120_000  # first visits load the model and decode on a shared 2-core CPU
NO_CHARTS = {"snapshots", "pretrained"}  # pages that may legitimately draw no plotly chart up front

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is missing: install it with `bash .ci/browser-setup.sh` "
                "(apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(app: Path, port: int, timeout: float = 90.0) -> subprocess.Popen:
    """`streamlit run` in its own process group; returns once /_stcore/health answers ok."""
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.headless", "true",
           "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
           "--server.fileWatcherType", "none"]
    proc = subprocess.Popen(cmd, cwd=app.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace")[-2000:]
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


def wait_drawn(page, need_chart: bool = True, timeout: int = PAGE_TIMEOUT_MS) -> None:
    """The script run has finished (no "Running..." status) and, if wanted, plotly has drawn."""
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout)
    page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached", timeout=timeout)
    if need_chart:
        page.wait_for_selector(".js-plotly-plot .main-svg", state="attached", timeout=timeout)
    page.wait_for_timeout(500)  # let plotly finish the last redraw before looking
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout)


def charts_drawn(page) -> int:
    """Plotly charts with a laid-out, non-empty plot area."""
    return page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].filter(el => {
        const r = el.getBoundingClientRect();
        return r.width > 50 && r.height > 50 && el._fullLayout && el.data && el.data.length > 0;
    }).length""")


@pytest.fixture(scope="module")
def server():
    proc = start_server(ROOT / "app.py", free_port())
    port = proc.args[proc.args.index("--server.port") + 1]
    yield f"http://127.0.0.1:{port}"
    stop_server(proc)


@pytest.fixture(scope="module")
def browser():
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


def page_files() -> dict[str, str]:
    """Page title -> file stem, from app.py's PAGES table (read with ast: importing runs Streamlit)."""
    tree = ast.parse((ROOT / "app.py").read_text(encoding="utf-8"))
    table = next(n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", "") == "PAGES" for t in n.targets))
    return {title: Path(file).stem for file, title, _icon in ast.literal_eval(table)}


def nav_pages(page, base: str) -> dict[str, str]:
    """Page name (file stem) -> URL path, for every page st.navigation lists in the sidebar."""
    page.goto(base + "/")
    page.wait_for_selector('[data-testid="stSidebarNav"] a', timeout=PAGE_TIMEOUT_MS)
    links = page.eval_on_selector_all('[data-testid="stSidebarNav"] a',
                                      "els => els.map(a => [new URL(a.href).pathname, a.innerText])")
    stems = page_files()
    # The link text starts with the icon's ligature name ("grid_view"), the title is the last line.
    return {stems.get(text.strip().splitlines()[-1].strip(), path.strip("/") or "home"): path
            for path, text in links}


@pytest.fixture(scope="module")
def paths(server, browser) -> dict[str, str]:
    context = browser.new_context(viewport=VIEWPORT)
    try:
        return nav_pages(context.new_page(), server)
    finally:
        context.close()


def test_every_page_renders(server, paths, page):
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert {"attention", "decoder", "training"} <= set(paths), paths
    problems = []
    for name, path in paths.items():
        page.goto(server + path)
        wait_drawn(page, need_chart=name not in NO_CHARTS)
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
        if page.locator('[data-testid="stException"]').count():
            problems.append(f"{name}: {page.locator('[data-testid=stException]').first.inner_text()[:500]}")
        if name not in NO_CHARTS and charts_drawn(page) == 0:
            problems.append(f"{name} ({path}): no plotly chart drawn")
    assert not problems, "\n".join(problems)


def select_option(page, label: str, option: str) -> None:
    """Pick `option` in the Streamlit selectbox labelled `label`."""
    page.locator('[data-testid="stSelectbox"]').get_by_role("combobox", name=label, exact=True).first.click()
    page.get_by_role("option", name=option, exact=True).click()


def test_changing_the_head_redraws_the_heatmap(server, paths, page):
    page.goto(server + paths["attention"])
    wait_drawn(page)
    titles = "() => [...document.querySelectorAll('.js-plotly-plot')].map(el => el.layout?.title?.text || '')"
    assert any("· head 0" in t for t in page.evaluate(titles))
    select_option(page, "Head", "1")
    page.wait_for_function(f"() => ({titles})().some(t => t.includes('· head 1'))", timeout=30_000)
    wait_drawn(page)
    assert not page.locator('[data-testid="stException"]').count()
    page.screenshot(path=str(SHOTS / "attention-head1.png"), full_page=True)


def test_decoder_play_advances_by_itself(server, paths, page):
    page.goto(server + paths["decoder"])
    wait_drawn(page)
    slider = page.locator('[data-testid="stSlider"] input[type="range"][aria-label="Step"]')
    if not slider.count():
        pytest.skip("the example's output has a single step: nothing to play")
    value = lambda: int(slider.input_value())  # noqa: E731
    last = value()  # the page opens on the last step; play restarts from step 1
    page.get_by_role("button", name="▶ Play").click()
    deadline = time.monotonic() + 30
    while value() >= last and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    first = value()
    assert first < last, "play did not restart from the first step"
    page.wait_for_timeout(3000)  # the fragment timer ticks every 0.9 s
    assert value() > first
    page.get_by_role("button", name="⏸ Pause").click()
    page.wait_for_selector("text=▶ Play", timeout=30_000)
    assert not page.locator('[data-testid="stException"]').count()
