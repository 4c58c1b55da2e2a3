"""Capture: exact, selective, budgeted, thread-safe; Trace files round-trip and fail clearly."""

import threading

import pytest
import torch
from conftest import small_config

from model import CaptureError, Trace, TraceFileError, Transformer, compare_traces
from model.core.recorder import capturing, recording
from model.families.transformer import capture_shapes

DESIGN_ROLES = {"q", "k", "v", "scores", "mask", "weights", "z", "out"}


@torch.no_grad()
def test_capture_on_off_gives_bit_identical_logits(small_model, batch):
    plain = small_model(*batch)
    traced, trace = small_model.run_with_trace(*batch)
    assert torch.equal(plain, traced)
    assert torch.equal(trace["logits"], plain)


@torch.no_grad()
def test_every_design_name_with_its_shape(small_model, batch):
    src, tgt = batch
    B, S, T, H, D = 2, src.shape[1], tgt.shape[1], 4, 32
    _, trace = small_model.run_with_trace(src, tgt)
    expected = {
        "encoder.embed.tok": (B, S, D), "decoder.embed.tok": (B, T, D),
        "encoder.embed.pos": (S, D), "decoder.embed.pos": (T, D),
        "encoder.embed.out": (B, S, D), "decoder.embed.out": (B, T, D),
        "masks.src_pad": (B, S), "masks.tgt_pad": (B, T), "masks.causal": (T, T),
        "decoder.layers.1.cross_attn.q": (B, H, T, D // H), "decoder.layers.1.cross_attn.k": (B, H, S, D // H),
        "decoder.layers.1.cross_attn.scores": (B, H, T, S), "decoder.layers.1.cross_attn.mask": (B, 1, T, S),
        "decoder.layers.1.cross_attn.weights": (B, H, T, S), "decoder.layers.1.cross_attn.z": (B, H, T, D // H),
        "decoder.layers.1.cross_attn.out": (B, T, D), "encoder.layers.0.self_attn.weights": (B, H, S, S),
        "decoder.layers.0.self_attn.weights": (B, H, T, T), "encoder.layers.1.ffn.hidden": (B, S, 64),
        "decoder.layers.0.out": (B, T, D), "encoder.out": (B, S, D), "decoder.out": (B, T, D),
        "logits": (B, T, 19),
    }
    for name, shape in expected.items():
        assert tuple(trace[name].shape) == shape, name
    assert {n: tuple(t.shape) for n, t in trace.items()} == capture_shapes(small_model.cfg, B, S, T)
    for p in ("encoder.layers.0.self_attn", "decoder.layers.1.self_attn", "decoder.layers.0.cross_attn"):
        assert {n.rsplit(".", 1)[1] for n in trace if n.startswith(p + ".")} == DESIGN_ROLES
    assert trace["masks.src_pad"].dtype == torch.bool and trace["decoder.layers.0.self_attn.mask"].dtype == torch.bool
    assert all(not t.requires_grad and t.device.type == "cpu" for t in trace.values())


@torch.no_grad()
def test_glob_filters_and_unknown_patterns(small_model, batch):
    _, trace = small_model.run_with_trace(*batch, names="*.weights")
    assert len(trace) == 6 and all(n.endswith(".weights") for n in trace)
    _, trace = small_model.run_with_trace(*batch, names=["decoder.layers.*.cross_attn.*", "logits"])
    assert "logits" in trace and len(trace) == 2 * 8 + 1
    with pytest.raises(CaptureError, match="(?s)matches no name.*encoder.layers.0.self_attn.weights"):
        small_model.run_with_trace(*batch, names=["*.weights", "*.atention*"])


@torch.no_grad()
def test_budget_refuses_before_running(small_model, batch):
    with pytest.raises(CaptureError, match="over the budget.*names="):
        small_model.run_with_trace(*batch, budget_bytes=20_000)
    _, trace = small_model.run_with_trace(*batch, names="*.weights", budget_bytes=20_000)
    assert trace.nbytes() <= 20_000


@torch.no_grad()
def test_threads_tracing_at_once_get_their_own_captures(small_model):
    inputs = [(torch.randint(1, 23, (1, 4 + i)), torch.randint(1, 19, (1, 3 + i))) for i in range(8)]
    sequential = [small_model.run_with_trace(s, t)[1] for s, t in inputs]
    results: list = [None] * 8
    barrier = threading.Barrier(8)

    def work(i):
        barrier.wait()
        for _ in range(3):
            results[i] = small_model.run_with_trace(*inputs[i])[1]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for seq, par in zip(sequential, results, strict=True):
        assert seq.names() == par.names()
        assert all(torch.equal(seq[n], par[n]) for n in seq)
    # A forward pass outside any capture records nothing anywhere: not into the capture another
    # thread has open (a new thread starts with an empty context), and no recorder is left behind.
    with capturing({"logits"}) as rec:
        th = threading.Thread(target=small_model, args=inputs[0])
        th.start()
        th.join()
        assert rec.tensors == {}
    assert not recording()


@torch.no_grad()
def test_trace_save_load_round_trip_is_exact(small_model, batch, tmp_path):
    _, trace = small_model.run_with_trace(*batch, meta={"src_tokens": ["a", "b"]})
    path = tmp_path / "t.safetensors"
    trace.save(path)
    loaded = Trace.load(path)
    assert loaded.names() == trace.names()
    assert all(torch.equal(loaded[n], trace[n]) and loaded[n].dtype == trace[n].dtype for n in trace)
    assert loaded.meta == trace.meta and loaded.meta["config"]["d_model"] == 32
    assert compare_traces(trace, loaded).equal
    assert Trace.from_bytes(trace.to_bytes()).names() == trace.names()


def test_trace_is_read_only(small_model, batch):
    _, trace = small_model.run_with_trace(*batch, names="logits")
    with pytest.raises(TypeError):
        trace["logits"] = torch.zeros(1)  # type: ignore[index]
    trace.meta["config"] = None
    assert trace.meta["config"] is not None
    assert not any(isinstance(v, torch.nn.Module) for v in vars(trace).values())


def test_truncated_foreign_and_missing_trace_files(small_model, batch, tmp_path):
    _, trace = small_model.run_with_trace(*batch, names="*.weights")
    good = tmp_path / "good.safetensors"
    trace.save(good)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:200])
    with pytest.raises(TraceFileError, match="cut.safetensors is truncated"):
        Trace.load(cut)
    cut.write_bytes(good.read_bytes()[:-10])  # the header intact, the data short
    with pytest.raises(TraceFileError, match="holds .* bytes of data; the file is truncated"):
        Trace.load(cut)
    from safetensors.torch import save_file

    foreign = tmp_path / "weights.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    with pytest.raises(TraceFileError, match="not an Attention Lab trace"):
        Trace.load(foreign)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x80\x04pickle? no thanks")
    with pytest.raises(TraceFileError):
        Trace.load(junk)
    with pytest.raises(TraceFileError, match="no trace file"):
        Trace.load(tmp_path / "missing.safetensors")


@torch.no_grad()
def test_compare_reports_worst_name_and_location(small_model, batch):
    src, tgt = batch
    meta = {"src_tokens": [[f"s{i}" for i in range(9)]] * 2, "tgt_tokens": [[f"t{i}" for i in range(6)]] * 2}
    _, a = small_model.run_with_trace(src, tgt, meta=meta)
    torch.manual_seed(0)
    other = Transformer(small_config()).eval()
    with torch.no_grad():
        # head 1 of layer 1's cross-attention (random: a constant shift vanishes on LayerNorm output)
        other.decoder.layers[1].cross_attn.w_q.weight[8:16] += 0.5 * torch.randn(8, 32)
    _, b = other.run_with_trace(src, tgt, meta=meta)
    diff = compare_traces(a, b, atol=1e-6)
    assert not diff.equal
    first_attn = next(d for d in diff.diffs if d.name.startswith("decoder.layers.1.cross_attn.weights"))
    assert first_attn.where["layer"] == 1 and first_attn.where["head"] == 1
    assert first_attn.where["query_token"].startswith("t") and first_attn.where["key_token"].startswith("s")
    assert all(not d.name.startswith("encoder.") for d in diff.diffs)
    assert "decoder.layers.1.cross_attn.weights" in diff.report()


@torch.no_grad()
def test_dropout_model_in_eval_is_deterministic(batch):
    m = Transformer(small_config(dropout=0.3)).eval()
    assert torch.equal(m(*batch), m.run_with_trace(*batch)[0])
