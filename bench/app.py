"""Browser benchmark of the app: first draw, redraw after a widget change, bytes on the wire.

    .venv/bin/python bench/app.py [--repeats 3]

In a real browser (Playwright + Debian's Chromium, like tests/test_browser.py):
- cold start: from `streamlit run` to the first page fully drawn (script finished, plotly
  drawn), against a hello-world Streamlit page with one small plotly chart started the same
  way in the same run (the ratio is what to watch: this machine's speed varies).
- head change: from clicking another head (the buttons inside the heatmap; the Head select for
  comparison) on the attention page to the redrawn heatmap.
- bytes: websocket frames received by the browser for a 256-token input, on the attention
  and decoder pages (a random-weight clone of the shipped checkpoint with max_len 512: the
  shipped ones are trained on short inputs), against the hello-world page.
Targets (issue 12): cold start <= 1.3x the hello-world page, head change <= 150 ms (median).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 3000}
HELLO = '''import plotly.graph_objects as go
import streamlit as st

st.title("Hello")
st.write("A reference page: one small plotly chart.")
st.plotly_chart(go.Figure(go.Heatmap(z=[[0, 1], [1, 0]])))
'''
TARGET_COLD_RATIO, TARGET_HEAD_S = 1.3, 0.150


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(app: Path, port: int, env: dict | None = None, extra: list[str] | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.headless", "true", "--server.port",
           str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
           "--server.fileWatcherType", "none", *(extra or [])]
    return subprocess.Popen(cmd, cwd=app.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, **(env or {})})


def wait_health(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        time.sleep(0.05)
    raise RuntimeError(f"no health answer on port {port} within {timeout:.0f} s")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the server's own process group only
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_drawn(page, timeout: int = 120_000) -> None:
    """Script finished and plotly drawn; a page that ends in an error box or exception fails fast."""
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout)
    failed = page.locator('[data-testid="stException"], [data-testid="stAlertContentError"]')
    if failed.count():
        raise RuntimeError(f"the page shows an error: {failed.first.inner_text()[:300]}")
    page.wait_for_selector(".js-plotly-plot .main-svg", state="attached", timeout=timeout)
    page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached", timeout=timeout)


class Frames:
    """Bytes of the websocket frames the page receives (Streamlit sends every element this way)."""

    def __init__(self, page):
        self.bytes = 0
        page.on("websocket", lambda ws: ws.on("framereceived", self._add))

    def _add(self, payload) -> None:
        self.bytes += len(payload) if isinstance(payload, bytes) else len(payload.encode())


def cold_start(browser, app: Path, path: str = "/", env: dict | None = None) -> tuple:
    """(server start -> health, -> page drawn, bytes received, -> script run finished) for a fresh server."""
    port = free_port()
    ctx = browser.new_context(viewport=VIEWPORT)
    page = ctx.new_page()
    frames = Frames(page)
    t0 = time.perf_counter()
    proc = start_server(app, port, env)
    try:
        wait_health(port)
        t_health = time.perf_counter() - t0
        page.goto(f"http://127.0.0.1:{port}{path}")
        page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=120_000)
        t_script = time.perf_counter() - t0
        wait_drawn(page)
        t_drawn = time.perf_counter() - t0
        page.wait_for_timeout(300)  # trailing frames (e.g. page-info messages)
        return t_health, t_drawn, frames.bytes, t_script
    finally:
        ctx.close()
        stop_server(proc)


HEATMAP = ".st-key-attn_head_fig .js-plotly-plot"  # the Attention page's head heatmap


def pick_head(page, h: int, via: str = "auto") -> float:
    """Choose head `h` and return seconds from the click to a heatmap redrawn with that head (its title
    says "· head h ·"); then wait until the server has caught up (URL, select, views) and the page settled.

    via="button": the head buttons inside the heatmap (plotly switches in the browser; what users click).
    via="select": the Head select above it (a server round trip, like any Streamlit widget).
    via="auto": the buttons when the page has them (the hello-world reference page has only a select)."""
    if via == "auto":
        via = "button" if page.locator(f"{HEATMAP} .updatemenu-button").count() else "select"
    if via == "button":
        target = page.locator(f"{HEATMAP} .updatemenu-button").nth(h)
        target.scroll_into_view_if_needed()
    else:
        page.locator('[data-testid="stSelectbox"]').get_by_role("combobox", name="Head", exact=True).first.click()
        target = page.get_by_role("option", name=str(h), exact=True)
        target.wait_for()
    t0 = time.perf_counter()
    target.click()
    page.wait_for_function(
        "h => [...document.querySelectorAll('.js-plotly-plot')].some("
        "el => (el.layout?.title?.text || '').includes('· head ' + h + ' ·'))", arg=h, polling="raf",
        timeout=60_000)
    took = time.perf_counter() - t0
    page.wait_for_function("h => new URLSearchParams(location.search).get('head') === String(h)", arg=h,
                           timeout=60_000)
    wait_drawn(page)  # let the rest of the page settle before the next change
    return took


def head_changes(browser, port: int, heads: list[str], via: str = "auto") -> list[float]:
    """Seconds from choosing another head on the attention page to the redrawn heatmap, per change."""
    ctx = browser.new_context(viewport=VIEWPORT)
    page = ctx.new_page()
    try:
        page.goto(f"http://127.0.0.1:{port}/")
        wait_drawn(page)
        return [pick_head(page, int(h), via) for h in heads]
    finally:
        ctx.close()


def page_bytes(browser, port: int, path: str, query: dict) -> tuple[int, float]:
    """(bytes received, seconds to drawn) for one page view on a running server."""
    ctx = browser.new_context(viewport=VIEWPORT)
    page = ctx.new_page()
    frames = Frames(page)
    try:
        t0 = time.perf_counter()
        page.goto(f"http://127.0.0.1:{port}{path}?{urllib.parse.urlencode(query)}")
        wait_drawn(page)
        elapsed = time.perf_counter() - t0
        page.wait_for_timeout(300)
        return frames.bytes, elapsed
    finally:
        ctx.close()


def long_checkpoint(tmp: Path) -> tuple[str, str, str]:
    """A random-weight clone of the default checkpoint with max_len 512, a 256-token input for it, and
    a short target (teacher-forced: a random model's own greedy output would run to max_len)."""
    import torch

    from model import Transformer, TransformerConfig
    from model.toy.checkpoint import Checkpoint, list_checkpoints, load_checkpoint

    names = list_checkpoints()
    if not names:
        raise SystemExit("no shipped checkpoint (model/checkpoints is empty)")
    base = load_checkpoint("dates" if "dates" in names else names[0])
    torch.manual_seed(0)
    cfg = TransformerConfig.from_dict({**base.cfg.to_dict(), "max_len": 512})
    clone = Checkpoint(Transformer(cfg), base.src_tokenizer, base.tgt_tokenizer,
                       meta={"name": "long", "example": base.example}, name="long")
    path = str(clone.save(tmp / "long"))
    text = base.example * (256 // max(1, len(base.example)) + 1)
    while len(base.src_tokenizer.encode(text)) > 256:  # char tokenizers: one token per character
        text = text[:-1]
    assert len(base.src_tokenizer.encode(text)) == 256, "the input must be exactly 256 tokens"
    return path, text, base.meta.get("probe", {}).get("target") or base.example


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="cold starts of each server (median reported)")
    args = ap.parse_args()
    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"{CHROMIUM} missing: run `bash .ci/browser-setup.sh` first")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        tmp = Path(tmp)
        hello = tmp / "hello.py"
        hello.write_text(HELLO, encoding="utf-8")
        long_path, long_text, long_target = long_checkpoint(tmp)
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            cold_start(browser, hello)  # warm the OS file cache and Python bytecode for both
            cold_start(browser, ROOT / "app.py")
            ref, app = [], []
            for _ in range(args.repeats):  # interleaved, so background load hits both alike
                ref.append(cold_start(browser, hello))
                app.append(cold_start(browser, ROOT / "app.py"))
            port = free_port()
            proc = start_server(ROOT / "app.py", port, {"ATTENTION_LAB_CHECKPOINTS": long_path})
            try:
                wait_health(port)
                heads = head_changes(browser, port, ["1", "2", "3", "0", "1", "2"])
                heads_select = head_changes(browser, port, ["1", "2", "3", "0", "1", "2"], via="select")
                q = {"checkpoint": long_path, "text": long_text, "target": long_target}
                att_bytes, att_s = page_bytes(browser, port, "/", q)
                dec_bytes, dec_s = page_bytes(browser, port, "/decoder", q)
            finally:
                stop_server(proc)
        finally:
            browser.close()

    med = lambda xs: statistics.median(xs)  # noqa: E731
    ref_draw, app_draw = med([r[1] for r in ref]), med([a[1] for a in app])
    ref_bytes = med([r[2] for r in ref])
    head = med(heads)
    ready, script = med([a[0] for a in app]), med([a[3] for a in app])
    print(f"cold start -> first page drawn   app {app_draw:6.2f} s (server ready {ready:.2f} s, script done "
          f"{script:.2f} s)   "
          f"hello-world {ref_draw:.2f} s   ratio {app_draw / ref_draw:.2f}x   "
          f"target <= {TARGET_COLD_RATIO:g}x [{'ok' if app_draw / ref_draw <= TARGET_COLD_RATIO else 'MISSED'}]")
    print(f"change head -> heatmap redrawn   median {head * 1000:6.0f} ms (min {min(heads) * 1000:.0f}, "
          f"max {max(heads) * 1000:.0f}, n={len(heads)}; head buttons in the figure)   target <= "
          f"{TARGET_HEAD_S * 1000:g} ms [{'ok' if head <= TARGET_HEAD_S else 'MISSED'}]")
    print(f"  the same with the Head select (a server round trip): median {med(heads_select) * 1000:.0f} ms")
    print(f"bytes received, 256-token input  attention page {att_bytes / 1024:8.1f} KiB ({att_s:.1f} s)   "
          f"decoder page {dec_bytes / 1024:8.1f} KiB ({dec_s:.1f} s)   "
          f"hello-world {ref_bytes / 1024:.1f} KiB   "
          f"ratios {att_bytes / ref_bytes:.0f}x / {dec_bytes / ref_bytes:.0f}x")
    print(f"first-page bytes (default input)  app {med([a[2] for a in app]) / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
