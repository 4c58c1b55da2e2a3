"""Hostile input and offline use (issue #12 §4): every bad file, text or URL gives a clear message
(never a traceback) at bounded memory, and the app ships settings that keep it offline."""

from __future__ import annotations

import io
import json
import pickle
import tomllib
from pathlib import Path

import pytest
import torch
from conftest import assert_clean
from safetensors.torch import save_file
from streamlit.testing.v1 import AppTest

from model import Trace, TraceFileError, load_checkpoint
from model.core.trace import MAX_NAMES

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
TIMEOUT = 240


# ---------------------------------------------------------------- hostile files


def forged_header(header: dict, data: bytes = b"") -> bytes:
    """A safetensors file whose JSON header says whatever we like."""
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


def pickled() -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(3)}, buf, _use_new_zipfile_serialization=False)
    return buf.getvalue()


def zipped() -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(3)}, buf)
    return buf.getvalue()


def many_names(n: int) -> bytes:
    meta = {"format": "attention-lab-trace", "version": "1", "meta": "{}"}
    buf = io.BytesIO()
    from safetensors.torch import save

    buf.write(save({f"t{i}": torch.zeros(1) for i in range(n)}, metadata=meta))
    return buf.getvalue()


HUGE = forged_header({"__metadata__": {"format": "attention-lab-trace"},
                      "logits": {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 4 * 10**12]}},
                     b"\0" * 64)
HOSTILE = {  # name -> (file bytes, TraceFileError.kind, words the message must contain)
    "empty": (b"", "empty", "the file is empty"),
    "pickle": (pickled(), "pickle", "Python pickle"),
    "plain pickle": (pickle.dumps({"w": [1, 2]}), "pickle", "Python pickle"),
    "torch.save zip": (zipped(), "zip", "zip archive"),
    "huge tensors": (HUGE, "corrupt", "claims shape [1000000, 1000000] (4,000,000,000,000 bytes)"),
    "huge header": ((2**62).to_bytes(8, "little") + b"{}", "corrupt", "header"),
    "short": (b"\x01\x02", "corrupt", "too short"),
    "header not JSON": (b"\x04\0\0\0\0\0\0\0abcd", "corrupt", "not JSON"),
    "10,000 names": (many_names(10_000), "too_many_names", "10,000 tensors"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_trace_files_are_refused_clearly(name, tmp_path):
    data, kind, words = HOSTILE[name]
    with pytest.raises(TraceFileError, match=None) as e:
        Trace.from_bytes(data, name="x.safetensors")
    assert e.value.kind == kind and words in str(e.value) and str(e.value).startswith("x.safetensors")
    path = tmp_path / "x.safetensors"
    path.write_bytes(data)
    with pytest.raises(TraceFileError):
        Trace.load(path)


def test_a_large_trace_under_the_limit_loads(tmp_path):
    t = Trace.from_bytes(many_names(MAX_NAMES), name="big.safetensors")
    assert len(t) == MAX_NAMES
    with pytest.raises(TraceFileError, match="limit 10"):
        Trace.from_bytes(many_names(11), max_names=10)


def test_an_upload_name_is_never_a_path(tmp_path, monkeypatch):
    """The browser names the upload: "../../x" or "/etc/x" must not choose where the bytes go."""
    monkeypatch.chdir(tmp_path)
    trace = Trace({"logits": torch.zeros(1, 2, 3)}, {"text": "x"})
    for name in ("../../evil.safetensors", "/tmp/evil-h4.safetensors", "a/b.safetensors"):
        assert Trace.from_bytes(trace.to_bytes(), name=name).names() == ["logits"]
    assert not Path("/tmp/evil-h4.safetensors").exists() and not list(tmp_path.parent.glob("evil*"))


def test_metadata_that_is_not_an_object(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file({"a": torch.zeros(1)}, str(path), metadata={"format": "attention-lab-trace", "meta": "[1, 2]"})
    with pytest.raises(TraceFileError, match="not an object"):
        Trace.load(path)


# ---------------------------------------------------------------- the Snapshots page


def snapshots_page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    at.switch_page("viz/pages/snapshots.py").run()
    assert_clean(at)
    return at


PAGE_WORDS = {"empty": "the file is empty (0 bytes)", "pickle": "never opens one", "torch.save zip": "zip archive",
              "huge tensors": "corrupt or forged", "10,000 names": "holds 10,000 tensors"}


def test_snapshots_page_explains_every_hostile_upload():
    at = snapshots_page()
    for name, words in PAGE_WORDS.items():
        at.file_uploader(key="snap_upload").clear().upload(f"{name}.safetensors", HOSTILE[name][0]).run()
        assert not at.exception, (name, [e.value for e in at.exception])
        assert len(at.error) == 1 and words in at.error[0].value, (name, [e.value for e in at.error])


def test_snapshots_page_in_chinese_words_a_refusal_in_chinese():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["lang"] = "zh"
    at.run()
    at.switch_page("viz/pages/snapshots.py").run()
    at.file_uploader(key="snap_upload").upload("p.safetensors", HOSTILE["pickle"][0]).run()
    assert not at.exception and "pickle" in at.error[0].value and "从不打开" in at.error[0].value


def test_snapshots_page_shows_a_long_text_cut_and_says_so():
    ckpt = load_checkpoint("dates")
    _, trace = ckpt.trace("3 november 2023", names="*.weights")
    long_text = "x" * 100_000
    upload = Trace(dict(trace), {**trace.meta, "text": long_text}).to_bytes()
    at = snapshots_page()
    at.file_uploader(key="snap_upload").upload("long.safetensors", upload).run()
    assert_clean(at)
    uploaded = [m.value for m in at.markdown if m.value.startswith("Uploaded:")]
    assert uploaded and "(100,000 characters in all)" in uploaded[0] and len(uploaded[0]) < 1000


# ---------------------------------------------------------------- text and URL


def test_a_100000_character_text_gives_a_message():
    """The sidebar's text (viz/ui/sidebar.py): refused with a message saying the limit, never a traceback."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state["source_text"] = "3 november 2023 " * 6250  # 100,000 characters
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.error) == 1 and "tokens long" in at.error[0].value and "limit" in at.error[0].value


GARBAGE = {"checkpoint": "../../etc/passwd", "layer": "-1e9", "head": "NaN", "view": "<script>x</script>",
           "lesson": "abc", "present": "maybe", "d_model": "x", "warmup": "1e99", "factor": "inf",
           "positions": "-5", "stack": "nope", "sub": "\u202e", "token": "999999", "lang": "xx", "exp": ";;;=;"}


GARBAGE_PAGES = ["viz/pages/attention.py", "viz/pages/schedule.py", "viz/pages/layer.py", "viz/pages/tokens.py",
                 "viz/pages/decoder.py", "viz/pages/lessons.py", "viz/pages/snapshots.py"]


def open_with_query(page: str, query: dict) -> AppTest:
    """`page` opened from a link: its very first run sees the query string."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.switch_page(page)
    at.query_params.update(query)
    return at.run()


@pytest.mark.parametrize("page", GARBAGE_PAGES, ids=lambda p: Path(p).stem)
def test_garbage_url_values_fall_back_to_defaults(page):
    at = open_with_query(page, GARBAGE)
    assert_clean(at)
    if page.endswith("schedule.py"):  # the page's own keys are rewritten with their defaults
        assert (at.query_params["d_model"], at.query_params["warmup"], at.query_params["factor"]) == ("512", "4000",
                                                                                                    "1.0")


# ---------------------------------------------------------------- offline settings


def test_streamlit_config_keeps_the_app_offline_and_bounded():
    cfg = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert cfg["server"]["maxUploadSize"] <= 100
    assert cfg["browser"]["gatherUsageStats"] is False
    assert cfg["server"]["fileWatcherType"] == "none" and ".venv" in cfg["server"]["folderWatchBlacklist"]
    from streamlit import config  # the names are options this Streamlit knows

    for section, options in cfg.items():
        for option in options:
            config.get_option(f"{section}.{option}")  # raises on an option this version does not have


@pytest.mark.browser
def test_nothing_loads_from_another_host(server, page):
    """Fonts, icons, scripts, metrics: every request the pages make goes to the app's own server."""
    from urllib.parse import urlparse

    from browser_support import wait_drawn

    own = urlparse(server).netloc
    remote: list[str] = []
    page.on("request", lambda r: remote.append(r.url) if urlparse(r.url).scheme in ("http", "https", "ws", "wss")
            and urlparse(r.url).netloc != own else None)
    for path, chart in (("/", True), ("/snapshots", False), ("/lessons?lang=zh", False)):
        page.goto(server + path)
        wait_drawn(page, need_chart=chart)
    assert not remote, f"requests to other hosts: {sorted(set(remote))}"


@pytest.mark.parametrize("name", ["pickle", "huge tensors", "empty"])
def test_a_model_directory_with_hostile_weights_is_refused(name, tmp_path):
    import shutil

    from model.testing.repro import TINY_MODEL, load_model_dir

    shutil.copytree(TINY_MODEL, tmp_path / "tiny")
    (tmp_path / "tiny" / "model.safetensors").write_bytes(HOSTILE[name][0])
    with pytest.raises(ValueError, match="tiny/model.safetensors") as e:
        load_model_dir(tmp_path / "tiny")
    assert HOSTILE[name][2] in str(e.value) or name == "huge tensors"
