"""Which ids end a generation, and where each comes from (issue 42 §4: LanguageModel.stop_rule).

The rule: the model file's own end tokens (a GGUF's tokenizer.ggml.eos_token_id and any eot/eom ids it declares; a
Hugging Face directory's eos_token_id in config.json and generation_config.json), plus, in a chat (chat=True), the
special token its chat template closes the assistant's turn with. Not llama.cpp's wider list of end-like control
texts: SmolLM2 stops at <|im_end|> (2) as transformers does, not also at <|endoftext|> (0); Gemma 3 270M (no chat
template) at <eos> (1) only, as its file says, not at <end_of_turn> (106).

Checked: each source on tiny models (a GGUF written here, a Hugging Face directory with a generation config, a
word-level model whose template closes a turn with a token that is not its eos), generation stopping at the
template's turn end only in a chat, the two shipped models' rules, and the generation panel stating the rule with
each id's source in en and zh.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_hf_lm
from streamlit.testing.v1 import AppTest
from test_gguf import QT, tiny_llama_state, write_tiny_llama
from test_lm import LLAMA, make

from model.loaders import lm as LM
from model.loaders.gguf import load_gguf
from model.loaders.lm import LanguageModel
from viz.i18n import t
from viz.ui import lm_models

APP = str(Path(__file__).resolve().parents[1] / "app.py")
SOURCES = [v for k, v in vars(LM).items() if k.startswith("STOP_")]


def test_a_gguf_stops_at_its_own_end_tokens_not_llama_cpps_end_like_texts(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_LAB_CACHE", str(tmp_path / "cache"))
    path = write_tiny_llama(tmp_path / "tiny.gguf", tiny_llama_state(), qtype=QT.Q8_0)
    lm = load_gguf(path)
    # id 0 is <|endoftext|>, a control token llama.cpp would also stop at; the file's eos is 2
    assert lm.tokens([0]) == ["<|endoftext|>"]
    assert lm.stop_rule() == [(2, "<|im_end|>", LM.STOP_GGUF_EOS)] and lm.stop_ids == [2]
    # its template closes a turn with <|im_end|>: the eos already, so a chat adds nothing
    assert lm.turn_end_ids() == [2] and lm.stop_rule(chat=True) == lm.stop_rule()
    again = load_gguf(path)  # from the dequantized cache: the same rule
    assert again.stop_rule() == lm.stop_rule()
    eot = load_gguf(write_tiny_llama(tmp_path / "eot.gguf", tiny_llama_state(),
                                     **{"tokenizer.ggml.eot_token_id": 1}))
    assert eot.stop_rule() == [(2, "<|im_end|>", LM.STOP_GGUF_EOS), (1, eot.tokens([1])[0], LM.STOP_GGUF_EOT)]


def test_a_cache_written_before_eot_was_kept_reads_the_files_header(tmp_path, monkeypatch):
    from model.loaders import gguf as G

    monkeypatch.setenv("ATTENTION_LAB_CACHE", str(tmp_path / "cache"))
    path = write_tiny_llama(tmp_path / "eot.gguf", tiny_llama_state(), **{"tokenizer.ggml.eot_token_id": 1})
    read = G.read_model

    def old_cache(p, cache=True):  # what a cache from before this change holds: no "eot"/"eom"
        part = read(p, cache=cache)
        part.special_ids = {k: v for k, v in part.special_ids.items() if k not in ("eot", "eom")}
        return part

    monkeypatch.setattr(G, "read_model", old_cache)
    assert [i for i, _, _ in load_gguf(path).stop_rule()] == [2, 1]


def test_a_hugging_face_directory_stops_at_config_and_generation_config_eos(tmp_path):
    tiny_hf_lm(tmp_path)  # config.json: eos_token_id 0
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 5]}))
    from model.loaders.hf import load_hf_dir

    lm = load_hf_dir(tmp_path)
    assert lm.stop_rule() == [(0, lm.tokens([0])[0], LM.STOP_CONFIG), (5, lm.tokens([5])[0],
                                                                         LM.STOP_GENERATION_CONFIG)]


def _word_lm(template: str | None, special: str | None) -> LanguageModel:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|im_end|>": 0, "<|im_start|>": 1} | {f"w{i}": i for i in range(2, 61)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|im_end|>", "<|im_start|>", *([special] if special else [])])
    torch.manual_seed(0)
    return LanguageModel(make(LLAMA), tok, name="tiny", stop_ids=[0], chat_template=template,
                         special_tokens={"eos_token": "<|im_end|>"},
                         stop_sources={0: LM.STOP_CONFIG})


@torch.no_grad()
def test_a_chat_also_stops_at_the_templates_turn_end_and_only_a_chat():
    prompt = torch.tensor([[1, 12, 13, 14]])
    free = _word_lm(None, None).generate(prompt, max_new_tokens=8)
    end = next(i for i in free.ids[1:] if i > 1)  # a token the model writes after its first: the turn end here
    word = f"w{end}"
    template = ("{% for m in messages %}<|im_start|> {{ m['content'] }} " + word + " {% endfor %}"
                "{% if add_generation_prompt %}<|im_start|> {% endif %}")
    lm = _word_lm(template, word)
    assert lm.turn_end_ids() == [end]
    assert lm.stop_rule() == [(0, "<|im_end|>", LM.STOP_CONFIG)]
    assert lm.stop_rule(chat=True) == [(0, "<|im_end|>", LM.STOP_CONFIG), (end, word, LM.STOP_CHAT)]
    plain = lm.generate(prompt, max_new_tokens=8)
    chat = lm.generate(prompt, max_new_tokens=8, chat=True)  # ids: not wrapped again, only the stops differ
    assert plain.ids == free.ids  # the turn end is no stop outside a chat
    k = free.ids.index(end)
    assert chat.ids == free.ids[:k + 1] and chat.stop_reason == "eos" and chat.text == lm.decode(free.ids[:k])
    assert [s.id for s in lm.stream(prompt, max_new_tokens=8, chat=True)] == chat.ids
    # a template that writes no special token after the answer has no turn end; no template, none
    assert _word_lm(template.replace(word, "w3"), None).turn_end_ids() == []
    assert _word_lm(None, None).stop_rule(chat=True) == [(0, "<|im_end|>", LM.STOP_CONFIG)]


def test_the_shipped_models_rules():
    from model import load_model
    from model.loaders import gemma3, smollm2

    if smollm2.is_available():
        lm = load_model("smollm2")
        eos = [(2, "<|im_end|>", LM.STOP_GGUF_EOS)]  # transformers' generation config for SmolLM2: eos 2
        assert lm.stop_rule() == eos and lm.stop_rule(chat=True) == eos and 0 not in lm.stop_set(chat=True)
    if gemma3.is_available():
        lm = load_model("gemma3")
        assert lm.chat_template is None and lm.stop_rule(chat=True) == [(1, "<eos>", LM.STOP_GGUF_EOS)]
        assert lm.tokens([106]) == ["<end_of_turn>"] and 106 not in lm.stop_set(chat=True)


def test_every_source_is_translated():
    assert len(SOURCES) == 7
    for src in SOURCES:
        assert t(src, lang="zh") != src, src


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return tiny_hf_lm(tmp_path_factory.mktemp("tiny-stop"), "llama")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_generation_panel_states_the_rule(tiny, lang):
    lm = lm_models.load(tiny).obj
    ((i, tok, src),) = lm.stop_rule()
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"checkpoint": tiny, "prompt": "Hello world", "view": "generate", "lang": lang})
    at.switch_page("viz/pages/llm.py")
    at.run()
    assert not at.exception and not at.error
    caps = [c.value for c in at.caption]
    want = t("A generation ends when the model writes {ends}, or after the number of new tokens.", lang=lang,
             ends=t("“{tok}” (id {id}: {source})", lang=lang, tok=tok, id=i, source=t(src, lang=lang)))
    assert any(want in c for c in caps), caps
    rule = t("The rule: the model file's own end tokens, and with the chat template on, the token the template "
             "closes the assistant's turn with.", lang=lang)
    assert any(rule in c for c in caps)
