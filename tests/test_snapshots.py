"""Snapshot tests of our own models: their captured tensors must not change unless we mean it to.

After an intended change, review the report, then refresh:
    pytest tests/test_snapshots.py --update-trace-snapshots
"""

import runpy

import pytest
import torch
from safetensors.torch import load_file
from tolerance import f32_tol

from model import list_checkpoints, load_checkpoint
from model.testing.repro import TINY_MODEL, load_model_dir

# Inputs are the tasks' demo examples, written out: a snapshot must not move when a default does.
SHIPPED = [("reverse", "attention42"), ("dates", "3 november 2023"), ("zh-en", "我爱机器学习")]


def test_tiny_fixture_model(trace_snapshot):
    _, trace = load_model_dir(TINY_MODEL).trace("hello world")
    trace_snapshot.check(trace)  # every capture: the whole tiny model is a few KB


def test_tiny_fixture_is_reproducible(tmp_path):
    """make_tiny.py rebuilds the committed fixture. The committed bytes were written on another machine, and torch
    promises the same bits only on the same one (its seeded init runs vectorised log / sin kernels chosen by the
    CPU), so float weights are held to their float32 resolution (tests/tolerance.py); names, shapes and dtypes
    exactly."""
    make_tiny = runpy.run_path(str(TINY_MODEL.parent / "make_tiny.py"))["make_tiny"]
    committed = load_file(str(TINY_MODEL / "model.safetensors"))
    rebuilt = load_file(str(make_tiny(tmp_path / "tiny") / "model.safetensors"))
    assert committed.keys() == rebuilt.keys()
    for k, want in committed.items():
        got = rebuilt[k]
        assert got.shape == want.shape and got.dtype == want.dtype, k
        if want.is_floating_point():
            assert float((got - want).abs().max()) <= f32_tol(want), k
        else:
            assert torch.equal(got, want), k
    assert (tmp_path / "tiny" / "config.json").read_text() == (TINY_MODEL / "config.json").read_text()


@pytest.mark.parametrize(("name", "text"), SHIPPED, ids=[n for n, _ in SHIPPED])
def test_shipped_model_attention(name, text, trace_snapshot):
    assert name in list_checkpoints()  # shipped as package data: never skip when one is missing
    # Attention weights and logits: what users look at, and small enough to commit.
    _, trace = load_checkpoint(name).trace(text, names=["*.weights", "logits"])
    trace_snapshot.check(trace)
