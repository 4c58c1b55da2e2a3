"""Watch attention learn (/learn, issue 33): page open (warm), one slider step, and a live run to the phase change.

    python bench/learn.py [--threads 1] [--skip-live]

- page open, warm: a second AppTest run of the page after a first one filled the server's caches (the recorded
  run measured once per server); the first (cold) run is printed too;
- slider step: moving the step slider by one checkpoint (the map of one head at that step: one tiny forward);
- live run to the phase change: `model.toy.learn.train` with the shipped settings, as the page's "Train it
  yourself" runs it (every checkpoint measured), until the best last-layer induction score first passes 0.5.
- a toy head switch on the Attention page (another session) while a /learn run trains in a thread of the same
  process, against the same switch without it (wall time, median of 6).
Targets (issue 33): open <= 2 s warm, a slider step <= 0.5 s, the phase change <= 3 min on 2 cores, the head
switch <= 1.5x.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from model.toy import learn as LR  # noqa: E402


def page_times() -> tuple[float, float, float]:
    from streamlit.testing.v1 import AppTest

    def fresh() -> AppTest:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
        at.switch_page("viz/pages/learn.py")
        return at

    t0 = time.perf_counter()
    at = fresh()
    at.run()
    cold = time.perf_counter() - t0
    assert not at.exception, at.exception
    t0 = time.perf_counter()
    at = fresh()
    at.run()
    warm = time.perf_counter() - t0
    slider = at.select_slider(key="learn_step")
    steps = list(slider.options)
    nxt = steps[(steps.index(str(slider.value)) + 1) % len(steps)]
    t0 = time.perf_counter()
    slider.set_value(int(nxt)).run()
    step = time.perf_counter() - t0
    assert not at.exception, at.exception
    return cold, warm, step


def live_to_phase(settings: LR.Settings) -> tuple[float | None, int | None, float]:
    seen: dict = {}

    def cb(run: LR.Run, kind: str) -> bool:
        if kind == "checkpoint" and run.scores and run.scores[-1].induction[-1].max() > 0.5:
            seen["s"], seen["step"] = run.seconds[-1], run.steps[-1]
            return False
        return True

    t0 = time.perf_counter()
    LR.train(settings, callback=cb, yield_s=LR.LIVE_YIELD_S)
    return seen.get("s"), seen.get("step"), time.perf_counter() - t0


def head_switch_cost(n: int = 6) -> tuple[float, float]:
    """Median wall time of a toy head switch on the Attention page (another session), without and then with a
    /learn training running in a background thread of the same process (as on the server)."""
    import statistics
    import threading

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.switch_page("viz/pages/attention.py")
    at.run()
    H = len(at.selectbox(key="attn_head").options)

    def switches() -> float:
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            at.selectbox(key="attn_head").set_value((i + 1) % H).run()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    alone = switches()
    stop = threading.Event()
    worker = threading.Thread(target=LR.train, args=(LR.Settings(**LR.run_meta()["models"]["attn2"]),),
                              kwargs={"callback": lambda r, k: not stop.is_set(), "yield_s": LR.LIVE_YIELD_S},
                              daemon=True)
    worker.start()
    time.sleep(2.0)
    busy = switches()
    stop.set()
    worker.join()
    return alone, busy


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-live", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    rows = []
    cold, warm, step = page_times()
    rows += [("page open, cold (measures 100 checkpoints)", f"{cold:.2f} s", ""),
             ("page open, warm", f"{warm:.2f} s", "<= 2 s"), ("slider step redraw", f"{step:.2f} s", "<= 0.5 s")]
    if not a.skip_live:
        s, at_step, total = live_to_phase(LR.Settings(**LR.run_meta()["models"]["attn2"]))
        rows.append(("live run to the phase change (induction > 0.5)",
                     f"{s:.1f} s (step {at_step})" if s is not None else f"not reached in {total:.0f} s", "<= 180 s"))
    alone, busy = head_switch_cost()
    rows += [("toy head switch (Attention page), no training", f"{alone:.2f} s", ""),
             ("toy head switch while /learn trains", f"{busy:.2f} s ({busy / alone:.2f}x)", "<= 1.5x")]
    w = max(len(r[0]) for r in rows)
    print(f"{'what':<{w}}  {'measured':>20}  target   (threads={a.threads}, torch {torch.__version__})")
    for name, val, target in rows:
        print(f"{name:<{w}}  {val:>20}  {target}")


if __name__ == "__main__":
    main()
