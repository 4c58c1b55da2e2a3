"""The server warms itself (viz/ui/warmup.py): the first visitor finds the default models and traces cached."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

from model.toy.checkpoint import Checkpoint
from viz.ui import models, warmup
from viz.ui.models import _cached_trace, _load_shared, checkpoint_names, get_trace, load_ckpt
from viz.ui.sidebar import default_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def test_warm_fills_the_caches_the_pages_use(monkeypatch):
    # the toy models' part; SmolLM2's (warm_lm) is tests/test_app_llm.py's, and its analyses a minute more
    monkeypatch.setenv(warmup.WARM_LM_ENV, "0")
    _load_shared.clear()
    _cached_trace.clear()
    traced = []
    real = Checkpoint.trace
    monkeypatch.setattr(Checkpoint, "trace", lambda self, *a, **kw: traced.append(a) or real(self, *a, **kw))
    warmup.warm()
    names = checkpoint_names()
    defaults = {default_checkpoint(names, lang) for lang in ("en", "zh")}
    assert len(traced) == len(defaults) >= 2  # English and Chinese open on different models
    for name in defaults:  # the page's own calls are cache hits now: no new forward pass
        get_trace(name, load_ckpt(name).example)
    assert len(traced) == len(defaults)


def test_warm_never_raises(monkeypatch, caplog):
    def broken():
        raise OSError("no checkpoints here")

    monkeypatch.setattr(models, "checkpoint_names", broken)  # warm() calls models.checkpoint_names
    monkeypatch.setenv(warmup.WARM_LM_ENV, "0")  # the toy models' part fails; SmolLM2's is not this test's
    warmup.warm()  # logged, not raised: the page shows the real error to the first visitor
    assert "warm-up failed" in caplog.text


def test_analyses_are_warmed_unless_the_server_says_no(monkeypatch):
    """ATTENTION_LAB_WARM_ANALYSES=0 (a test server that never shows the lessons): SmolLM2 is still loaded and
    traced, its analyses are left to the first visitor who opens them."""
    from viz.ui import lm_models

    warmed = []
    monkeypatch.setattr(warmup, "warm_analyses", lambda lm: warmed.append(lm))
    monkeypatch.setattr(lm_models, "names", lambda: [])  # no SmolLM2 to load: warm_lm returns at once
    warmup.warm_lm()
    assert warmed == []
    monkeypatch.setattr(lm_models, "names", lambda: ["smollm2"])
    for flag, calls in (("0", 0), ("1", 1)):
        monkeypatch.setenv(warmup.WARM_ANALYSES_ENV, flag)
        warmed.clear()
        warmup.warm_lm()
        assert len(warmed) == calls, flag


def test_start_runs_once_per_process(monkeypatch):
    monkeypatch.setattr(warmup, "warm", lambda: None)
    monkeypatch.setattr(warmup, "_started", threading.Lock())
    first = warmup.start()
    assert first is not None and warmup.start() is None
    first.join(timeout=10)


def test_app_py_is_the_served_app_and_the_script():
    """`streamlit run app.py` finds an st.App (AST discovery) and runs app.py itself as each session's script."""
    from streamlit.web.server.app_discovery import discover_asgi_app

    found = discover_asgi_app(ROOT / "app.py")
    assert found.is_asgi_app and found.app_name == "app"
    tree = ast.parse((ROOT / "app.py").read_text(encoding="utf-8"))
    served = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "App"]
    assert len(served) == 1 and isinstance(served[0].args[0], ast.Name) and served[0].args[0].id == "__file__"

