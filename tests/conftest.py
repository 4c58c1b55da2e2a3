import json
import os
from pathlib import Path

# OpenMP's wait policy, as the app sets it (viz/ui/warmup.py): PASSIVE unless the runner chose one. With the
# default policy torch's idle OpenMP threads spin while other work wants the cores: on 2 busy cores the fast subset
# took 693 s at OMP_NUM_THREADS=2 against 137 s at 4 (issue 38). libgomp reads the variable once, when torch first
# loads it, so it is set here, above `import torch`: pytest loads this file before anything imports torch (the
# snapshot plugin, model.testing.snapshot, imports none at load), and pytest-xdist's workers start later and inherit
# it (checked with an import hook: the controller and both workers import torch with PASSIVE set, libgomp not yet
# loaded).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402
from browser_support import browser, page, paths, server  # noqa: F401  (real-browser fixtures)

from model import Transformer, TransformerConfig

# Long texts in links are kept on disk (viz/ui/text_store.py): the tests' copies go to a folder of their own, not
# the user's cache. Set before any app or server starts, so the browser tests' `streamlit run` inherits it.
if "ATTENTION_LAB_TEXTS" not in os.environ:
    import tempfile

    os.environ["ATTENTION_LAB_TEXTS"] = tempfile.mkdtemp(prefix="al-texts-")

# ---------------------------------------------------------------- the thread count is the run's
# torch caps OMP_NUM_THREADS at the cores it sees (OMP_NUM_THREADS=4 on 2 cores gives 2 threads), so a run
# at a thread count (.ci/run's second run: OMP_NUM_THREADS=4) would silently test another one: set it here.
# The tests' float32 tolerances must hold at any thread count (tests/tolerance.py); CI runs two.
# Under pytest-xdist (the README's `-n 2`) the workers share the cores: each gets its share, not all of them
# (two workers of two threads each on two cores spend their time waiting for each other).
if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
elif os.environ.get("PYTEST_XDIST_WORKER_COUNT", "").isdigit():
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# ---------------------------------------------------------------- skips are failures in CI
# A skipped test proves nothing. In CI (CI=1, set by .ci/run) a skip fails the run unless the test
# is marked `@pytest.mark.may_skip(reason=...)`; locally a skip stays a skip, listed by -rs.


def strict_skips() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _fail_unexpected_skip(report, may_skip: bool, where: str) -> None:
    if report.skipped and not hasattr(report, "wasxfail") and not may_skip and strict_skips():
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"{where} was skipped in CI ({reason}); a skip is a failure here. Make it run, "
                           "or mark it @pytest.mark.may_skip(reason=...) if skipping is legitimate.")


def pytest_collection_modifyitems(config, items):
    """The fast subset (`pytest -m "not slow"`) leaves out the real-browser tests and every module that
    runs the app (AppTest): they start Streamlit and load models, seconds a test. Other slow tests carry
    @pytest.mark.slow themselves."""
    for item in items:
        module = getattr(item, "module", None)
        runs_app = module is not None and any(n in vars(module) for n in ("AppTest", "model_page"))
        if item.get_closest_marker("browser") or runs_app:
            item.add_marker(pytest.mark.slow)
    # The long files first: under `-n 2 --dist loadfile` each worker takes the next file when it is done, so a long
    # file collected late (alphabetically, tests/test_view_matrix.py) ran on one worker while the other had nothing
    # left. Files with real-browser tests, then files with other slow tests, then the rest; each file's tests stay
    # together and in their order, and every worker sorts the same collection the same way (xdist checks).
    rank: dict[str, int] = {}
    for item in items:
        f = item.nodeid.split("::")[0]
        r = 0 if item.get_closest_marker("browser") else 1 if item.get_closest_marker("slow") else 2
        rank[f] = min(rank.get(f, 2), r)
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_unexpected_skip(outcome.get_result(), item.get_closest_marker("may_skip") is not None, item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield  # a module-level skip (or importorskip) skips a whole file at collection
    _fail_unexpected_skip(outcome.get_result(), False, collector.nodeid)


# ---------------------------------------------------------------- the app under AppTest

APP = str(Path(__file__).resolve().parents[1] / "app.py")


def open_page(file: str | None = None, *, query: dict | None = None, state: dict | None = None,
              timeout: float = 180):
    """The app as a user opens it: the URL's query and the session state first, one run of app.py
    (sidebar), then the page `file` (e.g. "viz/pages/attention.py"). State set to None is left unset."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=timeout)
    at.query_params.update({k: str(v) for k, v in (query or {}).items()})
    for key, value in (state or {}).items():
        if value is not None:
            at.session_state[key] = value
    at.run()
    if file:
        at.switch_page(file)
        at.run()
    return at


def model_page(label: str, name: str, lang: str = "en", *, state: dict | None = None, timeout: float = 300,
               **query) -> "AppTest":  # noqa: F821 - imported below: conftest loads before Streamlit is needed
    """One page (viz/pages/<name>.py) opened by a link to the language model `label` in `lang`, with the session
    state set first; fails on any exception or error element."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=timeout)
    at.query_params.update({"checkpoint": label, "lang": lang, **{k: str(v) for k, v in query.items()}})
    for key, value in (state or {}).items():
        at.session_state[key] = value
    at.switch_page(f"viz/pages/{name}.py")
    at.run()
    assert not at.exception, (name, lang, [e.value for e in at.exception])
    assert not at.error, (name, lang, [e.value for e in at.error])
    return at


@pytest.fixture(scope="module")
def loaded(saved):
    """family -> the lab's model loaded from the module's `saved` (family -> (transformers model, its folder)), each
    loaded once per module (tests/test_families.py, tests/test_families_more.py)."""
    from model.loaders.hf import load_hf_dir

    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = load_hf_dir(saved(family)[1])
        return cache[family]

    return get


def figures(at) -> list[dict]:
    """Every plotly figure the run drew, as the JSON the browser receives."""
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def figures_by_title(at) -> dict[str, dict]:
    """The run's plotly figures (their JSON) keyed by title text."""
    return {(s := json.loads(c.proto.spec))["layout"].get("title", {}).get("text", ""): s
            for c in at.get("plotly_chart")}


_MODULE_START = r"(?:encoder|decoder)\.layers\.\d+\.(?:self|cross)_attn"


def title_names(title: str, start: str) -> bool:
    """Whether a figure's title is the one `start` names. `start` may open with an attention module's capture name
    ("decoder.layers.1.self_attn · head 3"): the title says the module in words (viz.figures.attention.module_title:
    "decoder layer 1 · self-attention · head 3") and its subtitle names the capture, so both are checked. A figure
    that names a capture itself (snapshot diff: "encoder.layers.0.self_attn.weights · head 1: ...") matches as is."""
    import re

    m = re.match(_MODULE_START, start)
    if m is None or title.startswith(start):
        return title.startswith(start)
    main, _, sub = title.partition("<br>")
    module, rest = m.group(), start[m.end():]
    return (sub.startswith(f"<sup>{module} ·") or sub.startswith(f"<sup>{module}</sup>")) and rest in main


def figure_titled(at, part: str) -> dict:
    """The first figure whose title contains `part` (fails listing the titles there are)."""
    found = [f for k, f in figures_by_title(at).items() if part in k or title_names(k, part)]
    assert found, list(figures_by_title(at))
    return found[0]


def shown(fig: dict) -> dict:
    """The visible trace of a figure's JSON: the page's head heatmap carries every head, showing one."""
    return next(d for d in fig["data"] if d.get("visible", True) is True)


def small_config(**kw) -> TransformerConfig:
    base = dict(src_vocab_size=23, tgt_vocab_size=19, d_model=32, n_heads=4, n_encoder_layers=2,
                n_decoder_layers=2, d_ff=64, dropout=0.0, max_len=64)
    return TransformerConfig(**(base | kw))


@pytest.fixture
def small_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(small_config()).eval()


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two sources (the second padded) and two targets (the second padded)."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(1, 23, (2, 9), generator=g)
    tgt = torch.randint(1, 19, (2, 6), generator=g)
    src[1, 6:] = 0
    tgt[1, 4:] = 0
    return src, tgt


def assert_clean(at) -> None:
    """An AppTest run showed no exception and no error message."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


TINY_CORPUS = ["When Mary and John went to the store, John gave a drink to Mary.",
               "The cat sat on the mat. The dog ran in the park.", "Hello world\nTwo lines 1 2 3 4 5"] * 20


def tiny_bpe_tokenizer(d: Path):
    """A byte-level BPE tokenizer (300 pieces, "<|end|>" special) trained on TINY_CORPUS, saved as d/tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TINY_CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|end|>"],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(d / "tokenizer.json"))
    return tok


def lower_full_budget(monkeypatch, budget: int) -> None:
    """Make a language model's full trace over `budget` bytes take the lazy path (as SmolLM2's 512 MiB does past
    276 tokens): run_with_trace's default budget and recorder.DEFAULT_BUDGET_BYTES (read at call time by the
    pages) lowered, and the shared LM trace cache emptied of traces made under another budget."""
    from model.core import recorder
    from model.loaders.lm import LanguageModel
    from viz.ui import models

    d = list(LanguageModel.run_with_trace.__defaults__)  # (names, hooks, budget_bytes, chat, lazy, ...)
    d[2] = budget
    monkeypatch.setattr(LanguageModel.run_with_trace, "__defaults__", tuple(d))
    monkeypatch.setattr(recorder, "DEFAULT_BUDGET_BYTES", budget)
    models._cached_lm_trace.clear()


def tiny_hf_lm(d: Path, family: str = "llama") -> str:
    """A tiny random Hugging Face LM directory in `d` (byte-level BPE tokenizer trained on TINY_CORPUS;
    "llama": GQA, RoPE, RMSNorm, SwiGLU; "gpt2": learned positions, LayerNorm, GELU), saved with
    transformers and registered as a server model (`--model PATH`); returns its label."""
    from viz.ui import lm_models

    tok = tiny_bpe_tokenizer(d)
    torch.manual_seed(0)
    if family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          tie_word_embeddings=True, eos_token_id=0, bos_token_id=0)
        LlamaForCausalLM(cfg).save_pretrained(d)
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_embd=32, n_layer=3, n_head=4, n_positions=128,
                         eos_token_id=0, bos_token_id=0)
        GPT2LMHeadModel(cfg).save_pretrained(d)
    (label,) = lm_models.add_server_models([str(d)])
    return label


def plotly_array(v):
    """Plotly JSON data as numpy: a base64 typed array ({dtype, bdata[, shape]}) or nested lists."""
    import base64

    import numpy as np

    if isinstance(v, dict):
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return a.reshape([int(s) for s in str(v["shape"]).split(",")]) if "shape" in v else a
    return np.asarray(v)


@pytest.fixture(scope="module")
def real():
    """The two shipped real LMs, SmolLM2 (grouped K/V, RoPE) and Gemma 3 270M (q/k-norm, sandwich norms, sliding and
    global layers), by name: the real-model checks of the residual decomposition and of explain_score."""
    from model import load_model

    return {name: load_model(name) for name in ("smollm2", "gemma3")}
