"""The loaders' error types, in a module of their own so that gguf.py and bpe.py (the GGUF tokenizer)
can both raise them without importing each other."""


class GGUFError(ValueError):
    """The file is not a GGUF this lab can read; the message says why."""
