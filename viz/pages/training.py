"""Training, live: train a small Transformer inside the app and watch its attention form.

The training runs in a background thread (`model.train.train` with a callback that records
metrics and honours the stop button); a fragment polls it every half second and redraws
the progress bar, the curves and the latest film frame. The shipped checkpoint's own film
strip is shown first, without training anything.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import streamlit as st

from viz import common
from viz import figures_decode as fd

POLL_SECONDS = 0.5
MAX_STEPS = 2000  # in-app training stays small: a shared CPU serves every session
ATTN_KINDS = {"cross_attn": "cross-attention (decoder → encoder)", "self_attn": "decoder self-attention",
              "encoder": "encoder self-attention"}
DEFAULTS = {"steps": 500, "warmup": 100, "d_model": 64, "layers": 2, "heads": 4, "batch": 32}


# ---------------------------------------------------------------- the training job


@st.cache_resource
def training_slot() -> threading.Lock:
    """One in-app training at a time across all sessions (2 CPU cores are shared)."""
    return threading.Lock()


@dataclass
class Job:
    """A training run in a background thread. The thread writes, the page only reads."""

    task: str
    steps: int
    warmup: int
    log: dict = field(default_factory=lambda: {"step": [], "loss": [], "acc": [], "lr": []})
    frames: list = field(default_factory=list)  # (step, Trace) of the probe, as they come
    stop: threading.Event = field(default_factory=threading.Event)
    done: bool = False
    error: str | None = None
    ckpt: object = None
    started: float = field(default_factory=time.monotonic)
    elapsed: float = 0.0

    def snapshot(self) -> dict:
        """The log so far, cut to one length (the thread may be mid-append)."""
        n = min(len(v) for v in self.log.values())
        return {k: v[:n] for k, v in self.log.items()}

    def on_step(self, step: int, m: dict) -> bool:
        for k in self.log:
            self.log[k].append(m[k])
        if "frame" in m:
            self.frames.append((step, m["frame"]))
        self.elapsed = m["elapsed"]
        return not self.stop.is_set()  # False ends training; the checkpoint keeps the steps done


def run_job(job: Job, overrides: dict, batch: int, slot: threading.Lock) -> None:
    from model.train import train  # imported here: the page must draw even if training is unavailable

    try:
        # threads=1: tiny matrices gain nothing from intra-op threads, and spin-waiting threads
        # slow every session down when the cores are busy.
        job.ckpt = train(job.task, overrides, job.steps, batch_size=batch, warmup=job.warmup,
                         film_every=max(1, job.steps // 40), eval_n=100, callback=job.on_step, threads=1)
    except Exception as e:  # noqa: BLE001 - shown on the page instead of dying silently in a thread
        job.error = f"{type(e).__name__}: {e}"
    finally:
        job.done = True
        job.elapsed = time.monotonic() - job.started
        slot.release()


def start_job(task: str, cfg: dict) -> None:
    slot = training_slot()
    if not slot.acquire(blocking=False):
        st.session_state["train_busy"] = True
        return
    st.session_state["train_busy"] = False
    overrides = {"d_model": cfg["d_model"], "n_heads": cfg["heads"], "n_encoder_layers": cfg["layers"],
                 "n_decoder_layers": cfg["layers"], "d_ff": 4 * cfg["d_model"], "dropout": 0.0}
    job = Job(task, cfg["steps"], cfg["warmup"])
    st.session_state["train_job"] = job
    threading.Thread(target=run_job, args=(job, overrides, cfg["batch"], slot), daemon=True,
                     name=f"attention-lab-train-{task}").start()


def stop_job() -> None:
    job = st.session_state.get("train_job")
    if job is not None:
        job.stop.set()


# ---------------------------------------------------------------- film strip


def frame_weights(trace, kind: str, layer: int, head: str) -> np.ndarray:
    """[queries, keys] attention of one frame: one head or the mean over heads."""
    side = "encoder" if kind == "encoder" else "decoder"
    name = f"{side}.layers.{layer}.{'self_attn' if kind != 'cross_attn' else 'cross_attn'}.weights"
    w = trace[name][0].numpy()  # [H, Lq, Lk]
    return w.mean(0) if head == "mean" else w[int(head)]


def frame_axes(trace, kind: str) -> tuple[list[str], list[str], str, str]:
    """Row tokens, column tokens and their axis titles for one attention kind of a film frame.

    Decoder rows are labelled with what each position predicts (the next token), as on the decoder page.
    """
    src, tgt = common.tokens_of(trace, "src"), common.tokens_of(trace, "tgt")
    nxt = [str(t) for t in trace.meta.get("next_tokens") or []]
    nxt = nxt if len(nxt) == len(tgt) else tgt
    return {"cross_attn": (nxt, src, "decoder position (predicts)", "source token"),
            "self_attn": (nxt, tgt, "decoder position (predicts)", "decoder input token"),
            "encoder": (src, src, "source token (query)", "source token (key)")}[kind]


def film_controls(prefix: str, n_layers: int, n_heads: int) -> tuple[str, int, str]:
    """Which attention map the film shows; defaults from the URL for the shipped model's film."""
    heads = ["mean", *map(str, range(n_heads))]
    if prefix == "film":
        q = common.seed_from_query
        q("film_kind", "film_attn", "cross_attn", valid=lambda v: v in ATTN_KINDS)
        q("film_layer", "film_layer", n_layers - 1, int, common.int_in(0, n_layers - 1))
        q("film_head", "film_head", "mean", valid=lambda v: v in heads)
    for key, ok, default in ((f"{prefix}_layer", lambda v: 0 <= v < n_layers, n_layers - 1),
                             (f"{prefix}_head", lambda v: v in heads, "mean")):
        if key in st.session_state and not ok(st.session_state[key]):
            st.session_state[key] = default  # another model may have fewer layers or heads
    c1, c2, c3 = st.columns([2, 1, 1])
    kind = c1.selectbox("Attention", list(ATTN_KINDS), format_func=ATTN_KINDS.get, key=f"{prefix}_kind")
    layer = c2.selectbox("Layer", range(n_layers), index=n_layers - 1, key=f"{prefix}_layer")
    head = c3.selectbox("Head", heads, key=f"{prefix}_head",
                        format_func=lambda h: "mean over heads" if h == "mean" else f"head {h}")
    return kind, layer, head


def show_film(film: list, prefix: str, n_layers: int, n_heads: int, warmup: int | None) -> None:
    """Slider over the saved frames, the chosen frame, a strip of a few frames, and the sharpness curve."""
    if not film:
        st.info("This checkpoint has no film strip (it was trained without film frames).")
        return
    kind, layer, head = film_controls(prefix, n_layers, n_heads)
    steps = [s for s, _ in film]
    key = f"{prefix}_frame"
    if prefix == "film":
        common.seed_from_query(key, "film_frame", steps[-1], int, lambda v: v in steps)
    if st.session_state.get(key) not in steps:
        st.session_state[key] = steps[-1]
    step = st.select_slider("Training step (film frame)", steps, key=key,
                            help="The probe example's attention as saved at this training step.")
    if prefix == "film":
        common.write_query(film_frame=step, film_attn=kind, film_layer=layer, film_head=head)
    trace = dict(film)[step]
    rows, cols, row_title, key_title = frame_axes(trace, kind)
    what = f"{ATTN_KINDS[kind]}, layer {layer}, {'mean over heads' if head == 'mean' else 'head ' + head}"
    weights = [frame_weights(tr, kind, layer, head) for _, tr in film]
    common.show_figure(fd.alignment_figure(weights[steps.index(step)], rows, cols,
                                           title=f"Probe example at training step {step}: {what}",
                                           row_title=row_title, key_title=key_title),
                       key=f"{prefix}_frame_fig", filename=f"{prefix}-step-{step}")
    picks = sorted(set(np.linspace(0, len(film) - 1, min(8, len(film))).round().astype(int)))
    strip = fd.film_strip_figure([(steps[i], weights[i]) for i in picks], rows, cols, current=step)
    common.show_figure(strip, key=f"{prefix}_strip", filename=f"{prefix}-strip")
    uniform = 1.0 / len(cols) if kind != "self_attn" else None
    common.show_figure(fd.sharpness_figure(steps, [fd.alignment_sharpness(w) for w in weights], current=step,
                                           warmup=warmup, uniform=uniform),
                       key=f"{prefix}_sharp", filename=f"{prefix}-sharpness")


# ---------------------------------------------------------------- sections


def shipped_section(sel) -> None:
    ckpt = sel.ckpt
    meta = ckpt.meta
    st.subheader(f"The shipped “{ckpt.name}” model: how it learned")
    probe = meta.get("probe", {})
    acc = meta.get("accuracy")
    facts = [f"{meta.get('steps', '?')} steps", f"warmup {meta.get('warmup', '?')}",
             f"{ckpt.model.num_parameters():,} parameters"]
    if isinstance(acc, float):
        facts.append(f"held-out exact match {acc:.1%}")
    st.markdown(" · ".join(facts) + (f" · probe: `{probe.get('source')}` → `{probe.get('target')}`"
                                     if probe else ""))
    if ckpt.log.get("step"):
        with st.expander("Training curves of the shipped model", expanded=False):
            common.show_figure(fd.training_curves_figure(ckpt.log, meta.get("warmup"),
                                                         title=f"Training curves of “{ckpt.name}”"),
                               key="film_curves",
                               filename=f"{ckpt.name}-training-curves")
    show_film(ckpt.film(), "film", ckpt.cfg.n_decoder_layers, ckpt.cfg.n_heads, meta.get("warmup"))


def train_form(tasks: list[str], default_task: str) -> None:
    with st.form("train_form", border=True):
        c = st.columns(4)
        task = c[0].selectbox("Task", tasks, index=tasks.index(default_task), key="train_task")
        steps = c[1].number_input("Steps", 20, MAX_STEPS, DEFAULTS["steps"], step=50, key="train_steps",
                                  help="About 10–30 steps a second here: the default takes under a minute.")
        warmup = c[2].number_input("Warmup steps", 1, MAX_STEPS, DEFAULTS["warmup"], step=10,
                                   key="train_warmup",
                                   help="Noam: lr rises linearly for this many steps, then decays "
                                        "as 1/√step.")
        batch = c[3].select_slider("Batch size", [16, 32, 64], DEFAULTS["batch"], key="train_batch")
        c = st.columns(4)
        d_model = c[0].select_slider("d_model", [32, 64, 128], DEFAULTS["d_model"], key="train_d",
                                     help="d_ff = 4 d_model.")
        heads = c[1].select_slider("Heads", [1, 2, 4, 8], DEFAULTS["heads"], key="train_heads")
        layers = c[2].select_slider("Layers (encoder = decoder)", [1, 2, 3], DEFAULTS["layers"],
                                    key="train_layers")
        submitted = st.form_submit_button("🏋️ Train", type="primary")
    if submitted:
        start_job(task, {"steps": int(steps), "warmup": int(warmup), "batch": batch, "d_model": d_model,
                         "heads": heads, "layers": layers})


def live_view(job: Job) -> None:
    """Progress, curves and the latest frame; reruns itself every POLL_SECONDS while training."""
    log = job.snapshot()
    n = len(log["step"])
    last = {k: v[-1] for k, v in log.items() if v}
    status = (f"step {n}/{job.steps} · loss {last.get('loss', float('nan')):.3f} · "
              f"token accuracy {last.get('acc', 0):.1%} · lr {last.get('lr', 0):.2e} · {job.elapsed:.0f} s")
    st.progress(min(n / job.steps, 1.0), text=status)
    cols = st.columns([3, 2])
    with cols[0]:
        fig = fd.training_curves_figure(log, job.warmup, job.steps, "Training curves of your run (live)")
        common.show_figure(fig, key="train_curves", filename="training-curves")
    with cols[1]:
        if job.frames:
            step, trace = job.frames[-1]
            rows, cols, row_title, key_title = frame_axes(trace, "cross_attn")
            last_layer = sum(1 for k in trace.names() if k.endswith("cross_attn.weights")) - 1
            w = frame_weights(trace, "cross_attn", last_layer, "mean")
            common.show_figure(fd.alignment_figure(
                w, rows, cols, title=f"Probe at step {step}: cross-attention",
                row_title=row_title, key_title=key_title), key="train_live_frame", filename="live-frame")
    if job.done:
        st.rerun()  # leave polling: the full page shows the result


def result_view(job: Job) -> None:
    if job.error:
        common.show_error(f"Training failed: {job.error}")
        return
    ckpt = job.ckpt
    n = len(job.log["step"])
    stopped = " (stopped early)" if n < job.steps else ""
    acc = ckpt.meta.get("accuracy")
    acc_s = f", held-out exact match {acc:.1%} (100 test pairs, greedy)" if isinstance(acc, float) else ""
    st.success(f"Trained “{job.task}” for {n} steps{stopped} in {job.elapsed:.0f} s{acc_s}.", icon="✅")
    common.show_figure(fd.training_curves_figure(job.log, job.warmup, title="Training curves of your run"),
                       key="train_curves_done",
                       filename="training-curves")
    probe = ckpt.meta.get("probe", {})
    try:
        out = ckpt.translate(probe.get("source", ckpt.example), max_new_tokens=64)
        st.markdown(f"Your model on the probe `{probe.get('source')}`: **`{out.text}`** "
                    f"(expected `{probe.get('target')}`)")
    except ValueError as e:
        common.show_error(e)
    st.markdown("**Film strip of your run**")
    show_film(ckpt.film(), "mine", ckpt.cfg.n_decoder_layers, ckpt.cfg.n_heads, job.warmup)


def main() -> None:
    st.title("Training, live")
    st.caption(
        "Training uses **teacher forcing**: the decoder reads [BOS] + target and predicts target + [EOS] "
        "at every position in one parallel pass (the look-ahead mask hides each position's own answer). "
        "The loss is cross-entropy with label smoothing that ignores [PAD]; Adam (β₂ = 0.98) follows "
        "the **Noam schedule** lr = d_model^−0.5 · min(step^−0.5, step · warmup^−1.5): it rises "
        "linearly during warmup, then decays as 1/√step. The film strip shows a fixed probe example's "
        "attention at saved steps: the alignment appears as warmup ends.")
    sel = common.selection()
    if sel is None:
        st.stop()
    try:
        shipped_section(sel)
    except ValueError as e:  # a checkpoint whose film or log cannot be read
        common.show_error(e)

    st.divider()
    st.subheader("Train your own")
    from model.tasks import TASKS

    tasks = sorted(TASKS)
    task_of_ckpt = sel.ckpt.meta.get("task")
    job: Job | None = st.session_state.get("train_job")
    running = job is not None and not job.done
    if running:
        st.button("⏹ Stop", on_click=stop_job, key="train_stop",
                  help="Ends training after the current step; you keep the model trained so far.")
        st.fragment(run_every=POLL_SECONDS)(live_view)(job)
        return
    train_form(tasks, task_of_ckpt if task_of_ckpt in tasks else "dates")
    if st.session_state.get("train_busy"):
        st.warning("Another session is training a model right now (one at a time on this shared CPU). "
                   "Try again in a minute.", icon="⏳")
    job = st.session_state.get("train_job")
    if job is not None and not job.done:
        st.rerun()  # just started: switch to the live view
    if job is not None:
        result_view(job)


main()
