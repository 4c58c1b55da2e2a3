"""Snapshots: download the current trace, upload one, and compare the two tensor by tensor."""

import hashlib

import streamlit as st

from model import Trace, TraceFileError, compare_traces
from viz import common
from viz import figures as F

st.title("Snapshots")
st.caption(
    "A trace is every captured tensor of one forward pass (embeddings, masks, Q/K/V, scores, weights, head "
    "outputs, layer outputs, logits), saved as a safetensors file with JSON metadata (never a pickle). Pin "
    "one in a test (`trace_snapshot.check(trace)`), or compare two here: differences are located by name, "
    "layer, head and the query/key tokens.")
sel, trace = common.require_trace()

# ---------------------------------------------------------------- download

st.subheader("Download the current trace")
meta = trace.meta
st.markdown(f"`{meta.get('checkpoint', sel.name)}` on “{meta.get('text', sel.text)}” → "
            f"“{meta.get('target', '')}”: **{len(trace)} tensors, {trace.nbytes() / 2**20:.2f} MiB**.")
# A deferred download: the file is only written when the button is clicked.
st.download_button("Download trace (.safetensors)", data=trace.to_bytes,
                   file_name=f"trace-{common.safe_filename(sel.name)}.safetensors",
                   mime="application/octet-stream", key="snap_download", on_click="ignore", icon="⬇️")
with st.expander("Load it in Python"):
    st.code("from model import Trace, compare_traces\n"
            "t = Trace.load('trace.safetensors')\n"
            "t['decoder.layers.0.cross_attn.weights']   # [B, H, T, S]\n"
            "print(compare_traces(t, other).report())", language="python")

# ---------------------------------------------------------------- upload


def _load_upload(upload) -> Trace | None:
    """The uploaded trace, parsed once per file and kept in this session only."""
    data = upload.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    cached = st.session_state.get("snap_loaded")
    if cached and cached[0] == digest:
        result = cached[1]
    else:
        try:
            result = Trace.from_bytes(data, name=upload.name)
        except TraceFileError as e:
            result = f"“{upload.name}” is not a usable trace file: {e}"
        except (ValueError, OSError, RuntimeError) as e:  # e.g. metadata that is not JSON-able
            result = f"“{upload.name}” could not be read as a trace: {e}"
        st.session_state["snap_loaded"] = (digest, result)
    if isinstance(result, str):
        common.show_error(result, "Upload a .safetensors trace saved by this app or by `Trace.save`.")
        return None
    return result


st.subheader("Compare with an uploaded trace")
upload = st.file_uploader("Trace file (.safetensors)", type=["safetensors"], key="snap_upload",
                          help="A trace downloaded above, or a snapshot / .obtained file from a test.")
if upload is None:
    st.info("Upload a trace to compare it with the current one (try the file you just downloaded: it matches "
            "exactly; then change the text or the model and compare again).")
    st.stop()
other = _load_upload(upload)
if other is None:
    st.stop()

om = other.meta
st.markdown(f"Uploaded: `{om.get('checkpoint', '?')}` on “{om.get('text', '?')}”, {len(other)} tensors, "
            f"{other.nbytes() / 2**20:.2f} MiB.")
atol = st.select_slider("Tolerance (absolute)", [0.0, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1], value=1e-5,
                        key="snap_atol", format_func=lambda v: f"{v:g}")
diff = compare_traces(other, trace, atol=atol, meta=om)
if diff.equal:
    st.success(f"The traces match: all {len(trace)} tensors within {atol:g}.", icon="✅")
for note in diff.meta_notes:
    st.warning(note)
if diff.missing:
    st.warning(f"{len(diff.missing)} tensor(s) of the file are not in the current trace: "
               + ", ".join(diff.missing[:12]) + (" …" if len(diff.missing) > 12 else ""))
if diff.new:
    st.warning(f"{len(diff.new)} tensor(s) of the current trace are not in the file: "
               + ", ".join(diff.new[:12]) + (" …" if len(diff.new) > 12 else ""))
if not diff.diffs:
    st.stop()


def _where(w: dict) -> str:
    return ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in w.items())


st.markdown(f"**{len(diff.diffs)} tensor(s) differ**, worst first:")
st.dataframe([{"name": d.name, "max |diff|": d.max_abs, "problem": d.problem or "values",
               "where (worst cell)": _where(d.where)} for d in diff.diffs[:200]], hide_index=True)
comparable = [d for d in diff.diffs if not d.problem]
if not comparable:
    st.info("Every differing tensor changed shape or dtype, so there is no cell-by-cell picture to draw "
            "(different input lengths give different shapes: compare traces of the same text).")
    st.stop()
pick = st.selectbox("Draw the difference of", range(len(comparable)), key="snap_pick",
                    format_func=lambda i: f"{comparable[i].name} (max |diff| {comparable[i].max_abs:.3g})")
d = comparable[pick]
ref, cur = other[d.name], trace[d.name]
head = 0
if ref.dim() == 4 and ref.shape[1] > 1:
    heads = list(range(ref.shape[1]))
    head = st.selectbox("Head", heads, index=int(d.where.get("head", 0)), key=f"snap_head_{d.name}")
common.show_figure(F.diff_figure(ref, cur, d.name, head), key="snap_diff", filename=f"diff-{d.name}")
