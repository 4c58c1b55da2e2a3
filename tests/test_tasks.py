"""Toy tasks: deterministic, disjoint splits, correct targets."""

import datetime as dt
import re

import pytest

from model.toy.tasks import SPLITS, TASKS, Task

ZH_EN = TASKS["zh-en"]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_task_metadata(name: str):
    t = TASKS[name]
    assert isinstance(t, Task) and t.name == name
    assert t.description.strip() and t.example.strip()
    assert {t.src_tokenizer_kind, t.tgt_tokenizer_kind} <= {"char", "wordpiece"}
    assert t.max_src_len > 0 and t.max_tgt_len > 0
    # The demo example is a training input, so a trained model shows it at its best.
    target = {"reverse": t.example[::-1], "dates": "2023-11-03", "zh-en": "i love machine learning"}[name]
    assert t.split_of(t.example, target) == "train"


@pytest.mark.parametrize("name", sorted(TASKS))
def test_sample_is_deterministic(name: str):
    t = TASKS[name]
    a = t.sample(200, seed=7, split="train")
    assert a == t.sample(200, seed=7, split="train")
    assert t.sample(50, seed=7, split="train") == a[:50]  # a prefix: n does not reshuffle
    assert a != t.sample(200, seed=8, split="train")
    assert all(isinstance(s, str) and isinstance(y, str) and s and y for s, y in a)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_splits_are_disjoint(name: str):
    t = TASKS[name]
    samples = {split: t.sample(2000 if split == "train" else 1000, seed=1, split=split) for split in SPLITS}
    for split, pairs in samples.items():
        assert all(t.split_of(s, y) == split for s, y in pairs)
    train = set(samples["train"])
    assert not train & set(samples["valid"]) and not train & set(samples["test"])
    # Stronger, per task: no held-out key (date, English sentence, string up to reversal) in train.
    train_keys = {t.split_key(s, y) for s, y in train}
    assert not train_keys & {t.split_key(s, y) for s, y in samples["test"]}


def test_zh_en_all_test_pairs_are_unseen_in_training():
    test = ZH_EN.all_pairs("test")
    assert len(test) > 2000  # a real test set
    train = ZH_EN.sample(2000, seed=0, split="train")
    assert not set(train) & set(test)
    assert not {y for _, y in train} & {y for _, y in test}  # not even the English sentence


def test_zh_en_split_sizes():
    pairs = ZH_EN.all_pairs()
    assert len(pairs) == len(set(pairs)) > 20_000
    sizes = {split: len(ZH_EN.all_pairs(split)) for split in SPLITS}
    assert sum(sizes.values()) == len(pairs)
    assert 0.75 < sizes["train"] / len(pairs) < 0.85
    assert len(ZH_EN.sample(300, seed=0, split="test", unique=True)) == 300
    with pytest.raises(ValueError, match="distinct"):
        ZH_EN.sample(sizes["test"] + 1, seed=0, split="test", unique=True)


def test_bad_arguments():
    with pytest.raises(ValueError, match="split"):
        TASKS["reverse"].sample(3, 0, split="dev")
    with pytest.raises(ValueError, match="enumerate"):
        TASKS["dates"].all_pairs()
    assert TASKS["reverse"].sample(0, 0) == []


def test_reverse():
    t = TASKS["reverse"]
    for s, y in t.sample(500, seed=0) + t.sample(100, seed=0, split="test"):
        assert y == s[::-1]
        assert 3 <= len(s) <= t.max_src_len and re.fullmatch(r"[a-z0-9]+", s)
    assert t.split_of("abc12", "21cba") == t.split_of("21cba", "abc12")  # a string and its reversal


# ---- dates --------------------------------------------------------------------------

_STRPTIME = ("%d %b %Y", "%d %B %Y", "%d-%b-%Y", "%B %d %Y", "%b %d, %Y", "%B %d, %Y", "%Y/%m/%d",
             "%A, %d %B %Y", "%A, %B %d, %Y", "%a %d %b %Y", "%d of %B %Y", "%d of %B, %Y")
_ZH = re.compile(r"(\d{4})年(\d{1,2})月(\d{1,2})日(?:星期([一二三四五六日]))?")


def _parse(text: str) -> dt.date:
    """An independent reading of the source (C-locale strptime, case-insensitive names)."""
    if m := _ZH.fullmatch(text):
        day = dt.date(int(m[1]), int(m[2]), int(m[3]))
        assert m[4] is None or "一二三四五六日".index(m[4]) == day.weekday()
        return day
    plain = re.sub(r"^the ", "", re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", text, flags=re.I), flags=re.I)
    for fmt in _STRPTIME:
        try:
            day = dt.datetime.strptime(plain, fmt).date()
        except ValueError:
            continue
        # strptime does not check the weekday: do it here, it must be the true one.
        if "%a" in fmt or "%A" in fmt:
            weekday = re.match(r"[a-z]+", plain, flags=re.I)[0].lower()
            assert day.strftime("%A").lower().startswith(weekday), text
        return day
    raise AssertionError(f"unparseable date source {text!r}")


def test_dates_targets_are_the_parsed_iso_date():
    t = TASKS["dates"]
    pairs = t.sample(1500, seed=3) + t.sample(300, seed=3, split="test")
    for s, y in pairs:
        assert dt.date(1950, 1, 1) <= dt.date.fromisoformat(y) <= dt.date(2049, 12, 31)
        assert _parse(s).isoformat() == y, (s, y)
        assert len(s) <= t.max_src_len and len(y) == t.max_tgt_len
        # never an all-numeric day/month order ("03.11.2023"): only year-first numerics
        assert not re.fullmatch(r"\d{1,2}\D\d{1,2}\D\d{4}", s), s
    sources = [s for s, _ in pairs]
    assert any(s.isupper() for s in sources) and any("年" in s for s in sources)
    assert any(re.search(r"\d(st|nd|rd|th)", s, re.I) for s in sources)
    assert _parse(t.example) == dt.date(2023, 11, 3)


def test_dates_known_renderings():
    from model.toy.tasks import _render_date

    day = dt.date(2023, 11, 3)  # a friday
    assert _render_date(day, "{weekday}, {d} {month} {y}", False, "lower") == "friday, 3 november 2023"
    assert _render_date(day, "{month} {dth}, {y}", False, "title") == "November 3rd, 2023"
    assert _render_date(day, "{y}年{m}月{d}日星期{zh_weekday}", False, "lower") == "2023年11月3日星期五"
    assert _render_date(day, "{y}/{m}/{d}", True, "upper") == "2023/11/03"
    days = (1, 2, 11, 12, 13, 22, 23)
    ordinals = [_render_date(dt.date(2023, 1, d), "{dth}", False, "lower") for d in days]
    assert ordinals == ["1st", "2nd", "11th", "12th", "13th", "22nd", "23rd"]


def test_dates_max_src_len_covers_every_format():
    from model.toy.tasks import _dates_coverage

    src, _ = _dates_coverage()  # every format x case x padding over all of 2023
    assert max(map(len, src)) <= TASKS["dates"].max_src_len


# ---- zh-en --------------------------------------------------------------------------


def test_zh_en_grammar():
    pairs = dict(ZH_EN.all_pairs())
    assert len(pairs) == len(ZH_EN.all_pairs())  # each source has exactly one translation
    assert pairs["我爱机器学习"] == "i love machine learning" == pairs[ZH_EN.example]
    assert ZH_EN.split_of("我爱机器学习", "i love machine learning") == "train"
    expected = {
        "我昨天吃了一个苹果": "i ate an apple yesterday",
        "昨天我吃了一个苹果": "i ate an apple yesterday",
        "他不喜欢茶": "he does not like tea",
        "她吃了两个苹果": "she ate two apples",
        "他们昨天没有吃苹果": "they did not eat apples yesterday",
        "我们明天会喝两杯茶": "we will drink two cups of tea tomorrow",
        "她正在看一部电影": "she is watching a movie",
        "我在读一本书": "i am reading a book",
        "我的朋友每天喝一杯咖啡": "my friend drinks a cup of coffee every day",
        "老师买了三瓶水": "the teacher bought three bottles of water",
        "你爱我": "you love me",
    }
    for zh, en in expected.items():
        assert pairs[zh] == en
    assert "我爱我" not in pairs
    t = ZH_EN
    for s, y in pairs.items():
        assert len(s) <= t.max_src_len and len(y) <= t.max_tgt_len
        assert re.fullmatch(r"[a-z]+( [a-z]+)*", y), y  # lowercase words, single spaces
