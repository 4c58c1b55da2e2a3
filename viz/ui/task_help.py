"""What the current toy model can translate: its grammar, example sentences to pick, and a warning
when the sidebar's input is outside what it learned (not only [UNK]: unknown characters, too long,
not a sentence of its grammar). The lead calls `task_help(sel)` from the sidebar, after the inputs.
"""

from __future__ import annotations

import streamlit as st

from model.toy.tasks import TASKS, Task
from viz.i18n import t

PICKER_KEY = "task_example"


def task_of(ckpt) -> Task | None:
    """The toy task a checkpoint was trained on (None for a checkpoint of no known task)."""
    return TASKS.get((getattr(ckpt, "meta", None) or {}).get("task"))


def _use_example() -> None:
    # A callback runs before the sidebar's text_area is drawn again, so its state may be set here.
    choice = st.session_state.get(PICKER_KEY)
    if choice:
        st.session_state["source_text"] = choice
        st.session_state["target_text"] = ""
    st.session_state[PICKER_KEY] = None


def problems_text(task: Task, text: str, skip: tuple[str, ...] = ()) -> list[str]:
    """The input problems of `text` (minus the kinds in `skip`), translated."""
    return [t(p.message, **p.args) for p in task.input_problems(text) if p.kind not in skip]


def task_help(sel, container=None) -> None:
    """Grammar, example picker and input warnings for the sidebar's selection (`sidebar.Selection`)."""
    if sel is None:
        return
    box = container if container is not None else st.sidebar
    try:
        task = task_of(sel.ckpt)
    except ValueError:  # a broken checkpoint: the sidebar already says why
        return
    if task is None:
        return
    with box.expander(t("What this model can translate"), expanded=False):
        st.caption(t(task.description))
        st.markdown("\n".join(f"- {t(line)}" for line in task.grammar))
    box.selectbox(t("Example sentences"), task.examples, index=None, key=PICKER_KEY,
                  placeholder=t("Pick one to put it in the source text"), on_change=_use_example)
    # Empty input and unknown characters: every page already says so above its figures (the [UNK] note).
    for msg in problems_text(task, sel.text, skip=("empty", "vocabulary")):
        box.warning(msg, icon="🧭")
