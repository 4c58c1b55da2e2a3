"""viz/ui/text_store.py: long texts in links, kept as plain files named by their hash, bounded in bytes."""

from __future__ import annotations

import os

import pytest

from viz.ui import text_store


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_LAB_TEXTS", str(tmp_path / "texts"))
    return tmp_path / "texts"


def test_a_text_comes_back_whole_under_its_reference(store):
    text = "Ünïcödé, 中文, emoji 🙂 and a\nnewline " * 500
    ref = text_store.put(text)
    assert ref == text_store.ref_of(text) and len(ref) == 16
    assert text_store.get(ref) == text
    assert text_store.put(text) == ref and len(list(store.glob("*.txt"))) == 1  # the same text: one copy
    assert not list(store.glob("*.tmp"))


@pytest.mark.parametrize("ref", ["", "0123", "0123456789ABCDEF", "../../etc/passwd", "0123456789abcdef/..", None, 7])
def test_only_a_reference_reaches_the_disk(store, ref):
    assert text_store.get(ref) is None


def test_a_copy_changed_on_disk_is_not_the_linked_text(store):
    ref = text_store.put("x" * 2000)
    (store / f"{ref}.txt").write_text("y" * 2000)
    assert text_store.get(ref) is None
    (store / f"{ref}.txt").write_bytes(b"\xff\xfe not utf-8")
    assert text_store.get(ref) is None


def test_the_folder_stays_under_its_bound_least_recently_used_out(store, monkeypatch):
    refs = []
    for i in range(8):
        refs.append(text_store.put(f"{i}" * 3000))
        t = 1_000_000 + i
        os.utime(store / f"{refs[-1]}.txt", (t, t))  # one second apart: the order is the order of use
    os.utime(store / f"{refs[0]}.txt", (2_000_000, 2_000_000))  # the first, used again last
    monkeypatch.setattr(text_store, "MAX_BYTES", 10_000)
    text_store.put("z" * 3000)
    kept = {p.stem for p in store.glob("*.txt")}
    assert sum(p.stat().st_size for p in store.glob("*.txt")) <= 10_000
    assert refs[0] in kept and text_store.ref_of("z" * 3000) in kept and refs[1] not in kept


def test_too_big_or_an_unwritable_folder_is_none_not_an_error(store, tmp_path, monkeypatch):
    assert text_store.put("x" * (text_store.MAX_TEXT_BYTES + 1)) is None
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ATTENTION_LAB_TEXTS", str(blocker / "texts"))
    assert text_store.put("x" * 2000) is None
