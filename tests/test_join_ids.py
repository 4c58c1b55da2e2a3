"""One way to join text into ids (issue 38 §1): every prompt builder in the project goes through
LanguageModel.encode_pieces / lm.encode, which encode pieces without special tokens and apply the model's own BOS
rule once, at the start. Each builder runs on a tokenizer that adds BOS (Gemma 3 270M: `<bos>` first) and on one
that does not (SmolLM2); no special token (bos/eos/pad, or any of the tokenizer's added special tokens) sits past
position 0 unless a chat template wrote it there, and position 0 is BOS exactly when the model's rule says so
(Olsson et al.'s induction sequence is [BOS] + tokens by its definition, on every model)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from model import load_model
from model.analysis import flow as FL
from model.analysis import ioi as IOI
from model.analysis import long as LG
from model.analysis import phenomena as PH
from model.analysis import shared
from model.analysis.inputs import as_ids
from model.loaders.card import bos_rule
from model.loaders.lm import encode_pieces

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", params=["gemma3", "smollm2"])
def lm(request):
    return load_model(request.param)


_SPECIALS: dict[int, set[int]] = {}


def specials(lm) -> set[int]:
    """Every special id, read from the tokenizer and the config (not from the code under test); once per model."""
    if id(lm) in _SPECIALS:
        return _SPECIALS[id(lm)]
    tok, cfg = lm.tokenizer, lm.model.cfg
    out = {int(i) for i, a in tok.get_added_tokens_decoder().items() if a.special}
    out |= {tok.token_to_id(t) for t in lm.special_tokens.values() if t and tok.token_to_id(t) is not None}
    out |= {i for i in (cfg.bos_id, cfg.eos_id, cfg.pad_id) if i is not None}
    return _SPECIALS.setdefault(id(lm), out)


def bos_id(lm) -> int:
    return lm.tokenizer.token_to_id(lm.special_tokens["bos_token"])


def assert_one_bos(lm, ids, what: str, bos: bool | None = None) -> None:
    """No special token past position 0; position 0 is BOS exactly when the rule (or the recipe: `bos`) says so."""
    ids, special = torch.as_tensor(ids).reshape(-1).tolist(), specials(lm)
    inside = [(p, lm.tokens([i])[0]) for p, i in enumerate(ids) if p > 0 and i in special]
    assert not inside, f"{lm.name} {what}: special tokens inside the prompt at {inside[:5]}"
    want = bos_rule(lm).prepended if bos is None else bos
    assert (ids[0] == bos_id(lm)) == want, f"{lm.name} {what}: token 0 is {lm.tokens([ids[0]])}"


def test_the_rule_is_each_models_own(lm):
    gemma = lm.name.lower().startswith("gemma")
    assert bos_rule(lm).prepended is gemma  # Gemma 3's file: add_bos_token true; SmolLM2's: false
    assert lm.bos_prefix() == ([2] if gemma else [])


def test_encode_pieces_joins_bare_pieces_behind_one_bos(lm):
    pieces = ["There is a key.", [1000, 1001, 1002], " What is it?", " It is"]
    ids, spans = lm.encode_pieces(pieces)
    assert_one_bos(lm, ids, "encode_pieces")
    flat = ids[0].tolist()
    for p, (a, b) in zip(pieces, spans, strict=True):
        want = p if isinstance(p, list) else lm.tokenizer.encode(p, add_special_tokens=False).ids
        assert flat[a:b] == want  # each piece where its span says, exactly its own bare ids
    assert spans[0][0] == len(lm.bos_prefix()) and spans[-1][1] == len(flat)
    # one piece is lm.encode; an answer appended after a prompt carries no BOS; the recipe's BOS is forced
    assert lm.encode_pieces(["The capital of France is"])[0].tolist() == lm.encode("The capital of France is").tolist()
    assert lm.encode_pieces([" 71432"], bos=False)[0][0].tolist() == \
        lm.tokenizer.encode(" 71432", add_special_tokens=False).ids
    assert lm.encode_pieces([[5000]], bos=True)[0][0].tolist() == [bos_id(lm), 5000]
    assert encode_pieces(lm.model, [[7, 8], [9]])[0].tolist() == [[7, 8, 9]]  # a bare DecoderLM: ids only
    with pytest.raises(ValueError, match="text needs a LanguageModel"):
        encode_pieces(lm.model, ["text"])
    with pytest.raises(TypeError, match="not one string"):
        lm.encode_pieces("one string")


def test_encode_and_its_cut_keep_the_one_bos(lm):
    text = "The cat sat on the mat. The dog ran in the park."
    assert_one_bos(lm, lm.encode(text), "encode")
    cut = lm.encode(text, keep_last=5)
    assert cut.shape[1] == 5
    assert_one_bos(lm, cut, "encode(keep_last=5)")  # a cut keeps the model's BOS first
    assert cut[0, -4:].tolist() == lm.encode(text)[0, -4:].tolist()


def test_a_chat_template_keeps_its_own_specials(lm):
    if not lm.chat_template:  # Gemma 3 270M (the base model) has none: said, not guessed
        with pytest.raises(ValueError, match="has no chat template"):
            lm.encode("Hello there", chat=True)
        return
    ids = lm.encode("Hello there", chat=True)[0].tolist()
    rendered = lm.tokenizer.encode(lm.render_chat("Hello there"), add_special_tokens=False).ids
    assert ids == rendered  # nothing added beyond what the template wrote
    if bos_rule(lm).prepended:
        assert ids[0] == bos_id(lm) and ids.count(bos_id(lm)) == 1  # the template's one <bos>, first


@pytest.mark.parametrize("length,depth", [(256, 0.0), (256, 0.5), (512, 1.0), (2000, 0.1)])
def test_needle_prompts_hold_one_bos_and_a_bare_answer(lm, length, depth):
    p = LG.needle_prompt(lm, length, depth)
    assert p.length == length == p.ids.shape[1]
    assert_one_bos(lm, p.ids, f"needle_prompt({length}, {depth})")
    assert not set(p.answer) & specials(lm)  # the answer: " 71432" as bare tokens
    assert lm.decode(p.answer).strip() == "71432" and len(p.answer) == 6
    s0, s1 = p.needle
    assert lm.decode(p.ids[0, s0:s1]).strip() == "The pass key is 71432. Remember it. 71432 is the pass key."
    tf = LG.teacher_forced_ids(lm, p)  # what needle_trial runs: the prompt and the answer but its last token
    assert_one_bos(lm, tf, "needle_trial's ids")
    assert tf[0].tolist() == p.ids[0].tolist() + p.answer[:-1]


def test_the_horizon_and_the_needle_page_build_their_prompts_here(lm):
    """Lesson 18's horizon and /phenomena's grid read needle_prompt: the same ids as above, at their lengths."""
    for n in shared.needle_lengths(lm):
        for d in shared.NEEDLE_DEPTHS:
            assert_one_bos(lm, LG.needle_prompt(lm, n, d, shared.NEEDLE_KEY).ids, f"needle grid {n}/{d}")
    for d in shared.NEEDLE_ABLATE_DEPTHS:
        assert_one_bos(lm, LG.needle_prompt(lm, 256, d, shared.NEEDLE_ABLATE_KEY).ids, f"needle ablation {d}")


def test_ioi_prompts_and_patching_pairs(lm):
    for p in IOI.ioi_prompts(lm, 12):
        clean, corrupt = as_ids(lm, p.text), as_ids(lm, p.corrupted)
        assert_one_bos(lm, clean, "IOI clean")
        assert_one_bos(lm, corrupt, "IOI corrupted")
        assert clean.shape == corrupt.shape  # patching copies position by position
        assert p.io_id not in specials(lm) and p.s_id not in specials(lm)


def test_induction_sequences_are_bos_then_tokens_twice(lm):
    ids = PH.induction_sequence(lm, n=50, batch=4, seed=0)
    assert ids.shape == (4, 101)
    for row in ids:
        assert_one_bos(lm, row, "induction_sequence", bos=True)  # Olsson et al.'s [BOS] + n + n, on every model
        assert row[1:51].tolist() == row[51:].tolist()


def test_flow_prompt_sets(lm):
    for p in FL.induction_set(lm, 10):
        ids = p.text_or_ids[0].tolist()
        assert_one_bos(lm, ids, "flow.induction_set")
        body = ids[len(lm.bos_prefix()):]
        assert body[:9] == body[10:] and body[9] == p.target  # seq + seq[:-1], the target its last token
    for p in [*FL.ioi_set(lm, 12), FL.Prompt(FL.ANIMAL)]:
        assert_one_bos(lm, as_ids(lm, p.text_or_ids), "flow prompt set")


def test_qk_batch_rows(lm):
    from viz.ui import qk_batch as QB

    for kind, bos in (("sentences", None), ("repeat", True)):
        rows, labels, _ = QB.lm_rows(lm, kind)
        assert len(rows) == len(labels)
        for r in rows:
            assert_one_bos(lm, r, f"Q/K batch {kind}", bos=bos)
    assert_one_bos(lm, QB.lm_rows(lm, "prompt", "Hello world")[0][0], "Q/K batch prompt")


def test_lesson_texts_and_the_repeated_prompt(lm):
    from viz import lessons as LS

    texts = [x.text for x in LS.LESSONS if x.source == "lm" and x.text]
    texts += [LS.IOI_TEXT, LS.LENS_TEXT, FL.ANIMAL]
    # "Use a prompt that repeats itself" (viz/pages/llm.py REPEATED: a page module, read without running it)
    tree = ast.parse((ROOT / "viz/pages/llm.py").read_text())
    repeated = next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", None) == "REPEATED" for t in n.targets))
    texts += list(repeated.values()) if isinstance(repeated, dict) else [repeated]
    assert len(texts) >= 4
    for text in texts:
        assert_one_bos(lm, as_ids(lm, text), f"lesson text {text[:30]!r}")
