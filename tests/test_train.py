"""Training: a short run lowers the loss; logs, film strip, callback, CLI."""

from __future__ import annotations

import json

import pytest
import torch

from model import load_checkpoint, noam_lr
from model.toy.tasks import TASKS
from model.toy.train import main, make_batch, train

TINY = {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64, "dropout": 0.0}


@pytest.fixture(scope="module")
def tiny():
    return train("dates", TINY, steps=60, batch_size=32, warmup=20, film_every=20, eval_n=20)


@pytest.mark.slow
def test_short_run_lowers_the_loss(tiny):
    loss = tiny.log["loss"]
    assert len(loss) == 60 and sum(loss[-10:]) / 10 < sum(loss[:10]) / 10 - 0.5
    assert sum(tiny.log["acc"][-10:]) > sum(tiny.log["acc"][:10])


@pytest.mark.slow
def test_log_lr_follows_noam(tiny):
    for step, lr in zip(tiny.log["step"], tiny.log["lr"], strict=True):
        assert lr == pytest.approx(noam_lr(step, 32, 20, factor=0.5))


@pytest.mark.slow
def test_meta_and_film(tiny):
    m = tiny.meta
    assert m["task"] == "dates" and m["steps"] == 60 and 0.0 <= m["accuracy"] <= 1.0
    assert m["layer_norm"] == "post-LN" and m["positional"] == "sinusoidal"
    assert m["command"].startswith("model.train.train('dates'")
    assert [s for s, _ in tiny.film()] == [0, 20, 40, 60]
    step, frame = tiny.film()[-1]
    assert frame.meta["step"] == 60 and frame.meta["text"] == "3 november 2023"
    L = 1
    assert sum(n.endswith(".weights") for n in frame.names()) == 3 * L  # encoder self, decoder self, cross


def test_teacher_forcing_batch_shifts_targets():
    src_tok, tgt_tok = TASKS["reverse"].build_tokenizers()
    src, tgt_in, label = make_batch([("abc", "cba"), ("hello", "olleh")], src_tok, tgt_tok)
    assert tgt_in[:, 0].tolist() == [tgt_tok.bos_id] * 2
    assert torch.equal(tgt_in[:, 1:4], label[:, :3])  # decoder input is the label shifted right
    assert label[0].tolist() == [*tgt_tok.encode("cba"), tgt_tok.eos_id, 0, 0]
    assert src[0, 3:].tolist() == [src_tok.eos_id, 0, 0]  # sources end with [EOS]


@pytest.mark.slow
def test_callback_can_stop_and_sees_metrics():
    seen = []

    def cb(step, m):
        seen.append(m)
        return step < 5

    c = train("reverse", TINY, steps=100, batch_size=8, film_every=2, eval_every=3, val_n=4, eval_n=0, callback=cb)
    assert c.meta["steps"] == 5 and len(c.log["loss"]) == 5 and c.meta["accuracy"] is None
    assert {"step", "loss", "acc", "lr", "elapsed"} <= set(seen[0])
    assert "eval_acc" in seen[2] and "frame" in seen[1]
    assert [s for s, _ in c.film()] == [0, 2, 4, 5]


@pytest.mark.slow
def test_same_seed_same_run_and_the_global_rng_untouched():
    """Dropout on, so the run draws random numbers: from its own seeded fork, not the process's generator."""
    cfg = TINY | {"dropout": 0.1}
    torch.manual_seed(123)
    before = torch.get_rng_state()
    threads = torch.get_num_threads()
    a = train("dates", cfg, steps=3, batch_size=8, film_every=0, eval_n=0)
    assert torch.equal(torch.get_rng_state(), before) and torch.get_num_threads() == threads
    torch.rand(5)  # a different global state must not change the run
    b = train("dates", cfg, steps=3, batch_size=8, film_every=0, eval_n=0)
    assert a.log["loss"] == b.log["loss"]
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    c = train("dates", cfg, steps=3, batch_size=8, film_every=0, eval_n=0, seed=1)
    assert c.log["loss"] != a.log["loss"]
    with pytest.warns(DeprecationWarning, match="process-wide"):
        train("dates", cfg, steps=1, batch_size=8, film_every=0, eval_n=0, threads=1)
    assert torch.get_num_threads() == threads


@pytest.mark.slow
def test_cli_writes_a_loadable_checkpoint(tmp_path, capsys):
    main(
        [
            "--task",
            "zh-en",
            "--out",
            str(tmp_path / "ck"),
            "--steps",
            "4",
            "--batch-size",
            "8",
            "--eval-n",
            "4",
            "--config",
            json.dumps(TINY),
        ]
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    c = load_checkpoint(tmp_path / "ck")
    assert summary["steps"] == 4 and c.meta["command"].startswith("python -m model.train --task zh-en --out")
    assert c.cfg.d_model == 32 and len(c.film()) >= 2
    assert c.src_tokenizer.decode(c.src_tokenizer.encode("我爱机器学习")) == "我爱机器学习"


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown task 'copy'.*dates"):
        train("copy")
    with pytest.raises(ValueError, match="unknown config keys"):
        train("reverse", {"d_modle": 64}, steps=1)
