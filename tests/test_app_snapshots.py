"""The Snapshots page in both languages (issue 17 items 7 and 10): a comparison's notes, table headers
and cells, and a refused text file are worded in the UI language; the model's reader says a text file
"is not a safetensors file" instead of quoting the header length its first 8 bytes would mean."""

from __future__ import annotations

import json

import pytest
from conftest import assert_clean, open_page
from streamlit.testing.v1 import AppTest

from model import Trace, TraceFileError, load_checkpoint

PAGE = "viz/pages/snapshots.py"
TEXT = "3 november 2023"
TEXT_FILE = b"checkpoint,text\ndates,3 november 2023\n"  # a text file renamed .safetensors


def run_page(lang: str) -> AppTest:
    return open_page(PAGE, query={"checkpoint": "dates", "text": TEXT, "lang": lang})


def test_the_reader_calls_a_text_file_not_a_safetensors_file():
    with pytest.raises(TraceFileError) as e:
        Trace.from_bytes(TEXT_FILE, name="notes.safetensors")
    assert e.value.kind == "corrupt"  # the kind is unchanged
    assert "this is not a safetensors file" in str(e.value) and "announce" not in str(e.value)


@pytest.mark.parametrize("lang, words", [("en", "“notes.safetensors” is not a safetensors file"),
                                         ("zh", "“notes.safetensors”不是 safetensors 文件")])
def test_a_text_file_is_refused_in_the_ui_language(lang, words):
    at = run_page(lang)
    at.file_uploader(key="snap_upload").upload("notes.safetensors", TEXT_FILE).run()
    assert not at.exception
    assert len(at.error) == 1 and words in at.error[0].value
    assert "byte" not in at.error[0].value and "5," not in at.error[0].value  # no 19-digit "header length"


@pytest.fixture(scope="module")
def other_text_trace() -> bytes:
    """A trace of another date of the same length: same shapes, other tokens and values."""
    return load_checkpoint("dates").trace("4 november 2023")[1].to_bytes()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_comparison_is_worded_in_the_ui_language(lang, other_text_trace):
    at = run_page(lang)
    at.file_uploader(key="snap_upload").upload("other.safetensors", other_text_trace).run()
    assert_clean(at)
    warnings = [w.value for w in at.warning]
    assert not any("note: metadata" in w for w in warnings)  # the CLI's English note
    want = "The source tokens differ" if lang == "en" else "源词元不同"
    assert any(want in w and '"3"' in w and '"4"' in w for w in warnings), warnings
    table = at.dataframe[0].value
    columns = (["name", "max |diff|", "problem", "where (worst cell)"] if lang == "en"
               else ["名称", "最大 |差|", "问题", "位置（差异最大的格）"])  # translated since dee1ab2
    assert list(table.columns) == columns
    problems, where = set(table[columns[2]]), " ".join(table[columns[3]])
    if lang == "en":
        assert problems == {"values"} and "layer=" in where and "head=" in where
    else:
        assert problems == {"数值"} and "层=" in where and "头=" in where
        assert "values" not in problems and "layer=" not in where and "position=" not in where
        titles = json.dumps([json.loads(c.proto.spec)["layout"] for c in at.get("plotly_chart")], ensure_ascii=False)
        assert "当前轨迹" in titles and "当前追踪" not in titles  # one word for "current trace"
