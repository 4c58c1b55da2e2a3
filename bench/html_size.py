"""Bytes of a standalone HTML export of attention views: ours (viz.notebook.export_html) vs BertViz's
`head_view(..., html_action="return")`, on the same attention (MiniLM, all 6 layers × 12 heads), at 128 and
512 tokens.

    .venv/bin/pip install --no-deps bertviz   # the reference (not a dependency of the lab)
    .venv/bin/python bench/html_size.py

What each file holds: BertViz's head view embeds every layer's and head's full weights as JSON text and
loads d3/jQuery from a CDN at view time (so it is not offline). Ours inlines plotly.js once (offline)
and holds the chosen layer's heads at full resolution (head buttons) plus the model view (every layer
× head, max-pooled thumbnails), numbers as base64 float arrays.
"""

from __future__ import annotations

import random

from model.loaders.minilm import load_minilm
from viz import notebook as nb

WORDS = "the animal did not cross street because it was too tired wide river bank money water".split()


def sentence(n_words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def main() -> None:
    from bertviz import head_view

    enc = load_minilm()
    print(f"{'tokens':>6}  {'ours (KB)':>10}  {'BertViz (KB)':>12}  ratio  (ours: plotly.js inlined once, offline; "
          "BertViz: d3/jQuery from a CDN)")
    for n in (128, 512):
        text = sentence(n - 2)  # [CLS] + n - 2 words (each one WordPiece token) + [SEP]
        _, trace = enc.run_with_trace(text, names="*.weights")
        T = trace["encoder.layers.0.self_attn.weights"].shape[-1]
        ours = nb.export_html([nb.head(trace, 3, 0), nb.model_view(trace)])
        attention = tuple(trace[f"encoder.layers.{i}.self_attn.weights"] for i in range(6))
        theirs = head_view(attention, trace.meta["src_tokens"], html_action="return").data
        a, b = len(ours.encode()), len(theirs.encode())
        print(f"{T:>6}  {a / 1024:>10,.0f}  {b / 1024:>12,.0f}  {a / b:.2f}x")


if __name__ == "__main__":
    main()
