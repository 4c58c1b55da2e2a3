"""The code layout's promises (issue 26 §0): figure builders never import Streamlit, the public import paths of
the contract still work, and the two old import circles stay cut (each side imports first, on its own)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIGURES = sorted(p.stem for p in (ROOT / "viz" / "figures").glob("*.py") if p.stem != "__init__")


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_figures_notebook_and_lessons_import_no_streamlit():
    """One fresh interpreter importing every figure module, the notebook API and the lessons: no streamlit."""
    mods = [f"viz.figures.{m}" for m in FIGURES] + ["viz.notebook", "viz.lessons"]
    assert len(FIGURES) >= 12
    out = run_python(f"import sys\nimport {', '.join(mods)}\nprint('streamlit' in sys.modules)")
    assert out == "False"


def test_viz_is_laid_out_by_role():
    assert not (ROOT / "viz" / "common.py").exists() and not list((ROOT / "viz").glob("figures_*.py"))
    for role in ("models", "state", "sidebar", "text", "render", "heap"):
        assert (ROOT / "viz" / "ui" / f"{role}.py").exists(), role


def test_model_tasks_is_the_toy_tasks():
    from model.tasks import TASKS
    from model.toy import tasks

    assert TASKS is tasks.TASKS and {"dates", "reverse", "zh-en"} <= set(TASKS)
    assert TASKS["dates"].sample(2, seed=0) == tasks.TASKS["dates"].sample(2, seed=0)


@pytest.mark.parametrize("first", ["model.analysis.patching", "model.analysis.phenomena",
                                   "model.loaders.bpe", "model.loaders.gguf"])
def test_no_import_circle(first):
    """Each module of the two old circles imports first in a fresh interpreter, and the shared names are one object."""
    run_python(f"import {first}\n"
               "from model.analysis import inputs, patching, phenomena\n"
               "assert patching.as_ids is phenomena.as_ids is inputs.as_ids\n"
               "assert patching.fit_batch is phenomena.fit_batch is inputs.fit_batch\n"
               "from model.loaders import bpe, errors, gguf\n"
               "assert gguf.GGUFError is bpe.GGUFError is errors.GGUFError\n")


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (function-level imports too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


@pytest.mark.parametrize("a, b", [("model/analysis/patching.py", "model/analysis/phenomena.py"),
                                  ("model/loaders/bpe.py", "model/loaders/gguf.py")])
def test_the_two_old_circles_stay_cut(a, b):
    """At most one of each pair imports the other (before: patching <-> phenomena, bpe <-> gguf)."""
    mod = {p: p.removesuffix(".py").replace("/", ".") for p in (a, b)}
    a_imports_b = mod[b] in imported(ROOT / a)
    b_imports_a = mod[a] in imported(ROOT / b)
    assert not (a_imports_b and b_imports_a), (a, b)
