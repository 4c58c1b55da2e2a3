"""The bilingual UI: every msgid the code uses has Chinese, the catalogs parse and keep their
placeholders, and every page runs in both languages, the zh one without an English sentence."""

from __future__ import annotations

import ast
import functools
import json
import re
import string
from pathlib import Path

import pytest
from babel.messages.extract import extract_from_file
from babel.messages.pofile import read_po
from conftest import assert_clean
from streamlit.testing.v1 import AppTest

from viz import i18n

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
# Where UI text lives: the app, every viz module, and model/toy/tasks.py (task grammars, input problems).
SOURCES = sorted([ROOT / "app.py", ROOT / "model" / "toy" / "tasks.py", *(ROOT / "viz").rglob("*.py")])
KEYWORDS = {"t": None, "N_": None}
PO_FILES = sorted((i18n.LOCALE_DIR / "zh").glob("*.po"))
PAGES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "viz" / "pages").glob("*.py") if p.stem != "__init__")
TIMEOUT = 300


# ---------------------------------------------------------------- catalogs


def used_msgids() -> dict[str, str]:
    """msgid -> "file:line" of its first use, for every t("...") / N_("...") literal: Babel's extractor
    (what `pybabel extract -k t -k N_` puts in a .pot), plus the calls it cannot see inside f-strings."""
    out: dict[str, str] = {}
    for path in SOURCES:
        where = path.relative_to(ROOT)
        for lineno, msg, _, _ in extract_from_file("python", str(path), keywords=KEYWORDS):
            msg = msg[0] if isinstance(msg, tuple) else msg
            if msg:
                out.setdefault(msg, f"{where}:{lineno}")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in KEYWORDS and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                out.setdefault(node.args[0].value, f"{where}:{node.lineno} (inside an f-string: pybabel misses it)")
    return out


def read(po: Path):
    with po.open("rb") as f:
        return read_po(f, locale="zh", abort_invalid=True)


def fields(text: str) -> set[str]:
    """The names of the {placeholders} in a format string (a broken one is reported as such)."""
    try:
        return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
    except ValueError as e:
        return {f"<unparsable: {e}>"}


def test_extraction_finds_the_ui_text():
    ids = used_msgids()
    assert len(ids) > 100 and "Lessons" in ids and "Presentation mode" in ids


# Babel's reader is lenient (an unterminated string silently becomes an empty msgstr): every
# line must also be one of the gettext forms, with its quoted string closed.
PO_LINE = re.compile(r'(#.*|(msgctxt|msgid|msgid_plural|msgstr(\[\d+\])?) )?"(?:[^"\\]|\\.)*"\s*|#.*|\s*')


def po_problems(po: Path) -> list[str]:
    lines = po.read_text(encoding="utf-8").splitlines()
    bad = [f"{po.name}:{i}: {line!r}" for i, line in enumerate(lines, 1) if not PO_LINE.fullmatch(line)]
    n_ids = sum(line.startswith("msgid ") for line in lines)
    # Babel yields a header message even when the file has none.
    n_read = len(list(read(po))) - (0 if any(line == 'msgid ""' for line in lines) else 1)
    if n_read != n_ids:
        bad.append(f"{po.name}: {n_ids} msgid lines but Babel read {n_read} messages")
    return bad


@pytest.mark.parametrize("po", PO_FILES, ids=lambda p: p.name)
def test_po_file_parses(po):
    cat = read(po)
    assert cat.locale and str(cat.locale) == "zh"
    assert len([m for m in cat if m.id]) > 0
    assert not po_problems(po)


def test_po_check_catches_an_unterminated_string(tmp_path):
    bad = tmp_path / "bad.po"
    bad.write_text('msgid ""\nmsgstr ""\n"Language: zh\\n"\n\nmsgid "a"\nmsgstr "b\n\nmsgid "c"\nmsgstr "d"\n',
                   encoding="utf-8")
    assert po_problems(bad) and 'msgstr "b' in po_problems(bad)[0]


def test_every_msgid_has_chinese():
    merged = i18n.catalog("zh")
    missing = [f"{where}: {msg!r}" for msg, where in used_msgids().items() if not merged.get(msg, "").strip()]
    assert not missing, f"{len(missing)} msgids have no Chinese in viz/locale/zh/*.po:\n" + "\n".join(missing)


def test_placeholders_match():
    bad = []
    for po in PO_FILES:
        for m in read(po):
            if m.id and m.string and fields(m.id) != fields(m.string):
                bad.append(f"{po.name}: {m.id!r} {sorted(fields(m.id))} -> {m.string!r} {sorted(fields(m.string))}")
    assert not bad, "placeholders differ between msgid and msgstr:\n" + "\n".join(bad)


def test_catalogs_agree_where_they_overlap():
    """Two owners' .po files translating one msgid differently: the merge would pick one silently."""
    seen: dict[str, tuple[str, str]] = {}
    clashes = []
    for po in PO_FILES:
        for m in read(po):
            if not (m.id and m.string):
                continue
            if m.id in seen and seen[m.id][1] != m.string:
                clashes.append(f"{m.id!r}: {seen[m.id][0]} {seen[m.id][1]!r} vs {po.name} {m.string!r}")
            seen.setdefault(m.id, (po.name, m.string))
    assert not clashes, "\n".join(clashes)


def test_t_translates_and_fills_after_translation():
    assert i18n.t("Lesson {n} of {total} · {done} of {total} questions answered", lang="zh", n=3, total=10,
                  done=1) == "第 3 课，共 10 课 · 已答对 1/10 题"
    assert i18n.t("Lessons", lang="en") == "Lessons"
    assert i18n.t("no such msgid {x}", lang="zh", x=1) == "no such msgid 1"  # falls back to English


def test_language_from_accept_language_header():
    assert i18n.lang_from_header("zh-CN,zh;q=0.9,en;q=0.8") == "zh"
    assert i18n.lang_from_header("en-US,en;q=0.9,zh;q=0.8") == "en"
    assert i18n.lang_from_header("fr-FR, zh;q=0.5, en;q=0.4") == "zh"
    assert i18n.lang_from_header("de") == i18n.lang_from_header(None) == i18n.DEFAULT_LANG
    assert i18n.lang_from_header("en;q=0.2, zh;q=bad") == "en"


def test_option_labels_are_fixed_when_made():
    fmt = i18n.option_labels(["a", "b"], lambda o: o.upper())
    assert fmt("a") == "A" and fmt("b") == "B"


# ---------------------------------------------------------------- pages in both languages

# ≥ 4 consecutive English words (letters, apostrophes, hyphens): a sentence left untranslated.
ENGLISH_RUN = re.compile(r"[A-Za-z][A-Za-z'’-]*(?:[ ,]+[A-Za-z][A-Za-z'’-]*){3,}")
# Not prose the UI owns: code, quoted strings (model input/output, example sentences), URLs,
# and symbols such as softmax(QKᵀ/√d_k).
NOT_PROSE = re.compile(r"```.*?```|`[^`]*`|“[^”]*”|《[^》]*》|\"[^\"]*\"|‘[^’]*’|'[^'\n]{1,80}'|https?://\S+"
                       r"|\[[A-Z]+\]", re.S)


@functools.cache
def model_words() -> frozenset[str]:
    """Every English word the toy models can output: a run made only of these is model output."""
    from model.toy.tasks import TASKS

    return frozenset(w for _, target in TASKS["zh-en"].all_pairs() for w in target.split())


TEXT_ELEMENTS = ("title", "header", "subheader", "markdown", "caption", "error", "warning", "info",
                 "success", "toast")
WIDGETS = ("button", "checkbox", "toggle", "radio", "selectbox", "multiselect", "select_slider", "slider",
           "number_input", "text_input", "text_area", "segmented_control", "pills", "date_input",
           "file_uploader", "download_button", "color_picker", "time_input", "expander", "tabs", "metric")


@functools.cache
def app_run(page: str, lang: str) -> AppTest:
    """One AppTest run of `page` in `lang` (shared by the tests below: each run costs seconds)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["lang"] = lang
    at.run()
    at.switch_page(page)
    at.run()
    return at


def shown_texts(at: AppTest, root=None) -> list[tuple[str, str]]:
    """(element type, text) of every visible string the page wrote (in `root`, default everywhere):
    texts and widget labels, help and placeholders."""
    out = []
    elements = list(walk(root)) if root is not None else None
    pick = (lambda kind: at.get(kind)) if root is None else (lambda kind: [e for e in elements if e.type == kind])
    for kind in TEXT_ELEMENTS:
        out += [(kind, str(e.value)) for e in pick(kind)]
    for kind in WIDGETS:
        for w in pick(kind):
            for attr in ("label", "help", "placeholder"):
                value = getattr(w, attr, None) or getattr(getattr(w, "proto", None), attr, None)
                if isinstance(value, str) and value:
                    out.append((f"{kind}.{attr}", value))
    return out


def walk(node):
    yield node
    for child in getattr(node, "children", {}).values():
        yield from walk(child)


def english_sentences(text: str) -> list[str]:
    runs = (m.group() for m in ENGLISH_RUN.finditer(NOT_PROSE.sub(" ", text)))
    return [r for r in runs if not set(re.split(r"[ ,]+", r.lower())) <= model_words()]


# Half-width , : ; ( ) touching a Chinese character, or parentheses around Chinese: Chinese text takes ，：；（）.
CJK = r"[\u3400-\u9fff]"
HALFWIDTH = re.compile(rf"{CJK}[,:;()]|[,:;()]{CJK}|\([^()]*{CJK}[^()]*\)")


FORMULA = re.compile(r"[A-Za-z]\([^()]*\)")  # p(词元 | 前缀, 源): math keeps its ASCII punctuation


def halfwidth_punctuation(text: str) -> list[str]:
    return [m.group() for m in HALFWIDTH.finditer(FORMULA.sub(" ", NOT_PROSE.sub(" ", text)))]


def test_halfwidth_detector():
    assert halfwidth_punctuation("多头交叉注意力(Q 来自解码器,K、V 来自编码器)")
    assert halfwidth_punctuation("当前模型:D = 64")
    assert not halfwidth_punctuation("多头交叉注意力（Q 来自解码器，K、V 来自编码器）")
    assert not halfwidth_punctuation("(B, S, D) = (1, 12, 64) 源端 id")  # shapes are code, not prose
    assert not halfwidth_punctuation("模型 p(词元 | 前缀, 源)")  # a formula
    assert halfwidth_punctuation("前瞻掩码(masks.causal)")


# Short English UI words in figures and tables (titles, axis titles, legends, map labels, table cells): a
# word the English msgids use and no Chinese translation keeps, e.g. "weight" in "weight(it→animal)",
# "values" in a table. Dotted capture names, quoted text and the toy models' output words are not prose.
WORD = re.compile(r"(?<![\w.])[A-Za-z][a-z]{2,}(?![\w.])")
NOTATION = {"dim"}  # PE(pos, dim): the paper's notation


@functools.cache
def ui_only_words() -> frozenset[str]:
    def words(text: str) -> set[str]:
        return {w.lower() for w in WORD.findall(NOT_PROSE.sub(" ", re.sub(r"\{[^{}]*\}", " ", text)))}

    english = set().union(*(words(m) for m in used_msgids()))
    kept = set().union(*(words(m.string) for po in PO_FILES for m in read(po) if m.id and m.string))
    return frozenset(english - kept - model_words() - NOTATION)


def english_words(text: str) -> list[str]:
    return [w for w in WORD.findall(NOT_PROSE.sub(" ", text)) if w.lower() in ui_only_words()]


def figure_texts(at: AppTest) -> list[tuple[str, str]]:
    """(where, text) of every plotly figure's title, axis titles, annotations, legend names and colorbar titles."""
    def text(x):
        return (x.get("text") if isinstance(x, dict) else x) or ""

    out = []
    for c in at.get("plotly_chart"):
        fig = json.loads(c.proto.spec)
        lay = fig.get("layout", {})
        out.append(("figure title", text(lay.get("title"))))
        out += [(f"figure {k} title", text(v.get("title"))) for k, v in lay.items()
                if k.startswith(("xaxis", "yaxis")) and isinstance(v, dict)]
        out += [("figure annotation", text(a)) for a in lay.get("annotations") or []]
        for d in fig.get("data", []):
            out += [("figure legend", text(d.get("name"))),
                    ("figure colorbar", text((d.get("colorbar") or {}).get("title")))]
    return [(k, v) for k, v in out if v]


def table_texts(at: AppTest) -> list[tuple[str, str]]:
    """(where, text) of every dataframe's and table's column names and text cells."""
    out = []
    for kind in ("dataframe", "table"):
        for el in at.get(kind):
            frame = el.value
            out += [(f"{kind} column", str(c)) for c in frame.columns]
            out += [(f"{kind} cell", v) for col in frame.columns for v in frame[col].tolist() if isinstance(v, str)]
    return out


def english_in_zh(at: AppTest) -> list[str]:
    """Everything English a zh page shows: sentences anywhere, UI words in figures and tables."""
    found = [f"{kind}: {hit!r} in {text[:120]!r}" for kind, text in shown_texts(at) for hit in english_sentences(text)]
    typed = {w.lower() for kind in ("text_input", "text_area") for el in at.get(kind)
             for w in WORD.findall(str(el.value or ""))}  # the inputs' words (tokens in a table) are data
    for kind, text in figure_texts(at) + table_texts(at):
        words = [w for w in english_words(text) if w.lower() not in typed]
        found += [f"{kind}: {hit!r} in {text[:120]!r}" for hit in english_sentences(text) + words]
    return found


def test_english_words_detector():
    assert english_words("每个头中的 weight(it→animal) − weight(it→street)") == ["weight", "weight"]
    assert not english_words("每个头中的 权重（it→animal）")
    assert not english_words("encoder.layers.0.self_attn · 头 0 · softmax 权重")
    assert not english_words("模型 zh-en · “The animal didn't cross the street”")


def test_english_detector():
    assert english_sentences("The input is empty: type a sentence in the sidebar.")
    assert not english_sentences("输出词“i love machine learning”把注意力给了 softmax(QKᵀ/√d_k)")
    assert not english_sentences("层 0 · head 1 · QKᵀ")
    assert not english_sentences("**模型输出：** i love machine learning")
    assert not english_sentences("例如 \"3 november 2023\"、`pip install -e '.[pretrained]'`")


def test_language_switch_is_kept_in_the_url():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["lang"] = "zh"
    at.run()
    at.switch_page("viz/pages/lessons.py")
    at.run()
    switch = at.get_by_key("_lang_choice")
    assert switch.value == "zh" and at.title[0].value == "课程"
    switch.set_value("en").run()  # a click on "English", with ?lang=zh still in the URL
    assert at.query_params["lang"] == "en" and at.title[0].value == "Lessons"
    at.get_by_key("_lang_choice").set_value("zh").run()
    assert at.query_params["lang"] == "zh" and at.title[0].value == "课程"


@pytest.mark.slow
@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("page", PAGES)
def test_page_runs_in_both_languages(page, lang):
    at = app_run(page, lang)
    assert_clean(at)
    assert at.query_params["lang"] == [lang] or at.query_params["lang"] == lang


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_zh_page_has_no_english_sentence(page):
    at = app_run(page, "zh")
    found = english_in_zh(at)
    assert not found, f"{page} in zh shows {len(found)} English sentence(s):\n" + "\n".join(found)


@pytest.mark.slow
def test_zh_snapshots_compare_has_no_english():
    """The compare view (notes, tables, difference figures) and a text-file refusal, in zh."""
    from model import Trace
    from model.toy.checkpoint import load_checkpoint

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)  # not app_run's shared run: this one uploads
    at.query_params["lang"] = "zh"
    at.run()
    at.switch_page("viz/pages/snapshots.py").run()
    ckpt = load_checkpoint("zh-en")
    trace = ckpt.trace("我爱机器学习")[1]
    tensors, meta = dict(trace), dict(trace.meta)
    name = "encoder.layers.0.self_attn.weights"
    tensors[name] = tensors[name].clone()
    tensors[name][0, 1, 0, 0] += 0.25
    meta["config"] = {**meta["config"], "dropout": 0.3}  # a metadata note too
    at.file_uploader(key="snap_upload").upload("edited.safetensors", Trace(tensors, meta).to_bytes()).run()
    assert not at.exception and at.dataframe, [e.value for e in at.exception]
    found = english_in_zh(at)
    at.file_uploader(key="snap_upload").clear().upload("notes.safetensors", b"hello, this is a text file\n" * 50)
    at.run()
    assert not at.exception and at.error
    found += english_in_zh(at)
    assert not found, "Snapshots compare in zh shows English:\n" + "\n".join(found)
