"""Real models in the sidebar's model list, beside the toy checkpoints: SmolLM2, MiniLM, and the models
the server was started with (`streamlit run app.py -- --model PATH`, repeatable).

A browser never chooses a server path: the URL carries a model's *label* (`?checkpoint=smollm2`, or a
server model's file name); only labels registered here at server start map to paths.

`load(name)` gives a `RealModel`, the small face the pages' shared code needs (`example`, `trace`,
`describe`, `capabilities`). The weights are loaded once per process by `model.load_model` (its own cache):
every session shares them, read-only.

Token display: byte-level BPE pieces (GPT-2, Llama 3, SmolLM2) spell bytes with stand-in letters (Ġ = space,
Ċ = newline). `readable()` turns a piece back into its text with visible marks (␣, ↵); a trace's
meta["tgt_tokens"] holds the readable forms (what every view labels axes with), meta["tgt_pieces"] the raw ones.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from model.core import recorder
from model.core.trace import LazyTrace

BUILTIN = ("smollm2", "minilm")
LAZY_BUDGET_BYTES = 512 * 2**20  # a long prompt's lazy trace (q, k, v + each layer's output): SmolLM2 at
                                 # 2,048 tokens holds ~380 MB; it fits up to ~2,700 tokens
LONG_RUNS = threading.Semaphore(1)  # long forwards (lazy traces) run one at a time on a server
EXACT_UP_TO = recorder.EXACT_UP_TO  # up to this many tokens a lazy trace is fed by the step-by-step forward
                                    # (bit for bit the full capture), beyond by the fused fast path (~1e-6)
EXAMPLES = {  # the sentence a model opens on
    "decoder_lm": "When Mary and John went to the store, John gave a drink to",
    "encoder": "The animal didn't cross the street because it was too tired",
}
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
    out = []
    if _available("smollm2"):
        out.append("smollm2")
    if _available("minilm"):
        out.append("minilm")
    return out + list(server_models())


def is_real(name: str) -> bool:
    return name in BUILTIN or name in server_models()


@cache
def _available(name: str) -> bool:
    if name == "smollm2":
        from model.loaders.smollm2 import is_available
    else:
        from model.loaders.minilm import is_available
    return is_available()


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


def readable(piece: str) -> str:
    """A byte-level BPE piece as the text it stands for, spaces and newlines visible ("ĠMary" -> "␣Mary",
    "Ċ" -> "↵"); bytes of a character split across pieces show as \\xNN. Pieces with letters outside the
    byte alphabet (a SentencePiece "▁word", a special token's text) keep their letters, "▁" shown as ␣."""
    table = _byte_decoder()
    if piece and all(ch in table for ch in piece):
        raw = bytes(table[ch] for ch in piece)
        return _marked(raw.decode("utf-8", errors="backslashreplace"))
    return _marked(piece.replace("▁", " "))


def readable_tokens(pieces: list[str], byte_level: bool = True) -> list[str]:
    return [readable(p) for p in pieces] if byte_level else list(pieces)


# ---------------------------------------------------------------- the models


@dataclass(eq=False)
class RealModel:
    """A loaded real model as the sidebar and the shared pages see it."""

    name: str  # the label in the model list and the URL
    obj: object  # model.loaders.lm.LanguageModel or model.loaders.minilm.PretrainedEncoder
    family: str  # describe()["family"]: "decoder_lm" or "encoder"

    @property
    def example(self) -> str:
        return EXAMPLES.get(self.family, EXAMPLES["decoder_lm"])

    @property
    def meta(self) -> dict:  # toy checkpoints have a meta dict (task, training log); real models none
        return {}

    @property
    def title(self) -> str:
        return getattr(self.obj, "name", self.name)

    def describe(self) -> dict:
        return self.obj.model.describe()

    def trace(self, text: str, target: str | None = None, chat: bool = False):
        """(logits, trace) of `text`; the target is meaningless here (no teacher forcing).

        A decoder LM's text too long for a full trace on this server (every attention map of every layer,
        over recorder.DEFAULT_BUDGET_BYTES) gets a lazy one (model/core/trace.py LazyTrace, layers=True):
        q, k, v and each layer's output are kept, a head's map is computed when a page asks for it and a
        layer's other tensors by running that layer again, so every name still reads as in a full trace.
        Its logits are the last position's [1, 1, V]. Over LAZY_BUDGET_BYTES even that is refused
        (CaptureBudgetError, with the longest length that fits)."""
        from model.core import recorder
        from model.core.trace import Trace

        if self.family == "decoder_lm":
            lm = self.obj
            T = lm._ids(text, chat).shape[1]  # text or ids; a text over the context length: ContextLengthError
            if lm.trace_bytes(T) <= recorder.DEFAULT_BUDGET_BYTES:
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
        if self.family == "decoder_lm":  # what each position predicts (rows read "position: input → predicted")
            best = logits[0].argmax(-1) if logits.shape[1] == trace_len(trace) else self._argmax(trace)
            meta["next_tokens"] = readable_tokens(self.obj.tokens(best.tolist()), _byte_level(self.obj))
        if isinstance(trace, LazyTrace):
            return logits, trace.with_meta(meta)  # lazy stays lazy (Trace(trace, meta) would compute every name)
        return logits, Trace(trace, meta)  # the same tensors (views of one block), this meta

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
        raise ValueError(f"{name}: {e}") from None
    family = obj.model.describe().get("family", "decoder_lm")
    return RealModel(name, obj, family)
