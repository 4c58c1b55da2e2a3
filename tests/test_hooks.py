"""Hook points and the capture-name table: every capture point is an intervention point.

Names come from the module tree (each module's `capture_points`); these tests hold them to the
record() calls of a real forward pass, check the new LayerNorm/FFN points recompose the residual
stream exactly, and check hooks: bit-identical when absent, isolated per thread, loud when wrong.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F
from conftest import small_config

from model import CaptureError, Transformer, TransformerConfig, load_checkpoint
from model.core.recorder import capturing
from model.families.transformer import capture_shapes


def _model(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(small_config(**kw)).eval()


CONFIGS = {
    "post-LN": {},
    "pre-LN": {"norm_first": True},
    "gelu-learned": {"activation": "gelu", "positional": "learned"},
}


@pytest.mark.parametrize("kw", CONFIGS.values(), ids=CONFIGS.keys())
def test_declared_points_are_what_forward_records_in_order(kw, batch):
    model = _model(**kw)
    src, tgt = batch
    declared = capture_shapes(model.cfg, *src.shape, tgt.shape[1])
    with torch.no_grad(), capturing(set(declared)) as rec:
        model(src, tgt)
    assert list(rec.tensors) == list(declared)  # same names, computation order
    assert {n: tuple(t.shape) for n, t in rec.tensors.items()} == declared
    assert declared == model.capture_names(*src.shape, tgt.shape[1])


def test_encoder_only_bert_style_points():
    cfg = TransformerConfig(src_vocab_size=30, tgt_vocab_size=0, d_model=16, n_heads=2, n_encoder_layers=2,
                            n_decoder_layers=0, d_ff=32, dropout=0.0, max_len=20, positional="learned",
                            n_token_types=2, embed_norm=True, scale_embedding=False, activation="gelu")
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    ids = torch.randint(1, 30, (1, 7))
    declared = model.capture_names(1, 7)
    with torch.no_grad(), capturing(set(declared)) as rec:
        model(ids, token_type_ids=torch.zeros_like(ids))
    assert list(rec.tensors) == list(declared)
    assert "encoder.embed.norm.in" in declared and "logits" not in declared


def test_post_ln_residual_stream_recomposes_exactly(batch):
    model = _model()
    _, tr = model.run_with_trace(*batch)
    for side, subs in (("encoder", ["self_attn", "ffn"]), ("decoder", ["self_attn", "cross_attn", "ffn"])):
        for i in range(2):
            p = f"{side}.layers.{i}"
            x = tr[f"{side}.embed.out"] if i == 0 else tr[f"{side}.layers.{i - 1}.out"]
            for k, sub in enumerate(subs, start=1):  # LayerNorm(x + Sublayer(x))
                norm, ln = f"{p}.norm{k}", getattr(getattr(model, side).layers[i], f"norm{k}")
                assert torch.equal(tr[f"{norm}.in"], x + tr[f"{p}.{sub}.out"])
                assert torch.equal(tr[f"{norm}.out"], F.layer_norm(x + tr[f"{p}.{sub}.out"], (32,), ln.weight,
                                                                    ln.bias, ln.eps))
                x = tr[f"{norm}.out"]
            assert torch.equal(tr[f"{p}.out"], x)
    assert torch.equal(tr["encoder.out"], tr["encoder.layers.1.out"])


def test_pre_ln_residual_stream_recomposes_exactly(batch):
    model = _model(norm_first=True)
    _, tr = model.run_with_trace(*batch)
    for side, subs in (("encoder", ["self_attn", "ffn"]), ("decoder", ["self_attn", "cross_attn", "ffn"])):
        x = tr[f"{side}.embed.out"]
        for i in range(2):
            p = f"{side}.layers.{i}"
            for k, sub in enumerate(subs, start=1):  # x + Sublayer(LayerNorm(x))
                assert torch.equal(tr[f"{p}.norm{k}.in"], x)
                x = x + tr[f"{p}.{sub}.out"]
            assert torch.equal(tr[f"{p}.out"], x)
        final = getattr(model, side).norm
        assert torch.equal(tr[f"{side}.norm.in"], x)
        assert torch.equal(tr[f"{side}.out"], F.layer_norm(x, (32,), final.weight, final.bias, final.eps))
    ffn = model.encoder.layers[0].ffn
    assert torch.equal(tr["encoder.layers.0.ffn.out"], ffn.linear2(tr["encoder.layers.0.ffn.hidden"]))


def test_no_hooks_and_identity_hooks_are_bit_identical(batch):
    model = _model()
    ref = model(*batch)
    assert torch.equal(model.run_with_hooks(*batch, hooks=None), ref)
    assert torch.equal(model.run_with_hooks(*batch, hooks={}), ref)
    assert torch.equal(model.run_with_hooks(*batch, hooks={"*": lambda t, n: None}), ref)
    assert torch.equal(model.run_with_trace(*batch, hooks={"*": lambda t, n: t.clone()})[0], ref)


def test_the_model_continues_with_the_hook_result_and_the_trace_records_it(batch):
    model = _model()
    seen = []

    def zero_pos(t, name):
        seen.append(name)
        return torch.zeros_like(t)

    logits, tr = model.run_with_trace(*batch, hooks={"*.embed.pos": zero_pos})
    assert seen == ["encoder.embed.pos", "decoder.embed.pos"]
    assert not tr["encoder.embed.pos"].any()
    assert torch.equal(tr["encoder.embed.out"], tr["encoder.embed.tok"])  # tok + 0
    no_pe = _model()  # independent: the same weights with a zero positional table
    no_pe.src_embed.pe.zero_()
    no_pe.tgt_embed.pe.zero_()
    assert torch.equal(logits, no_pe(*batch))
    assert tr.meta["hooks"] == {"*.embed.pos": "zero_pos"}


@pytest.mark.slow
def test_a_hook_on_keys_acts_once_per_position_under_the_kv_cache():
    """Greedy decoding (KV cache) under a hook == a teacher-forced pass under it on the output."""
    ckpt = load_checkpoint("dates")
    text = "3 november 2023"

    def scale(t, name):
        return t * 4.0

    hooks = {"decoder.layers.*.self_attn.k": scale, "decoder.layers.*.cross_attn.v": scale}
    out = ckpt.translate(text, hooks=hooks)
    plain = ckpt.translate(text)
    tok = ckpt.tgt_tokenizer
    ids = [tok.bos_id, *out.token_ids] + ([tok.eos_id] if out.finished else [])
    src = ckpt.encode_source(text)
    with torch.no_grad():
        logits = ckpt.model.run_with_hooks(src, torch.tensor([ids[:-1]]), hooks=hooks)
    assert logits[0].argmax(-1).tolist() == ids[1:]
    assert out.text != plain.text  # the intervention changed the output
    assert plain.text == ckpt.translate(text).text  # nothing leaked out of the hooked call


def test_wrong_hook_results_and_specs_are_clear_errors(batch):
    model = _model()
    with pytest.raises(ValueError, match=r"encoder\.layers\.0\.self_attn\.z.*\(2, 4, 9, 8\)"):
        model.run_with_hooks(*batch, hooks={"encoder.layers.0.self_attn.z": lambda t, n: t[:, :1]})
    with pytest.raises(ValueError, match="dtype torch.float32"):
        model.run_with_hooks(*batch, hooks={"logits": lambda t, n: t.double()})
    with pytest.raises(ValueError, match="shape"):
        model.run_with_hooks(*batch, hooks={"logits": lambda t, n: "oops"})
    with pytest.raises(CaptureError, match=r"(?s)matches no name.*encoder\.layers\.0\.norm1\.in"):
        model.run_with_hooks(*batch, hooks={"encoder.layers.9.*": lambda t, n: None})
    with pytest.raises(CaptureError, match="must be a function"):
        model.run_with_hooks(*batch, hooks={"logits": 3})


def test_hooks_in_eight_threads_never_see_each_other(batch):
    model = _model()

    def scale_head(h):
        def fn(t, name):
            t = t.clone()
            t[:, h] *= 3.0
            return t
        return fn

    expected = {h: model.run_with_hooks(*batch, hooks={"*.cross_attn.z": scale_head(h)}) for h in range(4)}
    expected[None] = model(*batch)
    results, barrier = {}, threading.Barrier(8)

    def work(i):
        h = None if i >= 4 else i
        barrier.wait()
        for _ in range(5):
            out = model(*batch) if h is None else model.run_with_hooks(*batch, hooks={"*.cross_attn.z": scale_head(h)})
            results.setdefault(i, []).append(torch.equal(out, expected[h]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(all(v) for v in results.values()) and len(results) == 8


@pytest.mark.slow
def test_pretrained_encoder_takes_hooks():
    from model.loaders import minilm as pretrained

    mini = pretrained.load_minilm()
    text = "The animal didn't cross the street because it was too tired"
    hidden, _ = mini.run_with_trace(text, names="encoder.out")
    hooked, tr = mini.run_with_trace(text, names="encoder.layers.0.self_attn.weights",
                                     hooks={"encoder.layers.0.self_attn.weights": lambda t, n: torch.zeros_like(t)})
    assert not tr["encoder.layers.0.self_attn.weights"].any()
    assert not torch.equal(hidden[-1], hooked[-1])


@pytest.mark.slow
def test_capture_cli_runs_without_runpy_warning(tmp_path):
    out = tmp_path / "x.safetensors"
    r = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "model.capture", "--checkpoint",
                        "dates", "--text", "3 may 2021", "--names", "*.cross_attn.weights", "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "RuntimeWarning" not in r.stderr and out.stat().st_size > 0
