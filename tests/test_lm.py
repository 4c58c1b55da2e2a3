"""The decoder-only language-model family (model/families/lm.py): capture names, exactness, masks,
causality, grouped-query attention, rotary positions, the KV cache, the trace budget."""

import math

import pytest
import torch
from tolerance import f32_tol

from model.core.layers import apply_rotary, rotary_angles
from model.core.recorder import CaptureError
from model.families.lm import DecoderLM, LMConfig
from model.loaders.lm import LanguageModel

LLAMA = dict(vocab_size=61, d_model=48, n_layers=2, n_heads=6, n_kv_heads=2, d_ff=80, max_len=64,
             positional="rotary", rope_base=500.0, norm="rmsnorm", norm_eps=1e-6, ffn="gated",
             activation="silu", qkv_bias=False, out_bias=False, ffn_bias=False, tie_embeddings=True)
GPT2 = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=40, positional="learned",
            norm="layernorm", ffn="plain", activation="gelu_tanh", tie_embeddings=True)


def make(kind: dict, seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    return DecoderLM(LMConfig(**kind)).eval()


@pytest.fixture(params=["llama", "gpt2"])
def lm(request):
    return make(LLAMA if request.param == "llama" else GPT2)


def ids(T=9, B=2, V=61, seed=1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_capture_names_are_exactly_what_a_forward_records(lm):
    x = ids()
    shapes = lm.capture_names(*x.shape)
    _, trace = lm.run_with_trace(x)
    assert trace.names() == list(shapes)  # same names, same (computation) order
    assert {n: tuple(t.shape) for n, t in trace.items()} == shapes
    c = lm.cfg
    rotary = c.positional == "rotary"
    assert ("decoder.rope.angles" in shapes) == rotary
    assert ("decoder.embed.pos" in shapes) == (not rotary)
    assert ("decoder.layers.0.ffn.gate" in shapes) == (c.ffn == "gated")
    assert ("decoder.layers.1.self_attn.q_unrot" in shapes) == rotary
    assert not any("cross_attn" in n for n in shapes)
    # grouped-query attention keeps the model's own K/V heads; scores and weights are per query head
    assert shapes["decoder.layers.1.self_attn.k"] == (2, c.kv_heads, 9, c.head_dim)
    assert shapes["decoder.layers.1.self_attn.weights"] == (2, c.n_heads, 9, 9)


@torch.no_grad()
def test_capture_on_and_off_give_bit_identical_logits(lm):
    x = ids()
    plain = lm(x)
    for names in (None, "*.weights", "logits"):
        logits, _ = lm.run_with_trace(x, names=names)
        assert torch.equal(logits, plain), names
    assert torch.equal(lm.run_with_hooks(x, hooks={"*.z": lambda t, n: None}), plain)


@torch.no_grad()
def test_masked_cells_are_exactly_zero_and_rows_sum_to_one(lm):
    _, trace = lm.run_with_trace(ids(), names=["*.weights", "*.mask", "*.scores", "masks.causal"])
    causal = trace["masks.causal"]
    assert torch.equal(causal, torch.ones(9, 9, dtype=torch.bool).triu(1))  # True = blocked (the future)
    for i in range(lm.cfg.n_layers):
        w = trace[f"decoder.layers.{i}.self_attn.weights"]
        mask = trace[f"decoder.layers.{i}.self_attn.mask"].expand_as(w)
        assert (w[mask] == 0).all()  # exactly 0
        assert (w[~mask] > 0).all()
        # a float32 softmax row of T weights <= 1 sums to 1 up to a few ulps x sqrt(T)
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), atol=f32_tol(1, n=w.shape[-1]), rtol=0)
        assert torch.isfinite(trace[f"decoder.layers.{i}.self_attn.scores"]).all()


@torch.no_grad()
def test_future_tokens_cannot_change_the_past(lm):
    x = ids(T=10)
    y = x.clone()
    y[:, 6:] = (y[:, 6:] + 7) % 61  # change only positions 6..9
    a, b = lm(x), lm(y)
    # equal in real arithmetic; 10 tokens either way, but other values in the rows the past does not see can
    # change how a kernel splits its sums: a few ulps of the largest logit x sqrt(d_model) (tests/tolerance.py)
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=f32_tol(a, b, n=lm.cfg.d_model), rtol=0)
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@torch.no_grad()
def test_scores_are_rotated_q_dot_k_over_sqrt_dk_with_shared_kv_heads():
    lm = make(LLAMA)
    _, trace = lm.run_with_trace(ids(), names="decoder.layers.1.self_attn.*")
    p = "decoder.layers.1.self_attn"
    q, k, s = trace[f"{p}.q"], trace[f"{p}.k"], trace[f"{p}.scores"]
    r = lm.cfg.n_heads // lm.cfg.kv_heads
    for h in range(lm.cfg.n_heads):  # query head h reads K/V head h // r
        g = lm.decoder.layers[1].self_attn.kv_head_of(h)
        assert g == h // r
        torch.testing.assert_close(s[:, h], q[:, h] @ k[:, g].transpose(-1, -2) / math.sqrt(lm.cfg.head_dim))
        torch.testing.assert_close(trace[f"{p}.z"][:, h], trace[f"{p}.weights"][:, h] @ trace[f"{p}.v"][:, g])
    angles = rotary_angles(9, lm.cfg.head_dim, lm.cfg.rope_base)
    torch.testing.assert_close(q, apply_rotary(trace[f"{p}.q_unrot"], angles))
    torch.testing.assert_close(k, apply_rotary(trace[f"{p}.k_unrot"], angles))
    # a rotation keeps lengths, and position 0 is not rotated
    torch.testing.assert_close(q.norm(dim=-1), trace[f"{p}.q_unrot"].norm(dim=-1))
    torch.testing.assert_close(q[:, :, 0], trace[f"{p}.q_unrot"][:, :, 0])


@torch.no_grad()
def test_one_kv_head_gives_the_bits_of_its_copies():
    """Multi-query attention (one K/V head, Gemma 3 270M/1B, Falcon): the forward reads the K/V head as a stride-0 view,
    not H copies; its scores and z are the copies' bits, so a lazy trace (which recomputes from the copies) and a
    cached decode step agree with the full trace as before."""
    lm = make(LLAMA | {"n_kv_heads": 1})
    for B in (1, 2):  # one sequence: the view; a batch: copies
        _one_kv_head_bits(lm, ids(B=B))


def _one_kv_head_bits(lm, x):
    from model.core.attention import attention_scores

    _, full = lm.run_with_trace(x, names="decoder.layers.1.self_attn.*")
    _, lazy = lm.run_with_trace(x, lazy=True)
    p, H = "decoder.layers.1.self_attn", lm.cfg.n_heads
    k, v = full[f"{p}.k"].repeat_interleave(H, dim=1), full[f"{p}.v"].repeat_interleave(H, dim=1)
    assert torch.equal(full[f"{p}.scores"], attention_scores(full[f"{p}.q"], k))
    assert torch.equal(full[f"{p}.z"], full[f"{p}.weights"] @ v)
    for role in ("scores", "weights", "z"):
        assert torch.equal(lazy[f"{p}.{role}"], full[f"{p}.{role}"]), role
    cache = lm.new_cache()
    steps = [lm(x[:, :4], cache=cache)] + [lm(x[:, t:t + 1], cache=cache, offset=t) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), lm(x), atol=f32_tol(1, n=64), rtol=0)


@torch.no_grad()
def test_rotary_scores_depend_on_relative_position_only():
    """RoPE: the score of the same (query, key) vectors placed at (i, j) depends only on i - j."""
    hs = 8
    a, b = torch.randn(1, 1, 1, hs), torch.randn(1, 1, 1, hs)
    ang = rotary_angles(20, hs, 100.0)
    score = [(apply_rotary(a, ang[i:i + 1]) * apply_rotary(b, ang[j:j + 1])).sum() for i, j in ((5, 2), (15, 12))]
    torch.testing.assert_close(score[0], score[1], atol=1e-5, rtol=0)


@torch.no_grad()
def test_kv_cache_one_token_at_a_time_equals_the_full_pass(lm):
    x = ids(T=8, B=1)
    full = lm(x)
    cache = lm.new_cache()
    steps = [lm(x[:, :3], cache=cache, offset=0)]
    steps += [lm(x[:, t:t + 1], cache=cache, offset=t) for t in range(3, 8)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_tied_embeddings_share_one_tensor_and_parameter_count_matches_config(lm):
    assert lm.generator.weight is lm.decoder.embed.tok.weight
    assert lm.num_parameters() == lm.cfg.num_parameters()
    untied = DecoderLM(LMConfig(**(GPT2 | {"tie_embeddings": False})))
    assert untied.generator.weight is not untied.decoder.embed.tok.weight
    assert untied.num_parameters() == untied.cfg.num_parameters()


@torch.no_grad()
def test_describe_travels_in_the_trace(lm):
    _, trace = lm.run_with_trace(ids(), names="logits")
    d = trace.meta["model"]
    assert d == lm.describe()
    assert d["family"] == "decoder_lm"
    assert d["stacks"] == {"decoder": {"layers": 2, "tokens": "tgt_tokens"}}
    a = d["attention"]["decoder.layers.1.self_attn"]
    assert a.items() >= {"kind": "decoder_self", "stack": "decoder", "layer": 1, "causal": True,
                         "query_tokens": "tgt_tokens", "key_tokens": "tgt_tokens", "n_heads": lm.cfg.n_heads,
                         "n_kv_heads": lm.cfg.kv_heads, "d_head": lm.cfg.head_dim}.items()
    # the score -> weights math of the layer (model/core/describe.py): plain causal attention here
    assert (a["scale"], a["softcap"], a["window"], a["qk_norm"]) == (lm.cfg.head_dim ** -0.5, None, None, False)
    assert list(d["attention"]) == ["decoder.layers.0.self_attn", "decoder.layers.1.self_attn"]
    assert d["blocks"]["positional"] == lm.cfg.positional and d["blocks"]["norm"] == lm.cfg.norm
    assert trace.meta["tgt_ids"] == ids().tolist()


@torch.no_grad()
def test_a_capture_over_budget_is_refused_saying_what_fits():
    lm = make(LLAMA)
    x = ids(T=40, B=1)
    one = 6 * 40 * 40 * 4  # one layer's weights, bytes
    with pytest.raises(CaptureError) as e:
        lm.run_with_trace(x, names="*.weights", budget_bytes=one + 100)
    msg = str(e.value)
    assert "at 40 tokens" in msg and "1 of these 2 tensors" in msg
    fits = int(msg.split("up to ")[1].split(" tokens")[0])
    assert 2 * 6 * fits * fits * 4 <= one + 100 < 2 * 6 * (fits + 1) ** 2 * 4  # the largest length that fits
    _, trace = lm.run_with_trace(x[:, :fits], names="*.weights", budget_bytes=one + 100)  # and it does
    assert len(trace) == 2


@pytest.mark.parametrize("bad, words", [
    (dict(n_kv_heads=4), "multiple of n_kv_heads"),
    (dict(positional="alibi"), "positional must be one of"),
    (dict(activation="swish"), "activation must be one of"),
    (dict(vocab_size=0), "vocab_size must be a positive integer"),
    (dict(eos_id=61), "eos_id (61) must be below vocab_size"),
])
def test_bad_configs_are_refused_with_a_reason(bad, words):
    with pytest.raises(ValueError) as e:
        LMConfig(**(LLAMA | bad))
    assert words in str(e.value)


def test_bad_ids_get_a_clear_message():
    lm = make(GPT2)
    with pytest.raises(ValueError, match="ids must be in"):
        lm(torch.tensor([[0, 61]]))
    with pytest.raises(ValueError, match="longer than this model's limit max_len=40"):
        lm(torch.zeros(1, 41, dtype=torch.long))
    with pytest.raises(ValueError, match="integer tensor"):
        lm(torch.zeros(1, 3))


# ---------------------------------------------------------------- LanguageModel: text, chat, generation


def word_lm(stop_ids=(), chat_template=None) -> LanguageModel:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|im_end|>": 0, "<|im_start|>": 1} | {f"w{i}": i for i in range(2, 61)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|im_end|>", "<|im_start|>"])
    return LanguageModel(make(LLAMA), tok, name="tiny", stop_ids=stop_ids, chat_template=chat_template,
                         special_tokens={"eos_token": "<|im_end|>"})


CHAT = ("{% for m in messages %}<|im_start|> w{{ 10 if m['role'] == 'user' else 11 }} {{ m['content'] }} "
        "<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|> w11 {% endif %}")


def test_text_in_trace_out_with_tokens_in_meta():
    lm = word_lm()
    ids = lm.encode("w5 w6 w7")
    assert ids.tolist() == [[5, 6, 7]]
    logits, trace = lm.run_with_trace("w5 w6 w7", names="*.weights")
    assert logits.shape == (1, 3, 61)
    assert trace.meta["tgt_tokens"] == ["w5", "w6", "w7"] and trace.meta["tgt_ids"] == [[5, 6, 7]]
    assert trace.meta["model"]["family"] == "decoder_lm"
    with pytest.raises(ValueError, match="empty"):
        lm.encode("   ")


def test_chat_template_renders_in_a_sandbox():
    lm = word_lm(chat_template=CHAT)
    assert lm.encode("w5 w6", chat=True).tolist() == [[1, 10, 5, 6, 0, 1, 11]]
    evil = word_lm(chat_template="{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ValueError, match="chat template failed"):
        evil.encode("w5", chat=True)  # the sandbox refuses attribute access to internals
    with pytest.raises(ValueError, match="no chat template"):
        word_lm().encode("w5", chat=True)


@torch.no_grad()
def test_greedy_generation_is_the_argmax_of_a_full_pass_at_every_step():
    lm = word_lm()
    out = lm.generate("w5 w6 w7", max_new_tokens=6)
    assert out.stop_reason == "length" and len(out.ids) == 6 and out.prompt_ids == [5, 6, 7]
    seq = torch.tensor([[5, 6, 7] + out.ids])
    full = lm.model(seq)
    assert out.ids == full[0, 2:-1].argmax(-1).tolist()  # the cache changed nothing
    for t, s in enumerate(out.steps):  # the recorded attention is the new position's row of a full pass
        _, trace = lm.run_with_trace(seq[:, :3 + t], names="*.weights")
        want = torch.stack([trace[f"decoder.layers.{i}.self_attn.weights"][0, :, -1] for i in range(2)])
        torch.testing.assert_close(s.attention, want, atol=1e-5, rtol=0)
        assert s.position == 2 + t
    assert out.tokens == [f"w{i}" if i > 1 else "<|im_end|>" for i in out.ids]


@torch.no_grad()
def test_generation_stops_at_an_end_token_and_says_so():
    free = word_lm().generate("w5 w6 w7", max_new_tokens=6)
    stop = free.ids[2]
    lm = word_lm(stop_ids=[stop])
    out = lm.generate("w5 w6 w7", max_new_tokens=6)
    k = free.ids.index(stop)
    assert out.stop_reason == "eos" and out.ids == free.ids[:k + 1]
    assert out.text == lm.decode(free.ids[:k])  # the end token is not part of the text
    seen = []
    lm.generate("w5 w6 w7", max_new_tokens=6, on_step=seen.append)  # streaming: one call per token
    assert [s.id for s in seen] == out.ids


@torch.no_grad()
def test_sampling_is_reproducible_and_respects_top_k_and_top_p():
    lm = word_lm()
    a = lm.generate("w5 w6", max_new_tokens=8, temperature=1.5, seed=3)
    assert a.ids == lm.generate("w5 w6", max_new_tokens=8, temperature=1.5, seed=3).ids  # private generator
    assert any(lm.generate("w5 w6", max_new_tokens=8, temperature=1.5, seed=s).ids != a.ids for s in range(4, 8))
    greedy = lm.generate("w5 w6", max_new_tokens=8).ids
    assert lm.generate("w5 w6", max_new_tokens=8, temperature=1.0, top_k=1, seed=9).ids == greedy
    assert lm.generate("w5 w6", max_new_tokens=8, temperature=1.0, top_p=1e-6, seed=9).ids == greedy
    for s in lm.generate("w5 w6", max_new_tokens=8, temperature=2.0, top_k=3, seed=1).steps:
        assert s.token in [tok for tok, _ in s.top[:3]]
    with pytest.raises(ValueError, match="top_p must be in"):
        lm.generate("w5", top_p=0)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        lm.generate("w5", temperature=-1)


# ---------------------------------------------------------------- interventions on a language model


@torch.no_grad()
def test_ablate_head_and_a_shared_kv_head_on_a_language_model():
    from model import interventions as iv

    lm = make(LLAMA)  # 6 query heads share 2 K/V heads: r = 3
    x = ids(B=1)
    module = "decoder.layers.1.self_attn"
    assert iv.shared_query_heads(6, 2, 1) == [3, 4, 5]
    assert "shared by query heads 3, 4, 5" in iv.kv_head_note(6, 2, 1)
    assert "silences all 3" in iv.kv_head_note(6, 2, 1)
    _, kv = lm.run_with_trace(x, names=[f"{module}.z", "logits"], hooks=iv.ablate_kv_head(module, 1))
    z = kv[f"{module}.z"]
    assert (z[:, 3:] == 0).all() and (z[:, :3] != 0).any()  # all three query heads silenced, the others not
    heads = iv.combine(*(iv.ablate_head(module, h) for h in (3, 4, 5)))
    # the same zeros by two hook paths: equal up to a few ulps of the largest logit x sqrt(d_model)
    torch.testing.assert_close(kv["logits"], lm.run_with_hooks(x, hooks=heads),
                               atol=f32_tol(kv["logits"], n=lm.cfg.d_model), rtol=0)
    one = lm.run_with_hooks(x, hooks=iv.ablate_head(module, 4))
    assert not torch.allclose(one, kv["logits"])  # one query head is not the whole group
    with pytest.raises(ValueError, match="K/V head 2 does not exist at .* it has 2 K/V heads"):
        lm.run_with_hooks(x, hooks=iv.ablate_kv_head(module, 2))
    hooks = iv.build(f"ablate_head:module={module},head=4") | iv.build("no_scaling", cfg=lm.cfg)
    assert lm.run_with_hooks(x, hooks=hooks).shape == (1, 9, 61)
