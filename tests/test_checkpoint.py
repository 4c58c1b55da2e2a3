"""Shipped checkpoints (accuracy, contents) and checkpoint loading (round trip, clear errors)."""

from __future__ import annotations

import functools
import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from model import list_checkpoints, load_checkpoint
from model.toy.checkpoint import CHECKPOINT_DIR, CheckpointError
from model.toy.tasks import TASKS

REQUIRED_ACCURACY = {"reverse": 0.99, "dates": 0.98, "zh-en": 0.95}


@functools.cache
def ckpt(name: str):
    return load_checkpoint(name)


def test_shipped_checkpoints_are_listed():
    assert list_checkpoints() == sorted(REQUIRED_ACCURACY)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REQUIRED_ACCURACY))
def test_shipped_heldout_accuracy(name):
    """Exact match on 500 test-split pairs (never seen in training), batched greedy decoding."""
    c = ckpt(name)
    acc = c.evaluate(TASKS[name].sample(500, seed=0, split="test"))
    assert acc >= REQUIRED_ACCURACY[name]
    assert c.meta["accuracy"] == pytest.approx(acc, abs=0.002)  # what the metadata claims is what we measure


@pytest.mark.parametrize("name", sorted(REQUIRED_ACCURACY))
def test_shipped_checkpoint_contents(name):
    c = ckpt(name)
    path = CHECKPOINT_DIR / name
    assert sum(f.stat().st_size for f in path.iterdir()) < 10 * 2**20
    assert {f.suffix for f in path.iterdir()} <= {".json", ".safetensors"}  # no pickles shipped
    m = c.meta
    assert m["task"] == name and m["steps"] > 0 and m["command"].startswith("python -m model.train --task " + name)
    assert {"wall_time_s", "torch", "layer_norm", "accuracy"} <= set(m)
    assert c.example == TASKS[name].example and c.model.training is False
    n = len(c.log["step"])
    assert n == m["steps"] and all(len(c.log[k]) == n for k in ("loss", "lr", "acc"))
    film = c.film()
    steps = [s for s, _ in film]
    assert steps[0] == 0 and steps[-1] == m["steps"] and steps == sorted(steps)
    last = film[-1][1]
    assert "decoder.layers.0.cross_attn.weights" in last.names()
    assert last.meta["src_tokens"] and last.meta["tgt_tokens"][0] == "[BOS]"


def test_trace_meta_and_default_target():
    c = ckpt("dates")
    logits, tr = c.trace("3 november 2023", names="decoder.layers.*.cross_attn.weights")
    m = tr.meta
    assert m["target"] == "2023-11-03" and m["text"] == "3 november 2023" and m["checkpoint"] == "dates"
    assert m["src_tokens"] == [*"3 november 2023", "[EOS]"] and m["tgt_tokens"] == ["[BOS]", *"2023-11-03"]
    assert m["next_tokens"] == [*"2023-11-03", "[EOS]"]
    assert tr["decoder.layers.0.cross_attn.weights"].shape == (1, c.cfg.n_heads, 11, 16)
    assert logits.shape == (1, 11, c.cfg.tgt_vocab_size)
    _, forced = c.trace("3 november 2023", target="1999-01-01", names="logits")
    assert forced.meta["tgt_tokens"] == ["[BOS]", *"1999-01-01"]


def test_round_trip(tmp_path):
    c = ckpt("reverse")
    c.save(tmp_path / "copy")
    d = load_checkpoint(tmp_path / "copy")
    for k, v in c.model.state_dict().items():
        assert torch.equal(v, d.model.state_dict()[k]), k
    for side in ("src_tokenizer", "tgt_tokenizer"):
        a, b = getattr(c, side), getattr(d, side)
        assert a.to_str() == b.to_str()
        assert b.decode(b.encode("abc123")) == "abc123"
    assert d.meta == c.meta and d.log == c.log and d.cfg == c.cfg
    assert d.translate("hello42").text == c.translate("hello42").text == "24olleh"
    fa, fb = c.film(), d.film()
    assert [s for s, _ in fa] == [s for s, _ in fb]
    for (_, x), (_, y) in zip(fa, fb, strict=True):
        assert x.names() == y.names() and x.meta == y.meta
        torch.testing.assert_close(x["decoder.layers.0.cross_attn.weights"], y["decoder.layers.0.cross_attn.weights"])


def test_tied_weights_round_trip(tmp_path):
    from model import Transformer, TransformerConfig
    from model.toy.checkpoint import Checkpoint

    c = ckpt("reverse")
    cfg = TransformerConfig.from_dict(
        {
            **c.cfg.to_dict(),
            "d_model": 16,
            "n_heads": 2,
            "d_ff": 32,
            "share_embeddings": True,
            "tie_generator": True,
        }
    )
    model = Transformer(cfg)
    Checkpoint(model, c.src_tokenizer, c.tgt_tokenizer, meta={"task": "reverse"}).save(tmp_path / "tied")
    d = load_checkpoint(tmp_path / "tied")
    assert d.model.generator.weight is d.model.tgt_embed.tok.weight
    assert d.model.src_embed.tok is d.model.tgt_embed.tok
    assert torch.equal(d.model.generator.weight, model.generator.weight)


@pytest.fixture
def copy(tmp_path):
    dst = tmp_path / "ck"
    shutil.copytree(CHECKPOINT_DIR / "reverse", dst)
    return dst


def test_unknown_name_lists_available():
    with pytest.raises(CheckpointError, match="unknown checkpoint name 'datez'.*dates.*reverse.*zh-en"):
        load_checkpoint("datez")


def test_missing_file(copy):
    (copy / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors is missing"):
        load_checkpoint(copy)


def test_corrupt_weights(copy):
    data = (copy / "model.safetensors").read_bytes()
    (copy / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model.safetensors: corrupt or truncated"):
        load_checkpoint(copy)


def test_foreign_weights(copy):
    save_file({"weight": torch.zeros(3)}, str(copy / "model.safetensors"))
    with pytest.raises(CheckpointError, match="model.safetensors: a safetensors file but not Attention Lab"):
        load_checkpoint(copy)


def test_weights_that_do_not_match_the_config(copy):
    cfg = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**cfg, "d_ff": cfg["d_ff"] * 2}))
    with pytest.raises(CheckpointError, match="ffn.linear1.weight has shape"):
        load_checkpoint(copy)


def test_corrupt_json(copy):
    (copy / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: corrupt, not valid JSON"):
        load_checkpoint(copy)
    (copy / "config.json").write_text(json.dumps({"d_model": 7}))
    with pytest.raises(CheckpointError, match="config.json: invalid model config"):
        load_checkpoint(copy)


def test_pickles_are_refused(tmp_path, copy):
    torch.save({"x": torch.zeros(1)}, tmp_path / "model.pt")
    with pytest.raises(CheckpointError, match="refusing to load a pickle"):
        load_checkpoint(tmp_path / "model.pt")
    (copy / "model.safetensors").rename(copy / "model.bin")
    with pytest.raises(CheckpointError, match=r"model.safetensors is missing.*model.bin.*never loaded"):
        load_checkpoint(copy)


def test_foreign_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(CheckpointError, match="not an Attention Lab checkpoint, config.json is missing"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no checkpoint directory at"):
        load_checkpoint(tmp_path / "nope")


def test_tokenizer_that_does_not_match_the_model_is_refused(copy):
    shutil.copy(CHECKPOINT_DIR / "dates" / "src_tokenizer.json", copy / "src_tokenizer.json")
    with pytest.raises(
        CheckpointError,
        match=r"src_tokenizer.json has \d+ tokens but the model's source "
        r"embedding has \d+ rows",
    ):
        load_checkpoint(copy)
    (copy / "tgt_tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    shutil.copy(CHECKPOINT_DIR / "reverse" / "src_tokenizer.json", copy / "src_tokenizer.json")
    with pytest.raises(CheckpointError, match="tgt_tokenizer.json.*BPE"):
        load_checkpoint(copy)


@pytest.mark.slow
def test_one_generation_limit_for_trace_and_translate():
    """A model that never stops (reverse, 116 characters: longer than it was trained on) is cut at
    the same limit by trace() and translate(), and both say so, instead of trace() failing with
    "target sequence has 257 tokens; max_len=256" (issue 13 §3)."""
    c = ckpt("reverse")
    text = ("attention" * 13)[:116]
    cap = c.max_new_tokens
    assert cap == c.cfg.max_len - 1  # [BOS] + output fits the model's positions
    _, tr = c.trace(text, names="logits")
    assert tr.meta["generated"] is True and tr.meta["finished"] is False and tr.meta["max_new_tokens"] == cap
    out = c.translate(text)  # this output falls into a loop: both stop at it, the same way, and say so
    assert not out.finished and out.loop is not None and tr.meta["looped"]["at_step"] == out.loop.at_step
    assert ["[BOS]", *out.tokens] == tr.meta["tgt_tokens"]
    endless = c.translate(text, stop_loops=None)  # without the loop guard: the length limit
    assert not endless.finished and len(endless.steps) == len(endless.tokens) == cap
    assert len(c.translate(text, max_new_tokens=10 * cap, stop_loops=None).tokens) == cap  # a larger ask is capped
    _, short = c.trace(c.example, names="logits")
    assert short.meta["finished"] is True and c.translate(c.example).finished
