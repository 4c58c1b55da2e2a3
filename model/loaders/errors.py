"""The loaders' error types, in a module of their own so that gguf.py and bpe.py (the GGUF tokenizer)
can both raise them without importing each other."""


class GGUFError(ValueError):
    """The file is not a GGUF this lab can read; the message says why."""


class ModelFileNotFoundError(FileNotFoundError):
    """A model path (a .gguf file, a directory) that is not there: the message says "file not found" first, before
    what a model can be (issue 38 §5: a missing .gguf was answered with the list of model kinds alone)."""
