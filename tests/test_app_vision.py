"""/vision in AppTest (en and zh): it opens with no exception, the attention map over the image is the shipped ViT's
own weights for the chosen layer, head and query (a switch redraws the model's numbers, and goes into the URL),
and a bad upload gets a sentence, not a traceback."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import APP, assert_clean, plotly_array
from streamlit.testing.v1 import AppTest

from model.families.vit import load_vit
from model.toy.shapes import make_batch

PAGE = "viz/pages/vision.py"
SEED = 5


@pytest.fixture(scope="module")
def weights():
    """The shipped model's attention weights on the sample the page opens with: (L, H, T, T)."""
    model = load_vit("shapes")
    images, _, _ = make_batch(1, SEED, image_size=model.cfg.image_size, patch_size=model.cfg.patch_size)
    with torch.no_grad():
        _, trace = model.run_with_trace(torch.from_numpy(images), names="*.weights")
    return model.cfg, np.stack([trace[f"encoder.layers.{i}.self_attn.weights"][0].numpy()
                                for i in range(model.cfg.n_layers)])


def open_vision(lang: str, **query) -> AppTest:
    """/vision with `query` in its URL. Set after the app's first run: the start page (Attention) writes its own
    layer and head into the URL, which a browser opening /vision?layer=… never runs."""
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params["lang"] = lang
    at.run()
    at.query_params.update({k: str(v) for k, v in query.items()})
    at.switch_page(PAGE)
    at.run()
    return at


def raw_map(at) -> np.ndarray:
    """The raw-weights panel of the attention map (the chart keyed vis_map: its first heatmap), as drawn."""
    chart = next(c for c in at.get("plotly_chart") if c.proto.id.endswith("-vis_map"))
    fig = json.loads(chart.proto.spec)
    return plotly_array(next(d for d in fig["data"] if d["type"] == "heatmap")["z"]).astype(np.float64)


def expected(cfg, w, layer, head, query=0) -> np.ndarray:
    rows, cols = cfg.grid
    row = w[layer].mean(0)[query] if head == "mean" else w[layer, head, query]
    return row[cfg.n_prefix:].reshape(rows, cols)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_vision_opens_and_a_head_switch_draws_the_models_numbers(lang, weights):
    cfg, w = weights
    at = open_vision(lang, seed=SEED, layer=cfg.n_layers - 1, head="mean", q="cls")
    assert_clean(at)
    L = cfg.n_layers
    assert at.title[0].value == ("Attention over an image" if lang == "en" else "图像上的注意力")
    np.testing.assert_allclose(raw_map(at), expected(cfg, w, L - 1, "mean"), rtol=0, atol=1e-6)
    at.segmented_control(key="vis_layer").set_value(0).run()
    at.segmented_control(key="vis_head").set_value(2).run()
    assert_clean(at)
    np.testing.assert_allclose(raw_map(at), expected(cfg, w, 0, 2), rtol=0, atol=1e-6)
    assert at.query_params["layer"] in ("0", ["0"]) and at.query_params["head"] in ("2", ["2"])
    if lang == "en":  # a patch as the query, and the head knocked out: the answer is said from the model's run
        at.selectbox(key="vis_q").set_value("1,2").run()
        np.testing.assert_allclose(raw_map(at), expected(cfg, w, 0, 2, cfg.n_prefix + 1 * cfg.grid[1] + 2),
                                   rtol=0, atol=1e-6)
        at.toggle(key="vis_ablate").set_value(True).run()
        assert_clean(at)
        assert any("knocked out" in m.value for m in at.markdown)


def test_a_bad_upload_gets_a_sentence():
    at = open_vision("en", img="upload")
    assert_clean(at)
    at.file_uploader(key="vis_upload").set_value(("broken.png", b"\x89PNG\r\n\x1a\nnot really", "image/png")).run()
    assert not at.exception
    assert [e.value for e in at.error] and "not an image the page can read" in at.error[0].value


def test_an_uploaded_image_gets_the_models_prediction_and_map():
    """A PNG of a sample, 4x larger than the model's input: the page draws the model's own [CLS] weights on the
    resized picture (model.families.vit.image_to_input) and its prediction."""
    import io

    from PIL import Image

    from model.families.vit import image_to_input

    model = load_vit("shapes")
    images, labels, _ = make_batch(1, SEED + 1, image_size=model.cfg.image_size, patch_size=model.cfg.patch_size)
    big = np.repeat(np.repeat((images[0].transpose(1, 2, 0) * 255).round().astype(np.uint8), 4, 0), 4, 1)
    buf = io.BytesIO()
    Image.fromarray(big).save(buf, format="PNG")
    x = image_to_input(big, model.cfg.image_size)
    with torch.no_grad():
        logits, trace = model.run_with_trace(x, names="*.weights")
    L = model.cfg.n_layers
    w = trace[f"encoder.layers.{L - 1}.self_attn.weights"][0].numpy()
    at = open_vision("en", img="upload", layer=L - 1, head=1, q="cls")
    at.file_uploader(key="vis_upload").set_value(("square.png", buf.getvalue(), "image/png")).run()
    assert_clean(at)
    rows, cols = model.cfg.grid
    np.testing.assert_allclose(raw_map(at), w[1, 0, model.cfg.n_prefix:].reshape(rows, cols), rtol=0, atol=1e-6)
    pred = json.loads(next(c for c in at.get("plotly_chart") if c.proto.id.endswith("-vis_pred")).proto.spec)
    drawn = plotly_array(next(d for d in pred["data"] if d["type"] == "bar")["x"]).astype(np.float64)
    probs = torch.softmax(logits[0].double(), -1).numpy()
    np.testing.assert_allclose(drawn, np.sort(probs)[::-1], rtol=0, atol=1e-6)  # drawn most probable first
    assert int(logits[0].argmax()) == int(labels[0])  # the resized sample keeps its answer


def test_lesson_20_states_the_numbers_vision_draws():
    """One claim, one number: lesson 20's per-layer shares (heads' mean of [CLS] on the square's patch) are the
    mean over heads of the bars /vision draws for the same sample (both from model.analysis.vision.deciding_share)."""
    import re

    from viz.lessons import live_patches

    model = load_vit("shapes")
    live = live_patches(model, SEED)
    stated = [float(v) / 100 for v in re.search(r"layer by layer: ([^;]+);", live.feedback).group(1)
              .replace("%", "").split(" · ")]
    at = open_vision("en", seed=SEED)
    assert_clean(at)
    fig = json.loads(next(c for c in at.get("plotly_chart") if c.proto.id.endswith("-vis_decide")).proto.spec)
    bars = np.stack([plotly_array(d["y"]).astype(np.float64) for d in fig["data"] if d["type"] == "bar"])  # (H, L)
    np.testing.assert_allclose(stated, bars.mean(0), atol=0.005)  # the lesson rounds to whole percents

