"""The READMEs run (issue 38 §4): every repository path, module, attribute and `python -m` command that README.md
and README.zh.md name exists, imports and resolves; the Layout section names every module of the packages it
describes; every ```python block runs on its own, in a fresh interpreter in a temporary directory (a block that
defines a `trace_snapshot` test runs under pytest: once to write its snapshot, once to pass against it).

Also: the page count the README gives is the sidebar's, the fast subset's time is one figure wherever it is
written, and the snapshot plugin's messages name functions that exist. Only the block runs are slow (a fresh
interpreter each, SmolLM2 loaded three times); the rest is in the fast subset.

A block may be left out only with the marker `<!-- readme-test: skip (reason) -->` on the line above it; the
markers are listed (and counted) by `test_the_skipped_blocks_are_few_and_say_why`."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READMES = ("README.md", "README.zh.md")
SKIP = re.compile(r"<!--\s*readme-test:\s*skip\s*\(([^)]+)\)\s*-->")
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
# Where a top-level path starts: a token that starts so names a file of this repository.
TOP = ("model/", "viz/", "tests/", "bench/", "deploy/", "examples/", "docs/", ".ci/", "app.py", "pyproject.toml")
DOTTED = re.compile(r"(?<![\w./-])((?:model|viz)(?:\.[A-Za-z_]\w*)+)")
FILE_EXT = (".safetensors", ".json", ".gguf", ".py", ".bin", ".html", ".md", ".toml", ".ipynb")
PRINTED = r"^print\(.*\)\s+#\s*(.+?)\s*$"  # a print with what it prints in its trailing comment
MODULE_TIMEOUT = 600  # a block that loads SmolLM2 cold on a busy 2-core machine


def text(readme: str) -> str:
    return (ROOT / readme).read_text(encoding="utf-8")


def blocks(readme: str) -> list[tuple[str, str, int, str | None]]:
    """(language, code, line, skip reason or None) of each fenced block."""
    src = text(readme)
    out = []
    for m in FENCE.finditer(src):
        line = src.count("\n", 0, m.start()) + 1
        before = src[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        out.append((m.group(1), m.group(2), line, skip.group(1) if skip else None))
    return out


def spans(readme: str) -> list[str]:
    """The inline code spans, outside fenced blocks."""
    return SPAN.findall(FENCE.sub("", text(readme)))


@cache
def tracked() -> tuple[set[str], set[str]]:
    """(files, directories) of the working tree, relative to the root: git's files (tracked or not ignored)."""
    done = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True)
    files = {f for f in done.stdout.splitlines() if (ROOT / f).exists()} if done.returncode == 0 else set()
    if not files:  # not a git checkout (an sdist): walk the tree
        files = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts}
    dirs = {str(Path(f).parents[i]) for f in files for i in range(len(Path(f).parts) - 1)}
    return files, dirs


def commands(readme: str) -> list[str]:
    """Where commands are written: every code span, and each line of the bash/console blocks."""
    lines = spans(readme)
    for lang, code, _, _ in blocks(readme):
        if lang in ("bash", "console", "sh", "shell"):
            lines += [ln.removeprefix("$ ") for ln in code.splitlines()]
    return lines


def path_tokens(readme: str) -> set[str]:
    """Every token that names a path of this repository: in code spans, and in bash blocks (console blocks show a
    user's own project: their paths are theirs)."""
    sources = spans(readme) + [ln for lang, code, _, _ in blocks(readme) if lang in ("bash", "sh")
                               for ln in code.splitlines()]
    found = set()
    for s in sources:
        for tok in re.split(r"[\s,;()\[\]'\"=]+", s):
            tok = tok.rstrip(".:")
            if not tok or any(c in tok for c in "*<>{}~$") or "://" in tok or tok.startswith(("/", "-", "path/to")):
                continue
            # a path relative to its section (`toy/checkpoints/`, `pages/lessons.py`): a folder or a file's name
            relative = "/" in tok and (tok.endswith("/") or Path(tok).suffix in FILE_EXT + (".sh", ".cfg"))
            if tok.startswith(TOP) or (relative and re.fullmatch(r"[\w.\-/]+", tok) and not tok.startswith(".")):
                found.add(tok)
    return found


def exists(tok: str) -> bool:
    """A path from the root, or (a path written relative to its section, `toy/checkpoints/`) the end of one."""
    files, dirs = tracked()
    p = tok.rstrip("/")
    if p in files or p in dirs:
        return True
    if tok.startswith(TOP):
        return False
    return any(f == p or f.endswith("/" + p) for f in files | dirs)


@pytest.mark.parametrize("readme", READMES)
def test_every_path_the_readme_names_exists(readme):
    toks = path_tokens(readme)
    assert len(toks) > (30 if readme == "README.md" else 10)  # the parser found the paths
    missing = sorted(t for t in toks if not exists(t))
    assert not missing, f"{readme} names paths that are not in the repository: {missing}"


def resolve(dotted: str) -> str | None:
    """None when `model.x.y` imports (a module) or resolves (an attribute of one); else why not. A name whose
    first part is no part of the package but a method of the lab's model classes is an instance's
    (`model.capture_names(...)` on a Transformer called `model`)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and not name.startswith(e.name):  # the module exists but fails to import
                return f"importing {name} fails: {e}"
            continue
        for j, attr in enumerate(parts[i:]):
            if not hasattr(obj, attr):
                if i == 1 and j == 0 and parts[0] == "model" and instance_attr(attr):
                    return None
                return f"{'.'.join(parts[:i + j])} has no attribute {attr!r}"
            obj = getattr(obj, attr)
        return None
    return "no such module"


def instance_attr(attr: str) -> bool:
    from model import DecoderLM, LanguageModel, Transformer

    return any(hasattr(cls, attr) for cls in (Transformer, DecoderLM, LanguageModel))


def dotted_names(readme: str) -> set[str]:
    names = set()
    for s in spans(readme) + commands(readme):
        for m in DOTTED.finditer(s):
            if not m.group(1).endswith(FILE_EXT):  # `model.safetensors` is a file's name
                names.add(m.group(1))
    return names


@pytest.mark.parametrize("readme", READMES)
def test_every_module_and_attribute_the_readme_names_resolves(readme):
    names = dotted_names(readme)
    assert len(names) >= (10 if readme == "README.md" else 1)  # the parser found them
    bad = {n: why for n in sorted(names) if (why := resolve(n)) is not None}
    assert not bad, f"{readme} names what does not resolve: {bad}"


def runnable(module: str) -> str | None:
    """None when `python -m module` runs a main: a module with a `__name__ == "__main__"` block, or a package
    with a __main__; else why not."""
    spec = importlib.util.find_spec(module)
    if spec is None:
        return "no such module"
    if spec.submodule_search_locations is not None:
        return None if importlib.util.find_spec(module + ".__main__") else "a package without __main__"
    src = Path(spec.origin).read_text(encoding="utf-8")
    return None if re.search(r"""__name__\s*==\s*["']__main__["']""", src) else "no __main__ block"


@pytest.mark.parametrize("readme", READMES)
def test_every_python_dash_m_command_runs_a_main(readme):
    mods = {m for line in commands(readme) for m in re.findall(r"python3?\s+-m\s+([\w.]+)", line)}
    if readme == "README.md":
        assert {"model.capture", "model.diff", "model.prenorm"} <= mods  # the parser found them
    bad = {m: why for m in sorted(mods) if m not in ("venv", "pip", "pytest") and (why := runnable(m))}
    assert not bad, f"{readme}: {bad}"
    scripts = {s for line in commands(readme) for s in re.findall(r"python3?\s+([\w./-]+\.py)", line)}
    assert not sorted(s for s in scripts if not exists(s)), scripts


# The folders whose every module the layout names (the zh README names the viz/ ones and points to the English one).
LAYOUT_DIRS = ("model/core", "model/families", "model/loaders", "model/toy", "model/analysis", "model/testing",
               "viz/figures", "viz/ui")


def layout_section(readme: str) -> str:
    src = text(readme)
    start = src.index("\n## Layout\n" if readme == "README.md" else "\n## 代码布局\n")
    return src[start:src.index("\n## ", start + 1)]


@pytest.mark.parametrize("readme", READMES)
def test_the_layout_names_every_module(readme):
    """Each module of the packages the Layout section walks through is named there: by path, by its dotted
    name, or by its file name in its folder's item (`- \\`model/core/\\` — \\`config.py\\`, ...`)."""
    section = layout_section(readme)
    items = re.split(r"\n- ", section)
    missing = []
    for d in LAYOUT_DIRS if readme == "README.md" else ("viz/figures", "viz/ui"):
        item = next((it for it in items if it.startswith(f"`{d}/`")), "")
        assert item, f"the Layout section has no item for {d}/"
        named = set(SPAN.findall(item))
        for f in sorted((ROOT / d).glob("*.py")):
            if f.stem == "__init__":
                continue
            dotted = f"{d.replace('/', '.')}.{f.stem}"
            if f.name not in named and f"{d}/{f.name}" not in section and dotted not in section:
                missing.append(f"{d}/{f.name}")
    for f in sorted((ROOT / "model").glob("*.py")) if readme == "README.md" else ():  # mains and public shims
        if f.stem != "__init__" and f"model.{f.stem}" not in section and f"model/{f.name}" not in section:
            missing.append(f"model/{f.name}")
    assert not missing, f"{readme}'s layout section does not name: {missing}"
    # and the other way: a file name in a folder's item is a file of that folder (or below it)
    wrong = []
    for item in items:
        folder = re.match(r"`([\w/]+)/`", item)
        if folder and (ROOT / folder.group(1)).is_dir():
            wrong += [f"{folder.group(1)}/{n}" for n in SPAN.findall(item)
                      if re.fullmatch(r"\w+\.py", n) and not list((ROOT / folder.group(1)).rglob(n))]
    assert not wrong, f"{readme}'s layout section names files that are not there: {wrong}"


def test_the_page_count_the_readme_gives_is_the_sidebar_s():
    tree = ast.parse((ROOT / "app.py").read_text(encoding="utf-8"))
    sections = next(n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", None) == "SECTIONS" for t in n.targets))
    pages = sum(len(v.elts) for v in sections.values)
    assert pages >= 19
    for readme in READMES:
        said = [int(n) for n in re.findall(r"sidebar's pages \((\d+) now", text(readme))]
        said += [int(n) for n in re.findall(r"侧栏(?:现有|的) ?(\d+) ?个页面", text(readme))]
        assert all(n == pages for n in said), (readme, said, pages)
    assert re.search(r"sidebar's pages \(\d+ now", text("README.md"))


def python_blocks() -> list[tuple[str, int, str, str | None]]:
    return [(readme, line, code, skip) for readme in READMES for lang, code, line, skip in blocks(readme)
            if lang == "python"]


def test_the_skipped_blocks_are_few_and_say_why():
    skipped = [(r, line, why) for r, line, _, why in python_blocks() if why]
    print("README blocks skipped:", skipped)
    assert len(python_blocks()) >= 7
    assert any(re.search(PRINTED, code, re.M) for _, _, code, _ in python_blocks())  # the doctest-style check bites
    assert len(skipped) <= 1, skipped
    assert all(len(why.split()) >= 2 for _, _, why in skipped)


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as tests/conftest.py sets it for this process
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=MODULE_TIMEOUT, env=env)


@pytest.mark.slow  # ~3.5 min on 2 busy cores: a fresh interpreter per block, SmolLM2 loaded three times
@pytest.mark.parametrize(("readme", "line", "code", "skip"), python_blocks(),
                         ids=[f"{r}:{line}" for r, line, _, _ in python_blocks()])
def test_every_python_block_runs(readme, line, code, skip, tmp_path):
    if skip:
        pytest.skip(f"{readme}:{line} is marked: {skip}")
    if re.search(r"^def test_\w+\(.*trace_snapshot", code, re.M):
        # A test for the snapshot plugin: the first run writes its snapshot, the second passes against it.
        (tmp_path / "test_block.py").write_text(code, encoding="utf-8")
        base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_block.py"]
        first = run(base + ["--update-trace-snapshots"], tmp_path)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        assert list((tmp_path / "__snapshots__").glob("*.safetensors"))
        second = run(base, tmp_path)
        assert second.returncode == 0 and "1 passed" in second.stdout, second.stdout[-3000:]
        return
    (tmp_path / "block.py").write_text(code, encoding="utf-8")
    done = run([sys.executable, "block.py"], tmp_path)
    assert done.returncode == 0, f"{readme}:{line}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    # Doctest-style: a print's trailing comment is what it prints (`print(a, "->", b)   # 2023-11-03 -> 2023-11-0-`).
    said = re.findall(PRINTED, code, re.M)
    assert all(s in done.stdout for s in said), (said, done.stdout[-2000:])


def test_the_fast_subset_s_time_is_one_figure():
    """The fast subset's time is written in the README (en, zh), pyproject's `slow` marker and .ci/run: one
    measured figure everywhere (issue 38: it was "a few minutes", "under 60 s" and "57 s")."""
    said = {}
    en = r"the fast subset: (\d[\d,]*) s\b"
    for f, pattern in (("README.md", en), ("README.zh.md", r"快速子集：(\d[\d,]*) 秒"), ("pyproject.toml", en),
                       (".ci/run", en)):
        found = re.findall(pattern, (ROOT / f).read_text(encoding="utf-8"))
        assert found, f"{f} does not state the fast subset's time"
        said[f] = {n.replace(",", "") for n in found}
    assert len(set().union(*said.values())) == 1, said
    for f in ("README.md", "pyproject.toml", ".ci/run"):
        src = (ROOT / f).read_text(encoding="utf-8")
        assert not re.search(r"under 60 s|a few minutes on 2 cores|\b57 s\b", src), f


def test_the_snapshot_plugin_s_messages_name_what_exists():
    """The plugin's refusals tell the user what to call (`model.testing.repro.deterministic(model)`): each dotted
    name in its strings resolves (it said `model.snapshot.deterministic`, which is not there)."""
    tree = ast.parse((ROOT / "model" / "testing" / "snapshot.py").read_text(encoding="utf-8"))
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    names = {m.group(1) for s in strings for m in DOTTED.finditer(s)}  # `model.eval()` is an instance's
    assert "model.testing.repro.deterministic" in names
    bad = {n: why for n in sorted(names) if (why := resolve(n)) is not None}
    assert not bad, bad
