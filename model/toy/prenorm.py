"""Post-LN vs pre-LN in practice: does pre-LN need no learning-rate warmup (seed 002's claim)?

Trains the same small model four times on one toy task: {post-LN, pre-LN} x {warmup 1, the usual
warmup}, and records each run's loss curve. Both warmups reach the SAME peak learning rate (the Noam
factor is chosen per warmup so that lr(step = warmup) = peak_lr): warmup 1 starts at the peak, the
usual warmup climbs to it. So the only difference is the warmup. A diverged run (non-finite loss)
keeps its curve up to that step and is marked as such.

    python -m model.prenorm                      # writes model/results/prenorm.json (+ two models)
    python -m model.prenorm --steps 100 --out /tmp/p.json

The shipped results file holds the exact command, so anyone can reproduce it. The two runs with
the usual warmup are also saved as checkpoints (model/results/prenorm-post-LN, .../prenorm-pre-LN),
outside model/checkpoints so the app's model list is unchanged: the "Inside a layer" page draws
both wirings with live tensors from them.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from model.toy.train import train

RESULTS = Path(__file__).parent / "results" / "prenorm.json"


def model_dir(wiring: str, results: str | Path = RESULTS) -> Path:
    """Where the usual-warmup model of `wiring` ("post-LN" or "pre-LN") is saved, beside the results."""
    return Path(results).with_name(f"prenorm-{wiring}")
TASK = "reverse"
# Deep enough for post-LN's trouble to show, small enough for ~a minute on 2 CPU cores.
MODEL = {"d_model": 64, "n_heads": 4, "n_encoder_layers": 3, "n_decoder_layers": 3, "d_ff": 256, "dropout": 0.0}
STEPS, BATCH, WARMUP, PEAK_LR, SEED = 300, 32, 200, 0.0088, 0
WIRINGS = {"post-LN": False, "pre-LN": True}  # label -> TransformerConfig.norm_first

Progress = Callable[[str, int, int], bool | None]  # (run label, step, steps) -> False stops


def run_label(wiring: str, warmup: int) -> str:
    return f"{wiring}, warmup {warmup}"


def noam_factor(peak_lr: float, d_model: int, warmup: int) -> float:
    """The Noam factor whose peak, factor · d^-0.5 · warmup^-0.5 (at step = warmup), is `peak_lr`."""
    return peak_lr * math.sqrt(d_model * warmup)


def one_run(wiring: str, warmup: int, *, task: str = TASK, steps: int = STEPS, batch_size: int = BATCH,
            peak_lr: float = PEAK_LR, seed: int = SEED, model: dict | None = None,
            progress: Progress | None = None, save_to: str | Path | None = None) -> dict:
    """Train one configuration; returns {wiring, warmup, step, loss, acc, lr, diverged, seconds}.
    save_to: also save the trained checkpoint there (unless it diverged)."""
    label = run_label(wiring, warmup)
    model = model or MODEL
    lr_factor = noam_factor(peak_lr, model["d_model"], warmup)
    log: dict[str, list] = {"step": [], "loss": [], "acc": [], "lr": []}

    def callback(step: int, m: dict) -> bool | None:
        for k in log:
            log[k].append(float(m[k]))
        return None if progress is None else progress(label, step, steps)

    t0 = time.perf_counter()
    diverged = False
    try:
        train(task, {**model, "norm_first": WIRINGS[wiring]}, steps, batch_size=batch_size,
              warmup=warmup, lr_factor=lr_factor, seed=seed, film_every=0, eval_every=0, eval_n=0,
              callback=callback, out=save_to)
    except FloatingPointError:  # train() stops at a non-finite loss: that *is* the result
        diverged = True
    return {"label": label, "wiring": wiring, "warmup": warmup, "lr_factor": lr_factor, **log, "diverged": diverged,
            "seconds": round(time.perf_counter() - t0, 2)}


def _run_star(args: tuple) -> dict:
    wiring, warmup, kw = args
    torch.set_num_threads(1)
    return one_run(wiring, warmup, **kw)


def run_experiment(*, task: str = TASK, steps: int = STEPS, batch_size: int = BATCH, warmup: int = WARMUP,
                   peak_lr: float = PEAK_LR, seed: int = SEED, model: dict | None = None,
                   progress: Progress | None = None, command: str | None = None,
                   results: str | Path | None = None, jobs: int = 1) -> dict:
    """All four runs plus everything needed to reproduce them (a JSON-able dict). With `results` (the
    JSON path), the usual-warmup models are saved beside it (see model_dir). jobs > 1: the runs train
    in that many processes (same numbers: every run is seeded on its own; no progress reports)."""
    model = model or MODEL
    todo = [(w, wu, {"task": task, "steps": steps, "batch_size": batch_size, "peak_lr": peak_lr, "seed": seed,
                     "model": model,
                     "save_to": model_dir(w, results) if results is not None and wu == warmup else None})
            for wu in (1, warmup) for w in WIRINGS]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            runs = list(pool.map(_run_star, todo))
    else:
        runs = [one_run(w, wu, progress=progress, **kw) for w, wu, kw in todo]
    return {
        "task": task, "steps": steps, "batch_size": batch_size, "warmups": [1, warmup], "peak_lr": peak_lr,
        "seed": seed, "model": model, "runs": runs,
        "command": command or (f"model.prenorm.run_experiment(task={task!r}, steps={steps}, "
                               f"batch_size={batch_size}, warmup={warmup}, peak_lr={peak_lr}, seed={seed})"),
        "torch": torch.__version__.split("+")[0], "python": platform.python_version(),
        "threads": torch.get_num_threads(),
    }


def summary(results: dict, last: int = 20) -> list[dict]:
    """Per run: mean loss and token accuracy over the last `last` steps recorded, and whether it diverged."""
    out = []
    for r in results["runs"]:
        tail = slice(-last, None)
        n = len(r["loss"][tail])
        out.append({"run": r["label"], "steps": len(r["loss"]), "diverged": r["diverged"],
                    "final loss": sum(r["loss"][tail]) / n if n else float("nan"),
                    "final accuracy": sum(r["acc"][tail]) / n if n else float("nan")})
    return out


def load_results(path: str | Path = RESULTS) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no pre-LN results at {path}: run `python -m model.prenorm`") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read pre-LN results {path}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ValueError(f"{path} is not a pre-LN results file (no 'runs' list)")
    return data


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m model.prenorm", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--task", default=TASK)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--batch-size", type=int, default=BATCH)
    p.add_argument("--warmup", type=int, default=WARMUP)
    p.add_argument("--peak-lr", type=float, default=PEAK_LR, help="the learning rate both warmups reach")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--threads", type=int, default=1, help="torch threads (small matrices: 1 is fastest on a busy CPU)")
    p.add_argument("--jobs", type=int, default=1, help="train the four runs in this many processes")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)

    def progress(label: str, step: int, steps: int) -> None:
        if step % 50 == 0 or step == steps:
            sys.stderr.write(f"{label}: step {step}/{steps}\n")

    res = run_experiment(task=a.task, steps=a.steps, batch_size=a.batch_size, warmup=a.warmup,
                         peak_lr=a.peak_lr, seed=a.seed, progress=progress,
                         command="python -m model.prenorm " + shlex.join(argv), results=a.out, jobs=a.jobs)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1), encoding="utf-8")
    print(json.dumps(summary(res), indent=1))


if __name__ == "__main__":
    main()
