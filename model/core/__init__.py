"""The instrumented core every model family shares: config, the recorder (capture + hooks), Trace files,
attention, the model description (describe.py)."""
