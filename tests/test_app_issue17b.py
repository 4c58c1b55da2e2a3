"""Issue 17 (part B) in the running app (AppTest, en and zh): teacher-forced rows and the target's [UNK]s,
links that keep the Tokenizer playground's text and the padding batch, the decoder's [UNK] note and number
format, the one-query table's numbers, and input messages said once, in the UI language."""

from __future__ import annotations

import pytest
from conftest import assert_clean, figures, open_page, shown

from model.toy.checkpoint import load_checkpoint
from viz.figures import attention as F
from viz.figures import tokenizers as FT
from viz.ui.render import model_tokens
from viz.ui.text import MAX_SHOWN

TIMEOUT = 300
TEXT, TARGET = "3 november 2023", "2023-11-04"  # the example: the model predicts 3 where the reference has 4
ZH = {"model": "（模型：", "caption": "教师强制", "target": "目标"}


def run(page: str, lang: str = "en", query: dict | None = None, state: dict | None = None):
    return open_page(f"viz/pages/{page}.py", query={"lang": lang, **(query or {})}, state=state, timeout=TIMEOUT)


def captions(at) -> str:
    return "\n".join(c.value for c in at.caption)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_teacher_forced_rows_show_reference_and_model_prediction(lang):
    ckpt = load_checkpoint("dates")
    _, trace = ckpt.trace(TEXT, target=TARGET)
    own = model_tokens(ckpt, trace)
    reference = trace.meta["next_tokens"]
    differ = [i for i, (r, m) in enumerate(zip(reference, own, strict=True)) if r != m]
    assert differ
    at = run("attention", lang, {"checkpoint": "dates", "text": TEXT, "target": TARGET, "attn_kind": "cross"})
    assert_clean(at)
    head = figures(at)[0]
    rows = shown(head)["y"]
    bracket = "(model: " if lang == "en" else ZH["model"]
    assert [i for i, r in enumerate(rows) if bracket in r] == differ
    i = differ[0]
    assert rows[i].startswith(f"{i}: {trace.meta['tgt_tokens'][i]} → {reference[i]}") and own[i] in rows[i]
    assert head["layout"]["yaxis"]["tickvals"] == rows  # every row labelled
    text = captions(at)
    assert ("Teacher forcing: rows are labelled “position: input → reference”" in text if lang == "en"
            else ZH["caption"] in text)
    assert "the token it predicts from there" not in text


def test_model_output_rows_stay_input_to_predicted():
    at = run("attention", query={"checkpoint": "dates", "text": TEXT, "attn_kind": "cross"})
    assert_clean(at)
    assert not any("(model: " in r for r in shown(figures(at)[0])["y"])
    assert "“position: input → predicted”" in captions(at)


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("page", ["attention", "tokens", "decoder"])
def test_a_target_outside_the_vocabulary_is_warned(page, lang):
    at = run(page, lang, {"checkpoint": "dates", "text": TEXT, "target": "zzzzzzzz"})
    assert not at.exception
    warned = [w.value for w in at.warning if "[UNK]" in w.value]
    prefix = "Target: " if lang == "en" else ZH["target"]
    assert any(w.startswith(prefix) and "'z'" in w for w in warned), warned


def test_decoder_names_unknown_characters_and_prints_zero_as_zero():
    ckpt = load_checkpoint("zh-en")
    text = "量子力学很难"
    unknown = [p for p in ckpt.src_tokenizer.pieces(text) if p.is_unk]
    assert unknown
    at = run("decoder", query={"checkpoint": "zh-en", "text": text})
    assert not at.exception
    (warning,) = [w.value for w in at.warning if "[UNK]" in w.value]
    assert "[UNK]@" not in warning
    assert all(f"'{text[p.span[0]:p.span[1]]}'" in warning for p in unknown)
    table = at.dataframe[0].value
    cells = [str(v) for col in ("max |Δ logits|", "max |Δ self-attn|", "max |Δ cross-attn|") for v in table[col]]
    assert cells and all(c == "0" or "e" in c or "." in c for c in cells)
    assert not any(c.startswith("0.00e") for c in cells)  # exact zero reads 0
    assert all(c == F.num(float(c)) for c in cells)  # the figures' format


def test_one_query_table_prints_the_charts_numbers():
    ckpt = load_checkpoint("dates")
    _, trace = ckpt.trace(ckpt.example)
    w = trace["encoder.layers.0.self_attn.weights"][0]
    head, token, _ = ((w > 0) & (w < 1e-4)).nonzero()[0].tolist()  # a row with a tiny weight (p < 1e-4)
    at = run("layer", query={"stack": "encoder", "layer": "0", "sub": "self_attn", "token": token, "head": head})
    assert_clean(at)
    table = at.dataframe[-1].value
    chart = next(f for f in figures(at) if "one query" in f["layout"]["title"]["text"])
    bars = [d for d in chart["data"] if d["type"] == "bar"]
    assert list(table["p"]) == list(bars[3]["text"])  # the softmax panel's labels
    assert list(table["q·k"]) == list(bars[0]["text"])
    assert any("e-0" in p for p in table["p"])  # the tiny weight in e-notation, as on its bar


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_tokenizer_playground_text_is_in_the_link(lang):
    at = run("tokenizers", lang)
    at.text_input(key="tkp_text").set_value("eat eating drink drinking 吃").run()
    assert_clean(at)
    assert at.query_params["tkp_text"] in ("eat eating drink drinking 吃", ["eat eating drink drinking 吃"])
    again = run("tokenizers", lang, {"tkp_text": "eat eating drink drinking 吃"})
    assert_clean(again)
    assert again.text_input(key="tkp_text").value == "eat eating drink drinking 吃"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_long_playground_text_is_capped_in_the_strips_and_kept_out_of_the_link(lang):
    text = "eating " * 715  # 5,005 characters
    at = run("tokenizers", lang, state={"tkp_text": text})
    assert_clean(at)
    assert "tkp_text" not in at.query_params and "tkp_text_ref" in at.query_params  # this server's copy
    strips = next(f for f in figures(at) if f["data"][0]["type"] == "bar")
    assert all(len(bar["x"]) <= FT.MAX_DRAWN for bar in strips["data"])
    words = len(FT.word_cut(text))
    assert any(str(words) in bar["y"][0] for bar in strips["data"])  # the count is the whole text's
    note = captions(at)
    assert ("the strips draw its first" in note and "reference to a copy" in note) if lang == "en" else \
        ("条带只画出前" in note and "所存副本的引用" in note)


def test_padding_sentences_and_model_are_in_the_link():
    at = run("padding", query={"checkpoint": "reverse"})
    assert_clean(at)
    key = next(a.key for a in at.text_area if a.key and a.key.startswith("pad_lines_"))
    lines = "abc => cba\nhello => olleh\nxy => yx"
    at.text_area(key=key).set_value(lines).run()
    assert_clean(at)
    assert at.query_params["pad_lines"] in (lines, [lines])
    model = at.query_params["pad_model"]
    model = model[0] if isinstance(model, list) else model
    again = run("padding", query={"checkpoint": "reverse", "pad_model": model, "pad_lines": lines})
    assert_clean(again)
    assert again.text_area(key=key).value == lines


def test_padding_link_sentences_do_not_leak_into_another_models_batch():
    """The link's sentences belong to its batch model; picking another model opens that model's own batch."""
    lines = "abc => cba\nhello => olleh"
    at = run("padding", query={"checkpoint": "reverse", "pad_model": "reverse", "pad_lines": lines})
    assert_clean(at)
    select = next(s for s in at.selectbox if s.key and s.key.startswith("pad_model_"))
    other = next(o for o in select.options if o != "reverse")
    select.set_value(other).run()
    assert not at.exception
    assert at.text_area(key=f"pad_lines_{other}").value != lines


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_an_overlong_input_is_said_once_with_a_capital(lang):
    at = run("attention", lang, {"checkpoint": "dates"}, state={"source_text": "1" * 5000})
    assert not at.exception
    (err,) = [e.value for e in at.error]
    if lang == "en":
        assert err.startswith("The input is 5000 tokens long") and err.count("Shorten") == 1
    else:
        assert err.startswith("输入有 5000 个词元") and "Shorten" not in err


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("token", ["", "streetx", "x" * 5000])
def test_query_token_messages_keep_quotes_and_stay_short(token, lang):
    """Experiments › Two inputs: an empty, a wrong and a 5,000-character query token each get one short message."""
    at = run("experiments", lang, {"exp_view": "compare"}, state={"exp_cmp_q": token})
    assert not at.exception
    (err,) = [e.value for e in at.error]
    assert "x" * (MAX_SHOWN + 1) not in err
    if token == "":
        assert err.startswith("The token box is empty" if lang == "en" else "词元框是空的"), err
    elif token == "streetx":
        assert err.startswith("“streetx”"), err  # the opening quote is kept
    else:
        assert ("… (5000 characters)" if lang == "en" else "…（共 5000 个字符）") in err, err
    if token:
        assert ("is not a token of this sentence" if lang == "en" else "不是这个句子中的词元") in err
