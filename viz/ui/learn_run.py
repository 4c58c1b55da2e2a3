"""The Watch attention learn run for the pages (/learn, lesson 17, the warm-up): the recorded run measured once
per server, one head's map at one step, and any checkpoint of a run (shipped or trained here) as a model of the
session's model list, so the Attention page and the Language model page open it.

A checkpoint joins the list the way Training, live's runs do: `models.add_session_model` puts it in
`st.session_state["session_models"]` (this session only). It is a `LearnModel`, a `lm_models.RealModel` over
`model.toy.learn.language_model` (the lab's own DecoderLM with a word-level tokenizer of its ids), so every
page that reads a language model reads it. Names are stable and not translated; a trained run's carry a number
unique in this server (`learn: run 3 (1 layer, seed 0), step 2000`), so a process-wide cache keyed by a name
never meets another session's weights. The shipped run's names (`learn: 2 layers, step 675`) mean the same
weights in every session.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import streamlit as st

from model.toy import learn as LR
from viz.ui.lm_models import RealModel
from viz.ui.models import add_session_model, session_models

SHIPPED_LABELS = {"attn2": "2 layers", "attn1": "1 layer"}  # in model names: stable, never translated
MAX_LEARN_MODELS = 6  # /learn checkpoints kept in a session's model list (the oldest not shown go first)
_RUN_IDS = itertools.count(1)  # a trained run's number, unique in this server


@st.cache_resource(show_spinner=False)
def shipped() -> tuple[dict, dict, LR.Summary]:
    """The recorded runs with every checkpoint measured (once per server: ~3 s on 2 cores), its meta, and the
    summary. The warm-up (viz/ui/warmup.py) fills it on a fresh server."""
    runs = LR.load_run()
    return runs, LR.run_meta(), LR.summary(runs["attn2"], runs["attn1"])


def head_map(run: LR.Run, i: int, layer: int, head: int) -> tuple[np.ndarray, list[int]]:
    """Head layer.head's attention [T, T] on the probe's first row at checkpoint i, and that row's ids."""
    probe = LR.probe_ids(run.settings)[:1]
    _, trace = run.model_at(i).run_with_trace(probe, names=f"decoder.layers.{layer}.self_attn.weights")
    return trace[f"decoder.layers.{layer}.self_attn.weights"][0, head].numpy(), probe[0].tolist()


@st.cache_data(show_spinner=False, max_entries=256)
def attention_at(name: str, i: int, layer: int, head: int) -> tuple[np.ndarray, list[int]]:
    """`head_map` of the shipped run `name`, shared by every session."""
    return head_map(shipped()[0][name], i, layer, head)


@dataclass(eq=False)
class LearnModel(RealModel):
    """A /learn checkpoint in the model list: it opens on the run's own repeated probe."""

    probe: str = ""

    @property
    def example(self) -> str:
        return self.probe


def run_label(run: LR.Run) -> str:
    """A trained run's part of its checkpoints' names, numbered once per run object in this server."""
    number = getattr(run, "_model_list_id", None)
    if number is None:
        number = run._model_list_id = next(_RUN_IDS)
    return f"run {number} ({run.settings.change.replace('_', ' ')}, seed {run.settings.seed})"


def model_name(key: str, run: LR.Run, i: int) -> str:
    """key: "attn2" / "attn1" (the shipped run) or anything else (a run trained in this server)."""
    what = SHIPPED_LABELS.get(key) or run_label(run)
    return f"learn: {what}, step {run.steps[i]}"


def add_checkpoint(key: str, run: LR.Run, i: int) -> str:
    """Checkpoint i of `run` into this session's model list (as Training, live adds its runs); its name."""
    name = model_name(key, run, i)
    own = session_models()
    if not isinstance(own.get(name), LearnModel):
        add_session_model(name, LearnModel(name, LR.language_model(run, i, name), "decoder_lm",
                                           probe=LR.probe_text(run.settings)))
    shown = st.session_state.get("checkpoint")
    extra = [n for n, m in session_models().items() if isinstance(m, LearnModel) and n not in (name, shown)]
    for old in extra[:max(0, len(extra) - (MAX_LEARN_MODELS - 1))]:  # a class clicking every step: keep a few
        session_models().pop(old, None)
    return name
