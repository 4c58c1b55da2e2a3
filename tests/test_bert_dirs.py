"""BERT-family directories as people have them: BERT, RoBERTa and DistilBERT saved by transformers (the bare
encoder, or with a masked-LM head and a 'bert.' / 'roberta.' / 'distilbert.' prefix), with tokenizer.json, with
only the older vocab files (vocab.txt; vocab.json + merges.txt), or with no tokenizer at all (then the encoder
opens on token ids and says so). Reference: transformers, eager, fp32: last hidden state within 1e-5 and every
layer's attention weights."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from model.loaders import clear_cache, load_model
from model.loaders.hf import ModelLoadError, load_hf_dir
from model.loaders.minilm import PretrainedEncoder

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "animal", "was", "tired", "it", "street", "cross",
         "##s", "##ed", "didn", "'", "t", "!", "unter", "Unter", "because", "too"]
VOCAB = 64
SIZES = {"bert": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48),
         "roberta": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48),
         "distilbert": dict(dim=32, n_layers=2, n_heads=4, hidden_dim=48)}
IDS = [2, 5, 6, 7, 8, 20, 9, 7, 21, 8, 12, 3]  # no id equals a pad id (0 for BERT, 1 for RoBERTa)


def tiny(kind: str, directory, head: bool = False):
    """A tiny random `kind` encoder saved to `directory`; returns the bare encoder (the reference)."""
    cfg = transformers.AutoConfig.for_model(kind, vocab_size=VOCAB, max_position_embeddings=40,
                                            attn_implementation="eager", **SIZES[kind])
    torch.manual_seed(0)
    model = (transformers.AutoModelForMaskedLM if head else transformers.AutoModel).from_config(cfg)
    with torch.no_grad():  # LayerNorms start at (1, 0): make them random, so a mismapped one shows
        for n, p in model.named_parameters():
            if "LayerNorm" in n or "layer_norm" in n:
                p.copy_(torch.randn_like(p) * 0.2 + (1.0 if n.endswith("weight") else 0.0))
    model.eval().save_pretrained(directory)
    return getattr(model, model.base_model_prefix) if head else model


@pytest.fixture(autouse=True)
def _fresh():
    yield
    clear_cache()


@pytest.mark.parametrize("head", [False, True], ids=["encoder", "masked-lm"])
@pytest.mark.parametrize("kind", ["bert", "roberta", "distilbert"])
@torch.no_grad()
def test_encoder_directories_match_transformers(tmp_path, kind, head):
    ref = tiny(kind, tmp_path, head)
    enc = load_model(tmp_path)
    assert isinstance(enc, PretrainedEncoder) and enc.kind == kind
    mlm = [n for n in enc.ignored_tensors if n.startswith(("cls.", "lm_head.", "vocab_"))]
    assert bool(mlm) == head  # the masked-LM head (and BERT's pooler) are left out, and listed
    ids = torch.tensor([IDS])
    out = ref(ids, output_attentions=True)
    hidden, trace = enc.run_with_trace(IDS, names="*.weights")
    want = out.last_hidden_state
    torch.testing.assert_close(hidden[-1], want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    assert len(out.attentions) == 2
    for i, w in enumerate(out.attentions):
        torch.testing.assert_close(trace[f"encoder.layers.{i}.self_attn.weights"], w, rtol=1e-5, atol=1e-6)
    assert trace.meta["src_tokens"] == [f"<{i}>" for i in IDS]  # no tokenizer here: ids shown as ids


def bert_vocab(directory, lower: bool | None = None) -> None:
    (directory / "vocab.txt").write_text("\n".join(WORDS + [f"[unused{i}]" for i in range(VOCAB - len(WORDS))]) + "\n")
    if lower is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower}))


@pytest.mark.parametrize("lower", [None, False], ids=["uncased-default", "cased"])
def test_wordpiece_from_vocab_txt_when_there_is_no_tokenizer_json(tmp_path, lower):
    tiny("bert", tmp_path)
    bert_vocab(tmp_path, lower)
    enc = load_hf_dir(tmp_path)
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in ["The animal didn't cross the streets!", "Unter crossed because it was too tired", "zebra"]:
        assert enc.encode(text).ids == ref(text)["input_ids"], text
    assert enc.tokenizer_note is None
    assert enc.tokens("the animal") == ["[CLS]", "the", "animal", "[SEP]"]


def test_roberta_bpe_from_vocab_json_and_merges(tmp_path):
    tiny("roberta", tmp_path)
    symbols = ["<s>", "<pad>", "</s>", "<unk>", "t", "h", "e", "Ġ", "a", "n", "i", "m", "l", "th", "the", "Ġthe",
               "an", "Ġan", "<mask>"]
    (tmp_path / "vocab.json").write_text(json.dumps({s: i for i, s in enumerate(symbols)}))
    (tmp_path / "merges.txt").write_text("#version: 0.2\nt h\nth e\nĠ the\na n\nĠ an\n")
    enc = load_hf_dir(tmp_path)
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in ["the an animal", "hat the<mask> man"]:
        assert enc.encode(text).ids == ref(text)["input_ids"], text


def test_a_directory_without_any_tokenizer_opens_on_ids_and_says_so(tmp_path):
    tiny("distilbert", tmp_path)
    enc = load_model(tmp_path)
    assert enc.tokenizer is None
    assert "has no tokenizer" in enc.tokenizer_note and "token ids" in enc.tokenizer_note
    with pytest.raises(ValueError, match="has no tokenizer.*pass token ids"):
        enc.run_with_trace("the animal")
    hidden, trace = enc.run_with_trace(torch.tensor([IDS]))
    assert hidden[-1].shape == (1, len(IDS), 32)
    with pytest.raises(ValueError, match=r"token ids must lie in 0\.\.63"):
        enc.run_with_trace([5, 64])


def test_an_encoder_we_cannot_run_is_refused_in_one_sentence(tmp_path):
    tiny("distilbert", tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(hf | {"activation": "relu"}))
    with pytest.raises(ModelLoadError, match=r"activation='relu' \(only exact 'gelu' is supported\)"):
        load_hf_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(hf | {"dim": 48}))
    with pytest.raises(ModelLoadError, match="config.json and the weights do not match"):
        load_hf_dir(tmp_path)
