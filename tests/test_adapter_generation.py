"""Recorded generation through the transformers adapter on sliding-window layers (issue 42 §1-2).

A sliding-window layer's KV cache in transformers holds only the keys its window can still see, so its
output_attentions during generation cover the last `window` positions. The adapter records, as the lab's own
families do (Step.attention: [L, H, T_so_far]), the whole causal row of every layer: the keys the window blocks are
exactly 0. Checked on tiny random models (AutoConfig.for_model + save_pretrained, no download) of types mixing
sliding and full layers (EXAONE 4, Ministral) and of all-sliding ones (OLMo 3, Cohere 2), generating well past the
window, against transformers' own eager attention on the whole final sequence: the step that predicted from
position t recorded row t of that run.

And the adapter's account of positions (describe()["blocks"]["positions"], and what it lacks) says what the
model does: Falcon rotates q and k (rotary), Falcon with alibi=True adds ALiBi and turns nothing.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_bpe_tokenizer
from tolerance import f32_tol

from model.loaders.hf import LM_TYPES, load_hf_dir

transformers = pytest.importorskip("transformers")

WINDOW = 6
S, F = "sliding_attention", "full_attention"
# case -> (model type, layer types); none of them a family of the lab's, so each opens through the adapter
CASES = {"exaone4": ("exaone4", [S, F, S, F]), "ministral": ("ministral", [S, S, F, S]),
         "olmo3": ("olmo3", [S, S, S]), "cohere2": ("cohere2", [S, S, S])}
COMMON = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=256, sliding_window=WINDOW, bos_token_id=0, eos_token_id=0, pad_token_id=0)
PROMPT = "When Mary and John went to the store"
NEW = 14  # tokens generated: the sequence ends well past the window


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """case -> (the adapter's LanguageModel, transformers' own model), built and saved once per module."""
    cache = {}

    def get(case):
        if case not in cache:
            kind, types = CASES[case]
            d = tmp_path_factory.mktemp(case)
            tok = tiny_bpe_tokenizer(d)
            torch.manual_seed(0)
            cfg = transformers.AutoConfig.for_model(kind, vocab_size=tok.get_vocab_size(), num_hidden_layers=len(types),
                                                    layer_types=types, **COMMON)
            ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
            ref.save_pretrained(d, safe_serialization=True)
            cache[case] = (load_hf_dir(d), ref)
        return cache[case]

    return get


@pytest.mark.parametrize("case", list(CASES))
def test_recorded_rows_are_whole_causal_rows_equal_to_transformers(made, case):
    lm, ref = made(case)
    kind, types = CASES[case]
    assert kind not in LM_TYPES and list(ref.config.layer_types) == types
    windows = [lm.model.describe()["attention"][f"decoder.layers.{i}.self_attn"]["window"] for i in range(len(types))]
    assert windows == [WINDOW if t == S else None for t in types]  # what the pages draw the mask from
    ids = lm.encode(PROMPT)
    T0 = ids.shape[1]
    gen = lm.generate(ids, max_new_tokens=NEW, record=True)
    full = torch.tensor([gen.prompt_ids + gen.ids])
    assert full.shape[1] - 1 >= T0 + WINDOW  # the last step predicted from a position past the window
    with torch.no_grad():
        out = ref(full, output_attentions=True, use_cache=False)
    # greedy tokens are transformers' own argmax on the whole sequence
    assert gen.ids == out.logits[0, T0 - 1:T0 - 1 + len(gen.ids)].argmax(-1).tolist()
    H = ref.config.num_attention_heads
    for step in gen.steps:
        t = step.position
        assert step.attention.shape == (len(types), H, t + 1)  # every layer: all t + 1 keys so far
        for i, kind_i in enumerate(types):
            want = out.attentions[i][0, :, t, :t + 1]
            got = step.attention[i]
            # a KV-cache step against one forward over the whole sequence: the same numbers up to reduction order
            assert float((got - want).abs().max()) <= f32_tol(1.0, n=ref.config.hidden_size), (case, t, i)
            back = t + 1 - WINDOW  # keys before it are outside a sliding window
            if kind_i == S and back > 0:
                assert torch.equal(got[:, :back], torch.zeros(H, back))  # blocked: exactly 0, not dropped
                assert torch.equal(want[:, :back], torch.zeros(H, back))
                assert bool((got[:, back:] > 0).all())
            elif back > 0:
                assert bool((got[:, :back] > 0).all())  # a full layer sees them
            torch.testing.assert_close(got.sum(-1), torch.ones(H), rtol=0, atol=1e-5)


def test_generation_without_recording_gives_the_same_tokens(made):
    lm, _ = made("exaone4")
    a = lm.generate(PROMPT, max_new_tokens=NEW, record=True)
    b = lm.generate(PROMPT, max_new_tokens=NEW, record=False)
    assert a.ids == b.ids and all(s.attention is None for s in b.steps)


@pytest.fixture(scope="module")
def falcon(tmp_path_factory):
    def get(alibi: bool):
        d = tmp_path_factory.mktemp(f"falcon-alibi-{alibi}")
        tok = tiny_bpe_tokenizer(d)
        torch.manual_seed(0)
        cfg = transformers.AutoConfig.for_model(
            "falcon", vocab_size=tok.get_vocab_size(), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            alibi=alibi, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
        ref.save_pretrained(d, safe_serialization=True)
        return load_hf_dir(d), ref

    return get


@pytest.mark.parametrize("alibi", [False, True])
def test_falcon_positions_are_said_as_the_model_applies_them(falcon, alibi):
    lm, ref = falcon(alibi)
    desc = lm.model.describe()
    lacks = " ".join(desc["lacks"])
    ids = lm.encode(PROMPT)
    logits, trace = lm.run_with_trace(ids)
    with torch.no_grad():
        out = ref(ids, output_attentions=True)
    assert torch.equal(logits, out.logits)
    if alibi:
        assert desc["blocks"]["positions"] == "alibi" and desc["blocks"]["q_k"] == "alibi"
        assert "rotary" not in lacks and "ALiBi" in lacks  # no rotary is applied, so none is said missing
        assert "decoder.layers.0.self_attn.q_unrot" not in trace  # q and k are used as projected
        assert "decoder.layers.0.self_attn.q" in trace
    else:
        assert desc["blocks"]["positions"] == "rotary" and desc["blocks"]["q_k"] == "rotated"
        assert "ALiBi" not in lacks
        # the scores the adapter gives after the rotary are what transformers' softmax compares
        T = ids.shape[1]
        blocked = torch.ones(T, T, dtype=torch.bool).triu(1)
        w = torch.softmax(trace["decoder.layers.1.self_attn.scores"].masked_fill(blocked, float("-inf")), -1)
        assert float((w - out.attentions[1]).abs().max()) <= f32_tol(1.0, n=16)


def test_a_model_without_positions_in_attention_says_none(tmp_path):
    """OPT adds learned positions to the embeddings: its attention turns nothing and adds no bias."""
    tok = tiny_bpe_tokenizer(tmp_path)
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model("opt", vocab_size=tok.get_vocab_size(), hidden_size=64, ffn_dim=96,
                                            num_hidden_layers=2, num_attention_heads=4, bos_token_id=0,
                                            eos_token_id=0, pad_token_id=0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path, safe_serialization=True)
    desc = load_hf_dir(tmp_path).model.describe()
    assert desc["blocks"]["positions"] == "none" and desc["blocks"]["q_k"] == "raw"
