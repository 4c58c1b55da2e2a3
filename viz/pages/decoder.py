"""Step-by-step decoder: watch the output being generated one token at a time.

Strategy (greedy, beam, sampling) -> one recorded decode (`ckpt.translate`) -> a step slider
(and play button) over its `Step` records: look-ahead mask, the new token's self- and
cross-attention, the top-k next tokens; then the beam tree, the accumulated alignment, and a
teacher-forced pass over the same output that must agree with the step-by-step numbers.
"""

from __future__ import annotations

import html
import time

import numpy as np
import streamlit as st
import torch

from viz import common
from viz import figures_decode as fd

STRATEGIES = {"greedy": "Greedy", "beam": "Beam search", "sample": "Sampling"}
PLAY_SECONDS = 0.9  # one step per tick while playing
AGREE_ATOL = 1e-4  # cached step-by-step vs one parallel pass: float32 reassociation only
MAX_NEW_TOKENS = 64  # the toy tasks' outputs are far shorter; bounds a runaway (untrained) decode


# ---------------------------------------------------------------- cached computations


@st.cache_resource(show_spinner="Decoding…", max_entries=32)
def translate(name: str, text: str, strategy: str, options: tuple):
    """One recorded decode, shared read-only by every session (same inputs, same output)."""
    return common.load_ckpt(name).translate(text, strategy, **dict(options))


@st.cache_resource(show_spinner="Teacher-forced pass…", max_entries=32)
def teacher_forced(name: str, text: str, out_ids: tuple[int, ...]):
    """One parallel pass over [BOS] + the decoded ids (ids, not text: re-tokenizing could differ)."""
    ckpt = common.load_ckpt(name)
    bos = ckpt.tgt_tokenizer.bos_id
    tgt = torch.tensor([[bos, *out_ids][: ckpt.cfg.max_len]])
    names = ["logits", "decoder.layers.*.self_attn.weights", "decoder.layers.*.cross_attn.weights"]
    with torch.no_grad():
        return ckpt.model.run_with_trace(ckpt.encode_source(text), tgt, names=names)[1]


# ---------------------------------------------------------------- widgets and state


def head_label(h: str) -> str:
    return {"all": "all heads (+ mean)", "mean": "mean over heads"}.get(h, f"head {h}")


def seed_state(n_layers: int, n_heads: int) -> list[str]:
    """Widget defaults from the URL; returns the head options."""
    q = common.seed_from_query
    heads = ["all", "mean", *map(str, range(n_heads))]
    q("dec_strategy", "dec_strategy", "greedy", valid=lambda v: v in STRATEGIES)
    q("dec_beam", "dec_beam", 4, int, common.int_in(1, 8))
    q("dec_lp", "dec_lp", 0.6, float, lambda v: 0.0 <= v <= 2.0)
    q("dec_temp", "dec_temp", 1.0, float, lambda v: 0.1 <= v <= 3.0)
    q("dec_topk", "dec_topk", 0, int, common.int_in(0, 50))
    q("dec_topp", "dec_topp", 1.0, float, lambda v: 0.05 <= v <= 1.0)
    q("dec_seed", "dec_seed", 0, int, common.int_in(0, 2**31 - 1))
    q("dec_step", "dec_step", 0, int, lambda v: isinstance(v, int) and v >= 1)  # 0: the last step
    q("dec_layer", "dec_layer", n_layers - 1, int, common.int_in(0, n_layers - 1))
    q("dec_head", "dec_head", "all", valid=lambda v: v in heads)
    # Another checkpoint may have fewer layers or heads than the URL or the last model had.
    if not 0 <= st.session_state["dec_layer"] < n_layers:
        st.session_state["dec_layer"] = n_layers - 1
    if st.session_state["dec_head"] not in heads:
        st.session_state["dec_head"] = "all"
    return heads


def strategy_controls() -> tuple[str, tuple]:
    """Strategy and its options, as a hashable tuple for the cache."""
    strategy = st.segmented_control("Strategy", list(STRATEGIES), format_func=STRATEGIES.get,
                                    key="dec_strategy", required=True)
    opts: dict = {"max_new_tokens": MAX_NEW_TOKENS}
    cols = st.columns(4)
    if strategy == "beam":
        opts["beam_width"] = cols[0].slider("Beam width", 1, 8, key="dec_beam",
                                            help="Hypotheses kept per step; width 1 is greedy.")
        opts["length_penalty"] = cols[1].slider(
            "Length penalty α", 0.0, 2.0, step=0.1, key="dec_lp",
            help="Finished hypotheses are ranked by log p / ((5 + |Y|) / 6)^α (GNMT); the paper used 0.6.")
    elif strategy == "sample":
        opts["temperature"] = cols[0].slider(
            "Temperature", 0.1, 3.0, step=0.1, key="dec_temp",
            help="Sample from softmax(logits / T): T < 1 sharpens, T > 1 flattens.")
        k = cols[1].slider("Top-k (0 = off)", 0, 50, key="dec_topk",
                           help="Keep only the k most likely tokens.")
        opts["top_k"] = k or None
        p = cols[2].slider("Top-p (nucleus)", 0.05, 1.0, step=0.05, key="dec_topp",
                           help="Keep the fewest most likely tokens whose probability mass reaches p.")
        opts["top_p"] = None if p >= 1.0 else p
        opts["seed"] = cols[3].number_input("Seed", 0, 2**31 - 1, key="dec_seed",
                                            help="Same seed, same sample: the run is reproducible.")
    return strategy, tuple(sorted(opts.items()))


def start_play(n_steps: int) -> None:
    if st.session_state.get("dec_step", 1) >= n_steps:
        st.session_state["dec_step"] = 1  # replay from the start
    st.session_state["dec_playing"] = True
    st.session_state["dec_tick"] = time.monotonic()


def stop_play() -> None:
    st.session_state["dec_playing"] = False


# ---------------------------------------------------------------- drawing


def rows_of(w: np.ndarray, head: str) -> tuple[np.ndarray, list[str]]:
    """[H, K] weights of one layer -> the rows to draw for the head choice, with labels."""
    if head == "all":
        return np.vstack([w, w.mean(0, keepdims=True)]), [f"head {h}" for h in range(len(w))] + ["mean"]
    if head == "mean":
        return w.mean(0, keepdims=True), ["mean of heads"]
    return w[int(head): int(head) + 1], [f"head {head}"]


def alignment_rows(out, layer: int, head: str, upto: int) -> np.ndarray:
    """Cross-attention of every step (one head, or the mean), rows after `upto` left blank (NaN)."""
    rows = np.stack([s.cross_attn[layer].numpy() for s in out.steps])  # [T, H, S]
    rows = rows.mean(1) if head in ("all", "mean") else rows[:, int(head)]
    rows = rows.astype(np.float32)
    rows[upto + 1:] = np.nan
    return rows


def token_chips(tokens: list[str], new: str, p: float) -> None:
    """The decoder input so far, then the token chosen at this step."""
    chip = ("<span style='display:inline-block;margin:2px;padding:2px 7px;border-radius:6px;"
            "font-family:monospace;background:{bg};color:{fg}'>{t}</span>")
    seen = "".join(chip.format(bg="#E8F0FA", fg="#1F3B57", t=html.escape(t)) for t in tokens)
    chosen = chip.format(bg=fd.ORANGE, fg="white", t=html.escape(new))
    st.html(f"<div>Decoder input: {seen} &nbsp;→&nbsp; chosen: {chosen} "
            f"<span style='color:#666'>(p = {p:.4f})</span></div>")


def step_view(out, layer: int, head: str, playing: bool) -> None:
    """Everything that depends on the step (a fragment, so playing redraws only this)."""
    n = len(out.steps)
    if playing and time.monotonic() - st.session_state.get("dec_tick", 0.0) >= PLAY_SECONDS * 0.8:
        st.session_state["dec_tick"] = time.monotonic()
        if st.session_state["dec_step"] < n:
            st.session_state["dec_step"] += 1
        else:
            stop_play()
            st.rerun()  # re-register the fragment without its timer
    step = st.slider("Step", 1, n, key="dec_step", disabled=n == 1,
                     help="Step t reads [BOS] y1 … y(t-1) and predicts y(t).") if n > 1 else 1
    common.write_query(dec_step=step)
    t = step - 1
    rec = out.steps[t]
    inp = out.tgt_tokens[: t + 1]  # [BOS] + tokens generated before this step
    token_chips(inp, rec.token, rec.prob)
    where = f"layer {layer}, {head_label(head)}"
    left, right = st.columns([3, 2])
    with left:
        common.show_figure(fd.lookahead_mask_figure(inp), key="dec_mask", filename="lookahead-mask")
    with right:
        title = f"Step {step}: top-{len(rec.topk)} next tokens"
        common.show_figure(fd.topk_figure(rec.topk, rec.token, title), key="dec_topk_fig", filename="topk")
    z, labels = rows_of(rec.self_attn[layer].numpy(), head)
    common.show_figure(fd.attention_rows_figure(
        z, labels, inp, f"Decoder self-attention of the new position ({where}): keys ≤ now only",
        query_token=inp[-1]), key="dec_self", filename="decoder-self-attention")
    z, labels = rows_of(rec.cross_attn[layer].numpy(), head)
    common.show_figure(fd.attention_rows_figure(
        z, labels, out.src_tokens, f"Cross-attention of the new position ({where}): Q from the decoder, "
        "K, V from the encoder", query_token=inp[-1]), key="dec_cross", filename="cross-attention")
    which = "mean over heads" if head in ("all", "mean") else f"head {head}"
    common.show_figure(fd.alignment_figure(
        alignment_rows(out, layer, head, t), [s.token for s in out.steps], out.src_tokens, current=t,
        title=f"Source–target alignment so far (cross-attention, layer {layer}, {which})"),
        key="dec_align", filename="alignment")


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def agreement_rows(out, trace, n_layers: int) -> list[dict]:
    """Per step: step-by-step records vs the teacher-forced pass at the same position."""
    logits = trace["logits"][0]
    rows = []
    for t, s in enumerate(out.steps[: logits.shape[0]]):
        d_self = max(max_abs(s.self_attn[i], trace[f"decoder.layers.{i}.self_attn.weights"][0, :, t, : t + 1])
                     for i in range(n_layers))
        d_cross = max(max_abs(s.cross_attn[i], trace[f"decoder.layers.{i}.cross_attn.weights"][0, :, t])
                      for i in range(n_layers))
        rows.append({"step": t + 1, "token": s.token,
                     "p step-by-step": float(torch.softmax(s.logits, -1)[s.token_id]),
                     "p teacher-forced": float(torch.softmax(logits[t], -1)[s.token_id]),
                     "max |Δ logits|": max_abs(s.logits, logits[t]),
                     "max |Δ self-attn|": d_self, "max |Δ cross-attn|": d_cross})
    return rows


def comparison_section(sel, out, n_layers: int) -> None:
    st.subheader("Teacher forcing vs free-running")
    st.caption("Training feeds the decoder the whole target at once: [BOS] y1 … yT in **one parallel "
               "pass**, the lower-triangular (look-ahead) mask keeping position t from seeing t+1 …. "
               "Generation feeds its own outputs back one step at a time (keys/values cached). Run the "
               "parallel pass over the decoded output: every logit and attention weight must equal the "
               "step-by-step record.")
    ckpt = sel.ckpt
    try:
        tf = teacher_forced(sel.name, sel.text, tuple(out.token_ids))
    except ValueError as e:
        common.show_error(e)
        return
    rows = agreement_rows(out, tf, n_layers)
    worst = max((max(r["max |Δ logits|"], r["max |Δ self-attn|"], r["max |Δ cross-attn|"]) for r in rows),
                default=0.0)
    if worst <= AGREE_ATOL:
        st.success(f"They agree: the largest difference over {len(rows)} steps is {worst:.2e} "
                   f"(≤ {AGREE_ATOL:g}, float32 rounding).", icon="✅")
    else:
        st.error(f"They disagree: max |Δ| = {worst:.3g} > {AGREE_ATOL:g}. The cached step-by-step decoder "
                 "and the parallel pass should compute the same numbers.", icon="❌")
    reference = None
    ref_rows: list[dict] = []
    if sel.target:
        problem = common.text_problems(sel.target)
        if problem:
            common.show_error("Reference target: " + problem)
        else:
            try:
                ref_rows = reference_table(ckpt, sel, out)
                reference = ([r["reference"] for r in ref_rows], [r["p(reference)"] for r in ref_rows])
            except ValueError as e:
                common.show_error(e, "Shorten or change the target in the sidebar.")
    common.show_figure(fd.agreement_figure([r["token"] for r in rows], [r["p step-by-step"] for r in rows],
                                           [r["p teacher-forced"] for r in rows], reference),
                       key="dec_agree", filename="teacher-forcing-vs-free-running")
    st.dataframe(rows, hide_index=True, column_config={
        k: st.column_config.NumberColumn(format="%.2e") for k in
        ("max |Δ logits|", "max |Δ self-attn|", "max |Δ cross-attn|")})
    if not sel.target:
        st.caption("Type a reference in the sidebar's *Target (teacher forcing)* box to also see what the "
                   "model predicts, position by position, when it is fed that reference.")
    if ref_rows:
        hits = sum(r["teacher-forced argmax"] == r["reference"] for r in ref_rows)
        nll = -float(np.mean(np.log(np.maximum([r["p(reference)"] for r in ref_rows], 1e-12))))
        st.markdown(f"**Reference** “{html.escape(sel.target)}”: teacher-forced token accuracy "
                    f"{hits}/{len(ref_rows)}, cross-entropy {nll:.4f} nats/token. Where the free-running "
                    "column differs, generation went its own way (exposure bias: at training time the "
                    "decoder always saw the reference prefix).")
        st.dataframe(ref_rows, hide_index=True)


def reference_table(ckpt, sel, out) -> list[dict]:
    trace = common.get_trace(sel.name, sel.text, sel.target)
    probs = torch.softmax(trace["logits"][0], -1)
    tok = ckpt.tgt_tokenizer
    want_ids = [*ckpt.target_ids(sel.target), tok.eos_id]
    free = [s.token for s in out.steps]
    rows = []
    for t, want in enumerate(want_ids):
        rows.append({"position": t + 1, "reference": tok.id_to_token(want),
                     "p(reference)": float(probs[t, want]),
                     "teacher-forced argmax": tok.id_to_token(int(probs[t].argmax())),
                     "free-running": free[t] if t < len(free) else "—"})
    return rows


# ---------------------------------------------------------------- page


def main() -> None:
    st.title("Step-by-step decoder")
    st.caption(
        "The decoder generates one token per step: step t reads [BOS] y1 … y(t-1) and predicts y(t). "
        "Its self-attention adds the look-ahead mask M, 0 on and below the diagonal and **−∞ above** it, "
        "to QKᵀ/√d_k, so softmax gives the future exactly 0 weight. Cross-attention takes Q from the decoder "
        "and K, V from the encoder output. Greedy takes the most likely token, beam search keeps the best W "
        "prefixes, sampling draws from softmax(logits / T) after top-k / top-p filtering.")
    sel = common.selection()
    if sel is None:
        st.stop()
    problem = common.text_problems(sel.text)
    if problem:
        common.show_error(problem)
        st.stop()
    ckpt = sel.ckpt
    cfg = ckpt.cfg
    heads = seed_state(cfg.n_decoder_layers, cfg.n_heads)
    strategy, options = strategy_controls()
    try:
        note = common.unk_note(ckpt.src_tokenizer.pieces(sel.text))
        out = translate(sel.name, sel.text, strategy, options)
    except ValueError as e:
        common.show_error(e, "Shorten or change the text in the sidebar.")
        st.stop()
    if note:
        st.warning(note, icon="🔤")
    n = len(out.steps)
    if n == 0:
        st.info("The decoder produced no step.")
        st.stop()
    if not 1 <= st.session_state["dec_step"] <= n:
        st.session_state["dec_step"] = n
    ended = "ended with [EOS]" if out.finished else f"stopped at the {MAX_NEW_TOKENS}-token limit"
    st.markdown(f"**Output:** `{out.text}` · {len(out.tokens)} tokens, {ended}, log p = {out.score:.3f}")

    c1, c2, c3 = st.columns([1, 1.5, 3])
    layer = c1.selectbox("Decoder layer", range(cfg.n_decoder_layers), key="dec_layer")
    head = c2.selectbox("Head", heads, format_func=head_label, key="dec_head")
    playing = bool(st.session_state.get("dec_playing")) and n > 1
    with c3:
        st.write("")  # align the button with the selects
        if playing:
            st.button("⏸ Pause", on_click=stop_play, key="dec_pause")
        else:
            st.button("▶ Play", on_click=start_play, args=(n,), key="dec_play", disabled=n == 1,
                      help=f"Step through the decode, one step every {PLAY_SECONDS:g} s.")
    common.write_query(dec_strategy=strategy, dec_layer=layer, dec_head=head, **query_options(strategy))

    st.fragment(run_every=PLAY_SECONDS if playing else None)(step_view)(out, layer, head, playing)

    if out.beam_tree is not None:
        st.subheader("Beam tree")
        st.caption("Each step extends every live hypothesis by every token and keeps the best by cumulative "
                   "log-probability; a hypothesis ending in [EOS] is finished. The returned one has the best "
                   "length-penalised score. The step records above follow the returned hypothesis.")
        common.show_figure(fd.beam_tree_figure(out.beam_tree), key="dec_beam_tree", filename="beam-tree")
    comparison_section(sel, out, cfg.n_decoder_layers)


def query_options(strategy: str) -> dict:
    """The strategy's options in the URL; the others' removed."""
    ss = st.session_state
    beam, sample = strategy == "beam", strategy == "sample"
    keys = {"dec_beam": beam, "dec_lp": beam, "dec_temp": sample, "dec_topk": sample, "dec_topp": sample,
            "dec_seed": sample}
    return {k: ss[k] if on else None for k, on in keys.items()}


main()
