"""A live class (issue 41): the room store (`store.py`: SQLite by default, Redis across machines), free of Streamlit.
The pages' glue is `viz/ui/classroom.py`; the page is `viz/pages/class.py`."""

from viz.classroom.store import ClassError, ClassStore, Question, normalize_code, open_store

__all__ = ["ClassError", "ClassStore", "Question", "normalize_code", "open_store"]
