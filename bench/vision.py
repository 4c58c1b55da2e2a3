"""/vision (issue 40 §5): server time of a new image (warm) and of a head switch, at the shipped ViT's size.

    python bench/vision.py [--rounds 5]

Each time is one AppTest run of the whole script (app.py's sidebar and the page), median over the rounds:
- new image: the sample's seed moved to one this server has not drawn (the model's forward with every capture, the
  rollout and the mean attention distance, every figure), after a first open filled the model cache;
- head switch: another head of the same image (the trace is cached: only slicing and the head-dependent figures);
- reference: a rerun with nothing changed, in the same process (what any run of the app costs here);
- the page's own work for both, without the app shell (`page_work`).
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


def page_work(rounds: int) -> tuple[float, float]:
    """The page's own work without the app shell (median s): a new image (the forward with every attention weight
    captured, rollout, mean attention distance, the blank-patch effect, every figure) and a head switch (the maps of
    one head and the figures that depend on it), as viz/pages/vision.py does them."""
    import numpy as np
    import torch

    from model.analysis import vision as AV
    from model.families.vit import load_vit
    from model.toy.shapes import make_batch
    from viz.figures import vision as FV

    model = load_vit("shapes")
    rows, cols = model.cfg.grid
    p, n = model.cfg.patch_size, model.cfg.n_prefix
    new, switch = [], []
    for i in range(rounds):
        x, _, decide = make_batch(1, 3000 + i, image_size=model.cfg.image_size, patch_size=p)
        x = torch.from_numpy(x)
        t0 = time.perf_counter()
        with torch.no_grad():
            logits, trace = model.run_with_trace(x, names="*.weights")
        roll, dist = AV.attention_rollout(trace), AV.mean_attention_distance(trace)
        blank, share = AV.blank_patch_effect(model, x), AV.deciding_share(trace, decide)
        figs = [FV.image_figure(x[0], (rows, cols), p), FV.distance_figure(dist, model.cfg.image_size),
                FV.deciding_share_figure(share["share"], share["coverage"]),
                FV.blank_effect_figure(x[0], blank, p, "blank"),
                FV.prediction_figure(torch.softmax(logits[0], -1).numpy(), model.cfg.names())]
        new.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        w = trace["encoder.layers.1.self_attn.weights"][0].double().numpy()
        z, _ = FV.patch_map(w[i % 4, 0], n, (rows, cols))
        rz, _ = FV.patch_map(roll[1, 0], n, (rows, cols))
        maps = np.stack([FV.patch_map(w[h, 0], n, (rows, cols))[0] for h in range(w.shape[0])])
        figs += [FV.rollout_beside_raw(x[0], z, rz, p, "raw", "rollout", "title"),
                 FV.heads_over_image(x[0], maps, p, "heads")]
        switch.append(time.perf_counter() - t0)
    return statistics.median(new), statistics.median(switch)


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
    own_new, own_switch = page_work(args.rounds)
    print(f"load average {os.getloadavg()[0]:.1f}; first open (cold model) {cold:.2f} s")
    print("| action | server time (median) | target | × reference rerun |")
    print("|---|---|---|---|")
    for name, xs, target in (("new image, warm", new, "≤ 1 s"), ("head switch", switch, "≤ 0.3 s"),
                             ("rerun (reference)", ref, "")):
        m = statistics.median(xs)
        print(f"| {name} | {m:.3f} s | {target} | {m / r:.2f}× |")
    print(f"the page's own work (no app shell): new image {own_new:.3f} s, head switch {own_switch:.3f} s")


if __name__ == "__main__":
    main()
