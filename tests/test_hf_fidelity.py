"""Hugging Face models loaded into our instrumented families agree with `transformers` (the
independent reference, eager attention): tiny random GPT-2, Llama with grouped-query attention,
Qwen2 with q/k/v biases, and BERT, built from transformers' configs and saved with save_pretrained
inside the test (no download). Logits and every head's attention weights within 1e-5."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from model import load_model  # noqa: E402
from model.loaders import clear_cache  # noqa: E402
from model.loaders.hf import ModelLoadError, load_hf_dir  # noqa: E402
from model.loaders.lm import LanguageModel  # noqa: E402

V = 97
T = 11
TOL = dict(atol=1e-5, rtol=0)


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random (HF zero-initialises biases and sets norms to 1: a bias or a norm weight
    mapped to the wrong place would go unnoticed)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if "norm" in name or name.split(".")[-2].startswith("ln") else 0.0
            p.copy_(base + 0.15 * torch.randn(p.shape, generator=g))


def _build(kind: str):
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=48,
                                      attn_implementation="eager", bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(cfg)
    elif kind == "llama":  # grouped-query attention: 6 query heads share 2 K/V heads
        cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                                       num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
                                       rope_theta=500.0, tie_word_embeddings=False, attn_implementation="eager",
                                       bos_token_id=1, eos_token_id=2)
        model = transformers.LlamaForCausalLM(cfg)
    else:  # qwen2: biases on q/k/v only, tied embeddings
        cfg = transformers.Qwen2Config(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                       rope_theta=10000.0, tie_word_embeddings=True, attn_implementation="eager",
                                       bos_token_id=1, eos_token_id=2)
        model = transformers.Qwen2ForCausalLM(cfg)
    _randomize(model, seed=len(kind))
    if kind == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias is not None
        assert model.model.layers[0].self_attn.o_proj.bias is None
    return model.eval()


@pytest.fixture(scope="module", params=["gpt2", "llama", "qwen2"])
def pair(request, tmp_path_factory):
    """(reference transformers model, our LanguageModel loaded from its save_pretrained directory)."""
    ref = _build(request.param)
    d = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(d, safe_serialization=True)
    return ref, load_hf_dir(d)


def _ids(seed=0, n=T):
    return torch.randint(0, V, (1, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_logits_and_every_heads_weights_match_transformers(pair):
    ref, lm = pair
    assert isinstance(lm, LanguageModel)
    ids = _ids()
    out = ref(ids, output_attentions=True)
    logits, trace = lm.run_with_trace(ids, names=["*.weights", "logits"])
    torch.testing.assert_close(logits, out.logits, **TOL)
    assert len(out.attentions) == lm.model.cfg.n_layers
    for i, w in enumerate(out.attentions):  # [1, H, T, T] per layer, per query head
        torch.testing.assert_close(trace[f"decoder.layers.{i}.self_attn.weights"], w, **TOL)
    assert torch.equal(logits, lm.model(ids))  # capture changes nothing


@torch.no_grad()
def test_kv_cache_logits_equal_the_full_pass(pair):
    _, lm = pair
    ids = _ids(1, 9)
    cache = lm.model.new_cache()
    parts = [lm.model(ids[:, :4], cache=cache, offset=0)]
    parts += [lm.model(ids[:, t:t + 1], cache=cache, offset=t) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(parts, 1), lm.model(ids), **TOL)


@torch.no_grad()
def test_greedy_generation_gives_transformers_tokens(pair):
    ref, lm = pair
    ids = _ids(2, 5)
    ours = lm.generate(ids, max_new_tokens=12)
    theirs = ref.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)[0, 5:].tolist()
    assert ours.ids == theirs
    assert ours.stop_reason == ("eos" if theirs[-1] in lm.stop_ids else "length")
    # per-step records: the new position's attention in every layer, the model's top-10
    s = ours.steps[-1]
    assert s.attention.shape == (lm.model.cfg.n_layers, lm.model.cfg.n_heads, 5 + len(ours.ids) - 1)
    torch.testing.assert_close(s.attention.sum(-1), torch.ones(s.attention.shape[:2]), atol=1e-5, rtol=0)
    assert len(s.top) == 10 and s.top[0][1] >= s.top[-1][1] and s.prob == pytest.approx(s.top[0][1])


@torch.no_grad()
def test_zeroing_one_heads_z_equals_zeroing_its_columns_of_the_output_projection(pair):
    ref, lm = pair
    ids = _ids(3)
    layer, head, hs = 1, 1, lm.model.cfg.head_dim

    def zero(t, name):
        t = t.clone()
        t[:, head] = 0
        return t

    ours = lm.run_with_hooks(ids, hooks={f"decoder.layers.{layer}.self_attn.z": zero})
    gpt2 = hasattr(ref, "transformer")
    block = ref.transformer.h[layer].attn.c_proj if gpt2 else ref.model.layers[layer].self_attn.o_proj
    w = block.weight
    saved = w.detach().clone()
    cols = slice(head * hs, (head + 1) * hs)
    with torch.no_grad():
        if gpt2:  # GPT-2's Conv1D is (in, out): the head's input rows
            w[cols, :] = 0
        else:
            w[:, cols] = 0
        theirs = ref(ids).logits
        w.copy_(saved)
    torch.testing.assert_close(ours, theirs, **TOL)
    assert not torch.allclose(ours, lm.model(ids), atol=1e-4)  # the head mattered


def test_load_model_returns_one_instance_per_directory(tmp_path):
    clear_cache()
    ref = _build("llama")
    ref.save_pretrained(tmp_path, safe_serialization=True)
    a = load_model(tmp_path)
    assert a is load_model(str(tmp_path)) and isinstance(a, LanguageModel)
    assert a.stop_ids == [2]
    clear_cache()


# ---------------------------------------------------------------- BERT: the existing encoder path


@torch.no_grad()
def test_bert_directory_loads_into_the_existing_encoder_wrapper(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from model.loaders.minilm import PretrainedEncoder

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "animal", "was", "tired", "it", "street", "cross", "##s"]
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(tmp_path / "tokenizer.json"))
    cfg = transformers.BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=32, attn_implementation="eager")
    ref = transformers.BertModel(cfg)
    _randomize(ref, seed=7)
    ref.eval().save_pretrained(tmp_path, safe_serialization=True)

    enc = load_model(tmp_path)
    assert isinstance(enc, PretrainedEncoder)
    text = "the animal was tired it crosss the street"
    ids = enc.ids(text)
    out = ref(ids, output_attentions=True)
    hidden, trace = enc.run_with_trace(text, names="*.weights")
    torch.testing.assert_close(hidden[-1], out.last_hidden_state, **TOL)
    for i, w in enumerate(out.attentions):
        torch.testing.assert_close(trace[f"encoder.layers.{i}.self_attn.weights"], w, **TOL)
    clear_cache()


# ---------------------------------------------------------------- refusals


def test_a_directory_with_only_pickled_weights_is_refused_with_the_conversion_command(tmp_path):
    ref = _build("gpt2")
    ref.config.save_pretrained(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x02 pickled")
    with pytest.raises(ModelLoadError) as e:
        load_hf_dir(tmp_path)
    msg = str(e.value)
    assert "pytorch_model.bin" in msg and "safetensors only" in msg
    assert "save_pretrained(" in msg and "safe_serialization=True" in msg and str(tmp_path) in msg


def test_an_unknown_architecture_lists_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}))
    from model.loaders.hf import LM_TYPES

    # the mechanism named (issue 32 §3), then every type the lab opens
    with pytest.raises(ModelLoadError, match=r"'mamba' is not supported: its layers are state-space \(Mamba\) layers, "
                       f"not attention; this lab opens these decoder-only types: {', '.join(LM_TYPES)} "
                       r"\(and the encoders bert, roberta, distilbert\)"):
        load_hf_dir(tmp_path)


@pytest.mark.parametrize("change, words", [
    ({"vocab_size": 10**12}, "vocab_size = 1,000,000,000,000 is absurd"),
    ({"hidden_size": 32768, "intermediate_size": 131072, "num_hidden_layers": 1000,
      "num_attention_heads": 256, "num_key_value_heads": 256}, "GiB in float32"),
    ({"num_hidden_layers": -3}, "num_hidden_layers must be a positive integer"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4}}, "RoPE scaling"),  # YaRN opens
])
def test_absurd_or_unsupported_configs_are_refused_before_allocating(tmp_path, change, words):
    import resource

    ref = _build("llama")
    ref.save_pretrained(tmp_path, safe_serialization=True)
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(hf | change))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ModelLoadError) as e:
        load_hf_dir(tmp_path)
    assert words in str(e.value)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: nothing big allocated


def test_weights_that_disagree_with_the_config_are_refused(tmp_path):
    ref = _build("llama")
    ref.save_pretrained(tmp_path, safe_serialization=True)
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(hf | {"intermediate_size": 96}))
    with pytest.raises(ModelLoadError, match="config.json and the weights do not match"):
        load_hf_dir(tmp_path)


def test_a_truncated_safetensors_file_is_refused(tmp_path):
    ref = _build("gpt2")
    ref.save_pretrained(tmp_path, safe_serialization=True)
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_hf_dir(tmp_path)


def test_an_absurd_bert_config_is_refused_before_allocating(tmp_path):
    from safetensors.torch import save_file

    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32768, num_hidden_layers=600, num_attention_heads=64,
                                  intermediate_size=131072, max_position_embeddings=512)
    cfg.save_pretrained(tmp_path)
    save_file({"embeddings.word_embeddings.weight": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="Refused before loading"):
        load_hf_dir(tmp_path)
