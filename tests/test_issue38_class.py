"""What a class saw (issue 38 §5: a zh teacher on Gemma 3 at 1920×1080), each fixed where a test can see it.

- zh words: the Language model page's head view is 头总览 (not 头数, "number of heads"), Top-k / Top-p are 采样
  (sampling) labels, the logit lens is 对数几率透镜 everywhere, the lens's embedding row is 嵌入, plot titles say the
  attention module in words (第 5 层 · 自注意力 · 头 1; en "layer 5 · self-attention · head 1") with the capture name
  under them, /learn's checkpoints are named in the UI's language, Streamlit's "Stopping..." joins "Stop", and a model
  that cannot load says why in the UI's language.
- Gemma 3 in zh opens on a Chinese prompt (SmolLM2, trained on English only, keeps its English one); "use a prompt
  that repeats itself" offers a Chinese one there; a generated "↵↵" breaks the output line.
- Presentation mode puts the question and its right/wrong beside the figure (the first screen); lesson 18's cold
  wait says how long; the needle page cites the README's SmolLM2 numbers on SmolLM2 only.
"""

from __future__ import annotations

import json

import pytest
from conftest import assert_clean, open_page
from test_i18n import walk

from viz import i18n
from viz import lessons as LS
from viz.figures import attention as F
from viz.ui import lm_models
from viz.ui.text import md_text_lines, model_name_text

ZH_PROMPT = "我爱机器学习，今天天气很好。"  # Gemma 3's greedy step 0 after it: "\n\n" (one token)


@pytest.fixture
def zh(monkeypatch):
    """t() in Chinese outside a script run (figure builders and helpers called directly)."""
    monkeypatch.setattr(i18n, "current_lang", lambda: "zh")


def page(*args, **kw):
    """conftest.model_page, imported when a page test runs: a module that names it at import is all slow (conftest's
    pytest_collection_modifyitems), and the helpers' tests here belong to the fast subset."""
    from conftest import model_page as opened

    return opened(*args, **kw)


def titles(at) -> list[str]:
    return [json.loads(c.proto.spec)["layout"].get("title", {}).get("text", "") for c in at.get("plotly_chart")]


# ---------------------------------------------------------------- helpers, no model


def test_module_titles_say_the_module_in_words(zh):
    toy = {"model": {"stacks": {"encoder": {"layers": 2}, "decoder": {"layers": 2}}, "attention": {}}}
    lm = {"model": {"stacks": {"decoder": {"layers": 18}}, "attention": {}}}
    assert F.module_title("decoder.layers.5.self_attn", lm) == "第 5 层 · 自注意力"
    assert F.module_title("decoder.layers.1.cross_attn", toy) == "解码器第 1 层 · 交叉注意力"
    assert F.module_title("encoder.layers.0.self_attn", toy) == "编码器第 0 层 · 自注意力"
    assert F.module_title("decoder.layers.5.ffn") == "decoder.layers.5.ffn"  # not an attention module: as it is


def test_module_titles_in_english():
    assert F.module_title("decoder.layers.5.self_attn") == "layer 5 · self-attention"
    from dataclasses import asdict

    from model import TransformerConfig

    cfg = TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=32, n_heads=4, n_encoder_layers=2,
                            n_decoder_layers=2, d_ff=64)
    toy = {"config": asdict(cfg)}  # a trace saved before descriptions: its config says there are two stacks
    assert F.module_title("decoder.layers.1.cross_attn", toy) == "decoder layer 1 · cross-attention"


def test_learn_checkpoint_names_in_zh(zh):
    assert model_name_text("learn: 2 layers, step 675") == "看注意力学习：2 层，第 675 步"
    assert model_name_text("learn: run 3 (one layer, seed 0), step 2000") == \
        "看注意力学习：第 3 次运行（1 层，种子 0），第 2000 步"
    assert model_name_text("dates") == "dates"
    from viz.ui.sidebar import model_label

    assert model_label("learn: 1 layer, step 40") == "看注意力学习：1 层，第 40 步"


def test_learn_checkpoint_names_in_english_are_the_names():
    for name in ("learn: 2 layers, step 675", "learn: run 3 (no positions, seed 1), step 2000"):
        assert model_name_text(name) == name


def test_generated_newlines_break_the_line_and_are_marked():
    assert md_text_lines("\n\n今天天气很好") == "↵  \n↵  \n今天天气很好"  # two spaces: a Markdown line break
    assert md_text_lines("a *b*\r\nc") == "a \\*b\\*↵  \nc"  # still escaped
    assert md_text_lines("no break") == "no break"


def test_streamlits_stopping_is_translated_too():
    from viz.ui.chrome import ZH, script

    assert ZH["Stop"] == "停止" and ZH["Stopping..."] == "正在停止…"
    assert "正在停止…" in script("zh")


def test_a_load_error_is_said_in_chinese(zh, tmp_path):
    p = tmp_path / "garbage.gguf"
    p.write_bytes(b"PK\x03\x04" + bytes(60))
    (label,) = lm_models.add_server_models([str(p)])
    with pytest.raises(ValueError) as e:
        lm_models.load(label)
    msg = str(e.value)
    assert msg.startswith(f"{label} 不是 GGUF 文件（它以 b'PK\\x03\\x04' 开头，而不是 b'GGUF'）。"), msg
    assert "本实验室能打开这些架构的 GGUF 文件" in msg and msg.count(label) == 1 and str(tmp_path) not in msg
    other = lm_models.said_in_ui("x.gguf: tensor 'w' appears twice.", "x.gguf")  # no sentence of its own: framed
    assert other == "无法打开 x.gguf：tensor 'w' appears twice。"


def test_a_load_error_in_english_is_the_loaders_sentence(tmp_path):
    assert lm_models.said_in_ui("x.gguf is not a GGUF file (it starts with b'PK', not b'GGUF').", "x.gguf") == \
        "x.gguf is not a GGUF file (it starts with b'PK', not b'GGUF')."


def test_lesson_18s_cold_wait_says_how_long(zh):
    load, run = lm_models.cold_waits("gemma3")
    assert "12–35 秒" in load and "Gemma 3 270M" in load and "约 10 秒" in run
    assert lm_models.cold_waits("smollm2") == ("正在加载 SmolLM2-135M-Instruct…", "正在运行模型…")


def test_gemma3_opens_on_a_chinese_prompt_in_zh_and_smollm2_stays_english():
    gemma, smol = lm_models.load("gemma3"), lm_models.load("smollm2")
    assert gemma.example_in("zh") == lm_models.LANG_EXAMPLES["zh"] and gemma.example_in("en").startswith("When Mary")
    assert smol.example_in("zh").startswith("When Mary")  # its file: general.languages = en


# ---------------------------------------------------------------- pages


@pytest.mark.slow
def test_gemma3_llm_page_in_zh():
    """/llm on Gemma 3 in zh: a Chinese prompt, 头总览, the module in words in the head's title, Top-k/Top-p 采样, the
    lens's 嵌入 row under 对数几率透镜, and a Chinese repeating prompt offered where the prompt repeats no token."""
    at = page("gemma3", "llm", "zh")
    assert at.text_area(key="llm_prompt").value == "玛丽和约翰去了商店，约翰把一杯饮料递给了"
    view = at.get_by_key("llm_view")
    assert [o.content for o in view.proto.options] == ["头总览", "生成", "对数几率透镜"]  # not 头数, nor Logit 透镜
    head = next(x for x in titles(at) if "· 头 0 ·" in x)
    assert head.startswith("第 0 层 · 自注意力 · 头 0 · softmax 权重<br><sup>decoder.layers.0.self_attn · ")
    view.set_value("generate").run()
    assert_clean(at)
    assert at.number_input(key="llm_topk").label == "Top-k 采样" and at.slider(key="llm_topp").label == "Top-p 采样"
    at.get_by_key("llm_view").set_value("lens").run()
    assert_clean(at)
    lens = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert lens["data"][0]["y"][0] == "嵌入" and lens["layout"]["title"]["text"].startswith("对数几率透镜")

    at = page("gemma3", "llm", "zh", prompt="我爱机器学习", stat="induction")  # no token repeats
    button = next(b for b in at.button if b.label == "换一个自我重复的提示词")
    button.click().run()
    assert_clean(at)
    assert at.text_area(key="llm_prompt").value == "小猫坐在垫子上。小狗在公园里跑。小猫坐在垫子上。小狗在公园里跑。"


@pytest.mark.slow
def test_a_generated_double_newline_breaks_the_output_line():
    """Gemma 3 answers the Chinese sentence with "\\n\\n" at step 0: the output line shows ↵↵ and breaks there."""
    at = page("gemma3", "llm", "zh", prompt=ZH_PROMPT, view="generate", max_new=3)
    next(b for b in at.button if b.label == "生成").click().run()
    assert_clean(at)
    out = next(m.value for m in at.markdown if m.value.startswith("**输出**"))
    assert "↵  \n↵  \n今天" in out, out


@pytest.mark.slow
def test_presentation_mode_puts_the_answer_beside_the_figure():
    """?present=1: the question, and the right/wrong it gets, in a column beside the figure (at 1080p the feedback
    was under an 880 px figure, below the fold); in the normal mode they stay under it."""
    at = open_page("viz/pages/lessons.py", query={"lang": "zh", "lesson": 3, "present": 1}, timeout=300)
    assert_clean(at)
    radio = next(r for r in at.radio if r.key and r.key.startswith("lesson_q_"))
    radio.set_value(radio.options[0]).run()
    assert_clean(at)
    rows = [b for b in walk(at.main) if getattr(b, "type", None) == "flex_container"
            and any(getattr(c, "type", None) == "column" for c in b.children.values())
            and any(e.type == "plotly_chart" for e in walk(b))]
    assert rows, "the figure sits in a row of columns"
    cols = list(rows[-1].children.values())  # the innermost row that holds the figure
    fig_col = next(c for c in cols if any(e.type == "plotly_chart" for e in walk(c)))
    side = next(c for c in cols if any(getattr(e, "key", None) == radio.key for e in walk(c)))
    assert side is not fig_col
    assert any(e.type in ("success", "warning") for e in walk(side)), "the feedback beside the figure"
    at.toggle(key="lesson_present").set_value(False).run()  # the normal page: the question under the figure
    assert_clean(at)
    order = [getattr(e, "key", None) or e.type for e in walk(at.main)]
    assert order.index(f"lesson_fig_{LS.LESSONS[2].slug}") < order.index(radio.key)
    assert not any(e.type == "plotly_chart" for c in walk(at.main) if getattr(c, "type", None) == "column"
                   for e in walk(c))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma3", "smollm2"])
def test_the_needle_cites_the_readme_only_beside_smollm2(name):
    # the needle grid is computed live (its ablation only when asked): room for a busy CI machine
    at = page(name, "phenomena", "en", phen="needle", timeout=900)
    said = " ".join(c.value for c in at.caption)
    assert "An easy haystack" in said
    assert ("The README reports SmolLM2" in said) is (name == "smollm2"), said
    if name == "smollm2":  # what it cites is what the README measured (4,096 / 8,187 tokens; nothing "not measured")
        import re
        from pathlib import Path

        readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
        para = readme[readme.index("**Needle in a haystack on SmolLM2**"):]
        para = para[:para.index("\n\n")]
        (cap,) = [c.value for c in at.caption if c.value.startswith("An easy haystack")]
        numbers = re.findall(r"\b\d[\d,]*\d\b", cap)  # "135M" (the model) is no measurement
        assert numbers and all(n in para for n in numbers) and "8,187" in cap, (numbers, para[:200])
