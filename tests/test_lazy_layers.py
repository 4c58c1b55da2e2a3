"""A lazy trace that gives every name (issue 24 §1, for the pages beyond Attention and /llm): with
`layers=True` it stores q, k, v and each layer's output, and computes any other tensor of a layer by running
that one layer again (`DecoderLM.run_layer`). Every name equals the full capture bit for bit (step-by-step
forward) for each family the lab opens; with the fast path, what the fast forward recorded. Memory stays
O(T·d); a saved lazy trace without its model says what it lacks."""

from __future__ import annotations

import pytest
import torch
from test_families import build, ids

from model import load_model
from model.core.trace import LazyTrace, Trace

FAMILIES = ("llama3", "mistral", "gemma2", "gemma3", "olmo2", "gpt_neox", "qwen2_moe")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    cache = {}

    def get(family):
        if family not in cache:
            d = tmp_path_factory.mktemp(family)
            build(family).save_pretrained(d)
            cache[family] = load_model(str(d)).model
        return cache[family]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_every_name_equals_the_full_capture(models, family):
    model = models(family)
    x = ids(n=30)
    with torch.no_grad():
        logits, full = model.run_with_trace(x)
        _, lazy = model.run_with_trace(x, lazy=True, layers=True)
    assert isinstance(lazy, LazyTrace)
    names = [n for n in full.names() if not n.startswith("logits")]  # [T, vocab]: the page's own return value
    assert [n for n in lazy.names()] == names  # computation order, nothing missing, nothing more
    for n in names:
        assert torch.equal(lazy[n], full[n]), n
    # what is kept: q, k, v, each layer's output and the names outside the layers; nothing T × T
    stored = set(lazy.stored())
    assert {f"decoder.layers.{i}.out" for i in range(model.cfg.n_layers)} <= stored
    assert not any(n.endswith((".weights", ".scores", ".mask")) or n.startswith("masks.") for n in stored)


def test_fast_path_layers_are_what_the_fast_forward_recorded(models):
    """fast=True: the layers run again on the fused path too, so a recomputed tensor equals what one fast
    forward records (`names=` keeps it in the trace) bit for bit, and the full capture to float rounding."""
    model = models("llama3")
    x = ids(n=30)
    with torch.no_grad():
        _, full = model.run_with_trace(x)
        _, kept = model.run_with_trace(x, lazy=True, fast=True, names="decoder.layers.1.*")
        _, lazy = model.run_with_trace(x, lazy=True, fast=True, layers=True)
    for n in kept.stored():
        if n.startswith("decoder.layers.1."):
            assert torch.equal(lazy[n], kept[n]), n
            assert (lazy[n] - full[n]).abs().max() <= 1e-4 * max(1.0, float(full[n].abs().max())), n


def test_layers_run_again_are_bounded_and_shared(models):
    model = models("llama3")
    _, lazy = model.run_with_trace(ids(n=20), lazy=True, layers=True)
    a = lazy["decoder.layers.0.norm2.out"]
    assert lazy["decoder.layers.0.norm2.out"] is a  # the layer ran once
    lazy["decoder.layers.1.norm2.out"]
    lazy["decoder.layers.0.ffn.out"]
    assert len(lazy._ran) <= LazyTrace.LAYERS_KEPT
    assert "decoder.layers.1.ffn.hidden" in lazy and "decoder.layers.1.ffn.hidden" not in lazy.stored()


def test_saved_without_its_model(models, tmp_path):
    """Saved, a lazy trace holds what it stored; loaded without the model, the names a layer would compute
    are not in it (a clear KeyError), and attach(model) gives them back, equal."""
    model = models("gpt_neox")
    _, lazy = model.run_with_trace(ids(n=12), lazy=True, layers=True)
    name = "decoder.layers.1.norm2.out"
    want = lazy[name]
    lazy.save(tmp_path / "t.safetensors")
    back = Trace.load(tmp_path / "t.safetensors")
    assert isinstance(back, LazyTrace) and name not in back and "decoder.layers.1.out" in back
    assert "decoder.layers.1.self_attn.weights" in back  # computed from q, k: no model needed
    with pytest.raises(KeyError):
        back[name]
    assert torch.equal(back.attach(model)[name], want)


def test_hooked_runs_keep_no_layers(models):
    """A hook changes what a layer computes: a hooked lazy trace cannot be rebuilt by running a layer
    again, so it keeps q, k, v only (and says nothing it cannot give)."""
    model = models("llama3")

    def zero(t, name):
        return t * 0

    _, lazy = model.run_with_trace(ids(n=12), lazy=True, layers=True, hooks={"decoder.layers.0.ffn.out": zero})
    assert "decoder.layers.0.norm2.out" not in lazy and "decoder.layers.0.out" not in lazy


def test_two_lazy_traces_compare_their_stored_tensors(models):
    """compare_traces on two lazy traces compares what they store (every computed map is the same function
    of it): equal traces match; a changed k is found."""
    from model.core.trace import compare_traces

    model = models("llama3")
    _, lazy = model.run_with_trace(ids(n=16), lazy=True)
    back = Trace.from_bytes(lazy.to_bytes())
    diff = compare_traces(back, lazy)
    assert diff.equal and diff.n_compared == len(lazy.stored())
    _, other = model.run_with_trace(ids(seed=3, n=16), lazy=True)
    assert not compare_traces(back, other).equal


def test_head_summary_of_a_lazy_trace_equals_the_full_one(models):
    """Experiments' "What each head does" on a long prompt reads a lazy trace tile by tile: the same entropy,
    distance and weight on special tokens as from the whole weights."""
    import numpy as np

    from model.analysis.heads import SPECIAL, head_summary

    model = models("mistral")  # a sliding window: rows past it see fewer keys
    x = ids(n=30)
    _, full = model.run_with_trace(x)
    _, lazy = model.run_with_trace(x, lazy=True)
    tokens = [sorted(SPECIAL)[0]] + ["w"] * 14 + [sorted(SPECIAL)[0]] + ["w"] * 14
    a = head_summary(full.with_meta(dict(full.meta, tgt_tokens=tokens)))
    b = head_summary(lazy.with_meta(dict(lazy.meta, tgt_tokens=tokens)))
    assert a["modules"] == b["modules"]
    for k in ("entropy", "distance", "special"):
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-12)
    assert (a["special"] > 0).all()
