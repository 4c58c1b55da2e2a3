"""The first /llm visitor on a fresh server, with and without SmolLM2 in the server's warm-up (viz/ui/warmup.py).

For each arrival delay (seconds after the server answers /_stcore/health: 0 = the first browser arrives
at once, as in bench/app.py's cold start; larger = a class that arrives after the teacher started the
server) and each warm-up setting (ATTENTION_LAB_WARM_LM=0 before, =1 after), a fresh `streamlit run`
and one Chromium visit of /llm?checkpoint=smollm2: the wall time from the visit to the page drawn (its
script run finished and the charts laid out). One run prints both, and their ratio.

    .venv/bin/python bench/warm_llm.py [--delays 0 10] [--repeats 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))  # bench/app.py (not the root's app.py: importing that starts a server's work)

from app import VIEWPORT, free_port, start_server, stop_server, wait_drawn, wait_health  # noqa: E402

PATH = "/llm?checkpoint=smollm2"


def first_view(browser, warm: bool, delay: float) -> float:
    """Seconds from the first visit (delay s after health) to /llm drawn, on a fresh server."""
    port = free_port()
    proc = start_server(ROOT / "app.py", port, env={"ATTENTION_LAB_WARM_LM": "1" if warm else "0"})
    ctx = browser.new_context(viewport=VIEWPORT)
    try:
        wait_health(port, timeout=120)
        time.sleep(delay)
        page = ctx.new_page()
        t0 = time.perf_counter()
        page.goto(f"http://127.0.0.1:{port}{PATH}")
        wait_drawn(page, timeout=300_000)
        return time.perf_counter() - t0
    finally:
        ctx.close()
        stop_server(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--delays", type=float, nargs="+", default=[0.0, 10.0])
    ap.add_argument("--repeats", type=int, default=1, help="fresh servers per setting (median reported)")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT / "tests"))
    from browser_support import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            first_view(browser, True, 0)  # OS file cache and bytecode warm for both settings
            for delay in args.delays:
                runs: dict[bool, list[float]] = {False: [], True: []}
                for _ in range(args.repeats):  # interleaved: a busy spell on the machine hits both settings
                    for warm in (False, True):
                        runs[warm].append(first_view(browser, warm, delay))
                got = {warm: statistics.median(v) for warm, v in runs.items()}
                print(f"first /llm view, visitor {delay:4.0f} s after health: without SmolLM2 warm-up "
                      f"{got[False]:6.2f} s, with {got[True]:6.2f} s (ratio {got[True] / got[False]:.2f})",
                      flush=True)
        finally:
            browser.close()


if __name__ == "__main__":
    main()
