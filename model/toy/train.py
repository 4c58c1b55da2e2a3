"""Train a small Transformer on a toy task, the paper's way, and save a checkpoint.

    python -m model.train --task dates --out /tmp/dates --steps 3000

- Adam (β1 = 0.9, β2 = 0.98, ε = 1e-9) with the Noam schedule: linear warmup, then 1/√step.
- Teacher forcing: decoder input = [BOS] + target, label = target + [EOS], every position in
  one parallel pass (the look-ahead mask keeps a position from seeing its own label).
- Cross-entropy with label smoothing (ε_ls = 0.1) that ignores [PAD].
- Every `film_every` steps, the attention of a fixed probe example is captured (the film strip).

As a library (the app's live-training page):

    ckpt = train("reverse", {"d_model": 64}, steps=300, callback=lambda step, m: not stop_pressed)

train() changes no process-wide state (the app trains in one session's thread while others trace):
it never sets the thread count, and never draws from torch's global generator while it trains.
The weights are initialised inside `torch.random.fork_rng` seeded with `seed` (a few milliseconds);
the generator state that leaves behind seeds a private `torch.Generator` that every dropout of the
run draws from (`PrivateDropout`: the same ops as nn.Dropout, so a run alone gives the same bits
as seeding the global generator did, and the shipped models' recorded commands still reproduce
them). Data batches come from the task's own seeded sampler.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import torch
from torch import nn

from model.core.config import TransformerConfig
from model.core.trace import Trace
from model.families.transformer import Transformer, label_smoothed_loss
from model.toy.checkpoint import Checkpoint
from model.toy.schedule import noam_lr
from model.toy.tasks import TASKS, Task
from model.toy.tokenizer import Tokenizer

# Small enough to train on 2 CPU cores in minutes (d_model 128, 4 heads, 2+2 layers, d_ff 512).
DEFAULT_MODEL = {
    "d_model": 128,
    "n_heads": 4,
    "n_encoder_layers": 2,
    "n_decoder_layers": 2,
    "d_ff": 512,
    "dropout": 0.1,
    "norm_first": False,
    "positional": "sinusoidal",
}
FILM_NAMES = ("*.weights", "logits")  # every attention map (encoder, decoder, cross) + the prediction
# The probe's target, for tasks whose example is not computable from the task API.
_PROBE_TARGETS = {
    "attention42": "24noitnetta",
    "3 november 2023": "2023-11-03",
    "我爱机器学习": "i love machine learning",
}

Callback = Callable[[int, dict], bool | None]


class Adam:
    """torch.optim.Adam's update on CPU (its single-tensor path; no weight decay, no amsgrad), written out.

    Not torch.optim itself: its first call imports torch._dynamo, and with it sympy and torch.distributed
    (~800 modules, ~75 MB), which a long-running app server then holds for good after one training run
    (issue 12's memory target). The operations and their order are torch's own, so a run gives the same
    bits (tests/test_memory.py checks against torch.optim.Adam)."""

    def __init__(self, params, betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-9):
        self.params = [p for p in params if p.requires_grad]
        self.betas, self.eps = betas, eps
        self.steps = [0] * len(self.params)  # per tensor, like torch: a tensor without a gradient is not stepped
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, lr: float) -> None:
        beta1, beta2 = self.betas
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            self.steps[i] += 1
            m, v, n = self.exp_avg[i], self.exp_avg_sq[i], self.steps[i]
            m.lerp_(p.grad, 1 - beta1)
            v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            denom = (v.sqrt() / (1 - beta2**n) ** 0.5).add_(self.eps)
            p.addcdiv_(m, denom, value=-(lr / (1 - beta1**n)))


def default_max_len(task: Task) -> int:
    """Positions for the longest source (+ [EOS]) and decoder input ([BOS] + target), rounded up to 8.
    max_src_len / max_tgt_len are in characters, an upper bound on tokens for either tokenizer kind."""
    n = max(task.max_src_len, task.max_tgt_len) + 1
    return -(-n // 8) * 8


def make_batch(pairs, src_tok: Tokenizer, tgt_tok: Tokenizer, pad_id: int = 0, src_eos: bool = True):
    """(src, tgt_in, label) padded LongTensors: src = source (+ [EOS]), tgt_in = [BOS] + target,
    label = target + [EOS]."""
    src = [torch.tensor(src_tok.encode(s) + [src_tok.eos_id] * src_eos) for s, _ in pairs]
    tgt = [tgt_tok.encode(t) for _, t in pairs]
    tgt_in = [torch.tensor([tgt_tok.bos_id, *t]) for t in tgt]
    label = [torch.tensor([*t, tgt_tok.eos_id]) for t in tgt]

    def pad(rows):
        return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad_id)

    return pad(src), pad(tgt_in), pad(label)


def probe_pair(task: Task) -> tuple[str, str]:
    """The film strip's fixed example: the task's demo input with its correct output."""
    if task.example in _PROBE_TARGETS:
        return task.example, _PROBE_TARGETS[task.example]
    if task.finite:
        for s, t in task.all_pairs():
            if s == task.example:
                return s, t
    return task.sample(1, seed=0, split="valid")[0]


def _film_frame(model: Transformer, probe, step: int, meta: dict) -> Trace:
    was = model.training
    model.eval()
    with torch.no_grad():
        _, trace = model.run_with_trace(probe[0], probe[1], names=list(FILM_NAMES), meta={**meta, "step": step})
    model.train(was)
    return trace


class PrivateDropout(nn.Module):
    """nn.Dropout's computation (same ops, same bits) drawing from a given generator: torch's dropout
    has no generator argument, and the global generator is shared by every session's thread."""

    def __init__(self, p: float, generator: torch.Generator):
        super().__init__()
        self.p, self.generator = p, generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        noise = torch.empty_like(x).bernoulli_(1 - self.p, generator=self.generator)
        return x * noise.div_(1 - self.p)


@contextmanager
def private_dropout(model: nn.Module, generator: torch.Generator) -> Iterator[nn.Module]:
    """Swap every nn.Dropout of `model` for a PrivateDropout on `generator`; put them back on exit."""
    swapped = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, nn.Dropout)]
    for parent, name, child in swapped:
        setattr(parent, name, PrivateDropout(child.p, generator))
    try:
        yield model
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)


def seeded_model(cfg: TransformerConfig, seed: int) -> tuple[Transformer, torch.Generator]:
    """The model initialised as `torch.manual_seed(seed); Transformer(cfg)` would, without leaving the
    global generator changed, and a private generator in the state that call would have left."""
    with torch.random.fork_rng(devices=[]):  # restores the CPU generator on exit
        torch.random.default_generator.manual_seed(seed)
        model = Transformer(cfg)
        generator = torch.Generator()
        generator.set_state(torch.get_rng_state())
    return model, generator


def _progress(step: int, steps: int, m: dict, elapsed: float, end: bool = False) -> None:
    width = 24
    done = int(width * step / steps)
    bar = "#" * done + "-" * (width - done)
    eval_part = f" val {m['eval_acc']:.1%}" if m.get("eval_acc") is not None else ""
    line = (
        f"\rstep {step:>{len(str(steps))}}/{steps} [{bar}] loss {m['loss']:.3f} acc {m['acc']:.1%} "
        f"lr {m['lr']:.2e}{eval_part} {elapsed:.0f}s"
    )
    sys.stderr.write(line + ("\n" if end else ""))
    sys.stderr.flush()


def train(
    task: str,
    overrides: dict | None = None,
    steps: int = 2000,
    *,
    batch_size: int = 64,
    warmup: int = 200,
    lr_factor: float = 0.5,
    smoothing: float = 0.1,
    seed: int = 0,
    src_eos: bool = True,
    film_every: int | None = None,
    eval_every: int = 0,
    eval_n: int = 500,
    val_n: int = 200,
    callback: Callback | None = None,
    out: str | Path | None = None,
    command: str | None = None,
    progress: bool = False,
    threads: int | None = None,
) -> Checkpoint:
    """Train on `task` for `steps` steps; returns the Checkpoint (saved to `out` if given).

    overrides: TransformerConfig fields over DEFAULT_MODEL (vocab sizes and max_len come from the task).
    callback(step, metrics) is called after every step with loss, acc (token accuracy), lr, elapsed
    (and eval_acc on validation steps, frame = the probe Trace on film steps); returning False stops
    training early, and the checkpoint holds the steps done so far.
    film_every: capture the probe's attention every K steps (None: about 60 frames; 0: none).
    eval_every: greedy exact-match accuracy on `val_n` validation pairs every K steps (0: never).
    eval_n: held-out test pairs for the final accuracy in meta (0: skip).
    lr_factor scales the Noam schedule. The paper's factor 1 at d_model 512 peaks at 7e-4; d_model^-0.5
    grows as the model shrinks, and factor 1 at d_model 64-128 is too hot for these tasks (post-LN
    overshoots, and the 1/sqrt(step) tail stays too high for exact outputs): 0.5 suits short runs
    with small batches, the shipped models used 0.15 with batch 128.
    src_eos: end every source with [EOS], as fairseq and tensor2tensor do: it gives the encoder an
    anchor to measure "distance from the end" (reverse needs it to cope with repeated characters).
    threads: ignored. The intra-op thread count is process-wide: a library call must not change it
    under other sessions. A program of its own sets it (`python -m model.train --threads N`).
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; available: {sorted(TASKS)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if threads is not None:
        warnings.warn("train(threads=...) is ignored: the thread count is process-wide; set it in your own "
                      "program with torch.set_num_threads", DeprecationWarning, stacklevel=2)
    settings = {k: v for k, v in locals().items() if k not in ("task", "threads")}
    return _train(TASKS[task], **settings)


def _train(
    t: Task,
    *,
    overrides,
    steps,
    batch_size,
    warmup,
    lr_factor,
    smoothing,
    seed,
    src_eos,
    film_every,
    eval_every,
    eval_n,
    val_n,
    callback,
    out,
    command,
    progress,
) -> Checkpoint:
    task = t.name
    start = time.perf_counter()
    src_tok, tgt_tok = t.build_tokenizers()
    fields = {**DEFAULT_MODEL, "max_len": default_max_len(t), **(overrides or {})}
    fields |= {
        "src_vocab_size": src_tok.vocab_size,
        "tgt_vocab_size": tgt_tok.vocab_size,
        "pad_id": src_tok.pad_id,
    }
    cfg = TransformerConfig.from_dict(fields)
    model, generator = seeded_model(cfg, seed)
    opt = Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9)

    probe = probe_pair(t)
    pb_src, pb_in, _ = make_batch([probe], src_tok, tgt_tok, cfg.pad_id, src_eos)
    film_meta = {
        "src_tokens": src_tok.tokens(pb_src[0].tolist()),
        "tgt_tokens": tgt_tok.tokens(pb_in[0].tolist()),
        "next_tokens": tgt_tok.tokens([*tgt_tok.encode(probe[1]), tgt_tok.eos_id]),
        "checkpoint": task,
        "text": probe[0],
        "target": probe[1],
    }
    if film_every is None:
        film_every = max(1, steps // 60)
    film = [(0, _film_frame(model, (pb_src, pb_in), 0, film_meta))] if film_every else []
    log: dict[str, list] = {"step": [], "loss": [], "lr": [], "acc": [], "eval_step": [], "eval_acc": []}
    meta = {
        "name": task,
        "task": task,
        "example": t.example,
        "probe": {"source": probe[0], "target": probe[1]},
        "seed": seed,
        "src_eos": src_eos,
        "batch_size": batch_size,
        "warmup": warmup,
        "lr_factor": lr_factor,
        "label_smoothing": smoothing,
        "optimizer": "Adam(betas=(0.9, 0.98), eps=1e-9) + Noam",
        "layer_norm": "pre-LN" if cfg.norm_first else "post-LN",
        "positional": cfg.positional,
        "n_parameters": model.num_parameters(),
        "command": command
        or f"model.train.train({task!r}, {overrides!r}, steps={steps}, batch_size={batch_size}, "
        f"warmup={warmup}, lr_factor={lr_factor}, seed={seed})",
    }
    ckpt = Checkpoint(model, src_tok, tgt_tok, meta=meta, log=log, film=film, name=task)
    val_pairs = t.sample(val_n, seed=seed, split="valid") if eval_every else []

    with private_dropout(model, generator):  # the run draws no random number from the global generator
        model.train()
        step = 0
        for step in range(1, steps + 1):
            pairs = t.sample(batch_size, seed=seed * 1_000_003 + step, split="train")
            src, tgt_in, label = make_batch(pairs, src_tok, tgt_tok, cfg.pad_id, src_eos)
            logits = model(src, tgt_in)  # teacher forcing: the whole target in one pass
            loss = label_smoothed_loss(logits, label, cfg.pad_id, smoothing)
            opt.zero_grad()
            loss.backward()
            lr = noam_lr(step, cfg.d_model, warmup, lr_factor)
            opt.step(lr)
            with torch.no_grad():
                real = label != cfg.pad_id
                acc = float((logits.argmax(-1) == label)[real].float().mean())
            m = {"step": step, "loss": loss.item(), "acc": acc, "lr": lr}
            if not math.isfinite(m["loss"]):
                raise FloatingPointError(f"loss is {m['loss']} at step {step}: lower lr_factor or raise warmup")
            for k in ("step", "loss", "lr", "acc"):
                log[k].append(m[k])
            if eval_every and (step % eval_every == 0 or step == steps):
                t0 = time.perf_counter()
                model.eval()
                m["eval_acc"] = ckpt.evaluate(val_pairs)
                model.train()
                m["eval_seconds"] = time.perf_counter() - t0
                log["eval_step"].append(step)
                log["eval_acc"].append(m["eval_acc"])
            if film_every and (step % film_every == 0 or step == steps):
                frame = _film_frame(model, (pb_src, pb_in), step, film_meta)
                film.append((step, frame))
                m["frame"] = frame
            m["elapsed"] = time.perf_counter() - start
            if progress and (step % 10 == 0 or step == steps):
                _progress(step, steps, m, m["elapsed"])
            if callback is not None and callback(step, m) is False:
                break
    if film and film[-1][0] != step:
        film.append((step, _film_frame(model, (pb_src, pb_in), step, film_meta)))

    model.eval()
    train_time = time.perf_counter() - start
    accuracy = ckpt.evaluate(t.sample(eval_n, seed=0, split="test")) if eval_n else None
    meta |= {
        "steps": step,
        "accuracy": accuracy,
        "eval": {"split": "test", "n": eval_n, "seed": 0, "metric": "exact match, greedy"},
        "train_time_s": round(train_time, 1),
        "wall_time_s": round(time.perf_counter() - start, 1),
        "final_loss": log["loss"][-1],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    ckpt.meta, ckpt.log = meta, log
    if progress:
        acc_s = "n/a" if accuracy is None else f"{accuracy:.1%}"
        sys.stderr.write(f"\ndone: {step} steps in {train_time:.0f}s, held-out exact match {acc_s}\n")
    if out is not None:
        ckpt.save(out)
    return ckpt


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m model.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, choices=sorted(TASKS))
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--lr-factor", type=float, default=0.5, help="Noam factor (the shipped models used 0.15)")
    p.add_argument("--smoothing", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-src-eos", action="store_true", help="do not end sources with [EOS]")
    p.add_argument("--film-every", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--eval-n", type=int, default=500)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--config", default="{}", help="JSON TransformerConfig overrides, e.g. '{\"d_model\": 64}'")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)  # this process is ours: the thread count is ours to set
    command = "python -m model.train " + shlex.join(argv)
    ckpt = train(
        a.task,
        json.loads(a.config),
        a.steps,
        batch_size=a.batch_size,
        warmup=a.warmup,
        lr_factor=a.lr_factor,
        smoothing=a.smoothing,
        seed=a.seed,
        src_eos=not a.no_src_eos,
        film_every=a.film_every,
        eval_every=a.eval_every,
        eval_n=a.eval_n,
        out=a.out,
        command=command,
        progress=True,
    )
    print(json.dumps({k: ckpt.meta[k] for k in ("task", "steps", "accuracy", "train_time_s", "command")}))


if __name__ == "__main__":
    main()
