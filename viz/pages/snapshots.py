"""Snapshots: download the current trace, upload one, and compare the two tensor by tensor."""

import hashlib
import json

import streamlit as st

from model import Trace, TraceFileError, compare_traces
from model.core.recorder import DEFAULT_BUDGET_BYTES, select_names
from model.core.trace import MAX_HEADER_BYTES, META_KEYS
from viz.figures import attention as F
from viz.i18n import N_, option_labels, t
from viz.ui.models import capabilities, is_real_model, load_ckpt
from viz.ui.render import safe_filename, show_error, show_figure
from viz.ui.sidebar import require_trace, selection
from viz.ui.state import seed_from_query, write_query
from viz.ui.text import text_problems

MAX_SHOWN_TEXT = 200  # characters of an uploaded trace's text shown inline (its length is always said)
# What a refused file is, in the user's words (TraceFileError.kind); other kinds show the reader's detail.
REFUSALS = {
    "empty": N_("“{name}” is not a trace: the file is empty (0 bytes)."),
    "pickle": N_("“{name}” is a Python pickle, not a safetensors trace. A pickle can run code when it is "
                 "opened, so this app never opens one."),
    "zip": N_("“{name}” is a zip archive (the format of torch.save), not a safetensors trace. Pickled "
              "tensors can run code when they are opened, so this app never opens them."),
    "too_many_names": N_("“{name}” holds {n} tensors; a trace of one forward pass has a few hundred (the "
                         "limit is {limit}). Capture fewer names, e.g. names='*.weights'."),
    "foreign": N_("“{name}” is a safetensors file but not an Attention Lab trace: it may be model weights."),
}
NOT_SAFETENSORS = N_("“{name}” is not a safetensors file (a text file renamed .safetensors, perhaps): a safetensors "
                     "file begins with the length of its header, and this one does not.")
# Coordinates of a differing cell (model.core.trace.locate's keys), in the UI language.
AXES = {"layer": N_("layer"), "batch": N_("batch"), "head": N_("head"), "query": N_("query"), "key": N_("key"),
        "position": N_("position"), "dim": N_("dim"), "vocab": N_("vocab"), "expected": N_("file"),
        "actual": N_("current")}
PROBLEMS = {"": N_("values"), "shape": N_("shape"), "dtype": N_("dtype")}
# Why two traces' metadata differ, in the UI language (model.core.trace words it in English for the CLI).
META_WHY = {"config": N_("The two traces come from different models ({changes}): expect differences everywhere."),
            "versions": N_("The library versions differ ({changes}): small numeric differences may come from the "
                           "upgrade."),
            "src_tokens": N_("The source tokens differ ({changes}): the text or the tokenizer changed."),
            "tgt_tokens": N_("The target tokens differ ({changes}): the text, target or tokenizer changed.")}

st.title(t("Snapshots"))
st.caption(t(
    "A trace is every captured tensor of one forward pass (embeddings, masks, Q/K/V, scores, weights, head "
    "outputs, layer outputs, logits), saved as a safetensors file with JSON metadata (never a pickle). Pin "
    "one in a test (`trace_snapshot.check(trace)`), or compare two here: differences are located by name, "
    "layer, head and the query/key tokens."))
# A language model's full trace is big (SmolLM2, 16 tokens: ~100 MiB; 1,024 tokens: gigabytes): its snapshot
# captures the attention weights only unless the user asks for everything.
CAPTURES = {"*.weights": N_("attention weights only (*.weights)"), "all": N_("everything (a full trace)"),
            "lazy": N_("queries, keys and values (the maps computed when read)")}


@st.cache_resource(show_spinner=False, max_entries=4, ttl=3600)
def _lm_weights_trace(name: str, text: str, names: str) -> Trace:
    """An LM's trace of `names` only, shared by sessions (read-only), meta as the other pages' LM traces."""
    from viz.ui import lm_models

    rm = load_ckpt(name)
    _, tr = rm.obj.run_with_trace(text, names=names)
    meta = dict(tr.meta, checkpoint=name, text=text, captured=names)
    if meta.get("tgt_tokens"):  # readable pieces, as on every page (raw ones kept in tgt_pieces)
        meta["tgt_pieces"] = list(meta["tgt_tokens"])
        meta["tgt_tokens"] = lm_models.readable_tokens(meta["tgt_pieces"], lm_models._byte_level(rm.obj))
    return Trace(dict(tr), meta)


def _bytes(lm, T: int, pattern: str) -> int:
    if pattern == "lazy":  # q, k, v of every layer (LazyTrace): grows like T
        return lm.trace_bytes(T, lazy=True)
    return lm.trace_bytes(T, names=None if pattern == "all" else pattern)


def _tokens_that_fit(lm, pattern: str, budget: int, T: int) -> int:
    """The longest prompt (in tokens, < T) whose capture of `pattern` stays within `budget` bytes."""
    lo, hi = 0, T
    while lo + 1 < hi:  # bytes grow with T: bisect
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _bytes(lm, mid, pattern) <= budget else (lo, mid)
    return lo


def lm_trace(sel):
    """(Selection, Trace) for a language model: the capture the user chose, after saying what it costs."""
    problem = text_problems(sel.text)
    if problem:
        show_error(problem)
        st.stop()
    rm = sel.ckpt
    try:
        T = rm.obj.encode(sel.text).shape[1]
    except ValueError as e:
        show_error(e, t("Shorten or change the text in the sidebar."))
        st.stop()
    model = rm.obj.model
    shapes = model.capture_names(1, T)
    sizes = {g: _bytes(rm.obj, T, g) for g in CAPTURES}
    from viz.ui.long_views import LONG_BUDGET

    budgets = {g: LONG_BUDGET if g == "lazy" else DEFAULT_BUDGET_BYTES for g in CAPTURES}
    default = "*.weights" if sizes["*.weights"] <= DEFAULT_BUDGET_BYTES else "lazy"  # a long prompt: lazy
    seed_from_query("snap_capture", "capture", default, valid=lambda v: v in CAPTURES)
    choice = st.radio(t("Capture"), list(CAPTURES), key="snap_capture", horizontal=True,
                      format_func=option_labels(list(CAPTURES), lambda g: t(CAPTURES[g])))
    write_query(capture=choice)
    n_weights = len(select_names(list(shapes), "*.weights"))
    st.caption(t("A language model's full trace is big: {n} tensors, about {full} MiB for these {T} tokens, and it "
                 "grows with the square of the length. Its attention weights alone ({k} tensors, one per layer) are "
                 "{w} MiB, so that is what a snapshot captures unless you choose everything.", n=len(shapes),
                 full=f"{sizes['all'] / 2**20:,.1f}", T=T, k=n_weights, w=f"{sizes['*.weights'] / 2**20:,.1f}"))
    st.caption(t("A lazy trace keeps the queries, keys and values of every layer ({q} MiB: it grows like the length) "
                 "and computes a map when it is read; saved, it holds just those, and loading it gives the same "
                 "maps.", q=f"{sizes['lazy'] / 2**20:,.1f}"))
    if sizes[choice] > budgets[choice]:
        fit = _tokens_that_fit(rm.obj, choice, budgets[choice], T)
        show_error(t("Capturing {what} for these {T} tokens needs about {mib} MiB, over this server's limit "
                            "of {limit} MiB per trace. Up to {fit} tokens fit: shorten the prompt, or capture the "
                            "attention weights only.", what=t(CAPTURES[choice]), T=T,
                            mib=f"{sizes[choice] / 2**20:,.0f}", limit=f"{budgets[choice] / 2**20:,.0f}",
                            fit=f"{fit:,}"))
        if fit > 0:  # the Attention page's cut: ?keep=N, the prompt's end (the sidebar applies it on every page)
            from viz.ui.long_views import _keep_button

            _keep_button(fit, "snap")
        st.stop()
    try:
        with st.spinner(t("Running the model…")):
            if choice == "all":
                return require_trace(sel)
            if choice == "lazy":  # the Attention page's long trace: the same forward, shared
                from viz.ui.long_views import _long_trace

                tr = _long_trace(sel.name, sel.text, False, None)
                return sel, tr.with_meta(dict(tr.meta, text=sel.text, captured="lazy"))
            return sel, _lm_weights_trace(sel.name, sel.text, choice)
    except ValueError as e:  # too long for the model's positions, ...
        show_error(e, t("Shorten or change the text in the sidebar."))
        st.stop()


_sel = selection()
if _sel is not None and is_real_model(_sel) and "lm" in capabilities(_sel.name):
    sel, trace = lm_trace(_sel)
else:
    sel, trace = require_trace()
is_lm = trace.meta.get("model", {}).get("family") == "decoder_lm"


def _shown(text) -> str:
    """A text for inline display: long ones are cut, and the cut is said (nothing silently truncated)."""
    text = str(text)
    if len(text) <= MAX_SHOWN_TEXT:
        return text
    return t("{start}… ({n} characters in all)", start=text[:MAX_SHOWN_TEXT], n=f"{len(text):,}")


# ---------------------------------------------------------------- download

st.subheader(t("Download the current trace"))
meta = trace.meta
if is_lm:  # no target: a language model reads one text
    st.markdown(t("`{checkpoint}` on “{text}”: **{n} tensors, {mib} MiB**.",
                  checkpoint=meta.get("checkpoint", sel.name), text=_shown(meta.get("text", sel.text)), n=len(trace),
                  mib=f"{trace.nbytes() / 2**20:.2f}"))
else:
    st.markdown(t("`{checkpoint}` on “{text}” → “{target}”: **{n} tensors, {mib} MiB**.",
                  checkpoint=meta.get("checkpoint", sel.name), text=_shown(meta.get("text", sel.text)),
                  target=_shown(meta.get("target", "")), n=len(trace), mib=f"{trace.nbytes() / 2**20:.2f}"))
# A deferred download: the file is only written when the button is clicked.
st.download_button(t("Download trace (.safetensors)"), data=trace.to_bytes,
                   file_name=f"trace-{safe_filename(sel.name)}.safetensors",
                   mime="application/octet-stream", key="snap_download", on_click="ignore", icon="⬇️")
with st.expander(t("Load it in Python")):
    st.code("from model import Trace, compare_traces\n"
            "t = Trace.load('trace.safetensors')\n"
            + ("t['decoder.layers.0.self_attn.weights']   # [B, H, T, T]\n" if is_lm else
               "t['decoder.layers.0.cross_attn.weights']   # [B, H, T, S]\n")
            + "print(compare_traces(t, other).report())", language="python")

# ---------------------------------------------------------------- upload


def _refusal(e: TraceFileError, name: str, data: bytes) -> str:
    if e.kind in REFUSALS:
        return t(REFUSALS[e.kind], name=name, **{k: f"{v:,}" for k, v in e.info.items()})
    if len(data) >= 8 and int.from_bytes(data[:8], "little") > MAX_HEADER_BYTES:  # the reader's own test
        return t(NOT_SAFETENSORS, name=name)
    return t("“{name}” is not a usable trace file: {error}", name=name, error=e)


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
            result = _refusal(e, upload.name, data)
        except (ValueError, OSError, RuntimeError) as e:  # e.g. metadata that is not JSON-able
            result = t("“{name}” could not be read as a trace: {error}", name=upload.name, error=e)
        st.session_state["snap_loaded"] = (digest, result)
    if isinstance(result, str):
        show_error(result, t("Upload a .safetensors trace saved by this app or by `Trace.save`."))
        return None
    return result


st.subheader(t("Compare with an uploaded trace"))
upload = st.file_uploader(t("Trace file (.safetensors)"), type=["safetensors"], key="snap_upload",
                          help=t("A trace downloaded above, or a snapshot / .obtained file from a test."))
if upload is None:
    st.info(t("Upload a trace to compare it with the current one (try the file you just downloaded: it matches "
              "exactly; then change the text or the model and compare again)."))
    st.stop()
other = _load_upload(upload)
if other is None:
    st.stop()

om = other.meta
st.markdown(t("Uploaded: `{checkpoint}` on “{text}”, {n} tensors, {mib} MiB.", checkpoint=om.get("checkpoint", "?"),
              text=_shown(om.get("text", "?")), n=len(other), mib=f"{other.nbytes() / 2**20:.2f}"))
atol = st.select_slider(t("Tolerance (absolute)"), [0.0, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1], value=1e-5,
                        key="snap_atol", format_func=lambda v: f"{v:g}")
diff = compare_traces(other, trace, atol=atol, meta=om)
if diff.equal:
    st.success(t("The traces match: all {n} tensors within {atol}.", n=len(trace), atol=f"{atol:g}"), icon="✅")


def _short(value) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "…"


def _meta_notes(file_meta: dict, current_meta: dict) -> list[str]:
    """What differs in the two traces' metadata and what it explains (TraceDiff.meta_notes, in the UI language)."""
    notes = []
    for key in META_KEYS:
        tokens_key = key.replace("_ids", "_tokens")
        if key.endswith("_ids") and tokens_key in file_meta:
            continue  # the token strings say the same, readably
        if tokens_key not in META_WHY or key not in file_meta or key not in current_meta:
            continue
        old, new = file_meta[key], current_meta[key]
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            changes = ", ".join(f"{k} {_short(old.get(k))} → {_short(new.get(k))}"
                                for k in sorted(set(old) | set(new), key=str) if old.get(k) != new.get(k))
        else:
            changes = f"{_short(old)} → {_short(new)}"
        notes.append(t(META_WHY[tokens_key], changes=changes))
    return notes


for note in _meta_notes(om, meta):
    st.warning(note)


def _listed(names: list[str], shown: int = 12) -> str:
    return ", ".join(names[:shown]) + (t(" … and {n} more", n=len(names) - shown) if len(names) > shown else "")


if diff.missing:
    st.warning(t("{n} tensor(s) of the file are not in the current trace: {names}", n=len(diff.missing),
                 names=_listed(diff.missing)))
if diff.new:
    st.warning(t("{n} tensor(s) of the current trace are not in the file: {names}", n=len(diff.new),
                 names=_listed(diff.new)))
if not diff.diffs:
    st.stop()


def _where(w: dict) -> str:
    """{"layer": 1, "query": 2, "query_token": "l"} -> "layer=1, query=2 'l'" (axis names in the UI language)."""
    parts = []
    for k, v in w.items():
        if k.endswith("_token"):
            continue
        tok = w.get(f"{k}_token")
        parts.append(f"{t(AXES.get(k, k))}={v}" + ("" if tok is None else f" {tok!r}"))
    return ", ".join(parts)


st.markdown(t("**{n} tensor(s) differ**, worst first:", n=len(diff.diffs)))
if len(diff.diffs) > 200:
    st.caption(t("The table lists the worst 200 of {n}.", n=len(diff.diffs)))
st.dataframe([{t("name"): d.name, t("max |diff|"): d.max_abs, t("problem"): t(PROBLEMS.get(d.problem, d.problem)),
               t("where (worst cell)"): _where(d.where)} for d in diff.diffs[:200]], hide_index=True)
comparable = [d for d in diff.diffs if not d.problem]
if not comparable:
    st.info(t("Every differing tensor changed shape or dtype, so there is no cell-by-cell picture to draw "
              "(different input lengths give different shapes: compare traces of the same text)."))
    st.stop()
pick = st.selectbox(t("Draw the difference of"), range(len(comparable)), key="snap_pick",
                    format_func=option_labels(range(len(comparable)), lambda i: t(
                        "{name} (max |diff| {value})", name=comparable[i].name, value=f"{comparable[i].max_abs:.3g}")))
d = comparable[pick]
ref, cur = other[d.name], trace[d.name]
head = 0
if ref.dim() == 4 and ref.shape[1] > 1:
    heads = list(range(ref.shape[1]))
    head = st.selectbox(t("Head"), heads, index=int(d.where.get("head", 0)), key=f"snap_head_{d.name}")
show_figure(F.diff_figure(ref, cur, d.name, head), key="snap_diff", filename=f"diff-{d.name}")
