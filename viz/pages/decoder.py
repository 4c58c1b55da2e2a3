"""Step-by-step decoder: watch the output being generated one token at a time.

Strategy (greedy, beam, sampling) -> one recorded decode (`ckpt.translate`) -> a step slider
(and play button) over its `Step` records: look-ahead mask, the new token's self- and
cross-attention, the top-k next tokens; then the beam tree, the accumulated alignment, and a
teacher-forced pass over the same output that must agree with the step-by-step numbers.

A decoder-only language model (SmolLM2, a server model) generates from the sidebar's prompt with
`LanguageModel.generate` (greedy, or sampling with a seed): each step shows its top-10 next tokens and
where the new position looked in every layer (the Language model page's figure builders); the
seq2seq-only parts say in one sentence that it has none and offer a toy model.
"""

from __future__ import annotations

import html
import time

import numpy as np
import streamlit as st
import torch

from model.core import recorder
from model.toy.checkpoint import sampling_distribution
from viz.figures import attention as F
from viz.figures import decode as fd
from viz.figures import llm as FL
from viz.i18n import N_, current_lang, option_labels, t
from viz.ui.models import capabilities, checkpoint_names, get_trace, is_real_name, load_ckpt
from viz.ui.render import show_error, show_figure
from viz.ui.sidebar import default_checkpoint, model_label, require, switch_model
from viz.ui.state import int_in, seed_from_query, write_query
from viz.ui.text import md_escape, target_unk_note, text_problems, unk_note

STRATEGIES = {"greedy": N_("Greedy"), "beam": N_("Beam search"), "sample": N_("Sampling")}
LM_STRATEGIES = ("greedy", "sample")  # LanguageModel.generate has no beam search
CHIPS_UP_TO = 64  # the decoder input is drawn as chips up to this many tokens; a longer one shows its end
MASK_UP_TO = 64  # the look-ahead mask figure, up to this many positions
KEYS_UP_TO = 256  # the new position's attention figures draw at most the last this many keys
LM_MAX_NEW = (1, 64, 16)  # new tokens a language model generates here: min, max, default
PLAY_SECONDS = 0.9  # one step per tick while playing
AGREE_ATOL = 1e-4  # cached step-by-step vs one parallel pass: float32 reassociation only
N_TOP = 5  # next-token bars: the model's k most likely tokens, plus the chosen one when it is not among them
# Table columns: every probability says which distribution it comes from.
P_FREE, P_FORCED, P_SAMPLE = (N_("p model, step by step"), N_("p model, teacher-forced"),
                              N_("p sampled from (T, top-k, top-p)"))
DELTAS = (N_("max |Δ logits|"), N_("max |Δ self-attn|"), N_("max |Δ cross-attn|"))


# ---------------------------------------------------------------- cached computations


def decode(ckpt, text: str, strategy: str, options: tuple):
    """One recorded decode, cut at the checkpoint's own generation limit (`ckpt.max_new_tokens`), the
    same limit as every other page."""
    return ckpt.translate(text, strategy, **dict(options))


def teacher_forced(ckpt, text: str, out_ids: tuple[int, ...]):
    """One parallel pass over [BOS] + the decoded ids (ids, not text: re-tokenizing could differ)."""
    bos = ckpt.tgt_tokenizer.bos_id
    tgt = torch.tensor([[bos, *out_ids][: ckpt.cfg.max_len]])
    names = ["logits", "decoder.layers.*.self_attn.weights", "decoder.layers.*.cross_attn.weights"]
    with torch.no_grad():
        return ckpt.model.run_with_trace(ckpt.encode_source(text), tgt, names=names)[1]


def generate_lm(rm, text: str, max_new: int, options: tuple):
    """A language model's recorded generation (`LanguageModel.generate`: every step's top-10 and the new
    position's attention in every layer; a private seeded generator when sampling). A long prompt runs on
    the named fast path (fused attention; the recorded rows are still each step's softmax, equal to ~1e-6)."""
    long = rm.obj.encode(text).shape[1] > recorder.EXACT_UP_TO
    return rm.obj.generate(text, max_new_tokens=max_new, fast=long, **dict(options))


COMPUTATIONS = {"decode": decode, "teacher_forced": teacher_forced, "generate": generate_lm}


@st.cache_resource(show_spinner=False, max_entries=32)
def _shared(what: str, name: str, *args):
    return COMPUTATIONS[what](load_ckpt(name), *args)


def computed(what: str, name: str, *args):
    """COMPUTATIONS[what](checkpoint, *args). A shipped model's result is cached for every session (same
    inputs, same read-only output); a model trained in this session is computed in a one-entry memo of
    this session (another session may hold another model under the same name)."""
    with st.spinner(t("Teacher-forced pass…") if what == "teacher_forced" else t("Decoding…")):
        if name not in (st.session_state.get("session_models") or {}):
            return _shared(what, name, *args)
        ckpt = load_ckpt(name)
        memo = st.session_state.setdefault("_dec_memo", {})
        key = (ckpt, name, args)  # the object itself: a retrained model under the same name is another key
        if memo.get(what, (None,))[0] != key:
            memo[what] = (key, COMPUTATIONS[what](ckpt, *args))
        return memo[what][1]


# ---------------------------------------------------------------- widgets and state


def head_label(h: str) -> str:
    return {"all": t("all heads (+ mean)"), "mean": t("mean over heads")}.get(h) or t("head {h}", h=h)


def seed_state(n_layers: int, n_heads: int) -> list[str]:
    """Widget defaults from the URL; returns the head options."""
    q = seed_from_query
    heads = ["all", "mean", *map(str, range(n_heads))]
    q("dec_strategy", "dec_strategy", "greedy", valid=lambda v: v in STRATEGIES)
    q("dec_beam", "dec_beam", 4, int, int_in(1, 8))
    q("dec_lp", "dec_lp", 0.6, float, lambda v: 0.0 <= v <= 2.0)
    q("dec_temp", "dec_temp", 1.0, float, lambda v: 0.1 <= v <= 3.0)
    q("dec_topk", "dec_topk", 0, int, int_in(0, 50))
    q("dec_topp", "dec_topp", 1.0, float, lambda v: 0.05 <= v <= 1.0)
    q("dec_seed", "dec_seed", 0, int, int_in(0, 2**31 - 1))
    q("dec_step", "dec_step", 0, int, lambda v: isinstance(v, int) and v >= 1)  # 0: the last step
    q("dec_layer", "dec_layer", n_layers - 1, int, int_in(0, n_layers - 1))
    q("dec_head", "dec_head", "all", valid=lambda v: v in heads)
    # Another checkpoint may have fewer layers or heads than the URL or the last model had.
    if not 0 <= st.session_state["dec_layer"] < n_layers:
        st.session_state["dec_layer"] = n_layers - 1
    if st.session_state["dec_head"] not in heads:
        st.session_state["dec_head"] = "all"
    return heads


def strategy_controls(offered: tuple[str, ...] = tuple(STRATEGIES)) -> tuple[str, tuple]:
    """Strategy (one of `offered`) and its options, as a hashable tuple for the cache."""
    if st.session_state.get("dec_strategy") not in offered:  # e.g. a link's beam for a language model
        st.session_state["dec_strategy"] = offered[0]
    strategy = st.segmented_control(t("Strategy"), list(offered), key="dec_strategy", required=True,
                                    format_func=option_labels(STRATEGIES, lambda k: t(STRATEGIES[k])))
    opts: dict = {}
    cols = st.columns(4)
    if strategy == "beam":
        opts["beam_width"] = cols[0].slider(t("Beam width"), 1, 8, key="dec_beam",
                                            help=t("Hypotheses kept per step; width 1 is greedy."))
        opts["length_penalty"] = cols[1].slider(
            t("Length penalty α"), 0.0, 2.0, step=0.1, key="dec_lp",
            help=t("Finished hypotheses are ranked by log p / ((5 + |Y|) / 6)^α (GNMT); the paper used 0.6."))
    elif strategy == "sample":
        opts["temperature"] = cols[0].slider(
            t("Temperature"), 0.1, 3.0, step=0.1, key="dec_temp",
            help=t("Sample from softmax(logits / T): T < 1 sharpens, T > 1 flattens."))
        k = cols[1].slider(t("Top-k (0 = off)"), 0, 50, key="dec_topk",
                           help=t("Keep only the k most likely tokens."))
        opts["top_k"] = k or None
        p = cols[2].slider(t("Top-p (nucleus)"), 0.05, 1.0, step=0.05, key="dec_topp",
                           help=t("Keep the fewest most likely tokens whose probability mass reaches p."))
        opts["top_p"] = None if p >= 1.0 else p
        opts["seed"] = cols[3].number_input(t("Seed"), 0, 2**31 - 1, key="dec_seed",
                                            help=t("Same seed, same sample: the run is reproducible."))
    return strategy, tuple(sorted(opts.items()))


def start_play(n_steps: int) -> None:
    if st.session_state.get("dec_step", 1) >= n_steps:
        st.session_state["dec_step"] = 1  # replay from the start
    st.session_state["dec_playing"] = True
    # The time of the last advance lives in the session, not in a module clock: a test moves it back
    # instead of sleeping.
    st.session_state["dec_tick"] = time.monotonic()


def stop_play() -> None:
    st.session_state["dec_playing"] = False


def layer_head_play(n_layers: int, heads: list[str], n: int) -> tuple[int, str, bool]:
    """The layer and head selects and the play/pause button, in one row: (layer, head, playing)."""
    c1, c2, c3 = st.columns([1, 1.5, 3])
    layer = c1.selectbox(t("Decoder layer"), range(n_layers), key="dec_layer")
    head = c2.selectbox(t("Head"), heads, format_func=option_labels(heads, head_label), key="dec_head")
    playing = bool(st.session_state.get("dec_playing")) and n > 1
    with c3:
        st.write("")  # align the button with the selects
        if playing:
            st.button(t("⏸ Pause"), on_click=stop_play, key="dec_pause")
        else:
            st.button(t("▶ Play"), on_click=start_play, args=(n,), key="dec_play", disabled=n == 1,
                      help=t("Step through the decode, one step every {s} s.", s=f"{PLAY_SECONDS:g}"))
    return layer, head, playing


# ---------------------------------------------------------------- drawing


def rows_of(w: np.ndarray, head: str) -> tuple[np.ndarray, list[str]]:
    """[H, K] weights of one layer -> the rows to draw for the head choice, with labels."""
    if head == "all":
        return np.vstack([w, w.mean(0, keepdims=True)]), [t("head {h}", h=h) for h in range(len(w))] + [t("mean")]
    if head == "mean":
        return w.mean(0, keepdims=True), [t("mean of heads")]
    return w[int(head): int(head) + 1], [t("head {h}", h=head)]


def alignment_rows(out, layer: int, head: str, upto: int) -> np.ndarray:
    """Cross-attention of every step (one head, or the mean), rows after `upto` left blank (NaN)."""
    rows = np.stack([s.cross_attn[layer].numpy() for s in out.steps])  # [T, H, S]
    rows = rows.mean(1) if head in ("all", "mean") else rows[:, int(head)]
    rows = rows.astype(np.float32)
    rows[upto + 1:] = np.nan
    return rows


def decoder_rows(out, n: int) -> list[str]:
    """Labels of the first n decoder positions: "input → predicted" ([BOS] → i, i → love, …)."""
    return fd.step_labels(out.tgt_tokens[:n], [s.token for s in out.steps[:n]])


def step_probs(rec, strategy: str, options: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The model's softmax over the raw logits, and (when sampling) the distribution the token was
    drawn from: softmax(logits / T) after top-k / top-p. Greedy and beam choose from the model's own."""
    model_p = torch.softmax(rec.logits.double(), -1).float()
    if strategy != "sample":
        return model_p, None
    kw = {k: options.get(k) for k in ("temperature", "top_k", "top_p")}
    return model_p, sampling_distribution(rec.logits, **kw)


def token_chips(tokens: list[str], new: str, model_p: float, sample_p: float | None) -> None:
    """The decoder input so far, then the token chosen at this step, with where its p comes from."""
    chip = ("<span style='display:inline-block;margin:2px;padding:2px 7px;border-radius:6px;"
            "font-family:monospace;background:{bg};color:{fg}'>{t}</span>")
    earlier = len(tokens) - CHIPS_UP_TO
    seen = "".join(chip.format(bg="#E8F0FA", fg="#1F3B57", t=html.escape(x)) for x in tokens[max(0, earlier):])
    if earlier > 0:  # a long prompt: its end, where this step reads most (the whole text is in the sidebar)
        seen = html.escape(t("… {n} earlier tokens …", n=f"{earlier:,}")) + " " + seen
    chosen = chip.format(bg=fd.ORANGE, fg="white", t=html.escape(new))
    if sample_p is None:
        where = t("p = {p} under the model (softmax of the logits)", p=f"{model_p:.4f}")
    else:
        where = t("p = {ps} in the distribution it was sampled from (after temperature, top-k, top-p); "
                  "p = {pm} under the model (softmax of the raw logits)", ps=f"{sample_p:.4f}", pm=f"{model_p:.4f}")
    inp, pick = html.escape(t("Decoder input:")), html.escape(t("chosen:"))
    where = html.escape(where)
    st.html(f"<div>{inp} {seen} &nbsp;→&nbsp; {pick} {chosen} <span style='color:#666'>({where})</span></div>")


def next_token_view(ckpt, rec, step: int, strategy: str, options: dict) -> None:
    model_p, sample_p = step_probs(rec, strategy, options)
    ids = fd.next_token_ids(model_p.numpy(), rec.token_id, N_TOP)
    tokens = [ckpt.tgt_tokenizer.id_to_token(i) for i in ids]
    title = t("Step {step}: the {k} most likely next tokens", step=step, k=N_TOP)
    if len(ids) > N_TOP:
        title += t(" + the sampled one")
    fig = fd.next_token_figure(tokens, model_p[ids].tolist(), ids.index(rec.token_id),
                               None if sample_p is None else sample_p[ids].tolist(), title)
    show_figure(fig, key="dec_topk_fig", filename="next-tokens")


def step_slider(n: int, playing: bool, help: str) -> int:
    """The step (1 … n) shown; while playing, one more every PLAY_SECONDS (the fragment's timer)."""
    if playing and time.monotonic() - st.session_state.get("dec_tick", 0.0) >= PLAY_SECONDS * 0.8:
        st.session_state["dec_tick"] = time.monotonic()
        if st.session_state["dec_step"] < n:
            st.session_state["dec_step"] += 1
        else:
            stop_play()
            st.rerun()  # re-register the fragment without its timer
    step = st.slider(t("Step"), 1, n, key="dec_step", disabled=n == 1, help=help) if n > 1 else 1
    write_query(dec_step=step)
    return step


def step_view(out, layer: int, head: str, playing: bool, ckpt, strategy: str, options: dict) -> None:
    """Everything that depends on the step (a fragment, so playing redraws only this)."""
    n = len(out.steps)
    step = step_slider(n, playing, t("Step t reads [BOS] y1 … y(t-1) and predicts y(t)."))
    i = step - 1
    rec = out.steps[i]
    inp = out.tgt_tokens[: i + 1]  # [BOS] + tokens generated before this step
    rows = decoder_rows(out, i + 1)
    model_p, sample_p = step_probs(rec, strategy, options)
    token_chips(inp, rec.token, float(model_p[rec.token_id]),
                None if sample_p is None else float(sample_p[rec.token_id]))
    where = t("layer {layer}, {head}", layer=layer, head=head_label(head))
    left, right = st.columns([3, 2])
    with left:
        show_figure(fd.lookahead_mask_figure(inp, [s.token for s in out.steps[: i + 1]]), key="dec_mask",
                           filename="lookahead-mask")
    with right:
        next_token_view(ckpt, rec, step, strategy, options)
    z, labels = rows_of(rec.self_attn[layer].numpy(), head)
    show_figure(fd.attention_rows_figure(
        z, labels, inp, t("Decoder self-attention of the new position {row} ({where}): keys ≤ now only",
                          row=rows[-1], where=where),
        query_token=rows[-1]), key="dec_self", filename="decoder-self-attention")
    z, labels = rows_of(rec.cross_attn[layer].numpy(), head)
    show_figure(fd.attention_rows_figure(
        z, labels, out.src_tokens, t("Cross-attention of the new position {row} ({where}): Q from the decoder, "
                                     "K, V from the encoder", row=rows[-1], where=where),
        query_token=rows[-1]), key="dec_cross", filename="cross-attention")
    which = t("mean over heads") if head in ("all", "mean") else t("head {h}", h=head)
    show_figure(fd.alignment_figure(
        alignment_rows(out, layer, head, i), decoder_rows(out, n), out.src_tokens, current=i,
        title=t("Source–target alignment so far (cross-attention, layer {layer}, {which})", layer=layer,
                which=which)),
        key="dec_align", filename="alignment")


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def agreement_rows(out, trace, n_layers: int, strategy: str, options: dict) -> list[dict]:
    """Per step: step-by-step records vs the teacher-forced pass at the same position (the model's
    own probabilities; when sampling, also the probability in the distribution it was drawn from)."""
    logits = trace["logits"][0]
    rows = []
    for i, s in enumerate(out.steps[: logits.shape[0]]):
        d_self = max(max_abs(s.self_attn[k], trace[f"decoder.layers.{k}.self_attn.weights"][0, :, i, : i + 1])
                     for k in range(n_layers))
        d_cross = max(max_abs(s.cross_attn[k], trace[f"decoder.layers.{k}.cross_attn.weights"][0, :, i])
                      for k in range(n_layers))
        model_p, sample_p = step_probs(s, strategy, options)
        row = {N_("step"): i + 1, N_("token"): s.token, P_FREE: float(model_p[s.token_id]),
               P_FORCED: float(torch.softmax(logits[i], -1)[s.token_id])}
        if sample_p is not None:
            row[P_SAMPLE] = float(sample_p[s.token_id])
        rows.append(row | dict(zip(DELTAS, (max_abs(s.logits, logits[i]), d_self, d_cross), strict=True)))
    return rows


def comparison_section(sel, out, n_layers: int, strategy: str, options: dict) -> None:
    st.subheader(t("Teacher forcing vs free-running"))
    st.caption(t("Training feeds the decoder the whole target at once: [BOS] y1 … yT in **one parallel "
                 "pass**, the lower-triangular (look-ahead) mask keeping position t from seeing t+1 …. "
                 "Generation feeds its own outputs back one step at a time (keys/values cached). Run the "
                 "parallel pass over the decoded output: every logit and attention weight must equal the "
                 "step-by-step record."))
    ckpt = sel.ckpt
    try:
        tf = computed("teacher_forced", sel.name, sel.text, tuple(out.token_ids))
    except ValueError as e:
        show_error(e)
        return
    rows = agreement_rows(out, tf, n_layers, strategy, options)
    worst = max((max(r[d] for d in DELTAS) for r in rows), default=0.0)
    if worst <= AGREE_ATOL:
        st.success(t("They agree: the largest difference over {n} steps is {worst} (≤ {tol}, float32 rounding).",
                     n=len(rows), worst=f"{worst:.2e}", tol=f"{AGREE_ATOL:g}"), icon="✅")
    else:
        st.error(t("They disagree: max |Δ| = {worst} > {tol}. The cached step-by-step decoder and the parallel "
                   "pass should compute the same numbers.", worst=f"{worst:.3g}", tol=f"{AGREE_ATOL:g}"), icon="❌")
    reference = None
    ref_rows: list[dict] = []
    if sel.target:
        problem = text_problems(sel.target)
        if problem:
            show_error(t("Reference target: {problem}", problem=problem))
        else:
            try:
                ref_rows = reference_table(ckpt, sel, out)
                reference = ([r["reference"] for r in ref_rows], [r["p(reference)"] for r in ref_rows])
            except ValueError as e:
                show_error(e, t("Shorten or change the target in the sidebar."))
    show_figure(fd.agreement_figure(decoder_rows(out, len(rows)), [r[P_FREE] for r in rows],
                                           [r[P_FORCED] for r in rows], reference),
                       key="dec_agree", filename="teacher-forcing-vs-free-running")
    if strategy == "sample":
        st.caption(t("The model's probabilities are softmax(logits); the token was drawn from the distribution "
                     "after temperature, top-k and top-p, whose probability is the last probability column."))
    # One number format with the figures' (exact zero reads 0, not 0.00e+0 beside 2.53e-07).
    st.dataframe(translated_columns([r | {d: F.num(r[d]) for d in DELTAS} for r in rows]), hide_index=True)
    if not sel.target:
        st.caption(t("Type a reference in the sidebar's *Target (teacher forcing)* box to also see what the "
                     "model predicts, position by position, when it is fed that reference."))
    if ref_rows:
        hits = sum(r["teacher-forced argmax"] == r["reference"] for r in ref_rows)
        nll = -float(np.mean(np.log(np.maximum([r["p(reference)"] for r in ref_rows], 1e-12))))
        st.markdown(t("**Reference** “{target}”: teacher-forced token accuracy {hits}/{n}, cross-entropy {nll} "
                      "nats/token. Where the free-running column differs, generation went its own way (exposure "
                      "bias: at training time the decoder always saw the reference prefix).",
                      target=html.escape(sel.target), hits=hits, n=len(ref_rows), nll=f"{nll:.4f}"))
        st.dataframe(translated_columns(ref_rows), hide_index=True)


def translated_columns(rows: list[dict]) -> list[dict]:
    """Column names in the session's language (the rows keep stable English keys for the code)."""
    return [{t(k): v for k, v in r.items()} for r in rows]


def reference_table(ckpt, sel, out) -> list[dict]:
    trace = get_trace(sel.name, sel.text, sel.target)
    probs = torch.softmax(trace["logits"][0], -1)
    tok = ckpt.tgt_tokenizer
    want_ids = [*ckpt.target_ids(sel.target), tok.eos_id]
    free = [s.token for s in out.steps]
    rows = []
    for i, want in enumerate(want_ids):
        rows.append({N_("position"): i + 1, N_("reference"): tok.id_to_token(want),
                     N_("p(reference)"): float(probs[i, want]),
                     N_("teacher-forced argmax"): tok.id_to_token(int(probs[i].argmax())),
                     N_("free-running"): free[i] if i < len(free) else "—"})
    return rows


# ---------------------------------------------------------------- page


def main() -> None:
    st.title(t("Step-by-step decoder"))
    st.caption(t(
        "The decoder generates one token per step: step t reads [BOS] y1 … y(t-1) and predicts y(t). "
        "Its self-attention adds the look-ahead mask M, 0 on and below the diagonal and **−∞ above** it, "
        "to QKᵀ/√d_k, so softmax gives the future exactly 0 weight. Cross-attention takes Q from the decoder "
        "and K, V from the encoder output. Greedy takes the most likely token, beam search keeps the best W "
        "prefixes, sampling draws from softmax(logits / T) after top-k / top-p filtering. A decoder position "
        "is labelled input → predicted: “[BOS] → i” reads [BOS] and predicts i."))
    sel = require("decoder")  # an encoder-only model says it has no decoder
    problem = text_problems(sel.text)
    if problem:
        show_error(problem)
        st.stop()
    if "lm" in capabilities(sel.name):
        lm_main(sel)
        return
    ckpt = sel.ckpt
    cfg = ckpt.cfg
    heads = seed_state(cfg.n_decoder_layers, cfg.n_heads)
    strategy, options = strategy_controls()
    try:
        note = unk_note(ckpt.src_tokenizer.pieces(sel.text), sel.text)
        out = computed("decode", sel.name, sel.text, strategy, options)
    except ValueError as e:
        show_error(e, t("Shorten or change the text in the sidebar."))
        st.stop()
    if note:
        st.warning(note, icon="🔤")
    note = target_unk_note(ckpt, sel.target) if sel.target and not text_problems(sel.target) else None
    if note:
        st.warning(note, icon="🔤")
    n = len(out.steps)
    if n == 0:
        st.info(t("The decoder produced no step."))
        st.stop()
    if not 1 <= st.session_state["dec_step"] <= n:
        st.session_state["dec_step"] = n
    output_line(out, ckpt.max_new_tokens)

    layer, head, playing = layer_head_play(cfg.n_decoder_layers, heads, n)
    write_query(dec_strategy=strategy, dec_layer=layer, dec_head=head, dec_max=None,  # dec_max: an LM's
                       **query_options(strategy))

    opts = dict(options)
    st.fragment(run_every=PLAY_SECONDS if playing else None)(step_view)(out, layer, head, playing, ckpt,
                                                                       strategy, opts)
    if out.beam_tree is not None:
        st.subheader(t("Beam tree"))
        st.caption(t("Each step extends every live hypothesis by every token and keeps the best by cumulative "
                     "log-probability; a hypothesis ending in [EOS] is finished. The returned one has the best "
                     "length-penalised score. The step records above follow the returned hypothesis."))
        show_figure(fd.beam_tree_figure(out.beam_tree), key="dec_beam_tree", filename="beam-tree")
    comparison_section(sel, out, cfg.n_decoder_layers, strategy, opts)


def output_line(out, limit: int) -> None:
    """The output, and how the decode ended: [EOS], or the generation limit every page shares."""
    stats = t("{n} tokens, log p = {score} (under the model)", n=len(out.tokens), score=f"{out.score:.3f}")
    if out.finished:
        st.markdown(t("**Output:** `{text}` · {stats}, ended with [EOS]", text=out.text, stats=stats))
        return
    st.markdown(t("**Output:** `{text}` · {stats}", text=out.text, stats=stats))
    loop = getattr(out, "loop", None)
    if loop is not None:  # model.decode's loop guard stopped it (when the caller enables it)
        st.warning(t("The model did not stop: its output ends with “{ngram}” repeated {n} times, more often than "
                     "the source repeats it, so decoding stopped there (a loop).", ngram=" ".join(loop.ngram),
                     n=loop.repeats), icon="🔁")
        return
    st.warning(t("The model did not stop: it produced no [EOS] and was stopped at the {limit}-token limit "
                 "(the model's max_len − 1 positions; the same limit on every page).", limit=limit), icon="✂️")


# ---------------------------------------------------------------- a decoder-only language model


def lm_main(sel) -> None:
    """The step-by-step decoder on a language model: it generates from the sidebar's prompt."""
    rm = sel.ckpt
    cfg = rm.obj.model.cfg
    heads = seed_state(cfg.n_layers, cfg.n_heads)
    seed_from_query("dec_max", "dec_max", LM_MAX_NEW[2], int, int_in(*LM_MAX_NEW[:2]))
    c1, c2 = st.columns([3, 1])
    with c1:
        strategy, options = strategy_controls(LM_STRATEGIES)
    max_new = c2.number_input(t("New tokens"), *LM_MAX_NEW[:2], key="dec_max")
    opts = dict(options)
    gen_opts = {"temperature": 0.0} if strategy == "greedy" else {
        "temperature": float(opts["temperature"]), "top_k": int(opts["top_k"] or 0),
        "top_p": float(opts["top_p"] or 1.0), "seed": int(opts["seed"])}
    try:
        gen = computed("generate", sel.name, sel.text, int(max_new), tuple(sorted(gen_opts.items())))
    except ValueError as e:  # too long for the model, no room left to generate
        show_error(e, t("Shorten or change the text in the sidebar."))
        st.stop()
    n = len(gen.steps)
    if not 1 <= st.session_state["dec_step"] <= n:
        st.session_state["dec_step"] = n
    why = t("stopped at the end token") if gen.stop_reason == "eos" else t("stopped at the token limit")
    # on one line: a generated blank line would otherwise start a paragraph that reads like the page's own text
    out = md_escape(gen.text).replace("\n", "↵")
    st.markdown(t("**Output** ({n} tokens, {why}): ", n=n, why=why) + out)
    layer, head, playing = layer_head_play(cfg.n_layers, heads, n)
    write_query(dec_strategy=strategy, dec_layer=layer, dec_head=head, dec_max=max_new,
                       **query_options(strategy))
    prompt = rm.readable(rm.obj.tokens(gen.prompt_ids))
    st.fragment(run_every=PLAY_SECONDS if playing else None)(lm_step_view)(
        gen, prompt, rm.readable(gen.tokens), rm.readable, layer, head, playing)
    seq2seq_note(sel)


def lm_step_view(gen, prompt: list[str], new: list[str], readable, layer: int, head: str, playing: bool) -> None:
    """One generated token: what the model read, its top 10, and where the new position looked."""
    step = step_slider(len(gen.steps), playing, t("Step t reads the prompt and the t − 1 tokens generated "
                                                  "before it, and predicts token t."))
    rec = gen.steps[step - 1]
    inp = prompt + new[: step - 1]  # the keys this step's query sees (cached), the new position last
    token_chips(inp, new[step - 1], rec.prob, None)
    left, right = st.columns([3, 2])
    with left:
        if len(inp) <= MASK_UP_TO:
            show_figure(fd.lookahead_mask_figure(inp), key="dec_mask", filename="lookahead-mask")
        else:  # thousands of rows of the same triangle teach nothing more; the rule is said instead
            st.caption(t("The look-ahead mask over these {n} positions (drawn up to {k}): the new position, the last "
                         "row, sees all {n} keys; every earlier row sees only the keys up to itself.",
                         n=f"{len(inp):,}", k=MASK_UP_TO))
    with right:
        top = list(zip(readable([tok for tok, _ in rec.top]), [p for _, p in rec.top], strict=True))
        show_figure(FL.top_tokens_figure(top, new[step - 1], title=t(
            "Step {step}: the model's top {k} next tokens", step=step, k=len(top))), key="dec_topk_fig",
            filename="next-tokens")
    attn = rec.attention.numpy()  # [L, H, T so far]
    which = head_label(head)
    first = max(0, len(inp) - KEYS_UP_TO)  # a long prompt: its last keys (thousands of columns draw as nothing)
    every = attn.mean(1, keepdims=True) if head in ("all", "mean") else attn[:, int(head): int(head) + 1]
    show_figure(FL.step_attention_figure(
        every, inp, 0, title=t("Step {step}: where the new position {pos} looked, every layer · {which}", step=step,
                               pos=rec.position, which=t("mean over heads") if head in ("all", "mean") else which),
        first=first), key="dec_every_layer", filename="new-position-every-layer")
    z, labels = rows_of(attn[layer], head)
    show_figure(fd.attention_rows_figure(
        z[:, first:], labels, inp[first:], t("Masked self-attention of the new position {pos} (layer {layer}, "
                                             "{which}): keys ≤ now only", pos=rec.position, layer=layer, which=which),
        query_token=inp[-1], first=first), key="dec_self", filename="decoder-self-attention")
    if first:
        rest = z[:, :first].sum(-1)  # each row's weight on the keys not drawn
        st.caption(t("Keys {a}–{b} of {n}: the last {k}. The weight on the {a} earlier keys, not drawn, is "
                     "{lo}–{hi} per row (each row sums to 1).", a=f"{first:,}", b=f"{len(inp) - 1:,}",
                     n=f"{len(inp):,}", k=KEYS_UP_TO, lo=f"{rest.min():.3f}", hi=f"{rest.max():.3f}"))


def seq2seq_note(sel) -> None:
    """One sentence on what a decoder-only model lacks here, and a toy model that has it."""
    st.info(t("{model} is decoder-only and has no encoder, so it has no cross-attention, no source–target "
              "alignment and no separate target to teacher-force; it generates from a prompt, greedily or by "
              "sampling (beam search and its tree are on the toy models).", model=model_label(sel.name)),
            icon="🧩")
    toys = [n for n in checkpoint_names() if not is_real_name(n)]
    if toys:
        toy = default_checkpoint(toys, current_lang())
        st.button(t("Open this page with {model}", model=model_label(toy)), key="dec_toy_switch",
                  on_click=switch_model, args=(toy,))


def query_options(strategy: str) -> dict:
    """The strategy's options in the URL; the others' removed."""
    ss = st.session_state
    beam, sample = strategy == "beam", strategy == "sample"
    keys = {"dec_beam": beam, "dec_lp": beam, "dec_temp": sample, "dec_topk": sample, "dec_topp": sample,
            "dec_seed": sample}
    return {k: ss[k] if on else None for k, on in keys.items()}


main()
