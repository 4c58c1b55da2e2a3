"""The trace_snapshot pytest plugin, run in a temporary project (pytester), and its CLIs."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo  # noqa: F401  (see below)

from model.core.trace import Trace
from model.diff import DEFAULT_TOLERANCES, Tolerance, compare, resolve_tolerances
from model.diff import main as diff_main
from model.testing.repro import TINY_MODEL, deterministic, load_model_dir
from model.testing.snapshot import TraceSnapshot, TraceSnapshotError, snapshot_stem

pytest_plugins = ["pytester"]
# pytester's in-process runs unload every module first imported inside them. torch.manual_seed
# imports torch's compiler stack lazily, and its op libraries cannot register twice: import it
# here, before any pytester snapshot, so every inner run reuses it.

# The user's test: env vars (read at run time) perturb the model and set the check's options.
USER_TEST = """
import json, os
import pytest, torch
from model.testing.repro import load_model_dir

def test_tiny(trace_snapshot):
    m = load_model_dir()
    if os.environ.get("PERTURB"):
        with torch.no_grad():  # W^Q rows 2:4 are head 1 of 2 (d_head = 2)
            m.model.decoder.layers[1].cross_attn.w_q.weight[2:4] += float(os.environ["PERTURB"])
    _, trace = m.trace("hello world", names=json.loads(os.environ.get("NAMES", "null")))
    trace_snapshot.check(trace, tolerances=json.loads(os.environ.get("TOLS", "null")))

@pytest.mark.parametrize("text", ["ab c", "ba"], ids=["ab c", "a/b"])  # ids a file name cannot hold
def test_param(trace_snapshot, text):
    trace_snapshot.check(load_model_dir().trace(text, names="*.cross_attn.weights")[1])
"""


@pytest.fixture
def project(pytester, monkeypatch):
    for var in ("PERTURB", "NAMES", "TOLS"):
        monkeypatch.delenv(var, raising=False)
    pytester.makepyfile(test_user=USER_TEST)
    return pytester


# Other plugins off: pytester unloads what each inner run imports (hypothesis costs seconds a run).
QUIET = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:anyio")


def run(project, *args):
    return project.runpytest(*QUIET, "-k", "test_tiny", *args)


def test_workflow_missing_update_pass_then_report(project, monkeypatch):
    snap = project.path / "__snapshots__" / "test_tiny.safetensors"
    obtained = project.path / "__snapshots__" / "test_tiny.obtained.safetensors"

    result = run(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no trace snapshot for this test yet*",
                                 "*pytest --update-trace-snapshots test_user.py::test_tiny*"])
    assert obtained.is_file() and not snap.exists()

    result = run(project, "--update-trace-snapshots")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["trace snapshots: 1 written"])
    assert snap.is_file() and not obtained.exists()
    assert Trace.load(snap).meta["versions"]["torch"] == torch.__version__.split("+")[0]

    run(project).assert_outcomes(passed=1)
    before = snap.read_bytes()
    result = run(project, "--update-trace-snapshots")  # unchanged within tolerance: no rewrite
    result.stdout.fnmatch_lines(["trace snapshots: 1 unchanged"])
    assert snap.read_bytes() == before

    monkeypatch.setenv("PERTURB", "0.5")
    result = run(project)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "trace differs from the snapshot __snapshots__/test_tiny.safetensors" in out
    assert "decoder.layers.1.cross_attn.weights" in out
    assert "first to differ in computation order: decoder.layers.1.cross_attn.q (layer 1, head 1)" in out
    weights_line = next(line for line in out.splitlines() if "cross_attn.weights " in line)
    assert "in head 1;" in weights_line and "query" in weights_line and "key" in weights_line
    assert "encoder." not in out.split("first to differ")[0]  # the encoder is untouched
    assert "python -m model.diff __snapshots__/test_tiny.safetensors" in out
    assert obtained.is_file() and snap.read_bytes() == before
    assert diff_main([str(snap), str(obtained)]) == 1  # the CLI reaches the same verdict

    result = run(project, "--update-trace-snapshots")  # accepting the change
    result.stdout.fnmatch_lines(["trace snapshots: 1 updated"])
    run(project).assert_outcomes(passed=1)
    assert not obtained.exists()


def test_tolerance_overrides(project, monkeypatch):
    monkeypatch.setenv("NAMES", '["decoder.layers.1.cross_attn.weights"]')
    run(project, "--update-trace-snapshots").assert_outcomes(passed=1)
    monkeypatch.setenv("PERTURB", "0.5")  # moves those weights by about 0.02
    run(project).assert_outcomes(failed=1)
    monkeypatch.setenv("TOLS", '{"*.cross_attn.weights": 0.05}')
    run(project).assert_outcomes(passed=1)
    monkeypatch.setenv("TOLS", '{"*.cross_attn.weights": [0.001, 0.01]}')
    result = run(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*atol 0.001, rtol 0.01*"])
    monkeypatch.setenv("TOLS", '{"*.crossattn.weights": 1}')  # a typo must not pass silently
    result = run(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*tolerance pattern '[*].crossattn.weights' matches no name*"])


def test_corrupt_snapshot_is_a_clear_error(project):
    run(project, "--update-trace-snapshots").assert_outcomes(passed=1)
    snap = project.path / "__snapshots__" / "test_tiny.safetensors"
    snap.write_bytes(b"\x00garbage, not a safetensors file")
    result = run(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*trace snapshot __snapshots__/test_tiny.safetensors is unreadable*",
                                 "*To recreate it from this run: pytest --update-trace-snapshots*"])
    result = run(project, "--update-trace-snapshots")
    result.stdout.fnmatch_lines(["trace snapshots: 1 updated"])
    run(project).assert_outcomes(passed=1)


def test_parametrized_names_become_safe_files(project):
    result = project.runpytest(*QUIET, "-k", "test_param", "--update-trace-snapshots")
    result.assert_outcomes(passed=2)
    files = sorted(p.name for p in (project.path / "__snapshots__").iterdir())
    assert files == sorted([f"{snapshot_stem('test_user.py::test_param[ab c]')}.safetensors",
                            f"{snapshot_stem('test_user.py::test_param[a/b]')}.safetensors"])
    assert all("/" not in f and " " not in f for f in files)


def test_snapshot_stem():
    assert snapshot_stem("tests/t.py::test_x") == "test_x"
    assert snapshot_stem("t.py::TestA::test_x[3-nov]") == "TestA.test_x-3-nov"
    odd = [snapshot_stem(f"t.py::test_x[{p}]") for p in ("a b", "a_b", "a/b", "我")]
    assert len(set(odd)) == 4 and all(s.isascii() and "/" not in s and " " not in s for s in odd)
    assert len(snapshot_stem("t.py::test_x[" + "y" * 500 + "]")) < 120


def test_tolerance_rules():
    names = ["masks.causal", "encoder.layers.0.self_attn.weights", "decoder.layers.0.cross_attn.mask",
             "logits", "encoder.out"]
    tols = resolve_tolerances(names)
    assert tols["masks.causal"] == tols["decoder.layers.0.cross_attn.mask"] == Tolerance(0.0, 0.0)
    assert tols["encoder.layers.0.self_attn.weights"] == Tolerance(1e-5)
    assert tols["logits"] == Tolerance(1e-4) and tols["encoder.out"] == DEFAULT_TOLERANCES["*"]
    tols = resolve_tolerances(names, {"*": 1e-3, "logits": (0.1, 0.01)})  # the last match wins
    assert tols["encoder.out"] == Tolerance(1e-3) and tols["logits"] == Tolerance(0.1, 0.01)


def test_check_takes_a_dict_and_refuses_nondeterministic_traces(tmp_path):
    snap = TraceSnapshot(tmp_path, "t.py::test_d", update=True, stats=__import__("collections").Counter(),
                         root=tmp_path)
    snap.check({"ids": torch.arange(4), "x": torch.ones(2, 3)})
    assert Trace.load(snap.path()).meta["snapshot"]["test"] == "t.py::test_d"
    strict = TraceSnapshot(tmp_path, "t.py::test_d", update=False, stats=snap._stats, root=tmp_path)
    with pytest.raises(TraceSnapshotError, match="ids"):
        strict.check({"ids": torch.arange(4) + (torch.arange(4) == 3), "x": torch.ones(2, 3)})  # ints: exact
    with pytest.raises(ValueError, match="float32"):
        strict.check({"x": torch.ones(2).double()}, name="f64")
    m = load_model_dir()
    trace = Trace(m.trace("ab")[1], {**m.trace("ab")[1].meta, "training": True,
                                     "config": {**m.model.cfg.to_dict(), "dropout": 0.1}})
    with pytest.raises(ValueError, match="training mode"):
        strict.check(trace, name="train")


def test_deterministic_restores_global_state():
    m = load_model_dir().model.train()
    threads = torch.get_num_threads()
    with deterministic(m, threads=1) as model:
        assert not model.training and torch.get_num_threads() == 1
        first = torch.rand(3)
    with deterministic():
        assert torch.equal(torch.rand(3), first)  # seeded
    assert m.training and torch.get_num_threads() == threads


# ---------------------------------------------------------------- CLIs


@pytest.mark.slow
def test_capture_cli_on_the_tiny_fixture(tmp_path):
    out = tmp_path / "t.safetensors"
    cmd = [sys.executable, "-m", "model.capture", "--checkpoint", str(TINY_MODEL), "--text", "hello",
           "--names", "*.cross_attn.weights", "--names", "logits", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    trace = Trace.load(out)
    assert sorted(trace) == [f"decoder.layers.{i}.cross_attn.weights" for i in (0, 1)] + ["logits"]
    assert trace.meta["src_tokens"] == ["h", "e", "l", "l", "o", "<eos>"]
    _, direct = load_model_dir().trace("hello", names=["*.cross_attn.weights", "logits"])
    assert all(torch.equal(trace[n], direct[n]) for n in trace)


def test_diff_cli_exit_codes(tmp_path, capsys):
    m = load_model_dir()
    a, b, bad = tmp_path / "a.safetensors", tmp_path / "b.safetensors", tmp_path / "bad.safetensors"
    m.trace("hello")[1].save(a)
    with torch.no_grad():
        m.model.decoder.layers[0].cross_attn.w_k.weight[0:2] += 0.5  # head 0
    m.trace("hello")[1].save(b)
    bad.write_bytes(b"not a trace")

    assert diff_main([str(a), str(a)]) == 0
    assert "traces match" in capsys.readouterr().out
    assert diff_main([str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "first to differ in computation order: decoder.layers.0.cross_attn.k (layer 0, head 0)" in out
    assert diff_main([str(a), str(b), "--tol", "decoder.*=10", "--tol", "logits=10"]) == 0
    capsys.readouterr()
    assert diff_main([str(a), str(bad)]) == 2
    assert "bad.safetensors is not a safetensors trace" in capsys.readouterr().err

    done = subprocess.run([sys.executable, "-m", "model.diff", str(a), str(tmp_path / "missing.safetensors")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "error: no trace file at" in done.stderr and "Traceback" not in done.stderr


def test_report_shape_dtype_new_missing_and_metadata():
    meta = {"versions": {"torch": "2.0.0"}, "config": {"d_model": 8}}
    expected = Trace({"a": torch.zeros(2), "b": torch.zeros(2), "c": torch.zeros(3), "gone": torch.zeros(1)},
                     meta)
    obtained = Trace({"a": torch.zeros(3), "b": torch.zeros(2, dtype=torch.int64), "c": torch.ones(3),
                      "extra": torch.zeros(1)}, {"versions": {"torch": "2.13.0"}, "config": {"d_model": 16}})
    report = compare(expected, obtained).report()
    assert "shape changed: a [2] -> [3]" in report and "dtype changed: b float32 -> int64" in report
    assert "missing names (1, expected but not obtained): gone" in report
    assert "new names (1, obtained but not expected): extra" in report
    assert """note: metadata 'versions' differs: torch "2.0.0" -> "2.13.0" (numeric noise""" in report
    assert "note: metadata 'config' differs: d_model 8 -> 16" in report


LIGHT_PLUGIN = """
import sys
import model.testing.snapshot as plugin
heavy = sorted(m for m in ("torch", "safetensors", "numpy") if m in sys.modules)
assert not heavy, f"loading the pytest plugin imported {heavy}"
assert plugin.deterministic.__module__ == "model.testing.repro" and "torch" in sys.modules  # lazy re-exports still work
"""


@pytest.mark.slow
def test_loading_the_plugin_imports_nothing_heavy():
    """pytest loads the plugin (entry point pytest11) into every run in the environment: it must stay light."""
    r = subprocess.run([sys.executable, "-c", LIGHT_PLUGIN], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- the CI skip policy (tests/conftest.py)

SKIPPING = """
import pytest

def test_runs():
    assert True

def test_skips():
    pytest.skip("no fixture data")

@pytest.mark.may_skip(reason="optional package")
def test_may_skip():
    pytest.skip("optional package missing")

@pytest.mark.xfail(reason="known bug", strict=True)
def test_known_bug():
    assert False
"""
LOAD_OUR_CONFTEST = f"""
import importlib.util, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
spec = importlib.util.spec_from_file_location("lab_conftest", {str(Path(__file__).parent / "conftest.py")!r})
lab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab)
pytest_runtest_makereport = lab.pytest_runtest_makereport
pytest_make_collect_report = lab.pytest_make_collect_report

def pytest_configure(config):
    config.addinivalue_line("markers", "may_skip(reason): may skip in CI")
"""


@pytest.mark.parametrize("ci", ["1", ""])
def test_an_unmarked_skip_fails_in_ci(pytester, monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    pytester.makeconftest(LOAD_OUR_CONFTEST)
    pytester.makepyfile(test_skipping=SKIPPING)
    result = pytester.runpytest(*QUIET, "-rs")
    if ci:
        result.assert_outcomes(passed=1, failed=1, skipped=1, xfailed=1)
        result.stdout.fnmatch_lines(["*test_skips was skipped in CI (*no fixture data*)*may_skip*"])
    else:
        result.assert_outcomes(passed=1, skipped=2, xfailed=1)
    # a whole module skipped at collection (pytest.skip(allow_module_level=True), importorskip)
    pytester.makepyfile(test_skipping="import pytest\npytest.skip('whole module', allow_module_level=True)\n")
    result = pytester.runpytest(*QUIET, "-rs")
    if ci:
        result.assert_outcomes(errors=1)
        result.stdout.fnmatch_lines(["*test_skipping.py was skipped in CI (*whole module*)*"])
    else:
        result.assert_outcomes(skipped=1)
