"""Every language-model page with a long prompt in the sidebar (issue 24 §2-§3): a tiny random Llama (256
positions) whose full-trace budget is lowered so that the limit bites at ~30 tokens, as SmolLM2's 512 MiB does
at 276. Each page either draws, or says the limit in the UI's words and language (no API words) and offers the
"Keep the last N tokens" button; a prompt over the model's context length gets its own sentence. en + zh.
Past the full trace's budget, the pages that read the sidebar's trace draw it from a lazy trace (q, k, v and each
layer's output kept; viz.ui.lm_models.RealModel.trace); past the lazy trace's budget too, they say so."""

from __future__ import annotations

import pytest
from conftest import APP, lower_full_budget, tiny_hf_lm
from streamlit.testing.v1 import AppTest

from model.core import recorder

pytestmark = pytest.mark.slow
TIMEOUT = 600
PAGES = ("tokens", "layer", "architecture", "phenomena", "qk", "since2017", "experiments", "flow", "decoder",
         "lessons", "snapshots")
TEXT = "The cat sat on the mat. The dog ran in the park. Attention relates every token to every other one. " * 2
API_WORDS = ("None", "budget_bytes", "CaptureError", "CaptureBudgetError", "lazy=True", "names=")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return tiny_hf_lm(tmp_path_factory.mktemp("tiny-long-pages"), "llama")


@pytest.fixture(scope="module")
def budget(tiny) -> int:
    """A full trace of 32 tokens fits; the test's prompt (~100 tokens) does not."""
    from viz.ui import lm_models

    return lm_models.load(tiny).obj.trace_bytes(32)


@pytest.fixture(autouse=True)
def small_budget(monkeypatch, budget):
    lower_full_budget(monkeypatch, budget)


def run(page: str, model: str, lang: str, text: str, **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"checkpoint": model, "lang": lang, **query})
    at.session_state["source_text"] = text
    at.switch_page(f"viz/pages/{page}.py")
    return at.run()


def shown(at) -> str:
    return " ".join(e.value for kind in ("error", "warning", "info", "markdown", "caption") for e in getattr(at, kind))


def keep_buttons(at) -> list:
    return [b for b in at.button if b.label.startswith(("Keep the last", "保留最后"))]


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("page", PAGES)
def test_long_prompt_is_drawn_or_said_with_a_cut(tiny, page, lang):
    at = run(page, tiny, lang, TEXT)
    assert not at.exception, [e.value for e in at.exception]
    words = shown(at)
    assert not any(w in words for w in API_WORDS), words[:800]
    keep = keep_buttons(at)
    drawn = (at.get("plotly_chart") or at.dataframe or at.table or "|---|" in words  # a figure or a table,
             or at.get("download_button"))  # or Snapshots' trace to download
    assert keep or drawn, words[:800]
    if keep and lang == "en":  # the cut works: the page runs on the prompt's end (en only: a second AppTest run
        # formats the zh model list's labels outside the session, in English, and cannot find them)
        n = int(keep[0].label.split()[3])
        assert 0 < n < 100, keep[0].label  # the prompt is ~100 tokens; 32 fit a full trace (more: fewer names)
        keep[0].click()
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert not keep_buttons(at), shown(at)[:800]
        assert at.query_params["keep"] in (str(n), [str(n)])
    if keep and lang == "zh":
        assert keep[0].label.startswith("保留最后 ") and "个词元" in words, words[:800]


@pytest.mark.parametrize("page", ("tokens", "since2017"))  # (/flow runs on the last 128 tokens of any long text)
def test_over_the_context_length_has_its_own_sentence(tiny, page):
    at = run(page, tiny, "en", "word " * 400)
    assert not at.exception, [e.value for e in at.exception]
    words = shown(at)
    assert "reads at most 256 tokens at once" in words, words[:800]
    assert [b.label for b in keep_buttons(at)] == ["Keep the last 256 tokens"]


def test_flow_causal_check_says_it_is_costly_and_runs_on_the_end(tiny, monkeypatch):
    """Over /flow's FLOW_MAX_TOKENS (128): one forward per token is too slow; a sentence says so and the page
    runs on the text's last 128 tokens (the positions it offers are those)."""
    from viz.ui import lm_models

    monkeypatch.setattr(recorder, "DEFAULT_BUDGET_BYTES", 2**30)
    text = TEXT * 2
    assert 128 < lm_models.load(tiny).obj.encode(text).shape[1] <= 256
    at = run("flow", tiny, "en", text)
    assert not at.exception, [e.value for e in at.exception]
    assert any("one forward pass per token" in w.value and "runs on the text's last 128 tokens" in w.value
               for w in at.warning), shown(at)[:800]
    assert not keep_buttons(at) and at.get("plotly_chart"), shown(at)[:800]
    assert len(at.selectbox(key="flow_pos").options) == 128


@pytest.mark.parametrize("full_budget", [None, 2**30])  # the prompt's trace lazy, or full
def test_head_importance_says_it_is_costly_and_runs_on_the_end(tiny, monkeypatch, full_budget):
    """Over Experiments' LM_IMPORTANCE_MAX_TOKENS (64): one forward per head is too slow; the knock-outs run on
    the text's last 64 tokens, said; the head summary reads the whole prompt's trace."""
    from viz.ui import lm_models

    if full_budget:
        monkeypatch.setattr(recorder, "DEFAULT_BUDGET_BYTES", full_budget)
    assert 64 < lm_models.load(tiny).obj.encode(TEXT).shape[1] <= 256
    at = run("experiments", tiny, "en", TEXT, exp_view="heads")
    assert not at.exception, [e.value for e in at.exception]
    assert at.get("plotly_chart") and not at.warning, shown(at)[:800]  # the summary, before any knock-out
    at.toggle(key="exp_lm_imp_on").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("one forward pass per head" in w.value and "last 64 tokens" in w.value for w in at.warning)
    assert not keep_buttons(at) and len(at.get("plotly_chart")) == 2, shown(at)[:800]


def test_a_new_prompt_drops_the_cut(tiny):
    """`?keep=N` cuts the prompt it was pressed for; typing another prompt shows that one whole (never cut silently)."""
    at = run("tokens", tiny, "en", "word " * 400)  # over the model's 256 positions: the cut is offered
    (keep,) = keep_buttons(at)
    keep.click()
    at.run()
    assert "keep" in at.query_params and any("Showing the last" in i.value for i in at.sidebar.info)
    at.session_state["source_text"] = "A short new prompt."
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert "keep" not in at.query_params
    assert not any("Showing the last" in i.value for i in at.sidebar.info)


LAZY_PAGES = ("tokens", "layer", "architecture", "since2017")  # they read the sidebar's trace, whatever its kind


@pytest.mark.parametrize("page", LAZY_PAGES)
def test_past_the_full_budget_the_page_draws_from_a_lazy_trace(tiny, page):
    from model.core.trace import LazyTrace
    from viz.ui import models

    at = run(page, tiny, "en", TEXT)
    assert not at.exception, [e.value for e in at.exception]
    assert not keep_buttons(at) and not at.error, shown(at)[:800]
    assert at.get("plotly_chart"), shown(at)[:800]
    assert isinstance(models.get_trace(tiny, TEXT), LazyTrace)


def test_past_the_lazy_budget_too_the_limit_names_what_is_kept(tiny, monkeypatch):
    """The lazy trace has a budget of its own: past it, the sentence says what a page keeps and the longest
    length that fits, and the cut runs."""
    from viz.ui import lm_models

    lm = lm_models.load(tiny).obj
    monkeypatch.setattr(recorder, "DEFAULT_BUDGET_BYTES", 1)  # no full trace: the lazy one's budget is the limit
    monkeypatch.setattr(lm_models, "LAZY_BUDGET_BYTES", lm.trace_bytes(48, lazy=True, layers=True))
    fit = lm.max_tokens_within(lm_models.LAZY_BUDGET_BYTES, lazy=True, layers=True)
    assert 48 <= fit < lm.encode(TEXT).shape[1]
    for lang, words in (("en", "each layer's output"), ("zh", "每一层的输出")):
        at = run("tokens", tiny, lang, TEXT)
        assert not at.exception, [e.value for e in at.exception]
        assert words in shown(at), shown(at)[:800]
        assert not any(w in shown(at) for w in API_WORDS)
    (keep,) = keep_buttons(at)
    assert keep.label == f"保留最后 {fit} 个词元"


def test_snapshots_capture_a_long_prompt_lazily(tiny):
    """Snapshots: past the budget of the attention weights, the capture defaults to a lazy trace (queries, keys,
    values); nothing refused, the size said."""
    at = run("snapshots", tiny, "en", TEXT)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error and not keep_buttons(at), shown(at)[:800]
    assert at.radio[0].value == "lazy"
    assert "A lazy trace keeps the queries, keys and values" in shown(at)
    at.radio[0].set_value("*.weights").run()  # the weights alone do not fit: said, with the cut
    assert not at.exception and at.error and keep_buttons(at)


def test_a_long_trace_of_text_or_ids_reads_like_a_full_one(tiny):
    """RealModel.trace past the full budget: the same meta as a full trace (the text, its readable tokens, what each
    position predicts: argmax of the logits, computed from the final hidden states a block at a time), for a
    text or its ids (/llm's `rep=` links pass ids)."""
    import torch

    from model.core.trace import LazyTrace
    from viz.ui import lm_models

    rm = lm_models.load(tiny)
    ids = rm.obj.encode(TEXT)
    with torch.no_grad():
        best = rm.obj.model(ids)[0].argmax(-1)
    for given in (TEXT, ids):
        logits, tr = rm.trace(given)
        assert isinstance(tr, LazyTrace) and logits.shape[1] == 1
        assert tr.meta["next_tokens"] == rm.readable(rm.obj.tokens(best.tolist()))
        assert tr.meta.get("text") == (TEXT if isinstance(given, str) else None)
        assert "decoder.layers.1.norm2.out" in tr and tr.meta["tgt_tokens"] == rm.readable(rm.obj.tokens(ids[0]))


@pytest.mark.parametrize("exact_up_to", [512, 16])  # step by step, or the fast path (both past 16 tokens)
def test_the_attention_page_and_the_other_pages_show_the_same_maps(tiny, monkeypatch, exact_up_to):
    """One prompt, one set of numbers: the Attention page's long trace (q, k, v) and the other pages' lazy trace
    (q, k, v + each layer's output) come from the same forward switch, so every head's map is the same, bit for bit."""
    import torch

    from viz.ui import lm_models, long_views, models

    monkeypatch.setattr(lm_models, "EXACT_UP_TO", exact_up_to)
    monkeypatch.setattr(long_views, "EXACT_UP_TO", exact_up_to)
    long_views._LONG_TRACES.clear()
    attn, pages = long_views._long_trace(tiny, TEXT, False, None), models.get_trace(tiny, TEXT)
    assert bool(attn.meta["fast_attention"]) == bool(pages.meta["fast_attention"]) == (exact_up_to == 16)
    for m in attn.modules():
        for r in ("q", "k", "v", "weights"):
            assert torch.equal(attn[f"{m}.{r}"], pages[f"{m}.{r}"]), (m, r)
    long_views._LONG_TRACES.clear()


def test_inside_a_layer_reads_the_attention_pages_trace(tiny, budget, monkeypatch):
    """Issue 31 §2 (Inside a layer <= 5 s on 2,380 tokens): after the Attention page, Inside a layer runs no forward
    of its own. It reads the lazy trace that page made (q, k, v and each layer's output: one layer run again on
    demand), and that layer's every tensor equals the full capture's, bit for bit (step by step at this length)."""
    import torch

    from model.loaders.lm import LanguageModel
    from viz.ui import lm_models, long_views, models

    monkeypatch.setattr(long_views, "FULL_BUDGET", budget)  # the Attention page's long views at this budget too
    models._LONG_TRACES.clear()
    forwards, real = [], LanguageModel.run_with_trace
    monkeypatch.setattr(LanguageModel, "run_with_trace", lambda self, *a, **kw: forwards.append(kw) or real(
        self, *a, **kw))
    at = run("attention", tiny, "en", TEXT)
    assert not at.exception and not at.error and at.get("plotly_chart"), shown(at)[:800]
    assert [kw.get("lazy") for kw in forwards] == [True]
    at = run("layer", tiny, "en", TEXT, layer="1")
    assert not at.exception and not at.error and at.get("plotly_chart"), shown(at)[:800]
    assert len(forwards) == 1  # the page read the Attention page's trace
    trace = models.get_trace(tiny, TEXT, next_tokens=False)
    assert trace is models.long_lm_trace(tiny, TEXT) and trace.meta["lazy"]["layers"]
    _, full = real(lm_models.load(tiny).obj, TEXT, budget_bytes=None)
    names = [n for n in full.names() if n.startswith("decoder.layers.1.")]
    assert len(names) >= 18 and all(n in trace for n in names)  # norms, q k v (before RoPE too), maps, FFN, out
    for n in names:
        assert torch.equal(trace[n], full[n]), n
    models._LONG_TRACES.clear()
