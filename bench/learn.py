"""Watch attention learn (/learn, issue 33): page open (warm), one slider step, and a live run to the phase change.

    python bench/learn.py [--threads 1] [--skip-live]

- page open, warm: a second AppTest run of the page after a first one filled the server's caches (the recorded
  run measured once per server); the first (cold) run is printed too;
- slider step: moving the step slider by one checkpoint (the map of one head at that step: one tiny forward);
- live run to the phase change: the shipped settings trained as the page's "Train it yourself" trains them (a child
  process, `model.toy.learn.train_in_child`, its start included; every checkpoint measured), until the best
  last-layer induction score first passes 0.5.
- a toy head switch on the Attention page (another session) while a /learn run trains, against the same switch
  without it, in interleaved rounds (median over the rounds' switches): the run as the app trains it (a child
  process, `train_in_child`) and, for comparison, as it trained before (a thread of the server's process,
  `train(yield_s=LIVE_YIELD_S)`). Wall time, and the server process's CPU time per switch (the training thread's
  own CPU subtracted; a child's is not the server's).
Targets (issue 33): open <= 2 s warm, a slider step <= 0.5 s, the phase change <= 3 min on 2 cores, the head
switch <= 1.5x.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the server sets it (viz/ui/warmup.py), before torch loads

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
    """As the page trains: in a child process (its start included)."""
    seen: dict = {}
    t0 = time.perf_counter()

    def cb(run: LR.Run, kind: str) -> bool:
        if kind == "checkpoint" and run.scores and run.scores[-1].induction[-1].max() > 0.5:
            seen["s"], seen["step"] = time.perf_counter() - t0, run.steps[-1]
            return False
        return True

    LR.train_in_child(settings, callback=cb)
    return seen.get("s"), seen.get("step"), time.perf_counter() - t0


def head_switch_cost(n: int = 6, rounds: int = 3) -> dict[str, tuple[float, float]]:
    """{"alone" | "thread" | "child": (median wall s, median server CPU s)} of a toy head switch on the Attention
    page (another session): alone, while a /learn run trains in a thread of this process (the old way), and while
    it trains in a child process (the app's way). Interleaved rounds, so the machine's other load falls on all."""
    import statistics
    import threading

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.switch_page("viz/pages/attention.py")
    at.run()
    H = len(at.selectbox(key="attn_head").options)
    settings = LR.Settings(**LR.run_meta()["models"]["attn2"])
    out: dict[str, list] = {"alone": [], "thread": [], "child": []}
    count = [0]

    def switches(mode: str, trainer: threading.Thread | None = None) -> None:
        clock = time.pthread_getcpuclockid(trainer.ident) if mode == "thread" else None
        for _ in range(n):
            count[0] += 1
            c0, w0 = time.process_time(), time.perf_counter()
            t0 = time.clock_gettime(clock) if clock is not None else 0.0
            at.selectbox(key="attn_head").set_value(count[0] % H).run()
            wall = time.perf_counter() - w0
            own = time.clock_gettime(clock) - t0 if clock is not None else 0.0
            out[mode].append((wall, time.process_time() - c0 - own))

    def training(mode: str) -> None:
        stop, started = threading.Event(), threading.Event()

        def cb(run, kind):
            started.set()
            return not stop.is_set()

        if mode == "thread":
            worker = threading.Thread(target=LR.train, args=(settings,),
                                      kwargs={"callback": cb, "yield_s": LR.LIVE_YIELD_S}, daemon=True)
        else:
            worker = threading.Thread(target=LR.train_in_child, args=(settings, cb), daemon=True)
        worker.start()
        started.wait(120)
        time.sleep(1.0)  # past the first checkpoints: steps running
        switches(mode, worker)
        stop.set()
        worker.join()

    switches("alone")  # warm: the first switches fill caches
    out["alone"].clear()
    for _ in range(rounds):
        switches("alone")
        training("thread")
        training("child")
    return {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-live", action="store_true")
    p.add_argument("--skip-page", action="store_true")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the head-switch comparison")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    rows = []
    if not a.skip_page:
        cold, warm, step = page_times()
        rows += [("page open, cold (measures 100 checkpoints)", f"{cold:.2f} s", ""),
                 ("page open, warm", f"{warm:.2f} s", "<= 2 s"), ("slider step redraw", f"{step:.2f} s", "<= 0.5 s")]
    if not a.skip_live:
        s, at_step, total = live_to_phase(LR.Settings(**LR.run_meta()["models"]["attn2"]))
        rows.append(("live run to the phase change (induction > 0.5)",
                     f"{s:.1f} s (step {at_step})" if s is not None else f"not reached in {total:.0f} s", "<= 180 s"))
    cost = head_switch_cost(rounds=a.rounds)
    (aw, ac) = cost["alone"]
    rows.append(("toy head switch (Attention page), no training: wall / server CPU", f"{aw:.3f} / {ac:.3f} s", ""))
    for mode, what in (("thread", "while a run trains in a server thread (before)"),
                       ("child", "while a run trains in a child process (the app)")):
        w, c = cost[mode]
        rows.append((f"toy head switch {what}", f"{w / aw:.2f}x / {c / ac:.2f}x", "<= 1.5x"))
    w = max(len(r[0]) for r in rows)
    print(f"{'what':<{w}}  {'measured':>20}  target   (threads={a.threads}, torch {torch.__version__})")
    for name, val, target in rows:
        print(f"{name:<{w}}  {val:>20}  {target}")


if __name__ == "__main__":
    main()
