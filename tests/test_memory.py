"""Memory a server keeps after a training run (issue 12 §2: memory returns once sessions close).

Measured with bench/load.py and a debug hook: the run's first `torch.optim` call imported torch._dynamo
(with sympy and torch.distributed: ~800 modules, +75 MB resident) and a module is never unloaded. The
tests pin the cause, not an RSS number: training imports none of it, its own Adam gives torch.optim.Adam's
bits, and nothing process-wide keeps a finished run alive.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from pathlib import Path

import torch

import model.toy.train as mt
from model.toy.train import train

ROOT = Path(__file__).resolve().parents[1]
TINY = {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64, "dropout": 0.1}
RUN = {"steps": 12, "batch_size": 8, "warmup": 4, "film_every": 6, "eval_n": 4}


class TorchAdam:
    """The reference: torch.optim.Adam behind model.train.Adam's interface (lr set before each step)."""

    def __init__(self, params, betas, eps):
        self.opt = torch.optim.Adam(params, lr=1.0, betas=betas, eps=eps)

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def step(self, lr: float) -> None:
        self.opt.param_groups[0]["lr"] = lr
        self.opt.step()


def test_training_imports_no_torch_dynamo():
    code = ("import sys; from model.toy.train import train; "
            f"train('dates', {TINY!r}, **{RUN!r}); "
            "print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_adam_gives_torch_optim_adams_bits(monkeypatch):
    ours = train("dates", TINY, **RUN)
    monkeypatch.setattr(mt, "Adam", TorchAdam)
    ref = train("dates", TINY, **RUN)
    assert ours.log["loss"] == ref.log["loss"] and ours.log["lr"] == ref.log["lr"]
    theirs = ref.model.state_dict()
    for name, tensor in ours.model.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name


def test_a_finished_run_is_freed_when_dropped():
    ckpt = train("dates", TINY, **RUN)
    model, frame = weakref.ref(ckpt.model), weakref.ref(ckpt.film()[-1][1])
    del ckpt
    gc.collect()
    assert model() is None and frame() is None  # no optimizer state, film or log kept process-wide
