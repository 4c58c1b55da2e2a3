"""Architecture map (AppTest): a click on a block, and the link list under the map, open that block's own
view — the right side of Tokens & embeddings, the chosen layer and head of Inside a layer — in both
languages, with Chinese punctuation in the zh labels."""

from __future__ import annotations

import urllib.parse

import pytest
from conftest import assert_clean, figures, open_page

from viz.figures import arch as FA

PAGE = "viz/pages/architecture.py"


def open_map(lang: str = "en", **query):
    return open_page(PAGE, query={"lang": lang, **query})


def click(at, block_id: str):
    """What the browser sends when the block's marker is clicked (plotly's selection event)."""
    at.session_state["arch_map"] = {"selection": {"points": [{"customdata": [block_id]}]}}
    return at.run()


def test_decoder_embedding_opens_the_decoder_side_of_tokens():
    at = open_map()
    at.session_state["tok_side"] = "encoder"  # the session saw Tokens on the encoder side before
    click(at, "tgt_embed")
    assert_clean(at)
    assert at.title[0].value == "Tokens & embeddings"
    assert at.session_state["tok_side"] == "decoder" and at.query_params["side"] == "decoder"
    assert at.radio(key="tok_side").value == "decoder"


def test_encoder_embedding_opens_the_encoder_side_of_tokens():
    at = open_map()
    at.session_state["tok_side"] = "decoder"
    click(at, "src_embed")
    assert_clean(at)
    assert at.session_state["tok_side"] == "encoder"


@pytest.mark.parametrize("block", ["enc_norm1", "dec_ffn"])
def test_add_norm_and_ffn_open_inside_a_layer_with_the_chosen_head(block):
    at = open_map(layer="1", head="3")
    click(at, block)
    assert_clean(at)
    assert at.title[0].value == "Inside a layer"
    stack, sub = FA.BY_ID[block].params["stack"], FA.BY_ID[block].params["sub"]
    state = {k: at.session_state[k] for k in ("ly_stack", "ly_layer", "ly_sub", "ly_head")}
    assert state == {"ly_stack": stack, "ly_layer": 1, "ly_sub": sub, "ly_head": 3}
    assert at.query_params["head"] == "3"


def test_link_list_carries_each_blocks_parameters():
    at = open_map(layer="1", head="2")
    links = at.get("page_link")  # in column order: match them to blocks by label
    assert len(links) == len(FA.BLOCKS)
    assert len({link.proto.label for link in links}) == len(links), "two links with one label"
    by_label = {link.proto.label: dict(urllib.parse.parse_qsl(link.proto.query_string)) for link in links}
    side = {"src_embed": "Encoder", "tgt_embed": "Decoder", "generator": "Decoder", "masks": None}
    for block in FA.BLOCKS:
        who = side.get(block.id, "Encoder" if block.id.startswith("enc") else "Decoder")
        name = FA.LIST_LABELS.get(block.id, block.label)
        label = f"{who}: {name}" if who else name
        assert by_label[label] == FA.block_params(block.id, 1, 2), block.id
    assert by_label["Decoder: Output embedding ×√d + positional encoding"] == {"side": "decoder"}
    assert by_label["Encoder: Input embedding ×√d + positional encoding"] == {"side": "encoder"}
    assert by_label["Decoder: Feed-forward network"]["head"] == "2"


def test_zh_labels_use_full_width_punctuation():
    at = open_map("zh")
    assert_clean(at)
    labels = [link.proto.label for link in at.get("page_link")]
    assert "解码器：多头交叉注意力（Q 来自解码器，K、V 来自编码器）" in labels, labels
    fig = next(f for f in figures(at) if f["layout"]["annotations"])
    texts = [a.get("text", "") for a in fig["layout"]["annotations"]] + [fig["layout"]["title"]["text"]]
    from test_i18n import halfwidth_punctuation

    bad = [x for x in texts + labels if halfwidth_punctuation(x)]
    assert not bad, bad
