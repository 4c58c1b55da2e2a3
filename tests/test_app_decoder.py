"""The step-by-step decoder and live-training pages, headless (streamlit.testing AppTest).

The figures must *be* the recorded numbers: every heatmap/bar chart is compared with the
`Step` records of an independent `ckpt.translate(...)` with the same options, and the film
frames with `ckpt.film()`.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_clean
from streamlit.testing.v1 import AppTest

from viz import common
from viz import figures_decode as fd

APP = str(Path(__file__).resolve().parents[1] / "app.py")
DECODER, TRAINING = "viz/pages/decoder.py", "viz/pages/training.py"
TIMEOUT = 180
MAX_NEW = 64  # the decoder page's max_new_tokens


@pytest.fixture(scope="module")
def shipped():
    names = common.checkpoint_names()
    if not names:
        pytest.skip("no checkpoints installed (model/checkpoints) or listed in $ATTENTION_LAB_CHECKPOINTS")
    name = common.default_checkpoint(names)
    from model.checkpoint import load_checkpoint

    return name, load_checkpoint(name)


def run_page(page: str, *, text: str | None = None, target: str | None = None, query: dict | None = None,
             state: dict | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    if query:
        at.query_params.update(query)
    for key, value in {"source_text": text, "target_text": target, **(state or {})}.items():
        if value is not None:
            at.session_state[key] = value
    at.run()
    at.switch_page(page)
    at.run()
    return at


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


def check_step_figures(at: AppTest, out, step: int, layer: int, head: str) -> None:
    """The step view's figures against the independent decode `out` (step is 1-based)."""
    t = step - 1
    rec = out.steps[t]
    topk = figure(at, f"Step {step}: top-")["data"][0]
    np.testing.assert_allclose(arr(topk["x"]), [p for _, p in rec.topk], rtol=0, atol=0)
    assert topk["customdata"] == [tok for tok, _ in rec.topk]

    mask = figure(at, "Look-ahead mask M")["data"][0]
    n = t + 1
    assert mask["y"] == fd.labels(out.tgt_tokens[:n])
    np.testing.assert_array_equal(arr(mask["z"]), np.triu(np.ones((n, n)), 1))
    assert all(mask["text"][i][j] == ("−∞" if j > i else "0") for i in range(n) for j in range(n))

    self_fig = figure(at, "Decoder self-attention of the new position")["data"][0]
    np.testing.assert_array_equal(arr(self_fig["z"]), rows_of(rec.self_attn[layer].numpy(), head))
    assert self_fig["x"] == fd.labels(out.tgt_tokens[: t + 1])  # the hover names the tokens ...
    assert "%{x}" in self_fig["hovertemplate"] and "%{z:.6f}" in self_fig["hovertemplate"]  # + the value

    cross = figure(at, "Cross-attention of the new position")["data"][0]
    np.testing.assert_array_equal(arr(cross["z"]), rows_of(rec.cross_attn[layer].numpy(), head))
    assert cross["x"] == fd.labels(out.src_tokens)

    align = arr(figure(at, "Source–target alignment so far")["data"][0]["z"])
    want = np.stack([s.cross_attn[layer].numpy() for s in out.steps])
    want = want.mean(1) if head in ("all", "mean") else want[:, int(head)]
    np.testing.assert_array_equal(align[: t + 1], want[: t + 1].astype(np.float32))
    assert np.isnan(align[t + 1:]).all()  # rows not generated yet stay blank


# ---------------------------------------------------------------- decoder page


def test_greedy_figures_are_the_step_records(shipped):
    name, ckpt = shipped
    at = run_page(DECODER)
    assert_clean(at)
    out = ckpt.translate(ckpt.example, "greedy", max_new_tokens=MAX_NEW)
    n = len(out.steps)
    assert at.slider(key="dec_step").value == n  # opens on the last step: the whole output
    L = ckpt.cfg.n_decoder_layers - 1
    check_step_figures(at, out, n, L, "all")
    assert any(out.text in m.value for m in at.markdown)
    assert at.success and "They agree" in at.success[0].value  # teacher forcing == step by step

    # Another step, layer and head: the figures follow, and so does the URL.
    step, head = max(1, n // 2), str(ckpt.cfg.n_heads - 1)
    at.slider(key="dec_step").set_value(step)
    at.selectbox(key="dec_layer").set_value(0)
    at.selectbox(key="dec_head").set_value(head)
    at.run()
    assert_clean(at)
    check_step_figures(at, out, step, 0, head)
    q = at.query_params
    assert (q["dec_step"], q["dec_layer"], q["dec_head"]) == (str(step), "0", head)


def test_teacher_forced_pass_agrees_with_step_by_step(shipped):
    name, ckpt = shipped
    at = run_page(DECODER)
    out = ckpt.translate(ckpt.example, "greedy", max_new_tokens=MAX_NEW)
    agree = figure(at, "Teacher forcing vs free-running")["data"]
    forced, free = arr(agree[0]["y"]), arr(agree[1]["y"])
    np.testing.assert_allclose(forced, free, atol=1e-5)
    want = [float(s.logits.double().softmax(-1)[s.token_id]) for s in out.steps]
    np.testing.assert_allclose(free, want, atol=1e-6)
    table = at.dataframe[0].value
    assert list(table["token"]) == [s.token for s in out.steps]
    assert (table[["max |Δ logits|", "max |Δ self-attn|", "max |Δ cross-attn|"]].to_numpy() <= 1e-4).all()


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
    out = ckpt.translate(ckpt.example, "beam", beam_width=3, length_penalty=0.6, max_new_tokens=MAX_NEW)
    check_step_figures(at, out, len(out.steps), ckpt.cfg.n_decoder_layers - 1, "all")
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
    out = ckpt.translate(ckpt.example, "sample", temperature=1.5, top_k=5, top_p=0.9, seed=7,
                         max_new_tokens=MAX_NEW)
    check_step_figures(at, out, 1, ckpt.cfg.n_decoder_layers - 1, "all")
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
    time.sleep(0.9)
    at.run()  # what the fragment's timer does in the browser: a rerun advances one step
    assert at.slider(key="dec_step").value == 2
    at.button(key="dec_pause").click().run()
    assert at.session_state["dec_playing"] is False
    assert at.button(key="dec_play")


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


def wait_for_result(at: AppTest, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not at.success and time.monotonic() < deadline:
        time.sleep(0.5)
        at.run()  # in the browser the fragment polls; here each run polls once
    assert_clean(at)
    assert at.success, "training did not finish in time"


def test_live_training_runs_to_the_end(shipped):
    at = run_page(TRAINING)
    start_training(at, 20)
    assert at.button(key="train_stop") and at.get("progress")  # live view while it runs
    wait_for_result(at)
    assert "for 20 steps in" in at.success[0].value
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
    assert "stopped early" in at.success[0].value
    job = at.session_state["train_job"]
    assert 0 < len(job.log["step"]) < 2000
    assert job.ckpt.film()[-1][0] == len(job.log["step"])
