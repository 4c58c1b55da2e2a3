"""What capture costs in memory: a trace lives in one recycled block (model.recorder._Block), holds
each recorded tensor once, and its values are bit-identical to the uncopied capture."""

import pytest
import torch
from conftest import small_config

from model import Transformer
from model.core import recorder
from model.core.recorder import capturing, estimate_bytes, release_trace_memory
from model.families.transformer import capture_shapes


def _model(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(small_config(d_model=64, d_ff=128, **kw)).eval()


def _ids() -> tuple[torch.Tensor, torch.Tensor]:
    """A batch whose full trace is over BLOCK_MIN_BYTES; S != T, so no two masks are equal views."""
    g = torch.Generator().manual_seed(2)
    src, tgt = torch.randint(1, 19, (4, 40), generator=g), torch.randint(1, 19, (4, 33), generator=g)
    src[1, 30:], tgt[1, 20:] = 0, 0
    return src, tgt


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@torch.no_grad()
@pytest.mark.parametrize("norm_first", [False, True])
def test_a_full_trace_is_one_block_bit_identical_to_the_uncopied_capture(norm_first):
    model, (src, tgt) = _model(norm_first=norm_first), _ids()
    shapes = capture_shapes(model.cfg, src.shape[0], src.shape[1], tgt.shape[1])
    assert estimate_bytes(shapes, list(shapes)) >= recorder.BLOCK_MIN_BYTES
    logits, trace = model.run_with_trace(src, tgt)
    with capturing(set(shapes)) as rec:  # no reserve: the tensors where the forward left them
        plain = model(src, tgt)
    assert torch.equal(logits, plain)
    assert list(trace) == list(rec.tensors) == list(shapes)
    for name, t in trace.items():
        ref = rec.tensors[name]
        assert t.dtype == ref.dtype and t.shape == ref.shape and torch.equal(t, ref), name
    assert len({_storage(t) for t in trace.values()}) == 1  # the block path was taken


@torch.no_grad()
def test_each_recorded_tensor_is_stored_once():
    model, (src, tgt) = _model(), _ids()
    _, trace = model.run_with_trace(src, tgt)
    # post-LN: a layer's output IS its last LayerNorm's output, and the stack's output is the last layer's
    for a, b in [("encoder.layers.0.out", "encoder.layers.0.norm2.out"), ("encoder.out", "encoder.layers.1.out"),
                 ("decoder.layers.1.out", "decoder.layers.1.norm3.out"), ("decoder.out", "decoder.layers.1.out")]:
        assert trace[a].data_ptr() == trace[b].data_ptr(), (a, b)
    with capturing(set(trace)) as rec:  # uncopied: all alive at once, so equal pointers = one tensor
        model(src, tgt)
    distinct = {(t.data_ptr(), t.shape, t.stride()) for t in rec.tensors.values()}
    slots = {t.data_ptr(): t.numel() * t.element_size() for t in trace.values()}
    assert len(slots) == len(distinct)
    ends = sorted((p, p + n) for p, n in slots.items())
    assert all(end <= nxt for (_, end), (nxt, _) in zip(ends, ends[1:], strict=False))  # no two slots overlap


@torch.no_grad()
def test_a_tensor_kept_from_a_dropped_trace_stays_valid():
    model, (src, tgt) = _model(), _ids()
    _, trace = model.run_with_trace(src, tgt)
    kept = trace["decoder.layers.1.cross_attn.weights"]
    expected, block = kept.clone(), _storage(kept)
    del trace
    for shift in range(1, 4):  # other inputs, same sizes: they would reuse a freed block
        _, other = model.run_with_trace(src % (10 + shift) + 1, tgt % (10 + shift) + 1)
        assert _storage(other["logits"]) != block
    assert torch.equal(kept, expected)


@torch.no_grad()
def test_a_freed_block_is_reused_and_released_on_demand():
    model, (src, tgt) = _model(), _ids()
    release_trace_memory()
    _, first = model.run_with_trace(src, tgt)
    block, size = _storage(first["logits"]), first["logits"].untyped_storage().nbytes()
    del first  # the last view of the block: it goes to the pool
    _, second = model.run_with_trace(src, tgt)
    assert _storage(second["logits"]) == block
    del second
    assert release_trace_memory() == size
    assert release_trace_memory() == 0


def test_the_pool_keeps_at_most_its_limit(monkeypatch):
    release_trace_memory()
    monkeypatch.setattr(recorder, "POOL_MAX_BYTES", 3 * 2**20)
    blocks = [recorder._Block(2**20 + k) for k in range(5)]
    while blocks:
        blocks.pop(0)  # freed oldest first
    assert len(recorder._POOL.free) == 2  # two 1 MiB+ blocks fit under 3 MiB; the older ones were unmapped
    assert release_trace_memory() == sum(2**20 + k for k in (3, 4))


def test_a_block_not_reused_goes_back_to_the_os_after_the_idle_time(monkeypatch):
    release_trace_memory()
    monkeypatch.setattr(recorder, "POOL_IDLE_SECONDS", 0.05)
    block = recorder._Block(2**20)
    del block
    assert len(recorder._POOL.free) == 1 and recorder._POOL.timer is not None
    while (timer := recorder._POOL.timer) is not None:  # each timer's thread unmaps what expired, then ends
        timer.join()
    assert recorder._POOL.free == []


@torch.no_grad()
def test_a_hooked_tensor_is_what_the_model_continues_with_and_what_the_block_holds():
    model, (src, tgt) = _model(), _ids()
    seen = {}

    def zero_head_1(t, name):
        t = t.clone()
        t[:, 1] = 0
        seen[name] = t
        return t

    hooks = {"decoder.layers.0.cross_attn.z": zero_head_1}
    logits, trace = model.run_with_trace(src, tgt, hooks=hooks)
    assert torch.equal(logits, model.run_with_hooks(src, tgt, hooks=hooks))
    assert not torch.equal(logits, model(src, tgt))
    assert torch.equal(trace["decoder.layers.0.cross_attn.z"], seen["decoder.layers.0.cross_attn.z"])
    assert _storage(trace["decoder.layers.0.cross_attn.z"]) == _storage(trace["logits"])  # in the block


@torch.no_grad()
def test_a_small_trace_stays_in_its_own_tensors():
    model, (src, tgt) = _model(), _ids()
    _, trace = model.run_with_trace(src[:1, :5], tgt[:1, :4], names="*.weights")
    assert len({_storage(t) for t in trace.values()}) == len(trace)
