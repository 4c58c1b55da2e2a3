"""Pure figure builders, one module per subject: a `Trace`, arrays or analysis results in, a plotly figure
out. Nothing here imports Streamlit or runs a model (the pages and the notebook do that).

- attention  heatmaps, head grids, pipeline/masks/QKVZ views; the shared colour scales and token labels
- arch       the architecture map (block diagram of the live model)
- decode     the decoder and training pages (look-ahead mask, next token, beam tree, training curves)
- experiments  what changed when a piece of the Transformer was broken
- layer      inside one layer: residual stream, Add & Norm, FFN, W^O
- llm        the Language model page (head statistics, logit lens, generation)
- modern     what changed since 2017
- padding    a batch with padding
- phenomena  attention phenomena (sinks, previous-token, induction, IOI) and lessons 11-15
- pretrained the pretrained encoder (MiniLM) page
- qk         the Q/K map
- tokenizers the tokenizer playground
"""
