"""Reproducible captures: a `deterministic()` context, and bare model directories for fixture models.

A model directory is `config.json` (format marker, TransformerConfig, character vocabulary, task)
plus `model.safetensors` (the state dict). It is what the tiny test fixture
(`model/fixtures/tiny/`, made by `model/fixtures/make_tiny.py`) is: small enough to commit,
loadable without the checkpoint machinery, traced like a `Checkpoint` (`.trace(text, names=...)`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from model.core.config import TransformerConfig
from model.core.trace import check_safetensors_header
from model.families.transformer import Transformer

MODEL_DIR_FORMAT = "attention-lab-model-dir"
SPECIALS = ("<pad>", "<bos>", "<eos>")  # ids 0, 1, 2; pad_id is 0
TINY_MODEL = Path(__file__).parent / "fixtures" / "tiny"


@contextmanager
def deterministic(model: nn.Module | None = None, threads: int = 1,
                  seed: int = 0) -> Iterator[nn.Module | None]:
    """Capture reproducibly; restores everything on exit.

    Eval mode (no dropout), float32, a fixed number of intra-op threads (a matmul splits its
    reductions by thread, so the thread count changes the last bits), a seeded RNG, and
    deterministic kernels on an accelerator.
    """
    accelerated = torch.cuda.is_available() or (
        model is not None and any(p.device.type != "cpu" for p in model.parameters()))
    saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(), torch.get_default_dtype(),
             torch.get_rng_state())
    model_state = None
    if model is not None:
        dtype = next((p.dtype for p in model.parameters()), torch.float32)
        model_state = (model.training, dtype)
        model.eval().float()
    torch.set_num_threads(threads)
    if accelerated:  # CPU kernels are deterministic already, and the switch imports torch._inductor (seconds)
        torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(seed)
    try:
        yield model
    finally:
        n, det, warn_only, dtype, rng = saved
        torch.set_num_threads(n)
        if accelerated:
            torch.use_deterministic_algorithms(det, warn_only=warn_only)
        torch.set_default_dtype(dtype)
        torch.set_rng_state(rng)
        if model is not None and model_state is not None:
            model.train(model_state[0]).to(model_state[1])


class CharModel:
    """A Transformer with a character vocabulary, loaded from a model directory."""

    def __init__(self, model: Transformer, vocab: Sequence[str], task: str = "reverse", name: str = ""):
        self.model, self.vocab, self.task, self.name = model.eval(), list(vocab), task, name
        self.ids = {t: i for i, t in enumerate(self.vocab)}

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - set(self.ids))
        if unknown:
            known = "".join(t for t in self.vocab if t not in SPECIALS)
            raise ValueError(f"characters {unknown} are not in this model's vocabulary {known!r}")
        return [self.ids[c] for c in text]

    def trace(self, text: str, target: str | None = None, names: str | Sequence[str] | None = None):
        """Teacher-forced trace of (text -> target); the target defaults to the task's answer.

        Returns (logits, Trace) like `Checkpoint.trace`; the meta carries the token strings.
        """
        if target is None:
            if self.task != "reverse":
                raise ValueError(f"task {self.task!r} has no default target: pass target=")
            target = text[::-1]
        src = self.encode(text) + [self.ids["<eos>"]]
        tgt = [self.ids["<bos>"]] + self.encode(target)
        meta = {"checkpoint": self.name, "text": text, "target": target,
                "src_tokens": [self.vocab[i] for i in src], "tgt_tokens": [self.vocab[i] for i in tgt]}
        with torch.no_grad():
            return self.model.run_with_trace(torch.tensor([src]), torch.tensor([tgt]), names=names, meta=meta)


def is_model_dir(path: str | Path) -> bool:
    cfg = Path(path) / "config.json"
    if not (cfg.is_file() and (Path(path) / "model.safetensors").is_file()):
        return False
    try:
        return json.loads(cfg.read_text()).get("format") == MODEL_DIR_FORMAT
    except (ValueError, AttributeError):
        return False


def save_model_dir(model: Transformer, vocab: Sequence[str], path: str | Path, task: str = "reverse") -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    info = {"format": MODEL_DIR_FORMAT, "task": task, "config": model.cfg.to_dict(), "vocab": list(vocab)}
    (path / "config.json").write_text(json.dumps(info, indent=1, ensure_ascii=False) + "\n")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": MODEL_DIR_FORMAT})


def load_model_dir(path: str | Path = TINY_MODEL) -> CharModel:
    path = Path(path)
    if not is_model_dir(path):
        raise ValueError(f"{path} is not a model directory (config.json with format "
                         f"{MODEL_DIR_FORMAT!r} and model.safetensors)")
    info = json.loads((path / "config.json").read_text())
    model = Transformer(TransformerConfig.from_dict(info["config"]))
    weights = path / "model.safetensors"
    # A pickle, a forged header or a truncated file: a clear ValueError before any tensor is read.
    check_safetensors_header(weights, f"{path.name}/model.safetensors", max_names=100_000, what="model")
    model.load_state_dict(load_file(str(weights)))  # strict: every weight must match
    return CharModel(model, info["vocab"], info.get("task", "reverse"), name=path.name)


def open_model(name_or_path: str):
    """A model directory, else whatever `model.checkpoint.load_checkpoint` accepts (shipped name or path)."""
    if is_model_dir(name_or_path):
        return load_model_dir(name_or_path)
    try:
        from model.toy.checkpoint import load_checkpoint
    except ImportError as e:
        raise ValueError(f"{name_or_path!r} is not a model directory, and checkpoints cannot be loaded "
                         f"here ({e})") from None
    return load_checkpoint(name_or_path)

