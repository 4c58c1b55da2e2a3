"""Inside a layer: the residual stream, Add & Norm (post-LN vs pre-LN), the FFN, W^O, one query step by step.

URL parameters: stack (encoder|decoder), layer, sub (self_attn|cross_attn|ffn), token, head; first (a long
prompt: the first token of the window that figures with one row per token show); why=Q,K and why_vs=J (the "Why here?"
panel on the chosen head: viz/ui/why_panel.py).
"""

import streamlit as st

from model.core.describe import attention_of, described
from model.toy import prenorm
from model.toy.tasks import TASKS
from viz.figures import layer as FL
from viz.i18n import N_, option_labels, t
from viz.ui.models import load_ckpt
from viz.ui.render import show_error, show_figure
from viz.ui.sidebar import require_trace
from viz.ui.state import clamp_state, int_in, seed_from_query, write_query
from viz.ui.why_panel import render_why

STACKS = {"encoder": N_("Encoder"), "decoder": N_("Decoder")}
SUMMARY_COLUMNS = (N_("run"), N_("steps"), N_("diverged"), N_("final loss"), N_("final accuracy"))  # prenorm.summary

st.title(t("Inside a layer"))
st.caption(t("What happens after attention. Every sublayer (self-attention, cross-attention, feed-forward) is "
             "wrapped in a residual connection and a LayerNorm (Add & Norm). Pick a layer, a sublayer and a token; "
             "every number below is a tensor the model computed for your input."))
# A long prompt: the lazy trace every page shares (one layer run again on demand); no "input → predicted" labels here
sel, trace = require_trace(next_tokens=False)
stacks = [s for s in STACKS if FL.layers_of(trace, s)]


def choose() -> tuple[str, str, str, int, int]:
    """Stack, layer prefix, sublayer, token and head widgets (seeded from the URL, written back)."""
    seed_from_query("ly_stack", "stack", stacks[0], valid=lambda v: v in stacks)
    c1, c2, c3, c4, c5 = st.columns([1.2, 0.8, 1.6, 1.2, 0.8])
    stack = c1.segmented_control(t("Stack"), stacks, format_func=option_labels(stacks, lambda s: t(STACKS[s])),
                                  key="ly_stack")
    stack = stack or stacks[0]
    layers = FL.layers_of(trace, stack)
    subs = [s for s, _ in FL.sublayers(trace, layers[0])]  # from the model's description: LMs have no cross_attn
    tokens = FL.side_tokens(trace, layers[0])
    n_tok = trace[f"{layers[0]}.out"].shape[1]
    n_heads = attention_of(trace.meta, f"{layers[0]}.self_attn")["n_heads"]
    seed_from_query("ly_layer", "layer", 0, int, int_in(0, len(layers) - 1))
    seed_from_query("ly_sub", "sub", subs[0], valid=lambda v: v in subs)
    seed_from_query("ly_token", "token", 0, int, int_in(0, n_tok - 1))
    seed_from_query("ly_head", "head", 0, int, int_in(0, n_heads - 1))
    for key, hi in (("ly_layer", len(layers) - 1), ("ly_token", n_tok - 1), ("ly_head", n_heads - 1)):
        clamp_state(key, 0, hi)  # another model or text may be smaller
    if st.session_state.get("ly_sub") not in subs:  # cross-attention exists in the decoder only
        st.session_state["ly_sub"] = subs[0]
    layer = c2.selectbox(t("Layer"), range(len(layers)), key="ly_layer")
    sub = c3.radio(t("Sublayer"), subs, format_func=option_labels(subs, lambda s: t(FL.SUBLAYER_TITLES[s])),
                   key="ly_sub", horizontal=True)
    labels = FL.F.token_labels(tokens, n_tok)
    token = c4.selectbox(t("Token"), range(n_tok), format_func=labels.__getitem__, key="ly_token")
    head = c5.selectbox(t("Head"), range(n_heads), key="ly_head")
    write_query(stack=stack, layer=layer, sub=sub, token=token, head=head)
    return stack, layers[layer], sub, token, head


stack, layer, sub, token, head = choose()
tokens = FL.side_tokens(trace, layer)
pre_ln = FL.is_pre_ln(trace)
norm_kind = FL.norm_kind(trace)
norm_label = FL.NORM_LABELS[norm_kind]
wiring_kind = FL.wiring_kind(trace)
WIRING_NOTES = {  # the 2024–2026 wirings, said once at the top (the model's description says which)
    "sandwich": N_("This language model wraps each sublayer in two {norm}s (a sandwich, Gemma 2/3): x → {norm} → "
                   "sublayer → {norm}′ → x + {norm}′(sublayer), so what each sublayer adds to the stream is "
                   "normalised too."),
    "post_norm": N_("This language model puts its {norm} after each sublayer, inside the residual branch (OLMo 2): "
                    "x → sublayer → {norm} → x + {norm}(sublayer(x)). Unlike 2017's post-LN, the sum itself is "
                    "never normalised."),
    "parallel": N_("This language model computes attention and the feed-forward network side by side from the same "
                   "input (parallel residual, GPT-NeoX / Pythia): x + Attn({norm}₁(x)) + FFN({norm}₂(x)). Neither "
                   "sublayer sees the other's output within a layer."),
}
if wiring_kind in WIRING_NOTES:
    st.info(t(WIRING_NOTES[wiring_kind], norm=norm_label), icon="🧱")
elif trace.meta.get("model", {}).get("family") == "decoder_lm":  # the LM's own wiring, said once at the top
    st.info(t("This language model is pre-LN with {norm}: x → {norm} → sublayer → x + sublayer, for its masked "
              "self-attention and then its feed-forward network (no cross-attention, no encoder).", norm=norm_label)
            + (" " + t("RMSNorm only rescales each token's vector by its root mean square: it does not subtract the "
                       "mean and adds no bias β.") if norm_kind == "rmsnorm" else ""), icon="🧱")
try:
    steps = FL.residual_steps(trace, layer, sub)
except KeyError as e:
    show_error(t("This trace has no capture {name}: the model code that records LayerNorm inputs and "
                        "outputs is missing.", name=str(e)))
    st.stop()

@st.cache_resource(show_spinner=False, max_entries=8)
def experiment_trace(wiring: str, text: str):
    """The post-LN vs pre-LN experiment's model of `wiring` (usual warmup) on `text`."""
    return load_ckpt(str(prenorm.model_dir(wiring))).trace(text)[1]


def other_trace(wiring: str):
    """(trace, note) for the wiring the sidebar model does not have: the experiment's model of that wiring,
    on the sidebar text if that task can read it, else on the task's example."""
    ckpt = load_ckpt(str(prenorm.model_dir(wiring)))
    task = ckpt.meta.get("task", "")
    text = sel.text.strip() if task in TASKS and not TASKS[task].input_problems(sel.text) else ckpt.example
    return experiment_trace(wiring, text), t("the {wiring} model trained in the experiment below ({task} task), "
                                              "input “{text}”", wiring=wiring, task=task, text=text)


def wiring_diagram(wiring: str) -> None:
    """One wiring's block diagram with live tensors: the sidebar model's if it has this wiring, else the
    experiment's model of that wiring (same stack, layer and sublayer, clamped to its size)."""
    if (wiring == "pre-LN") == pre_ln and wiring_kind in ("pre", "post-ln"):
        wt, wlayer, wsteps, wtok, note = trace, layer, steps, token, t("the sidebar's model and input")
    else:
        try:
            wt, note = other_trace(wiring)
        except ValueError as e:
            show_error(e)
            return
        wlayers = FL.layers_of(wt, stack)
        wlayer = wlayers[min(int(layer.rsplit(".", 1)[1]), len(wlayers) - 1)]
        wtok = min(token, wt[f"{wlayer}.out"].shape[1] - 1)
        wsteps = FL.residual_steps(wt, wlayer, sub)
    show_figure(FL.wiring_figure(wsteps, wiring == "pre-LN", wtok, sub, norm=FL.norm_kind(wt)),
                       key=f"ly_wiring_{wiring}", filename=f"wiring-{wiring}")
    tok = FL.F.token_labels(FL.side_tokens(wt, wlayer), wtok + 1)[wtok]
    st.caption(t("Live tensors: {note}; {layer}, token {tok}.", note=note, layer=wlayer, tok=tok))


def experiment() -> None:
    """The shipped post-LN vs pre-LN training curves, and a live re-run."""
    try:
        shipped = prenorm.load_results()
    except ValueError as e:
        show_error(e)
        shipped = None
    live = st.session_state.get("ly_prenorm_live")
    res = live or shipped
    if res is None:
        return
    st.caption(t("Seed 002 says post-LN is hard to train without learning-rate warmup and pre-LN is not. The same "
                 "small model ({task} task, {steps} steps, batch {batch}) trained four times: post-LN and pre-LN, "
                 "with warmup 1 and with warmup {w}. Both warmups reach the same peak learning rate {lr}: warmup 1 "
                 "starts there at step 1, warmup {w} climbs to it (Noam schedule, then 1/√step).",
                 task=res["task"], steps=res["steps"], batch=res["batch_size"], w=res["warmups"][1],
                 lr=f"{res.get('peak_lr', float('nan')):.2g}"))
    show_figure(FL.prenorm_figure(res), key="ly_prenorm", filename="post-ln-vs-pre-ln")
    st.dataframe([{t(k): v for k, v in row.items()} for row in prenorm.summary(res)], hide_index=True)
    st.caption(t("{which}. Command: `{cmd}`", cmd=res["command"],
                 which=t("Your live re-run") if live else t("Shipped results (model/results/prenorm.json)")))
    with st.form("ly_prenorm_form"):
        steps_n = st.slider(t("Steps per run (live re-run)"), 20, prenorm.STEPS, 60, step=20, key="ly_prenorm_steps",
                            help=t("Four runs of this many steps; 300 steps take about half a minute each here."))
        if st.form_submit_button(t("Re-run the experiment live"), icon=":material/play_arrow:"):
            bar = st.progress(0.0)
            total = 4 * steps_n
            done = {"n": 0}

            def progress(label: str, step: int, steps: int) -> None:
                done["n"] += 1
                bar.progress(min(1.0, done["n"] / total), text=f"{label}: {step}/{steps}")

            st.session_state["ly_prenorm_live"] = prenorm.run_experiment(steps=steps_n, progress=progress)
            st.rerun()


def token_window() -> int:
    """A long prompt: the first token of the window every figure with one row per token shows (seeded from the
    URL's `first`, written back; a newly chosen token moves the window to it). 0 when every figure fits whole."""
    widths = [4, 2 * steps[0].value.shape[1]]  # LayerNorm's bars, W^O's two heatmaps
    if f"{layer}.ffn.hidden" in trace:
        widths.append((2 if f"{layer}.ffn.gate" in trace else 1) * trace[f"{layer}.ffn.hidden"].shape[-1])
    size = min(FL.window_size(n_tok, w) for w in widths)
    if size >= n_tok:
        return 0
    lead = size // 4  # the chosen token sits this far into the narrowest window
    seed_from_query("ly_first", "first", max(0, token - lead), int, int_in(0, n_tok - 1))
    clamp_state("ly_first", 0, n_tok - 1)
    if st.session_state.get("_ly_window_token", token) != token:  # another token picked: the window follows
        st.session_state["ly_first"] = max(0, token - lead)
    st.session_state["_ly_window_token"] = token
    first = st.number_input(t("First token"), 0, n_tok - 1, key="ly_first",
                            help=t("The figures with one row per token show a window of the prompt starting here. "
                                   "Picking another token moves the window to it."))
    write_query(first=first)
    st.caption(t("This prompt has {n} tokens: a figure with one row per token shows a window of them, at most {k} "
                 "tokens (fewer where each token has many values), from token {first}.", n=f"{n_tok:,}",
                 k=FL.ROWS_UP_TO, first=first))
    return int(first)


def window_note(rows: slice) -> None:
    """Under a windowed figure: which tokens it shows."""
    if rows.stop - rows.start < n_tok:
        st.caption(t("Tokens {a}–{b} of {n}: the window set by “First token” above.", a=rows.start,
                     b=rows.stop - 1, n=f"{n_tok:,}"))


n_tok = steps[0].value.shape[0]
first = token_window()


def rows_of(width: int) -> slice:
    """The window of tokens a figure with `width` values per token shows (all tokens when they fit)."""
    return FL.token_window(n_tok, first, FL.window_size(n_tok, width))


tabs = st.tabs([t("Residual stream & Add & Norm"), t("Post-LN vs pre-LN wiring"), t("Feed-forward network"),
                t("W^O: concatenated heads"), t("One query, step by step")])

# ---------------------------------------------------------------- residual stream
with tabs[0]:
    wiring = "pre-LN" if pre_ln else "post-LN"
    if wiring_kind in WIRING_NOTES:  # sandwich, post norms, parallel: the steps below follow the model's own wiring
        st.caption(t("This model's wiring: **{wiring}**. The residual connection still adds what the sublayer "
                     "computed to its input, so information and gradients have a direct path through the stack. Top: "
                     "the length ‖·‖ of every token's vector at each step, in the order the model computes them; "
                     "bottom: the chosen token's vectors themselves.", wiring=t(FL.WIRING_TITLES[wiring_kind])))
    elif norm_kind == "rmsnorm":
        st.caption(t("This model is **{wiring}**. The residual connection adds the sublayer's output to its input "
                     "(x + sublayer(x)), so information and gradients have a direct path through the stack; RMSNorm "
                     "rescales the sublayer's input by its root mean square (times a learned γ): no mean is "
                     "subtracted and there is no β. Top: the length ‖·‖ of every token's vector at each step; "
                     "bottom: the chosen token's vectors themselves.", wiring=wiring))
    else:
        st.caption(t("This model is **{wiring}**. The residual connection adds the sublayer's output to its input "
                     "(x + sublayer(x)), so information and gradients have a direct path through the stack; LayerNorm "
                     "then rescales each token's vector to mean 0 and variance 1 (times a learned γ, plus β). Top: "
                     "the length ‖·‖ of every token's vector at each step; bottom: the chosen token's vectors "
                     "themselves.", wiring=wiring))
    show_figure(FL.residual_figure(steps, tokens, token), key="ly_resid", filename=f"{layer}-{sub}-residual")
    norm = next(s.name for s in steps if s.label.startswith(norm_label)).removesuffix(".out")
    if norm_kind == "rmsnorm":
        st.caption(t("RMSNorm normalises each token on its own, over its {d} features, by √(mean(x²) + ε). Left: "
                     "the mean μ, which LayerNorm would subtract and RMSNorm keeps (no mean-centring), so the "
                     "output's μ is not 0; right: the mean square it divides by.", d=steps[0].value.shape[1]))
    else:
        st.caption(t("LayerNorm normalises each token on its own, over its {d} features: μ and σ² below are "
                     "computed per token (per row), never across tokens or across the batch.",
                     d=steps[0].value.shape[1]))
    rows = rows_of(4)  # four bars per token
    show_figure(FL.layernorm_figure(FL.F.arr(trace[f"{norm}.in"][0, rows]), FL.F.arr(trace[f"{norm}.out"][0, rows]),
                                    tokens, norm, kind=norm_kind, first=rows.start), key="ly_ln",
                filename=f"{norm}-stats")
    window_note(rows)

# ---------------------------------------------------------------- wirings
with tabs[1]:
    st.caption(t("The paper puts LayerNorm after the residual sum (post-LN): LayerNorm(x + Sublayer(x)). Pre-LN "
                 "normalises only the sublayer's input, x + Sublayer(LayerNorm(x)), so the residual path is a clean "
                 "sum from the embedding to the last layer (one final LayerNorm closes each stack). Each diagram "
                 "carries live numbers for the chosen token: ‖·‖ of every edge and μ, σ² of what LayerNorm receives."))
    if wiring_kind in WIRING_NOTES:  # this model's own wiring first, with its live tensors
        st.markdown(t("**This model's wiring**, as it computes it ({layer}, token {tok}); below it, the paper's two "
                      "wirings for comparison, from the experiment's models.", layer=layer,
                      tok=FL.F.token_labels(tokens, token + 1)[token]))
        show_figure(FL.model_wiring_figure(steps, wiring_kind, token, sub, norm=norm_kind), key="ly_wiring_model",
                    filename=f"wiring-{wiring_kind}")
    for col, wiring in zip(st.columns(2), ("post-LN", "pre-LN"), strict=True):
        with col:
            wiring_diagram(wiring)
    st.subheader(t("Post-LN vs pre-LN in practice: is warmup needed?"))
    experiment()

# ---------------------------------------------------------------- FFN


def plain_ffn(hidden, act: str) -> None:
    st.caption(t("FFN(x) = W₂·act(W₁·x + b₁) + b₂, d_model = {d} → d_ff = {f} → d_model. It is position-wise: the "
                 "same W₁ and W₂ act on every token separately (no token sees another here; mixing happens only in "
                 "attention). Each column is one token's {f} hidden units after {act}.",
                 d=steps[0].value.shape[1], f=hidden.shape[1], act=act.upper()))
    rows = rows_of(hidden.shape[1] + 1)
    show_figure(FL.ffn_figure(hidden[rows], tokens, f"{layer}.ffn", first=rows.start), key="ly_ffn",
                filename=f"{layer}-ffn")
    window_note(rows)
    share = float(FL.zero_share(hidden).mean())  # over every token, not only the window
    if act == "relu":
        st.caption(t("ReLU zeroes every negative pre-activation: on average {s} of the units are exactly 0 for a "
                     "token, so each token uses its own sparse subset of the FFN.", s=f"{share:.1%}"))
    elif act.startswith("gelu"):
        st.caption(t("GELU is smooth: it zeroes no unit exactly ({s} exact zeros), but squashes negative inputs "
                     "towards 0.", s=f"{share:.1%}"))


def gated_ffn(hidden, gate, act: str) -> None:
    """SwiGLU (Llama, SmolLM2): a gate multiplies the up projection, unit by unit."""
    st.caption(t("A gated FFN (SwiGLU): FFN(x) = W_down·({act}(W_gate·x) ⊙ W_up·x), d_model = {d} → d_ff = {f} → "
                 "d_model. The gate and the up projection both read the token; their product, unit by unit, is "
                 "what W_down reads, so a gate near 0 switches its unit off for that token. It is position-wise: "
                 "no token sees another here. Left: the gate's {f} values per token; right: the hidden units.",
                 act=act, d=steps[0].value.shape[1], f=hidden.shape[1]))
    rows = rows_of(2 * hidden.shape[1])
    show_figure(FL.gated_ffn_figure(gate[rows], hidden[rows], tokens, f"{layer}.ffn", act, first=rows.start),
                key="ly_ffn", filename=f"{layer}-ffn")
    window_note(rows)
    st.caption(t("{act} zeroes no unit exactly ({s} exact zeros); {c} of the gate values lie within ±0.05, "
                 "units nearly switched off.", act=act, s=f"{float(FL.zero_share(gate).mean()):.1%}",
                 c=f"{float((abs(gate) < 0.05).mean()):.1%}"))


def moe_ffn() -> None:
    """A mixture of experts in place of the FFN: the router's probabilities and choices in this layer."""
    from viz.figures import modern as FM

    moe = described(trace.meta)["blocks"]["moe"]
    R = f"{layer}.ffn.router"
    probs, ids = FL.F.arr(trace[f"{R}.probs"])[0], FL.F.arr(trace[f"{R}.topk_ids"])[0].astype(int)
    wts = FL.F.arr(trace[f"{R}.topk_weights"])[0]
    st.caption(t("A mixture of experts takes the FFN's place: a router scores the {E} experts for each token "
                 "(p = softmax(W_r·x)), only the top {k} run on it, and their outputs are summed with those "
                 "weights{shared}. Each expert is a gated FFN of d_ff = {f}.", E=moe["n_experts"], k=moe["top_k"],
                 f=moe["d_ff"], shared=t(", plus a shared expert every token goes through") if moe.get("shared")
                 else ""))
    loads = FM.expert_load(ids, int(moe["n_experts"]))[None]  # over every token
    rows = rows_of(probs.shape[1])
    show_figure(FM.moe_figure(probs[rows], ids[rows], loads, FL.window_labels(tokens, rows),
                              int(layer.rsplit(".", 1)[1])), key="ly_moe", filename=f"{layer}-moe")
    window_note(rows)
    show_figure(FM.router_choice_figure(probs[token], ids[token], wts[token], tokens[token]), key="ly_router",
                filename=f"{layer}-router-{token}")


with tabs[2]:
    act = described(trace.meta).get("blocks", {}).get("activation") or trace.meta["config"]["activation"]
    if f"{layer}.ffn.router.probs" in trace:
        moe_ffn()
    elif f"{layer}.ffn.gate" in trace:
        gated_ffn(FL.F.arr(trace[f"{layer}.ffn.hidden"])[0], FL.F.arr(trace[f"{layer}.ffn.gate"])[0],
                  FL.ACT_LABELS.get(act, act))
    else:
        plain_ffn(FL.F.arr(trace[f"{layer}.ffn.hidden"])[0], act)

# ---------------------------------------------------------------- W^O
attn = f"{layer}.{sub if sub != 'ffn' else 'self_attn'}"
with tabs[3]:
    st.caption(t("MultiHead(Q, K, V) = Concat(head_1, …, head_h)·W^O. Each head's output z (tokens × d_k) is "
                 "transposed back and the heads are laid side by side (tokens × h·d_k = d_model); W^O, a "
                 "d_model × d_model matrix, then mixes the heads into the sublayer's output. Shown for `{attn}`.",
                 attn=attn))
    rows = rows_of(2 * steps[0].value.shape[1])
    show_figure(FL.wo_figure(FL.head_outputs(trace, attn, rows), trace[f"{attn}.out"][0, rows], tokens, attn,
                             first=rows.start), key="ly_wo", filename=f"{attn}-wo")
    window_note(rows)

# ---------------------------------------------------------------- one query
with tabs[4]:
    k_tokens = FL.meta_tokens(trace, attention_of(trace.meta, attn)["key_tokens"])  # the keys' side
    st.caption(t("Attention as a soft lookup, for one query (the chosen token) and head {h} of `{attn}`: score the "
                 "query against every key, scale, mask, turn the scores into weights that sum to 1, and return the "
                 "weighted sum of the values.", h=head, attn=attn))
    qs = FL.query_steps(trace, attn, head, token)
    info = attention_of(trace.meta, attn)
    notes = []
    if info["n_kv_heads"] < info["n_heads"]:  # grouped-query attention
        notes.append(t("Grouped-query attention: {H} query heads share {G} K/V heads, so query head {h} reads the "
                       "keys and values of K/V head {g} (h // {r}).", H=info["n_heads"], G=info["n_kv_heads"], h=head,
                       g=int(qs["kv_head"]), r=info["n_heads"] // info["n_kv_heads"]))
    if "qk_unrot" in qs:
        notes.append(t("Rotary positions (RoPE): q and k below are rotated by their positions before the dot "
                       "product (the captures `.q`, `.k`), so q·k depends on how far apart the two tokens are; the "
                       "table's last column is the same dot product before the rotation (`.q_unrot`, `.k_unrot`)."))
    n_keys = len(qs["qk"])
    size = FL.window_size(n_keys, 4 + int(qs["d_k"]))  # four bars per key, and its p·v in the last panel
    if size < n_keys:  # a long prompt: a window of keys, what the others add to z summed
        if qs["blocked"][token + 1:].all():  # causal: the last keys it sees, up to itself (later ones add 0)
            keys = slice(max(0, token + 1 - size), token + 1)
            note = t("This query has {n} keys: the chart and the table show keys {a}–{b}, the last {k} it can see "
                     "(up to itself); in the last panel, what the other keys add to z is one grey bar.",
                     n=f"{n_keys:,}", a=keys.start, b=keys.stop - 1, k=keys.stop - keys.start)
        else:  # it sees both sides (an encoder): the keys around it
            keys = FL.token_window(n_keys, token - size // 2, size)
            note = t("This query has {n} keys: the chart and the table show keys {a}–{b}, the {k} around it; in the "
                     "last panel, what the other keys add to z is one grey bar.", n=f"{n_keys:,}", a=keys.start,
                     b=keys.stop - 1, k=size)
        qs = FL.query_window(qs, keys)
        notes.append(note)
    for note in notes:
        st.caption(note)
    show_figure(FL.query_figure(qs, FL.F.token_labels(tokens, token + 1)[token], k_tokens),
                       key="ly_query", filename=f"{attn}-head{head}-query{token}")
    k_first = int(qs.get("first", 0))
    k_labels = FL.window_labels(k_tokens, slice(k_first, k_first + len(qs["qk"])))
    # The chart's number format (FL.F.num), so a cell reads as its bar's label: 1.58e-09, not 0.000000001.
    plain = "scale" not in qs or abs(float(qs["scale"]) * float(qs["d_k"]) ** 0.5 - 1) < 1e-6
    scaled_col = "÷√d_k" if plain else f"× {float(qs['scale']):.4g}"  # the model's own query scale
    last = qs.get("capped", qs["scaled"])  # what softmax reads: the soft-capped scores where the model caps
    st.dataframe([{t("key"): k_labels[i], "q·k": FL.F.num(qs["qk"][i]), scaled_col: FL.F.num(qs["scaled"][i]),
                   **({t("capped"): FL.F.num(qs["capped"][i])} if "capped" in qs else {}),
                   "+ M": "−∞" if qs["blocked"][i] else FL.F.num(last[i]), "p": FL.F.num(qs["weights"][i]),
                   **({t("q·k without RoPE"): FL.F.num(qs["qk_unrot"][i])} if "qk_unrot" in qs else {})}
                  for i in range(len(k_labels))], hide_index=True)
    # "Why here?" on this head: no per-cell heatmap on this page to click, so the panel's number inputs choose the
    # cell (any query of this sublayer, not only the chosen token). The lab's own families and the toy models have
    # the residual decomposition the split needs; this page never opens a model via transformers (require_trace).
    render_why(getattr(sel.ckpt, "obj", sel.ckpt), trace, attn, int(layer.rsplit(".", 1)[1]), head, list(tokens),
               key="ly", key_tokens=list(k_tokens), label=f"{FL.F.module_title(attn, trace.meta)} · H{head}")
