"""Deterministic toy seq2seq tasks whose attention patterns are worth looking at.

    from model.toy.tasks import TASKS
    pairs = TASKS["dates"].sample(1000, seed=0, split="train")   # [(source, target), ...]

- reverse: "abc12" -> "21cba"; cross-attention is an anti-diagonal.
- dates:   "November 3rd, 2023" / "2023年11月3日" / ... -> "2023-11-03"; attention jumps
           between year, month and day wherever the format put them.
- zh-en:   "我昨天吃了一个苹果" -> "i ate an apple yesterday"; a small grammar whose word
           orders differ (time words move to the end, 了 becomes a past tense, measure words).

Splits are disjoint by construction: a pair's split is a stable hash (md5, never Python's
salted hash()) of a key derived from it, 80/10/10 train/valid/test, and sampling rejects
pairs of other splits. The key is the target for dates and zh-en (so a test date or English
sentence is never seen in training, in any source wording) and the string/reversal pair for
reverse (so a test string is never seen in training, forwards or backwards).

A generator is written against a `choose(options) -> option` callback: drawing at random
gives the sampler, walking every sequence of choices enumerates a finite grammar (zh-en).
"""

from __future__ import annotations

import datetime as dt
import difflib
import functools
import hashlib
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from model.toy.tokenizer import Kind, Tokenizer

SPLITS = ("train", "valid", "test")


def N_(msg: str) -> str:
    """Mark UI text for the translation catalog (`pybabel extract -k N_`); model/ never translates."""
    return msg


@dataclass(frozen=True)
class InputProblem:
    """Why an input is outside what a toy model learned. `message` is an English template (a catalog
    msgid); the UI translates it and fills `{placeholders}` from `args`."""

    kind: str  # "empty", "length", "vocabulary", "grammar" or "range"
    message: str
    args: dict = field(default_factory=dict)

    def text(self) -> str:
        return self.message.format(**self.args)
Choose = Callable[[Sequence[Any]], Any]
Pair = tuple[str, str]


@dataclass(frozen=True)
class Task:
    name: str
    description: str  # one sentence for the UI
    example: str  # a demo source whose attention is meaningful
    max_src_len: int  # in characters: also an upper bound on tokens, for either tokenizer kind
    max_tgt_len: int
    src_tokenizer_kind: Kind
    tgt_tokenizer_kind: Kind
    generate: Callable[[Choose], Pair] = field(repr=False)
    split_key: Callable[[str, str], str] = field(repr=False)
    # Texts that together hold every symbol (char) or word (wordpiece) the task can emit,
    # so a tokenizer built from them has no [UNK] on task data, whatever the sample drew.
    coverage: Callable[[], tuple[list[str], list[str]]] = field(repr=False)
    finite: bool = False  # small enough to enumerate with all_pairs()
    split_salt: str = ""  # appended to the name in the split hash: chosen to put `example` in train
    tgt_vocab_size: int = 300  # for a wordpiece target tokenizer
    grammar: tuple[str, ...] = ()  # what the model can translate, one rule a line (N_-marked)
    examples: tuple[str, ...] = ()  # sources in the grammar, one per pattern (for a picker)
    # Extra checks after length and vocabulary (e.g. "is this a sentence of the grammar?").
    grammar_check: Callable[[str], list[InputProblem]] = field(default=lambda text: [], repr=False)

    def split_of(self, source: str, target: str) -> str:
        """"train", "valid" or "test": a pure function of the pair, identical on every run."""
        key = f"{self.name}{self.split_salt}:{self.split_key(source, target)}"
        digest = hashlib.md5(key.encode()).digest()
        bucket = int.from_bytes(digest[:8], "big") % 100
        return "train" if bucket < 80 else "valid" if bucket < 90 else "test"

    def sample(self, n: int, seed: int = 0, split: str = "train", unique: bool = False) -> list[Pair]:
        """`n` (source, target) pairs of `split`; the same (n, seed, split) always gives the same list.

        Pairs are drawn independently (repeats possible) unless `unique`.
        """
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        # A str seed is hashed with sha512 by random.Random: stable across runs and platforms.
        rng = random.Random(f"{self.name}|{split}|{seed}")
        if unique and self.finite:
            pool = self.all_pairs(split)
            if n > len(pool):
                raise ValueError(f"{self.name} has only {len(pool)} distinct {split} pairs, {n} requested")
            return rng.sample(pool, n)
        out: list[Pair] = []
        seen: set[Pair] = set()
        misses = 0
        while len(out) < n:
            pair = self.generate(rng.choice)
            if self.split_of(*pair) != split or (unique and pair in seen):
                misses += 1
                if misses > 100_000:  # a split of 10% misses ~10 in a row, not 100k
                    raise ValueError(
                        f"{self.name}: found only {len(out)} distinct {split} pairs, {n} requested"
                    )
                continue
            misses = 0
            seen.add(pair)
            out.append(pair)
        return out

    def all_pairs(self, split: str | None = None) -> list[Pair]:
        """Every distinct pair the task can produce (of `split`, if given), sorted. Finite tasks only."""
        if not self.finite:
            raise ValueError(f"task {self.name!r} is too large to enumerate; use sample()")
        pairs = _enumerate(self.generate)
        return list(pairs) if split is None else [p for p in pairs if self.split_of(*p) == split]

    @functools.cached_property
    def source_chars(self) -> frozenset[str]:
        """Every character a source of this task can contain (from the coverage texts)."""
        return frozenset("".join(self.coverage()[0]))

    def input_problems(self, text: str) -> list[InputProblem]:
        """Why the model cannot be expected to handle `text` (empty list = in its grammar).

        Beyond [UNK]: characters it never saw, inputs longer than anything it trained on, and
        sentences its grammar cannot produce (it will still output *something*, usually wrong).
        """
        text = text.strip()
        if not text:
            return [InputProblem("empty", N_("The input is empty."))]
        out = []
        unknown = sorted({c for c in text if c not in self.source_chars})
        if unknown:
            out.append(InputProblem("vocabulary", N_(
                "Characters this model never saw in training: {chars}. It reads them as [UNK]."),
                {"chars": " ".join(f"“{'␣' if c == ' ' else c}”" for c in unknown[:12])}))
        if len(text) > self.max_src_len:
            out.append(InputProblem("length", N_(
                "The input has {n} characters; the longest training input had {max}."),
                {"n": len(text), "max": self.max_src_len}))
        return out + (self.grammar_check(text) if not unknown else [])

    def build_tokenizers(self, n: int = 5000) -> tuple[Tokenizer, Tokenizer]:
        """(source, target) tokenizers trained on `n` train pairs plus the task's coverage texts.

        Deterministic: the same task always gives the same vocabularies.
        """
        pairs = self.sample(n, seed=0, split="train")
        src_cov, tgt_cov = self.coverage()
        return (
            _train(self.src_tokenizer_kind, src_cov + [s for s, _ in pairs], self.tgt_vocab_size),
            _train(self.tgt_tokenizer_kind, tgt_cov + [t for _, t in pairs], self.tgt_vocab_size),
        )


def _train(kind: Kind, texts: list[str], vocab_size: int) -> Tokenizer:
    return Tokenizer.train_char(texts) if kind == "char" else Tokenizer.train_wordpiece(texts, vocab_size)


@functools.cache
def _enumerate(generate: Callable[[Choose], Pair]) -> list[Pair]:
    return sorted(set(_walk(generate)))


def _walk(generate: Callable[[Choose], Pair]) -> Iterator[Pair]:
    """Run `generate` once per sequence of choices, odometer style (last choice turns fastest)."""
    prefix: list[int] = []
    while True:
        trail: list[tuple[int, int]] = []  # (index taken, number of options) per choice

        def choose(options: Sequence[Any], trail: list = trail, prefix: list = prefix) -> Any:
            k = prefix[len(trail)] if len(trail) < len(prefix) else 0
            trail.append((k, len(options)))
            return options[k]

        yield generate(choose)
        while trail and trail[-1][0] + 1 == trail[-1][1]:
            trail.pop()
        if not trail:
            return
        prefix = [k for k, _ in trail[:-1]] + [trail[-1][0] + 1]


# ---- reverse ------------------------------------------------------------------------

_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"


def _reverse(choose: Choose) -> Pair:
    s = "".join(choose(_ALNUM) for _ in range(choose(range(3, 13))))
    return s, s[::-1]


def _reverse_check(text: str) -> list[InputProblem]:
    if len(text) < 3:
        return [InputProblem("length", N_("Training strings had 3 to 12 characters; this one has {n}."),
                             {"n": len(text)})]
    return []


REVERSE = Task(
    name="reverse",
    description=N_("Reverse a string of letters and digits: cross-attention traces the anti-diagonal."),
    example="attention42",
    max_src_len=12,
    max_tgt_len=12,
    src_tokenizer_kind="char",
    tgt_tokenizer_kind="char",
    generate=_reverse,
    split_key=lambda s, t: min(s, t),  # a string and its reversal share a split
    split_salt="/3",  # puts the example in train
    coverage=lambda: ([_ALNUM], [_ALNUM]),
    grammar=(N_("3 to 12 characters, each a lowercase letter a–z or a digit 0–9."),
             N_("The output is the same characters in reverse order.")),
    examples=("attention42", "hello", "abc123", "transformer"),
    grammar_check=_reverse_check,
)


# ---- dates --------------------------------------------------------------------------

_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december")
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_ZH_WEEKDAYS = "一二三四五六日"  # 星期一 .. 星期日, indexed by date.weekday()
_FIRST_DAY = dt.date(1950, 1, 1)
_N_DAYS = (dt.date(2050, 1, 1) - _FIRST_DAY).days  # 1950-01-01 .. 2049-12-31

# Only unambiguous orders: month spelled out, or year first. Never numeric d/m/y or m/d/y
# ("03.11.2023" is 3 November in Europe and March 11 in the US).
_DATE_FORMATS = (
    "{d} {mon} {y}",
    "{d} {month} {y}",
    "{d}-{mon}-{y}",
    "{month} {d} {y}",
    "{month} {dth}, {y}",
    "{mon} {d}, {y}",
    "{dth} of {month} {y}",
    "the {dth} of {month}, {y}",
    "{weekday}, {d} {month} {y}",
    "{weekday}, {month} {dth}, {y}",
    "{wkd} {d} {mon} {y}",
    "{y}/{m}/{d}",
    "{y}年{m}月{d}日",
    "{y}年{m}月{d}日星期{zh_weekday}",
)


_CASES = ("lower", "title", "upper")


def _ordinal(d: int) -> str:
    return f"{d}{'th' if 10 <= d % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(d % 10, 'th')}"


def _render_date(day: dt.date, fmt: str, pad: bool, case: str) -> str:
    month, weekday = _MONTHS[day.month - 1], _WEEKDAYS[day.weekday()]
    if case == "title":  # capitalise names only: "3rd Of" would look machine-made
        month, weekday = month.capitalize(), weekday.capitalize()
    text = fmt.format(
        y=day.year, m=f"{day.month:02d}" if pad else day.month, d=f"{day.day:02d}" if pad else day.day,
        dth=_ordinal(day.day), month=month, mon=month[:3], weekday=weekday, wkd=weekday[:3],
        zh_weekday=_ZH_WEEKDAYS[day.weekday()],
    )
    return text.upper() if case == "upper" else text


def _dates(choose: Choose) -> Pair:
    day = _FIRST_DAY + dt.timedelta(days=choose(range(_N_DAYS)))
    fmt, pad, case = choose(_DATE_FORMATS), choose((False, True)), choose(_CASES)
    return _render_date(day, fmt, pad, case), day.isoformat()


def _dates_coverage() -> tuple[list[str], list[str]]:
    # 2023 has every month, weekday and day number: every symbol a date can be written with.
    days = [dt.date(2023, 1, 1) + dt.timedelta(days=i) for i in range(365)]
    styles = [(f, p, c) for f in _DATE_FORMATS for p in (False, True) for c in _CASES]
    return [_render_date(d, *style) for d in days for style in styles], ["0123456789-"]


_DATE_FIELDS = {  # format placeholder -> regex (case-insensitive)
    "y": r"(?P<y>\d{4})", "m": r"(?P<m>\d{1,2})", "d": r"(?P<d>\d{1,2})",
    "dth": r"(?P<d>\d{1,2})(?:st|nd|rd|th)", "month": "(?P<month>" + "|".join(_MONTHS) + ")",
    "mon": "(?P<mon>" + "|".join(m[:3] for m in _MONTHS) + ")", "weekday": "(?:" + "|".join(_WEEKDAYS) + ")",
    "wkd": "(?:" + "|".join(w[:3] for w in _WEEKDAYS) + ")", "zh_weekday": f"[{_ZH_WEEKDAYS}]",
}


@functools.cache
def _date_patterns() -> list[re.Pattern]:
    def compile_(fmt: str) -> re.Pattern:
        parts = re.split(r"\{(\w+)\}", fmt)  # literal, field, literal, field, ...
        return re.compile("".join(_DATE_FIELDS[p] if i % 2 else re.escape(p) for i, p in enumerate(parts)),
                          re.IGNORECASE)
    return [compile_(f) for f in _DATE_FORMATS]


def parse_date(text: str) -> dt.date | None:
    """The date a source of the dates task names, or None if no trained format matches (or no such day)."""
    for pattern in _date_patterns():
        m = pattern.fullmatch(text.strip())
        if not m:
            continue
        g = m.groupdict()
        name = (g.get("month") or g.get("mon") or "").lower()
        month = int(g["m"]) if g.get("m") else next(i for i, n in enumerate(_MONTHS, 1) if n.startswith(name))
        try:
            return dt.date(int(g["y"]), month, int(g["d"]))
        except ValueError:
            return None
    return None


def date_fields(text: str) -> dict[str, tuple[int, int]]:
    """Character spans of "year", "month" and "day" in a dates source ({} if no trained format matches)."""
    stripped = text.strip()
    lead = len(text) - len(text.lstrip())
    for pattern in _date_patterns():
        m = pattern.fullmatch(stripped)
        if m:
            spans = {"year": m.span("y"), "day": m.span("d"),
                     "month": next(m.span(g) for g in ("m", "month", "mon") if m.groupdict().get(g))}
            return {k: (a + lead, b + lead) for k, (a, b) in spans.items()}
    return {}


def _dates_check(text: str) -> list[InputProblem]:
    day = parse_date(text)
    if day is None and any(p.fullmatch(text.strip()) for p in _date_patterns()):
        return [InputProblem("range", N_("The format is right, but there is no such day."))]
    if day is None:
        return [InputProblem("grammar", N_(
            "This is not one of the date formats the model was trained on (e.g. \"3 november 2023\", "
            "\"Nov 3, 2023\", \"2023/11/03\", \"2023年11月3日\"; numeric day/month orders are ambiguous and "
            "not included)."))]
    if not _FIRST_DAY <= day < _FIRST_DAY + dt.timedelta(days=_N_DAYS):
        return [InputProblem("range", N_("Training dates run from 1950 to 2049; {year} is outside."),
                             {"year": day.year})]
    return []


DATES = Task(
    name="dates",
    description=N_("Rewrite a date written the way people write it (English or Chinese) as ISO YYYY-MM-DD."),
    example="3 november 2023",
    max_src_len=32,  # "wednesday, september 23rd, 2023" is 31
    max_tgt_len=10,
    src_tokenizer_kind="char",
    tgt_tokenizer_kind="char",
    generate=_dates,
    split_key=lambda s, t: t,  # by date: a test date is unseen in training in every format
    split_salt="/1",  # puts the example's date in train
    coverage=_dates_coverage,
    grammar=(
        N_("Days from 1950-01-01 to 2049-12-31, written in one of 14 formats:"),
        N_("day month year: \"3 november 2023\", \"3 nov 2023\", \"03-nov-2023\""),
        N_("month day year: \"november 3 2023\", \"November 3rd, 2023\", \"nov 3, 2023\""),
        N_("with ordinals and weekdays: \"the 3rd of november, 2023\", \"Friday, 3 November 2023\""),
        N_("year first: \"2023/11/3\", \"2023年11月3日\", \"2023年11月3日星期五\""),
        N_("lower case, Title Case or UPPER CASE; the output is always YYYY-MM-DD."),
    ),
    examples=("3 november 2023", "November 3rd, 2023", "2023年11月3日", "the 21st of march, 1987",
              "Friday, 3 November 2023", "1999/12/31"),
    grammar_check=_dates_check,
)


# ---- zh-en --------------------------------------------------------------------------

# (zh, English subject, English object form, person). The person picks am/is/are, do/does
# and the -s of the present: "1s" (i), "3s" (he, she, my friend), "pl" (we, they, you).
_SUBJECTS = (
    ("我", "i", "me", "1s"),
    ("你", "you", "you", "pl"),
    ("他", "he", "him", "3s"),
    ("她", "she", "her", "3s"),
    ("我们", "we", "us", "pl"),
    ("他们", "they", "them", "pl"),
    ("老师", "the teacher", "the teacher", "3s"),
    ("我的朋友", "my friend", "my friend", "3s"),
    ("孩子们", "the children", "the children", "pl"),
)


@dataclass(frozen=True)
class _Noun:
    zh: str
    generic: str  # English of a bare object: plural or mass ("i like apples", "she drinks tea")
    # (measure word, English unit for one, for many): 一杯茶 "a cup of tea", 两杯茶 "two cups of tea"
    counted: tuple[tuple[str, str, str], ...] = ()


_NOUNS = {n.generic: n for n in (
    _Noun("苹果", "apples", (("个", "apple", "apples"),)),
    _Noun("橘子", "oranges", (("个", "orange", "oranges"),)),
    _Noun("香蕉", "bananas", (("根", "banana", "bananas"),)),
    _Noun("米饭", "rice", (("碗", "bowl of rice", "bowls of rice"),)),
    _Noun("面条", "noodles", (("碗", "bowl of noodles", "bowls of noodles"),)),
    _Noun("茶", "tea", (("杯", "cup of tea", "cups of tea"),)),
    _Noun("咖啡", "coffee", (("杯", "cup of coffee", "cups of coffee"),)),
    _Noun("牛奶", "milk", (("杯", "glass of milk", "glasses of milk"),
                          ("瓶", "bottle of milk", "bottles of milk"))),
    _Noun("水", "water", (("杯", "glass of water", "glasses of water"),
                         ("瓶", "bottle of water", "bottles of water"))),
    _Noun("书", "books", (("本", "book", "books"),)),
    _Noun("杂志", "magazines", (("本", "magazine", "magazines"),)),
    _Noun("报纸", "newspapers", (("份", "newspaper", "newspapers"),)),
    _Noun("信", "letters", (("封", "letter", "letters"),)),
    _Noun("故事", "stories", (("个", "story", "stories"),)),
    _Noun("电影", "movies", (("部", "movie", "movies"),)),
    _Noun("猫", "cats", (("只", "cat", "cats"),)),
    _Noun("狗", "dogs", (("只", "dog", "dogs"),)),
    _Noun("车", "cars", (("辆", "car", "cars"),)),
    _Noun("电视", "tv"),
    _Noun("音乐", "music"),
    _Noun("数学", "math"),
    _Noun("中文", "chinese"),
    _Noun("英语", "english"),
    _Noun("机器学习", "machine learning"),
)}
_NUMERALS = (("一", ""), ("两", "two"), ("三", "three"))  # "" = a/an


@dataclass(frozen=True)
class _Verb:
    zh: str
    base: str
    s: str
    past: str
    ing: str
    objects: tuple[str, ...]  # keys of _NOUNS it makes sense with


_ACTIONS = (
    _Verb("吃", "eat", "eats", "ate", "eating", ("apples", "oranges", "bananas", "rice", "noodles")),
    _Verb("喝", "drink", "drinks", "drank", "drinking", ("tea", "coffee", "milk", "water")),
    _Verb("读", "read", "reads", "read", "reading",
          ("books", "magazines", "newspapers", "letters", "stories")),
    _Verb("写", "write", "writes", "wrote", "writing", ("books", "letters", "stories")),
    _Verb("看", "watch", "watches", "watched", "watching", ("movies", "tv")),
    _Verb("买", "buy", "buys", "bought", "buying",
          ("apples", "oranges", "books", "magazines", "newspapers", "cats", "dogs", "cars", "coffee",
           "water")),
    _Verb("学习", "study", "studies", "studied", "studying",
          ("math", "chinese", "english", "music", "machine learning")),
)
# Stative verbs: no 了 / 在 forms; they take generic nouns or people.
_STATIVES = (_Verb("爱", "love", "loves", "", "", ()), _Verb("喜欢", "like", "likes", "", "", ()))
_LIKEABLE = ("apples", "oranges", "rice", "noodles", "tea", "coffee", "milk", "books", "movies", "cats",
             "dogs", "cars", "tv", "music", "math", "chinese", "english", "machine learning")

_PAST_TIMES = (("昨天", "yesterday"), ("昨晚", "last night"), ("上周", "last week"), ("今天", "today"))
_FUTURE_TIMES = (("明天", "tomorrow"), ("下周", "next week"), ("今天", "today"))
_PATTERNS = ("stative", "habit", "past", "past_neg", "future", "future_neg", "progressive")


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"  # enough for this vocabulary (no "hour", "user")


def _object(noun: _Noun, choose: Choose, counted: bool) -> Pair:
    if not (counted and noun.counted):
        return noun.zh, noun.generic
    measure, one, many = choose(noun.counted)
    num_zh, num_en = choose(_NUMERALS)
    return num_zh + measure + noun.zh, f"{num_en} {many}" if num_en else f"{_article(one)} {one}"


def _zh_en(choose: Choose) -> Pair:
    subj_zh, subj_en, _, person = choose(_SUBJECTS)
    pattern = choose(_PATTERNS)
    time: tuple[str, str] | None = None
    if pattern == "stative":
        verb = choose(_STATIVES)
        people = [(zh, obj) for zh, _, obj, _ in _SUBJECTS if zh != subj_zh]  # no "i love me"
        obj_zh, obj_en = choose([(_NOUNS[k].zh, k) for k in _LIKEABLE] + people)
        neg = choose((False, True))
        zh_verb = ("不" if neg else "") + verb.zh + obj_zh
        en_verb = _present(verb, person, neg) + " " + obj_en
    else:
        verb = choose(_ACTIONS)
        noun = _NOUNS[choose(verb.objects)]
        if pattern == "habit":  # 他不喝咖啡 "he does not drink coffee"; 我每天喝一杯茶 "... every day"
            time = choose((None, ("每天", "every day")))
            neg = time is None and choose((False, True))
            obj_zh, obj_en = _object(noun, choose, counted=time is not None and choose((False, True)))
            zh_verb = ("不" if neg else "") + verb.zh + obj_zh
            en_verb = f"{_present(verb, person, neg)} {obj_en}"
        elif pattern == "past":  # V了 + a counted object: 吃了一个苹果 "ate an apple"
            time = choose((None, *_PAST_TIMES))
            obj_zh, obj_en = _object(noun, choose, counted=True)
            zh_verb, en_verb = f"{verb.zh}了{obj_zh}", f"{verb.past} {obj_en}"
        elif pattern == "past_neg":  # 没(有) + V, no 了: "did not eat apples"
            time = choose((None, *_PAST_TIMES))
            zh_verb = f"{choose(('没', '没有'))}{verb.zh}{noun.zh}"
            en_verb = f"did not {verb.base} {noun.generic}"
        elif pattern == "future":
            time = choose((None, *_FUTURE_TIMES))
            obj_zh, obj_en = _object(noun, choose, counted=choose((False, True)))
            zh_verb, en_verb = f"会{verb.zh}{obj_zh}", f"will {verb.base} {obj_en}"
        elif pattern == "future_neg":
            time = choose((None, *_FUTURE_TIMES))
            zh_verb, en_verb = f"不会{verb.zh}{noun.zh}", f"will not {verb.base} {noun.generic}"
        else:  # progressive: 他(现在)正在看一部电影 "he is watching a movie (now)"
            time = choose((None, ("现在", "now")))
            obj_zh, obj_en = _object(noun, choose, counted=choose((False, True)))
            be = {"1s": "am", "3s": "is"}.get(person, "are")
            zh_verb, en_verb = f"{choose(('在', '正在'))}{verb.zh}{obj_zh}", f"{be} {verb.ing} {obj_en}"
    if time is None:
        return subj_zh + zh_verb, f"{subj_en} {en_verb}"
    # Chinese puts the time word before the verb, either side of the subject; English at the end.
    zh = choose((subj_zh + time[0], time[0] + subj_zh)) + zh_verb
    return zh, f"{subj_en} {en_verb} {time[1]}"


def _present(verb: _Verb, person: str, neg: bool) -> str:
    if neg:
        return f"{'does' if person == '3s' else 'do'} not {verb.base}"
    return verb.s if person == "3s" else verb.base


def _zh_en_coverage() -> tuple[list[str], list[str]]:
    pairs = ZH_EN.all_pairs("train")  # train only: not even the vocabulary peeks at test
    return [s for s, _ in pairs], [t for _, t in pairs]


@functools.cache
def _zh_sources() -> tuple[frozenset[str], dict[str, list[str]]]:
    """Every source sentence of the zh-en grammar, and an index from character bigrams to them."""
    sources = frozenset(s for s, _ in _enumerate(_zh_en))
    index: dict[str, list[str]] = {}
    for s in sources:
        for bigram in {s[i:i + 2] for i in range(len(s) - 1)}:
            index.setdefault(bigram, []).append(s)
    return sources, index


def closest_zh(text: str, shortlist: int = 50) -> str:
    """The zh-en source most like `text`: a shortlist by shared character bigrams, then the best
    difflib ratio (ties: sorted order)."""
    _, index = _zh_sources()
    counts: dict[str, int] = {}
    for bigram in {text[i:i + 2] for i in range(len(text) - 1)}:
        for s in index.get(bigram, ()):
            counts[s] = counts.get(s, 0) + 1
    if not counts:
        return ZH_EN.example
    short = sorted(counts, key=lambda s: (-counts[s], abs(len(s) - len(text)), s))[:shortlist]
    return max(short, key=lambda s: (difflib.SequenceMatcher(None, text, s).ratio(), [-ord(c) for c in s]))


def _zh_en_check(text: str) -> list[InputProblem]:
    if text in _zh_sources()[0]:
        return []
    return [InputProblem("grammar", N_(
        "All characters are known, but the toy grammar cannot produce this sentence, so the model was "
        "never trained on anything like it. Closest sentence it knows: {closest}"),
        {"closest": closest_zh(text)})]


ZH_EN = Task(
    name="zh-en",
    description=N_("Translate toy Chinese into English: time words move to the end, 了 becomes past tense."),
    example="我爱机器学习",
    max_src_len=14,  # "我的朋友上周没有学习机器学习"
    max_tgt_len=56,  # "the children will drink three glasses of water next week"
    src_tokenizer_kind="char",
    tgt_tokenizer_kind="wordpiece",
    generate=_zh_en,
    split_key=lambda s, t: t,  # by English sentence: all its Chinese wordings share a split
    coverage=_zh_en_coverage,
    finite=True,
    split_salt="/4",  # puts the default example, "i love machine learning", in train
    tgt_vocab_size=270,  # most words whole, some split: "buy ##s", "watch ##ing", "studi ##es"
    grammar=(
        N_("One simple sentence: subject + (time word) + verb phrase; no punctuation, no spaces."),
        N_("Subjects: 我 你 他 她 我们 他们 老师 我的朋友 孩子们"),
        N_("Like or love: (不)爱 / (不)喜欢 + a thing or a person: 我爱机器学习, 她不喜欢咖啡"),
        N_("Habits: (不) + verb + object, or 每天 + verb + object: 他不喝咖啡, 我每天喝一杯茶"),
        N_("Past: verb + 了 + number + measure word + noun: 我昨天吃了一个苹果; negated with 没/没有: "
           "他没有读书"),
        N_("Future with 会 / 不会, progressive with 在 / 正在 (+ 现在): 我们明天会喝两杯茶, 老师正在看一部电影"),
        N_("Time words (昨天 昨晚 上周 今天 明天 下周 每天 现在) go before or after the subject; "
           "in English they move to the end."),
        N_("Verbs: 吃 喝 读 写 看 买 学习 爱 喜欢; numbers 一 两 三 with measure words "
           "个 根 碗 杯 瓶 本 份 封 部 只 辆."),
    ),
    examples=("我爱机器学习", "我昨天吃了一个苹果", "她不喜欢咖啡", "我们明天会喝两杯茶", "老师正在看一部电影",
              "孩子们上周没有读书", "我每天喝一杯茶", "他们不会买车"),
    grammar_check=_zh_en_check,
)

TASKS: dict[str, Task] = {t.name: t for t in (REVERSE, DATES, ZH_EN)}
