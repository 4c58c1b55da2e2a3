"""Issue 17 (part B), pure parts: teacher-forced row labels, every tick, the Q·K·V·z grid, fonts for a
projector, Chinese y titles upright, one number format, the tokenizer strips' cap, and input messages."""

from __future__ import annotations

import pytest

from model.analysis.compare import NotATokenError, find_token
from model.toy.checkpoint import load_checkpoint
from viz.figures import attention as F
from viz.figures import tokenizers as FT
from viz.ui.render import model_tokens
from viz.ui.text import MAX_SHOWN, error_text, unk_note

TEXT, TARGET = "3 november 2023", "2023-11-04"


@pytest.fixture(scope="module")
def forced():
    """The dates model fed a reference it does not predict everywhere, and its own predictions."""
    ckpt = load_checkpoint("dates")
    _, trace = ckpt.trace(TEXT, target=TARGET)
    own = model_tokens(ckpt, trace)
    return ckpt, trace, own


def test_teacher_forced_rows_name_the_reference_and_the_models_own_prediction(forced):
    ckpt, trace, own = forced
    meta = trace.meta
    reference = meta["next_tokens"]
    argmax = [ckpt.tgt_tokenizer.id_to_token(int(i)) for i in trace["logits"][0].argmax(-1)]
    assert own == argmax
    differ = [i for i, (r, m) in enumerate(zip(reference, own, strict=True)) if r != m]
    assert differ, "the example needs a position where the model disagrees with the reference"
    fig = F.attention_heatmap(trace, "decoder.layers.1.cross_attn", 0, meta=meta | {"model_tokens": own})
    rows = list(fig.layout.yaxis.tickvals)
    for i, label in enumerate(rows):
        assert label.startswith(f"{i}: {meta['tgt_tokens'][i]} → {reference[i]}")
        assert ("(model: " in label) == (i in differ)
    i = differ[0]
    assert rows[i].endswith(f"(model: {own[i]})")
    assert "reference" in fig.layout.yaxis.title.text
    # The model's own output (no target): "→" is its prediction, and no bracket is added.
    _, greedy = ckpt.trace(TEXT)
    assert model_tokens(ckpt, greedy) is None
    assert "predicted" in F.attention_heatmap(greedy, "decoder.layers.1.cross_attn", 0).layout.yaxis.title.text


def test_single_head_heatmap_labels_every_row_and_column(forced):
    _, trace, _ = forced
    fig = F.attention_heatmap(trace, "encoder.layers.0.self_attn", 0)
    n = trace["encoder.layers.0.self_attn.weights"].shape[-1]
    assert 16 <= n <= F.MAX_TICKS
    assert fig.layout.yaxis.tickmode == "array" and len(fig.layout.yaxis.tickvals) == n
    assert fig.layout.xaxis.tickmode == "array" and len(fig.layout.xaxis.tickvals) == n
    assert F.every_tick([str(i) for i in range(F.MAX_TICKS + 1)]) == {}  # longer: plotly's own choice


def test_qkvz_labels_each_token_axis_once_on_the_left(forced):
    _, trace, _ = forced
    fig = F.qkvz_figure(trace, "decoder.layers.1.cross_attn", 0)
    by_axis = {(tr.xaxis, tr.yaxis): tr for tr in fig.data}
    assert len(by_axis) == 4
    labelled = {name: fig.layout[name] for name in ("yaxis", "yaxis2", "yaxis3", "yaxis4")}
    # Left column (Q over K) carries the labels; the right column (z, V) shows none, so nothing falls on Q or K.
    assert labelled["yaxis"].showticklabels is not False and labelled["yaxis3"].showticklabels is not False
    assert labelled["yaxis2"].showticklabels is False and labelled["yaxis4"].showticklabels is False
    q_rows, k_rows = list(labelled["yaxis"].tickvals), list(labelled["yaxis3"].tickvals)
    assert len(q_rows) == trace["decoder.layers.1.cross_attn.q"].shape[2]
    assert len(k_rows) == trace["decoder.layers.1.cross_attn.k"].shape[2]
    z = next(tr for tr in fig.data if tr.yaxis == "y2")
    assert list(z.y) == q_rows  # z sits on the query rows, beside Q
    # The panels of one row do not overlap: the labels of the left column stay left of it.
    assert fig.layout.xaxis.domain[1] < fig.layout.xaxis2.domain[0]


def test_scale_fonts_reaches_ticks_titles_annotations_and_buttons(forced):
    _, trace, _ = forced
    fig = F.scale_fonts(F.attention_heatmap(trace, "decoder.layers.1.cross_attn", 0, all_heads=True), 18)
    assert fig.layout.xaxis.tickfont.size == 18 and fig.layout.yaxis.tickfont.size == 18
    assert fig.layout.xaxis.title.font.size == 18 and fig.layout.yaxis.title.font.size == 18
    assert all(a.font.size == 18 for a in fig.layout.annotations)
    assert fig.layout.updatemenus[0].font.size == 18
    assert all(tr.colorbar.tickfont.size == 18 for tr in fig.data)
    grid = F.scale_fonts(F.heads_grid(trace, "encoder.layers.0.self_attn"), 20)
    assert {ax.tickfont.size for ax in grid.select_yaxes()} == {20}


def test_chinese_y_titles_are_written_horizontally(forced):
    _, trace, _ = forced
    fig = F.qkvz_figure(trace, "decoder.layers.1.cross_attn", 0)
    fig.layout.yaxis.title.text = "查询（解码器：输入 → 参考）"
    fig.layout.yaxis3.title.text = "key (source)"  # not Chinese: stays an axis title
    out = F.upright_y_titles(fig, copy=True)
    assert out is not fig and fig.layout.yaxis.title.text == "查询（解码器：输入 → 参考）"  # the original is kept
    assert out.layout.yaxis.title.text is None and out.layout.yaxis3.title.text == "key (source)"
    (note,) = [a for a in out.layout.annotations if a.text == "查询（解码器：输入 → 参考）"]
    assert (note.xref, note.yref, note.x, note.y, note.xanchor) == ("x domain", "y domain", 0, 1, "right")
    assert note.textangle is None  # horizontal
    assert out.layout.margin.l >= F.text_width(note.text)  # room for the whole title left of the plot
    plain = F.attention_heatmap(trace, "encoder.layers.0.self_attn", 0)
    assert F.upright_y_titles(plain, copy=True) is plain  # nothing to move, no copy


def test_one_number_format():
    assert F.num(0.0) == "0" and F.num(-0.0) == "0"
    assert F.num(1.58e-09) == "1.58e-09" and F.num(2.53e-7) == "2.53e-07"
    assert F.num(0.123456) == "0.123" and F.num(float("-inf")) == "−∞"


def test_tokenizer_strips_draw_a_readable_part_of_a_long_text():
    text = ("eating drinking " * 400)[:5000]
    pieces = [type("P", (), {"token": w, "span": (m, m + len(w))})() for m, w in
              ((i, "eat") for i in range(0, len(text), 16))]
    end = FT.drawn_end(text)
    assert end <= FT.MAX_DRAWN and text[end] == " "  # a word is not cut in two
    cuts = FT.cuts_upto(text, pieces, end)
    totals = {"word": len(FT.word_cut(text)), "char": len(FT.char_cut(text)), "wordpiece": len(pieces)}
    fig = FT.strips_figure(cuts, None, totals)
    for bar, method in zip(fig.data, cuts, strict=True):
        assert len(bar.x) == len(cuts[method]) <= FT.MAX_DRAWN
        assert bar.y[0].startswith(f"{FT.t(FT.METHODS[method])}: {totals[method]} tokens (first {len(bar.x)} drawn)")
    one_word = "x" * 5000  # no space in reach: cut at the limit, and a 5,000-character word is one short box
    assert FT.drawn_end(one_word) == FT.MAX_DRAWN
    fig = FT.strips_figure({"word": [one_word]})
    assert len(fig.data[0].text[0]) == FT.MAX_BOX and sum(fig.data[0].x) < FT.MAX_BOX + 1


def test_error_messages_keep_quotes_say_it_once_and_shorten():
    msg, _ = error_text(ValueError("'street' is not a token of this sentence"))
    assert msg.startswith("'street'")  # the opening quote is kept
    assert error_text(KeyError("no such capture"))[0] == "No such capture"
    tokens = ["the", "animal", "street"]
    with pytest.raises(NotATokenError) as empty:
        find_token(tokens, "")
    msg, advised = error_text(empty.value)
    assert advised and msg.startswith("The token box is empty") and "the animal street" in msg
    with pytest.raises(NotATokenError) as huge:
        find_token(tokens, "x" * 5000)
    msg, _ = error_text(huge.value)
    assert "(5000 characters)" in msg and "x" * (MAX_SHOWN + 1) not in msg
    assert "x" * 41 not in str(huge.value)  # the model's own message is short too
    msg, advised = error_text(ValueError("the input is 5000 tokens long; this model's limit is 255 tokens. "
                                                "Shorten it: it is never silently truncated."))
    assert advised and msg.startswith("The input is 5000 tokens long") and msg.count("Shorten") == 1


def test_unk_note_escapes_markdown():
    text = "*_`<>:b"
    pieces = [type("P", (), {"is_unk": True, "span": (i, i + 1), "token": "[UNK]"})() for i in range(len(text))]
    note = unk_note(pieces, text)
    for ch in text[:-1]:  # Markdown's characters (and Streamlit's ":") are escaped, letters are not
        assert f"'\\{ch}'" in note
    assert "'b'" in note
