"""AppTest for Inside a layer, Architecture map, A batch with padding and Tokenizer playground: every page
runs in English and Chinese with no exception or error, and draws the numbers the model computed."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from conftest import assert_clean, figures, open_page
from streamlit.testing.v1 import AppTest

from model import load_checkpoint
from model.toy.padding import batch_trace
from model.toy.tokenizer import Tokenizer
from viz.figures import arch as FA
from viz.figures import layer as FL

PAGES = ["layer", "architecture", "padding", "tokenizers"]
TIMEOUT = 300


def run_page(page: str, lang: str = "en", query: dict | None = None, state: dict | None = None) -> AppTest:
    return open_page(f"viz/pages/{page}.py", query={"lang": lang, **(query or {})}, state=state, timeout=TIMEOUT)


def values(v) -> np.ndarray:
    """Plotly JSON data: a base64 typed array ({dtype, bdata[, shape]}) or plain lists."""
    if isinstance(v, dict):
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return a.reshape([int(s) for s in str(v["shape"]).split(",")]) if "shape" in v else a
    return np.asarray(v)


def figure(at: AppTest, title_part: str) -> dict:
    found = [f for f in figures(at) if title_part in f["layout"].get("title", {}).get("text", "")]
    assert found, [f["layout"].get("title", {}).get("text") for f in figures(at)]
    return found[0]


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("page", PAGES)
def test_page_runs_clean(page, lang):
    at = run_page(page, lang)
    assert_clean(at)
    assert figures(at), f"{page} drew no figure"
    if lang == "zh":
        assert any("\u4e00" <= ch <= "\u9fff" for ch in at.title[0].value), at.title[0].value


def test_layer_page_follows_the_url_and_draws_the_model_tensors():
    at = run_page("layer", query={"stack": "decoder", "layer": "1", "sub": "cross_attn", "token": "2", "head": "3"})
    assert_clean(at)
    ckpt = load_checkpoint("dates")
    _, trace = ckpt.trace(ckpt.example)
    steps = FL.residual_steps(trace, "decoder.layers.1", "cross_attn")
    resid = figure(at, "residual stream")
    lines = [d for d in resid["data"] if d["type"] == "scatter"]
    for line, s in zip(lines, steps, strict=True):
        np.testing.assert_allclose(values(line["y"]), FL.token_norms(s.value), rtol=1e-5)
    assert "decoder.layers.1.cross_attn" in figure(at, "W^O")["layout"]["title"]["text"]
    query = figure(at, "soft lookup")
    np.testing.assert_allclose(values(query["data"][3]["y"]), trace["decoder.layers.1.cross_attn.weights"][0, 3, 2],
                               rtol=1e-6)
    assert at.query_params["sub"] == "cross_attn" and at.query_params["head"] == "3"


def test_layer_page_draws_both_wirings_and_the_shipped_experiment():
    at = run_page("layer")
    assert_clean(at)
    titles = [f["layout"]["title"]["text"] for f in figures(at)]
    assert any(t.startswith("post-LN: LayerNorm(x + Sublayer(x))") for t in titles)
    assert any(t.startswith("pre-LN: x + Sublayer(LayerNorm(x))") for t in titles)
    curves = figure(at, "with and without learning-rate warmup")
    assert sum(d.get("mode") == "lines" for d in curves["data"]) == 4


def test_layer_page_reruns_the_experiment_live():
    at = run_page("layer")
    at.slider(key="ly_prenorm_steps").set_value(20)
    rerun = [b for b in at.button if b.label == "Re-run the experiment live"]
    assert rerun, [b.label for b in at.button]
    rerun[0].click()
    at.run()
    assert_clean(at)
    curves = figure(at, "with and without learning-rate warmup")
    lines = [d for d in curves["data"] if d.get("mode") == "lines"]
    assert len(lines) == 4 and all(len(values(d["x"])) == 20 for d in lines)
    assert any("live re-run" in c.value for c in at.caption)


def padding_batch(model: str, lines: str) -> AppTest:
    """The padding page with `model` chosen and `lines` typed, as a user would."""
    at = run_page("padding")
    at.selectbox[0].select(model).run()
    at.text_area(key=f"pad_lines_{model}").input(lines).run()
    return at


def test_padding_page_shows_the_right_and_the_wrong_average():
    ckpt = load_checkpoint("dates")
    pairs = [("3 november 2023", "2023-11-03"), ("14 OCT 1994", "1994-10-14"), ("the 23rd of july, 2032", "2032-07-23")]
    lines = "\n".join(f"{s} => {t}" for s, t in pairs)
    at = padding_batch("dates", lines)
    assert_clean(at)
    _, losses = batch_trace(ckpt, pairs)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Right: sum / real tokens"] == f"{losses.right_mean:.4f}"
    assert metrics["Wrong (seed 001): torch.mean(loss * mask)"] == f"{losses.wrong_mean:.4f}"
    assert losses.wrong_mean == losses.right_mean  # dates targets all have one length: no [PAD] label
    masks = figure(at, "padding masks")
    assert values(masks["data"][0]["z"]).sum() > 0  # real [PAD] columns in the sources


def test_padding_page_opens_on_a_model_with_padded_labels():
    at = run_page("padding")  # the sidebar opens on dates, whose targets never need padding
    assert_clean(at)
    model = at.selectbox[0].value
    assert model != "dates" and at.selectbox[0].label == "Model for this batch"
    typed = at.text_area(key=f"pad_lines_{model}").value.splitlines()
    pairs = [(s.strip(), t.strip()) for s, t in (line.split("=>") for line in typed)]
    assert len(pairs) == 3
    _, losses = batch_trace(load_checkpoint(model), pairs)
    assert not losses.real.all() and losses.wrong_mean < losses.right_mean  # the [PAD] zeros drag it down
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Wrong (seed 001): torch.mean(loss * mask)"] == f"{losses.wrong_mean:.4f}"
    loss = figure(at, "per-token loss")
    shown = values(loss["data"][0]["z"])
    np.testing.assert_allclose(shown[losses.real.numpy()], losses.per_token[losses.real].numpy(), rtol=1e-6)


def test_padding_page_refuses_a_single_sentence_with_a_message():
    at = padding_batch("dates", "3 november 2023")
    assert not at.exception
    assert at.error and "2 to 4 sentences" in at.error[0].value


def test_architecture_page_lists_every_block_with_the_trace_shapes():
    at = run_page("architecture", query={"layer": "1", "head": "2"})
    assert_clean(at)
    fig = figure(at, "the live model")
    assert [c[0] for c in fig["data"][0]["customdata"]] == [b.id for b in FA.BLOCKS]
    _, trace = load_checkpoint("dates").trace("3 november 2023")
    text = " ".join(a.get("text", "") for a in fig["layout"]["annotations"])
    assert f"(B, S, D) = {tuple(trace['encoder.out'].shape)}" in text
    assert len(at.get("page_link")) == len(FA.BLOCKS)


def test_tokenizer_page_trains_the_wordpiece_it_draws():
    at = run_page("tokenizers", query={"corpus": "zh-en:tgt", "vocab": "150"})
    assert_clean(at)
    strips = figure(at, "cut three ways")
    from model.toy.tasks import TASKS

    corpus = [tgt for _, tgt in TASKS["zh-en"].sample(2000, seed=0, split="train")]
    tok = Tokenizer.train_wordpiece(corpus, 150)
    assert strips["data"][2]["text"] == [p.token for p in tok.pieces("I like eating ice cream.")]
    assert strips["data"][1]["text"] == list("Ilikeeatingicecream.")
