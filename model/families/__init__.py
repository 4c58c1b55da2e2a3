"""Model families built on model/core: the 2017 encoder-decoder Transformer (and its encoder-only BERT
form), and decoder-only language models (GPT-2, Llama-style)."""
