"""Learning-rate schedule: the Noam warmup curve, its presets, and what a shipped model really used."""

import streamlit as st

from model import noam_lr
from viz.figures import attention as F
from viz.i18n import t
from viz.ui.models import is_real_model
from viz.ui.render import show_figure
from viz.ui.sidebar import selection
from viz.ui.state import int_in, seed_from_query, write_query

D_MODELS = [32, 64, 128, 256, 512, 768, 1024, 2048]

st.title(t("Learning-rate schedule"))
st.caption(t(
    "The paper trains with Adam and the Noam schedule: lrate = factor · d_model^(−1/2) · min(step^(−1/2), "
    "step · warmup_steps^(−3/2)). For the first warmup_steps steps the rate grows linearly (a post-LN "
    "Transformer's early gradients are unreliable, so it starts gently), it peaks at step = warmup_steps, "
    "then decays as 1/√step. A larger d_model means a smaller rate everywhere."))


def schedule_of(meta: dict) -> dict:
    """The schedule a checkpoint was trained with, from its metadata (keys vary: look around)."""
    found: dict = {}
    for scope in (meta, *(v for v in meta.values() if isinstance(v, dict))):
        for k, v in scope.items():
            if k in ("warmup", "warmup_steps") and isinstance(v, int | float):
                found.setdefault("warmup", int(v))
            elif k in ("lr_factor", "factor", "noam_factor") and isinstance(v, int | float):
                found.setdefault("factor", float(v))
    return found


sel = selection()
sel = None if is_real_model(sel) else sel  # a pretrained model has no training log here: the schedule alone
ckpt = sel.ckpt if sel else None
trained = schedule_of(ckpt.meta) if ckpt else {}

seed_from_query("sch_d", "d_model", 512, int, lambda v: v in D_MODELS)
seed_from_query("sch_w", "warmup", 4000, int, int_in(1, 20000))
seed_from_query("sch_f", "factor", 1.0, float, lambda v: 0.05 <= v <= 10)


def _match_checkpoint() -> None:
    st.session_state["sch_d"] = min(D_MODELS, key=lambda d: abs(d - ckpt.cfg.d_model))
    st.session_state["sch_w"] = trained.get("warmup", st.session_state["sch_w"])
    st.session_state["sch_f"] = trained.get("factor", 1.0)


c1, c2, c3 = st.columns(3)
d_model = c1.select_slider("d_model", D_MODELS, key="sch_d")
warmup = c2.slider("warmup_steps", 1, 20000, step=1, key="sch_w")
factor = c3.slider("factor", 0.05, 10.0, step=0.05, key="sch_f")
write_query(d_model=d_model, warmup=warmup, factor=factor)
peak = noam_lr(warmup, d_model, warmup, factor)
st.markdown(t("Peak learning rate **{lr}** at step **{w}** = warmup_steps (= factor · d_model^(−1/2) · "
              "warmup^(−1/2)).", lr=f"{peak:.3g}", w=warmup))

log = ckpt.log if ckpt else None
label = t("'{name}' while training", name=ckpt.name) if ckpt else t("recorded")
has_log = bool(log and log.get("step") and log.get("lr"))
max_step = max(20000, 2 * warmup)
if has_log:
    st.button(t("Match the '{name}' checkpoint (d_model={d}{w})", name=ckpt.name, d=ckpt.cfg.d_model,
                w=f", warmup={trained['warmup']}" if "warmup" in trained else ""),
              on_click=_match_checkpoint, key="sch_match",
              disabled=ckpt.cfg.d_model not in D_MODELS and "warmup" not in trained)
    zoom = st.toggle(t("Zoom to the checkpoint's training run"), value=False, key="sch_zoom")
    if zoom:
        max_step = max(int(max(log["step"])), 2)
fig = F.noam_figure(d_model, warmup, factor, max_step=max_step, log=log if has_log else None, log_label=label)
show_figure(fig, key="sch_fig", filename=f"noam-d{d_model}-w{warmup}")
if has_log:
    st.caption(t("Green: the learning rate the optimizer actually used at each step while '{name}' trained "
                 "(d_model = {d}, read from its training log). Dotted: the paper's presets 512/4000 and two "
                 "variants, for comparison.", name=ckpt.name, d=ckpt.cfg.d_model))
elif ckpt:
    st.info(t("The '{name}' checkpoint has no recorded learning rates.", name=ckpt.name))
