"""GGUF reader: metadata and tensor infos as gguf.GGUFReader reads them, dequantization bit-identical to
gguf.quants.dequantize, llama.cpp's Q/K permutation undone, HF names and config, and hostile files
(truncated, garbage, forged sizes) refused with a GGUFError in bounded memory."""

from __future__ import annotations

import struct
import tracemalloc

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from model.loaders import gguf as G
from model.loaders.bpe import tokenizer_from_gguf

RNG = np.random.default_rng(0)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's `permute` (LlamaModel), which the reader must undo."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# where each k-quant block keeps its fp16 scales (d, dmin): random bytes there could be inf or nan
K_SCALE_BYTES = {QT.Q2_K: (80, 84), QT.Q3_K: (108, 110), QT.Q4_K: (0, 4), QT.Q5_K: (0, 4), QT.Q6_K: (208, 210)}
K_TYPES = tuple(K_SCALE_BYTES)


def random_k_blocks(qtype: QT, n_blocks: int) -> np.ndarray:
    """Random k-quant blocks (gguf cannot quantize to these) with finite fp16 scales; every other bit random."""
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    b = RNG.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    lo, hi = K_SCALE_BYTES[qtype]
    scale = RNG.uniform(-0.05, 0.05, size=(n_blocks, (hi - lo) // 2)).astype("<f2")
    b[:, lo:hi] = scale.view(np.uint8).reshape(n_blocks, hi - lo)
    return b


def quantized(qtype: QT, shape: tuple[int, int]) -> np.ndarray:
    """Bytes of a random [rows, cols] tensor in `qtype`, laid out as GGUFWriter stores them."""
    x = RNG.standard_normal(shape).astype(np.float32)
    if qtype == QT.F32:
        return x
    if qtype == QT.F16:
        return x.astype(np.float16)
    if qtype in K_TYPES:
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        return random_k_blocks(qtype, shape[0] * shape[1] // block).reshape(shape[0], -1)
    return gguf.quants.quantize(x, qtype)


def write_gguf(path, tensors: dict[str, tuple[np.ndarray, QT]], kv: dict | None = None, arch: str = "llama"):
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in (kv or {}).items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, list) and value and isinstance(value[0], int):
            w.add_array(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=None if qtype in (QT.F32, QT.F16) else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


ALL_TYPES = [QT.F32, QT.F16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, *K_TYPES]


@pytest.fixture(scope="module")
def mixed_file(tmp_path_factory):
    tensors = {f"t.{q.name}": (quantized(q, (8, 512)), q) for q in ALL_TYPES}
    kv = {"x.u32": 7, "x.f32": 0.5, "x.flag": True, "x.text": "héllo 世界", "x.ints": [1, 2, 3],
          "x.words": ["a", "Ġb", "🤖"], "x.floats": [0.25, -1.5]}
    return write_gguf(tmp_path_factory.mktemp("gguf") / "mixed.gguf", tensors, kv)


def test_metadata_and_tensor_infos_match_gguf_reader(mixed_file):
    ours = G.read_gguf(mixed_file)
    ref = gguf.GGUFReader(mixed_file)
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        want = field.contents()
        got = ours.metadata[key]
        assert got == pytest.approx(want) if isinstance(want, float) else got == want, key
    assert set(ours.metadata) == {k for k in ref.fields if not k.startswith("GGUF.")}
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert info.ggml_type == int(t.tensor_type) and info.n_bytes == int(t.n_bytes)
        assert info.offset == int(t.data_offset) and info.shape == tuple(int(d) for d in t.shape[::-1])
        assert np.array_equal(ours.raw(t.name), np.asarray(t.data).reshape(-1).view(np.uint8))


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda q: q.name)
def test_dequantize_is_bit_identical_to_gguf(mixed_file, qtype):
    ours = G.read_gguf(mixed_file).dequantize(f"t.{qtype.name}")
    t = next(t for t in gguf.GGUFReader(mixed_file).tensors if t.name == f"t.{qtype.name}")
    ref = gguf.quants.dequantize(t.data, t.tensor_type)
    assert ours.shape == (8, 512) and ours.dtype == torch.float32
    assert np.isfinite(ref).all()
    assert np.array_equal(ours.numpy().view(np.uint32), ref.reshape(8, 512).view(np.uint32))


@pytest.mark.parametrize("qtype", [QT.IQ2_XXS, QT.IQ4_XS, QT.IQ1_M, QT.TQ2_0, QT.Q8_K], ids=lambda q: q.name)
def test_other_quantization_types_are_refused_by_name(qtype):
    with pytest.raises(G.GGUFError, match=rf"^quantization type {qtype.name} is not supported; supported: F32, .*Q5_K"):
        G.dequantize(np.zeros(1024, np.uint8), int(qtype), (256,))


def test_bf16_is_the_high_half_of_float32():
    x = RNG.standard_normal(64).astype(np.float32)
    raw = (x.view(np.uint32) >> 16).astype("<u2").view(np.uint8)
    got = G.dequantize(raw, 30, (64,))
    assert np.array_equal(got.numpy(), (x.view(np.uint32) & 0xFFFF0000).view(np.float32))


def tiny_llama_state(n_layers=2, d=64, n_heads=4, n_kv=2, d_ff=96, vocab=300):
    hd = d // n_heads
    sd = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,)}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        sd |= {p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
               p + "self_attn.q_proj.weight": (n_heads * hd, d), p + "self_attn.k_proj.weight": (n_kv * hd, d),
               p + "self_attn.v_proj.weight": (n_kv * hd, d), p + "self_attn.o_proj.weight": (d, n_heads * hd),
               p + "mlp.gate_proj.weight": (d_ff, d), p + "mlp.up_proj.weight": (d_ff, d),
               p + "mlp.down_proj.weight": (d, d_ff)}
    return {k: RNG.standard_normal(s).astype(np.float32) for k, s in sd.items()}


GGUF_OF = {v: k for k, v in G._LAYER_NAMES.items()}


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, *rest = hf.split(".")
    return f"blk.{i}.{GGUF_OF['.'.join(rest[:-1])]}.weight"


def bytes_to_unicode() -> list[str]:
    """GPT-2's byte alphabet: printable bytes stand for themselves, the others shift past 255 (space -> Ġ)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def tiny_tokenizer_kv(vocab: int) -> dict:
    """A byte-level BPE of `vocab` tokens: 3 control tokens, the 256 byte symbols, merges of letter pairs."""
    letters = "etaoinshrdlu"
    merges = [f"{a} {b}" for a in letters for b in letters][: vocab - 259]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *bytes_to_unicode(), *(m.replace(" ", "") for m in merges)]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (vocab - 3), "tokenizer.ggml.merges": merges,
            "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"}


def write_tiny_llama(path, sd, n_heads=4, n_kv=2, qtype=QT.F32, **extra):
    tensors = {}
    for name, w in sd.items():
        if ".q_proj." in name:
            w = llama_cpp_permute(w, n_heads)
        elif ".k_proj." in name:
            w = llama_cpp_permute(w, n_kv)
        q = qtype if w.ndim == 2 else QT.F32
        tensors[gguf_name(name)] = (w if q == QT.F32 else gguf.quants.quantize(w, q), q)
    d = sd["model.norm.weight"].shape[0]
    kv = {"llama.block_count": sum(1 for k in sd if k.endswith("q_proj.weight")), "llama.embedding_length": d,
          "llama.attention.head_count": n_heads, "llama.attention.head_count_kv": n_kv,
          "llama.feed_forward_length": sd["model.layers.0.mlp.up_proj.weight"].shape[0],
          "llama.context_length": 128, "llama.rope.freq_base": 10000.0,
          "llama.attention.layer_norm_rms_epsilon": 1e-5, "tokenizer.ggml.bos_token_id": 1,
          "tokenizer.ggml.eos_token_id": 2} | tiny_tokenizer_kv(sd["model.embed_tokens.weight"].shape[0]) | extra
    return write_gguf(path, tensors, kv)


def test_hf_tensors_undo_the_rotary_permutation_and_rename(tmp_path):
    sd = tiny_llama_state()
    g = G.read_gguf(write_tiny_llama(tmp_path / "tiny.gguf", sd))
    config = G.hf_config(g)
    assert config["vocab_size"] == 300 and config["num_key_value_heads"] == 2
    assert config["tie_word_embeddings"] and config["head_dim"] == 16 and config["eos_token_id"] == 2
    got = dict(G.hf_tensors(g, config))
    assert set(got) == set(sd)
    for name, w in sd.items():
        assert torch.equal(got[name], torch.from_numpy(w)), name


def test_permutation_on_quantized_rows_equals_permuting_dequantized_rows(tmp_path):
    sd = tiny_llama_state()
    g = G.read_gguf(write_tiny_llama(tmp_path / "q8.gguf", sd, qtype=QT.Q8_0))
    got = dict(G.hf_tensors(g, G.hf_config(g)))["model.layers.1.self_attn.k_proj.weight"]
    stored = g.dequantize("blk.1.attn_k.weight").numpy()
    back = stored.reshape(2, 8, 2, 64).swapaxes(1, 2).reshape(32, 64)  # transformers' reverse_permute
    assert np.array_equal(got.numpy(), back)
    assert np.abs(got.numpy() - sd["model.layers.1.self_attn.k_proj.weight"]).max() < 0.05  # Q8_0 error only


def test_hf_names():
    assert G.hf_name("blk.12.ffn_gate.weight") == "model.layers.12.mlp.gate_proj.weight"
    assert G.hf_name("blk.0.attn_output.weight") == "model.layers.0.self_attn.o_proj.weight"
    assert G.hf_name("blk.3.attn_q.bias") == "model.layers.3.self_attn.q_proj.bias"
    assert G.hf_name("output.weight") == "lm_head.weight"
    assert G.hf_name("rope_freqs.weight") is None and G.hf_name("blk.x.attn_q.weight") is None


@pytest.mark.parametrize("key, value, words", [
    ("llama.block_count", 1_000_000_000, "block_count"),
    ("llama.embedding_length", 1 << 30, "embedding_length"),
    ("llama.attention.head_count", 3, "head_count"),
    ("llama.attention.head_count_kv", 3, "head_count_kv"),
    ("llama.feed_forward_length", 7, "feed_forward_length"),
])
def test_absurd_config_sizes_are_refused(tmp_path, key, value, words):
    g = G.read_gguf(write_tiny_llama(tmp_path / "bad.gguf", tiny_llama_state(), **{key: value}))
    with pytest.raises(G.GGUFError, match=words):
        G.hf_config(g)


def test_unknown_architecture_lists_the_supported_ones(tmp_path):
    g = G.read_gguf(write_gguf(tmp_path / "x.gguf", {"w": (np.zeros(4, np.float32), QT.F32)}, arch="mamba"))
    with pytest.raises(G.GGUFError, match="'mamba'.*llama, qwen2"):
        G.hf_config(g)


# ---------------------------------------------------------------- hostile files


def header(n_tensors=0, n_kv=0, version=3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def gstr(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def read_bounded(path, limit=8 << 20):
    """read_gguf must raise GGUFError, allocating less than `limit` bytes while doing so."""
    tracemalloc.start()
    try:
        with pytest.raises(G.GGUFError) as err:
            G.read_gguf(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < limit, f"peak {peak:,} bytes"
    return str(err.value)


def test_every_truncation_of_a_valid_file_is_refused(mixed_file, tmp_path):
    data = mixed_file.read_bytes()
    cut = tmp_path / "cut.gguf"
    sizes = sorted({*range(0, 400, 7), *range(400, len(data), 997), len(data) - 1})
    for n in sizes:
        cut.write_bytes(data[:n])
        with pytest.raises(G.GGUFError, match="truncated|corrupt|not a GGUF|outside the file"):
            G.read_gguf(cut)


@pytest.mark.parametrize("body, words", [
    (b"", "shorter than a GGUF header"),
    (b"PK\x03\x04" + bytes(60), "not a GGUF file"),
    (header(version=1) + bytes(8), "version 1 is not supported"),
    (header(n_kv=1 << 62), "metadata entries"),
    (header(n_tensors=1 << 40), "tensors"),
    # one array claiming 2^61 strings: refused before any is read
    (header(n_kv=1) + gstr("k") + struct.pack("<IIQ", 9, 8, 1 << 61), "refused|truncated"),
    (header(n_kv=1) + gstr("k") + struct.pack("<IIQ", 9, 8, 1 << 20) + bytes(64), "refused|truncated"),
    (header(n_kv=1) + gstr("k") + struct.pack("<IIQ", 9, 4, 1 << 22), "truncated"),
    (header(n_kv=1) + gstr("k") + struct.pack("<IIQ", 9, 9, 2), "nested"),
    (header(n_kv=1) + gstr("k") + struct.pack("<I", 77) + bytes(16), "unknown value type"),
    (header(n_kv=1) + struct.pack("<Q", 1 << 50) + b"key", "truncated"),
    # a tensor claiming 2^40 x 2^20 floats far past the end of a tiny file
    (header(n_tensors=1) + gstr("w") + struct.pack("<I2QIQ", 2, 1 << 20, 1 << 40, 0, 0) + bytes(64),
     "impossible shape|outside"),
    (header(n_tensors=1) + gstr("w") + struct.pack("<I2QIQ", 2, 64, 64, 0, 0) + bytes(64), "outside the file"),
    (header(n_tensors=1) + gstr("w") + struct.pack("<IQIQ", 9, 64, 0, 0) + bytes(64), "dimensions"),
    (header(n_tensors=1) + gstr("w") + struct.pack("<IQIQ", 1, 256, 16, 0) + bytes(64),
     "quantization type IQ2_XXS (tensor 'w') is not supported; supported: F32"),
    (header(n_tensors=1) + gstr("w") + struct.pack("<IQIQ", 1, 64, 999, 0) + bytes(64), "unknown type id"),
    (header(n_tensors=1) + gstr("w") + struct.pack("<IQIQ", 1, 33, 8, 0) + bytes(64), "blocks"),
])
def test_hostile_headers_are_refused_in_bounded_memory(tmp_path, body, words):
    path = tmp_path / "bad.gguf"
    path.write_bytes(body)
    assert G.GGUFError.__mro__[1] is ValueError
    msg = read_bounded(path)
    assert any(w in msg for w in words.split("|")), msg
    assert "Traceback" not in msg


def test_garbage_after_the_magic_is_refused(tmp_path):
    path = tmp_path / "garbage.gguf"
    for seed in range(20):
        path.write_bytes(b"GGUF" + struct.pack("<I", 3) + np.random.default_rng(seed).bytes(4096))
        read_bounded(path)


def test_not_a_file(tmp_path):
    with pytest.raises(G.GGUFError, match="Cannot read"):
        G.read_gguf(tmp_path / "missing.gguf")
    with pytest.raises(G.GGUFError, match="not a file"):
        G.read_gguf(tmp_path)


# ---------------------------------------------------------------- tokenizer metadata


def test_tokenizer_needs_byte_level_or_sentencepiece_bpe():
    with pytest.raises(G.GGUFError, match=r"tokenizer 't5' is not supported \(byte-level BPE, 'gpt2', and "
                                          r"SentencePiece BPE, 'llama', are\)"):
        tokenizer_from_gguf({"tokenizer.ggml.model": "t5"})
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": [],
            "tokenizer.ggml.pre": "made-up"}
    with pytest.raises(G.GGUFError, match="pre-tokenizer 'made-up'.*smollm"):
        tokenizer_from_gguf(meta)
    with pytest.raises(G.GGUFError, match="merges do not fit"):
        tokenizer_from_gguf(meta | {"tokenizer.ggml.pre": "gpt2", "tokenizer.ggml.merges": ["a zz"]})


# ---------------------------------------------------------------- the dequantized cache


@pytest.fixture
def tiny_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_LAB_CACHE", str(tmp_path / "cache"))
    sd = tiny_llama_state()
    return write_tiny_llama(tmp_path / "tiny.gguf", sd, qtype=QT.Q8_0), sd


def cached_file(tmp_path):
    (only,) = (tmp_path / "cache" / "gguf").glob("*.safetensors")
    return only


def test_read_model_parts(tiny_gguf):
    path, sd = tiny_gguf
    part = G.read_model(path)
    assert not part.from_cache and set(part.tensors) == set(sd)
    # "end" is llama.cpp's list (<|endoftext|> too); the lab stops at the file's eos (LanguageModel.stop_rule)
    assert part.special_ids == {"bos": 1, "eos": 2, "pad": None, "eot": None, "eom": None, "end": [0, 2]}
    # merges rank "e a" before "t h"; "h e" is not a merge; the control token stays whole
    assert part.tokenizer.encode("the heat<|im_end|>").tokens == ["th", "e", "Ġ", "h", "ea", "t", "<|im_end|>"]
    assert part.chat_template.startswith("{% for m in messages %}")


def test_cache_is_written_then_read_and_checked(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    first = G.read_model(path)
    again = G.read_model(path)
    assert again.from_cache and again.config == first.config and again.special_ids == first.special_ids
    assert again.chat_template == first.chat_template
    assert again.tokenizer.encode("heat 42").ids == first.tokenizer.encode("heat 42").ids
    for name, t in first.tensors.items():
        assert torch.equal(again.tensors[name], t), name


@pytest.mark.parametrize("damage", ["flip a weight bit", "truncate", "garbage", "empty"])
def test_a_corrupt_cache_is_rebuilt(tiny_gguf, tmp_path, damage):
    path, _ = tiny_gguf
    first = G.read_model(path)
    cached = cached_file(tmp_path)
    data = bytearray(cached.read_bytes())
    if damage == "flip a weight bit":
        data[-5] ^= 0x10
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "garbage":
        data = bytearray(np.random.default_rng(1).bytes(len(data)))
    else:
        data = bytearray()
    cached.write_bytes(bytes(data))
    rebuilt = G.read_model(path)
    assert not rebuilt.from_cache
    for name, t in first.tensors.items():
        assert torch.equal(rebuilt.tensors[name], t), name
    assert G.read_model(path).from_cache  # and the cache is whole again


def test_a_changed_gguf_is_not_served_from_the_old_cache(tiny_gguf, tmp_path):
    path, sd = tiny_gguf
    G.read_model(path)
    sd2 = {k: v + 1.0 for k, v in sd.items()}
    write_tiny_llama(path, sd2, qtype=QT.Q8_0)  # same size, new bytes
    part = G.read_model(path)
    assert not part.from_cache
    assert torch.allclose(part.tensors["model.norm.weight"], torch.from_numpy(sd2["model.norm.weight"]), atol=0.05)


def test_an_unwritable_cache_only_costs_time(tiny_gguf, tmp_path, monkeypatch):
    path, sd = tiny_gguf
    (tmp_path / "blocked").write_text("a file where the cache dir should be")
    monkeypatch.setenv("ATTENTION_LAB_CACHE", str(tmp_path / "blocked"))
    assert set(G.read_model(path).tensors) == set(sd)
    assert not G.read_model(path).from_cache


def spm_kv(arch: str) -> dict:
    """A SentencePiece BPE vocabulary as llama.cpp stores it: <unk> <s> </s>, 256 byte tokens, scored pieces
    (Gemma's own order: <pad> <eos> <bos> <unk>, and a run of spaces stored as spaces)."""
    gemma = arch.startswith("gemma")
    head = ["<pad>", "</s>", "<s>", "<unk>"] if gemma else ["<unk>", "<s>", "</s>"]
    pieces = ["\u2581", "t", "h", "e", "a", "n", "o", "w", "r", "d", "l", "th", "\u2581t", "\u2581th", "the",
              "\u2581the", "an", "\u2581a", "\u2581an", "he", "wo", "\u2581wo", "or", "ld", "orld", "\u2581world",
              "<|user|>"] + (["  ", "   ", "\n"] if gemma else [])
    tokens = head + [f"<0x{b:02X}>" for b in range(256)] + pieces
    # Gemma's runs of spaces and its newline are user-defined tokens (type 4), as in the real file
    types = [3] * len(head) + [6] * 256 + [1] * (len(pieces) - (4 if gemma else 1)) + [3] + ([4, 4, 4] if gemma else [])
    scores = [0.0] * (len(head) + 256) + [-float(i) * (1.5 if i % 3 else 1.0) for i in range(len(pieces))]
    ids = {"bos": 2, "eos": 1, "unknown": 3, "padding": 0} if gemma else {"bos": 1, "eos": 2, "unknown": 0}
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.scores": scores} | {f"tokenizer.ggml.{k}_token_id": v for k, v in ids.items()}


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gemma3", "phi3"])
def test_sentencepiece_tokenizer_matches_transformers_gguf_tokenizer(tmp_path, arch):
    from transformers import AutoTokenizer

    kv = spm_kv(arch)
    path = write_gguf(tmp_path / f"{arch}.gguf", {"w": (np.zeros(32, np.float32), QT.F32)}, kv, arch=arch)
    ours = tokenizer_from_gguf(G.read_gguf(path).metadata | {"general.architecture": arch}, path.name)
    ref = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    assert ours.get_vocab_size() == len(kv["tokenizer.ggml.tokens"])  # no token added twice, no id past the embedding
    for text in ["the world", " the  an", "another world!", "h\u00e9llo w\u00f6rld \u4e16", "<|user|>the",
                 "   three", "  two", "a  b   c", "tab\tand\nnewline\n\n"]:
        assert ours.encode(text).ids == ref(text)["input_ids"], text
        assert ours.decode(ours.encode(text).ids, skip_special_tokens=True) == ref.decode(ref(text)["input_ids"],
                                                                                          skip_special_tokens=True)
