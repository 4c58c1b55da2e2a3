"""The Q/K map (/qk): the map's numbers against the trace and plain loops, then the page in AppTest (a toy model,
MiniLM, SmolLM2; en and zh), its link parameters and bad link values.

Figure tests: the normalisation leaves every softmax row as the trace has it; the drawn points are the joint PCA
of the normalised queries and keys; the keys a clicked query highlights are the argmax-5 of the trace's weights
row (a trace run here, independent of the page's batch); clarity and the pattern share equal plain loops.
"""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import pytest
import torch
from conftest import APP
from streamlit.testing.v1 import AppTest
from test_i18n import english_in_zh

from model.analysis.qk import normalise
from model.toy.checkpoint import load_checkpoint
from viz.figures import qk as FQ
from viz.ui import lm_models
from viz.ui import qk_batch as QB

PAGE = "viz/pages/qk.py"
LM_TIMEOUT = 1800  # SmolLM2's batch (40 sentences, 30 layers) and its 270 heads' clarity, on a shared 2-core CPU


@pytest.fixture(scope="module")
def toy():
    ckpt = load_checkpoint("dates")
    return ckpt, QB.toy_batch(ckpt)


@pytest.fixture(scope="module")
def smol():
    from model import load_model

    lm = load_model("smollm2")
    return lm, QB.lm_batch(lm, "sentences", readable=lm_models.readable)


def _softmax(s: np.ndarray, blocked: np.ndarray) -> np.ndarray:
    s = np.where(blocked, -np.inf, s)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("kind", ["encoder_self", "decoder_self", "cross"])
def test_normalisation_keeps_every_softmax_row(toy, kind):
    _, batch = toy
    module = batch.modules(kind)[1]
    for head in range(batch.desc["attention"][module]["n_heads"]):
        qs = [a[f"{module}.q"][head].astype(np.float64) for a in batch.arrays]
        ks = [a[f"{module}.k"][head].astype(np.float64) for a in batch.arrays]
        qn, kn, a, c = normalise(np.concatenate(qs), np.concatenate(ks))
        assert a > 0 and not np.allclose(c, 0)  # the map really moved and scaled them
        qo = np.cumsum([0] + [len(q) for q in qs])
        ko = np.cumsum([0] + [len(k) for k in ks])
        for s, arrays in enumerate(batch.arrays[:10]):
            q, k = qn[qo[s]:qo[s + 1]], kn[ko[s]:ko[s + 1]]
            n_q, n_k = len(q), len(k)
            blocked = np.triu(np.ones((n_q, n_k), bool), 1) if kind == "decoder_self" else np.zeros((n_q, n_k), bool)
            w = _softmax(q @ k.T / math.sqrt(q.shape[1]), blocked)
            np.testing.assert_allclose(w, arrays[f"{module}.weights"][head], atol=2e-5)


def test_drawn_points_are_the_joint_pca_of_the_normalised_points(toy):
    _, batch = toy
    module = batch.modules("cross")[0]
    m = FQ.qk_map(batch, module, 2)
    fig = FQ.qk_figure(m, batch.labels, "kind")
    qs = np.concatenate([a[f"{module}.q"][2] for a in batch.arrays]).astype(np.float64)
    ks = np.concatenate([a[f"{module}.k"][2] for a in batch.arrays]).astype(np.float64)
    qn, kn, _, _ = normalise(qs, ks)
    x = np.concatenate([qn, kn])
    x -= x.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    expect = x @ vt[:2].T
    sign = np.sign((expect * m.xy).sum(0))  # PCA axes are defined up to their sign
    np.testing.assert_allclose(m.xy, expect * sign, atol=1e-8)
    drawn = {tr.name: tr for tr in fig.data}
    assert set(drawn) == {"queries", "keys"}
    for tr in fig.data:
        idx = np.asarray(tr.customdata)[:, 0].astype(int)
        np.testing.assert_allclose(np.c_[tr.x, tr.y], m.xy[idx])
        assert set(m.kind[idx]) == {"query" if tr.name == "queries" else "key"}
    assert len(drawn["queries"].x) == sum(a[f"{module}.q"].shape[1] for a in batch.arrays)


@pytest.mark.parametrize("kind,sentence,position", [("decoder_self", 7, 9), ("cross", 3, 5), ("encoder_self", 12, 4)])
def test_highlighted_keys_are_the_argmax5_of_the_traces_weights_row(toy, kind, sentence, position):
    ckpt, batch = toy
    module = batch.modules(kind)[1]
    head = 3
    m = FQ.qk_map(batch, module, head)
    q = m.index("query", sentence, position)
    fig = FQ.qk_figure(m, batch.labels, "position", selected=q)
    top = next(tr for tr in fig.data if tr.name == "_top_keys")
    keys = np.asarray(top.customdata)[:, 0].astype(int)
    assert set(m.kind[keys]) == {"key"} and set(m.sentence[keys]) == {sentence}
    # An independent trace of that input: the row of the head's weights, argmax-5 over the keys it can see.
    src, tgt = batch.labels[sentence].split(" → ")
    _, trace = ckpt.trace(src, target=tgt)
    row = trace[f"{module}.weights"][0, head, position].double().numpy()
    seen = row[:position + 1] if kind == "decoder_self" else row
    expect = np.argsort(-seen, kind="stable")[:5]
    assert [int(m.position[i]) for i in keys] == expect.tolist()
    np.testing.assert_allclose([float(s) for s in top.text], np.round(seen[expect], 2), atol=0.006)
    np.testing.assert_allclose(np.c_[top.x, top.y], m.xy[keys])


def _plain_clarity(m: FQ.QKMap, k: int = 5) -> tuple[float, float]:
    hits, chance = [], []
    for s, w in enumerate(m.weights):
        for p in range(w.shape[0]):
            vis = list(range(p + 1)) if m.causal else list(range(w.shape[1]))
            if len(vis) <= k:
                continue
            qxy = m.xy[m.index("query", s, p)]
            d = [float(((m.xy[m.index("key", s, j)] - qxy) ** 2).sum()) for j in vis]
            near = {vis[i] for i in np.argsort(d, kind="stable")[:k]}
            true = {vis[i] for i in np.argsort(-w[p, vis], kind="stable")[:k]}
            hits.append(len(near & true) / k)
            chance.append(k / len(vis))
    return float(np.mean(hits)), float(np.mean(chance))


def _plain_share(m: FQ.QKMap, offset: int, first: int) -> tuple[float, int]:
    hits = []
    for s, w in enumerate(m.weights):
        for p in range(first, w.shape[0]):
            j = p - offset
            vis = list(range(p + 1)) if m.causal else list(range(w.shape[1]))
            if j not in vis:
                continue
            qxy = m.xy[m.index("query", s, p)]
            d = [float(((m.xy[m.index("key", s, i)] - qxy) ** 2).sum()) for i in vis]
            hits.append(vis[int(np.argmin(d))] == j)
    return float(np.mean(hits)), len(hits)


@pytest.mark.parametrize("kind", ["encoder_self", "decoder_self", "cross"])
def test_clarity_and_pattern_share_equal_plain_loops(toy, kind):
    _, batch = toy
    m = FQ.qk_map(batch, batch.modules(kind)[0], 1)
    assert m.clarity() == pytest.approx(_plain_clarity(m), abs=1e-12)
    share, _, n = m.pattern_share(lambda p: p - 1, 1)
    assert (share, n) == pytest.approx(_plain_share(m, 1, 1), abs=1e-12)
    rows, chance = FQ.clarity_table(batch, kind)
    assert len(rows) == len(batch.modules(kind)) * 4 and [r[3] for r in rows] == sorted((r[3] for r in rows),
                                                                                       reverse=True)
    layer, head = rows[0][1], rows[0][2]
    assert FQ.qk_map(batch, batch.modules(kind)[layer], head).clarity()[0] == rows[0][3]


def test_a_bad_head_or_module_is_refused_with_its_range(toy):
    _, batch = toy
    with pytest.raises(ValueError, match=r"has 4 heads \(0..3\)"):
        FQ.qk_map(batch, batch.modules("cross")[0], 4)
    with pytest.raises(ValueError, match="no attention module"):
        FQ.qk_map(batch, "decoder.layers.9.cross_attn", 0)


# ---------------------------------------------------------------- SmolLM2 (slow, never skipped)


@pytest.mark.slow
def test_smollm2_batch_gqa_keys_and_right_padding_are_exact(smol):
    """The batched, right-padded pass gives each sentence the rows of its own pass; a query head reads the keys
    of K/V head h // 3."""
    lm, batch = smol
    module = "decoder.layers.16.self_attn"
    s = 5
    ids = lm.encode(QB.SENTENCES[s])
    _, tr = lm.run_with_trace(ids, names=[f"{module}.{r}" for r in ("q", "k", "weights")])
    np.testing.assert_allclose(batch.arrays[s][f"{module}.weights"], tr[f"{module}.weights"][0].numpy(), atol=2e-5)
    for head in (0, 4, 8):
        m = FQ.qk_map(batch, module, head)
        assert m.kv_head == head // 3
        np.testing.assert_allclose(batch.arrays[s][f"{module}.k"][m.kv_head], tr[f"{module}.k"][0, head // 3].numpy(),
                                   atol=2e-4)
    assert batch.tokens[s]["tgt_tokens"] == lm_models.readable_tokens(lm.tokens(ids[0]))


# ---------------------------------------------------------------- the page (AppTest)


def decode(a) -> np.ndarray:
    """A plotly JSON array: a base64 typed array ({dtype, bdata, shape}) or nested lists."""
    if isinstance(a, dict):
        x = np.frombuffer(base64.b64decode(a["bdata"]), dtype=np.dtype(a["dtype"]))
        return x.reshape([int(s) for s in str(a.get("shape", x.size)).split(",")])
    return np.asarray(a)


def open_page(page: str, query: dict, timeout: float = 300) -> AppTest:
    """The page opened from a link: one run (a second run would re-format the sidebar's model list outside the
    session, in English, and AppTest could not find a zh label)."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    at.query_params.update({k: str(v) for k, v in query.items()})
    at.switch_page(page)
    at.run()
    return at


def _figs(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _ok(at):
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_page_on_a_toy_model_with_a_link_reopens_the_picked_query(toy, lang):
    _, batch = toy
    at = open_page(PAGE, query={"checkpoint": "dates", "lang": lang, "qk_kind": "cross", "layer": 1, "head": 2,
                                "color": "token", "query": "3.5"})
    _ok(at)
    assert at.session_state["qk_kind"] == "cross" and at.session_state["qk_layer"] == 1
    assert at.session_state["qk_head"] == 2 and at.session_state["qk_color"] == "token"
    assert at.query_params["query"] == "3.5"
    qk = _figs(at)[0]
    assert qk["layout"]["title"]["text"].startswith(  # the module in words (viz.figures.attention.module_title)
        {"en": "decoder layer 1 · cross-attention · ", "zh": "解码器第 1 层 · 交叉注意力 · "}[lang])
    top = next(d for d in qk["data"] if d.get("name") == "_top_keys")
    m = FQ.qk_map(batch, "decoder.layers.1.cross_attn", 2)
    keys = decode(top["customdata"])[:, 0].astype(int).tolist()
    assert keys == [i for i, _ in m.top_keys(m.index("query", 3, 5))]
    table = at.dataframe[0].value
    assert len(table) == 5
    if lang == "zh":
        assert at.title[0].value == "Q/K 图"
        assert any("输入 3 中的查询" in md.value for md in at.markdown)
        assert not english_in_zh(at)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_page_on_minilm_draws_its_encoder_heads(lang):
    at = open_page(PAGE, query={"checkpoint": "minilm", "lang": lang, "layer": 2, "head": 5}, timeout=900)
    _ok(at)
    assert at.session_state["qk_kind"] == "enc"
    figs = _figs(at)
    assert figs[0]["layout"]["title"]["text"].startswith({"en": "layer 2 · self-attention · ",
                                                           "zh": "第 2 层 · 自注意力 · "}[lang])  # one stack
    assert len(figs) == 2  # the map and the clarity grid
    if lang == "zh":
        assert not english_in_zh(at)


def test_bad_link_values_are_replaced_and_said():
    at = open_page(PAGE, query={"checkpoint": "dates", "layer": "999", "head": "abc", "color": "nope",
                                "query": "../../etc", "qk_kind": "x"})
    _ok(at)
    notes = " ".join(w.value for w in at.warning)
    assert "layer=999" in notes and "head=abc" in notes and "color=nope" in notes and "query=../../etc" in notes
    assert at.session_state["qk_layer"] == 0 and at.session_state["qk_query"] is None


@pytest.mark.slow
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_page_on_smollm2_shows_a_previous_token_head_only_if_its_map_shows_it(smol, lang):
    lm, batch = smol
    at = open_page(PAGE, query={"checkpoint": "smollm2", "lang": lang, "layer": 16, "head": 0}, timeout=LM_TIMEOUT)
    _ok(at)
    mods = batch.modules("decoder_self")
    scores = QB.previous_token_scores(batch, mods)
    li, h = divmod(int(np.argmax(scores)), scores.shape[1])
    share, chance, n = FQ.qk_map(batch, mods[li], h).pattern_share(lambda p: p - 1, 1)
    text = " ".join(md.value for md in at.markdown)
    shows = share >= 0.5 and share >= 3 * chance
    if lang == "en":
        assert f"layer {li} head {h}" in text
        assert ("Its map shows the structure" in text) == shows
        assert ("does not show the structure" in text) == (not shows)
        assert f"{share:.0%} of its {n} queries" in text
    else:
        assert ("它的图显示出了这种结构" in text) == shows
        assert not english_in_zh(at)
    assert at.session_state["qk_batch"] == "sentences"


@pytest.mark.slow
def test_page_on_smollm2_repeated_random_tokens_names_the_induction_head(smol):
    lm, _ = smol
    at = open_page(PAGE, query={"checkpoint": "smollm2", "batch": "repeat", "layer": 18, "head": 6},
                   timeout=LM_TIMEOUT)
    _ok(at)
    rep = QB.lm_batch(lm, "repeat", readable=lm_models.readable)
    mods = rep.modules("decoder_self")
    scores = QB.induction_scores(rep, mods)
    li, h = divmod(int(np.argmax(scores)), scores.shape[1])
    text = " ".join(md.value for md in at.markdown)
    assert f"induction head on the repeated random tokens is layer {li} head {h}" in text
    n = rep.period
    share, chance, count = FQ.qk_map(rep, mods[li], h).pattern_share(lambda p: p - (n - 1), n + 1)
    assert f"{share:.0%} of its {count} queries" in text
    assert count == len(rep.arrays) * n  # every second-copy position has its pattern key
    assert torch.equal(torch.tensor(rep.arrays[0][f"{mods[0]}.q"].shape), torch.tensor([9, 2 * n + 1, 64]))


def test_page_on_a_gpt2_style_server_model(tmp_path):
    """No GQA, learned positions, byte-level BPE: every query head reads its own keys; tokens readable."""
    from conftest import tiny_hf_lm

    label = tiny_hf_lm(tmp_path, "gpt2")
    at = open_page(PAGE, query={"checkpoint": label, "layer": 1, "head": 3, "batch": "repeat"})
    _ok(at)
    qk = _figs(at)[0]
    assert qk["layout"]["title"]["text"].startswith("layer 1 · self-attention · head 3 · ")
    assert "K/V head" not in qk["layout"]["title"]["text"]
    assert any("induction head on the repeated random tokens" in md.value for md in at.markdown)
