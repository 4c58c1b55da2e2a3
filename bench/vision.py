"""/vision (issue 40 §5): server time of a new image (warm) and of a head switch, at the shipped ViT's size.

    python bench/vision.py [--rounds 5]

Each time is one AppTest run of the whole script (app.py's sidebar and the page), median over the rounds:
- new image: the sample's seed moved to one this server has not drawn (the model's forward with every capture, the
  rollout and the mean attention distance, every figure), after a first open filled the model cache;
- head switch: another head of the same image (the trace is cached: only slicing and the head-dependent figures);
- reference: a rerun with nothing changed, in the same process (what any run of the app costs here).
Targets (issue 40): a new image <= 1 s warm, a head switch <= 0.3 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the server sets it (viz/ui/warmup.py), before torch loads


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    from streamlit.testing.v1 import AppTest

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.query_params["lang"] = "en"
    at.run()
    at.query_params.update({"seed": "1000", "layer": "0", "head": "0"})
    at.switch_page("viz/pages/vision.py")
    cold = timed(at.run)
    assert not at.exception, at.exception
    new, switch, ref = [], [], []
    for i in range(args.rounds):
        new.append(timed(lambda i=i: at.number_input(key="vis_seed").set_value(2000 + i).run()))
        switch.append(timed(lambda i=i: at.segmented_control(key="vis_head").set_value((i + 1) % 4).run()))
        ref.append(timed(at.run))
        assert not at.exception and not at.error, (at.exception, at.error)
    r = statistics.median(ref)
    print(f"load average {os.getloadavg()[0]:.1f}; first open (cold model) {cold:.2f} s")
    print("| action | server time (median) | target | × reference rerun |")
    print("|---|---|---|---|")
    for name, xs, target in (("new image, warm", new, "≤ 1 s"), ("head switch", switch, "≤ 0.3 s"),
                             ("rerun (reference)", ref, "")):
        m = statistics.median(xs)
        print(f"| {name} | {m:.3f} s | {target} | {m / r:.2f}× |")


if __name__ == "__main__":
    main()
