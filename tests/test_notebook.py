"""The notebook API (viz/notebook.py): the same figures as the app, from a Trace, and one offline HTML file."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from model import load_checkpoint
from model.loaders.minilm import load_minilm
from viz import notebook as nb


@pytest.fixture(scope="module")
def dates_trace():
    return load_checkpoint("dates").trace("3 november 2023")[1]


def _z(fig, i=0):
    return np.asarray(fig.data[i].z, dtype=float)


def test_head_is_the_captured_weights_of_the_chosen_module(dates_trace):
    fig = nb.head(dates_trace, layer=1, head=2)  # default kind: cross-attention, where the alignment is
    visible = [i for i, tr in enumerate(fig.data) if tr.visible is not False]
    assert len(fig.data) == 4 and visible == [2]  # every head is in the figure, the chosen one shown
    want = dates_trace["decoder.layers.1.cross_attn.weights"][0, 2].numpy()
    np.testing.assert_allclose(_z(fig, 2), want, atol=1e-6)
    assert fig.layout.title.text.startswith("decoder layer 1 · cross-attention · head 2")
    assert "<sup>decoder.layers.1.cross_attn · " in fig.layout.title.text  # the capture, named under the words
    enc = nb.head(dates_trace, 0, 1, kind="encoder_self", scores=True)
    np.testing.assert_allclose(_z(enc, 1), dates_trace["encoder.layers.0.self_attn.scores"][0, 1].numpy(), atol=1e-5)


def test_modules_follow_the_models_description(dates_trace):
    assert nb.modules(dates_trace, "decoder_self") == [f"decoder.layers.{i}.self_attn" for i in range(2)]
    with pytest.raises(ValueError, match="layer 5 is out of range"):
        nb.head(dates_trace, 5, 0)
    _, bert = load_minilm().run_with_trace("The animal didn't cross the street", names="*.weights")
    assert nb.modules(bert) == [f"encoder.layers.{i}.self_attn" for i in range(6)]  # an encoder: its self-attention
    with pytest.raises(ValueError, match="no 'cross' attention"):
        nb.modules(bert, "cross")


def test_every_view_builds(dates_trace):
    for fig in (nb.heads(dates_trace, 0), nb.model_view(dates_trace), nb.pipeline(dates_trace, 0, 1),
                nb.masks(dates_trace, 0, 1, kind="decoder_self"), nb.qkvz(dates_trace, 1, 3)):
        assert fig.data and fig.layout.title.text


def test_export_html_is_offline_and_inlines_plotly_once(dates_trace, tmp_path):
    figs = [nb.head(dates_trace, 1, 2), nb.model_view(dates_trace)]
    page = nb.export_html(figs, tmp_path / "views.html")
    assert (tmp_path / "views.html").read_text(encoding="utf-8") == page
    assert page.count("plotly.js v") == 1 or page.count("Plotly=") <= 1  # the library, once
    assert not re.search(r"<script[^>]+src=['\"]https?:", page)  # nothing is fetched: it works offline
    specs = re.findall(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*(\[.*?\]),\s*\{", page, flags=re.S)
    assert len(specs) == 2
    assert json.loads(specs[0])[2]["z"]  # the head's numbers are in the page


@pytest.mark.slow
def test_quickstart_notebook_runs_top_to_bottom():
    """examples/quickstart.ipynb (toy model, MiniLM, SmolLM2, your own HF directory, a hook, a snapshot test)
    runs in a fresh kernel; any cell's error fails the test."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(__file__).parent.parent / "examples" / "quickstart.ipynb"
    book = nbformat.read(path, as_version=4)
    NotebookClient(book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
                   ).execute()
    outputs = [o for c in book.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "2023-11-03" in text and "Paris" in text and "passed" in text
