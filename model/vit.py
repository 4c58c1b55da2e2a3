"""`python -m model.vit`: train the lab's vision transformer (issue 40) and save it as a checkpoint.

    python -m model.vit --task shapes --seed 0 --out model/toy/checkpoints/vision/shapes

The model is model/families/vit.py's VisionTransformer; the data model/toy/shapes.py ("what colour is the square?",
fresh images every step, batch seeds below 10**6) or, with --task digits, scikit-learn's 8x8 digits. The held-out
accuracy is measured on fresh images the training never drew (seed HELD_OUT_SEED >= 10**6; for digits the test
split) and written to meta.json with the exact command, so `load_vit(name).meta["accuracy"]` is re-checkable
(tests/test_vit.py does). Kept apart from the recorder and the family (DESIGN.md: mains live apart), and `train`
never touches process-wide state (torch's global generator, the thread count) unless run as the main.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from model.families.vit import VIT_DIR, VisionTransformer, ViTConfig, save_vit
from model.toy import shapes

DEFAULTS = {"steps": 800, "batch_size": 128, "lr": 2e-3, "weight_decay": 0.05, "warmup": 200}
EVAL_N = 2000


def config_for(task: str, **over) -> ViTConfig:
    names, _ = shapes.TASKS[task]
    base = dict(image_size=32, patch_size=8, channels=3, d_model=64, n_heads=4, n_layers=4, d_ff=128,
                n_classes=len(names), class_names=tuple(names))
    return ViTConfig(**(base | over))


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to 0 (the ViT paper's schedule)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return 0.5 * lr * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def batch_seed(seed: int, step: int) -> int:
    """Training batch seeds stay below 10**6; held-out seeds are >= 10**6 (shapes.HELD_OUT_SEED)."""
    return (seed * 100_003 + step) % 10**6


@torch.no_grad()
def accuracy(model: VisionTransformer, task: str, n: int = EVAL_N, seed: int = shapes.HELD_OUT_SEED,
             chunk: int = 500) -> float:
    """Share of n fresh images (seed, never a training seed; digits: the test split) the model labels right."""
    c = model.cfg
    if task == "digits":  # the whole test split (n and seed do not apply)
        x, y, _ = shapes.digits_test(c.image_size, c.patch_size)
        n = len(y)
    else:
        x, y, _ = shapes.batch(task, n, seed, c.image_size, c.patch_size)
    was = model.training
    model.eval()
    right = 0
    for a in range(0, n, chunk):
        right += int((model(torch.from_numpy(x[a:a + chunk])).argmax(-1).numpy() == y[a:a + chunk]).sum())
    model.train(was)
    return right / n


def train(task: str = "shapes", seed: int = 0, cfg: ViTConfig | None = None, steps: int = DEFAULTS["steps"],
          batch_size: int = DEFAULTS["batch_size"], lr: float = DEFAULTS["lr"],
          weight_decay: float = DEFAULTS["weight_decay"], warmup: int = DEFAULTS["warmup"], log_every: int = 50,
          eval_every: int = 0, eval_n: int = 500, verbose: bool = False) -> tuple[VisionTransformer, dict]:
    """Train from `seed` (model init and data): the same seed and torch give the same bits. Returns (model in eval
    mode, log {"step", "loss", "acc", "lr", "eval_step", "eval_acc"})."""
    cfg = cfg or config_for(task)
    with torch.random.fork_rng(devices=[]):  # the init draws from a private stream: global state untouched
        torch.manual_seed(seed)
        model = VisionTransformer(cfg)
    decay = [p for n, p in model.named_parameters() if p.dim() > 1 and not n.startswith("embed.")]
    rest = [p for n, p in model.named_parameters() if not (p.dim() > 1 and not n.startswith("embed."))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.99))
    log: dict[str, list] = {"step": [], "loss": [], "acc": [], "lr": [], "eval_step": [], "eval_acc": []}
    model.train()
    t0 = time.perf_counter()
    run_loss, run_acc, k = 0.0, 0.0, 0
    for step in range(steps):
        x, y, _ = shapes.batch(task, batch_size, batch_seed(seed, step), cfg.image_size, cfg.patch_size)
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        rate = lr_at(step, steps, lr, warmup)
        for g in opt.param_groups:
            g["lr"] = rate
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run_loss += loss.item()
        run_acc += float((logits.detach().argmax(-1) == y).float().mean())
        k += 1
        if (step + 1) % log_every == 0 or step + 1 == steps:
            log["step"].append(step + 1)
            log["loss"].append(run_loss / k)
            log["acc"].append(run_acc / k)
            log["lr"].append(rate)
            run_loss, run_acc, k = 0.0, 0.0, 0
            if verbose:
                print(f"step {step + 1:5d}  loss {log['loss'][-1]:.4f}  acc {log['acc'][-1]:.3f}  "
                      f"lr {rate:.2e}  {time.perf_counter() - t0:.0f}s", flush=True)
        if eval_every and (step + 1) % eval_every == 0:
            # a validation seed apart from both training (< 10**6) and the held-out one the meta states
            log["eval_step"].append(step + 1)
            log["eval_acc"].append(accuracy(model, task, eval_n, seed=2 * 10**6 + step))
            model.train()
            if verbose:
                print(f"  eval acc {log['eval_acc'][-1]:.3f}", flush=True)
    log["train_time_s"] = round(time.perf_counter() - t0, 1)
    return model.eval(), log


ANALYSIS_N, ANALYSIS_SEED = 500, shapes.HELD_OUT_SEED + 1


@torch.no_grad()
def summarise(model: VisionTransformer, task: str, n: int = ANALYSIS_N, seed: int = ANALYSIS_SEED) -> dict:
    """What meta.json states about the trained model's attention, from one trace of n fresh images: per (layer,
    head) [CLS]'s share on the deciding patches (shapes only) and the mean attention distance in pixels."""
    from model.analysis import vision  # the analyses read a trace; imported here so the family never needs them

    c = model.cfg
    if task == "digits":
        x, _, decide = shapes.digits_test(c.image_size, c.patch_size)
        n, seed = len(x), None
    else:
        x, _, decide = shapes.batch(task, n, seed, c.image_size, c.patch_size)
    _, tr = model.run_with_trace(torch.from_numpy(x), names="*.self_attn.weights")
    out = {"mean_attention_distance": {"n": n, "seed": seed, "pixels": vision.mean_attention_distance(tr).tolist()}}
    if task == "shapes":
        d = vision.deciding_share(tr, decide)
        out["deciding_share"] = {"n": n, "seed": seed, "share": d["share"].tolist(), "coverage": d["coverage"],
                                 "on_patches": d["on_patches"].tolist()}
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m model.vit", description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="shapes", choices=sorted(shapes.TASKS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="checkpoint directory (default: the shipped one for the task)")
    ap.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    ap.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    ap.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    ap.add_argument("--weight-decay", type=float, default=DEFAULTS["weight_decay"])
    ap.add_argument("--warmup", type=int, default=DEFAULTS["warmup"])
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--config", default="{}", help="JSON overrides of ViTConfig, e.g. '{\"n_registers\": 4}'")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    cfg = config_for(a.task, **json.loads(a.config))
    out = Path(a.out) if a.out else VIT_DIR / a.task
    t0 = time.perf_counter()
    model, log = train(a.task, a.seed, cfg, a.steps, a.batch_size, a.lr, a.weight_decay, a.warmup,
                       eval_every=a.eval_every, verbose=True)
    acc = accuracy(model, a.task)
    names, question = shapes.TASKS[a.task]
    meta = {
        "name": out.name, "task": a.task, "question": question, "class_names": list(names), "seed": a.seed,
        "command": "python -m model.vit " + " ".join(shlex.quote(s) for s in argv),
        "steps": a.steps, "batch_size": a.batch_size, "lr": a.lr, "weight_decay": a.weight_decay,
        "warmup": a.warmup, "optimizer": "AdamW(betas=(0.9, 0.99)) + linear warmup, cosine decay; grad clip 1.0",
        "n_parameters": model.num_parameters(),
        "accuracy": acc,
        "eval": ({"n": EVAL_N, "seed": shapes.HELD_OUT_SEED, "split": "fresh samples (seed >= 10**6; training "
                  "seeds < 10**6)", "metric": "top-1 accuracy"} if a.task == "shapes" else
                 {"n": len(shapes.digits_split("test")), "seed": None, "split": "the whole test split (20% of "
                  "sklearn's digits, never trained on)", "metric": "top-1 accuracy"}),
        "chance": 1.0 / cfg.n_classes,
        "final_loss": log["loss"][-1],
        "train_time_s": log["train_time_s"], "wall_time_s": round(time.perf_counter() - t0, 1),
        "threads": a.threads, "load_average": [round(v, 2) for v in os.getloadavg()],  # the machine was shared
        "torch": torch.__version__, "python": platform.python_version(),
        "numpy": np.__version__, "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    meta |= summarise(model, a.task)
    save_vit(model, out, meta, log)
    print(json.dumps({k: meta[k] for k in ("accuracy", "train_time_s", "n_parameters", "command")}, indent=1))


if __name__ == "__main__":
    main()
