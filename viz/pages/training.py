"""Training, live: train a small Transformer inside the app and watch its attention form.

The training runs in a background thread (`model.train.train` with a callback that records
metrics and honours the stop button); a fragment polls it every half second and redraws
the progress bar, the curves and the latest film frame. The shipped checkpoint's own film
strip is shown first, without training anything. A finished run joins the session's models
(`st.session_state["session_models"]`), which the sidebar offers on every page.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import streamlit as st

from viz.figures import decode as fd
from viz.i18n import N_, option_labels, t
from viz.ui.heap import training_job
from viz.ui.models import add_session_model, is_real_model
from viz.ui.render import safe_filename, show_error, show_figure, tokens_of
from viz.ui.sidebar import selection
from viz.ui.state import int_in, seed_from_query, write_query

POLL_SECONDS = 0.5
MAX_STEPS = 2000  # in-app training stays small: a shared CPU serves every session
LEARNED = 0.5  # held-out exact match from which a run counts as having learned its task
ATTN_KINDS = {"cross_attn": N_("cross-attention (decoder → encoder)"), "self_attn": N_("decoder self-attention"),
              "encoder": N_("encoder self-attention")}
DEFAULTS = {"steps": 500, "warmup": 100, "d_model": 64, "layers": 2, "heads": 4, "batch": 32}
CHOICES = {"batch": [16, 32, 64], "d_model": [32, 64, 128], "heads": [1, 2, 4, 8], "layers": [1, 2, 3]}
FORM = {  # form setting -> (widget key, URL parameter)
    "steps": ("train_steps", "train_steps"), "warmup": ("train_warmup", "train_warmup"),
    "batch": ("train_batch", "train_batch"), "d_model": ("train_d", "train_d"),
    "heads": ("train_heads", "train_heads"), "layers": ("train_layers", "train_layers"),
}


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
    finished: threading.Event = field(default_factory=threading.Event)  # set once done (tests wait on it)
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

    @property
    def steps_done(self) -> int:
        return len(self.log["step"])

    @property
    def model_name(self) -> str:
        """The name the sidebar offers the trained model under (stable: not translated)."""
        return f"trained: {self.task} (step {self.steps_done})"


def run_job(job: Job, overrides: dict, batch: int, slot: threading.Lock) -> None:
    from model.toy.train import train  # imported here: the page must draw even if training is unavailable

    with training_job(job, slot):
        job.ckpt = train(job.task, overrides, job.steps, batch_size=batch, warmup=job.warmup,
                         film_every=max(1, job.steps // 40), eval_n=100, callback=job.on_step)


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


def register(job: Job) -> str:
    """Offer the trained model in the sidebar's model selector for the rest of the session."""
    add_session_model(job.model_name, job.ckpt)
    return job.model_name


# ---------------------------------------------------------------- film strip


def frame_weights(trace, kind: str, layer: int, head: str) -> np.ndarray:
    """[queries, keys] attention of one frame: one head or the mean over heads."""
    side = "encoder" if kind == "encoder" else "decoder"
    name = f"{side}.layers.{layer}.{'self_attn' if kind != 'cross_attn' else 'cross_attn'}.weights"
    w = trace[name][0].numpy()  # [H, Lq, Lk]
    return w.mean(0) if head == "mean" else w[int(head)]


def frame_axes(trace, kind: str) -> tuple[list[str], list[str], str, str]:
    """Row names, column tokens and their axis titles for one attention kind of a film frame.

    A decoder row is labelled "input → predicted" (`fd.step_labels`), the convention of every page.
    """
    src, tgt = tokens_of(trace, "src"), tokens_of(trace, "tgt")
    rows = fd.step_labels(tgt, [str(x) for x in trace.meta.get("next_tokens") or []])
    dec = t("decoder position (input → predicted)")
    return {"cross_attn": (rows, src, dec, t("source token")),
            "self_attn": (rows, tgt, dec, t("decoder input token")),
            "encoder": (fd.labels(src), src, t("source token (query)"), t("source token (key)"))}[kind]


def head_name(h: str) -> str:
    return t("mean over heads") if h == "mean" else t("head {h}", h=h)


def film_controls(prefix: str, n_layers: int, n_heads: int) -> tuple[str, int, str]:
    """Which attention map the film shows; defaults from the URL for the shipped model's film."""
    heads = ["mean", *map(str, range(n_heads))]
    if prefix == "film":
        q = seed_from_query
        q("film_kind", "film_attn", "cross_attn", valid=lambda v: v in ATTN_KINDS)
        q("film_layer", "film_layer", n_layers - 1, int, int_in(0, n_layers - 1))
        q("film_head", "film_head", "mean", valid=lambda v: v in heads)
    for key, ok, default in ((f"{prefix}_layer", lambda v: 0 <= v < n_layers, n_layers - 1),
                             (f"{prefix}_head", lambda v: v in heads, "mean")):
        if key in st.session_state and not ok(st.session_state[key]):
            st.session_state[key] = default  # another model may have fewer layers or heads
    c1, c2, c3 = st.columns([2, 1, 1])
    kind = c1.selectbox(t("Attention"), list(ATTN_KINDS),
                        format_func=option_labels(ATTN_KINDS, lambda k: t(ATTN_KINDS[k])),
                        key=f"{prefix}_kind")
    layer = c2.selectbox(t("Layer"), range(n_layers), index=n_layers - 1, key=f"{prefix}_layer")
    head = c3.selectbox(t("Head"), heads, key=f"{prefix}_head", format_func=option_labels(heads, head_name))
    return kind, layer, head


def show_film(film: list, prefix: str, n_layers: int, n_heads: int, warmup: int | None) -> None:
    """Slider over the saved frames, the chosen frame, a strip of a few frames, and the sharpness curve."""
    if not film:
        st.info(t("This checkpoint has no film strip (it was trained without film frames)."))
        return
    kind, layer, head = film_controls(prefix, n_layers, n_heads)
    steps = [s for s, _ in film]
    key = f"{prefix}_frame"
    if prefix == "film":
        seed_from_query(key, "film_frame", steps[-1], int, lambda v: v in steps)
    if st.session_state.get(key) not in steps:
        st.session_state[key] = steps[-1]
    step = st.select_slider(t("Training step (film frame)"), steps, key=key,
                            help=t("The probe example's attention as saved at this training step."))
    if prefix == "film":
        write_query(film_frame=step, film_attn=kind, film_layer=layer, film_head=head)
    trace = dict(film)[step]
    rows, cols, row_title, key_title = frame_axes(trace, kind)
    what = t("{kind}, layer {layer}, {head}", kind=t(ATTN_KINDS[kind]), layer=layer, head=head_name(head))
    weights = [frame_weights(tr, kind, layer, head) for _, tr in film]
    show_figure(fd.alignment_figure(weights[steps.index(step)], rows, cols,
                                           title=t("Probe example at training step {step}: {what}",
                                                   step=step, what=what),
                                           row_title=row_title, key_title=key_title),
                       key=f"{prefix}_frame_fig", filename=f"{prefix}-step-{step}")
    picks = sorted(set(np.linspace(0, len(film) - 1, min(8, len(film))).round().astype(int)))
    strip = fd.film_strip_figure([(steps[i], weights[i]) for i in picks], rows, cols, current=step, what=what)
    show_figure(strip, key=f"{prefix}_strip", filename=f"{prefix}-strip")
    uniform = 1.0 / len(cols) if kind != "self_attn" else None
    show_figure(fd.sharpness_figure(steps, [fd.alignment_sharpness(w) for w in weights], current=step,
                                           warmup=warmup, uniform=uniform),
                       key=f"{prefix}_sharp", filename=f"{prefix}-sharpness")


# ---------------------------------------------------------------- your model as a file
# A trained model lives only in its session (and its server's memory): a closed tab, a restart, a
# replica that dies mid-class (deploy/) lose it. So it is offered as one file, and the file brings it back.

MODEL_REFUSALS = {  # CheckpointFileError.kind -> what the file is, in the user's words
    "empty": N_("“{name}” is empty (0 bytes): it is not a model file."),
    "pickle": N_("“{name}” is a Python pickle, not a model file of this app. A pickle can run code when it is "
                 "opened, so this app never opens one."),
    "zip": N_("“{name}” is a zip archive (the format of torch.save), not a model file of this app. Pickled "
              "tensors can run code when they are opened, so this app never opens them."),
    "foreign": N_("“{name}” is a safetensors file but not a model downloaded from this page (a trace, or "
                  "another program's weights?)."),
    "too_many_names": N_("“{name}” holds far more tensors than a model trained here: it is not one."),
}
UPLOADED = "uploaded: "  # sidebar name prefix of a model brought back from a file (stable: not translated)


def model_file(ckpt) -> bytes:
    """The checkpoint as one .safetensors file (weights, film strip, config, tokenizers, meta and log)."""
    from model.toy.checkpoint import save_checkpoint_file

    with tempfile.TemporaryDirectory() as d:
        return save_checkpoint_file(ckpt, Path(d) / "model.safetensors").read_bytes()


def download_model(ckpt, name: str) -> None:
    file_name = f"{safe_filename(name)}.safetensors"
    # Deferred: the file is only written when the button is clicked.
    st.download_button(t("Download your model (.safetensors)"), data=lambda: model_file(ckpt), file_name=file_name,
                       mime="application/octet-stream", key="train_download", on_click="ignore", icon="⬇️")
    st.caption(t("Your model lives only in this session: closing the tab or a server restart loses it. The file "
                 "(safetensors with JSON metadata, never a pickle) brings it back: upload it below, or in Python "
                 "`load_checkpoint(\"{file}\")`.", file=file_name))


def read_model_upload(upload):
    """(name, Checkpoint) for an uploaded model file, else the refusal in the UI language; parsed once per
    file and kept in this session only."""
    from model.toy.checkpoint import CheckpointError, CheckpointFileError, load_checkpoint_file

    data = upload.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    cached = st.session_state.get("train_loaded")
    if cached and cached[0] == digest:
        return cached[1]
    try:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "model.safetensors"  # a fixed name: an upload's name is not a safe path
            path.write_bytes(data)
            ckpt = load_checkpoint_file(path, label=upload.name)
        ckpt.model.eval()
        result = (UPLOADED + safe_filename(Path(upload.name).stem)[:60], ckpt)
    except CheckpointFileError as e:
        result = (t(MODEL_REFUSALS[e.kind], name=upload.name) if e.kind in MODEL_REFUSALS
                  else t("“{name}” is not a usable model file: {error}", name=upload.name, error=e))
    except (CheckpointError, ValueError, OSError, RuntimeError) as e:
        result = t("“{name}” could not be read as a model file: {error}", name=upload.name, error=e)
    st.session_state["train_loaded"] = (digest, result)
    return result


def upload_section() -> None:
    st.subheader(t("Bring back a model you downloaded"))
    upload = st.file_uploader(t("Model file (.safetensors)"), type=["safetensors"], key="train_upload",
                              help=t("A file from “Download your model” on this page."))
    if upload is None:
        return
    result = read_model_upload(upload)
    if isinstance(result, str):
        show_error(result, t("Upload a .safetensors model file downloaded from this page."))
        return
    name, ckpt = result
    models = st.session_state.setdefault("session_models", {})
    if models.get(name) is not ckpt:
        models[name] = ckpt
        st.rerun()  # the sidebar was drawn before this page: run again so its model list has it
    st.success(t("“{name}” is back: pick it in the sidebar's model selector, on every page, for the rest of this "
                 "session.", name=name), icon="✅")


# ---------------------------------------------------------------- sections


def shipped_section(sel) -> None:
    ckpt = sel.ckpt
    meta = ckpt.meta
    st.subheader(t("The shipped “{name}” model: how it learned", name=ckpt.name))
    probe = meta.get("probe", {})
    acc = meta.get("accuracy")
    facts = [t("{n} steps", n=meta.get("steps", "?")), t("warmup {n}", n=meta.get("warmup", "?")),
             t("{n} parameters", n=f"{ckpt.model.num_parameters():,}")]
    if isinstance(acc, float):
        facts.append(t("held-out exact match {acc}", acc=f"{acc:.1%}"))
    if probe:
        facts.append(t("probe: `{source}` → `{target}`", source=probe.get("source"), target=probe.get("target")))
    st.markdown(" · ".join(facts))
    if ckpt.log.get("step"):
        with st.expander(t("Training curves of the shipped model"), expanded=False):
            show_figure(fd.training_curves_figure(ckpt.log, meta.get("warmup"),
                                                         title=t("Training curves of “{name}”", name=ckpt.name)),
                               key="film_curves", filename=f"{ckpt.name}-training-curves")
    show_film(ckpt.film(), "film", ckpt.cfg.n_decoder_layers, ckpt.cfg.n_heads, meta.get("warmup"))


def seed_form(tasks: list[str], default_task: str) -> None:
    """The form's starting values from the URL (a shared link reopens the same training setup)."""
    q = seed_from_query
    q("train_task", "train_task", default_task, valid=lambda v: v in tasks)
    q("train_steps", "train_steps", DEFAULTS["steps"], int, int_in(20, MAX_STEPS))
    q("train_warmup", "train_warmup", DEFAULTS["warmup"], int, int_in(1, MAX_STEPS))
    for name in ("batch", "d_model", "heads", "layers"):
        key, param = FORM[name]
        q(key, param, DEFAULTS[name], int, lambda v, ok=CHOICES[name]: v in ok)


def train_form(tasks: list[str], default_task: str) -> None:
    seed_form(tasks, default_task)
    with st.form("train_form", border=True):
        c = st.columns(4)
        task = c[0].selectbox(t("Task"), tasks, key="train_task")
        steps = c[1].number_input(t("Steps"), 20, MAX_STEPS, step=50, key="train_steps",
                                  help=t("About 10–30 steps a second here: the default takes under a minute."))
        warmup = c[2].number_input(t("Warmup steps"), 1, MAX_STEPS, step=10, key="train_warmup",
                                   help=t("Noam: lr rises linearly for this many steps, then decays as 1/√step."))
        batch = c[3].select_slider(t("Batch size"), CHOICES["batch"], key="train_batch")
        c = st.columns(4)
        d_model = c[0].select_slider("d_model", CHOICES["d_model"], key="train_d", help=t("d_ff = 4 d_model."))
        heads = c[1].select_slider(t("Heads"), CHOICES["heads"], key="train_heads")
        layers = c[2].select_slider(t("Layers (encoder = decoder)"), CHOICES["layers"], key="train_layers")
        submitted = st.form_submit_button(t("🏋️ Train"), type="primary")
    cfg = {"steps": int(steps), "warmup": int(warmup), "batch": batch, "d_model": d_model, "heads": heads,
           "layers": layers}
    write_query(train_task=task, **{FORM[k][1]: v for k, v in cfg.items()})
    if submitted:
        start_job(task, cfg)


def progress_text(job: Job, log: dict) -> str:
    n = len(log["step"])
    if not n:  # no step finished yet: there is no loss to show
        return t("step 0/{total} · starting…", total=job.steps)
    return t("step {n}/{total} · loss {loss} · token accuracy {acc} · lr {lr} · {s} s", n=n, total=job.steps,
             loss=f"{log['loss'][-1]:.3f}", acc=f"{log['acc'][-1]:.1%}", lr=f"{log['lr'][-1]:.2e}",
             s=f"{job.elapsed:.0f}")


def live_view(job: Job) -> None:
    """Progress, curves and the latest frame; reruns itself every POLL_SECONDS while training."""
    log = job.snapshot()
    st.progress(min(len(log["step"]) / job.steps, 1.0), text=progress_text(job, log))
    cols = st.columns([3, 2])
    with cols[0]:
        fig = fd.training_curves_figure(log, job.warmup, job.steps, t("Training curves of your run (live)"))
        show_figure(fig, key="train_curves", filename="training-curves")
    with cols[1]:
        if job.frames:
            step, trace = job.frames[-1]
            rows, keys, row_title, key_title = frame_axes(trace, "cross_attn")
            last_layer = sum(1 for k in trace.names() if k.endswith("cross_attn.weights")) - 1
            w = frame_weights(trace, "cross_attn", last_layer, "mean")
            show_figure(fd.alignment_figure(
                w, rows, keys, title=t("Probe at step {step}: cross-attention", step=step),
                row_title=row_title, key_title=key_title), key="train_live_frame", filename="live-frame")
    if job.done:
        st.rerun()  # leave polling: the full page shows the result


def outcome(job: Job, acc: float | None) -> None:
    """What happened, honestly: a green tick only for a run that finished and learned its task."""
    n = job.steps_done
    acc_s = t(", held-out exact match {acc} (100 test pairs, greedy)", acc=f"{acc:.1%}") if acc is not None else ""
    if n < job.steps:
        st.info(t("Stopped after {n} of {total} steps ({s} s){acc}.", n=n, total=job.steps,
                  s=f"{job.elapsed:.0f}", acc=acc_s), icon="⏹")
    elif acc is not None and acc < LEARNED:
        st.warning(t("Trained “{task}” for {n} steps in {s} s{acc}: it has not learned the task yet. "
                     "Train longer, or with a larger model.", task=job.task, n=n, s=f"{job.elapsed:.0f}",
                     acc=acc_s), icon="⚠️")
    else:
        st.success(t("Trained “{task}” for {n} steps in {s} s{acc}.", task=job.task, n=n, s=f"{job.elapsed:.0f}",
                     acc=acc_s), icon="✅")


def result_view(job: Job) -> None:
    if job.error:
        show_error(t("Training failed: {error}", error=job.error))
        return
    ckpt = job.ckpt
    acc = ckpt.meta.get("accuracy")
    outcome(job, acc if isinstance(acc, float) else None)
    name = register(job)
    st.caption(t("Your model is now in the sidebar's model selector as “{name}”, on every page, for the rest "
                 "of this session.", name=name))
    download_model(ckpt, name)
    show_figure(fd.training_curves_figure(job.log, job.warmup, title=t("Training curves of your run")),
                       key="train_curves_done", filename="training-curves")
    probe = ckpt.meta.get("probe") or {}
    if probe.get("source"):
        try:
            out = ckpt.translate(probe["source"])
            st.markdown(t("Your model on the probe `{source}`: **`{output}`** (expected `{target}`)",
                          source=probe["source"], output=out.text, target=probe.get("target")))
        except ValueError as e:
            show_error(e)
    st.markdown(t("**Film strip of your run**"))
    show_film(ckpt.film(), "mine", ckpt.cfg.n_decoder_layers, ckpt.cfg.n_heads, job.warmup)


def main() -> None:
    st.title(t("Training, live"))
    st.caption(t(
        "Training uses **teacher forcing**: the decoder reads [BOS] + target and predicts target + [EOS] "
        "at every position in one parallel pass (the look-ahead mask hides each position's own answer). "
        "The loss is cross-entropy with label smoothing that ignores [PAD]; Adam (β₂ = 0.98) follows "
        "the **Noam schedule** lr = d_model^−0.5 · min(step^−0.5, step · warmup^−1.5): it rises "
        "linearly during warmup, then decays as 1/√step. The film strip shows a fixed probe example's "
        "attention at saved steps: the alignment appears as warmup ends."))
    sel = selection()
    if sel is None:
        st.stop()
    try:
        if not is_real_model(sel):  # a pretrained model was not trained here: no film, no log
            shipped_section(sel)
    except ValueError as e:  # a checkpoint whose film or log cannot be read
        show_error(e)

    st.divider()
    st.subheader(t("Train your own"))
    from model.toy.tasks import TASKS

    tasks = sorted(TASKS)
    task_of_ckpt = sel.ckpt.meta.get("task")
    job: Job | None = st.session_state.get("train_job")
    if job is not None and not job.done:
        st.button(t("⏹ Stop"), on_click=stop_job, key="train_stop",
                  help=t("Ends training after the current step; you keep the model trained so far."))
        st.fragment(run_every=POLL_SECONDS)(live_view)(job)
        upload_section()
        return
    train_form(tasks, task_of_ckpt if task_of_ckpt in tasks else "dates")
    if st.session_state.get("train_busy"):
        st.warning(t("Another session is training a model right now (one at a time on this shared CPU). "
                     "Try again in a minute."), icon="⏳")
    job = st.session_state.get("train_job")
    if job is not None and not job.done:
        st.rerun()  # just started: switch to the live view
    if job is not None:
        result_view(job)
    st.divider()
    upload_section()


main()
