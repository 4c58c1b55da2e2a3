"""/vision's figure builders (viz/figures/vision.py): every number they draw is the model's or the analysis's
(model/analysis/vision.py), on a small untrained ViT with a register token (so [CLS] is not the only prefix)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model.analysis import vision as AV
from model.families.vit import VisionTransformer, ViTConfig
from model.toy.shapes import make_batch
from viz.figures import vision as FV


@pytest.fixture(scope="module")
def run():
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(image_size=16, patch_size=4, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                                        n_registers=1, class_names=("red", "green", "blue", "yellow"))).eval()
    images, labels, decide = make_batch(2, seed=3, image_size=16, patch_size=4)
    with torch.no_grad():
        logits, trace = model.run_with_trace(torch.from_numpy(images), names="*.weights")
    return model, images, decide, logits, trace


def heatmaps(fig):
    return [d for d in fig.data if d.type == "heatmap"]


def test_patch_map_splits_a_row_into_prefix_and_grid(run):
    _, _, _, _, trace = run
    w = trace["encoder.layers.1.self_attn.weights"][0, 1, 0].numpy()  # [CLS]'s row, head 1
    z, prefix = FV.patch_map(w, trace.meta["n_prefix"], trace.meta["grid"])
    assert z.shape == (4, 4) and trace.meta["n_prefix"] == 2
    assert np.allclose(z.ravel(), w[2:]) and prefix == pytest.approx(float(w[:2].sum()))
    assert z.sum() + prefix == pytest.approx(1.0, abs=1e-6)


def test_image_figure_draws_the_pixels_and_the_grid(run):
    _, images, _, _, _ = run
    fig = FV.image_figure(images[0], (4, 4), 4, picked=(1, 2))
    img = np.asarray(fig.data[0].z)
    assert img.shape == (16, 16, 3)
    assert np.array_equal(img, np.rint(np.moveaxis(images[0], 0, -1) * 255).astype(np.uint8))
    kinds = [s.type for s in fig.layout.shapes]
    assert kinds.count("line") == 6 and kinds.count("rect") == 1  # 3 + 3 inner grid lines, the picked patch


def test_raw_and_rollout_maps_are_the_traces_numbers(run):
    _, images, _, _, trace = run
    n, (rows, cols) = trace.meta["n_prefix"], trace.meta["grid"]
    w = trace["encoder.layers.1.self_attn.weights"][0].numpy()
    roll = np.asarray(AV.attention_rollout(trace))
    q = n + 1 * cols + 2  # patch (1, 2) as the query
    raw, _ = FV.patch_map(w[0, q], n, (rows, cols))
    rz, _ = FV.patch_map(roll[1, q], n, (rows, cols))
    fig = FV.rollout_beside_raw(images[0], raw, rz, 4, "raw", "rollout", "title", picked=(1, 2))
    a, b = heatmaps(fig)
    assert np.array_equal(np.asarray(a.z), w[0, q, n:].reshape(rows, cols).astype(np.float64))
    assert np.array_equal(np.asarray(b.z), roll[1, q, n:].reshape(rows, cols).astype(np.float64))
    assert a.zmax == pytest.approx(float(raw.max())) and b.zmax == pytest.approx(float(rz.max()))
    maps = np.stack([FV.patch_map(w[h, 0], n, (rows, cols))[0] for h in range(2)])
    grid = FV.heads_over_image(images[0], maps, 4, "heads", chosen=1)
    assert [np.asarray(h.z).tolist() for h in heatmaps(grid)] == maps.tolist()


def test_distance_figure_plots_the_mean_attention_distance(run):
    _, _, _, _, trace = run
    d = np.asarray(AV.mean_attention_distance(trace))
    fig = FV.distance_figure(d, 16)
    assert d.shape == (2, 2) and len(fig.data) == 2
    for h, tr in enumerate(fig.data):
        assert np.allclose(np.asarray(tr.y), d[:, h]) and list(tr.x) == [0, 1]


def test_position_similarity_tiles_are_the_analysis(run):
    model = run[0]
    sim = np.asarray(AV.position_similarity(model))
    assert sim.shape == (16, 4, 4)
    tiles = np.asarray(FV.position_similarity_figure(sim).data[0].z, dtype=np.float64)
    assert tiles.shape == (4 * 5 - 1, 4 * 5 - 1)
    for i in (0, 6, 15):
        r, c = divmod(i, 4)
        assert np.allclose(tiles[r * 5:r * 5 + 4, c * 5:c * 5 + 4], sim[i])
    assert np.isnan(tiles[4]).all()  # the gap between tile rows


def test_deciding_share_bars_and_the_covered_line(run):
    _, _, decide, _, trace = run
    res = AV.deciding_share(trace, decide)
    share, covered = np.asarray(res["share"]), float(res["coverage"])
    fig = FV.deciding_share_figure(share, covered)
    for h, bar in enumerate(fig.data):
        assert np.allclose(np.asarray(bar.y), share[:, h])
    assert fig.layout.shapes[0].y0 == pytest.approx(covered)


def test_prediction_figure_orders_the_softmax(run):
    model, _, _, logits, _ = run
    p = torch.softmax(logits[0].double(), -1).numpy()
    fig = FV.prediction_figure(p, model.cfg.names(), truth=2)
    assert np.allclose(np.asarray(fig.data[0].x), np.sort(p)[::-1])
    assert [y.removesuffix(" ✓") for y in fig.data[0].y] == [model.cfg.names()[i] for i in np.argsort(-p)]
    assert sum(y.endswith("✓") for y in fig.data[0].y) == 1


def test_the_architecture_map_draws_the_vit_from_its_config(run):
    from viz.figures.arch import vit_architecture_figure

    cfg = run[0].cfg.to_dict()
    fig = vit_architecture_figure(cfg)
    texts = " ".join(a.text for a in fig.layout.annotations)
    assert "18 tokens = [CLS] + 1 registers + 16 patches" in fig.layout.title.text  # 1 + 1 + 4·4
    assert "cut into 4 × 4 patches of 4 × 4" in texts and "one linear layer 48 → 16" in texts  # 3·4·4 → d_model
    assert "2 encoder blocks" in texts and "linear 16 → 4" in texts and "learned positions" in texts
