"""The Streamlit glue, by role (the figures in viz/figures/ never import it):

- models     models and trace caches (shared read-only, or per session), capabilities
- state      URL and state: seed_from_query, write_query, note_replaced, the history patch
- sidebar    the sidebar, Selection, require(...), the default model per language
- text       input checks, escaping, error sentences in the UI language
- render     show_figure (with export), show_error, token labels
- heap       the heap freezer and giving freed memory back
- lm_models, attention_views, task_help, qk_batch, warmup, failover: page-side helpers
"""
