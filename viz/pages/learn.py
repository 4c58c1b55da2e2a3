"""Watch attention learn (issue 33): induction heads forming during training.

The shipped recorded run (model/toy/checkpoints/learn/run: a 2-layer attention-only model and its 1-layer
control, ~50 log-spaced checkpoints each) opens at once; every number is measured on its checkpoints
(model/toy/learn.py) when the server first needs it, then cached for every session. A step slider (in the URL)
redraws one head's attention on the repeated probe at that step. "Train it yourself" runs the same training
with one change, one run at a time on the server: a background thread (as Training, live has) waits on a child
process that trains (model.toy.learn.train_in_child: its own GIL, one thread, a lower priority, so the other
sessions' clicks do not wait for it); a fragment polls the job and redraws the progress and the curves. Any
checkpoint, shipped or trained, opens on the Attention page or the Language model page with one click
(viz/ui/learn_run.py: it joins the session's model list). A click on a cell of the head map (or `?why=Q,K`,
`?why_vs=J`) opens "Why here?" on it (viz/ui/why_panel.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np
import streamlit as st

from model.toy import learn as LR
from viz.figures import learn as FL
from viz.i18n import N_, current_lang, option_labels, t
from viz.ui import learn_run as LRUN
from viz.ui.heap import training_job
from viz.ui.render import show_error, show_figure
from viz.ui.sidebar import switch_model
from viz.ui.state import seed_from_query, write_query
from viz.ui.why_panel import cell_clicks, render_why

POLL_SECONDS = 0.5
MODEL_LABELS = {"attn2": N_("2 layers"), "attn1": N_("1 layer (control)"), "yours": N_("your run")}
CHANGE_LABELS = {"none": N_("no change (the shipped setup)"), "one_layer": N_("1 layer"),
                 "no_positions": N_("no positional information"), "freeze_layer0": N_("layer 0 frozen"),
                 "one_head": N_("fewer heads (1 per layer)")}
SCORES = {"induction": N_("induction score"), "previous": N_("previous-token score"),
          "prefix": N_("prefix-matching score")}


# ---------------------------------------------------------------- a checkpoint on the other pages

OPEN_PAGES = {"attention": "viz/pages/attention.py", "llm": "viz/pages/llm.py"}
PAGE_KEYS = {  # the widgets those pages seed from their URL: cleared so the link's layer and head take effect
    "attention": ("attn_kind", "attn_layer", "attn_head", "attn_view"),
    "llm": ("llm_view", "llm_layer", "llm_head", "llm_prompt", "llm_stat"),
}
REP_N, REP_SEED = (10, 100), (0, 10_000)  # what the Language model page's ?rep=N:SEED accepts


def open_query(which: str, name: str, run: LR.Run, layer: int, head: int) -> dict:
    """The other page's URL: this checkpoint on the run's repeated probe, at this head. The Language model page
    gets the probe as its ?rep= ids (the same [BOS] + n tokens + the same n, phenomena.induction_sequence), where
    its head overview scores the induction heads on their period; the Attention page as the sidebar's prompt."""
    s = run.settings
    query = {"lang": current_lang(), "checkpoint": name, "layer": layer, "head": head}
    if which == "attention":
        return query | {"text": LR.probe_text(s), "view": "heads"}
    if REP_N[0] <= s.n <= REP_N[1] and REP_SEED[0] <= s.probe_seed <= REP_SEED[1]:
        return query | {"view": "heads", "stat": "induction", "rep": f"{s.n}:{s.probe_seed}"}
    return query | {"view": "heads", "stat": "induction", "prompt": LR.probe_text(s)}


def open_checkpoint(which: str, key: str, run: LR.Run, i: int, layer: int, head: int) -> None:
    """Button callback: the checkpoint joins this session's model list and becomes the sidebar's model, on the
    run's probe (st.switch_page follows in the script)."""
    name = LRUN.add_checkpoint(key, run, i)
    switch_model(name)  # its example is the probe: the sidebar's prompt
    for k in PAGE_KEYS[which]:
        st.session_state.pop(k, None)
    st.session_state["_learn_goto"] = (OPEN_PAGES[which], open_query(which, name, run, layer, head))


def open_buttons(key: str, run: LR.Run, i: int, layer: int, head: int) -> None:
    step = run.steps[i]
    labels = {"attention": t("Open step {step} on the Attention page", step=step),
              "llm": t("Open step {step} in the Language model page's head overview", step=step)}
    cols = st.columns(len(labels))
    for col, (which, label) in zip(cols, labels.items(), strict=True):
        if col.button(label, key=f"learn_open_{which}", on_click=open_checkpoint,
                      args=(which, key, run, i, layer, head), icon=":material/open_in_new:"):
            page, query = st.session_state.pop("_learn_goto")
            st.switch_page(page, query_params=query)
    st.caption(t("The checkpoint joins the sidebar's model list for this session as “{name}”, on the repeated probe "
                 "(its prompt is token ids): every page reads it.", name=LRUN.model_name(key, run, i)))


def your_run() -> LR.Run | None:
    """This session's finished run, when it measured at least one checkpoint."""
    job = st.session_state.get("learn_job")
    if job is None or not job.done or job.error or job.run is None or not job.run.scores:
        return None
    return job.run


# ---------------------------------------------------------------- train it yourself


@st.cache_resource
def learn_slot() -> threading.Lock:
    """One /learn training at a time across all sessions (2 CPU cores are shared)."""
    return threading.Lock()


@dataclass
class LearnJob:
    settings: LR.Settings
    run: LR.Run | None = None
    step: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    done: bool = False
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    elapsed: float = 0.0
    phase_seconds: float | None = None  # wall time when the induction score first passed 0.5

    def on_event(self, run: LR.Run, kind: str) -> bool:
        self.run = run
        self.step = len(run.loss)
        self.elapsed = time.monotonic() - self.started
        if kind == "checkpoint" and self.phase_seconds is None and run.scores \
                and run.scores[-1].induction[-1].max() > 0.5:
            self.phase_seconds = self.elapsed
        return not self.stop.is_set()


def run_learn_job(job: LearnJob, slot: threading.Lock) -> None:
    with training_job(job, slot):
        LR.train_in_child(job.settings, callback=job.on_event)  # own process: no GIL or core taken from sessions


def start_learn_job(settings: LR.Settings) -> None:
    slot = learn_slot()
    if not slot.acquire(blocking=False):
        st.session_state["learn_busy"] = True
        return
    st.session_state["learn_busy"] = False
    job = LearnJob(settings)
    st.session_state["learn_job"] = job
    threading.Thread(target=run_learn_job, args=(job, slot), daemon=True, name="attention-lab-learn").start()


def job_figure(job: LearnJob, base: LR.Run):
    return LRUN.comparison_figure(job.run, job.settings, base)


def job_text(job: LearnJob) -> str:
    return LRUN.status_text(job.step, job.settings.steps, job.run, job.elapsed)


def live_view(job: LearnJob, base: LR.Run) -> None:
    st.progress(min(job.step / job.settings.steps, 1.0), text=job_text(job))
    show_figure(job_figure(job, base), key="learn_live_curves", filename="learn-live")
    if job.done:
        if not job.error and job.step:  # this server's pace, for the next run's estimate
            LRUN.record_pace(job.settings.change, job.elapsed / job.step, job.elapsed)
        if (run := your_run()) is not None:  # before the rerun draws the sidebar: its model list has it
            LRUN.add_checkpoint("yours", run, len(run.steps) - 1)
        st.rerun()


def train_section(base: LR.Run) -> None:
    st.subheader(t("Train it yourself"))
    job: LearnJob | None = st.session_state.get("learn_job")
    if job is not None and not job.done:
        st.caption(t("The shipped setup with one change at a time, from a seed of your choice. One run at a time on "
                     "this server."))
        st.button(t("⏹ Stop"), on_click=job.stop.set, key="learn_stop")
        st.fragment(run_every=POLL_SECONDS)(live_view)(job, base)
        return
    seed_from_query("learn_change", "change", "none", str, lambda v: v in LR.CHANGES)
    seed_from_query("learn_seed", "seed", 0, int, lambda v: isinstance(v, int) and 0 <= v <= 9999)
    chosen = replace(base.settings, change=st.session_state["learn_change"])
    try:
        with st.spinner(t("Timing a few training steps on this server…")):
            estimate = LRUN.estimate_text(chosen)
    except (RuntimeError, ValueError) as e:  # the estimate is a courtesy: the run itself still works
        estimate = t("its time could not be measured here ({error})", error=e)
    st.caption(t("The shipped setup with one change at a time, from a seed of your choice: {estimate}. One run at a "
                 "time on this server.", estimate=estimate))
    with st.form("learn_form", border=True):
        c = st.columns([3, 1])
        change = c[0].radio(t("One change"), list(LR.CHANGES), key="learn_change", horizontal=True,
                            format_func=option_labels(LR.CHANGES, lambda k: t(CHANGE_LABELS[k])))
        seed = c[1].number_input(t("Seed"), 0, 9999, key="learn_seed")
        submitted = st.form_submit_button(t("🏋️ Train"), type="primary")
    write_query(change=change, seed=int(seed))
    if submitted:
        start_learn_job(replace(base.settings, seed=int(seed), change=change))
        if st.session_state.get("learn_job") is not None and not st.session_state["learn_job"].done:
            st.rerun()
    if st.session_state.get("learn_busy"):
        st.warning(t("Another session is training a model right now (one at a time on this shared CPU). "
                     "Try again in a minute."), icon="⏳")
    if job is not None and job.done:
        if job.error:
            show_error(t("Training failed: {error}", error=job.error))
            return
        run = job.run
        phase = LR.phase_change(run.steps, run.series("icl"))
        best = float(max(s.induction[-1].max() for s in run.scores))
        st.success(t("Your run ({change}, seed {seed}): {n} steps in {s} s; best last-layer induction score {ind}; "
                     "phase change: {phase}.", change=t(CHANGE_LABELS[job.settings.change]),
                     seed=job.settings.seed, n=len(run.loss), s=f"{job.elapsed:.0f}", ind=FL.fmt(best),
                     phase=phase if phase is not None else t("none")), icon="✅")
        show_figure(job_figure(job, base), key="learn_done_curves", filename="learn-yours")
        name = LRUN.add_checkpoint("yours", run, len(run.steps) - 1)
        st.caption(t("Your run's last checkpoint is in the sidebar's model list as “{name}”, on every page, for the "
                     "rest of this session; “{mine}” above opens any of its checkpoints.", name=name,
                     mine=t(MODEL_LABELS["yours"])))


# ---------------------------------------------------------------- the page


def why_here(name: str, run: LR.Run, i: int, layer: int, head: int, tokens: list[str]) -> None:
    """"Why here?" on the head map: a click on a cell (or the panel's inputs) splits that cell's score at this
    checkpoint into what built its query and its key (the data-dependent composition, beside the weight-based
    K-composition below). This session's own run is traced per session (kept for its last checkpoint)."""
    cell_clicks("learn", "learn_map", len(tokens), len(tokens))
    if name in LRUN.shipped()[0]:
        model, trace = LRUN.shipped_why_trace(name, i)
    else:
        held = st.session_state.get("_learn_why")
        if held is None or held[0] is not run or held[1] != i:
            held = st.session_state["_learn_why"] = (run, i, *LRUN.why_trace(run, i))
        model, trace = held[2:]
    render_why(model, trace, f"decoder.layers.{layer}.self_attn", layer, head, tokens, key="learn")


def main() -> None:
    st.title(t("Watch attention learn"))
    st.caption(t(
        "A 2-layer attention-only Transformer learns to copy from its context. Each training sequence has its "
        "own random rule (which token follows which), so the only way to predict well is to find the earlier "
        "occurrence of the current token and copy what came after it: an **induction head** (Olsson et al. 2022). "
        "It needs two layers: a layer-0 head that looks at the previous token, and a layer-1 head whose keys "
        "read that head's output (K-composition, Elhage et al. 2021). It appears suddenly, as a phase change; "
        "the 1-layer control never gets it."))
    try:
        with st.spinner(t("Measuring the recorded checkpoints (once per server)…")):
            runs, meta, sm = LRUN.shipped()
    except (OSError, ValueError, KeyError) as e:
        show_error(t("The recorded run cannot be read: {error}", error=e))
        st.stop()
    two = runs["attn2"]
    st.info(FL.sentence(sm), icon="📈")
    st.caption(t("Phase change rule: {rule}. Command: `{cmd}` (seed {seed}).", rule=t(
        "the checkpoint where the in-context loss falls most steeply against log(step)"), cmd=meta.get("command"),
        seed=meta.get("seed")))
    show_figure(FL.curves_figure({k: {"label": t(MODEL_LABELS[k]), "loss": r.loss, "steps": r.steps,
                                      "icl": r.series("icl")} for k, r in runs.items()}, sm.step,
                                 total_steps=two.steps[-1]), key="learn_curves", filename="learn-curves")

    # ---- the step slider and one head's attention (the shipped runs, and this session's finished run)
    st.subheader(t("One head at one step"))
    viewed = dict(runs)
    if (mine := your_run()) is not None:
        viewed["yours"] = mine
    seed_from_query("learn_model", "lmodel", "attn2", str, lambda v: v in viewed)
    if st.session_state["learn_model"] not in viewed:  # a run of this session that is gone (a new one started)
        st.session_state["learn_model"] = "attn2"
    name = st.radio(t("Model"), list(viewed), key="learn_model", horizontal=True,
                    format_func=option_labels(list(viewed), lambda k: t(MODEL_LABELS[k])))
    run = viewed[name]
    heads = [f"{la}.{h}" for la in range(run.settings.layers) for h in range(run.settings.heads)]
    default_head = f"{sm.layer}.{sm.head}" if f"{sm.layer}.{sm.head}" in heads else heads[-1]
    seed_from_query("learn_head", "lhead", default_head, str, lambda v: v in heads)
    if st.session_state["learn_head"] not in heads:  # another model has fewer layers or heads
        st.session_state["learn_head"] = default_head
    default_step = sm.step if sm.step in run.steps else run.steps[-1]
    seed_from_query("learn_step", "step", default_step, int, lambda v: v in run.steps)
    if st.session_state["learn_step"] not in run.steps:  # a run stopped early has fewer checkpoints
        st.session_state["learn_step"] = min(run.steps, key=lambda x: abs(x - st.session_state["learn_step"]))
    c = st.columns([1, 4])
    head = c[0].selectbox(t("Head (layer.head)"), heads, key="learn_head")
    step = c[1].select_slider(t("Training step"), run.steps, key="learn_step")
    write_query(lmodel=name, lhead=head, step=int(step))
    layer, h = map(int, head.split("."))
    i = run.steps.index(step)
    w, ids = LRUN.attention_at(name, i, layer, h) if name in runs else LRUN.head_map(run, i, layer, h)
    sc = run.scores[i]
    cols = st.columns([3, 2])
    with cols[0]:
        show_figure(FL.attention_step_figure(w, [str(x) for x in ids], run.settings.n, t(
            "Head {head} at step {step}: attention on the repeated probe", head=head, step=step)),
            key="learn_map", filename=f"learn-{name}-{head}-step{step}")
    with cols[1]:
        st.metric(t("induction score"), FL.fmt(sc.induction[layer, h]))
        st.metric(t("previous-token score"), FL.fmt(sc.previous[layer, h]))
        st.metric(t("prefix-matching score"), FL.fmt(sc.prefix[layer, h]))
        st.metric(t("in-context loss"), FL.fmt(sc.icl))
        st.caption(t("Probe: [BOS] + {n} random tokens + the same {n} again. The red squares mark the induction "
                     "stripe: each token of the second copy looking at the token after its first occurrence.",
                     n=run.settings.n))
    open_buttons(name, run, i, layer, h)
    why_here(name, run, i, layer, h, [str(x) for x in ids])

    # ---- per-head scores over steps
    st.subheader(t("Every head over training"))
    st.caption(t(
        "Induction score: mean attention from each token of the second copy to the token after its earlier "
        "occurrence (Olsson et al. 2022; the same function as the Attention phenomena page). Previous-token "
        "score: attention from i to i − 1. Prefix-matching score: attention on the token after every earlier "
        "copy of the current token, on plain random tokens (repeats by chance)."))
    tabs = st.tabs([t(v) for v in SCORES.values()])
    for tab, key in zip(tabs, SCORES, strict=True):
        with tab:
            for k, r in runs.items():
                z = r.heads(key)  # the array summary() names its head from (one claim, one number)
                show_figure(FL.head_steps_figure(r.steps, z, t(SCORES[key]), sm.step if k == "attn2" else None,
                                                 t("{what}: {model}", what=t(SCORES[key]), model=t(MODEL_LABELS[k]))),
                            key=f"learn_heads_{key}_{k}", filename=f"learn-{key}-{k}")

    # ---- K-composition
    st.subheader(t("K-composition"))
    if sm.prev_head is not None:
        kc = np.stack([s.kcomp for s in two.scores])  # [C, H0, H1]
        pair = kc[:, sm.prev_head, sm.head]
        mask = np.ones(kc.shape[1:], dtype=bool)
        mask[sm.prev_head, sm.head] = False
        others = kc[:, mask].mean(axis=1)
        show_figure(FL.kcomp_figure(two.steps, pair, others, t("head 0.{g} → head 1.{h}", g=sm.prev_head, h=sm.head),
                                    sm.step), key="learn_kcomp", filename="learn-kcomp")
        st.caption(t(
            "How much head 1.{h}'s keys read what head 0.{g} (the strongest previous-token head at the end) writes: "
            "‖W_QK W_OVᵀ‖ / (‖W_QK‖ ‖W_OV‖) (Elhage et al. 2021), layer 1's LayerNorm gain folded in, positions left "
            "out. At step {s}: {a}; at the end: {b}; the other pairs' mean at the end: {c}.", h=sm.head,
            g=sm.prev_head, s=sm.step, a=FL.fmt(pair[two.steps.index(sm.step)] if sm.step in two.steps else pair[-1]),
            b=FL.fmt(pair[-1]), c=FL.fmt(others[-1])))

    st.divider()
    train_section(two)


main()
