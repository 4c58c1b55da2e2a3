"""The step-by-step decoder and live-training pages, headless (streamlit.testing AppTest).

The figures must *be* the recorded numbers: every heatmap/bar chart is compared with the
`Step` records of an independent `ckpt.translate(...)` with the same options, and the film
frames with `ckpt.film()`.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import torch
from conftest import assert_clean, open_page
from streamlit.testing.v1 import AppTest

from model.toy.checkpoint import sampling_distribution
from viz.figures import decode as fd
from viz.ui.models import checkpoint_names
from viz.ui.render import tokens_of
from viz.ui.sidebar import default_checkpoint

DECODER, TRAINING = "viz/pages/decoder.py", "viz/pages/training.py"
TIMEOUT = 180


@pytest.fixture(scope="module")
def shipped():
    names = checkpoint_names()
    if not names:
        pytest.skip("no checkpoints installed (model/checkpoints) or listed in $ATTENTION_LAB_CHECKPOINTS")
    name = default_checkpoint(names)
    from model.toy.checkpoint import load_checkpoint

    return name, load_checkpoint(name)


def run_page(page: str, *, text: str | None = None, target: str | None = None, query: dict | None = None,
             state: dict | None = None) -> AppTest:
    return open_page(page, query=query, state={"source_text": text, "target_text": target, **(state or {})},
                     timeout=TIMEOUT)


def figure(at: AppTest, title_start: str) -> dict:
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    titles = [f["layout"].get("title", {}).get("text", "") for f in specs]
    found = [f for f, t in zip(specs, titles, strict=True) if t.startswith(title_start)]
    assert found, f"no figure titled {title_start!r}: {titles}"
    return found[0]


def arr(value) -> np.ndarray:
    """A plotly JSON array: base64 typed array ({dtype, bdata, shape}) or (nested) lists; null -> NaN."""
    if isinstance(value, dict):
        a = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        return a.reshape([int(s) for s in str(value["shape"]).split(",")]) if "shape" in value else a
    return np.asarray(value, dtype=np.float64)


def rows_of(w: np.ndarray, head: str) -> np.ndarray:
    if head == "all":
        return np.vstack([w, w.mean(0, keepdims=True)])
    return w.mean(0, keepdims=True) if head == "mean" else w[int(head): int(head) + 1]


def check_step_figures(at: AppTest, ckpt, out, step: int, layer: int, head: str) -> None:
    """The step view's figures against the independent decode `out` (step is 1-based)."""
    t = step - 1
    rec = out.steps[t]
    bars = figure(at, f"Step {step}: the 5 most likely next tokens")["data"]
    model_p = torch.softmax(rec.logits.double(), -1)
    top = model_p.topk(5).indices.tolist()
    ids = top if rec.token_id in top else [*top, rec.token_id]  # the chosen token is always drawn
    assert bars[0]["customdata"] == [ckpt.tgt_tokenizer.id_to_token(i) for i in ids]
    np.testing.assert_allclose(arr(bars[0]["x"]), model_p[ids].numpy(), rtol=0, atol=1e-6)
    if out.strategy == "sample":  # the second series: the distribution the token was drawn from
        opts = {k: out.options[k] for k in ("temperature", "top_k", "top_p")}
        np.testing.assert_allclose(arr(bars[1]["x"]), sampling_distribution(rec.logits, **opts)[ids].numpy(),
                                   rtol=0, atol=1e-6)
    else:  # greedy and beam choose from the model's own softmax: the recorded top-k
        assert len(bars) == 1 and bars[0]["customdata"] == [tok for tok, _ in rec.topk]
        np.testing.assert_allclose(arr(bars[0]["x"]), [p for _, p in rec.topk], rtol=0, atol=1e-6)

    rows = fd.step_labels(out.tgt_tokens[: t + 1], [s.token for s in out.steps[: t + 1]])
    mask = figure(at, "Look-ahead mask M")["data"][0]
    n = t + 1
    assert mask["y"] == rows and mask["x"] == fd.labels(out.tgt_tokens[:n])
    assert rows[0] == f"0: [BOS] → {out.steps[0].token}"  # one convention: input → predicted
    np.testing.assert_array_equal(arr(mask["z"]), np.triu(np.ones((n, n)), 1))
    assert all(mask["text"][i][j] == ("−∞" if j > i else "0") for i in range(n) for j in range(n))

    self_fig = figure(at, "Decoder self-attention of the new position")["data"][0]
    np.testing.assert_array_equal(arr(self_fig["z"]), rows_of(rec.self_attn[layer].numpy(), head))
    assert self_fig["x"] == fd.labels(out.tgt_tokens[: t + 1])  # the hover names the tokens ...
    assert "%{x}" in self_fig["hovertemplate"] and "%{z:.4f}" in self_fig["hovertemplate"]  # + the value

    cross = figure(at, "Cross-attention of the new position")["data"][0]
    np.testing.assert_array_equal(arr(cross["z"]), rows_of(rec.cross_attn[layer].numpy(), head))
    assert cross["x"] == fd.labels(out.src_tokens)

    align_fig = figure(at, "Source–target alignment so far")["data"][0]
    assert align_fig["y"] == fd.step_labels(out.tgt_tokens[: len(out.steps)], [s.token for s in out.steps])
    align = arr(align_fig["z"])
    want = np.stack([s.cross_attn[layer].numpy() for s in out.steps])
    want = want.mean(1) if head in ("all", "mean") else want[:, int(head)]
    np.testing.assert_array_equal(align[: t + 1], want[: t + 1].astype(np.float32))
    assert np.isnan(align[t + 1:]).all()  # rows not generated yet stay blank


# ---------------------------------------------------------------- decoder page


def test_greedy_figures_are_the_step_records(shipped):
    name, ckpt = shipped
    at = run_page(DECODER)
    assert_clean(at)
    out = ckpt.translate(ckpt.example, "greedy")
    n = len(out.steps)
    assert at.slider(key="dec_step").value == n  # opens on the last step: the whole output
    L = ckpt.cfg.n_decoder_layers - 1
    check_step_figures(at, ckpt, out, n, L, "all")
    assert any(out.text in m.value for m in at.markdown)
    assert at.success and "They agree" in at.success[0].value  # teacher forcing == step by step

    # Another step, layer and head: the figures follow, and so does the URL.
    step, head = max(1, n // 2), str(ckpt.cfg.n_heads - 1)
    at.slider(key="dec_step").set_value(step)
    at.selectbox(key="dec_layer").set_value(0)
    at.selectbox(key="dec_head").set_value(head)
    at.run()
    assert_clean(at)
    check_step_figures(at, ckpt, out, step, 0, head)
    q = at.query_params
    assert (q["dec_step"], q["dec_layer"], q["dec_head"]) == (str(step), "0", head)


def test_teacher_forced_pass_agrees_with_step_by_step(shipped):
    name, ckpt = shipped
    at = run_page(DECODER)
    out = ckpt.translate(ckpt.example, "greedy")
    agree = figure(at, "Teacher forcing vs free-running")["data"]
    forced, free = arr(agree[0]["y"]), arr(agree[1]["y"])
    np.testing.assert_allclose(forced, free, atol=1e-5)
    want = [float(s.logits.double().softmax(-1)[s.token_id]) for s in out.steps]
    np.testing.assert_allclose(free, want, atol=1e-6)
    table = at.dataframe[0].value
    assert list(table["token"]) == [s.token for s in out.steps]
    deltas = table[["max |Δ logits|", "max |Δ self-attn|", "max |Δ cross-attn|"]]
    assert (deltas.astype(float).to_numpy() <= 1e-4).all()  # printed as the figures print numbers (F.num)


def test_reference_target_is_teacher_forced(shipped):
    name, ckpt = shipped
    probe = ckpt.meta.get("probe", {})
    text, target = probe.get("source") or ckpt.example, probe.get("target") or "x"
    at = run_page(DECODER, text=text, target=target)
    assert_clean(at)
    _, tf_trace = ckpt.trace(text, target=target, names="logits")
    probs = tf_trace["logits"][0].softmax(-1)
    want_ids = [*ckpt.target_ids(target), ckpt.tgt_tokenizer.eos_id]
    ref = figure(at, "Teacher forcing vs free-running")["data"][2]
    np.testing.assert_allclose(arr(ref["y"]), [float(probs[t, i]) for t, i in enumerate(want_ids)], atol=1e-6)
    table = at.dataframe[1].value
    assert list(table["reference"]) == [ckpt.tgt_tokenizer.id_to_token(i) for i in want_ids]


def test_beam_search_tree_and_steps(shipped):
    name, ckpt = shipped
    at = run_page(DECODER, query={"dec_strategy": "beam", "dec_beam": "3", "dec_lp": "0.6"})
    assert_clean(at)
    out = ckpt.translate(ckpt.example, "beam", beam_width=3, length_penalty=0.6)
    check_step_figures(at, ckpt, out, len(out.steps), ckpt.cfg.n_decoder_layers - 1, "all")
    tree = figure(at, "Beam tree")["data"]
    nodes = tree[-1]
    assert [c[0] for c in nodes["customdata"]] == [n.token for n in out.beam_tree]
    np.testing.assert_allclose([c[1] for c in nodes["customdata"]], [n.score for n in out.beam_tree])
    assert list(arr(nodes["x"])) == [n.depth for n in out.beam_tree]
    assert at.query_params["dec_strategy"] == "beam" and at.query_params["dec_beam"] == "3"


def test_sampling_is_reproducible_from_the_url(shipped):
    name, ckpt = shipped
    query = {"dec_strategy": "sample", "dec_temp": "1.5", "dec_topk": "5", "dec_topp": "0.9", "dec_seed": "7",
             "dec_step": "1"}
    at = run_page(DECODER, query=query)
    assert_clean(at)
    out = ckpt.translate(ckpt.example, "sample", temperature=1.5, top_k=5, top_p=0.9, seed=7)
    check_step_figures(at, ckpt, out, 1, ckpt.cfg.n_decoder_layers - 1, "all")
    assert any(f"`{out.text}`" in m.value for m in at.markdown)
    assert at.success and "They agree" in at.success[0].value


def test_play_starts_from_the_first_step_and_pauses(shipped):
    name, ckpt = shipped
    at = run_page(DECODER)
    if at.slider(key="dec_step").value == 1:
        pytest.skip("the example's output has a single step: nothing to play")
    at.button(key="dec_play").click().run()
    assert_clean(at)
    assert at.slider(key="dec_step").value == 1  # replays from the start
    assert at.session_state["dec_playing"] is True
    at.session_state["dec_tick"] = float("inf")  # the injected clock: the next tick is not due yet
    at.run()  # a rerun before the tick is due does not advance
    assert at.slider(key="dec_step").value == 1
    at.session_state["dec_tick"] = float("-inf")  # the injected clock: the last advance was long ago
    at.run()  # what the fragment's timer does in the browser: a rerun advances one step
    assert at.slider(key="dec_step").value == 2
    at.button(key="dec_pause").click().run()
    assert at.session_state["dec_playing"] is False
    assert at.button(key="dec_play")


def test_sampling_says_which_distribution_each_probability_is_from(shipped):
    """Issue 13 §5: at temperature 2 the sampled token can lie outside the 5 most likely ones; the bars
    still show it, and every p names its distribution (sampled-from vs the model's softmax)."""
    name, ckpt = shipped
    opts = {"temperature": 2.0, "top_k": None, "top_p": None, "seed": 1}
    out = ckpt.translate(ckpt.example, "sample", **opts)
    sampled = [sampling_distribution(s.logits, 2.0) for s in out.steps]
    outside = [i for i, (s, p) in enumerate(zip(out.steps, sampled, strict=True))
               if s.token_id not in p.topk(5).indices.tolist()]
    assert outside, "seed 1 at T=2 should sample a token outside the top 5 (the issue's example)"
    step = outside[0] + 1
    query = {"dec_strategy": "sample", "dec_temp": "2.0", "dec_topk": "0", "dec_topp": "1.0", "dec_seed": "1",
             "dec_step": str(step)}
    at = run_page(DECODER, query=query)
    assert_clean(at)
    rec = out.steps[step - 1]
    model_p, sample_p = float(torch.softmax(rec.logits.double(), -1)[rec.token_id]), rec.prob
    assert float(sampled[step - 1][rec.token_id]) == sample_p  # the page's distribution is the sampler's
    bars = figure(at, f"Step {step}: the 5 most likely next tokens + the sampled one")["data"]
    assert [b["name"] for b in bars] == ["model: softmax(logits)", "sampled from: after temperature, top-k, top-p"]
    assert len(bars[0]["customdata"]) == 6 and bars[0]["customdata"][-1] == rec.token
    np.testing.assert_allclose([arr(bars[0]["x"])[-1], arr(bars[1]["x"])[-1]], [model_p, sample_p], atol=1e-6)
    header = next(h.proto.body for h in at.get("html") if "chosen:" in h.proto.body)
    assert f"p = {sample_p:.4f} in the distribution it was sampled from" in header
    assert f"p = {model_p:.4f} under the model" in header
    table = at.dataframe[0].value.set_index("step")
    assert table.loc[step, "p model, step by step"] == pytest.approx(model_p, abs=1e-6)
    assert table.loc[step, "p sampled from (T, top-k, top-p)"] == pytest.approx(sample_p, abs=1e-6)


@pytest.mark.parametrize("text, expect", [
    ("", "empty"),
    ("   \n\t ", "whitespace"),
    ("3 november\x00 2023", "control character"),
    ("3" * 5000, "limit"),
])
def test_bad_input_gives_a_message(shipped, text, expect):
    at = run_page(DECODER, text=text)
    assert not at.exception, [e.value for e in at.exception]
    assert at.error and expect in at.error[0].value.lower(), [e.value for e in at.error]
    assert not at.get("plotly_chart")


def test_emoji_becomes_unk_with_a_warning(shipped):
    name, ckpt = shipped
    at = run_page(DECODER, text=ckpt.example[:-1] + "🎉")
    assert not at.exception, [e.value for e in at.exception]
    assert any("[UNK]" in w.value for w in at.warning)
    assert at.get("plotly_chart")


def test_bad_reference_target_gives_a_message(shipped):
    at = run_page(DECODER, target="ok\x07")
    assert not at.exception
    assert any("control character" in e.value for e in at.error)


def test_junk_query_falls_back(shipped):
    name, ckpt = shipped
    junk = {"dec_strategy": "nope", "dec_step": "-3", "dec_layer": "99", "dec_head": "x", "dec_temp": "nan"}
    at = run_page(DECODER, query=junk)
    assert_clean(at)
    assert at.segmented_control(key="dec_strategy").value == "greedy"
    assert at.selectbox(key="dec_layer").value == ckpt.cfg.n_decoder_layers - 1
    assert at.selectbox(key="dec_head").value == "all"


# ---------------------------------------------------------------- training page


def test_training_page_shows_the_shipped_film(shipped):
    name, ckpt = shipped
    film = ckpt.film()
    at = run_page(TRAINING, query={"film_frame": str(film[0][0]) if film else "0"})
    assert_clean(at)
    if not film:
        assert any("no film strip" in i.value for i in at.info)
        return
    step, trace = film[0]
    L = ckpt.cfg.n_decoder_layers - 1
    fig = figure(at, f"Probe example at training step {step}:")["data"][0]
    want = trace[f"decoder.layers.{L}.cross_attn.weights"][0].numpy().mean(0)
    np.testing.assert_array_equal(arr(fig["z"]), want)
    rows = fd.step_labels(tokens_of(trace, "tgt"), trace.meta["next_tokens"])
    assert fig["y"] == rows and rows[0].startswith("0: [BOS] → ")  # the decoder page's convention
    sharp = figure(at, "Alignment sharpness")["data"][0]
    assert list(arr(sharp["x"])) == [s for s, _ in film]


def start_training(at: AppTest, steps: int) -> None:
    at.number_input(key="train_steps").set_value(steps)
    at.number_input(key="train_warmup").set_value(5)
    at.select_slider(key="train_d").set_value(32)
    at.select_slider(key="train_layers").set_value(1)
    next(b for b in at.get("form_submit_button") if "Train" in b.label).click()
    at.run()
    assert_clean(at)


def wait_for_result(at: AppTest, seconds: float = 300) -> None:
    """Wait on the job's own event (set when the training thread ends), then redraw once."""
    assert at.session_state["train_job"].finished.wait(seconds), "training did not finish in time"
    at.run()
    assert_clean(at)


def test_live_training_runs_to_the_end(shipped):
    at = run_page(TRAINING)
    start_training(at, 20)
    assert at.button(key="train_stop") and at.get("progress")  # live view while it runs
    wait_for_result(at)
    job = at.session_state["train_job"]
    acc = job.ckpt.meta["accuracy"]
    outcome = at.success if acc >= 0.5 else at.warning  # a green tick only for a run that learned
    assert "for 20 steps in" in outcome[0].value
    job = at.session_state["train_job"]
    assert job.log["step"] == list(range(1, 21))
    curves = figure(at, "Training curves of your run")["data"]
    np.testing.assert_allclose(arr(curves[0]["y"]), job.log["loss"])
    np.testing.assert_allclose(arr(curves[2]["y"]), job.log["lr"])
    frames = job.ckpt.film()
    assert frames and frames[-1][0] == 20
    film_fig = figure(at, "Probe example at training step 20:")["data"][0]
    L = job.ckpt.cfg.n_decoder_layers - 1
    want = frames[-1][1][f"decoder.layers.{L}.cross_attn.weights"][0].numpy().mean(0)
    np.testing.assert_array_equal(arr(film_fig["z"]), want)


def test_stop_button_keeps_the_model_trained_so_far(shipped):
    at = run_page(TRAINING)
    start_training(at, 2000)
    at.button(key="train_stop").click()
    at.run()
    wait_for_result(at)
    assert not at.success  # a stopped run gets no green tick (issue 13 §8)
    assert "Stopped after" in at.info[0].value and at.info[0].proto.icon == "⏹"
    job = at.session_state["train_job"]
    assert 0 < len(job.log["step"]) < 2000
    assert job.ckpt.film()[-1][0] == len(job.log["step"])


class FakeJob:
    """What the training page reads from its background job, without a thread (tests the drawing only)."""

    def __init__(self, steps: int, done_steps: int, ckpt=None, task: str = "reverse"):
        self.task, self.steps, self.warmup, self.ckpt, self.error = task, steps, 5, ckpt, None
        self.log = {"step": list(range(1, done_steps + 1)), "loss": [2.0] * done_steps, "acc": [0.0] * done_steps,
                    "lr": [1e-3] * done_steps}
        self.frames, self.elapsed, self.done = [], 1.0, ckpt is not None

    snapshot = lambda self: self.log  # noqa: E731
    steps_done = property(lambda self: len(self.log["step"]))
    model_name = property(lambda self: f"trained: {self.task} (step {self.steps_done})")


def untrained(accuracy: float):
    from model.toy.checkpoint import Checkpoint

    c = load_shipped("reverse")
    meta = {"task": "reverse", "accuracy": accuracy, "probe": c.meta["probe"]}
    return Checkpoint(c.model, c.src_tokenizer, c.tgt_tokenizer, meta=meta)


def load_shipped(name: str):
    from model.toy.checkpoint import load_checkpoint

    return load_checkpoint(name)


def test_progress_at_step_zero_says_starting(shipped):
    at = run_page(TRAINING, state={"train_job": FakeJob(10, 0)})
    assert_clean(at)
    text = at.get("progress")[0].proto.text
    assert text == "step 0/10 · starting…" and "nan" not in text


@pytest.mark.parametrize("done, icon, kind", [(10, "⚠️", "warning"), (4, "⏹", "info")])
def test_a_run_that_did_not_learn_gets_no_green_tick(shipped, done, icon, kind):
    """Issue 13 §8: finished at 0% exact match -> a warning; stopped early -> an info; never a ✅."""
    job = FakeJob(10, done, untrained(0.0))
    at = run_page(TRAINING, state={"train_job": job})
    assert not at.exception and not at.success
    msg = getattr(at, kind)[0]
    assert msg.proto.icon == icon and "0.0%" in msg.value


def test_trained_model_joins_the_session_models(shipped):
    """Issue 13 §9: the trained checkpoint is offered under a clear name for the rest of the session."""
    job = FakeJob(10, 10, untrained(1.0))
    at = run_page(TRAINING, state={"train_job": job})
    assert_clean(at)
    assert at.session_state["session_models"] == {"trained: reverse (step 10)": job.ckpt}
    assert at.success and "✅" == at.success[0].proto.icon
    assert any("trained: reverse (step 10)" in c.value for c in at.caption)
    assert any("24noitnetta" in m.value for m in at.markdown)  # it runs: its output on the probe


def test_a_model_that_never_stops_is_cut_and_the_page_says_why():
    """Issue 13 §3 / 11 §4: the reverse model on 116 characters never emits [EOS]; it falls into a loop,
    which the page stops at the same step trace() does on every other page, and says so, without an error.
    (Without the loop guard the shared max_len − 1 limit cuts it: tests/test_checkpoint.py.)"""
    ckpt = load_shipped("reverse")
    text = ("attention" * 13)[:116]
    at = run_page(DECODER, query={"checkpoint": "reverse"}, text=text)
    assert_clean(at)
    out = ckpt.translate(text)
    assert out.loop is not None and not out.finished
    assert any("did not stop" in w.value and "repeated" in w.value for w in at.warning)
    assert at.slider(key="dec_step").value == len(out.steps)
    _, tr = ckpt.trace(text, names="logits")  # what the Attention/Tokens/Snapshots pages draw
    assert tr.meta["finished"] is False and tr.meta["tgt_tokens"] == ["[BOS]", *out.tokens]


def test_decoder_runs_a_model_trained_in_this_session(shipped):
    """Issue 13 §9: a session model (the training page registers it) decodes on this page, in this
    session only (never through the process-wide cache, where another session's model could answer)."""
    name = "trained: reverse (step 10)"
    mine = untrained(1.0)
    mine.meta["example"] = "attention42"
    at = run_page(DECODER, state={"session_models": {name: mine}, "checkpoint": name, "source_text": "hello42"})
    assert_clean(at)
    out = mine.translate("hello42")
    assert any(f"`{out.text}`" in m.value for m in at.markdown)
    assert at.session_state["_dec_memo"]["decode"][0][0] is mine
