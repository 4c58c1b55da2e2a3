"""No import circles inside viz/ (viz/ui included) or model/ (issue 30 §6): every `import` of a sibling module,
at the top of a file or inside a function (a late import hides a circle, it does not remove it), is an edge; the
graph must have no cycle. A circle found is printed as the chain of modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, package: str) -> set[str]:
    """The modules of `package` (dotted) that `path` imports anywhere in its body."""
    me = module_name(path)
    base = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base.split(".")[: len(base.split(".")) - node.level + 1]
                mod = ".".join(parent + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n for n in names if n == package or n.startswith(package + ".")}
    return out - {me}


def graph(package: str) -> dict[str, set[str]]:
    files = sorted((ROOT / package.replace(".", "/")).rglob("*.py"))
    mods = {module_name(f): f for f in files}
    g = {}
    for name, f in mods.items():
        # `from viz.ui import lm_models` names the module viz.ui.lm_models; a name that is no module is dropped
        g[name] = {m for m in imports_of(f, package) if m in mods and m != name and not name.startswith(m + ".")}
    return g


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state and (c := visit(n)):
            return c
    return None


@pytest.mark.parametrize("package", ["viz", "model"])
def test_no_import_circle(package):
    cycle = find_cycle(graph(package))
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_checker_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
