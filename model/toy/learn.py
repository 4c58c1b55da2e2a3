"""Watch attention learn (issue 33): induction heads forming during training, in a model small enough to
train on two CPU cores in a couple of minutes.

The models are the lab's own decoder-only LM (`DecoderLM` / `LMConfig`, model/families/lm.py) with
`ffn="none"`: attention-only blocks x + Attn(LayerNorm(x)), like the 1- and 2-layer attention-only models of
Elhage et al. 2021 and Olsson et al. 2022. Every capture name and every page that reads `decoder.*` works
on them.

The data (`batch_ids`): sequences of 1 + 2n tokens, [BOS] then 2n tokens. Each sequence has its own random
successor table: a next token follows it with probability 0.75, else is a plain random token (`repeat_share`
of the rows can also repeat their first half as their second; the shipped run uses none). A model that knows
only the training distribution can do no better than uniform (log(V - 1) nats); one that looks back for the
earlier occurrence of the current token and copies what followed it (an induction head) predicts much of the
rest. Why not "second half repeats the first half" alone: with a fixed period, positions solve it (layer 0
learns to attend n - 1 tokens back, and a 1-layer model scores 0.92 on the induction probe; measured), so the
repeats must sit at varying distances. The probe (`probe_ids`) is still [BOS] + n random tokens repeated.

The measurements (all from one fixed probe batch, `probe_ids`, the lab's own `induction_sequence`):
- in-context loss: mean loss on the second copy minus mean loss on the first copy (Olsson et al. 2022 use
  the loss of a late token minus an early one; here "late" = the tokens the context already showed);
- per head, over steps: the induction score (Olsson's recipe, the same function as the Attention
  phenomena page: mean attention from each token of the second copy to the token after its previous
  occurrence), the previous-token score (attention i -> i-1), the prefix-matching score (attention on the
  token after every earlier copy of the current token, measured on *plain* random tokens, where tokens repeat
  only by chance: does the head match prefixes outside the repeated blocks too?);
- K-composition (Elhage et al. 2021) between a layer-0 head and a layer-1 head:
  ||W_QK^{1.h} W_OV^{0.g}ᵀ||_F / (||W_QK^{1.h}||_F ||W_OV^{0.g}||_F), with layer 1's LayerNorm gain folded into
  its W_Q and W_K (biases and the norm's centring left out, as in the paper);
- the phase change: PHASE_RULE (`phase_change`).

Training changes no process-wide state (the app trains in a session's thread): it never sets the thread
count and never draws from torch's global generator (the model is initialised from a private one).

Shipped run: model/toy/checkpoints/learn/run/ (`python -m model.learn --out ...`, the command is in its
meta.json); `load_run()` reads it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from model.analysis import phenomena as PH
from model.families.lm import DecoderLM, LMConfig

RUN_DIR = Path(__file__).parent / "checkpoints" / "learn" / "run"
FORMAT, FORMAT_VERSION = "attention-lab-learn-run", "1"
MODELS = ("attn2", "attn1")  # the 2-layer model and its 1-layer control
PHASE_RULE = ("the phase change is the checkpoint step where the in-context loss falls most steeply against "
              "log(step): the largest drop between consecutive checkpoints divided by the log-step between them; "
              "the step named is the later checkpoint of that pair")
CHANGES = ("none", "one_layer", "no_positions", "freeze_layer0", "one_head")
LIVE_YIELD_S = 0.003  # an in-process run (`train(yield_s=)`) sleeps this long after each step, so other threads get the
# GIL between steps. Not enough (bench/learn.py: a toy head switch took ~2x its time while such a run trained): the
# app trains in a child process instead (`train_in_child`), with its own GIL, one thread and a lower priority.
LIVE_NICE = 10  # the child's nice increment: a session's click wins a core from it (CFS weight 1024 vs 110)


@dataclass(frozen=True)
class Settings:
    """Everything a run depends on (meta.json keeps it; the same settings and torch give the same bits)."""

    seed: int = 0
    steps: int = 2000
    n_checkpoints: int = 50
    vocab: int = 32  # id 0 is [BOS]; tokens are drawn from 1..vocab-1
    n: int = 20  # the repeated block: sequences are [BOS] + 2n tokens
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    batch: int = 32
    repeat_share: float = 0.0  # share of each batch whose second half repeats its first (see the module doc)
    follow: float = 0.75  # probability that a next token follows the sequence's own successor table
    lr: float = 3e-3
    warmup: int = 50  # linear warmup, then constant
    weight_decay: float = 0.01
    change: str = "none"  # one change at a time: CHANGES
    positional: str = "rotary"  # "rotary" or "learned"
    pos_init: float = 0.02  # std of a learned position table at init
    probe_batch: int = 16
    probe_seed: int = 1234

    def __post_init__(self) -> None:
        if self.change not in CHANGES:
            raise ValueError(f"change must be one of {CHANGES}, got {self.change!r}")
        for f in ("steps", "n_checkpoints", "vocab", "n", "d_model", "n_layers", "n_heads", "batch", "probe_batch"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{f} must be a positive integer, got {v!r}")

    @property
    def layers(self) -> int:
        return 1 if self.change == "one_layer" else self.n_layers

    @property
    def heads(self) -> int:
        return 1 if self.change == "one_head" else self.n_heads

    def config(self) -> LMConfig:
        return LMConfig(vocab_size=self.vocab, d_model=self.d_model, n_layers=self.layers, n_heads=self.heads,
                        d_ff=1, max_len=1 + 2 * self.n,
                        positional="learned" if self.change == "no_positions" else self.positional,
                        norm="layernorm", ffn="none",
                        tie_embeddings=False, bos_id=0)


# ---------------------------------------------------------------------- data


def batch_ids(s: Settings, generator: torch.Generator) -> torch.Tensor:
    """[batch, 1 + 2n]: [BOS] + 2n tokens. Each sequence draws its own successor table (token -> next token);
    each next token follows it with probability `follow`, else is a plain random token. In the first
    repeat_share of the rows the second half then repeats the first half exactly.
    Positions alone predict nothing (the tokens that repeat sit anywhere, at any distance): only "find the
    earlier occurrence of this token and copy what came after it" (an induction head) lowers the loss."""
    B, T = s.batch, 2 * s.n
    table = torch.randint(1, s.vocab, (B, s.vocab), generator=generator)
    x = torch.empty(B, T, dtype=torch.long)
    x[:, 0] = torch.randint(1, s.vocab, (B,), generator=generator)
    for t in range(1, T):
        follow = torch.rand(B, generator=generator) < s.follow
        plain = torch.randint(1, s.vocab, (B,), generator=generator)
        x[:, t] = torch.where(follow, table.gather(1, x[:, t - 1:t])[:, 0], plain)
    k = int(round(B * s.repeat_share))
    x[:k, s.n:] = x[:k, :s.n]
    return torch.cat([torch.zeros(B, 1, dtype=torch.long), x], dim=1)


def probe_ids(s: Settings) -> torch.Tensor:
    """The fixed probe: [BOS] + n random tokens + the same n again (the lab's `induction_sequence`)."""
    return PH.induction_sequence(init_model(s.config(), 0, meta=True), s.n, s.probe_batch, s.probe_seed)


def plain_probe_ids(s: Settings) -> torch.Tensor:
    """Plain random tokens (no repeated block) for the prefix-matching score; repeats happen by chance."""
    g = torch.Generator().manual_seed(s.probe_seed + 1)
    body = torch.randint(1, s.vocab, (s.probe_batch, 2 * s.n), generator=g)
    return torch.cat([torch.zeros(s.probe_batch, 1, dtype=torch.long), body], dim=1)


def log_steps(steps: int, n: int) -> list[int]:
    """0 and about n log-spaced steps in 1..steps (distinct integers, `steps` included)."""
    k = n
    while True:
        out = sorted({0, *np.unique(np.round(np.geomspace(1, steps, k)).astype(int)).tolist()})
        if len(out) >= n or k > 10 * n:
            return out
        k += 1


# ---------------------------------------------------------------------- model


def init_model(cfg: LMConfig, seed: int, meta: bool = False, pos_init: float = 0.02) -> DecoderLM:
    """DecoderLM(cfg) initialised from a private generator (GPT-2's N(0, 0.02) for matrices, zero biases,
    unit LayerNorm gains): the global generator is never touched."""
    with torch.device("meta"):
        model = DecoderLM(cfg)
    if meta:
        return model
    model = model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, pos_init if name == "decoder.embed.pos.weight" else 0.02, generator=g)
            elif ".norm" in name and name.endswith(".weight"):
                p.fill_(1.0)
            else:
                p.zero_()
    model.tie()
    return model


def apply_change(model: DecoderLM, change: str) -> list[torch.nn.Parameter]:
    """The parameters the optimizer trains under one change (see CHANGES)."""
    frozen: set[str] = set()
    if change == "no_positions":  # learned positions held at zero: no positional information at all
        with torch.no_grad():
            model.decoder.embed.pos.weight.zero_()
        frozen |= {"decoder.embed.pos.weight"}
    if change == "freeze_layer0":  # layer 0 keeps its random initial weights
        frozen |= {n for n, _ in model.named_parameters() if n.startswith("decoder.layers.0.")}
    params = []
    for n, p in model.named_parameters():
        p.requires_grad_(n not in frozen)
        if n not in frozen:
            params.append(p)
    return params


# ---------------------------------------------------------------------- measurements


@dataclass
class Scores:
    """One checkpoint's numbers. Per-head arrays are [layers, heads]."""

    icl: float  # in-context loss: second copy minus first copy (nats; negative = learned from context)
    first: float  # mean loss on the first copy
    second: float  # ... and on the second
    induction: np.ndarray
    previous: np.ndarray
    prefix: np.ndarray
    kcomp: np.ndarray | None  # [H0, H1]: K-composition of layer-0 head g into layer-1 head h (2+ layers)


@torch.no_grad()
def measure(model: DecoderLM, probe: torch.Tensor, plain: torch.Tensor, n: int) -> Scores:
    was = model.training
    model.eval()
    logits, trace = model.run_with_trace(probe, names="*.self_attn.weights")
    rl = PH.repeat_loss(logits, probe, n)
    stats = PH.head_statistics(trace, period=n)
    _, tp = model.run_with_trace(plain, names="*.self_attn.weights")
    pat = torch.stack([PH.induction_pattern(r) for r in plain])
    prefix = np.stack([PH.pattern_score(tp[f"decoder.layers.{i}.self_attn.weights"], pat).numpy()
                       for i in range(model.cfg.n_layers)])
    model.train(was)
    return Scores(rl.second - rl.first, rl.first, rl.second, stats["induction"].scores,
                  stats["previous_token"].scores, prefix, k_composition(model))


def _head_rows(w: torch.Tensor, h: int, hs: int) -> torch.Tensor:
    return w[h * hs:(h + 1) * hs]


@torch.no_grad()
def k_composition(model: DecoderLM) -> np.ndarray | None:
    """[H0, H1]: Elhage et al. 2021's K-composition score of layer-0 head g (its OV circuit, what it writes)
    into layer-1 head h (its QK circuit, what its keys read), in row-vector convention:
    W_OV = W_V W_O (D x D), W_QK = W_Q W_Kᵀ, score = ||W_QK W_OVᵀ||_F / (||W_QK||_F ||W_OV||_F).
    Layer 1's LayerNorm gain multiplies the rows of its W_Q and W_K (the norm sits before them). With rotary
    positions, q and k are also turned by their positions: the score is that of the unrotated W_Q, W_K (a query
    and a key at the same position), as TransformerLens computes it for rotary models."""
    if model.cfg.n_layers < 2:
        return None
    a0, a1 = model.decoder.layers[0].self_attn, model.decoder.layers[1].self_attn
    H, hs = model.cfg.n_heads, model.cfg.head_dim
    gain = model.decoder.layers[1].norm1.weight.double()
    ov = []
    for g in range(H):
        wv = _head_rows(a0.w_v.weight.double(), g, hs)  # [hs, D]: v = x wvᵀ
        wo = a0.w_o.weight.double()[:, g * hs:(g + 1) * hs]  # [D, hs]: out = z woᵀ
        ov.append(wv.T @ wo.T)  # [D, D]: x -> x W_OV
    out = np.zeros((H, H))
    for h in range(H):
        wq = _head_rows(a1.w_q.weight.double(), h, hs).T * gain[:, None]  # [D, hs]
        wk = _head_rows(a1.w_k.weight.double(), h, hs).T * gain[:, None]
        qk = wq @ wk.T  # [D, D]: scores = x_q W_QK x_kᵀ
        for g in range(H):
            out[g, h] = float(torch.linalg.norm(qk @ ov[g].T) / (torch.linalg.norm(qk) * torch.linalg.norm(ov[g])))
    return out


def phase_change(steps, icl) -> int | None:
    """PHASE_RULE: the later step of the consecutive checkpoint pair (step > 0 both) where the in-context loss
    falls most steeply per unit of log(step). None when it never falls."""
    steps, icl = np.asarray(steps, dtype=float), np.asarray(icl, dtype=float)
    best, at = 0.0, None
    for i in range(len(steps) - 1):
        a, b = steps[i], steps[i + 1]
        if a <= 0 or b <= a:
            continue
        slope = (icl[i + 1] - icl[i]) / (math.log(b) - math.log(a))
        if slope < best:
            best, at = slope, int(b)
    return at


# ---------------------------------------------------------------------- training


@dataclass
class Run:
    """A training run: its settings, the per-step training loss, and checkpoints at `log_steps`."""

    settings: Settings
    steps: list[int] = field(default_factory=list)  # checkpoint steps
    states: list[dict[str, torch.Tensor]] = field(default_factory=list)  # weights at those steps
    scores: list[Scores] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)  # training loss of step 1, 2, ...
    seconds: list[float] = field(default_factory=list)  # wall time at each checkpoint (live runs)

    def model_at(self, i: int) -> DecoderLM:
        model = init_model(self.settings.config(), 0, meta=True).to_empty(device="cpu")
        model.load_state_dict({k: v.float() for k, v in self.states[i].items()})
        model.tie()
        return model.eval()

    def series(self, key: str) -> np.ndarray:
        return np.array([getattr(s, key) for s in self.scores])

    def heads(self, key: str = "induction") -> np.ndarray:
        """[checkpoints, layers, heads]: one per-head score ("induction", "previous", "prefix") at every checkpoint.
        The one source of the heads-over-training heatmaps (/learn, lesson 17) and of `summary`'s cited head, so
        the head a sentence names is the heatmap's brightest at the step it names (issue 38 §5)."""
        return np.stack([getattr(s, key) for s in self.scores])


def lr_at(s: Settings, step: int) -> float:
    return s.lr * min(1.0, step / s.warmup)


def _train_step(model: DecoderLM, opt: torch.optim.Optimizer, s: Settings, step: int, data: torch.Generator) -> float:
    """One optimizer step of `train` (and of `pace`, which times it); the step's training loss."""
    for group in opt.param_groups:
        group["lr"] = lr_at(s, step)
    ids = batch_ids(s, data)
    logits = model(ids)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, model.cfg.vocab_size), ids[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())


def _optimizer(model: DecoderLM, s: Settings) -> torch.optim.Optimizer:
    return torch.optim.AdamW(apply_change(model, s.change), lr=s.lr, betas=(0.9, 0.98), weight_decay=s.weight_decay)


@dataclass(frozen=True)
class Pace:
    """How fast this machine trains a run now (`pace`): seconds per training step and per checkpoint
    (weights kept and measured), each timed on a few of them."""

    step_s: float
    checkpoint_s: float
    steps_timed: int

    def seconds(self, s: Settings) -> float:
        """The whole run of `s` at this pace: its steps and its checkpoints."""
        return s.steps * self.step_s + len(log_steps(s.steps, s.n_checkpoints)) * self.checkpoint_s


def pace(s: Settings, n_steps: int = 12) -> Pace:
    """Time `n_steps` training steps and one checkpoint of run `s` on this machine, now (a fraction of a second on
    an idle core; more under load, which is the point): what a live run's estimate is made of, instead of a fixed
    "about a minute" (issue 38 §5: a run promised that took 283 s at load 6-11). One untimed step first (the first
    backward pays torch's one-time setup). Touches no global state (a private generator, its own model)."""
    model = init_model(s.config(), s.seed, pos_init=s.pos_init)
    opt = _optimizer(model, s)
    data = torch.Generator().manual_seed(s.seed + 1)
    probe, plain = probe_ids(s), plain_probe_ids(s)
    model.train()
    _train_step(model, opt, s, 1, data)
    t0 = time.perf_counter()
    for step in range(2, n_steps + 2):
        _train_step(model, opt, s, step, data)
    step_s = (time.perf_counter() - t0) / n_steps
    t0 = time.perf_counter()
    _kept = {k: v.detach().to(torch.float16).clone() for k, v in model.state_dict().items()}  # as a checkpoint does
    measure(model, probe, plain, s.n)
    return Pace(step_s, time.perf_counter() - t0, n_steps)


def train(s: Settings, callback: Callable[[Run, str], bool | None] | None = None,
          score: bool = True, dtype: torch.dtype = torch.float16, yield_s: float = 0.0) -> Run:
    """Train one model. At each checkpoint step the weights are kept (as `dtype`, what meta.json says) and,
    with `score`, measured; `callback(run, "checkpoint")` after each checkpoint and `callback(run, "step")`
    after each step may return False to stop early. yield_s: sleep after each step (LIVE_YIELD_S in the app)."""
    cfg = s.config()
    model = init_model(cfg, s.seed, pos_init=s.pos_init)
    opt = _optimizer(model, s)
    data = torch.Generator().manual_seed(s.seed + 1)
    want = set(log_steps(s.steps, s.n_checkpoints))
    probe, plain = probe_ids(s), plain_probe_ids(s)
    run = Run(s)
    t0 = time.perf_counter()

    def checkpoint(step: int) -> bool:
        run.steps.append(step)
        run.states.append({k: v.detach().to(dtype).clone() for k, v in model.state_dict().items()})
        if score:
            run.scores.append(measure(model, probe, plain, s.n))
        run.seconds.append(time.perf_counter() - t0)
        return callback is None or callback(run, "checkpoint") is not False

    if not checkpoint(0):
        return run
    model.train()
    for step in range(1, s.steps + 1):
        run.loss.append(_train_step(model, opt, s, step, data))
        if yield_s:
            time.sleep(yield_s)
        if step in want and not checkpoint(step):
            break
        if callback is not None and callback(run, "step") is False:
            break
    return run


# ---------------------------------------------------------------------- training in a child process


def _child_main(s: Settings, conn, nice: int, threads: int, every_s: float) -> None:
    """The child's side of `train_in_child`: train with its own thread count and priority, sending the losses
    (batched, every `every_s` seconds) and each checkpoint (weights as numpy, scores, wall time) to the parent;
    a "stop" from the parent ends the run after the current step (at a checkpoint the child waits for the answer)."""
    try:
        if nice:
            os.nice(nice)
        torch.set_num_threads(threads)  # this process is ours: its thread count is ours to set
        sent, last = [0], [time.perf_counter()]

        def stopped() -> bool:
            return conn.poll() and conn.recv() == "stop"

        def cb(run: Run, kind: str) -> bool:
            if kind == "checkpoint":
                state = {k: v.numpy() for k, v in run.states[-1].items()}
                conn.send(("checkpoint", run.loss[sent[0]:], run.steps[-1], state,
                           run.scores[-1] if run.scores else None, run.seconds[-1]))
            elif time.perf_counter() - last[0] >= every_s:
                conn.send(("loss", run.loss[sent[0]:]))
            else:
                return True
            sent[0], last[0] = len(run.loss), time.perf_counter()
            # At a checkpoint the parent's callback answers before the next step (exactly as `train` in a thread:
            # False stops after this step, not one or two later on a busy machine); between them, a poll.
            return conn.recv() != "stop" if kind == "checkpoint" else not stopped()

        run = train(s, callback=cb)
        conn.send(("done", run.loss[sent[0]:]))
    except Exception as e:  # noqa: BLE001 - the parent raises it with its type and message
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()
    # Out without the interpreter's teardown: torch's worker threads, still joinable then, made the C++ runtime
    # print "terminate called without an active exception" at every run's end.
    os._exit(0)


def _child_context():
    """forkserver: a clean single-threaded server process (never a fork of the app's threads) that imported torch
    and this module once; each run forks from it in a fraction of a second (spawn paid ~5 s of imports per run on a
    busy 2-core machine). spawn where forkserver is missing."""
    import multiprocessing as mp

    try:
        ctx = mp.get_context("forkserver")
    except ValueError:
        return mp.get_context("spawn")
    ctx.set_forkserver_preload([__name__])
    return ctx


def train_in_child(s: Settings, callback: Callable[[Run, str], bool | None] | None = None,
                   nice: int = LIVE_NICE, threads: int = 1, every_s: float = 0.2) -> Run:
    """`train(s, callback)` run in a child process (`_child_context`: a server's threads are never forked), for a
    live run beside other sessions: the child has its own GIL (the server's Python never waits for it), `threads`
    threads and a lower priority (`nice`). This thread only receives: the Run fills as the child's messages come,
    and `callback` sees it as with `train` (False stops the child after its current step). With threads=1 the
    weights are those of `python -m model.learn --threads 1` bit for bit. Raises RuntimeError when the child fails
    or dies."""
    ctx = _child_context()
    conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_child_main, args=(s, child_conn, nice, threads, every_s), daemon=True,
                       name="attention-lab-learn-child")
    proc.start()
    child_conn.close()
    run, asked_stop = Run(s), False
    try:
        while True:
            if not conn.poll(0.5):
                if not proc.is_alive() and not conn.poll():
                    raise RuntimeError(f"the training process ended without a result (exit code {proc.exitcode})")
                continue
            try:
                msg = conn.recv()
            except EOFError:
                raise RuntimeError(f"the training process ended early (exit code {proc.join(5) or proc.exitcode})"
                                   ) from None
            if msg[0] == "error":
                raise RuntimeError(msg[1])
            run.loss.extend(msg[1])  # the training losses since the last message
            if msg[0] == "done":
                return run
            if msg[0] == "checkpoint":
                _, _, step, state, scores, seconds = msg
                run.steps.append(step)
                run.states.append({k: torch.from_numpy(v) for k, v in state.items()})
                if scores is not None:
                    run.scores.append(scores)
                run.seconds.append(seconds)
            go_on = callback is None or callback(run, msg[0] if msg[0] == "checkpoint" else "step") is not False
            if msg[0] == "checkpoint" or (not go_on and not asked_stop):  # the child waits for this answer
                with contextlib.suppress(OSError):  # it may have stopped already (an earlier "stop")
                    conn.send("go" if go_on else "stop")
                asked_stop = asked_stop or not go_on
    finally:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
        conn.close()


# ---------------------------------------------------------------------- the shipped run on disk


def save_run(runs: dict[str, Run], out: Path, meta: dict) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, run in runs.items():
        tensors = {f"step{st:06d}/{k}": v.contiguous() for st, state in zip(run.steps, run.states, strict=True)
                   for k, v in state.items()}
        save_file(tensors, str(out / f"{name}.safetensors"),
                  metadata={"format": FORMAT, "format_version": FORMAT_VERSION, "model": name})
    log = {name: {"loss": [round(x, 5) for x in run.loss], "checkpoints": run.steps} for name, run in runs.items()}
    (out / "log.json").write_text(json.dumps(log))
    (out / "meta.json").write_text(json.dumps(meta | {"models": {name: asdict(run.settings) for name, run in
                                                                  runs.items()}}, indent=1))


def load_run(path: str | Path = RUN_DIR, score: bool = True) -> dict[str, Run]:
    """The recorded runs {"attn2": Run, "attn1": Run} (weights, training loss, and with `score` every
    checkpoint measured: a second or two)."""
    path = Path(path)
    meta = json.loads((path / "meta.json").read_text())
    log = json.loads((path / "log.json").read_text())
    runs = {}
    for name, settings in meta["models"].items():
        s = Settings(**settings)
        run = Run(s, loss=list(log[name]["loss"]))
        with safe_open(str(path / f"{name}.safetensors"), "pt") as f:
            if (f.metadata() or {}).get("format") != FORMAT:
                raise ValueError(f"{path / (name + '.safetensors')} is not an attention-lab learn run")
            keys = list(f.keys())
            for st in log[name]["checkpoints"]:
                prefix = f"step{st:06d}/"
                run.steps.append(st)
                run.states.append({k[len(prefix):]: f.get_tensor(k) for k in keys if k.startswith(prefix)})
        if score:
            probe, plain = probe_ids(s), plain_probe_ids(s)
            run.scores = [measure(run.model_at(i), probe, plain, s.n) for i in range(len(run.steps))]
        runs[name] = run
    return runs


def run_meta(path: str | Path = RUN_DIR) -> dict:
    return json.loads((Path(path) / "meta.json").read_text())


# ---------------------------------------------------------------------- a checkpoint as a language model

BOS_TOKEN = "[BOS]"


def tokenizer(vocab: int):
    """A word-level tokenizer for the runs' token ids, so every page that reads a prompt reads one: the text
    "5 17 3" is [BOS] 5 17 3 (the [BOS] put in front by its post-processor, as the runs were trained).
    "[UNK]" gets an id past the model's vocabulary: `RunLanguageModel.encode` refuses a word before it is used."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    ids = {BOS_TOKEN: 0, **{str(i): i for i in range(1, vocab)}, "[UNK]": vocab}
    tok = Tokenizer(models.WordLevel(ids, unk_token="[UNK]"))
    tok.add_special_tokens([BOS_TOKEN])
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS_TOKEN} $A", special_tokens=[(BOS_TOKEN, 0)])
    return tok


class NotARunTokenError(ValueError):
    """A prompt word that is not one of a run's token ids (the pages say it in the UI's words: viz/ui/text.py)."""

    def __init__(self, word: str, top: int, name: str):
        super().__init__(f"“{word}” is not a token of {name}: its tokens are the numbers 1 to {top}, separated by "
                         "spaces")
        self.run_word, self.run_top = word, top


def probe_text(s: Settings) -> str:
    """The probe's first row as a prompt ([BOS] left out: the tokenizer puts it back): the map the page draws."""
    return " ".join(str(i) for i in probe_ids(s)[0, 1:].tolist())


@functools.cache
def _run_language_model():
    from model.loaders.lm import LanguageModel  # lazy: training and the recorded run never need it

    class RunLanguageModel(LanguageModel):
        """A checkpoint of a /learn run as the lab's other language models: a prompt is token ids 1..V-1 written
        as numbers; any other word is refused with a sentence (never read as an unknown token)."""

        def encode(self, text: str, chat: bool = False, keep_last: int | None = None) -> torch.Tensor:
            if isinstance(text, str) and not chat:
                top = self.model.cfg.vocab_size - 1
                bad = [w for w in text.split() if not (w.isdigit() and 1 <= int(w) <= top)]
                if bad:
                    raise NotARunTokenError(bad[0], top, self.name)
            return super().encode(text, chat=chat, keep_last=keep_last)

    return RunLanguageModel


def language_model(run: Run, i: int, name: str):
    """Checkpoint i of `run` as a model.loaders.lm.LanguageModel named `name` (its own weights, float32)."""
    return _run_language_model()(run.model_at(i), tokenizer(run.settings.vocab), name=name,
                                 special_tokens={"bos_token": BOS_TOKEN})


# ---------------------------------------------------------------------- summary


@dataclass
class Summary:
    step: int | None  # the phase change (PHASE_RULE)
    icl_before: float  # in-context loss at the checkpoint before the steepest fall, and at `step`
    icl_after: float
    layer: int  # the layer whose heads are compared (the last)
    head: int  # the head with the highest induction score at the phase change (`step`; the last checkpoint if none)
    induction_before: float  # that head's induction score at the checkpoint before, and at `step`
    induction_after: float
    control_max: float | None  # the control's highest induction score of any head, any checkpoint
    prev_head: int | None  # layer 0's highest previous-token head at the last checkpoint (2+ layers)


def summary(run: Run, control: Run | None = None) -> Summary:
    """The numbers of the page's sentence, all from the checkpoints. The head it names is the last layer's best at
    the phase change itself, the step the sentence is about (`Run.heads`, what the heatmap draws): naming the best
    head at the last checkpoint cited head 1.1 (0.073 → 0.46) where the heatmap's brightest at step 675 is 1.0
    (0.087 → 0.61) (issue 38 §5)."""
    icl = run.series("icl")
    step = phase_change(run.steps, icl)
    layer = run.settings.layers - 1
    ind = run.heads("induction")[:, layer]  # [checkpoints, H]
    i = run.steps.index(step) if step is not None else len(run.steps) - 1
    head = int(np.argmax(ind[i]))
    j = max(i - 1, 0)
    prev = int(np.argmax(run.scores[-1].previous[0])) if run.settings.layers > 1 else None
    ctrl = float(np.max([s.induction.max() for s in control.scores])) if control and control.scores else None
    return Summary(step, float(icl[j]), float(icl[i]), layer, head, float(ind[j, head]), float(ind[i, head]), ctrl,
                   prev)


# ---------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m model.learn",
                                description="Train the /learn page's recorded run: a 2-layer attention-only model "
                                            "and its 1-layer control, checkpoints at log-spaced steps.")
    p.add_argument("--out", type=Path, default=RUN_DIR)
    p.add_argument("--seed", type=int, default=Settings.seed)
    p.add_argument("--steps", type=int, default=Settings.steps)
    p.add_argument("--checkpoints", type=int, default=Settings.n_checkpoints)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)  # this process is ours: the thread count is ours to set
    base = Settings(seed=a.seed, steps=a.steps, n_checkpoints=a.checkpoints)
    runs, times = {}, {}
    for name, s in (("attn2", base), ("attn1", replace(base, change="one_layer"))):
        t0 = time.perf_counter()
        runs[name] = train(s, score=False)
        times[name] = round(time.perf_counter() - t0, 1)
        print(f"{name}: {s.steps} steps in {times[name]} s", file=sys.stderr)
    cmd = "python -m model.learn " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = {"name": "learn", "what": "2-layer attention-only model and its 1-layer control on repeated random "
                                     "tokens (issue 33)",
            "command": cmd.strip(), "seed": a.seed, "dtype": "float16 (weights as stored; trained in float32)",
            "phase_rule": PHASE_RULE, "train_time_s": times, "threads": a.threads, "torch": torch.__version__,
            "python": platform.python_version(), "created": datetime.now(UTC).isoformat(timespec="seconds")}
    save_run(runs, a.out, meta)
    print(f"saved {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
