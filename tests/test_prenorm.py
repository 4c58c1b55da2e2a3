"""Post-LN vs pre-LN experiment (model.prenorm): same peak learning rate for both warmups, curves
recorded per step, divergence kept as a result, and the shipped results/models are what they claim."""

from __future__ import annotations

import json

import pytest

from model import load_checkpoint, noam_lr
from model.toy import prenorm as P

TINY = {"d_model": 16, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 32, "dropout": 0.0}


@pytest.mark.parametrize("warmup", [1, 7, 200])
def test_noam_factor_puts_the_peak_at_peak_lr(warmup):
    f = P.noam_factor(0.003, 64, warmup)
    assert noam_lr(warmup, 64, warmup, factor=f) == pytest.approx(0.003)
    assert all(noam_lr(s, 64, warmup, factor=f) <= 0.003 * (1 + 1e-12) for s in range(1, 400))


@pytest.mark.slow
def test_run_experiment_trains_four_runs_with_the_same_peak(tmp_path):
    res = P.run_experiment(steps=4, batch_size=8, warmup=3, peak_lr=0.002, model=TINY, results=tmp_path / "r.json")
    assert [r["label"] for r in res["runs"]] == ["post-LN, warmup 1", "pre-LN, warmup 1",
                                                 "post-LN, warmup 3", "pre-LN, warmup 3"]
    for r in res["runs"]:
        assert r["step"] == [1, 2, 3, 4] and not r["diverged"]
        assert max(r["lr"]) == pytest.approx(0.002)  # warmup 1: at step 1; warmup 3: at step 3
        assert r["lr"].index(max(r["lr"])) + 1 == r["warmup"]
    assert json.loads(json.dumps(res)) == res  # JSON-able, as shipped
    for wiring, pre in P.WIRINGS.items():  # the usual-warmup models are saved beside the results
        assert load_checkpoint(P.model_dir(wiring, tmp_path / "r.json")).cfg.norm_first is pre
    rows = P.summary(res, last=2)
    assert rows[0]["final loss"] == pytest.approx(sum(res["runs"][0]["loss"][-2:]) / 2)


def test_a_diverged_run_keeps_its_curve(monkeypatch):
    def exploding(task, overrides, steps, *, callback, **kw):
        for step in (1, 2):
            callback(step, {"step": step, "loss": 9.0, "acc": 0.0, "lr": 1.0})
        raise FloatingPointError("loss is nan at step 3")

    monkeypatch.setattr(P, "train", exploding)
    r = P.one_run("post-LN", 1, steps=10, model=TINY)
    assert r["diverged"] and r["step"] == [1, 2] and r["loss"] == [9.0, 9.0]


def test_load_results_refuses_what_is_not_a_results_file(tmp_path):
    with pytest.raises(ValueError, match="no pre-LN results"):
        P.load_results(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        P.load_results(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"runs": 3}')
    with pytest.raises(ValueError, match="not a pre-LN results file"):
        P.load_results(tmp_path / "other.json")


def test_shipped_results_reproduce_seed_002s_claim():
    res = P.load_results()
    assert res["command"].startswith("python -m model.prenorm") and res["steps"] == P.STEPS
    final = {r["run"]: r for r in P.summary(res)}
    assert all(r["steps"] == res["steps"] for r in final.values())
    w = res["warmups"][1]
    # Without warmup, at the same peak learning rate, post-LN does not learn and pre-LN does.
    assert final["pre-LN, warmup 1"]["final loss"] < final["post-LN, warmup 1"]["final loss"] - 1.0
    assert final["pre-LN, warmup 1"]["final accuracy"] > final["post-LN, warmup 1"]["final accuracy"] + 0.3
    # With warmup both learn.
    assert min(final[f"{wiring}, warmup {w}"]["final accuracy"] for wiring in P.WIRINGS) > 0.5
    for wiring, pre in P.WIRINGS.items():
        ckpt = load_checkpoint(P.model_dir(wiring))
        assert ckpt.cfg.norm_first is pre and ckpt.meta["warmup"] == w
