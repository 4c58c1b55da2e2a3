"""The 2024-2026 decoder families, each loaded from a tiny random model that transformers saved, agree with
transformers 5.x (eager attention, float32): logits and every head's attention weights within 1e-5
(relative to the largest value), greedy tokens equal. One switch per mechanism in model/families/lm.py:
llama3 RoPE scaling, sliding windows, q/k norm, Gemma's scaled embedding and (1 + w) norms, soft-capping,
sandwich and post norms, query_pre_attn_scalar, two RoPE bases, fused qkv / gate_up, parallel residual,
partial rotary, mixtures of experts. Also: the new capture points and hooks, the description, bfloat16,
devices, and the directories a user may bring wrong."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from model import load_model  # noqa: E402
from model.loaders import clear_cache  # noqa: E402
from model.loaders.hf import LM_TYPES, ModelLoadError, load_hf_dir  # noqa: E402

V, T, W = 160, 24, 8  # vocabulary, prompt length, sliding window (the prompt is 3 windows long)
COMMON = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
FAMILIES = {
    "llama3": ("llama", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                             rope_theta=50.0)),  # a small base: the scaled band falls inside d_head
    "mistral": ("mistral", dict(sliding_window=W, head_dim=16)),
    "qwen3": ("qwen3", dict(head_dim=16)),
    "gemma": ("gemma", dict(head_dim=16)),
    "gemma2": ("gemma2", dict(head_dim=16, sliding_window=W, query_pre_attn_scalar=24,
                              attn_logit_softcapping=3.0, final_logit_softcapping=2.0)),  # small caps: they bite
    "gemma3": ("gemma3_text", dict(head_dim=16, sliding_window=W, query_pre_attn_scalar=24,
                                   layer_types=["sliding_attention", "full_attention"],
                                   rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                       "rope_theta": 1e6},
                                                    "sliding_attention": {"rope_type": "default",
                                                                          "rope_theta": 1e4}})),
    "phi3": ("phi3", dict()),
    "olmo2": ("olmo2", dict()),
    "gpt_neox": ("gpt_neox", dict(rotary_pct=0.5, num_key_value_heads=4)),
    "qwen2_moe": ("qwen2_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                    shared_expert_intermediate_size=48, num_hidden_layers=3,
                                    mlp_only_layers=[1])),  # layer 1: a dense FFN between MoE layers
    "olmoe": ("olmoe", dict(num_experts=4, num_experts_per_tok=2)),
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2)),
}


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random (norms near their identity: 1 for a weight, 0 for Gemma's offset; a norm
    or a bias mapped to the wrong place would otherwise go unnoticed)."""
    g = torch.Generator().manual_seed(seed)
    gemma = "gemma" in type(model).__name__.lower()
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if ("norm" in name and not gemma) and name.endswith("weight") else 0.0
            p.copy_(base + 0.2 * torch.randn(p.shape, generator=g))


def build(family: str, dtype=torch.float32, families=None):
    """A tiny random transformers model of `family` (from `families`, default FAMILIES), eager, in `dtype`."""
    model_type, extra = (FAMILIES if families is None else families)[family]
    cfg = transformers.AutoConfig.for_model(model_type, **(COMMON | extra))
    cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    _randomize(model, seed=sum(map(ord, family)))
    return model.to(dtype).eval()


def saved_by(tmp_path_factory, builder):
    """family -> (transformers model from `builder`, its save_pretrained directory), each built once."""
    cache = {}

    def get(family):
        if family not in cache:
            ref = builder(family)
            d = tmp_path_factory.mktemp(family)
            ref.save_pretrained(d)
            cache[family] = ref, d
        return cache[family]

    return get


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return saved_by(tmp_path_factory, build)


def ids(seed=0, n=T):
    return torch.randint(3, V, (1, n), generator=torch.Generator().manual_seed(seed))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("family", list(FAMILIES))
@torch.no_grad()
def test_logits_weights_and_greedy_tokens_match_transformers(family, saved):
    ref, d = saved(family)
    lm = load_hf_dir(d)
    assert lm.model.num_parameters() == lm.model.cfg.num_parameters() == sum(p.numel() for p in ref.parameters())
    x = ids()
    out = ref(x, output_attentions=True)
    logits, trace = lm.run_with_trace(x, names=["*.weights", "logits"])
    assert rel(logits, out.logits) <= 1e-5, family
    assert len(out.attentions) == lm.model.cfg.n_layers
    for i, w in enumerate(out.attentions):  # [1, H, T, T] per layer, every query head
        assert rel(trace[f"decoder.layers.{i}.self_attn.weights"], w) <= 1e-5, (family, i)
    want = ref.generate(x, max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)[0, T:].tolist()
    assert lm.generate(x, max_new_tokens=4, record=False).ids == want


# ---------------------------------------------------------------- capture points of the new mechanisms

NEW_POINTS = {  # family -> names its trace must have (besides the 2017 ones)
    "llama3": ["decoder.rope.angles"],
    "mistral": ["masks.sliding"],
    "qwen3": ["decoder.layers.0.self_attn.q_norm.in", "decoder.layers.0.self_attn.k_norm.out"],
    "gemma2": ["masks.sliding", "decoder.layers.0.self_attn.scores_capped", "logits_uncapped",
               "decoder.layers.0.norm_post_attn.out", "decoder.layers.0.norm_post_ffn.in"],
    "gemma3": ["decoder.rope.angles_local", "decoder.layers.1.self_attn.q_norm.out", "masks.sliding"],
    "olmo2": ["decoder.layers.0.self_attn.q_norm.in", "decoder.layers.1.norm_post_ffn.out"],
    "qwen2_moe": ["decoder.layers.0.ffn.router.logits", "decoder.layers.0.ffn.router.probs",
                  "decoder.layers.0.ffn.router.topk_ids", "decoder.layers.0.ffn.router.topk_weights",
                  "decoder.layers.0.ffn.experts.3.out", "decoder.layers.0.ffn.shared_expert.out",
                  "decoder.layers.0.ffn.shared_gate"],
    "mixtral": ["decoder.layers.1.ffn.experts.0.out"],
}


@pytest.mark.parametrize("family", list(FAMILIES))
@torch.no_grad()
def test_capture_names_are_what_a_forward_records_and_capture_changes_nothing(family, loaded):
    lm = loaded(family)
    x = ids(seed=1)
    logits, trace = lm.run_with_trace(x)
    shapes = lm.model.capture_names(*x.shape)
    assert trace.names() == list(shapes)  # derived from the module tree, in computation order
    assert all(tuple(trace[n].shape) == s for n, s in shapes.items())
    assert set(NEW_POINTS.get(family, [])) <= set(shapes)
    assert torch.equal(logits, lm.model(x))  # bit-identical with and without capture
    assert "masks.sliding" not in shapes or FAMILIES[family][1].get("sliding_window")
    assert "decoder.layers.0.norm1.in" in shapes or family == "olmo2"  # OLMo 2 has no norm before sublayers


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gemma3", "gpt_neox", "olmo2", "llama3", "qwen2_moe"])
@torch.no_grad()
def test_weights_recompute_from_q_k_and_the_description(family, loaded):
    """The describe() contract the lazy traces rely on: weights = softmax(mask(softcap(q·kᵀ × scale))),
    the window in the mask, from the recorded (normed, rotated) q and k and the layer's entry alone."""
    from model.core.attention import attention_weights, causal_mask, softcap

    lm = loaded(family)
    _, trace = lm.run_with_trace(ids(seed=2), names=["*.self_attn.q", "*.self_attn.k", "*.self_attn.weights"])
    for name, a in trace.meta["model"]["attention"].items():
        q, k = trace[f"{name}.q"], trace[f"{name}.k"]
        k = k.repeat_interleave(a["n_heads"] // a["n_kv_heads"], dim=1)
        s = (q @ k.transpose(-2, -1)) * a["scale"]
        if a["softcap"] is not None:
            s = softcap(s, a["softcap"])
        mask = causal_mask(T, window=a["window"])[None, None]
        torch.testing.assert_close(attention_weights(s, mask), trace[f"{name}.weights"], atol=1e-6, rtol=0)


@torch.no_grad()
def test_sliding_window_masks_block_keys_window_or_more_back_on_sliding_layers_only(loaded):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    window = (j > i) | (i - j >= W)
    for family, sliding in (("mistral", [0, 1]), ("gemma2", [0]), ("gemma3", [0])):
        _, trace = loaded(family).run_with_trace(ids(), names="*.mask")
        for layer in range(2):
            m = trace[f"decoder.layers.{layer}.self_attn.mask"][0, 0]
            assert torch.equal(m, window if layer in sliding else j > i), (family, layer)
        d = trace.meta["model"]["attention"]
        assert [d[f"decoder.layers.{n}.self_attn"]["window"] for n in range(2)] == [
            W if n in sliding else None for n in range(2)]


def test_the_description_says_each_layers_mechanisms(loaded):
    g2 = loaded("gemma2").model.describe()
    a0, a1 = g2["attention"]["decoder.layers.0.self_attn"], g2["attention"]["decoder.layers.1.self_attn"]
    assert (a0["scale"], a0["softcap"], a0["window"], a0["layer_type"]) == (24 ** -0.5, 3.0, W, "sliding")
    assert (a1["window"], a1["layer_type"]) == (None, "full")
    assert g2["blocks"].items() >= {"norm_position": "sandwich", "post_norms": True, "final_softcap": 2.0,
                                    "embed_scale": 8.0, "parallel_residual": False, "moe": None}.items()  # 8 = √64
    g3 = loaded("gemma3").model.describe()["attention"]
    assert g3["decoder.layers.0.self_attn"]["rope"] == {"base": 1e4, "scaling": "default", "rotary_dim": 16,
                                                         "angles": "decoder.rope.angles_local"}
    assert g3["decoder.layers.1.self_attn"]["rope"] == {"base": 1e6, "scaling": "linear", "factor": 4.0,
                                                         "rotary_dim": 16, "angles": "decoder.rope.angles"}
    assert g3["decoder.layers.0.self_attn"]["qk_norm"] is True
    l3 = loaded("llama3").model.describe()["attention"]["decoder.layers.0.self_attn"]["rope"]
    assert l3 == {"base": 50.0, "scaling": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_len": 16, "rotary_dim": 16, "angles": "decoder.rope.angles"}
    neox = loaded("gpt_neox").model.describe()
    assert neox["blocks"]["parallel_residual"] and neox["attention"]["decoder.layers.0.self_attn"]["rope"][
        "rotary_dim"] == 8
    assert loaded("olmo2").model.describe()["blocks"]["norm_position"] == "post"
    assert loaded("olmo2").model.describe()["attention"]["decoder.layers.0.self_attn"]["qk_norm_over"] == "full"
    moe = loaded("qwen2_moe").model.describe()["blocks"]["moe"]
    assert moe == {"n_experts": 4, "top_k": 2, "d_ff": 32, "norm_topk": False, "shared": True, "shared_d_ff": 48,
                   "shared_gate": True, "layers": [0, 2]}
    assert json.loads(json.dumps(loaded("gemma3").model.describe())) == loaded("gemma3").model.describe()


# ---------------------------------------------------------------- hooks on the new points

@torch.no_grad()
def test_a_hook_that_zeroes_an_expert_removes_it_from_the_positions_routed_to_it(loaded):
    lm = loaded("qwen2_moe")
    x = ids(seed=3)
    base, trace = lm.run_with_trace(x, names=["decoder.layers.0.ffn.*"])
    chosen = trace["decoder.layers.0.ffn.router.topk_ids"][0]  # (T, k)
    probs = trace["decoder.layers.0.ffn.router.probs"]
    assert chosen.dtype == torch.int64 and probs.dtype == torch.float32
    assert torch.equal(chosen, probs[0].topk(2).indices)
    routed = (chosen == 1).any(-1)  # positions that chose expert 1
    e1 = trace["decoder.layers.0.ffn.experts.1.out"][0]
    assert routed.any() and (e1[~routed] == 0).all() and (e1[routed] != 0).any(dim=-1).all()
    w = trace["decoder.layers.0.ffn.router.topk_weights"][0]
    shared = trace["decoder.layers.0.ffn.shared_gate"] * trace["decoder.layers.0.ffn.shared_expert.out"]
    mix = sum(w[:, j, None] * trace[f"decoder.layers.0.ffn.experts.{e}.out"][0] * (chosen[:, j, None] == e)
              for j in range(2) for e in range(4))
    torch.testing.assert_close(trace["decoder.layers.0.ffn.out"][0], mix + shared[0], atol=1e-5, rtol=0)

    def zero(t, name):
        return torch.zeros_like(t)

    out, t2 = lm.run_with_trace(x, names="decoder.layers.0.ffn.out", hooks={"decoder.layers.0.ffn.experts.1.out": zero})
    assert not torch.equal(out, base)
    delta = (t2["decoder.layers.0.ffn.out"] - trace["decoder.layers.0.ffn.out"])[0]
    assert (delta[~routed] == 0).all() and (delta[routed] != 0).any(dim=-1).all()
    assert torch.equal(lm.run_with_hooks(x, hooks={"*.experts.*.out": lambda t, n: None}), base)


@torch.no_grad()
def test_hooks_on_qk_norm_and_the_capped_scores(loaded):
    x = ids(seed=4)

    def zero_head_1(t, name):  # q_norm.out is (B, H, T, hs) for a per-head norm
        t = t.clone()
        t[:, 1] = 0
        return t

    _, trace = loaded("qwen3").run_with_trace(x, names="decoder.layers.0.self_attn.weights",
                                              hooks={"decoder.layers.0.self_attn.q_norm.out": zero_head_1})
    w = trace["decoder.layers.0.self_attn.weights"][0, 1]  # a zero query scores 0 everywhere: uniform rows
    torch.testing.assert_close(w, torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None], atol=1e-6, rtol=0)

    lm = loaded("gemma2")
    _, trace = lm.run_with_trace(x, names=["*.scores", "*.scores_capped", "logits*"])
    s, c = trace["decoder.layers.0.self_attn.scores"], trace["decoder.layers.0.self_attn.scores_capped"]
    assert s.abs().max() > 3.0 > c.abs().max()  # the cap bites
    torch.testing.assert_close(c, torch.tanh(s / 3.0) * 3.0)
    assert trace["logits"].abs().max() < 2.0 < trace["logits_uncapped"].abs().max()
    doubled = lm.run_with_hooks(x, hooks={"decoder.layers.0.self_attn.scores_capped": lambda t, n: t * 2})
    assert not torch.equal(doubled, trace["logits"])


# ---------------------------------------------------------------- precision and device

@pytest.mark.parametrize("family", ["llama3", "gemma2", "qwen3", "olmo2"])
@torch.no_grad()
def test_bfloat16_on_the_cpu_matches_transformers_bfloat16(family, saved):
    ref, d = saved(family)
    ref16 = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, attn_implementation="eager")
    lm = load_hf_dir(d, dtype="bfloat16")
    assert next(lm.model.parameters()).dtype == torch.bfloat16
    x = ids(seed=5)
    logits, trace = lm.run_with_trace(x, names=["*.weights", "logits"])
    out = ref16(x, output_attentions=True)
    assert logits.dtype == torch.bfloat16 and (trace.meta["dtype"], trace.meta["device"]) == ("bfloat16", "cpu")
    assert trace["decoder.layers.0.self_attn.weights"].dtype == torch.bfloat16  # captured as computed
    assert rel(logits, out.logits) <= 2 ** -7  # bfloat16 keeps 8 significant bits (on this CPU: 0, the same bits)
    for i, w in enumerate(out.attentions):
        assert rel(trace[f"decoder.layers.{i}.self_attn.weights"], w) <= 2 ** -7
    assert rel(logits, ref(x).logits) <= 0.1  # and near float32


def test_float16_that_an_operation_lacks_is_refused_with_a_sentence(saved, monkeypatch):
    from model.families.lm import DecoderLM

    def lacks(self, *a, **k):
        raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'')

    monkeypatch.setattr(DecoderLM, "forward", lacks)
    with pytest.raises(ModelLoadError, match="float16 does not run on this cpu.*bfloat16"):
        load_hf_dir(saved("qwen3")[1], dtype="float16")


def test_dtype_and_device_words(saved):
    d = saved("qwen3")[1]
    with pytest.raises(ModelLoadError, match="dtype must be one of float32, bfloat16, float16"):
        load_hf_dir(d, dtype="int8")
    with pytest.raises(ModelLoadError, match="device must be 'cpu', 'cuda' or 'mps'"):
        load_hf_dir(d, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA GPU"):
            load_model(d, device="cuda")
    clear_cache()
    a, b = load_model(d), load_model(d, dtype="bfloat16")
    assert a is load_model(d, dtype="float32", device="cpu") and a is not b  # cached per dtype
    clear_cache()


@pytest.mark.may_skip(reason="needs a CUDA GPU; the refusal on a machine without one is tested above")
@torch.no_grad()
def test_on_a_gpu_the_model_matches_the_cpu(saved):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    for family in ("gemma3", "qwen2_moe"):
        d = saved(family)[1]
        cpu, gpu = load_hf_dir(d), load_hf_dir(d, device="cuda")
        assert next(gpu.model.parameters()).is_cuda
        x = ids(seed=6)
        logits, trace = gpu.run_with_trace(x, names=["*.weights", "logits"])
        assert trace["decoder.layers.0.self_attn.weights"].device.type == "cpu"  # traces live on the CPU
        assert rel(logits.cpu(), cpu.run_with_trace(x, names="logits")[0]) <= 1e-4
        assert gpu.generate(x, max_new_tokens=3).ids == cpu.generate(x, max_new_tokens=3).ids
        b16 = load_hf_dir(d, dtype="bfloat16", device="cuda")
        assert rel(b16.model(x).float().cpu(), cpu.model(x)) <= 0.1


# ---------------------------------------------------------------- directories a user may bring wrong

def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_an_unsupported_architecture_is_refused_listing_the_supported_ones(tmp_path):
    # a causal attention LM of another type opens through transformers (tests/test_adapter.py); a state-space one not
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}))
    with pytest.raises(ModelLoadError) as e:
        load_hf_dir(tmp_path)
    assert "'mamba' is not supported" in str(e.value) and all(t in str(e.value) for t in LM_TYPES)


def test_config_sizes_that_do_not_match_the_weights_are_refused(saved, tmp_path):
    d = _copy(saved("gemma2")[1], tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg | {"intermediate_size": 128}))
    with pytest.raises(ModelLoadError, match="config.json and the weights do not match"):
        load_hf_dir(d)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    d = tmp_path_factory.mktemp("sharded")
    build("qwen3").save_pretrained(d, max_shard_size="60KB")
    assert len(list(d.glob("*.safetensors"))) > 2 and (d / "model.safetensors.index.json").is_file()
    return d


@torch.no_grad()
def test_a_sharded_directory_loads_and_a_missing_shard_is_named(sharded, saved, tmp_path):
    lm = load_hf_dir(sharded)
    assert torch.equal(lm.model(ids()), load_hf_dir(saved("qwen3")[1]).model(ids()))  # same seed, same model
    d = _copy(sharded, tmp_path / "m")
    gone = sorted(d.glob("*.safetensors"))[1]
    gone.unlink()
    with pytest.raises(ModelLoadError, match=f"1 of the .* weight shards .* are missing: {gone.name}"):
        load_hf_dir(d)


def test_a_shard_index_naming_files_outside_the_directory_is_refused(sharded, tmp_path):
    for outside in ("../secret.safetensors", "/etc/passwd", "sub/../../x.safetensors"):
        d = _copy(sharded, tmp_path / f"m{abs(hash(outside))}")
        index = json.loads((d / "model.safetensors.index.json").read_text())
        first = next(iter(index["weight_map"]))
        index["weight_map"][first] = outside
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
        with pytest.raises(ModelLoadError, match="names a shard outside the model directory"):
            load_hf_dir(d)


@pytest.mark.parametrize("change, words", [
    # YaRN is computed since gpt-oss (issue 32); dynamic NTK scaling is not
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4}}, "RoPE scaling 'dynamic'"),
    ({"layer_types": ["sliding_attention"]}, "layer_types must list"),
])
def test_configs_we_do_not_compute_exactly_are_refused(saved, tmp_path, change, words):
    d = _copy(saved("gemma2")[1], tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg | change))
    with pytest.raises(ModelLoadError, match=words):
        load_hf_dir(d)


def test_a_model_that_will_not_fit_is_refused_in_its_own_dtype_before_allocating(monkeypatch):
    from model.loaders import hf

    cfg = hf.config_from_hf(FAMILIES["qwen3"][1] | COMMON | {"model_type": "qwen3"})
    n = cfg.num_parameters()
    monkeypatch.setattr(hf, "available_bytes", lambda: 3 * n)  # room for bfloat16 (2 n), not float32 (4 n)
    hf.check_fits(cfg, torch.bfloat16)
    with pytest.raises(ModelLoadError, match=f"{n:,} parameters .* in float32.*Refused before loading"):
        hf.check_fits(cfg, torch.float32)
    raw = FAMILIES["qwen3"][1] | COMMON | {"model_type": "qwen3"}
    assert hf.config_from_hf(raw, "bfloat16") == cfg  # a directory loaded in bfloat16 is checked in bfloat16
    with pytest.raises(ModelLoadError, match="in float32"):
        hf.config_from_hf(raw)


def test_a_trace_of_a_new_family_saves_and_loads_with_its_config(loaded, tmp_path):
    from model.core.trace import Trace
    from model.families.lm import LMConfig

    lm = loaded("gemma3")
    _, trace = lm.run_with_trace(ids(), names=["*.q_norm.out", "masks.sliding", "decoder.rope.angles_local"])
    trace.save(tmp_path / "t.safetensors")
    back = Trace.load(tmp_path / "t.safetensors")
    assert back.names() == trace.names() and all(torch.equal(back[n], trace[n]) for n in trace.names())
    assert LMConfig.from_dict(back.meta["config"]) == lm.model.cfg  # layer_types: a JSON list back to a tuple


def test_the_server_command_line_loads_its_models_in_bfloat16(saved):
    from viz.ui import lm_models

    argv = ["--model", str(saved("gemma3")[1]), "--dtype", "bfloat16", "--port", "1"]
    assert lm_models.parse_precision_args(argv) == {"dtype": "bfloat16"}
    assert lm_models.parse_precision_args(["--dtype=float16", "--device=cpu"]) == {"dtype": "float16", "device": "cpu"}
    (label,) = lm_models.add_server_models(lm_models.parse_model_args(argv), lm_models.parse_precision_args(argv))
    try:
        real = lm_models.load(label)
        assert next(real.obj.model.parameters()).dtype == torch.bfloat16
        lm_models.add_server_models(lm_models.parse_model_args(argv), {"dtype": "int3"})
        with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16"):
            lm_models.load(label)
    finally:  # the server's model list is process-wide: leave it as found
        lm_models._SERVER.pop(label, None)
        lm_models._PRECISION.pop(label, None)
        clear_cache()
