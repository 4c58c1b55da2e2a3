"""Time-to-accuracy of training on this machine: post-LN (the paper) versus pre-LN, one run.

    .venv/bin/python bench/train.py [--task reverse] [--target 0.9] [--max-steps 3000]

Trains the shipped architecture with the shipped recipe, measuring greedy exact match on
200 validation pairs every `--every` steps, and stops once it reaches `--target`. Prints the
wall time and steps to get there for each layer-norm placement, and their ratio. The
evaluation time is excluded from the training time.
"""

from __future__ import annotations

import argparse

import torch

from model import load_checkpoint
from model.toy.train import train


def recipe(task: str) -> dict:
    """The shipped model's settings, from its checkpoint (config + meta.json)."""
    c = load_checkpoint(task)
    keys = ("d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff", "dropout", "max_len", "positional")
    cfg = {k: getattr(c.cfg, k) for k in keys}
    m = c.meta
    return {
        "overrides": cfg,
        "batch_size": m["batch_size"],
        "warmup": m["warmup"],
        "lr_factor": m["lr_factor"],
        "seed": m.get("seed", 0),
    }


def time_to_accuracy(task: str, target: float, max_steps: int, every: int, norm_first: bool) -> dict:
    state = {"eval_time": 0.0, "reached": None}

    def cb(step: int, m: dict) -> bool:
        if "eval_acc" in m:
            state["eval_time"] += m["eval_seconds"]  # evaluation is not training time
            if m["eval_acc"] >= target:
                state["reached"] = (step, m["elapsed"] - state["eval_time"], m["eval_acc"])
                return False
        return True

    r = recipe(task)
    overrides = {**r.pop("overrides"), "norm_first": norm_first}
    train(task, overrides, max_steps, **r, eval_every=every, film_every=0, eval_n=0, callback=cb)
    return state


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--task", default="reverse", choices=["dates", "reverse", "zh-en"])
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--max-steps", type=int, default=3000)
    p.add_argument("--every", type=int, default=100)
    p.add_argument("--threads", type=int, default=2, help="1 is steadier on a shared, busy machine")
    a = p.parse_args()
    torch.set_num_threads(a.threads)  # our own process: train() itself never changes the thread count
    results = {}
    for name, norm_first in (("post-LN", False), ("pre-LN", True)):
        r = time_to_accuracy(a.task, a.target, a.max_steps, a.every, norm_first)["reached"]
        results[name] = r
        if r is None:
            print(f"{a.task} {name}: did not reach {a.target:.0%} validation exact match in {a.max_steps} steps")
        else:
            step, secs, acc = r
            print(f"{a.task} {name}: {acc:.1%} validation exact match after {step} steps, {secs:.0f} s training")
    if all(results.values()):
        print(f"pre-LN / post-LN time to {a.target:.0%}: {results['pre-LN'][1] / results['post-LN'][1]:.2f}x")


if __name__ == "__main__":
    main()
