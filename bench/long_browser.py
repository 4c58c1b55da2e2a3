"""A long document in a real browser (issue 31 §2): a head switch, a zoom window and a document position on the
Attention page and on /llm with SmolLM2 and a 2,380-token prompt, timed from the click to the page drawn.

    .venv/bin/python bench/long_browser.py [--tokens 2380] [--repeats 3] [--pages attention,llm] [--reference DIR]

`streamlit run app.py` + Playwright driving Debian's Chromium (/usr/bin/chromium, the tests' arguments). The
prompt is typed into the sidebar once (its first view is not timed here: bench/lm_pages.py --parts long has it),
then each change is timed, per change:
- script: click (on the option, or Enter in a number box: opening the list and typing come first, off the clock) ->
  the server's script run finished, as the browser sees it (data-test-script-state);
- server's run: click -> the server's script_finished message received (its run, both ways on the wire);
- drawn: click -> what was asked is on the page (the figure or caption names the new head / window / position)
  and the browser's main thread has been idle for QUIET_MS (the end of its last long task: plotly's redraws);
- bytes: websocket bytes the browser received for the change (Streamlit sends every element this way), and
  which figures came with them (their size on the wire, from the delta messages);
- busy: the main thread's long tasks (> 50 ms) summed, what the redraw cost the browser.
Target: drawn <= 1 s (median; warm: the trace is computed on the first view). `--reference DIR` measures another
copy of the app first in the same run (before/after: `git archive <commit> | tar -x -C DIR`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

TARGET_S = 1.0
QUIET_MS = 400  # the browser is done when no long task has run for this long (and none is running)
LONG_TASKS_JS = """() => {
  window.__alTasks = [];
  new PerformanceObserver(l => l.getEntries().forEach(e => window.__alTasks.push([e.startTime, e.duration])))
    .observe({type: 'longtask', buffered: false});
}"""
IDLE_JS = """([t0, quiet]) => {
  const idle = document.querySelector('[data-testid="stApp"][data-test-script-state="notRunning"]')
      && !document.querySelector('[data-testid="stStatusWidget"]');
  if (!idle) return false;
  const tasks = (window.__alTasks || []).filter(t => t[0] + t[1] >= t0);
  const end = Math.max(window.__alScriptDone || t0, ...tasks.map(t => t[0] + t[1]));
  return performance.now() - end >= quiet;
}"""


def document(lm, length: int) -> str:
    """bench/lm_pages.py's document: a needle fact in the middle of filler, `length` tokens for SmolLM2."""
    from model.analysis import long as LG
    from model.analysis import shared as AN

    def at(n: int) -> str:
        return lm.tokenizer.decode(LG.needle_prompt(lm, n, 0.5, AN.NEEDLE_KEY).ids[0].tolist())

    doc = at(length)  # decoded and read again, the text has other tokens: one correction step
    return at(round(length * length / lm.encode(doc).shape[1]))


class Wire:
    """Websocket bytes the page receives, and the plotly figures among them (their spec's size, by key)."""

    def __init__(self, page):
        self.bytes, self.frames, self.times = 0, [], []
        page.on("websocket", lambda ws: ws.on("framereceived", self._add))

    def _add(self, payload) -> None:
        data = payload if isinstance(payload, bytes) else payload.encode()
        self.bytes += len(data)
        self.frames.append(data)
        self.times.append(time.perf_counter())

    def finished_at(self, mark: tuple[int, int]) -> float:
        """When the first script_finished message after `mark` arrived (perf_counter; nan if none)."""
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        for data, at in zip(self.frames[mark[1]:], self.times[mark[1]:], strict=True):
            msg = ForwardMsg()
            try:
                msg.ParseFromString(data)
            except Exception:  # noqa: BLE001
                continue
            if msg.WhichOneof("type") == "script_finished":
                return at
        return float("nan")

    def mark(self) -> tuple[int, int]:
        return self.bytes, len(self.frames)

    def since(self, mark: tuple[int, int]) -> tuple[int, list[tuple[str, int]], dict[str, int]]:
        """(bytes since `mark`, [(figure key, spec bytes)] of the figures sent since, {element kind: bytes})."""
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        figs, kinds = [], {}
        for data in self.frames[mark[1]:]:
            msg = ForwardMsg()
            try:
                msg.ParseFromString(data)
            except Exception:  # noqa: BLE001 - not a ForwardMsg (should not happen)
                continue
            kind = msg.WhichOneof("type") or "?"
            if kind == "delta":
                kind = msg.delta.WhichOneof("type")
                if kind == "new_element":
                    el = msg.delta.new_element
                    kind = el.WhichOneof("type")
                    if kind == "plotly_chart":
                        figs.append((el.plotly_chart.id.rsplit("-", 1)[-1][:24] or "?", len(el.plotly_chart.spec)))
            kinds[kind] = kinds.get(kind, 0) + len(data)
        return self.bytes - mark[0], figs, kinds


def settle(page, t0: float = 0.0, timeout: int = 600_000) -> None:
    page.wait_for_function(IDLE_JS, arg=[t0, QUIET_MS], polling=50, timeout=timeout)


SERVER_PID: list[int] = []  # the server's pid (its CPU seconds per change)
SERVER_ENV: dict[str, str] = {}  # extra environment for the server (an experiment: OMP_NUM_THREADS=1)


def server_cpu() -> float:
    from load import cpu_seconds  # bench/load.py

    return cpu_seconds(SERVER_PID[0]) if SERVER_PID else float("nan")


def quiet_server(settle_s: float = 0.3) -> float:
    """The server's CPU seconds once it has been idle for `settle_s` (bench/load.py quiet_cpu)."""
    from load import quiet_cpu

    return quiet_cpu(SERVER_PID[0], settle_s) if SERVER_PID else float("nan")


def timed_change(page, wire: Wire, act, shown_js: str, arg, prepare=None) -> dict:
    """Run `act()` (a click, an Enter) and time it: script finished, content shown, browser idle. `prepare()`
    runs before the clock starts (opening a select, typing a number: the reader's time, not the app's)."""
    settle(page)
    if prepare is not None:
        prepare()
    c0 = quiet_server()  # background work (the warm-up's analyses, a sweep) finished first
    mark = wire.mark()
    t0 = page.evaluate("() => { window.__alScriptDone = null; return performance.now(); }")
    page.evaluate("""() => { const app = document.querySelector('[data-testid="stApp"]');
      window.__alSawRun = false;
      const obs = new MutationObserver(() => {
        const s = app.getAttribute('data-test-script-state');
        if (s === 'running') window.__alSawRun = true;
        else if (window.__alSawRun && s === 'notRunning' && !window.__alScriptDone)
          window.__alScriptDone = performance.now();
      });
      obs.observe(app, {attributes: true}); window.__alObs && window.__alObs.disconnect(); window.__alObs = obs; }""")
    clicked = time.perf_counter()
    act()
    try:
        page.wait_for_function(shown_js, arg=arg, polling="raf", timeout=120_000)
    except Exception:
        page.screenshot(path="/tmp/long_browser_failed.png", full_page=True)
        raise
    shown = page.evaluate("() => performance.now()")
    settle(page, t0)
    out = page.evaluate("""([t0]) => {
      const tasks = (window.__alTasks || []).filter(t => t[0] + t[1] >= t0);
      const end = Math.max(window.__alScriptDone || t0, ...tasks.map(t => t[0] + t[1]));
      return {script: (window.__alScriptDone || NaN) - t0, busy: tasks.reduce((a, t) => a + t[1], 0), end: end - t0};
    }""", [t0])
    n_bytes, figs, kinds = wire.since(mark)
    return {"script": out["script"] / 1000, "shown": (shown - t0) / 1000,
            "drawn": max(out["end"], shown - t0) / 1000, "busy": out["busy"] / 1000, "bytes": n_bytes, "figs": figs,
            "kinds": kinds, "server_cpu": server_cpu() - c0, "server": wire.finished_at(mark) - clicked}


FIG_TITLE_JS = """([key, text]) => [...document.querySelectorAll('.st-key-' + key + ' .js-plotly-plot')].some(
  el => (el.layout?.title?.text || '').includes(text))"""
TEXT_JS = """([text]) => document.body.innerText.includes(text)"""


def open_select(page, label: str, value: int) -> None:
    """Open the main area's select labelled `label` and filter its list to `value` (a long list shows only some
    options); `pick` then clicks it."""
    box = page.get_by_test_id("stMainBlockContainer").get_by_role("combobox", name=label, exact=True).first
    box.click()
    page.keyboard.type(str(value))
    page.get_by_role("option", name=str(value), exact=True).wait_for()


def pick(page, value: int) -> None:
    page.get_by_role("option", name=str(value), exact=True).click()


def fill_number(page, label: str, value: int) -> None:
    """Type `value` into the number input labelled `label` (not sent yet: `enter` sends it)."""
    page.get_by_test_id("stMainBlockContainer").get_by_label(label, exact=True).first.fill(str(value))


def enter(page, label: str) -> None:
    page.get_by_test_id("stMainBlockContainer").get_by_label(label, exact=True).first.press("Enter")


def changes(page, wire: Wire, key: str, n: int, repeats: int, heads: list[int]) -> dict[str, list[dict]]:
    """Head switches, zoom windows and document positions on a page drawn with the long prompt. `heads`: ones no
    page opened yet on this server (a head's pooled map is cached for every session once computed)."""
    out: dict[str, list[dict]] = {"head": [], "zoom": [], "position": []}
    heads = heads[:repeats]
    for i, h in enumerate(heads):
        out["head"].append(timed_change(page, wire, lambda h=h: pick(page, h), FIG_TITLE_JS,
                                        [f"{key}_long_overview", f", head {h}:"],
                                        prepare=lambda h=h: open_select(page, "Head", h)))
        q0 = n // 2 + 37 * (i + 1)
        out["zoom"].append(timed_change(page, wire, lambda: enter(page, "First query"), FIG_TITLE_JS,
                                        [f"{key}_long_window", f"queries {q0}–"],
                                        prepare=lambda q0=q0: fill_number(page, "First query", q0)))
        pos = n // 2 + 53 * (i + 1)
        out["position"].append(timed_change(page, wire, lambda: enter(page, "Position"), TEXT_JS,
                                            [f"source tokens of position {pos}"],
                                            prepare=lambda pos=pos: fill_number(page, "Position", pos)))
    return out


def open_long(page, base: str, path: str, key: str, text: str) -> float:
    """Open `path` on SmolLM2, paste the long prompt into the sidebar, wait for its long views; seconds taken."""
    page.goto(f"{base}{path}?checkpoint=smollm2&lang=en")
    settle(page)
    box = page.get_by_test_id("stSidebar").get_by_label("Prompt", exact=True)
    t0 = time.perf_counter()
    box.fill(text)
    box.press("Control+Enter")
    page.wait_for_selector(f".st-key-{key}_long_overview .js-plotly-plot .main-svg", state="attached",
                           timeout=600_000)
    settle(page)
    return time.perf_counter() - t0


def report(page_name: str, n: int, results: dict[str, list[dict]]) -> list[str]:
    lines = []
    for what, runs in results.items():
        med = statistics.median(r["drawn"] for r in runs)
        script = statistics.median(r["script"] for r in runs)
        busy = statistics.median(r["busy"] for r in runs)
        kb = statistics.median(r["bytes"] for r in runs) / 1024
        figs = runs[-1]["figs"]
        sent = ", ".join(f"{k} {b / 1024:.0f} kB" for k, b in figs) or "none"
        cpu = statistics.median(r["server_cpu"] for r in runs)
        server = statistics.median(r["server"] for r in runs)
        kinds = ", ".join(f"{k} {b / 1024:.0f}" for k, b in sorted(runs[-1]["kinds"].items(), key=lambda kv: -kv[1])
                          if b >= 1024)
        ok = "ok" if med <= TARGET_S else "MISSED"
        each = ", ".join(f"{r['drawn']:.2f}" for r in runs)
        lines.append(f"{page_name:9s} {what:8s} {n:,} tokens: drawn {med:5.2f} s (server's run {server:.2f} s, "
                     f"CPU {cpu:.2f} s; script state {script:.2f} s; browser busy {busy:.2f} s, {kb:5.0f} kB received; "
                     f"figures sent: {sent}; kB by element: {kinds})  target <= {TARGET_S:g} s "
                     f"ratio {med / TARGET_S:.2f} {ok}  [each: {each}]")
    return lines


def measure(app_dir: Path, label: str, text: str, n: int, pages: list[str], repeats: int) -> list[str]:
    """Start `streamlit run app_dir/app.py`, open each page with the long prompt and time its changes."""
    from playwright.sync_api import sync_playwright

    import app as bench  # bench/app.py: the server and the browser's arguments

    port = bench.free_port()
    proc = bench.start_server(app_dir / "app.py", port, env=SERVER_ENV)
    SERVER_PID[:] = [proc.pid]
    lines = []
    try:
        bench.wait_health(port, timeout=120)
        quiet_server(2.0)  # the server's warm-up (models, the shared analyses) done
        base = f"http://127.0.0.1:{port}"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=bench.CHROMIUM, args=bench.ARGS)
            for name in pages:
                path, key = {"attention": ("/", "attn"), "llm": ("/llm", "llm")}[name]
                ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
                page = ctx.new_page()
                page.set_default_timeout(180_000)
                wire = Wire(page)
                first = open_long(page, base, path, key, text)
                print(f"[{label}] {name}: first view {first:.1f} s (the trace of {n:,} tokens, when not yet "
                      "computed)", flush=True)
                page.evaluate(LONG_TASKS_JS)
                heads = {"attention": [3, 5, 1, 7], "llm": [4, 6, 2, 8]}[name]
                lines += [f"[{label}] {line}" for line in report(name, n, changes(page, wire, key, n, repeats, heads))]
                print("\n".join(lines[-3:]), flush=True)
                ctx.close()
            browser.close()
    finally:
        bench.stop_server(proc)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2380)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pages", default="attention,llm")
    ap.add_argument("--reference", type=Path, default=None,
                    help="another copy of the app to measure first, in the same run (before/after), e.g. "
                         "`git archive 551e658 | tar -x -C /tmp/before` and --reference /tmp/before")
    args = ap.parse_args()
    import os

    from model import load_model

    lm = load_model("smollm2")
    text = document(lm, args.tokens)
    n = lm.encode(text).shape[1]
    load0 = os.getloadavg()[0]
    lines = []
    pages = args.pages.split(",")
    if args.reference:
        lines += measure(args.reference.resolve(), "before", text, n, pages, args.repeats)
    lines += measure(ROOT, "after" if args.reference else "this tree", text, n, pages, args.repeats)
    print(f"\nissue 31 §2 in Chromium ({os.cpu_count()} cores, load average {load0:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end)")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
