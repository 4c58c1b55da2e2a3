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
import time
from dataclasses import dataclass, replace

import numpy as np
import streamlit as st

from model.toy import learn as LR
from viz.figures import learn as FL
from viz.i18n import t
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


def why_trace(run: LR.Run, i: int):
    """Checkpoint i's model and its full trace on the probe's first row (the rows head_map draws): what the "Why
    here?" panel splits, every capture explain_score reads (a 2-layer toy on ~40 tokens: small)."""
    model = run.model_at(i)
    _, trace = model.run_with_trace(LR.probe_ids(run.settings)[:1])
    return model, trace


@st.cache_resource(show_spinner=False, max_entries=16)
def shipped_why_trace(name: str, i: int):
    """`why_trace` of the shipped run `name`, one object per checkpoint for every session (the panel's cache is
    keyed by the trace object)."""
    return why_trace(shipped()[0][name], i)


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


# ---------------------------------------------------------------- a live run: its status, its chart, its estimate


def comparison_figure(run: LR.Run | None, settings: LR.Settings, base: LR.Run):
    """A live or finished run over the shipped one (drawn wide and light beneath it: with the shipped setup the two
    coincide, and the shipped line vanished under yours), each phase change a labelled line: yours red and dashed,
    the shipped run's dotted in its colour (issue 38 §5: one unlabelled line)."""
    series = {"attn2": {"label": t("shipped run"), "loss": base.loss, "steps": base.steps,
                        "icl": base.series("icl")}}
    if run is not None and run.scores:
        series["yours"] = {"label": t("your run"), "loss": run.loss, "steps": run.steps, "icl": run.series("icl")}
    phase = LR.phase_change(run.steps, run.series("icl")) if run is not None and len(run.scores) > 2 else None
    shipped = LR.phase_change(base.steps, base.series("icl"))
    marks = [(shipped, t("shipped run's phase change (step {n})", n=shipped), FL.COLORS["attn2"])] if shipped else []
    return FL.curves_figure(series, phase, t("Your run against the shipped one"), total_steps=settings.steps,
                            phase_label=t("your run's phase change (step {n})", n=phase) if phase else None,
                            marks=marks, overlay=True)


MIN_PACE_STEPS = 20  # steps a live run takes before its own pace is extrapolated to the rest


def status_text(step: int, total: int, run: LR.Run | None, elapsed: float) -> str:
    """The live run's progress line: its step, its best last-layer induction score ("not measured yet" until the
    first checkpoint's scores arrive: it said "NaN" for the child process's first 20 s), its time, and from
    MIN_PACE_STEPS on the time left at this run's own pace."""
    if run is not None and run.scores:
        ind = FL.fmt(run.scores[-1].induction[-1].max())
    else:
        ind = t("not measured yet")
    text = t("step {n}/{total} · best last-layer induction score {ind} · {s} s", n=step, total=total, ind=ind,
             s=f"{elapsed:.0f}")
    if MIN_PACE_STEPS <= step < total:
        text += " · " + t("about {s} s left at this run's pace", s=f"{elapsed / step * (total - step):.0f}")
    return text


PACE_TTL_S = 120  # a quick timing of this server counts as "now" for two minutes (then it is timed again)
RUN_PACE_FRESH_S = 600  # a finished live run's pace counts as this server's for ten minutes


@st.cache_data(ttl=PACE_TTL_S, show_spinner=False, max_entries=len(LR.CHANGES))
def measured_pace(settings: LR.Settings) -> LR.Pace:
    """model.toy.learn.pace on this server now (a fraction of a second), shared by every session."""
    return LR.pace(settings)


@st.cache_resource(show_spinner=False)
def _run_paces() -> dict:
    """change -> (seconds per step of the last finished live run on this server, its wall time, when)."""
    return {}


def record_pace(change: str, step_s: float, took: float) -> None:
    """A finished live run's own pace (a child process at a lower priority, as the next run will be)."""
    _run_paces()[change] = (step_s, took, time.time())


def estimate_text(settings: LR.Settings) -> str:
    """How long a live run of `settings` should take on this server: the last finished run's own pace here, when
    recent; else a timing of a few steps now (`measured_pace`). Never a fixed "about a minute" (issue 38 §5: that
    run took 283 s at load 6-11)."""
    got = _run_paces().get(settings.change)
    if got is not None and time.time() - got[2] <= RUN_PACE_FRESH_S:
        return t("about {s} s on this server (the last run here with this change took {took} s, {m} min ago)",
                 s=f"{got[0] * settings.steps:.0f}", took=f"{got[1]:.0f}", m=f"{(time.time() - got[2]) / 60:.0f}")
    p = measured_pace(replace(settings, seed=0))
    return t("about {s} s on this server now (timed just now: {ms} ms a step over {n} steps, {c} ms a checkpoint; "
             "the recorded run took {rec} s on one idle core)", s=f"{p.seconds(settings):.0f}",
             ms=f"{1000 * p.step_s:.0f}", n=p.steps_timed, c=f"{1000 * p.checkpoint_s:.0f}",
             rec=f"{LR.run_meta().get('train_time_s', {}).get('attn2', float('nan')):.0f}")
